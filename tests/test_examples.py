"""Every schedule in examples/ is a checked, correct, timed program.

`examples/<op>.sched` (or `<op>_<variant>.sched`) schedules the op defined in `examples/<op>.py`.
Each one must parse, be stored in canonical form, check without errors, build for llvm, and match
the op's numpy reference. Each is then timed and the result printed (`pytest -s` shows it); timings
are never asserted, since they depend on the machine and on what else it runs.

A model file (`examples/models/*.py`, `@schedlang.model`) is built whole, as a Relax model, and
must match its own numpy reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlang.checker.check import check
from schedlang.core.diagnostics import render_all
from schedlang.core.opinfo import flop_count
from schedlang.core.ops import Op, load_op
from schedlang.core.target import resolve_target
from schedlang.lang.printer import format_schedule, format_stmt
from schedlang.lang.syntax import parse
from schedlang.models.graph import build_model, compare_outputs, run_model, time_model
from schedlang.models.model_file import load_model
from schedlang.run.build import compile_func
from schedlang.run.measure import set_runtime_threads, time_kernel, verify
from schedlang.store.db import Database

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCHEDULES = sorted(EXAMPLES.glob("*.sched"))
OP_FILES = sorted(EXAMPLES.glob("*.py"))
MODEL_FILES = sorted(
    (EXAMPLES / "models").glob("*.py")
)  # whole Relax models (schedlang.models.graph)
# The unscheduled matmul 1024 takes ~8 s a run: time unscheduled builds only below this.
UNSCHEDULED_TIMING_MAX_FLOPS = 500e6

set_runtime_threads()  # before the first kernel runs: TVM's pool reads TVM_NUM_THREADS once


def op_file_for(schedule: Path) -> Path | None:
    """`matmul.sched` → `matmul.py`; `matmul_packed.sched` → `matmul.py`, unless an op file
    named `matmul_packed.py` exists: the longest op-file name the schedule's name starts with."""
    stem = schedule.stem
    matches = [
        op_file
        for op_file in OP_FILES
        if stem == op_file.stem or stem.startswith((f"{op_file.stem}_", f"{op_file.stem}."))
    ]
    return max(matches, key=lambda p: len(p.stem), default=None)


@pytest.fixture(scope="module")
def llvm():
    return resolve_target("llvm")


def test_examples_exist():
    assert SCHEDULES, f"no .sched files in {EXAMPLES}"


def test_every_op_file_has_a_schedule():
    scheduled = {op_file_for(schedule) for schedule in SCHEDULES}
    unscheduled = [p.name for p in OP_FILES if p not in scheduled]
    assert not unscheduled, f"op files without an example schedule: {unscheduled}"


def test_matmul_4x4_is_the_seed_schedule():
    schedule = parse((EXAMPLES / "matmul_4x4.sched").read_text(encoding="utf-8"))
    statements = [format_stmt(stmt) for stmt in schedule.statements]
    assert statements == ["tile i, j by 2x2", "unroll k"]


@pytest.mark.parametrize("schedule_path", SCHEDULES, ids=[p.name for p in SCHEDULES])
def test_example(schedule_path: Path, llvm) -> None:
    op_path = op_file_for(schedule_path)
    assert op_path is not None, (
        f"{schedule_path.name} has no op file: name it after one of "
        f"{', '.join(p.name for p in OP_FILES)}"
    )
    text = schedule_path.read_text(encoding="utf-8")
    schedule = parse(text, str(schedule_path))
    assert format_schedule(schedule) == text, (
        f"{schedule_path.name} is not canonically formatted: run `schedlang fmt` on it"
    )

    op = load_op(str(op_path))
    result = check(schedule, op.func, llvm)
    assert result.ok, render_all(result.diagnostics, text)
    assert result.lowered is not None

    executable = compile_func(result.lowered.func, llvm)
    ok, reason = verify(op, executable, llvm)
    assert ok, f"{schedule_path.name}: {reason}"

    timing = time_kernel(op, executable, llvm, repeat=5, min_repeat_ms=50)
    line = f"{schedule_path.name:24} {_duration(timing.median_s)}  {timing.gflops:7.1f} GFLOP/s"
    line += _against_unscheduled(op, llvm, timing.median_s)
    warnings = [d for d in result.diagnostics if not d.is_error]
    if warnings:
        line += f"  ({len(warnings)} warning{'s' * (len(warnings) > 1)})"
    print("\n" + line, end="")


@pytest.mark.parametrize("model_path", MODEL_FILES, ids=[p.name for p in MODEL_FILES])
def test_model_example(model_path: Path, llvm, tmp_path) -> None:
    """A model builds with an empty database (every function gets dlight's schedule or none) and
    matches its reference (numpy's, or the framework's: PyTorch for a torch.nn.Module)."""
    if "import torch" in model_path.read_text():
        pytest.importorskip("torch")
    model = load_model(str(model_path))
    with Database(tmp_path / "empty.db") as db:
        executable, applied = build_model(model.mod, llvm, db)
    expected = model.expected_outputs()
    assert expected is not None, f"{model_path.name}: give @schedlang.model a reference"
    ok, reason = compare_outputs(run_model(executable, model.inputs, llvm), expected)
    assert ok, f"{model_path.name}: {reason}"
    (latency,) = time_model(executable, model.inputs, llvm, repeat=1, min_repeat_ms=0)
    print(f"\n{model_path.name:24} {_duration(latency)}  untuned, {len(applied)} functions", end="")


def _against_unscheduled(op: Op, target, scheduled_s: float) -> str:
    if flop_count(op.func) > UNSCHEDULED_TIMING_MAX_FLOPS:
        return "  (unscheduled not timed: too slow)"
    unscheduled = time_kernel(op, compile_func(op.func, target), target, repeat=3, min_repeat_ms=50)
    speedup = unscheduled.median_s / scheduled_s
    return f"  unscheduled {_duration(unscheduled.median_s)}: {speedup:.1f}x"


def _duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:9.2f} us"
    return f"{seconds * 1e3:9.2f} ms"


# --- bench/bench_examples.py's packed GEMM at 1000 x 999 x 997 ----------------------------------

BENCH_SCHEDULES = sorted((EXAMPLES.parent / "bench").glob("packed_gemm_odd*.sched"))


@pytest.mark.parametrize("schedule_path", BENCH_SCHEDULES, ids=lambda p: p.name)
def test_bench_packed_gemm_schedules_check_clean(schedule_path: Path, llvm) -> None:
    """The odd-shape schedules the benchmark times (AVX2 and AVX-512 panels) check clean; the
    benchmark builds and verifies them before it times them."""
    func = load_op(str(EXAMPLES / "matmul.py"), {"M": "1000", "N": "999", "K": "997"}).func
    text = schedule_path.read_text()
    result = check(parse(text, str(schedule_path)), func, llvm)
    assert result.lowered is not None, render_all(result.diagnostics, text)


def test_bench_picks_the_panels_for_the_core() -> None:
    import sys

    sys.path.insert(0, str(EXAMPLES.parent / "bench"))
    try:
        import bench_examples
    finally:
        sys.path.pop(0)
    avx2 = resolve_target('{"kind": "llvm", "mcpu": "skylake", "num-cores": 2}')
    avx512 = resolve_target('{"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}')
    names = [p.name for p, _, _ in bench_examples.packed_gemm_for(avx2)]
    assert names == ["matmul_packed.sched", "matmul_packed.sched", "packed_gemm_odd.sched"]
    names = [p.name for p, _, _ in bench_examples.packed_gemm_for(avx512)]
    assert names == [
        "matmul_packed_avx512.sched",
        "matmul_packed_avx512.sched",
        "packed_gemm_odd_avx512.sched",
    ]
    assert all(p.exists() for p, _, _ in bench_examples.packed_gemm_for(avx512))
