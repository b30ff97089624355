"""`prepack` and CPU weight pre-packing (issue 28, item 2), as a spec: the statement parses,
prints, checks (golden diagnostics in tests/golden/prepack/ for each way it cannot hold), lowers to
the annotation TVM's SplitLayoutRewritePreproc reads, and is read back from a trace; a model's
constant weights are marked and count in the key; a model built with a prepacked record matches
its reference and no longer packs per call; the tuner verifies the whole function and times the
kernel alone; the matmul templates prepack a constant B and only a constant B.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te, tirx
from typer.testing import CliRunner

from schedlang import cli, interop
from schedlang.checker.check import check
from schedlang.checker.pipeline import SCHEDULED_ATTR, lower
from schedlang.core.diagnostics import render_all
from schedlang.core.ops import from_primfunc
from schedlang.core.target import resolve_target
from schedlang.lang.printer import format_stmt
from schedlang.lang.statements.layout import LAYOUT_FREE_ATTR, PREPACK_ANNOTATION, Prepack
from schedlang.lang.syntax import parse
from schedlang.models.function_times import profile_model
from schedlang.models.graph import build_model, compare_outputs, extract_tasks, run_model
from schedlang.models.model_file import load_model
from schedlang.propose.builtin import write_templates
from schedlang.run.build import apply, compile_func
from schedlang.run.measure import output_indices, set_runtime_threads, time_kernel, verify
from schedlang.run.packing import KERNEL_SYMBOL, PACK_SYMBOL, split_prepacked
from schedlang.run.sandbox import verify_then_time
from schedlang.store.db import Database
from schedlang.store.records import op_key
from schedlang.tuning.measurer import Measurer
from tests.planted import fast_settings, measure_each
from tests.test_model import add_record

LLVM = resolve_target("llvm")
CPU = resolve_target('{"kind": "llvm", "mcpu": "skylake", "num-cores": 4}')
MLP = str(Path(__file__).resolve().parent.parent / "examples" / "models" / "mlp.py")
SMALL = {"batch": "8", "features": "32", "hidden": "64", "layers": "2"}
PACK = "block C:\n  split j by 16\n  cache_read B global\n"
PANELS = PACK + "  transform_layout B_global (k, j) -> (j // 16, k, j % 16)\n"
PREPACK_LINE = "  prepack B_global\n"
PREPACKED = PANELS + PREPACK_LINE

set_runtime_threads()


@cache
def matmul(constant_b: bool = True, m: int = 32, n: int = 64, k: int = 48) -> tirx.PrimFunc:
    """C = A @ B, 32 x 64 x 48 unless given; B a constant weight (as a model's PrimFunc after
    AttachLayoutFreeBuffers) unless `constant_b` is False."""
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    func = te.create_prim_func([a, b, c])
    return func.with_attr(LAYOUT_FREE_ATTR, [1]) if constant_b else func


def diagnostics(schedule: str, func: tirx.PrimFunc) -> str:
    result = check(parse(schedule), func, CPU, template_ok=False)
    return render_all(result.diagnostics, schedule)


# --- the statement -------------------------------------------------------------------------------


def test_parse_print_round_trip() -> None:
    (stmt,) = parse("prepack B_global").statements
    assert isinstance(stmt, Prepack) and stmt.block.text == "B_global"
    assert format_stmt(stmt) == "prepack B_global"


def test_a_copy_of_a_constant_weight_checks_clean() -> None:
    assert diagnostics(PREPACKED, matmul()) == ""
    assert diagnostics(PACK + "  prepack B_global\n", matmul()) == ""  # a copy, not reordered


@dataclass(frozen=True)
class Refused:
    name: str
    schedule: str
    constant_b: bool = True


REFUSED = [
    # An op file's B, or a model's weight that is an input: it may change from call to call.
    Refused("not_layout_free", PREPACKED, constant_b=False),
    # The matmul block reads A and B, and reduces.
    Refused("not_a_copy", "block C:\n  prepack C\n"),
    # A copy per column panel, inside the kernel's loops.
    Refused("copy_inside_the_kernel", PACK.replace("global", "global at j.o") + PREPACK_LINE),
    # Moved into the kernel's loops after it was marked: found when the schedule ends.
    Refused("moved_after", PREPACKED + "  compute_at B_global j.o\n"),
]  # fmt: skip


@pytest.mark.parametrize("case", REFUSED, ids=lambda case: case.name)
def test_diagnostics(case: Refused, golden) -> None:
    text = diagnostics(case.schedule, matmul(case.constant_b))
    golden(f"prepack/{case.name}.txt", f"{case.schedule}\n{text}")


def _prepack_by_hand(sch: s_tir.Schedule) -> None:
    block = sch.get_sblock("C")
    sch.split(sch.get_loops(block)[1], [None, 16])
    copy = sch.cache_read(block, 1, "global")
    sch.transform_layout(block, "B_global", lambda k, j: (j // 16, k, j % 16))
    sch.annotate(copy, PREPACK_ANNOTATION, True)


def test_prepack_lowers_to_the_annotation(golden) -> None:
    lowered = lower(parse(PREPACKED), matmul(), CPU).func
    sch = s_tir.Schedule(matmul())
    _prepack_by_hand(sch)
    tvm.ir.assert_structural_equal(lowered, sch.mod["main"].with_attr(SCHEDULED_ATTR, True))
    schedule = "".join(f"#   {line}\n" for line in PREPACKED.splitlines())
    golden("lower/prepack.txt", f"# llvm:\n{schedule}\n{lowered.script()}\n")


def test_decompiler_reads_prepack_back() -> None:
    sch = s_tir.Schedule(matmul())
    _prepack_by_hand(sch)
    imported = interop.decompile(sch.trace, matmul(), CPU)
    assert "prepack B_global" in imported.text
    assert imported.complete


# --- measuring: the packing once, the kernel timed ----------------------------------------------


def test_a_prepacked_kernel_splits_into_its_packing_and_its_kernel() -> None:
    func = lower(parse(PREPACKED), matmul(), CPU).func
    module, packed = split_prepacked(func, output_indices(from_primfunc(matmul())))
    assert [(w.index, w.shape) for w in packed] == [(1, (4, 48, 16))]
    assert {g.name_hint for g in module.functions} == {"main", PACK_SYMBOL, KERNEL_SYMBOL}
    assert '"B_global"' not in module[KERNEL_SYMBOL].script()  # no copy block left in it
    rng = np.random.default_rng(0)
    a, b = rng.random((32, 48), "float32"), rng.random((48, 64), "float32")
    library = tvm.compile(module, target=LLVM.to_tvm())
    tensors = [tvm.runtime.tensor(x) for x in (a, b, np.zeros((32, 64), "float32"))]
    panels = tvm.runtime.empty((4, 48, 16), "float32")
    library[PACK_SYMBOL](tensors[1], panels)
    library[KERNEL_SYMBOL](tensors[0], panels, tensors[2])
    np.testing.assert_allclose(tensors[2].numpy(), a @ b, rtol=1e-5)
    assert split_prepacked(lower(parse(PANELS), matmul(), CPU).func, [2]) is None


def test_the_tuner_verifies_the_whole_function_and_times_the_kernel(tmp_path) -> None:
    measurer = Measurer(from_primfunc(matmul()), LLVM, fast_settings(), tmp_path)
    try:
        outcomes = measure_each(measurer, PREPACKED, PANELS)
    finally:
        measurer.close()
    prepacked, per_call = outcomes[PREPACKED.strip()], outcomes[PANELS.strip()]
    assert prepacked.is_ok and per_call.is_ok, (prepacked.reason, per_call.reason)
    assert prepacked.extra["prepacked"] == [1]  # B: packed before the timing, not timed
    assert "prepacked" not in per_call.extra


class _Spy:
    """A loaded library that says which of its functions were called and which were timed."""

    def __init__(self, library):
        self.library, self.called, self.timed = library, [], []

    def __getitem__(self, symbol: str):
        self.called.append(symbol)
        return self.library[symbol]

    def time_evaluator(self, symbol: str, *args, **kwargs):
        self.timed.append(symbol)
        return self.library.time_evaluator(symbol, *args, **kwargs)


def test_the_timing_runs_the_packing_once_and_times_the_kernel_alone() -> None:
    op = from_primfunc(matmul())
    func = lower(parse(PREPACKED), matmul(), CPU).func
    module, packed = split_prepacked(func, output_indices(op))
    library = _Spy(tvm.compile(module, target=LLVM.to_tvm()).jit())
    args = [np.random.default_rng(0).random(b.shape, "float32") for b in (*op.inputs, *op.outputs)]
    expected = [args[0] @ args[1]]
    outcome = verify_then_time(
        library, tvm.cpu(0), args, expected, [2], ["C"], repeat=2, min_repeat_ms=1,
        prepacked=[(w.index, w.shape, w.dtype) for w in packed],
    )  # fmt: skip
    assert outcome.is_ok, outcome.reason
    # `main` (packing and kernel) is verified, the packing runs once, the kernel alone is timed.
    assert library.called == ["main", PACK_SYMBOL]
    assert library.timed == [KERNEL_SYMBOL]


def test_run_times_a_prepacked_kernel_as_a_model_runs_it(tmp_path) -> None:
    # `schedlang run` on an op whose B is a constant weight: B packed once beforehand, the kernel
    # timed alone (the packing inside the timing made a conv_prepacked conv of ResNet-18 read
    # 6.1 ms where the model runs it in 1.2), and the whole function verified.
    script = matmul().script().replace("# from tvm.script", "from tvm.script")
    op_file, sched = tmp_path / "matmul_b.py", tmp_path / "prepacked.sched"
    op_file.write_text(script)
    sched.write_text(PREPACKED)
    result = CliRunner().invoke(cli.app, ["run", str(op_file), str(sched), "--repeat", "1"])
    assert result.exit_code == 0, result.output
    assert "verified" in result.output
    assert "packed once beforehand; the kernel timed alone" in result.output
    sched.write_text(PANELS)  # packed per call: timed whole
    result = CliRunner().invoke(cli.app, ["run", str(op_file), str(sched), "--repeat", "1"])
    assert result.exit_code == 0, result.output
    assert "packed once" not in result.output


def test_time_kernel_packs_once_and_times_the_kernel_alone() -> None:
    op = from_primfunc(matmul())
    module, packed = split_prepacked(lower(parse(PREPACKED), matmul(), CPU).func, [2])
    executable = compile_func(module, LLVM)
    spy = _Spy(executable.mod)
    timing = time_kernel(op, SimpleNamespace(mod=spy), LLVM, repeat=1, min_repeat_ms=1,
                         prepacked=packed)  # fmt: skip
    assert spy.called == [PACK_SYMBOL] and spy.timed == [KERNEL_SYMBOL]
    assert len(timing.latencies_s) == 1


# --- models --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def constant_mlp():
    return load_model(MLP, {**SMALL, "constant_weights": "1"})


def test_a_models_constant_weights_are_marked_and_count_in_its_key(constant_mlp) -> None:
    tasks = extract_tasks(constant_mlp.mod, LLVM)
    assert [t.name for t in tasks] == ["fused_matmul_add_relu", "fused_matmul1_add1"]
    assert all(list(t.op.func.attrs[LAYOUT_FREE_ATTR]) == [1, 2] for t in tasks)
    inputs = {t.name: t for t in extract_tasks(load_model(MLP, SMALL).mod, LLVM)}
    # Weights passed in: no attribute, the key of the same op file (tests/test_model.py).
    twin = inputs["fused_matmul_add_relu"]
    assert LAYOUT_FREE_ATTR not in twin.op.func.attrs
    assert twin.key != tasks[0].key == op_key(tasks[0].op.func)


def test_weights_passed_past_num_input_are_not_layout_free() -> None:
    # TVM lifts their packing into main_transform_params for the caller; schedlang does not.
    model = load_model(MLP, SMALL)
    mod = model.mod.clone()
    mod["main"] = mod["main"].with_attr("num_input", 1)
    assert all(LAYOUT_FREE_ATTR not in t.op.func.attrs for t in extract_tasks(mod, LLVM))


def _first_point(task, family: str) -> str:
    draft = next(d for d in write_templates(task.op, LLVM) if d.family == family)
    text = draft.text
    for knob, value in re.findall(r"param (\w+) in \[(\d+)", draft.text):
        text = re.sub(rf"\b{knob}\b", value, text)
    return re.sub(r"param \w+ in \[[^\n]*\n", "", text)


def test_a_model_built_with_a_prepacked_record_packs_once(constant_mlp, tmp_path) -> None:
    db = Database(tmp_path / "records.db")
    for task in extract_tasks(constant_mlp.mod, LLVM):
        schedule = _first_point(task, "matmul_panels")
        assert "prepack param_0_global" in schedule
        add_record(db, task.op.func, schedule)
    executable, applied = build_model(constant_mlp.mod, LLVM, db)
    assert [item.how for item in applied] == ["schedlang", "schedlang"]
    outputs = run_model(executable, constant_mlp.inputs, LLVM)
    assert compare_outputs(outputs, constant_mlp.expected_outputs()) == (
        True,
        "matches the reference",
    )
    profile = profile_model(executable, applied, constant_mlp.inputs, LLVM, repeat=2)
    called = {row.function for row in profile.rows}
    assert called == {"fused_matmul_add_relu_prepacked", "fused_matmul1_add1_prepacked"}
    assert all("weight packed at build time" in row.scheduled for row in profile.rows)


def test_the_packing_is_gone_from_the_built_modules_calls(constant_mlp, tmp_path) -> None:
    from schedlang.models.graph import ApplySchedlangDatabase, to_tir
    from schedlang.models.weights import prepack_passes

    db = Database(tmp_path / "records.db")
    task = extract_tasks(constant_mlp.mod, LLVM)[0]
    add_record(db, task.op.func, _first_point(task, "matmul_panels"))
    with LLVM.to_tvm():
        scheduled = ApplySchedlangDatabase(db, LLVM)(to_tir(constant_mlp.mod, LLVM))
        built = tvm.transform.Sequential(prepack_passes())(scheduled)
    names = {g.name_hint for g in built.functions}
    assert "fused_matmul_add_relu_prepacked" in names
    assert not any(name.endswith("_weight_prepack") for name in names)
    assert "fused_matmul_add_relu" not in names
    main = built["main"].script()
    assert "fused_matmul_add_relu_prepacked" in main and "weight_prepack" not in main
    assert isinstance(built["main"], relax.Function)


# --- templates -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family, shape, copy",
    [
        ("matmul_panels", (32, 64, 48), "B_global"),
        ("matmul_packed", (32, 64, 48), "B_global"),
        ("matmul_panels_padded", (30, 45, 37), "B_pad"),  # `pad by`'s copy of B
    ],
)
def test_the_templates_prepack_a_constant_b_only(family: str, shape, copy: str) -> None:
    for constant_b in (True, False):
        func = matmul(constant_b, *shape)
        draft = next(d for d in write_templates(from_primfunc(func), LLVM) if d.family == family)
        assert (f"prepack {copy}" in draft.text) == constant_b, draft.text
        if constant_b:  # its first point checks clean
            knobs = {k: int(v) for k, v in re.findall(r"param (\w+) in \[(\d+)", draft.text)}
            assert check(parse(draft.text), func, LLVM, knobs=knobs).lowered is not None


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_conv_template_prepacks_a_constant_weight_and_computes_the_conv() -> None:
    convnet = str(Path(MLP).parent / "convnet.py")
    model = load_model(convnet, {"size": "16", "channels": "16"})
    tasks = [t for t in extract_tasks(model.mod, LLVM) if t.name.startswith("fused_conv2d")]
    chains = 0
    for task in tasks:
        drafts = [d for d in write_templates(task.op, LLVM) if d.family.startswith("conv")]
        draft = drafts[0]  # a constant weight: the prepacked recipe comes first
        assert draft.family == "conv_prepacked", [d.family for d in drafts]
        assert "prepack param_0_global" in draft.text
        # Every elementwise block after the conv (bias, a residual add, ReLU) is folded into the
        # write-back, and the padding runs over rows: no other block is left to schedule.
        assert set(re.findall(r"^block (\w+):", draft.text, re.M)) == {"conv2d_nchw", "pad_temp"}
        assert "parallel rows" in draft.text
        chains += draft.text.count("reverse_compute_inline") > 2
        func = apply(task.op.func, _first_point(task, "conv_prepacked"), LLVM)
        assert split_prepacked(func, output_indices(task.op)) is not None
        assert verify(task.op, compile_func(func, LLVM), LLVM)[0]
        plain = from_primfunc(task.op.func.without_attr(LAYOUT_FREE_ATTR))
        assert "conv_prepacked" not in {d.family for d in write_templates(plain, LLVM)}
    assert chains  # the residual block's conv: bias, add and ReLU
