"""schedlang's tuner against MetaSchedule, numpy and PyTorch, side by side in one run.

    python bench/bench_tune.py                                    # every op, 64 trials, both arms
    python bench/bench_tune.py --ops matmul conv2d --trials 64 --out docs/benchmarks.md \\
        --plot docs/tuning.png
    python bench/bench_tune.py --ops softmax --trials 4 --no-metaschedule --wait-quiet 0  # smoke

For each op: schedlang's tuner (built-in proposer) with its cost model and without it (`--cost-model
both`, the side-by-side of the model's effect), and MetaSchedule (`tune_tir`, the configuration in
bench/metaschedule_baseline.py) each measure the same number of candidates; then the best kernel of
each is built, verified and timed the same way (TVM's time evaluator, median of repeats,
TVM_NUM_THREADS = cores), and so are numpy (matmuls) and PyTorch's CPU kernels (`torch.matmul`,
`torch.bmm`, `F.conv2d`, `torch.softmax`, `F.layer_norm`; oneDNN/MKL inside) where they have the
op. "Trials to 90 %" is the first trial at which a tuner's best so far (its own measurements)
reached 90 % of its final best. Ratios come from one run: timings on a shared 2-core machine swing
by 20–30 % from minute to minute, so only numbers measured side by side are compared, and the run
first waits for a quiet machine (`--wait-quiet`). It prints an estimate of its wall time first.

Needs `pip install 'schedlang[tune,metaschedule]' psutil torch` (`--no-metaschedule` skips
MetaSchedule, `--no-torch` PyTorch).
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from schedlang.core.opinfo import flop_count  # noqa: E402
from schedlang.core.ops import load_op, random_inputs  # noqa: E402
from schedlang.core.target import resolve_target  # noqa: E402
from schedlang.run.build import build  # noqa: E402
from schedlang.run.measure import time_kernel, verify  # noqa: E402
from schedlang.store.db import Database  # noqa: E402
from schedlang.tuning.tune import Settings, tune  # noqa: E402


@dataclass(frozen=True)
class BenchOp:
    file: str
    defines: dict[str, str] = field(default_factory=dict)
    numpy: bool = False  # numpy has the op (a BLAS call): time op.reference
    torch: str | None = None  # the PyTorch call compared with (see torch_call)
    # Rough seconds per trial, from the 2026-11-30 run here (schedlang, MetaSchedule): the estimate.
    seconds_per_trial: tuple[float, float] = (1.0, 2.5)


OPS = {
    "matmul": BenchOp(
        "examples/matmul.py", numpy=True, torch="matmul", seconds_per_trial=(1.2, 3.8)
    ),
    "matmul_odd": BenchOp(
        "examples/matmul.py",
        {"M": "1000", "N": "999", "K": "997"},
        numpy=True,
        torch="matmul",
        seconds_per_trial=(1.2, 3.8),
    ),
    "batch_matmul": BenchOp("examples/batch_matmul.py", numpy=True, torch="bmm"),
    "conv2d": BenchOp("examples/conv2d.py", torch="conv2d", seconds_per_trial=(1.0, 1.3)),
    "depthwise_conv2d": BenchOp("examples/depthwise_conv2d.py", torch="depthwise_conv2d"),
    "softmax": BenchOp("examples/softmax.py", torch="softmax", seconds_per_trial=(0.8, 2.0)),
    "layernorm": BenchOp("examples/layernorm.py", torch="layer_norm", seconds_per_trial=(0.8, 2.0)),
}
START_S = (10.0, 45.0)  # per op and arm: workers, TVM imports (MetaSchedule: its builder pool)
CHECKPOINTS = (16, 64)


@dataclass
class Arm:
    """One tuner's run on one op: its own best-so-far curve, the final re-timed kernel."""

    label: str
    gflops: float | None = None  # the best kernel, re-built and re-timed after tuning
    wall_s: float | None = None
    curve: list[float] = field(default_factory=list)  # best GFLOP/s so far, per trial
    note: str = ""

    def best_after(self, trials: int) -> float | None:
        """Best so far after `trials` (None if the tuner measured fewer)."""
        return self.curve[trials - 1] if len(self.curve) >= trials else None

    def trials_to(self, share: float = 0.9) -> int | None:
        if not self.curve or not self.curve[-1]:
            return None
        return next(n for n, best in enumerate(self.curve, 1) if best >= share * self.curve[-1])


@dataclass
class Row:
    op: str
    shape: str
    trials: int
    arms: dict[str, Arm] = field(default_factory=dict)  # "model", "off", "metaschedule"
    numpy_gflops: float | None = None
    torch_gflops: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def schedlang(self) -> Arm | None:
        return self.arms.get("model") or self.arms.get("off")


# --- baselines -----------------------------------------------------------------------------------


def op_inputs(op) -> list[np.ndarray]:
    names = {tensor.name for tensor in op.inputs}
    return [
        array
        for array, param in zip(random_inputs(op, 0), op.func.params, strict=True)
        if param.name in names
    ]


def time_call(call: Callable[[], object], repeat: int = 10, min_s: float = 0.1) -> float:
    """Median seconds of one call; each repeat runs the call enough times to last `min_s`."""
    call()
    start, runs = time.perf_counter(), 0
    while time.perf_counter() - start < min_s:
        call()
        runs += 1
    number = max(1, runs)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            call()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def time_numpy(op, bench: BenchOp) -> float | None:
    if not bench.numpy or op.reference is None:
        return None
    args = op_inputs(op)
    return flop_count(op.func) / time_call(lambda: op.reference(*args)) / 1e9


def torch_call(name: str, args: list[np.ndarray], threads: int) -> Callable[[], object]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    tensors = [torch.from_numpy(a) for a in args]
    calls = {
        "matmul": lambda: torch.matmul(*tensors),
        "bmm": lambda: torch.bmm(*tensors),
        "conv2d": lambda: F.conv2d(tensors[0], tensors[1], stride=1, padding=1),
        "depthwise_conv2d": lambda: F.conv2d(
            tensors[0], tensors[1].unsqueeze(1), stride=1, padding=1, groups=tensors[0].shape[1]
        ),
        "softmax": lambda: torch.softmax(tensors[0], dim=1),
        "layer_norm": lambda: F.layer_norm(
            tensors[0], (tensors[0].shape[1],), tensors[1], tensors[2], eps=1e-5
        ),
    }
    call = calls[name]

    def run():
        with torch.inference_mode():
            return call()

    return run


def time_torch(op, bench: BenchOp, threads: int) -> tuple[float | None, str]:
    """GFLOP/s of PyTorch's kernel for the op, checked against the op's reference first."""
    if bench.torch is None:
        return None, ""
    try:
        import torch
    except ImportError:
        return None, "torch not installed"
    args = op_inputs(op)
    call = torch_call(bench.torch, args, threads)
    if op.reference is not None:
        expected = op.reference(*[a.copy() for a in args])
        got = call().numpy()
        if not np.allclose(got, expected, rtol=1e-3, atol=1e-3):
            return None, f"torch's {bench.torch} disagrees with the reference: not timed"
    return flop_count(op.func) / time_call(call) / 1e9, f"torch {torch.__version__}"


# --- the tuners ----------------------------------------------------------------------------------


def run_schedlang(op, target, trials: int, seed: int, cost_model: str) -> Arm:
    arm = Arm("schedlang" + (" + cost model" if cost_model != "off" else ""))
    with tempfile.TemporaryDirectory() as work, Database(Path(work) / "bench.db") as db:
        start = time.perf_counter()
        settings = Settings(trials=trials, seed=seed, cost_model=cost_model)
        result = tune(op, target, db, settings=settings)
        arm.wall_s = time.perf_counter() - start
        best = 0.0
        for record in result.records:
            best = max(best, record.gflops or 0.0)
            arm.curve.append(best)
        if result.cost_model:
            figures = result.cost_model
            arm.note = (
                f"cost model: {figures['fits']} fits, {figures['fit_s']:.1f} s; features "
                f"{figures['feature_ms_per_schedule']:.0f} ms x "
                f"{figures['schedules_featurized']} schedules"
            )
        arm.note = "; ".join([*result.notes, arm.note] if arm.note else result.notes)
        if result.best is None:
            return arm
        schedule = result.best.schedule
    executable = build(op.func, schedule, target)
    ok, reason = verify(op, executable, target)
    if not ok:
        raise SystemExit(f"schedlang's best {op.name} kernel is wrong: {reason}")
    arm.gflops = time_kernel(op, executable, target, repeat=10, min_repeat_ms=100).gflops
    return arm


def run_metaschedule(op, target, trials: int, seed: int) -> Arm | None:
    try:
        from metaschedule_baseline import tune_metaschedule
    except ImportError as exc:
        print(f"MetaSchedule skipped: {exc}", file=sys.stderr)
        return None
    arm = Arm("MetaSchedule")
    flops = flop_count(op.func)
    with tempfile.TemporaryDirectory() as work:
        folder = str(Path(work) / "ms")
        result = tune_metaschedule(
            op.func,
            target.tvm_config,
            trials,
            folder,
            seed=seed,
            reference=op.reference,
            quiet=True,
        )
        best = 0.0
        for latency in metaschedule_trials(Path(folder)):
            best = max(best, flops / latency / 1e9 if latency else 0.0)
            arm.curve.append(best)
    arm.gflops, arm.wall_s = result.gflops, result.wall_s
    return arm


def metaschedule_trials(folder: Path) -> list[float | None]:
    """Each trial's mean run time in the order of MetaSchedule's record file (None: failed)."""
    path = folder / "database_tuning_record.json"
    trials: list[float | None] = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.strip():
            run_secs = [float(s) for s in json.loads(line)[1][1] or []]
            valid = run_secs and all(s < 1e9 for s in run_secs)
            trials.append(sum(run_secs) / len(run_secs) if valid else None)
    return trials


# --- the run -------------------------------------------------------------------------------------


def estimate_s(names: list[str], trials: list[int], arms: list[str], metaschedule: bool) -> float:
    total = 0.0
    for name in names:
        sl, ms = OPS[name].seconds_per_trial
        for count in trials:
            total += len(arms) * (START_S[0] + sl * count)
            if metaschedule:
                total += START_S[1] + ms * count
        total += 10.0  # baselines and the final timings
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    parser.add_argument("--trials", nargs="+", type=int, default=[64])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cost-model",
        choices=("both", "auto", "lightgbm", "off"),
        default="both",
        help="schedlang's arm(s): both = with the cost model and without it, side by side",
    )
    parser.add_argument("--no-metaschedule", action="store_true")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument(
        "--wait-quiet", type=float, default=300.0, help="seconds to wait for idle CPUs (0: none)"
    )
    parser.add_argument("--out", help="write the tables here (replaces its tuning section)")
    parser.add_argument("--plot", help="tuning curves (PNG)")
    args = parser.parse_args(argv)

    target = resolve_target("llvm")
    threads = int(os.environ["TVM_NUM_THREADS"])
    arms = ["lightgbm", "off"] if args.cost_model == "both" else [args.cost_model]
    estimate = estimate_s(args.ops, args.trials, arms, not args.no_metaschedule)
    print(
        f"estimate: about {estimate / 60:.0f} min on a quiet machine for {len(args.ops)} ops x "
        f"{args.trials} trials ({len(arms)} schedlang arm(s)"
        f"{'' if args.no_metaschedule else ' + MetaSchedule'}), after waiting for quiet",
        file=sys.stderr,
        flush=True,
    )
    if not args.no_metaschedule:  # a missing package fails now, not after the first op's tuning
        from metaschedule_baseline import check_versions

        check_versions()
    if args.wait_quiet > 0:
        from metaschedule_baseline import wait_for_quiet

        if not wait_for_quiet(args.wait_quiet):
            print(f"the machine did not go quiet in {args.wait_quiet:.0f} s", file=sys.stderr)

    started = time.perf_counter()
    rows: list[Row] = []
    for name in args.ops:
        bench = OPS[name]
        op = load_op(str(ROOT / bench.file), bench.defines or None)
        shape = ", ".join(f"{k}={v}" for k, v in bench.defines.items()) or "default"
        numpy_gflops = time_numpy(op, bench)
        torch_gflops, torch_note = (None, "") if args.no_torch else time_torch(op, bench, threads)
        for trials in args.trials:
            row = Row(name, shape, trials, numpy_gflops=numpy_gflops, torch_gflops=torch_gflops)
            if torch_note and torch_gflops is None:
                row.notes.append(torch_note)
            for cost_model in arms:
                print(f"[{name} @ {trials}] schedlang, cost model {cost_model} …", file=sys.stderr)
                arm = run_schedlang(op, target, trials, args.seed, cost_model)
                row.arms["off" if cost_model == "off" else "model"] = arm
            if not args.no_metaschedule:
                print(f"[{name} @ {trials}] MetaSchedule …", file=sys.stderr, flush=True)
                measured = run_metaschedule(op, target, trials, args.seed)
                if measured is not None:
                    row.arms["metaschedule"] = measured
            rows.append(row)
            print(render(rows[-1:]), file=sys.stderr, flush=True)
        print(f"elapsed {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    total_s = time.perf_counter() - started
    header = (
        f"Machine: {target.describe().splitlines()[0]}; TVM_NUM_THREADS={threads}; numpy "
        f"{np.__version__}; seed {args.seed}; whole run {total_s / 60:.1f} min "
        f"(estimated {estimate / 60:.0f}).\n\n"
    )
    text = header + render(rows) + "\n\n" + render_cost_model(rows) + "\n\n" + render_targets(rows)
    print(text)
    if args.out:
        write_section(Path(args.out), text, args.plot)
    if args.plot:
        plot(rows, args.plot)
    return 0


# --- tables --------------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if digits and abs(value) < 10:  # memory-bound ops run at a few GFLOP/s
        digits = 2
    return f"{value:.{digits}f}"


def render(rows: list[Row]) -> str:
    lines = [
        "| op | shape | trials | schedlang GFLOP/s | MetaSchedule | numpy | torch "
        "| vs MetaSchedule | vs numpy | vs torch | tuning s (schedlang / MS) "
        "| trials to 90 % (schedlang / MS) |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        ours, ms = row.schedlang, row.arms.get("metaschedule")
        ours_g = ours.gflops if ours else None
        ms_g = ms.gflops if ms else None
        lines.append(
            f"| {row.op} | {row.shape} | {row.trials} | {_num(ours_g)} | {_num(ms_g)} | "
            f"{_num(row.numpy_gflops)} | {_num(row.torch_gflops)} | {_ratio(ours_g, ms_g)} | "
            f"{_ratio(ours_g, row.numpy_gflops)} | {_ratio(ours_g, row.torch_gflops)} | "
            f"{_num(ours.wall_s if ours else None, 0)} / {_num(ms.wall_s if ms else None, 0)} | "
            f"{_num(ours.trials_to() if ours else None, 0)} / "
            f"{_num(ms.trials_to() if ms else None, 0)} |"
        )
    return "\n".join(lines)


def render_cost_model(rows: list[Row]) -> str:
    """The same run with and without the cost model: best so far after 16 and 64 trials."""
    lines = [
        "| op | trials | best@16 without / with | best@64 without / with | final re-timed "
        "without / with | trials to 90 % without / with | tuning s without / with |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        off, on = row.arms.get("off"), row.arms.get("model")
        if off is None or on is None:
            continue

        def pair(get, digits=1, off=off, on=on):
            return f"{_num(get(off), digits)} / {_num(get(on), digits)}"

        lines.append(
            f"| {row.op} | {row.trials} | {pair(lambda a: a.best_after(16))} | "
            f"{pair(lambda a: a.best_after(64))} | {pair(lambda a: a.gflops)} | "
            f"{pair(lambda a: a.trials_to(), 0)} | {pair(lambda a: a.wall_s, 0)} |"
        )
    if len(lines) == 2:
        return "(The cost model's side-by-side needs `--cost-model both`.)"
    notes = [f"- {r.op}: {r.arms['model'].note}" for r in rows if "model" in r.arms]
    notes += [f"- {r.op}: {n}" for r in rows for n in r.notes]
    return "\n".join(lines + (["", *notes] if notes else []))


def render_targets(rows: list[Row]) -> str:
    """The issue's targets, each marked met or missed from this run's figures."""
    lines = ["Targets (issue 16), from this run:", ""]

    def check(label: str, value: float | None, goal: float, at_most: bool = False) -> None:
        if value is None:
            lines.append(f"- {label}: not measured")
            return
        met = value <= goal if at_most else value >= goal
        lines.append(
            f"- {label}: {value:.2f} (goal {'≤' if at_most else '≥'} {goal}) "
            f"{'met' if met else 'MISSED'}"
        )

    def ratio(a, b):
        return a / b if a and b else None

    for row in rows:
        ours, ms = row.schedlang, row.arms.get("metaschedule")
        if ours is None:
            continue
        where = f"{row.op} @{row.trials}"
        if ms is not None:
            check(f"{where} vs MetaSchedule", ratio(ours.gflops, ms.gflops), 1.5)
            check(f"{where} tuning time / MetaSchedule's", ratio(ours.wall_s, ms.wall_s), 0.5, True)
        to90 = ours.trials_to()
        check(f"{where} trials to 90 %", float(to90) if to90 else None, 16, True)
        if row.op == "matmul":
            check(f"{where} vs numpy", ratio(ours.gflops, row.numpy_gflops), 1.0)
        if row.op == "conv2d":
            check(f"{where} vs torch", ratio(ours.gflops, row.torch_gflops), 1.0)
            if ms is not None:
                check(f"{where} vs MetaSchedule (conv2d)", ratio(ours.gflops, ms.gflops), 3.0)
        if row.op in ("softmax", "layernorm"):
            check(f"{where} vs torch", ratio(ours.gflops, row.torch_gflops), 1.0)
    return "\n".join(lines)


SECTION = "## Tuning: schedlang vs MetaSchedule (`bench/bench_tune.py`)"


def write_section(path: Path, text: str, plot_path: str | None) -> None:
    """Replace the tuning section of a benchmarks page (or write a page with only it)."""
    body = f"{SECTION}\n\nOne run of `python bench/bench_tune.py {' '.join(sys.argv[1:])}`.\n\n"
    body += text + "\n"
    if plot_path:
        relative = os.path.relpath(plot_path, path.parent)
        body += f"\n![best-so-far GFLOP/s per trial]({relative})\n"
    old = path.read_text() if path.is_file() else ""
    if SECTION in old:
        before, rest = old.split(SECTION, 1)
        after = rest[rest.find("\n## ") + 1 :] if "\n## " in rest else ""
        path.write_text(before + body + ("\n" + after if after else ""))
    else:
        path.write_text((old + "\n" if old else "") + body)


def plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(row.op for row in rows))
    columns = min(4, len(ops))
    lines = -(-len(ops) // columns)
    figure, axes = plt.subplots(
        lines, columns, figsize=(5 * columns, 3.8 * lines), dpi=110, squeeze=False
    )
    styles = {"model": ("C0", "-"), "off": ("C0", ":"), "metaschedule": ("C1", "--")}
    for axis, name in zip(axes.flat, ops, strict=False):
        for row in (r for r in rows if r.op == name):
            for key, arm in row.arms.items():
                color, style = styles[key]
                axis.plot(
                    range(1, len(arm.curve) + 1),
                    arm.curve,
                    color=color,
                    linestyle=style,
                    label=f"{arm.label} @{row.trials}",
                )
            if row.numpy_gflops:
                axis.axhline(row.numpy_gflops, linestyle="-.", color="C2", label="numpy")
            if row.torch_gflops:
                axis.axhline(row.torch_gflops, linestyle="-.", color="C3", label="torch")
        axis.set_title(name)
        axis.set_xlabel("trial")
        axis.set_ylabel("best GFLOP/s so far")
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right", fontsize=7)
    for axis in list(axes.flat)[len(ops) :]:
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(path)


if __name__ == "__main__":
    raise SystemExit(main())
