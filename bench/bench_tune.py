"""schedlang's tuner against MetaSchedule and numpy, side by side in one run.

    python bench/bench_tune.py                       # matmul 1024³ and conv2d, 64 trials each
    python bench/bench_tune.py --trials 64 256 --out docs/benchmarks.md --plot docs/tuning.png

For each op: schedlang's built-in proposer and MetaSchedule (`tune_tir`, the configuration in
bench/metaschedule_baseline.py) each measure the same number of candidates; then the best kernel of
each is built and timed the same way (TVM's time evaluator, median of repeats, TVM_NUM_THREADS =
cores), and numpy where it has the op. Ratios come from one run: timings on a shared 2-core machine
swing by 20–30 % from minute to minute, so only numbers measured side by side are compared.
Needs `pip install xgboost psutil cloudpickle` for MetaSchedule (`--no-metaschedule` skips it).
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from schedlang.build import build  # noqa: E402
from schedlang.db import Database  # noqa: E402
from schedlang.measure import time_kernel, verify  # noqa: E402
from schedlang.ops import load_op  # noqa: E402
from schedlang.target import resolve_target  # noqa: E402
from schedlang.tune import Settings, tune  # noqa: E402

OPS = {"matmul": "examples/matmul.py", "conv2d": "examples/conv2d.py"}


@dataclass
class Row:
    op: str
    trials: int
    schedlang_gflops: float = 0.0
    schedlang_wall_s: float = 0.0
    metaschedule_gflops: float | None = None
    metaschedule_wall_s: float | None = None
    numpy_gflops: float | None = None
    schedlang_curve: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def time_numpy(op, repeat: int = 10) -> float | None:
    """GFLOP/s of the op's numpy reference (only where it is a BLAS call worth comparing)."""
    if op.name not in ("matmul", "batch_matmul") or op.reference is None:
        return None
    from schedlang.ops import flop_count, random_inputs

    args = [
        a
        for a, b in zip(random_inputs(op, 0), op.func.params, strict=True)
        if b.name in {i.name for i in op.inputs}
    ]
    op.reference(*args)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        op.reference(*args)
        times.append(time.perf_counter() - start)
    return flop_count(op.func) / statistics.median(times) / 1e9


def run_schedlang(op, target, trials: int, seed: int) -> tuple[float, float, list[float], str]:
    with tempfile.TemporaryDirectory() as work:
        with Database(Path(work) / "bench.db") as db:
            start = time.perf_counter()
            result = tune(op, target, db, settings=Settings(trials=trials, seed=seed))
            wall = time.perf_counter() - start
            curve, best = [], 0.0
            for record in result.records:
                best = max(best, record.gflops or 0.0)
                curve.append(best)
            if result.best is None:
                return 0.0, wall, curve, ""
            schedule = result.best.schedule
    executable = build(op.func, schedule, target)
    ok, reason = verify(op, executable, target)
    if not ok:
        raise SystemExit(f"schedlang's best {op.name} kernel is wrong: {reason}")
    timing = time_kernel(op, executable, target, repeat=10, min_repeat_ms=100)
    return timing.gflops, wall, curve, schedule


def run_metaschedule(op, target, trials: int, seed: int) -> tuple[float, float] | None:
    try:
        from metaschedule_baseline import tune_metaschedule
    except ImportError as exc:
        print(f"MetaSchedule skipped: {exc}", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as work:
        result = tune_metaschedule(
            op.func, target.tvm_config, trials, work, seed=seed, reference=op.reference, quiet=True
        )
    return result.gflops, result.wall_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    parser.add_argument("--trials", nargs="+", type=int, default=[64])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-metaschedule", action="store_true")
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--plot", help="tuning curves (PNG)")
    args = parser.parse_args(argv)

    target = resolve_target("llvm")
    rows: list[Row] = []
    for name in args.ops:
        op = load_op(str(ROOT / OPS[name]))
        numpy_gflops = time_numpy(op)
        for trials in args.trials:
            row = Row(name, trials, numpy_gflops=numpy_gflops)
            print(f"[{name} @ {trials}] schedlang …", file=sys.stderr, flush=True)
            gflops, wall, curve, _ = run_schedlang(op, target, trials, args.seed)
            row.schedlang_gflops, row.schedlang_wall_s, row.schedlang_curve = gflops, wall, curve
            if not args.no_metaschedule:
                print(f"[{name} @ {trials}] MetaSchedule …", file=sys.stderr, flush=True)
                measured = run_metaschedule(op, target, trials, args.seed)
                if measured is not None:
                    row.metaschedule_gflops, row.metaschedule_wall_s = measured
            rows.append(row)
            print(render([row]), file=sys.stderr, flush=True)

    table = render(rows)
    header = (
        f"Machine: {target.describe().splitlines()[0]}; TVM_NUM_THREADS="
        f"{os.environ['TVM_NUM_THREADS']}; numpy {np.__version__}; seed {args.seed}.\n\n"
    )
    print(header + table)
    if args.out:
        Path(args.out).write_text(header + table + "\n")
    if args.plot:
        plot(rows, args.plot)
    return 0


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _num(value: float | None, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if value is not None else "-"


def render(rows: list[Row]) -> str:
    lines = [
        "| op | trials | schedlang GFLOP/s | MetaSchedule GFLOP/s | numpy GFLOP/s "
        "| schedlang / MetaSchedule | schedlang / numpy | schedlang tuning s | MetaSchedule "
        "tuning s | wall ratio |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.op} | {row.trials} | {row.schedlang_gflops:.1f} | "
            f"{_num(row.metaschedule_gflops)} | {_num(row.numpy_gflops)} | "
            f"{_ratio(row.schedlang_gflops, row.metaschedule_gflops)} | "
            f"{_ratio(row.schedlang_gflops, row.numpy_gflops)} | {row.schedlang_wall_s:.0f} | "
            f"{_num(row.metaschedule_wall_s, 0)} | "
            f"{_ratio(row.schedlang_wall_s, row.metaschedule_wall_s)} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = sorted({row.op for row in rows})
    figure, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4), dpi=110, squeeze=False)
    for axis, name in zip(axes[0], ops, strict=True):
        for row in (r for r in rows if r.op == name):
            axis.plot(
                range(1, len(row.schedlang_curve) + 1),
                row.schedlang_curve,
                label=f"schedlang builtin @{row.trials}",
                linewidth=2,
            )
            if row.metaschedule_gflops:
                axis.axhline(
                    row.metaschedule_gflops,
                    linestyle="--",
                    color="C1",
                    label=f"MetaSchedule @{row.trials} (final)",
                )
            if row.numpy_gflops:
                axis.axhline(row.numpy_gflops, linestyle=":", color="C2", label="numpy")
        axis.set_title(name)
        axis.set_xlabel("trial")
        axis.set_ylabel("best GFLOP/s so far")
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path)


if __name__ == "__main__":
    raise SystemExit(main())
