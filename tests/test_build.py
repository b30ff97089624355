"""Building: a schedule applied, compiled, run against numpy, exported, and used as a TVM pass."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx

import schedlang
from schedlang.checker.pipeline import SCHEDULED_ATTR
from schedlang.core.diagnostics import DiagnosticError, SchedlangError
from schedlang.core.target import resolve_target
from schedlang.run.build import SchedulePass, apply, build, export, source

CPU = resolve_target("llvm")  # this machine's CPU: the built code runs here
GPU = resolve_target("cuda")  # built without a GPU; never run

SCHEDULE = """\
tile i, j by 16x16
split k by 4
reorder i.o, j.o, k.o, i.i, k.i, j.i
parallel i.o
vectorize j.i
"""


def matmul(n: int = 64) -> tirx.PrimFunc:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, c])


def add_one(n: int = 64) -> tirx.PrimFunc:
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] + 1.0, name="B")
    return te.create_prim_func([a, b])


def run_matmul(function, n: int = 64) -> None:
    """Call a built matmul on random inputs and compare with numpy."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, n, n), dtype="float32")
    c = tvm.runtime.tensor(np.zeros((n, n), dtype="float32"), tvm.cpu())
    function(tvm.runtime.tensor(a, tvm.cpu()), tvm.runtime.tensor(b, tvm.cpu()), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_apply_returns_the_scheduled_function() -> None:
    scheduled = apply(matmul(), SCHEDULE, CPU)
    assert scheduled.attrs[SCHEDULED_ATTR]
    assert "T.parallel(4)" in scheduled.script() and "T.vectorized(16)" in scheduled.script()
    assert schedlang.apply is apply  # the package exports it


def test_apply_reports_every_error() -> None:
    with pytest.raises(DiagnosticError) as raised:
        apply(matmul(), "split i by 0\nvectorize k\n", "llvm")
    assert len(raised.value.diagnostics()) == 2
    assert "factor must be positive, got 0" in str(raised.value)


def test_build_runs_and_matches_numpy() -> None:
    run_matmul(build(matmul(), SCHEDULE, CPU))


def test_build_with_knobs() -> None:
    template = "param T in [8, 16, 32]\ntile i, j by T x T\nparallel i.o\n"
    run_matmul(build(matmul(), template, "llvm", knobs={"T": 32}))


def two_stage() -> tirx.PrimFunc:
    a = te.placeholder((64, 64), name="A")
    b = te.compute((64, 64), lambda x, y: a[x, y] * 2.0, name="B")
    c = te.compute((64, 64), lambda i, j: b[i, j] + 1.0, name="C")
    return te.create_prim_func([a, c])


# Schedules that move blocks and buffers around: each must still compute the same values.
MATMUL_SCHEDULES = [
    "split j by 16\ncache_write C global at j.o\nparallel i\n",
    "split k by 16\nrfactor k.i\nblock C_rf:\nparallel k.i\n",
    "split k by 8\nsplit j by 8\nreorder i, j.o, k.o, k.i, j.i\nvectorize j.i\n"
    "decompose_reduction at k.o\n",
    "cache_read B global as B_pack\ntile i, j by 8x16\ncache_read A global at i.o\n",
]


@pytest.mark.parametrize("text", MATMUL_SCHEDULES)
def test_scheduled_matmul_matches_numpy(text: str) -> None:
    run_matmul(build(matmul(), text, CPU))


@pytest.mark.parametrize(
    "text",
    [
        "block C:\nsplit j by 8\nvectorize j.i\ncompute_at B j.o\nparallel i\n",
        "block B:\nsplit x by 8\nreverse_compute_at C x.o\nparallel x.o\n",
        "block B:\ncompute_inline B\n",
    ],
)
def test_scheduled_two_stage_matches_numpy(text: str) -> None:
    a = np.random.default_rng(0).standard_normal((64, 64), dtype="float32")
    c = tvm.runtime.tensor(np.zeros((64, 64), dtype="float32"), tvm.cpu())
    build(two_stage(), text, CPU)(tvm.runtime.tensor(a, tvm.cpu()), c)
    np.testing.assert_allclose(c.numpy(), a * 2 + 1, rtol=1e-6)


def test_build_without_a_schedule() -> None:
    run_matmul(build(matmul(), None, CPU))


def global_buffer_inside_a_kernel() -> tirx.PrimFunc:
    """B = A + 1; C = B * 2 with B computed inside C's kernel: CUDA cannot allocate B there
    (schedlang's checker refuses this schedule; scheduled by hand, it reaches the build)."""
    a = te.placeholder((64,), name="A")
    b = te.compute((64,), lambda i: a[i] + 1.0, name="B")
    c = te.compute((64,), lambda i: b[i] * 2.0, name="C")
    sch = s_tir.Schedule(te.create_prim_func([a, c]))
    (i,) = sch.get_loops(sch.get_sblock("C"))
    outer, inner = sch.split(i, factors=[None, 32])
    sch.bind(outer, "blockIdx.x")
    sch.bind(inner, "threadIdx.x")
    sch.compute_at(sch.get_sblock("B"), outer)
    return sch.mod["main"]


def test_build_failure_is_one_line() -> None:
    with pytest.raises(SchedlangError) as raised:
        build(global_buffer_inside_a_kernel(), None, GPU)
    message = raised.value.message
    assert message.startswith("TVM could not build the function: ")
    assert "\n" not in message and len(message) < 400


def test_export_writes_a_loadable_library(tmp_path) -> None:
    path = export(build(matmul(), SCHEDULE, CPU), tmp_path / "matmul.so")
    assert path == tmp_path / "matmul.so" and path.is_file()
    run_matmul(tvm.runtime.load_module(str(path))["main"])


def test_export_failure_is_a_schedlang_error(tmp_path) -> None:
    with pytest.raises(SchedlangError, match="cannot export the library"):
        export(build(add_one(), "vectorize i", CPU), tmp_path / "missing" / "dir" / "x.so")


def test_source_is_cuda_c_for_a_gpu() -> None:
    text = "split i by 32\nbind i.o blockIdx.x\nbind i.i threadIdx.x\n"
    cuda = source(build(add_one(), text, GPU), GPU)
    assert "__global__" in cuda and "threadIdx.x" in cuda


def test_source_is_assembly_for_a_cpu() -> None:
    asm = source(build(add_one(), "vectorize i", CPU), CPU)
    assert ".text" in asm and "__global__" not in asm


# --- as a TVM pass -------------------------------------------------------------------------------


def module() -> tvm.IRModule:
    """`main` (to schedule), `other` (no schedule given) and `done` (already scheduled)."""
    return tvm.IRModule(
        {
            "main": matmul().with_attr("global_symbol", "main"),
            "other": add_one().with_attr("global_symbol", "other"),
            "done": add_one().with_attr("global_symbol", "done").with_attr(SCHEDULED_ATTR, True),
        }
    )


def test_pass_schedules_the_named_function() -> None:
    schedules = {"main": SCHEDULE, "done": "vectorize i"}
    seq = tvm.transform.Sequential([SchedulePass(schedules, CPU)])
    before = module()
    after = seq(before)
    main = after["main"]
    assert main.attrs[SCHEDULED_ATTR] and main.attrs["global_symbol"] == "main"
    expected = apply(matmul(), SCHEDULE, CPU).with_attr("global_symbol", "main")
    tvm.ir.assert_structural_equal(main, expected)
    # No schedule for `other`; `done` is already marked scheduled: both left as they were.
    tvm.ir.assert_structural_equal(after["other"], before["other"])
    tvm.ir.assert_structural_equal(after["done"], before["done"])


def test_pass_output_builds_and_runs() -> None:
    mod = SchedulePass({"main": SCHEDULE}, CPU)(tvm.IRModule({"main": matmul()}))
    run_matmul(tvm.compile(mod, target=CPU.to_tvm())["main"])


def test_pass_reports_schedule_errors() -> None:
    # TVM's pass machinery re-raises the DiagnosticError as a RuntimeError; the rendered
    # diagnostics (file, caret line, notes) survive in its message.
    with pytest.raises(RuntimeError, match=r"<main>:1:7: error: unknown axis `q` in block C"):
        SchedulePass({"main": "split q by 4"}, CPU)(tvm.IRModule({"main": matmul()}))
