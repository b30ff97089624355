"""Whole models (schedlang.models.graph): a Relax model's PrimFuncs as tasks, the database's records
applied by a pass in the Relax build, dlight for the rest, model files, and the tune-model and
build-model commands.

Records are written by hand here (a schedule, verified and timed with schedlang.run.measure, then
`Database.add`), except in the tune-model test, which tunes a one-layer model for two trials.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import tvm
import tvm_ffi
from typer.testing import CliRunner

from schedlang.checker.pipeline import SCHEDULED_ATTR
from schedlang.cli import app
from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import describe
from schedlang.core.ops import from_primfunc, load_op
from schedlang.core.target import resolve_target
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse
from schedlang.models.graph import (
    ApplySchedlangDatabase,
    StaleRecordWarning,
    build_default,
    build_model,
    compare_outputs,
    extract_tasks,
    run_model,
    schedule_names,
    to_tir,
)
from schedlang.models.model_file import from_irmodule, load_model
from schedlang.models.renaming import rename_like
from schedlang.run.build import apply, compile_func
from schedlang.run.measure import set_runtime_threads, time_kernel, verify
from schedlang.store.db import Database
from schedlang.store.records import Record, Status, current_versions, op_key

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MLP = str(EXAMPLES / "models" / "mlp.py")
SMALL = {"batch": "8", "features": "32", "hidden": "64"}  # 8 x 32 → 64 → 64 → 32
SMALL_ARGS = [arg for key, value in SMALL.items() for arg in ("-D", f"{key}={value}")]
LLVM = resolve_target("llvm")
GPU = resolve_target("cuda")
# The first layer's matmul: a row of x per parallel task, 16 columns of w1 vectorized.
LAYER_SCHEDULE = """\
block matmul:
  split i1 by 16
  reorder i0, i1.o, k, i1.i
  parallel i0
  vectorize i1.i
"""
# examples/matmul.py's names (block C, loops i, j, k, buffers A, B, C) for the same matmul.
OP_FILE_SCHEDULE = """\
block C:
  split j by 16
  reorder i, j.o, k, j.i
  cache_read B global at j.o
  parallel i
  vectorize j.i
"""

set_runtime_threads()  # before the first kernel runs: TVM's pool reads TVM_NUM_THREADS once


@pytest.fixture(scope="module")
def mlp():
    return load_model(MLP, SMALL)


@pytest.fixture(scope="module")
def tasks(mlp):
    return {task.name: task for task in extract_tasks(mlp.mod, LLVM)}


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "records.db") as database:
        yield database


def add_record(db: Database, func, schedule: str, *, latency_s: float | None = None) -> Record:
    """A record of `schedule` for `func`, measured unless `latency_s` is given (for a schedule
    that no longer applies), with the names of `func` like the tuner's."""
    op = from_primfunc(func)
    if latency_s is None:
        executable = compile_func(apply(func, schedule, LLVM), LLVM)
        ok, reason = verify(op, executable, LLVM)
        assert ok, reason
        latencies = time_kernel(op, executable, LLVM, repeat=3, min_repeat_ms=10).latencies_s
    else:
        latencies = (latency_s,)
    median = sorted(latencies)[len(latencies) // 2]
    schedlang_version, tvm_version = current_versions()
    record = Record(
        op_key=op_key(func),
        op_name=op.name,
        target_key=LLVM.key,
        target=LLVM.tvm_config,
        schedule=format_schedule(parse(schedule)),
        knobs={},
        template=None,
        status=Status.OK,
        reason="",
        latencies_s=latencies,
        median_s=median,
        gflops=describe(op).flops / median / 1e9,
        proposer="human",
        seed=None,
        created_at=time.time(),
        schedlang_version=schedlang_version,
        tvm_version=tvm_version,
        extra={"names": schedule_names(func)},
    )
    db.add(record)
    stored = db.get(record.op_key, record.target_key, record.schedule)
    assert stored is not None and stored.id is not None
    return stored


def _apply_pass(mod, db: Database, target=LLVM, fallback="dlight"):
    schedule = ApplySchedlangDatabase(db, target, fallback)
    with target.to_tvm():
        return schedule(to_tir(mod, target)), schedule.applied


# --- tasks ---------------------------------------------------------------------------------------


def test_tasks_are_the_fused_layers_heaviest_first(tasks):
    names = list(tasks)
    assert names == ["fused_matmul1_add_relu", "fused_matmul_add_relu", "fused_matmul2_add1"]
    blocks = {name: [b.name for b in describe(task.op).blocks] for name, task in tasks.items()}
    assert blocks["fused_matmul_add_relu"] == ["matmul", "T_add", "compute"]
    assert blocks["fused_matmul2_add1"] == ["matmul", "T_add"]
    first = tasks["fused_matmul_add_relu"]
    assert first.calls == 1
    assert first.flops == 2 * 8 * 32 * 64 + 8 * 64 + 8 * 64  # multiply-adds, bias, ReLU
    assert str(first.op.func.params[0].shape[0].ty) == "int32"  # narrowed from Relax's int64


def test_unfused_tasks_are_the_operators_with_their_calls(mlp):
    calls = {task.name: task.calls for task in extract_tasks(mlp.mod, LLVM, fuse=False)}
    # Both hidden layers add a bias and apply ReLU to 8 x 64: one function each, called twice.
    assert calls == {"matmul1": 1, "matmul": 1, "matmul2": 1, "add": 2, "relu": 2, "add1": 1}


def test_a_repeated_layer_is_one_task_called_twice():
    model = load_model(MLP, {**SMALL, "layers": "4"})
    calls = {task.name: task.calls for task in extract_tasks(model.mod, LLVM)}
    assert calls == {
        "fused_matmul1_add_relu": 2,
        "fused_matmul_add_relu": 1,
        "fused_matmul2_add1": 1,
    }


def test_a_model_matmul_has_the_key_of_the_same_op_file(mlp):
    op = load_op(str(EXAMPLES / "matmul.py"), {"M": "8", "N": "64", "K": "32"})
    keys = {task.name: task.key for task in extract_tasks(mlp.mod, LLVM, fuse=False)}
    assert keys["matmul"] == op_key(op.func)
    assert keys["matmul1"] != op_key(op.func)  # 64 x 64: another shape


# --- the pass ------------------------------------------------------------------------------------


def test_a_record_is_applied_and_the_rest_falls_back_to_dlight(mlp, tasks, db):
    record = add_record(db, tasks["fused_matmul_add_relu"].op.func, LAYER_SCHEDULE)
    out, applied = _apply_pass(mlp.mod, db)

    got = {item.function: item.summary() for item in applied}
    assert (
        got["fused_matmul_add_relu"]
        == f"schedlang record #{record.id} ({record.gflops:.1f} GFLOP/s)"
    )
    assert got["fused_matmul1_add_relu"] == got["fused_matmul2_add1"] == "dlight"
    scheduled = out["fused_matmul_add_relu"]
    assert scheduled.attrs[SCHEDULED_ATTR]
    assert "global_symbol" not in scheduled.attrs  # still private: the VM names it
    script = scheduled.script()
    assert "for i0 in T.parallel(8):" in script
    assert "for i1_1 in T.vectorized(16):" in script


def test_the_pass_leaves_the_callers_module_and_scheduled_functions_alone(mlp, tasks, db):
    add_record(db, tasks["fused_matmul_add_relu"].op.func, LAYER_SCHEDULE)
    lowered = to_tir(mlp.mod, LLVM)
    before = lowered["fused_matmul_add_relu"]
    schedule = ApplySchedlangDatabase(db, LLVM, fallback="dlight")
    with LLVM.to_tvm():
        once = schedule(lowered)
        twice = schedule(once)
    assert lowered["fused_matmul_add_relu"].same_as(before)
    assert {item.how for item in schedule.applied} == {"scheduled before"}
    tvm.ir.assert_structural_equal(twice, once)


def test_the_built_model_matches_numpy(mlp, tasks, db):
    add_record(db, tasks["fused_matmul_add_relu"].op.func, LAYER_SCHEDULE)
    executable, applied = build_model(mlp.mod, LLVM, db)
    assert [item.how for item in applied].count("schedlang") == 1
    outputs = run_model(executable, mlp.inputs, LLVM)
    assert compare_outputs(outputs, mlp.expected_outputs()) == (True, "matches the reference")
    default = run_model(build_default(mlp.mod, LLVM), mlp.inputs, LLVM)
    assert compare_outputs(outputs, default)[0]


def test_a_stale_record_is_skipped_with_a_warning(mlp, tasks, db):
    func = tasks["fused_matmul_add_relu"].op.func
    good = add_record(db, func, LAYER_SCHEDULE)
    # Faster, so tried first; it names an axis the function does not have.
    stale = add_record(db, func, "block matmul:\n  split j by 4\n", latency_s=good.median_s / 2)
    with pytest.warns(StaleRecordWarning, match=rf"record #{stale.id} no longer applies"):
        _, applied = _apply_pass(mlp.mod, db)
    item = next(a for a in applied if a.function == "fused_matmul_add_relu")
    assert item.record is not None and item.record.id == good.id
    assert "unknown axis `j`" in item.warnings[0]


def test_with_only_stale_records_the_function_falls_back(mlp, tasks, db):
    func = tasks["fused_matmul_add_relu"].op.func
    add_record(db, func, "block matmul:\n  split j by 4\n", latency_s=1e-3)
    with pytest.warns(StaleRecordWarning):
        out, applied = _apply_pass(mlp.mod, db, fallback="none")
    item = next(a for a in applied if a.function == "fused_matmul_add_relu")
    assert item.summary() == "unscheduled" and item.warnings
    assert SCHEDULED_ATTR not in out["fused_matmul_add_relu"].attrs


def test_an_op_file_record_applies_to_the_models_matmul(mlp, db):
    op = load_op(str(EXAMPLES / "matmul.py"), {"M": "8", "N": "64", "K": "32"})
    record = add_record(db, op.func, OP_FILE_SCHEDULE)
    executable, applied = build_model(mlp.mod, LLVM, db, fuse=False)
    got = {item.function: item for item in applied}
    assert got["matmul"].record is not None and got["matmul"].record.id == record.id
    outputs = run_model(executable, mlp.inputs, LLVM)
    assert compare_outputs(outputs, mlp.expected_outputs())[0]


# --- names ---------------------------------------------------------------------------------------


def test_rename_like_gives_a_function_the_names_of_its_twin(mlp):
    op = load_op(str(EXAMPLES / "matmul.py"), {"M": "8", "N": "64", "K": "32"})
    task = next(t for t in extract_tasks(mlp.mod, LLVM, fuse=False) if t.name == "matmul")
    renamed = rename_like(task.op.func, schedule_names(op.func))
    assert schedule_names(renamed) == {
        "blocks": ["C"],
        "loops": ["i", "j", "k"],
        "buffers": ["A", "B", "C"],
    }
    assert tvm_ffi.structural_equal(renamed, task.op.func)


def test_rename_like_refuses_names_that_would_clash(tasks):
    func = tasks["fused_matmul2_add1"].op.func
    names = schedule_names(func)
    with pytest.raises(SchedlangError, match="`T` cannot be given"):
        rename_like(func, {**names, "buffers": ["T", *names["buffers"][1:]]})
    with pytest.raises(SchedlangError, match="different loops"):
        rename_like(func, {**names, "loops": names["loops"][:-1]})


def test_rename_like_puts_only_plain_names_into_the_text_it_parses(tasks):
    # A record may come from anyone: a block "name" that closes the string would be code.
    func = tasks["fused_matmul2_add1"].op.func
    names = schedule_names(func)
    evil = 'x"); __import__("os").system("touch /tmp/pwned"); ("'
    with pytest.raises(SchedlangError, match="the record names its blocks oddly"):
        rename_like(func, {**names, "blocks": [evil, *names["blocks"][1:]]})


# --- GPU -----------------------------------------------------------------------------------------


def test_on_a_cpu_a_function_without_a_record_is_left_as_tvm_compile_leaves_it(mlp, db):
    """The default fallback (auto) gives dlight's CPU rules to nothing: measured, they made whole
    models slower than no schedule (docs/models.md, the pass)."""
    _, applied = _apply_pass(mlp.mod, db, fallback="auto")
    assert {item.how for item in applied} == {"unscheduled"}


def test_a_cuda_build_gets_dlight_kernels(mlp, db):
    executable, applied = build_model(mlp.mod, GPU, db)
    assert {item.how for item in applied} == {"dlight"}
    kernels = [m.inspect_source() for m in _modules(executable.mod) if m.kind == "cuda"]
    assert kernels and "threadIdx.x" in kernels[0]
    with pytest.raises(SchedlangError, match="TVM would run it on the host") as error:
        build_model(mlp.mod, GPU, db, fallback="none")
    assert error.value.notes == ("keep the dlight fallback, or tune it",)


def _modules(module):
    yield module
    for imported in module.imports:
        yield from _modules(imported)


# --- model files ---------------------------------------------------------------------------------

HEADER = "import numpy as np\nfrom tvm import relax\nimport schedlang\n\n"
ONE_MATMUL = """
def one_matmul():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 2), "float32"))
    with bb.function("main", [x, w]):
        out = bb.emit(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    return bb.get()
"""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("raise ValueError('no weights today')\n", r"m\.py:5: model file raised ValueError: no we"),
        (
            "@schedlang.model\ndef m():\n    return 3\n",
            r"model function `m` in .*m\.py returned int, expected a Relax IRModule",
        ),
        (
            ONE_MATMUL
            + "\n@schedlang.model\ndef m():\n    return one_matmul(), [np.zeros((4, 8))]\n",
            r"gave 1 inputs for the 2 parameters of `main`",
        ),
        (
            ONE_MATMUL + "\n@schedlang.model\ndef m():\n"
            "    return one_matmul(), [np.zeros((4, 8), 'float32'), np.zeros((8, 3), 'float32')]\n",
            r"input `w` is float32\[8, 3\], `main` takes float32\[8, 2\]",
        ),
        ("x = 1\n", r"m\.py defines no model"),
    ],
    ids=["raises", "wrong-type", "input-count", "input-shape", "nothing"],
)
def test_a_bad_model_file_is_one_clear_error(tmp_path, body, message):
    path = tmp_path / "m.py"
    path.write_text(HEADER + body)
    with pytest.raises(SchedlangError, match=message):
        load_model(str(path))


def test_a_model_file_that_hangs_times_out(tmp_path):
    path = tmp_path / "slow.py"
    path.write_text("while True:\n    pass\n")
    with pytest.raises(SchedlangError, match=r"took more than 0\.5 s to load"):
        load_model(str(path), timeout_s=0.5)


def test_an_op_file_is_not_a_model():
    with pytest.raises(SchedlangError) as error:
        load_model(str(EXAMPLES / "matmul.py"))
    assert "defines no model" in error.value.message
    assert any("it defines the op matmul" in note for note in error.value.notes)


def test_a_models_parameters_are_checked():
    with pytest.raises(SchedlangError, match="model `mlp` has no parameter `batches`") as error:
        load_model(MLP, {"batches": "4"})
    assert "did you mean `batch`?" in error.value.notes


def test_a_module_level_irmodule_is_a_model_with_random_inputs(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text(HEADER + ONE_MATMUL + "\nMODULE = one_matmul()\n")
    model = load_model(str(path))
    assert model.name == "MODULE"
    assert [a.shape for a in model.inputs] == [(4, 8), (8, 2)]
    assert from_irmodule(model.mod).inputs[0].shape == (4, 8)


# --- the commands --------------------------------------------------------------------------------


def test_tune_model_then_build_model_uses_the_records(tmp_path):
    db = str(tmp_path / "t.db")
    one_layer = ["-D", "layers=1", "-D", "batch=8", "-D", "features=32"]
    result = CliRunner().invoke(
        app, ["tune-model", MLP, *one_layer, "--trials", "2", "--db", db, "--seed", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "fused_matmul_add  1 x" in result.output and "2 trials" in result.output
    assert "fused_matmul_add: 2 measured, 2 ok" in result.output

    result = CliRunner().invoke(
        app, ["build-model", MLP, *one_layer, "--db", db, "--compare", "--repeat", "2"]
    )
    assert result.exit_code == 0, result.output
    # The database's fastest record of the function, whichever it is: a schedule, or on a loaded
    # machine the unscheduled baseline the tuner timed beside its 2 candidates.
    assert re.search(
        r"fused_matmul_add  (schedlang record #|unscheduled: record #\d+ .*the fastest measured)",
        result.output,
    ), result.output
    assert "outputs agree with the default build and the reference" in result.output
    assert "x tuned)" in result.output and "numpy" in result.output

    # What `schedlang report` reads: the model, its tasks and the latencies --compare measured.
    with Database(db, read_only=True) as database:
        [model] = database.models()
        assert model["name"] == "mlp" and model["tasks"][0]["name"] == "fused_matmul_add"
        assert model["tasks"][0]["calls"] == 1 and model["tasks"][0]["flops"] > 0
        labels = list(model["timings"])
        assert labels[:2] == ["tuned", "default (tvm.compile)"] and "numpy" in labels, labels
        assert database.op_script(model["tasks"][0]["key"]).startswith("# from tvm.script")


def test_build_model_writes_a_library(tmp_path):
    library = tmp_path / "mlp.so"
    result = CliRunner().invoke(
        app, ["build-model", MLP, *SMALL_ARGS, "--db", str(tmp_path / "t.db"), "-o", str(library)]
    )
    assert result.exit_code == 0, result.output
    assert "0 of 3 functions scheduled from the database" in result.output
    assert tvm.runtime.load_module(str(library)) is not None


def test_build_model_checks_the_build_against_the_reference_before_writing_it(tmp_path):
    library = tmp_path / "mlp.so"
    args = ["build-model", MLP, *SMALL_ARGS, "--db", str(tmp_path / "t.db"), "-o", str(library)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "outputs agree with the reference (numpy)" in result.output
    # A reference that disagrees with what the model computes: an error, and nothing written.
    path = tmp_path / "wrong.py"
    path.write_text(
        HEADER + ONE_MATMUL + "\n\ndef doubled(x, w):\n    return 2 * (x @ w)\n\n\n"
        "@schedlang.model(reference=doubled)\ndef m():\n    return one_matmul()\n"
    )
    wrong = tmp_path / "wrong.so"
    args = ["build-model", str(path), "--db", str(tmp_path / "t.db"), "-o", str(wrong)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "the tuned build differs from the model's reference (numpy)" in result.output
    assert not wrong.exists() and "Traceback" not in result.output
    result = CliRunner().invoke(app, [*args, "--no-verify"])
    assert result.exit_code == 0 and wrong.exists()  # asked for: built without the check


def test_build_model_with_a_bad_model_file_is_one_error(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import schedlang\n\n@schedlang.model\ndef broken():\n    return 1 / 0\n")
    result = CliRunner().invoke(app, ["build-model", str(path), "--db", str(tmp_path / "t.db")])
    assert result.exit_code == 1
    assert "model function `broken` raised ZeroDivisionError" in result.output
    assert "Traceback" not in result.output


def test_build_model_rejects_an_unknown_fallback(tmp_path):
    result = CliRunner().invoke(
        app, ["build-model", MLP, *SMALL_ARGS, "--db", str(tmp_path / "t.db"), "--fallback", "x"]
    )
    assert result.exit_code == 1 and "unknown fallback `x`" in result.output
