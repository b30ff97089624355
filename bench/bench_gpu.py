"""Benchmark the CUDA example schedules on an NVIDIA GPU against torch (cuBLAS, cuDNN).

    python bench/bench_gpu.py [--repeat 20] [--out DIR] [--only NAME] [--dry-run]
    python bench/bench_gpu.py --prepare DIR      # no GPU needed: build the kernels for one
    python bench/bench_gpu.py --kernels DIR      # on the GPU: verify and time what --prepare built

Each `examples/cuda/*.sched` names its op file and shapes on its first line
(`# op: examples/matmul.py -D M=4096 -D N=4096 -D K=4096 -D dtype=float32`). The script checks and
builds each for sm_90, runs it once on random inputs and verifies the output against numpy (a
sample of 64 output rows, or one image, computed in float64 from the same inputs) and, when torch
with CUDA is importable, against torch on the whole output (float64, on the GPU). It then times
the kernel with TVM's time evaluator (median of `--repeat` repeats of at least `--min-repeat-ms`)
and, in the same run, the torch equivalent on the same shapes and dtypes: `torch.matmul`
(cuBLAS) for matmuls, `conv2d` (cuDNN), `torch.softmax`. A wrong kernel is reported, not timed.
The markdown table (schedule, op, shape, dtype, schedlang ms, TFLOP/s, torch ms, ratio) goes to
stdout and to `$OUT/gpu_bench.md` (`--out DIR` overrides `$OUT`; with neither, the current
directory). Nothing is installed or fetched. Without a CUDA device it prints "no CUDA device:
nothing measured" and exits with status 1; `--dry-run` builds everything without a GPU and lists
what would be measured.

Running it through the device tool (kind nvidia-h200). That machine has Python 3.12 with torch,
numpy and cuda-bindings, and nvcc 13; it has no TVM and no package index, and TVM's wheel (100 MB,
most of it the compiler) is over the 64 MiB a call carries. So the kernels are built here, where
TVM is installed, and the GPU machine gets them with TVM's runtime only (about 17 MiB in all):

    # here, from the repository root (build/ is ignored by git):
    python bench/bench_gpu.py --prepare build/gpu_bench
    python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 -d build/gpu_bench/wheels \\
        apache-tvm-ffi==0.1.14.post1

`--prepare` checks and builds every schedule, exports each as a library (host code plus the CUDA C),
compiles the CUDA C to an sm_90 fatbin with nvcc when nvcc is here (else the GPU machine's nvcc
compiles it when the library is loaded), and copies TVM's Python package without its compiler
library into build/gpu_bench/site. Then one call of the device tool, from the repository root, with
`carry: ["build/gpu_bench"]` and `timeout_s: 300`:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \\
      build/gpu_bench/wheels/*.whl && PYTHONPATH=/tmp/site:build/gpu_bench/site \\
      PYTHONUNBUFFERED=1 python3 bench/bench_gpu.py --kernels build/gpu_bench --repeat 20

The table comes back as `$OUT/gpu_bench.md`. On a machine with TVM and a GPU, run the script with
no options instead: it builds, verifies and times in one go.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_EXAMPLES = ROOT / "examples" / "cuda"
OP_LINE = re.compile(r"# op: (?P<path>\S+\.py)(?P<defines>(?: -D \w+=\S+)*)")
NO_DEVICE = "no CUDA device: nothing measured"
ARCH = "sm_90"
TORCH_BASELINES = {"matmul": "cuBLAS", "conv2d": "cuDNN", "softmax": "torch"}
SAMPLE_ROWS = 64  # numpy checks this many rows of each output (conv2d: one image)
MANIFEST = "manifest.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="timed repeats (median)")
    parser.add_argument("--min-repeat-ms", type=int, default=50, help="least ms of one repeat")
    parser.add_argument("--out", type=Path, help="folder for gpu_bench.md (default: $OUT, or .)")
    parser.add_argument("--only", action="append", help="only this schedule (e.g. matmul)")
    parser.add_argument(
        "--schedules", type=Path, default=CUDA_EXAMPLES, metavar="DIR",
        help="the .sched files to build, each with its `# op:` line (default: examples/cuda)",
    )  # fmt: skip
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="build everything, measure nothing")
    mode.add_argument("--prepare", type=Path, metavar="DIR", help="build the kernels into DIR")
    mode.add_argument("--kernels", type=Path, metavar="DIR", help="run what --prepare built")
    return parser.parse_args(argv)


# --- what is measured ----------------------------------------------------------------------------


@dataclass
class Entry:
    """One example schedule: its op and shapes; once built, its arguments and kernels."""

    schedule: str  # file name in examples/cuda
    kind: str  # the op file's stem: matmul, conv2d, softmax, …
    defines: dict[str, str]
    args: list[dict] = field(default_factory=list)  # name, shape, dtype, role per argument
    flops: int = 0
    threads: str = ""  # threads per block, per kernel
    shared_bytes: int = 0  # the largest kernel's shared memory
    library: str = ""  # the exported library (--prepare)

    @property
    def dtype(self) -> str:
        return self.defines.get("dtype", "float32")

    @property
    def shape(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.defines.items() if k != "dtype")


@dataclass
class Result:
    entry: Entry
    ms: float | None = None
    torch_ms: float | None = None
    verified: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def find_schedules(
    only: list[str] | None, folder: Path = CUDA_EXAMPLES
) -> list[tuple[Path, Entry]]:
    found = []
    for path in sorted(folder.glob("*.sched")):
        if only and path.stem not in only and path.name not in only:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        match = OP_LINE.fullmatch(lines[0] if lines else "")
        if not match:
            sys.exit(f"{path}: the first line must be `# op: examples/OP.py -D NAME=VALUE …`")
        defines = dict(d.split("=", 1) for d in match["defines"].split(" -D ") if d.strip())
        found.append((path, Entry(path.name, Path(match["path"]).stem, defines)))
    return found


def build(path: Path, entry: Entry, result: Result):
    """Check and build one schedule with the full TVM; the executable, or None."""
    from schedlang.checker.check import check, kernel_uses, lower_for_verification
    from schedlang.core.diagnostics import render_all
    from schedlang.core.opinfo import flop_count
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.lang.syntax import parse
    from schedlang.run.build import compile_func

    target = resolve_target("cuda", arch=ARCH)
    text = path.read_text(encoding="utf-8")
    first = OP_LINE.fullmatch(text.splitlines()[0])
    op = load_op(str(ROOT / first["path"]), entry.defines)
    checked = check(parse(text, str(path)), op.func, target)
    if not checked.ok:
        result.problems.append("does not check:\n" + render_all(checked.diagnostics, text))
        return None
    entry.flops = flop_count(op.func)
    entry.args = [
        {"name": b.name, "shape": [int(d) for d in b.shape], "dtype": str(b.dtype), "role": role}
        for bufs, role in ((op.inputs, "input"), (op.outputs, "output"))
        for b in bufs
    ]
    order = [p.name for p in op.func.params]
    entry.args.sort(key=lambda a: order.index(a["name"]) if a["name"] in order else len(order))
    kernels = kernel_uses(lower_for_verification(checked.lowered.func, target))
    entry.threads = ", ".join(str(k.threads_per_block) for k in kernels)
    entry.shared_bytes = max((k.shared_bytes for k in kernels), default=0)
    try:
        return compile_func(checked.lowered.func, target)
    except Exception as exc:  # SchedlangError, with TVM's reason in one line
        result.problems.append(f"does not build: {exc}")
        return None


# --- inputs and references -----------------------------------------------------------------------


def make_inputs(entry: Entry, seed: int = 0) -> list:
    """One array per argument: inputs uniform in [-1, 1), outputs zero (as schedlang's own)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [
        rng.uniform(-1.0, 1.0, a["shape"]).astype(a["dtype"])
        if a["role"] == "input"
        else np.zeros(a["shape"], a["dtype"])
        for a in entry.args
    ]


def numpy_sample(entry: Entry, arrays: list):
    """(the sampled output rows, their float64 reference), or None for an unknown op."""
    import numpy as np

    roles = [spec["role"] for spec in entry.args]
    inputs = [
        a.astype(np.float64) for a, role in zip(arrays, roles, strict=True) if role == "input"
    ]
    rng = np.random.default_rng(1)
    if entry.kind == "matmul":
        a, b = inputs
        rows = np.sort(rng.choice(a.shape[0], min(SAMPLE_ROWS, a.shape[0]), replace=False))
        return rows, a[rows] @ b
    if entry.kind == "softmax":
        count = inputs[0].shape[0]
        rows = np.sort(rng.choice(count, min(SAMPLE_ROWS, count), replace=False))
        x = inputs[0][rows]
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return rows, e / e.sum(axis=1, keepdims=True)
    if entry.kind == "conv2d":
        from numpy.lib.stride_tricks import sliding_window_view

        data, weight = inputs
        r, stride, pad = (
            int(entry.defines.get(k, v)) for k, v in (("R", 3), ("stride", 1), ("pad", 1))
        )
        padded = np.pad(data[:1], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        windows = sliding_window_view(padded, (r, r), axis=(2, 3))[:, :, ::stride, ::stride]
        return np.array([0]), np.einsum("nchwyx,kcyx->nkhw", windows, weight, optimize=True)
    return None


def torch_op(entry: Entry, inputs: list, torch):
    """The op in torch, as a function of no arguments; None for an op torch is not asked about."""
    if entry.kind == "matmul":
        return lambda: torch.matmul(*inputs)
    if entry.kind == "softmax":
        return lambda: torch.softmax(inputs[0], dim=1)
    if entry.kind == "conv2d":
        stride, pad = int(entry.defines.get("stride", 1)), int(entry.defines.get("pad", 1))
        return lambda: torch.nn.functional.conv2d(*inputs, stride=stride, padding=pad)
    return None


def tolerance(dtype: str, reference) -> tuple[float, float]:
    """(rtol, atol) against a float64 reference. fp16 results accumulate in fp16 over thousands
    of terms: their error grows with the results' magnitude, so atol scales with it."""
    import numpy as np

    scale = float(np.max(np.abs(reference))) if reference.size else 1.0
    if dtype in ("float16", "bfloat16"):
        return 2e-2, 2e-2 * scale
    return 1e-3, 1e-4 * scale


def check_close(result: Result, against: str, got, want) -> None:
    import numpy as np

    rtol, atol = tolerance(result.entry.dtype, want)
    if got.shape != want.shape:
        result.problems.append(f"differs from {against}: shape {got.shape}, not {want.shape}")
    elif not np.allclose(got, want, rtol=rtol, atol=atol):
        worst = float(np.nanmax(np.abs(got - want)))
        result.problems.append(
            f"differs from {against}: max error {worst:.3g} (rtol {rtol:g}, atol {atol:.3g})"
        )
    else:
        result.verified.append(against)


def verify(result: Result, function, device, torch) -> None:
    import numpy as np
    import tvm

    entry = result.entry
    arrays = make_inputs(entry)
    tensors = [tvm.runtime.tensor(a, device) for a in arrays]
    function(*tensors)
    device.sync()
    output = tensors[-1].numpy().astype(np.float64)
    sample = numpy_sample(entry, arrays)
    if sample is not None:
        rows, expected = sample
        check_close(result, "numpy", output[rows], expected)
    if torch is not None:
        inputs = [torch.from_numpy(a).cuda().double() for a in arrays[:-1]]
        call = torch_op(entry, inputs, torch)
        if call is not None:
            check_close(result, "torch", output, call().cpu().numpy())


# --- timing --------------------------------------------------------------------------------------


def time_kernel(entry: Entry, module, device, repeat: int, min_repeat_ms: int) -> float:
    import tvm

    tensors = [tvm.runtime.tensor(a, device) for a in make_inputs(entry)]
    evaluator = module.time_evaluator(
        "main", device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms
    )
    return statistics.median(evaluator(*tensors).results) * 1e3


def time_torch(entry: Entry, torch, repeat: int, min_repeat_ms: int) -> float | None:
    """Median ms of the torch equivalent, with CUDA events, after a warm-up."""
    dtype = getattr(torch, entry.dtype)
    inputs = [torch.from_numpy(a).to("cuda", dtype) for a in make_inputs(entry)[:-1]]
    call = torch_op(entry, inputs, torch)
    if call is None:
        return None
    for _ in range(3):
        call()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    stop.record()
    torch.cuda.synchronize()
    number = max(1, math.ceil(min_repeat_ms / max(start.elapsed_time(stop), 1e-3)))
    times = []
    for _ in range(repeat):
        start.record()
        for _ in range(number):
            call()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / number)
    return statistics.median(times)


def import_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


# --- --prepare here, --kernels on the GPU machine ------------------------------------------------


def prepare(folder: Path, only: list[str] | None, schedules: Path = CUDA_EXAMPLES) -> int:
    """Build every schedule into `folder`: libraries, fatbins, a manifest, TVM's runtime."""
    from schedlang.core.target import resolve_target
    from schedlang.run.build import source

    kernels = folder / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    nvcc = shutil.which("nvcc") or (
        "/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").is_file() else None
    )
    entries, failed = [], False
    for path, entry in find_schedules(only, schedules):
        result = Result(entry)
        started = time.perf_counter()
        executable = build(path, entry, result)
        if executable is None:
            print(f"{entry.schedule}: {'; '.join(result.problems)}", file=sys.stderr)
            failed = True
            continue
        entry.library = f"{path.stem}.so"
        executable.export_library(str(kernels / entry.library))
        cuda = source(executable, resolve_target("cuda", arch=ARCH))
        if nvcc:
            fatbin = kernels / f"{_source_key(cuda)}.fatbin"
            _nvcc(nvcc, cuda, fatbin)
        entries.append(asdict(entry))
        print(f"{entry.schedule}: built in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    (folder / MANIFEST).write_text(json.dumps({"arch": ARCH, "entries": entries}, indent=1))
    _copy_tvm_runtime(folder / "site")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"{folder}: {size / 2**20:.1f} MiB (add the tvm-ffi wheel: see the top of this file)")
    return 1 if failed else 0


def _source_key(cuda: str) -> str:
    return hashlib.sha256(cuda.encode("utf-8")).hexdigest()[:24]


def _nvcc(nvcc: str, cuda: str, output: Path) -> None:
    source = output.with_suffix(".cu")
    source.write_text(cuda, encoding="utf-8")
    command = [nvcc, "-fatbin", "-O3", f"-arch={ARCH}", "-o", str(output), str(source)]
    subprocess.run(command, check=True, capture_output=True, text=True)
    source.unlink()


def _copy_tvm_runtime(site: Path) -> None:
    """TVM's Python package without the compiler library and C++ headers: `import tvm` then runs
    in TVM's runtime-only mode, which loads and runs exported libraries."""
    import tvm

    package = Path(tvm.__file__).parent
    skip = shutil.ignore_patterns("libtvm_compiler.so", "3rdparty", "include", "src", "__pycache__")
    shutil.rmtree(site / "tvm", ignore_errors=True)
    shutil.copytree(package, site / "tvm", ignore=skip)


def preload_cudart() -> None:
    """TVM's CUDA runtime library needs libcudart.so.13; where the loader's path lacks it, load it
    from the CUDA toolkit or from the pip package torch brings, before TVM looks."""
    import ctypes
    import glob

    patterns = [
        "/usr/local/cuda/lib64/libcudart.so.13*",
        "/usr/local/cuda*/lib*/libcudart.so.13*",
        *(f"{p}/nvidia/*/lib/libcudart.so.13*" for p in sys.path if p.endswith("-packages")),
    ]
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


def load_runtime_extensions() -> None:
    """TVM's Python package without its compiler library loads only libtvm_runtime.so: the CUDA
    device API (libtvm_runtime_cuda.so) and the rest are linked into the compiler library
    otherwise, so without it `tvm.cuda(0).exist` is False on a machine with a GPU. Load them."""
    import ctypes

    import tvm

    if not getattr(tvm.base, "_RUNTIME_ONLY", False):
        return
    lib = Path(tvm.__file__).parent / "lib"
    for name in ("libtvm_runtime_extra.so", "libtvm_runtime_cuda.so"):
        if (lib / name).is_file():
            ctypes.CDLL(str(lib / name), mode=ctypes.RTLD_GLOBAL)


def load_prepared(folder: Path, only: list[str] | None) -> list[tuple[Entry, object]]:
    """The prepared entries with their loaded modules. Each library holds the CUDA C, which TVM
    compiles when it is loaded: with the fatbin nvcc made at --prepare time when there is one,
    else with this machine's nvcc."""
    import tvm
    import tvm_ffi

    manifest = json.loads((folder / MANIFEST).read_text())
    kernels = folder / "kernels"
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def compile_cuda(code: str) -> bytes:
        fatbin = kernels / f"{_source_key(code)}.fatbin"
        if not fatbin.is_file():
            _nvcc(nvcc, code, fatbin)
        return fatbin.read_bytes()

    loaded = []
    for data in manifest["entries"]:
        entry = Entry(**data)
        if only and Path(entry.schedule).stem not in only and entry.schedule not in only:
            continue
        loaded.append((entry, tvm.runtime.load_module(str(kernels / entry.library))))
    return loaded


# --- report --------------------------------------------------------------------------------------


def report(results: list[Result], header: str, dry_run: bool) -> str:
    lines = [header, ""]
    if dry_run:
        lines += [
            "| schedule | op | shape | dtype | GFLOP | threads/block | shared/block | against |",
            "|---|---|---|---|---:|---:|---:|---|",
        ]
        for r in results:
            e = r.entry
            baseline = TORCH_BASELINES.get(e.kind, "-")
            lines.append(
                f"| {e.schedule} | {e.kind} | {e.shape} | {e.dtype} | {e.flops / 1e9:.1f} | "
                f"{e.threads or '-'} | {e.shared_bytes} B | torch ({baseline}) |"
            )
    else:
        lines += [
            "| schedule | op | shape | dtype | schedlang ms | TFLOP/s | torch ms | ratio | "
            "verified against |",
            "|---|---|---|---|---:|---:|---:|---:|---|",
        ]
        for r in results:
            e = r.entry
            ms = f"{r.ms:.3f}" if r.ms else "-"
            tflops = f"{e.flops / (r.ms * 1e-3) / 1e12:.2f}" if r.ms else "-"
            torch_ms = f"{r.torch_ms:.3f} ({TORCH_BASELINES[e.kind]})" if r.torch_ms else "-"
            ratio = f"{r.torch_ms / r.ms:.2f}" if r.ms and r.torch_ms else "-"
            lines.append(
                f"| {e.schedule} | {e.kind} | {e.shape} | {e.dtype} | {ms} | {tflops} | "
                f"{torch_ms} | {ratio} | {', '.join(r.verified) or 'nothing'} |"
            )
        lines += [
            "",
            "ratio = torch ms / schedlang ms (1.00: as fast as torch, 0.50: half as fast). The "
            "fp16 matmul op accumulates in fp16; cuBLAS accumulates fp16 products in fp32 on "
            "tensor cores, which no schedlang statement reaches.",
        ]
    problems = [f"- {r.entry.schedule}: {p}" for r in results for p in r.problems]
    if problems:
        lines += ["", "Problems:", *problems]
    return "\n".join(lines) + "\n"


def write_report(text: str, out: Path | None) -> Path:
    folder = out or Path(os.environ.get("OUT") or ".")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpu_bench.md"
    path.write_text(text, encoding="utf-8")
    return path


def device_name(device) -> str:
    try:
        return str(device.device_name)
    except Exception:  # the attribute needs a device
        return "CUDA device 0"


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.prepare:
        return prepare(args.prepare, args.only, args.schedules)
    if args.kernels:
        preload_cudart()
        load_runtime_extensions()
    import tvm

    device = tvm.cuda(0)
    if not device.exist and not args.dry_run:
        print(NO_DEVICE, file=sys.stderr)
        print("(--dry-run builds everything without one)", file=sys.stderr)
        return 1
    torch = None if args.dry_run else import_torch()
    results = []
    if args.kernels:
        runs = [
            (Result(entry), module, module.get_function("main"))
            for entry, module in load_prepared(args.kernels, args.only)
        ]
    else:
        runs = []
        for path, entry in find_schedules(args.only, args.schedules):
            result, started = Result(entry), time.perf_counter()
            executable = build(path, entry, result)
            print(
                f"{entry.schedule}: built in {time.perf_counter() - started:.1f} s", file=sys.stderr
            )
            module = executable.mod if executable is not None else None
            runs.append((result, module, executable))
    for result, module, function in runs:
        results.append(result)
        if args.dry_run or module is None:
            continue
        verify(result, function, device, torch)
        if result.problems:
            continue  # a wrong kernel is reported, not timed
        result.ms = time_kernel(result.entry, module, device, args.repeat, args.min_repeat_ms)
        if torch is not None:
            result.torch_ms = time_torch(result.entry, torch, args.repeat, args.min_repeat_ms)
        print(f"{result.entry.schedule}: {result.ms:.3f} ms", file=sys.stderr)
    if not results:
        print(f"no schedules in {args.schedules}", file=sys.stderr)
        return 1
    if args.dry_run:
        where = f"on {device_name(device)}" if device.exist else "(no CUDA device here)"
        header = f"# What bench/bench_gpu.py would measure {where}, {ARCH}"
    else:
        versions = f"TVM {tvm.__version__}" + (f", torch {torch.__version__}" if torch else "")
        header = f"# CUDA examples on {device_name(device)}, {ARCH} ({versions})"
        if torch is None:
            header += "\n\ntorch with CUDA is not importable: no torch timings or checks."
    text = report(results, header, args.dry_run)
    print(text)
    print(f"written to {write_report(text, args.out)}", file=sys.stderr)
    return 1 if any(r.problems for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
