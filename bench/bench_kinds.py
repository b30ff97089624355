"""Where MobileNetV2's time goes, by kind of layer, in schedlang's tuned build and in onnxruntime
(issue 47, item 6: why the one is faster than the other). schedlang: `profile_model` (each
function timed call by call in the VM), each function put in a kind by its convolution's weight
(depthwise: one input channel a group; pointwise: 1x1; the 3x3 stem), the classifier's matmul
and the rest. onnxruntime: its own profiler (`enable_profiling`), each node's kernel time put in
a kind by the shapes it reports (its layout transformer's reorders apart).

    python bench/bench_kinds.py --db mnv2.db --repeat 20 --out kinds.json
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_NUM_THREADS", "2")  # before TVM starts

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("depthwise 3x3", "pointwise 1x1", "stem 3x3", "classifier", "layout", "other")


def weight_kind(shape: list[int]) -> str | None:
    """A convolution's kind from its weight's shape (O, I/groups, KH, KW), None if not one."""
    if len(shape) != 4:
        return None
    if shape[2:] == [1, 1]:
        return "pointwise 1x1"
    if shape[1] == 1:
        return "depthwise 3x3"
    return "stem 3x3"


def function_kind(func) -> str:
    """A TIR function's kind: its 4-d parameter with the smallest window decides a conv."""
    from schedlang.core.opinfo import arg_buffers

    shapes = [[int(x) for x in buffer.shape] for buffer in arg_buffers(func)]
    text = func.script()
    if "conv2d" in text:
        for shape in shapes:  # the weight: (O, I/groups, KH, KW) with a window of 1 or 3
            if len(shape) == 4 and shape[2] == shape[3] and shape[2] in (1, 3) and shape[0] > 3:
                kind = weight_kind(shape)
                if kind is not None:
                    return kind
    if "matmul" in text:
        return "classifier"
    return "other"


def node_kind(event: dict) -> str:
    """An onnxruntime profile node's kind, from its operator and its inputs' shapes."""
    args = event.get("args", {})
    op = args.get("op_name", "")
    if op in ("ReorderInput", "ReorderOutput"):
        return "layout"
    if op in ("Gemm", "MatMul", "FusedGemm"):
        return "classifier"
    shapes = [list(next(iter(s.values()))) for s in args.get("input_type_shape", [])]
    if "Conv" in op and len(shapes) > 1:
        shape = shapes[1]  # the weight
        if len(shape) == 4 and shape[2:] == [3, 3] and shape[1] == 1:
            return "depthwise 3x3"
        if len(shape) >= 4 and shape[2:4] == [1, 1]:
            return "pointwise 1x1"
        if len(shape) >= 4:  # the stem, or a reordered (NCHWc) weight of any kind
            return "stem 3x3" if shape[0] == 32 and shape[1] == 3 else _blocked(shape)
    return "other"


def _blocked(shape: list[int]) -> str:
    """An NCHWc convolution's weight (O/b, I/b, KH, KW, b, b) or (O/b, 1, KH, KW, 1, b)."""
    if len(shape) == 6 and shape[2:4] == [1, 1]:
        return "pointwise 1x1"
    if len(shape) >= 4 and shape[2:4] == [3, 3]:
        return "depthwise 3x3" if shape[1] == 1 else "stem 3x3"
    return "other"


def schedlang_kinds(model, tgt, db_path: str, repeat: int) -> dict:
    from schedlang.models.function_times import profile_model
    from schedlang.models.graph import build_model
    from schedlang.models.tune_model import model_tasks
    from schedlang.store.db import Database

    with Database(db_path) as db:
        executable, applied = build_model(model.mod, tgt, db)
    kinds_of = {task.name: function_kind(task.op.func) for task in model_tasks(model, tgt)}
    profile = profile_model(executable, applied, model.inputs, tgt, repeat)
    totals: dict[str, float] = defaultdict(float)
    for row in profile.rows:
        name = row.function.removesuffix("_prepacked")
        totals[kinds_of.get(name, "other")] += row.total_s
    return {"total_s": profile.total_s, "builtins_s": profile.builtins_s, "kinds_s": totals}


def onnxruntime_kinds(onnx_path: Path, inputs, threads: int, repeat: int, work: Path) -> dict:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling = True
    options.profile_file_prefix = str(work / "ort")
    session = onnxruntime.InferenceSession(
        str(onnx_path), options, providers=["CPUExecutionProvider"]
    )
    name = session.get_inputs()[0].name
    for _ in range(3 + repeat):
        session.run(None, {name: inputs[0]})
    events = json.loads(Path(session.end_profiling()).read_text())
    runs: list[dict[str, float]] = []
    per_run: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            runs.append(dict(per_run))
            per_run = defaultdict(float)
        elif event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_run[node_kind(event)] += event["dur"] * 1e-6
    runs = runs[3:]  # the warm-up runs
    kinds = {kind: statistics.median(run.get(kind, 0.0) for run in runs) for kind in KINDS}
    totals = [sum(run.values()) for run in runs]
    return {"total_s": statistics.median(totals), "kinds_s": kinds}


def markdown(result: dict) -> str:
    ours, theirs = result["schedlang"], result["onnxruntime"]
    lines = [
        f"{result['cpu']}, {result['threads']} threads, medians of {result['repeat']} runs "
        "(each system's own per-call timing: schedlang's VM hook, onnxruntime's profiler).",
        "",
        "| kind | schedlang | onnxruntime | schedlang / onnxruntime |",
        "|---|--:|--:|--:|",
    ]
    for kind in KINDS:
        a, b = ours["kinds_s"].get(kind, 0.0), theirs["kinds_s"].get(kind, 0.0)
        ratio = f"{a / b:.2f}" if a and b else "-"
        lines.append(f"| {kind} | {1e3 * a:.3f} ms | {1e3 * b:.3f} ms | {ratio} |")
    lines.append(
        f"| **all kernels** | {1e3 * ours['total_s']:.3f} ms | {1e3 * theirs['total_s']:.3f} ms "
        f"| {ours['total_s'] / theirs['total_s']:.2f} |"
    )
    lines.append(
        f"\nschedlang's VM builtins (allocation, checks): {1e3 * ours['builtins_s']:.3f} ms"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="the tuned MobileNetV2's database")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from bench_modes import export_onnx

    from schedlang.core.imports import allow_torch
    from schedlang.core.target import resolve_target
    from schedlang.models.compare import cpu_name, runtime_threads
    from schedlang.models.model_file import load_model

    allow_torch()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-kinds-"))
    work.mkdir(parents=True, exist_ok=True)
    model = load_model(str(ROOT / "bench/models/mobilenet_v2.py"))
    tgt = resolve_target("llvm")
    onnx_path = work / "model.onnx"
    export_onnx(onnx_path)
    threads = runtime_threads()
    result = {
        "cpu": cpu_name(), "threads": threads, "repeat": args.repeat,
        "schedlang": schedlang_kinds(model, tgt, args.db, args.repeat),
        "onnxruntime": onnxruntime_kinds(onnx_path, model.inputs, threads, args.repeat, work),
    }  # fmt: skip
    print(markdown(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
