"""Whole models built for CUDA here and run on a GPU machine that has TVM's runtime alone.

    python bench/gpu_models.py --prepare build/gpu_models        # here (no GPU needed)
    # then through the device tool, from the repository root, carrying build/gpu_models and the
    # runtime that `bench/bench_gpu.py --prepare` copies (build/gpu_bench/site, and the ffi wheel):
    PYTHONPATH=/tmp/site:build/gpu_bench/site python3 bench/gpu_models.py --run build/gpu_models

`--prepare` builds each model with `build_model` for sm_90 from an empty database (every function
gets dlight's schedule) and exports the library, the inputs and the reference's outputs (PyTorch
for a PyTorch model). `--run` loads each library in the Relax VM on the GPU (the CUDA C compiled by
that machine's nvcc when loaded), checks the outputs against the reference's, and times `main`
(median of 20 repeats of 10 runs). The weights are constants inside each library: a model over
the 64 MiB one device call carries (BERT's 94 MB embedding table) cannot travel.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = [
    ("examples/models/convnet.py", []),
    ("tests/models/attention.py", []),
    ("examples/models/mlp.py", []),
    ("bench/models/resnet18.py", []),
]
MANIFEST = "manifest.json"


def prepare(folder: Path, models=MODELS, arch: str = "sm_90") -> list[dict]:
    from schedlang.cli.model import load_model_arg
    from schedlang.core.target import resolve_target
    from schedlang.models.graph import build_model
    from schedlang.store.db import Database

    folder.mkdir(parents=True, exist_ok=True)
    target = resolve_target("cuda", arch=arch)
    manifest = []
    with warnings.catch_warnings(), Database(":memory:") as db:
        warnings.simplefilter("ignore")
        for spec, defines in models:
            name = Path(spec).stem
            started = time.perf_counter()
            model = load_model_arg(str(ROOT / spec), defines)
            executable, applied = build_model(model.mod, target, db)
            executable.export_library(str(folder / f"{name}.so"))
            np.savez(folder / f"{name}.npz", *model.inputs)
            np.savez(folder / f"{name}_expected.npz", *(model.expected_outputs() or []))
            how: dict[str, int] = {}
            for item in applied:
                how[item.how] = how.get(item.how, 0) + 1
            manifest.append({"name": name, "reference": model.reference_kind, "functions": how})
            print(f"{name}: built in {time.perf_counter() - started:.1f} s, {how}", flush=True)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def run(folder: Path) -> int:
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_gpu

    bench_gpu.preload_cudart()
    bench_gpu.load_runtime_extensions()
    import tvm
    import tvm_ffi
    from tvm.runtime.vm import VirtualMachine

    device = tvm.cuda(0)
    if not device.exist:
        print(bench_gpu.NO_DEVICE, file=sys.stderr)
        return 1
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cache = Path("/tmp/schedlang-fatbins")
    cache.mkdir(exist_ok=True)

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def compile_cuda(code: str) -> bytes:
        fatbin = cache / f"{bench_gpu._source_key(code)}.fatbin"
        if not fatbin.is_file():
            bench_gpu._nvcc(nvcc, code, fatbin)
        return fatbin.read_bytes()

    print(f"| model on {device.device_name} | functions | outputs | max rel. error | median ms |")
    print("|---|---|---|---:|---:|")
    wrong = 0
    for entry in json.loads((folder / MANIFEST).read_text()):
        name = entry["name"]
        vm = VirtualMachine(tvm.runtime.load_module(str(folder / f"{name}.so")), device)
        args = [tvm.runtime.tensor(a, device) for a in np.load(folder / f"{name}.npz").values()]
        expected = list(np.load(folder / f"{name}_expected.npz").values())
        result = vm["main"](*args)
        outputs = [result.numpy()] if hasattr(result, "numpy") else [r.numpy() for r in result]
        errors = [
            float(np.max(np.abs(o - e)) / (np.max(np.abs(e)) + 1e-12))
            for o, e in zip(outputs, expected, strict=True)
        ]
        agree = len(outputs) == len(expected) and all(e < 1e-3 for e in errors)
        wrong += not agree
        timer = vm.time_evaluator("main", device, number=10, repeat=20, min_repeat_ms=50)
        ms = float(np.median(timer(*args).results)) * 1e3
        verdict = f"{'agree with' if agree else 'DIFFER from'} {entry['reference']}"
        print(f"| {name} | {entry['functions']} | {verdict} | {max(errors):.1e} | {ms:.3f} |")
    return 1 if wrong else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prepare", type=Path, metavar="DIR")
    mode.add_argument("--run", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    if args.prepare:
        sys.path.insert(0, str(ROOT))
        prepare(args.prepare)
        return 0
    return run(args.run)


if __name__ == "__main__":
    sys.exit(main())
