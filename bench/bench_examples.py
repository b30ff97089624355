"""Benchmark every example schedule: unscheduled build vs schedlang schedule vs numpy.

    python bench/bench_examples.py [--repeat 5] [--threads 2] [--wait-idle 120] [--out results.md]
    python bench/bench_examples.py --frontend-only [--frontend-runs 10] [--long-statements 100000]

For each `examples/*.sched` (paired with its op file by name, as tests/test_examples.py does) it
builds the op unscheduled and scheduled for llvm, verifies the scheduled build against the op's
numpy reference, and times the unscheduled build, the scheduled one and the numpy reference (medians
over repeats). It then times schedlang's front end on the matmul schedule: parse, and check + lower
(one pass: the checker applies each statement as it goes), against `tvm.compile` of the lowered
function, and checks one long schedule (`--long-statements` statements, each naming an axis the
block lacks: the checker's per-statement cost, as tests/test_faults.py's 20,000-line file).
`--frontend-only` skips the examples. Everything is printed as markdown; `--out` also writes it to
a file.

The packed GEMM (issue 14) is then timed against numpy at the issue's three shapes, side by side in
one process: examples/matmul_packed.sched at 1024³ and 2048³ (target: 1.15× numpy), and
bench/packed_gemm_odd.sched at 1000×999×997 (target: 1.0×; it pads the iteration space with
`pad by`). `--no-packed-gemm` skips it.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats per kernel (median)")
    parser.add_argument("--threads", type=int, default=2, help="TVM_NUM_THREADS (default 2)")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    parser.add_argument(
        "--frontend-runs", type=int, default=10, help="runs of the front-end timing (median)"
    )
    parser.add_argument(
        "--frontend-only", action="store_true", help="only the front-end timings (no examples)"
    )
    parser.add_argument(
        "--long-statements",
        type=int,
        default=100_000,
        help="statements in the long schedule the front end checks (0: none)",
    )
    parser.add_argument(
        "--no-packed-gemm", action="store_true", help="skip the packed GEMM against numpy"
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each example, wait up to this long for other processes to leave the CPUs "
        "idle (Linux; for shared machines)",
    )
    return parser.parse_args()


ARGS = _parse_args() if __name__ == "__main__" else None
# TVM's thread pool reads this once, when it starts: set it before tvm is imported.
os.environ["TVM_NUM_THREADS"] = str(ARGS.threads if ARGS else 2)

import numpy as np  # noqa: E402
import tvm  # noqa: E402

from schedlang.checker.check import check  # noqa: E402
from schedlang.core.diagnostics import render_all  # noqa: E402
from schedlang.core.opinfo import flop_count  # noqa: E402
from schedlang.core.ops import Op, load_op, random_inputs  # noqa: E402
from schedlang.core.target import Target, resolve_target  # noqa: E402
from schedlang.lang.syntax import parse  # noqa: E402
from schedlang.run.build import compile_func  # noqa: E402
from schedlang.run.measure import time_kernel, verify  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MIN_REPEAT_S = 0.1  # each repeat runs the kernel often enough to last this long
SLOW_KERNEL_S = 1.0  # a kernel slower than this is run only `--repeat`-capped few times


@dataclass(frozen=True)
class Row:
    schedule: str
    op: str
    flops: int
    unscheduled_s: float
    scheduled_s: float
    numpy_s: float | None
    warnings: int
    other_load: float | None  # share of the CPUs other processes used while this row was timed


def main() -> int:
    assert ARGS is not None
    target = resolve_target("llvm")
    schedules = sorted(EXAMPLES.glob("*.sched"))
    rows: list[Row] = []
    for schedule_path in [] if ARGS.frontend_only else schedules:
        if ARGS.wait_idle > 0 and not wait_for_idle(ARGS.wait_idle):
            print(f"the CPUs stayed busy for {ARGS.wait_idle:g} s", file=sys.stderr)
        print(f"timing {schedule_path.name} ...", file=sys.stderr, flush=True)
        rows.append(bench_example(schedule_path, target, ARGS.repeat))
    packed = []
    if not ARGS.frontend_only and not ARGS.no_packed_gemm:
        for schedule_path, shape, goal in packed_gemm_for(target):
            if ARGS.wait_idle > 0 and not wait_for_idle(ARGS.wait_idle):
                print(f"the CPUs stayed busy for {ARGS.wait_idle:g} s", file=sys.stderr)
            print(f"timing {schedule_path.name} at {shape} ...", file=sys.stderr, flush=True)
            packed.append(bench_packed_gemm(schedule_path, shape, goal, target, ARGS.repeat))
    frontend = bench_frontend(EXAMPLES / "matmul.sched", target, ARGS.frontend_runs)
    long = bench_long_schedule(target, ARGS.long_statements) if ARGS.long_statements else None
    report = render_report(rows, frontend, target, ARGS.repeat, long)
    if packed:
        report += render_packed_gemm(packed)
    print(report)
    if ARGS.out:
        ARGS.out.write_text(report, encoding="utf-8")
        print(f"written to {ARGS.out}", file=sys.stderr)
    return 0


# --- one example ---------------------------------------------------------------------------------


def op_file_for(schedule: Path) -> Path:
    """The op file with the longest name that the schedule's name is or starts with (`_`)."""
    stem = schedule.stem
    matches = [
        op_file
        for op_file in EXAMPLES.glob("*.py")
        if stem == op_file.stem or stem.startswith((f"{op_file.stem}_", f"{op_file.stem}."))
    ]
    if not matches:
        raise SystemExit(f"{schedule.name}: no op file in {EXAMPLES} for this schedule")
    return max(matches, key=lambda p: len(p.stem))


def bench_example(schedule_path: Path, target: Target, repeat: int) -> Row:
    op = load_op(str(op_file_for(schedule_path)))
    text = schedule_path.read_text(encoding="utf-8")
    result = check(parse(text, schedule_path.name), op.func, target)
    if result.lowered is None:
        raise SystemExit(render_all(result.diagnostics, text))
    scheduled = compile_func(result.lowered.func, target)
    ok, reason = verify(op, scheduled, target)
    if not ok:
        raise SystemExit(f"{schedule_path.name}: {reason}")
    unscheduled = compile_func(op.func, target)
    with OtherLoad() as load:
        unscheduled_s = time_tvm(op, unscheduled, target, repeat)
        scheduled_s = time_tvm(op, scheduled, target, repeat)
        numpy_s = time_numpy(op, repeat)
    return Row(
        schedule=schedule_path.name,
        op=op.name,
        flops=flop_count(op.func),
        unscheduled_s=unscheduled_s,
        scheduled_s=scheduled_s,
        numpy_s=numpy_s,
        warnings=sum(not d.is_error for d in result.diagnostics),
        other_load=load.share,
    )


# --- the packed GEMM against numpy (issue 14) -----------------------------------------------------

BENCH = Path(__file__).resolve().parent
PACKED_GEMM = (  # (schedule, (M, N, K), the goal: schedlang time ≤ numpy time / goal)
    (EXAMPLES / "matmul_packed.sched", (1024, 1024, 1024), 1.15),
    (EXAMPLES / "matmul_packed.sched", (2048, 2048, 2048), 1.15),
    (BENCH / "packed_gemm_odd.sched", (1000, 999, 997), 1.0),
)


def packed_gemm_for(target: Target) -> list[tuple[Path, tuple[int, int, int], float]]:
    """The packed GEMM schedules for this core: with 32 vector registers of 16 float32 lanes
    (AVX-512), the `_avx512` versions (32-column panels, an 8 x 32 register tile); else the AVX2
    ones (16-column panels, 4 x 16)."""
    wide = target.vector_registers >= 32 and target.vector_lanes("float32") >= 16
    if not wide:
        return list(PACKED_GEMM)
    return [
        (path.with_name(f"{path.stem}_avx512.sched"), shape, goal)
        for path, shape, goal in PACKED_GEMM
    ]


@dataclass(frozen=True)
class PackedRow:
    schedule: str
    shape: tuple[int, int, int]
    goal: float
    scheduled_s: float
    numpy_s: float
    other_load: float | None
    problem: str = ""  # why it was not built (the checker's errors)

    @property
    def speedup(self) -> float:
        return self.numpy_s / self.scheduled_s


def bench_packed_gemm(
    schedule_path: Path, shape: tuple[int, int, int], goal: float, target: Target, repeat: int
) -> PackedRow:
    m, n, k = shape
    op = load_op(str(EXAMPLES / "matmul.py"), {"M": str(m), "N": str(n), "K": str(k)})
    text = schedule_path.read_text(encoding="utf-8")
    result = check(parse(text, schedule_path.name), op.func, target)
    if result.lowered is None:  # reported in its row; the other rows are still measured
        problem = render_all([d for d in result.diagnostics if d.is_error], text)
        return PackedRow(schedule_path.name, shape, goal, math.nan, math.nan, None, problem)
    scheduled = compile_func(result.lowered.func, target)
    ok, reason = verify(op, scheduled, target)
    if not ok:
        raise SystemExit(f"{schedule_path.name} at {shape}: {reason}")
    # Interleaved, so that a neighbour's load falls on both sides alike.
    tvm_runs, numpy_runs = [], []
    with OtherLoad() as load:
        for _ in range(3):
            tvm_runs.append(time_tvm(op, scheduled, target, repeat))
            numpy_runs.append(time_numpy(op, repeat) or float("nan"))
    return PackedRow(
        schedule_path.name,
        shape,
        goal,
        statistics.median(tvm_runs),
        statistics.median(numpy_runs),
        load.share,
    )


def render_packed_gemm(rows: list[PackedRow]) -> str:
    lines = [
        "",
        "## Packed GEMM against numpy (issue 14)",
        "",
        "Timed side by side in one process, interleaved (three rounds, medians).",
        "",
        "| schedule | M×N×K | schedlang GFLOP/s | numpy GFLOP/s | vs numpy | goal | others' CPU |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        if row.problem:
            first = row.problem.splitlines()[0]
            lines.append(
                f"| {row.schedule} | {'×'.join(map(str, row.shape))} | not built: {first} "
                f"| | | ≥ {row.goal:.2f}x: missed | |"
            )
            continue
        flops = 2 * row.shape[0] * row.shape[1] * row.shape[2]
        verdict = "met" if row.speedup >= row.goal else "missed"
        lines.append(
            f"| {row.schedule} | {'×'.join(map(str, row.shape))} "
            f"| {flops / row.scheduled_s / 1e9:.1f} | {flops / row.numpy_s / 1e9:.1f} "
            f"| {row.speedup:.2f}x | ≥ {row.goal:.2f}x: {verdict} "
            f"| {'?' if row.other_load is None else f'{row.other_load:.0%}'} |"
        )
    return "\n".join(lines) + "\n"


def time_tvm(op: Op, executable, target: Target, repeat: int) -> float:
    """Median seconds per run. A kernel slower than SLOW_KERNEL_S (the unscheduled matmul 1024
    takes ~8 s) is run three times at most, directly, without time_evaluator's warm-up run."""
    tensors = [tvm.runtime.tensor(a, tvm.cpu(0)) for a in random_inputs(op)]
    first = _seconds(lambda: executable(*tensors))  # also the warm-up
    if first > SLOW_KERNEL_S:
        more = [_seconds(lambda: executable(*tensors)) for _ in range(min(repeat, 3) - 1)]
        return statistics.median([first, *more])
    min_repeat_ms = int(MIN_REPEAT_S * 1000)
    return time_kernel(op, executable, target, repeat=repeat, min_repeat_ms=min_repeat_ms).median_s


def time_numpy(op: Op, repeat: int) -> float | None:
    """Median seconds per call of the op's numpy reference, or None when it has none."""
    if op.reference is None:
        return None
    input_names = {buffer.name for buffer in op.inputs}
    arguments = zip(random_inputs(op), op.func.params, strict=True)
    inputs = [array for array, param in arguments if param.name in input_names]
    reference = op.reference
    first = _seconds(lambda: reference(*inputs))
    calls = max(1, int(MIN_REPEAT_S / max(first, 1e-9)))
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            reference(*inputs)
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


class OtherLoad:
    """The share of the machine's CPU time that other processes used while the `with` block ran
    (from Linux's /proc/stat; None elsewhere). On a shared 2-core machine one busy neighbour halves
    a parallel kernel's speed, so the report shows it next to each row."""

    def __enter__(self) -> OtherLoad:
        self.start = _cpu_sample()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = _cpu_sample()

    @property
    def share(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        machine_busy, machine_total, own = (
            b - a for a, b in zip(self.start, self.end, strict=True)
        )
        return max(0.0, machine_busy - own) / machine_total if machine_total > 0 else None


def wait_for_idle(limit_s: float, busy_below: float = 0.05, sample_s: float = 1.0) -> bool:
    """Wait until other processes use under `busy_below` of the CPUs for two samples in a row."""
    deadline = time.monotonic() + limit_s
    calm = 0
    while time.monotonic() < deadline:
        with OtherLoad() as load:
            time.sleep(sample_s)
        if load.share is None:
            return False
        calm = calm + 1 if load.share < busy_below else 0
        if calm >= 2:
            return True
    return False


def _cpu_sample() -> tuple[float, float, float] | None:
    """(busy, total) CPU seconds of the whole machine, and this process's CPU seconds."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    own = os.times()
    return (sum(fields) - idle) / ticks, sum(fields) / ticks, own.user + own.system


def _seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


# --- front-end overhead --------------------------------------------------------------------------


@dataclass(frozen=True)
class Frontend:
    schedule: str
    parse_s: float
    check_lower_s: float
    compile_s: float
    runs: int


def bench_frontend(schedule_path: Path, target: Target, runs: int) -> Frontend:
    op = load_op(str(op_file_for(schedule_path)))
    text = schedule_path.read_text(encoding="utf-8")
    parse_times, check_times, compile_times = [], [], []
    for _ in range(runs):
        start = time.perf_counter()
        schedule = parse(text, schedule_path.name)
        parsed = time.perf_counter()
        result = check(schedule, op.func, target)
        checked = time.perf_counter()
        assert result.lowered is not None
        compile_func(result.lowered.func, target)
        compiled = time.perf_counter()
        parse_times.append(parsed - start)
        check_times.append(checked - parsed)
        compile_times.append(compiled - checked)
    return Frontend(
        schedule_path.name,
        statistics.median(parse_times),
        statistics.median(check_times),
        statistics.median(compile_times),
        runs,
    )


@dataclass(frozen=True)
class LongSchedule:
    statements: int
    parse_s: float
    check_s: float
    render_s: float


def bench_long_schedule(target: Target, statements: int) -> LongSchedule:
    """Parse, check and render the diagnostics of `statements` statements in one block, each
    naming an axis the block lacks (one error each): once, it takes tens of seconds."""
    op = load_op(str(EXAMPLES / "matmul.py"), {"M": "64", "N": "64", "K": "64"})
    text = "block C:\n" + "".join(f"  unroll q{n}\n" for n in range(statements))
    start = time.perf_counter()
    schedule = parse(text, "long.sched")
    parsed = time.perf_counter()
    result = check(schedule, op.func, target)
    checked = time.perf_counter()
    render_all(result.diagnostics, text)
    rendered = time.perf_counter()
    assert len(result.diagnostics) == statements
    return LongSchedule(statements, parsed - start, checked - parsed, rendered - checked)


# --- the report ----------------------------------------------------------------------------------


def render_report(
    rows: list[Row],
    frontend: Frontend,
    target: Target,
    repeat: int,
    long: LongSchedule | None = None,
) -> str:
    lines = [
        f"# schedlang examples: unscheduled vs schedule vs numpy ({date.today().isoformat()})",
        "",
        f"- machine: {target.cpu or 'unknown CPU'}, {os.cpu_count()} cores; llvm target "
        f"`{target.tvm_config}`",
        f"- TVM {tvm.__version__}, TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}; "
        f"medians of {repeat} repeats (each ≥ {MIN_REPEAT_S * 1000:g} ms); kernels slower "
        f"than {SLOW_KERNEL_S:g} s: median of 3 single runs",
        f"- numpy {np.__version__}, BLAS: {blas_description()}",
        "",
        "| schedule | op | MFLOP | unscheduled | schedlang | numpy | schedlang GFLOP/s "
        "| numpy GFLOP/s | vs unscheduled | vs numpy | others' CPU |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        numpy_cells = ["–", "–", "–"]
        if row.numpy_s is not None:
            numpy_cells = [
                duration(row.numpy_s),
                f"{row.flops / row.numpy_s / 1e9:.1f}",
                f"{row.numpy_s / row.scheduled_s:.2f}x",
            ]
        name = row.schedule + (f" ({row.warnings} warnings)" if row.warnings else "")
        lines.append(
            f"| {name} | {row.op} | {row.flops / 1e6:.3g} | {duration(row.unscheduled_s)} "
            f"| {duration(row.scheduled_s)} | {numpy_cells[0]} "
            f"| {row.flops / row.scheduled_s / 1e9:.1f} | {numpy_cells[1]} "
            f"| {row.unscheduled_s / row.scheduled_s:.1f}x | {numpy_cells[2]} "
            f"| {'?' if row.other_load is None else f'{row.other_load:.0%}'} |"
        )
    lines += [
        "",
        "`vs unscheduled` and `vs numpy`: how many times faster the schedlang build is (above 1: "
        "faster). numpy runs the op's reference (`A @ B` is BLAS; the others are numpy array "
        "code). `others' CPU`: the share of the machine's CPU time other processes used while the "
        "row was timed; above a few percent the row's parallel timings are unreliable.",
        "",
        f"## Front-end overhead ({frontend.schedule}, median of {frontend.runs})",
        "",
        "| stage | time | share |",
        "|---|--:|--:|",
    ]
    total = frontend.parse_s + frontend.check_lower_s + frontend.compile_s
    for stage, seconds in (
        ("parse", frontend.parse_s),
        ("check + lower (one pass)", frontend.check_lower_s),
        ("tvm.compile of the lowered function", frontend.compile_s),
    ):
        lines.append(f"| {stage} | {duration(seconds)} | {seconds / total:.0%} |")
    front = frontend.parse_s + frontend.check_lower_s
    lines += ["", f"parse + check + lower: {front / frontend.compile_s:.1%} of `tvm.compile`."]
    if long is not None:
        lines += [
            "",
            f"## A long schedule ({long.statements:,} statements, one error each, run once)",
            "",
            "| stage | time |",
            "|---|--:|",
            f"| parse | {duration(long.parse_s)} |",
            f"| check | {duration(long.check_s)} |",
            f"| render the diagnostics | {duration(long.render_s)} |",
        ]
    return "\n".join(lines) + "\n"


def blas_description() -> str:
    """Which BLAS numpy calls, and with how many threads when threadpoolctl can tell."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        threadpool_info = None
    if threadpool_info is not None:
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if pools:
            return "; ".join(
                f"{p['internal_api']} {p.get('version')} ({p.get('architecture')}, "
                f"{p['num_threads']} threads, via threadpoolctl)"
                for p in pools
            )
    config = np.show_config(mode="dicts")
    blas = config.get("Build Dependencies", {}).get("blas", {})
    detail = blas.get("openblas configuration") or blas.get("version") or "unknown version"
    env = [
        f"{k}={os.environ[k]}"
        for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
        if k in os.environ
    ]
    threads = ", ".join(env) if env else "thread count not set (OpenBLAS: one per core)"
    return f"{blas.get('name', 'unknown')} — {detail} (np.show_config; {threads})"


def duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
