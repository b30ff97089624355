"""Round trips with TVM's own formats, as a spec.

- Every example schedule (CPU and CUDA) goes DSL → TVM trace (JSON) → DSL, and the second DSL
  lowers to the same function (structurally, and as the same TVMScript text).
- A schedule exported to a MetaSchedule JSONDatabase is found and built by stock TVM
  (`ms.tir_integration.compile_tir`), and the built kernel matches numpy.
- Traces MetaSchedule itself makes (its default llvm design space, sampled decisions and all,
  post-processed as it does before building a candidate) import as schedlang that parses, checks
  clean and lowers to the trace's function, also through a JSONDatabase written by TVM.
- What schedlang cannot say is reported at the instruction, rendered like any diagnostic
  (tests/golden/interop/).
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from typer.testing import CliRunner

from schedlang import cli, interop
from schedlang.checker.check import check
from schedlang.checker.pipeline import lower
from schedlang.core.diagnostics import DiagnosticError, SchedlangError, Severity, render_all
from schedlang.core.ops import load_op
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse
from schedlang.store.db import Database
from schedlang.store.records import Record, Status, op_key

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
OP_LINE = re.compile(r"# op: (?P<path>\S+\.py)(?P<defines>(?: -D \w+=\S+)*)")
SMALL_MATMUL = {"M": "64", "N": "64", "K": "64"}
CPU = resolve_target("llvm", cores=2)  # MetaSchedule's parallel hint depends on the core count
GPU = resolve_target("cuda")


def cpu_example(path: Path) -> tuple[Path, dict[str, str]]:
    """`matmul_4x4.sched` schedules `matmul_4x4.py`; `batch_matmul.sched` `batch_matmul.py`."""
    ops = [p for p in EXAMPLES.glob("*.py") if path.stem == p.stem or path.stem.startswith(p.stem)]
    return max(ops, key=lambda p: len(p.stem)), {}


def cuda_example(path: Path) -> tuple[Path, dict[str, str]]:
    match = OP_LINE.fullmatch(path.read_text(encoding="utf-8").splitlines()[0])
    assert match, f"{path.name} must name its op on its first line"
    defines = dict(d.split("=", 1) for d in match["defines"].split(" -D ") if d.strip())
    return ROOT / match["path"], defines


EXAMPLE_CASES = [
    *((p, cpu_example(p), CPU) for p in sorted(EXAMPLES.glob("*.sched"))),
    *((p, cuda_example(p), GPU) for p in sorted((EXAMPLES / "cuda").glob("*.sched"))),
]


def assert_same_function(actual, expected) -> None:
    """Structurally equal, whatever the attributes naming the function or marking it scheduled."""
    for attr in ("global_symbol", "tirx.is_scheduled"):
        actual, expected = actual.without_attr(attr), expected.without_attr(attr)
    tvm.ir.assert_structural_equal(actual, expected)


def example_id(case) -> str:
    return str(case[0].relative_to(EXAMPLES))


# --- DSL → trace → DSL ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", EXAMPLE_CASES, ids=[example_id(c) for c in EXAMPLE_CASES])
def test_example_round_trips_through_a_trace(case) -> None:
    path, (op_path, defines), target = case
    op = load_op(str(op_path), defines)
    text = path.read_text(encoding="utf-8")
    if "fast_math" in text:  # not a TVM primitive: refused, and the rest round-trips
        with pytest.raises(SchedlangError, match="`fast_math` rewrites the block's TIR itself"):
            interop.to_trace(op.func, parse(text, str(path)), target)
        text = "\n".join(line for line in text.splitlines() if "fast_math" not in line) + "\n"
    lowered = lower(parse(text, str(path)), op.func, target)

    # The trace, as JSON text, replays to the scheduled function on a fresh schedule.
    trace_json = json.loads(json.dumps(interop.trace_to_json(lowered.trace)))
    replayed = s_tir.Schedule(op.func)
    s_tir.Trace.apply_json_to_schedule(trace_json, replayed)
    assert_same_function(replayed.mod["main"], lowered.func)

    imported = interop.decompile(trace_json, op.func, target)
    assert imported.complete and not [d for d in imported.diagnostics if d.is_error]
    again = lower(parse(imported.text, "<imported>"), op.func, target)
    tvm.ir.assert_structural_equal(again.func, lowered.func)
    assert again.script() == lowered.script()


def test_imported_text_uses_schedlangs_names() -> None:
    op = load_op(str(EXAMPLES / "matmul.py"), SMALL_MATMUL)
    schedule = (
        "block C:\n  tile i, j by 8x16\n  reorder i.o, j.o, k, i.i, j.i\n  fuse i.o, j.o as ij\n"
        "  parallel ij\n  cache_write C local at ij\n  vectorize j.i\n"
        "  decompose_reduction at k\n\nblock C_local:\n  vectorize ax1\n"
    )
    text = interop.from_trace(interop.to_trace(op.func, schedule, CPU), op.func, CPU)
    assert text == (  # a tile is two splits and a reorder; `as` names are not in the trace
        "block C:\n  split i by 8\n  split j by 16\n  reorder i.o, j.o, i.i, j.i\n"
        "  reorder i.o, j.o, k, i.i, j.i\n  fuse i.o, j.o\n  parallel i.o_j.o\n"
        "  cache_write C local at i.o_j.o\n  vectorize j.i\n  decompose_reduction at k\n"
        "\nblock C_local:\n  vectorize ax1\n"
    )


# --- export: a MetaSchedule database stock TVM builds from ---------------------------------------


def test_exported_record_is_built_by_stock_compile_tir(tmp_path: Path) -> None:
    op = load_op(str(EXAMPLES / "matmul.py"), {"M": "128", "N": "128", "K": "128"})
    schedule = (EXAMPLES / "matmul.sched").read_text(encoding="utf-8")
    record = interop.export_metaschedule(tmp_path, op.func, schedule, CPU, [2e-4, 3e-4])
    assert record.added and record.run_secs == (2e-4, 3e-4)
    assert {p.name for p in tmp_path.iterdir()} == {interop.WORKLOAD_FILE, interop.RECORD_FILE}

    database = ms.database.JSONDatabase(work_dir=str(tmp_path), allow_missing=False)
    sch = ms.tir_integration.compile_tir(database, op.func, CPU.to_tvm())
    assert sch is not None, "compile_tir did not find the exported record"
    expected = lower(parse(schedule), op.func, CPU).func
    assert_same_function(sch.mod["main"], expected)

    executable = tvm.compile(sch.mod, target=CPU.to_tvm())
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((128, 128), dtype=np.float32) for _ in range(2))
    c = tvm.runtime.tensor(np.zeros((128, 128), np.float32), tvm.cpu())
    executable(tvm.runtime.tensor(a, tvm.cpu()), tvm.runtime.tensor(b, tvm.cpu()), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_metaschedule_picks_the_fastest_export_and_exports_once(tmp_path: Path) -> None:
    op = load_op(str(EXAMPLES / "matmul.py"), SMALL_MATMUL)
    slow, fast = "split j by 8", "split j by 16; reorder i, j.o, k, j.i; vectorize j.i"
    interop.export_metaschedule(tmp_path, op.func, slow, CPU, [3e-5])
    interop.export_metaschedule(tmp_path, op.func, fast, CPU, [1e-5])
    assert not interop.export_metaschedule(tmp_path, op.func, fast, CPU, [1e-5]).added

    database = ms.database.JSONDatabase(work_dir=str(tmp_path), allow_missing=False)
    assert len(database) == 2
    record = database.query_tuning_record(interop.workload(op.func), CPU.to_tvm(), "main")
    assert interop.trace_to_json(record.trace) == interop.trace_to_json(
        interop.to_trace(op.func, fast, CPU)
    )
    assert interop.from_metaschedule(tmp_path, op.func).endswith(
        "\n\nblock C:\n  split j by 16\n  reorder i, j.o, k, j.i\n  vectorize j.i\n"
    )


def test_best_records_of_a_schedlang_database_export_and_import_back(tmp_path: Path) -> None:
    op = load_op(str(EXAMPLES / "matmul.py"), SMALL_MATMUL)
    fast = "split j by 16\nreorder i, j.o, k, j.i\nvectorize j.i\n"
    schedules = {"split j by 8\n": 3e-5, fast: 1e-5}
    with Database(tmp_path / "schedlang.store.db") as db:
        for text, seconds in schedules.items():
            db.add(tuning_record(op.func, text, seconds))
        exported = interop.export_best(tmp_path / "ms", db, CPU, [op.func], n=2)
    assert [e.run_secs for e in exported] == [(1e-5, 1e-5), (3e-5, 3e-5)]
    imported = interop.import_metaschedule(tmp_path / "ms", op.func, CPU)
    fastest = lower(parse(fast), op.func, CPU)
    assert_same_function(lower(parse(imported.text), op.func, CPU).func, fastest.func)


def tuning_record(func, schedule: str, seconds: float) -> Record:
    return Record(
        op_key=op_key(func),
        op_name="matmul",
        target_key=CPU.key,
        target=CPU.tvm_config,
        schedule=schedule,
        knobs={},
        template=None,
        status=Status.OK,
        reason="",
        latencies_s=(seconds, seconds),
        median_s=seconds,
        gflops=1.0,
        proposer="human",
        seed=None,
        created_at=0.0,
        schedlang_version="0.1.0",
        tvm_version=tvm.__version__,
    )


@pytest.mark.parametrize(
    ("schedule", "latencies", "message"),
    [
        ("", [1e-3], "an empty schedule has an empty trace, which MetaSchedule ignores"),
        ("parallel i", [], "run times must be positive numbers of seconds, got []"),
        ("parallel i", [0.0], "run times must be positive numbers of seconds, got [0.0]"),
    ],
)
def test_export_refuses_what_metaschedule_would_ignore(tmp_path, schedule, latencies, message):
    op = load_op(str(EXAMPLES / "matmul.py"), SMALL_MATMUL)
    with pytest.raises(SchedlangError) as raised:
        interop.export_metaschedule(tmp_path, op.func, schedule, CPU, latencies)
    assert raised.value.message == message


# --- import: traces MetaSchedule makes -----------------------------------------------------------


def metaschedule_sketches(op, seed: int = 0) -> tuple[list, list]:
    """MetaSchedule's default llvm design space of `op` (its sketches, their decisions sampled
    with `seed`), each also post-processed as MetaSchedule does before it builds a candidate. No
    tuning, no builds: well under a second for the example ops at small sizes."""
    with pytest.MonkeyPatch.context() as patch:
        # TuneContext imports tvm.s_tir.tensor_intrin (30+ s here) to register tensor intrinsics,
        # which the default llvm rules do not use.
        name = "tvm.s_tir.tensor_intrin"
        patch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
        context = ms.TuneContext(
            mod=interop.workload(op.func),
            target=CPU.to_tvm(),
            space_generator=ms.space_generator.PostOrderApply(
                sch_rules=ms.ScheduleRule.create("llvm"),
                postprocs=ms.Postproc.create("llvm"),
                mutator_probs={},
            ),
            task_name="main",
            rand_state=seed,
            num_threads=1,
        )
        spaces = context.generate_design_space()
        processed = []
        for space in context.generate_design_space():
            space.enter_postproc()
            assert all(p.apply(space) for p in context.space_generator.postprocs)
            processed.append(space)
    return spaces, processed


@pytest.fixture(scope="module")
def design_spaces():
    """The design space of a 64³ matmul (three sketches), as sampled and post-processed."""
    op = load_op(str(EXAMPLES / "matmul.py"), SMALL_MATMUL)
    return op, *metaschedule_sketches(op)


def test_metaschedule_traces_import_as_schedules_that_check_clean(design_spaces) -> None:
    op, _, processed = design_spaces
    assert len(processed) == 3
    for sch in processed:
        imported = interop.decompile(sch.trace, op.func, CPU)
        schedule = parse(imported.text, "<imported>")
        result = check(schedule, op.func, CPU)
        assert result.ok and result.lowered is not None, render_all(result.diagnostics)
        assert_same_function(result.lowered.func, interop.without_hints(sch.mod["main"]))
        notes = [d.message for d in imported.diagnostics if d.severity is Severity.NOTE]
        assert notes == [
            "dropped MetaSchedule's bookkeeping annotation `meta_schedule.tiling_structure` "
            "(1x): TVM drops it when it builds"
        ]


@pytest.mark.parametrize(
    ("file", "defines", "options"),
    [
        ("softmax.py", {"rows": "64", "cols": "64"}, ("factor_axis 1", "keep_unit_loops")),
        ("conv2d.py", {}, ("keep_unit_loops",)),
    ],
    ids=["softmax", "conv2d"],
)
def test_metaschedule_sketches_that_need_the_options_import(file, defines, options) -> None:
    """Row reductions (rfactor with factor_axis=1) and a batch of one (unit loops kept by every
    move): none of these imported before schedlang had the two options."""
    op = load_op(str(EXAMPLES / file), defines)
    _, processed = metaschedule_sketches(op)
    texts = []
    for sch in processed:
        imported = interop.decompile(sch.trace, op.func, CPU)
        assert imported.complete, imported.render()
        result = check(parse(imported.text, "<imported>"), op.func, CPU)
        assert result.ok and result.lowered is not None, render_all(result.diagnostics)
        assert_same_function(result.lowered.func, interop.without_hints(sch.mod["main"]))
        lines = imported.text.splitlines()  # a loop annotated once per block under it: one line
        assert not [a for a, b in itertools.pairwise(lines) if a == b and "pragma" in a]
        texts.append(imported.text)
    for option in options:
        assert any(option in text for text in texts), option


def test_a_softmax_sketch_reads_like_schedlang(golden) -> None:
    op = load_op(str(EXAMPLES / "softmax.py"), {"rows": "64", "cols": "64"})
    _, processed = metaschedule_sketches(op)
    golden("interop/metaschedule_softmax.sched", interop.from_trace(processed[2].trace, op.func))


def test_metaschedule_trace_reads_like_schedlang(design_spaces, golden) -> None:
    op, _, processed = design_spaces
    golden("interop/metaschedule_matmul.sched", interop.from_trace(processed[0].trace, op.func))


def test_the_bookkeeping_annotation_is_all_that_differs(design_spaces) -> None:
    _op, _, processed = design_spaces
    func = processed[0].mod["main"]
    assert "meta_schedule.tiling_structure" in func.script()
    stripped = interop.without_hints(func)
    assert "meta_schedule" not in stripped.script()
    annotation = r'\n *T\.sblock_attr\(\{"meta_schedule\.tiling_structure": "SSRSRS"\}\)'
    assert stripped.script() == re.sub(annotation, "", func.script())


def test_a_design_space_gets_its_hints_applied_as_metaschedule_would(design_spaces) -> None:
    op, spaces, _ = design_spaces
    sch = spaces[1]
    imported = interop.decompile(sch.trace, op.func, CPU)
    assert "RewriteParallelVectorizeUnroll" in imported.diagnostics[0].message
    assert "# MetaSchedule's postprocessing" in imported.text
    expected = s_tir.Schedule(op.func)
    sch.trace.apply_to_schedule(expected, remove_postproc=False)
    assert ms.postproc.RewriteParallelVectorizeUnroll().apply(expected)
    assert_same_function(
        lower(parse(imported.text), op.func, CPU).func, interop.without_hints(expected.mod["main"])
    )


def test_the_best_record_of_a_metaschedule_database_imports(design_spaces, tmp_path) -> None:
    """A JSONDatabase written by TVM's own API, as tune_tir writes it; the fastest record wins."""
    op, _, processed = design_spaces
    database = ms.database.JSONDatabase(work_dir=str(tmp_path), allow_missing=True)
    workload = database.commit_workload(interop.workload(op.func))
    for sch, seconds in zip(processed, (3e-5, 1e-5, 2e-5), strict=True):
        database.commit_tuning_record(
            ms.database.TuningRecord(sch.trace, workload, [seconds], CPU.to_tvm())
        )
    text = interop.from_metaschedule(tmp_path, op.func, CPU)
    assert text.startswith(f"# imported from the MetaSchedule database {tmp_path}: 10 us")
    stock = ms.tir_integration.compile_tir(
        ms.database.JSONDatabase(work_dir=str(tmp_path), allow_missing=False),
        op.func,
        CPU.to_tvm(),
    )
    assert_same_function(
        lower(parse(text), op.func, CPU).func, interop.without_hints(stock.mod["main"])
    )


def test_import_finds_no_record_for_another_op_or_target(design_spaces, tmp_path) -> None:
    op, _, processed = design_spaces
    database = ms.database.JSONDatabase(work_dir=str(tmp_path), allow_missing=True)
    workload = database.commit_workload(interop.workload(op.func))
    database.commit_tuning_record(
        ms.database.TuningRecord(processed[0].trace, workload, [1e-5], CPU.to_tvm())
    )
    other = load_op(str(EXAMPLES / "matmul.py"), {"M": "32", "N": "64", "K": "64"})
    with pytest.raises(SchedlangError, match="no record of this op among the 1 records"):
        interop.from_metaschedule(tmp_path, other.func)
    with pytest.raises(SchedlangError, match="no record of this op for this target") as raised:
        interop.from_metaschedule(tmp_path, op.func, GPU)
    assert raised.value.notes[0].startswith('records of this op exist for: {"kind": "llvm"')
    with pytest.raises(SchedlangError, match="is not a MetaSchedule database"):
        interop.from_metaschedule(tmp_path / "missing", op.func)


# --- what schedlang cannot say -------------------------------------------------------------------


def matmul_schedule() -> tuple[object, s_tir.Schedule]:
    op = load_op(str(EXAMPLES / "matmul.py"), SMALL_MATMUL)
    sch = s_tir.Schedule(op.func)
    return op, sch


def test_unsupported_instructions_are_reported_together(golden) -> None:
    op, sch = matmul_schedule()
    block = sch.get_sblock("C")
    i, j, _ = sch.get_loops(block)
    sch.split(i, [None, 16])
    sch.transform_layout(block, ("write", 0), lambda x, y: (y, x))
    sch.annotate(j, "pragma_debug_skip_region", 1)
    sch.cache_write(block, 0, "global")
    sch.set_scope(block, 0, "local")
    with pytest.raises(DiagnosticError) as raised:
        interop.decompile(sch.trace, op.func, CPU)
    golden("interop/unsupported_instructions.txt", raised.value.render() + "\n")


def test_partial_keeps_what_translates_and_comments_out_the_rest(golden) -> None:
    op, sch = matmul_schedule()
    block = sch.get_sblock("C")
    i, _, _ = sch.get_loops(block)
    sch.split(i, [None, 16])
    sch.transform_layout(block, ("write", 0), lambda x, y: (y, x))
    sch.parallel(sch.get_loops(block)[0])
    imported = interop.decompile(sch.trace, op.func, CPU, partial=True)
    assert not imported.complete
    assert [d.severity for d in imported.diagnostics] == [Severity.WARNING]
    assert parse(imported.text).statements == parse("block C:\n  split i by 16\n").statements
    golden("interop/partial.sched", imported.text)


def test_loops_of_extent_one_kept_by_compute_at_become_keep_unit_loops() -> None:
    op, sch = matmul_schedule()
    block = sch.get_sblock("C")
    _, j, _ = sch.get_loops(block)
    copy = sch.cache_read(block, 0, "global")
    sch.compute_at(copy, j, preserve_unit_loops=True)  # A[i, 0:64]: a loop of extent 1 stays
    text = interop.from_trace(sch.trace, op.func, CPU)
    assert text == "block C:\n  cache_read A global at j keep_unit_loops\n"
    assert_same_function(lower(parse(text), op.func, CPU).func, sch.mod["main"])


def test_keep_unit_loops_is_said_only_where_a_loop_of_extent_one_is_kept() -> None:
    op, sch = matmul_schedule()
    block = sch.get_sblock("C")
    _, j, _ = sch.get_loops(block)
    j_o, _ = sch.split(j, [None, 16])
    copy = sch.cache_read(block, 1, "global")
    sch.compute_at(copy, j_o, preserve_unit_loops=True)  # B[0:64, j.o*16:+16]: no unit loop
    text = interop.from_trace(sch.trace, op.func, CPU)
    assert text == "block C:\n  split j by 16\n  cache_read B global at j.o\n"
    assert_same_function(lower(parse(text), op.func, CPU).func, sch.mod["main"])


def test_a_move_to_the_first_place_it_may_go_is_said_as_that_index() -> None:
    # index=-2 is TVM's first place the block may go: after the producers already in the loop's
    # body, which is not always 0 (here C's producer B comes first).
    from tvm import te

    a = te.placeholder((32, 32), name="A")
    b = te.compute((32, 32), lambda x, y: a[x, y] * 2.0, name="B")
    c = te.compute((32, 32), lambda i, j: b[i, j] + 1.0, name="C")
    func = te.create_prim_func([a, c])
    sch = s_tir.Schedule(func)
    x, _ = sch.get_loops(sch.get_sblock("B"))
    sch.reverse_compute_at(sch.get_sblock("C"), x, index=-2)
    text = interop.from_trace(sch.trace, func, CPU)
    assert text == "block B:\n  reverse_compute_at C x index 1\n"
    assert_same_function(lower(parse(text), func, CPU).func, sch.mod["main"])


@pytest.mark.parametrize(
    ("factor_axis", "said"), [(0, ""), (1, " factor_axis 1"), (-1, " factor_axis 2")]
)
def test_rfactor_keeps_its_factor_axis(factor_axis: int, said: str) -> None:
    op, sch = matmul_schedule()
    _, _, k = sch.get_loops(sch.get_sblock("C"))
    _, k_i = sch.split(k, [None, 16])
    sch.rfactor(k_i, factor_axis=factor_axis)  # -1: last, as numpy counts
    text = interop.from_trace(sch.trace, op.func, CPU)
    assert text == f"block C:\n  split k by 16\n  rfactor k.i{said}\n"
    assert_same_function(lower(parse(text), op.func, CPU).func, sch.mod["main"])


def test_a_hint_no_postprocessor_applied_is_an_error() -> None:
    op, sch = matmul_schedule()
    _, j, _ = sch.get_loops(sch.get_sblock("C"))
    sch.annotate(j, "meta_schedule.cooperative_fetch", 4)
    with pytest.raises(DiagnosticError, match=r"hint `meta_schedule.cooperative_fetch`"):
        interop.decompile(sch.trace, op.func, CPU)


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ("[1, 2", "the trace is not valid JSON"),
        ('{"insts": []}', "this JSON is not a TVM trace"),
        (
            '[[["GetSBlock", [], ["C", "main"], ["b0"]],'
            ' ["GetLoops", ["b0"], [], ["l1", "l2", "l3"]],'
            ' ["SamplePerfectTile", ["l1"], [2, 64], ["v4", "v5"]]], []]',
            "instruction #2 of the trace (SamplePerfectTile) has no decision",
        ),
        (
            '[[["GetSBlock", [], ["conv2d", "main"], ["b0"]]], []]',
            "the trace does not apply to this op",
        ),
    ],
)
def test_a_bad_trace_is_one_clear_error(trace: str, message: str) -> None:
    op = load_op(str(EXAMPLES / "matmul.py"), SMALL_MATMUL)
    with pytest.raises(SchedlangError) as raised:
        interop.from_trace(trace, op.func)
    assert raised.value.message.startswith(message)


# --- the command line ----------------------------------------------------------------------------


def test_cli_export_then_import(tmp_path: Path) -> None:
    runner = CliRunner()
    op = [str(EXAMPLES / "matmul.py"), "-D", "M=64", "-D", "N=64", "-D", "K=64"]
    schedule = ["-s", "split j by 16; reorder i, j.o, k, j.i; vectorize j.i"]
    ms_db, trace = str(tmp_path / "ms"), str(tmp_path / "trace.json")
    result = runner.invoke(
        cli.app,
        ["export", *op, *schedule, "--ms-db", ms_db, "--trace-json", trace, "--latency", "1e-5"],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"wrote the trace (9 instructions) to {trace}\n"
        f"{ms_db}: added a record for matmul (mean 10 us over 1 run)\n"
    )
    expected = "block C:\n  split j by 16\n  reorder i, j.o, k, j.i\n  vectorize j.i\n"

    result = runner.invoke(cli.app, ["import", *op, "--trace", trace])
    assert result.exit_code == 0, result.output
    assert result.stdout == expected

    output = tmp_path / "imported.sched"
    result = runner.invoke(cli.app, ["import", *op, "--ms-db", ms_db, "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert output.read_text(encoding="utf-8").endswith("\n\n" + expected)


def test_cli_import_reports_what_it_cannot_translate(tmp_path: Path) -> None:
    _op, sch = matmul_schedule()
    block = sch.get_sblock("C")
    sch.transform_layout(block, ("write", 0), lambda x, y: (y, x))
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(interop.trace_to_json(sch.trace)), encoding="utf-8")
    args = ["import", str(EXAMPLES / "matmul.py"), "-D", "M=64", "-D", "N=64", "-D", "K=64"]
    result = CliRunner().invoke(cli.app, [*args, "--trace", str(trace)])
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"{trace}:2:1: error: schedlang transforms only buffers a schedule made; `C` is a "
        "parameter of the function\n"
    )
    assert "Traceback" not in result.output
    result = CliRunner().invoke(cli.app, [*args, "--trace", str(trace), "--partial"])
    assert result.exit_code == 0
    assert "# not translated, from instruction #1 on:" in result.stdout
    assert "warning: schedlang transforms only buffers a schedule made" in result.stderr


def test_sampled_compute_locations_become_statements() -> None:
    op = load_op(str(EXAMPLES / "softmax.py"), {"rows": "64", "cols": "64"})
    sch = s_tir.Schedule(op.func)
    row_max, exp = sch.get_sblock("row_max"), sch.get_sblock("exp")
    sch.compute_at(row_max, sch.sample_compute_location(row_max, decision=-1))  # root: stays
    sch.compute_at(exp, sch.sample_compute_location(exp, decision=-2))  # inline
    row_sum = sch.get_sblock("row_sum")
    sch.compute_at(row_sum, sch.sample_compute_location(row_sum, decision=0))
    assert interop.from_trace(sch.trace, op.func) == (
        "block row_max:\n  compute_inline exp\n\nblock normalize:\n  compute_at row_sum i\n"
    )


def test_the_schedules_in_the_docs_parse() -> None:
    text = (ROOT / "docs" / "interop.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```schedlang\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 3
    for block in blocks:
        parse(block, "docs/interop.md")
