"""TVM 0.27's `Bind` statement through the checker (issue 32).

In TVM 0.27 `tvm.tirx.Bind` (`T.let` in TVMScript, `tirx.LetStmt` an alias of it) has no body: its
variable is bound for the statements after it in the SeqStmt around it. A reduction with several
outputs (argmax, argmin, a layer norm's mean and variance) writes each update as Binds then
stores. The whole-kernel dataflow check walked statements as if a let had a body and raised
`AttributeError: 'Bind' object has no attribute 'body'` on every such kernel: an internal error on
valid input, found on TVM's own tests (tests/python/s_tir/schedule/test_tir_schedule_rfactor.py:
`argmax_split`, `argmin_split_init_update_reordered`; test_tir_schedule_compute_inline.py:
`test_reverse_compute_inline_layer_norm`).

- Acceptance: those schedules check clean and lower to what the same primitives give by hand.
- Scope: a Bind's variable is known to the statements after it, so an index computed through a
  Bind is still checked (out of bounds found, in bounds accepted).
- Every other walk over a kernel's statements (`show`, the allocation and unroll counts, the GPU
  verifier's kernels, the proposer's analysis, the trace's hint stripping) takes a Bind; the
  proposer's analysis also goes into an `if` (it stopped there, missing the blocks inside).
- Fuzz: argmax and argmin at odd sizes, split and rfactored, check clean and lower as by hand.
"""

from __future__ import annotations

import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import s_tir, te, tirx, topi
from tvm.script import tirx as T

from schedlang.checker import dataflow, gpu_verifier, kernel_size
from schedlang.checker.check import check
from schedlang.checker.pipeline import SCHEDULED_ATTR
from schedlang.core import opinfo
from schedlang.core.target import resolve_target
from schedlang.interop.traces import without_hints
from schedlang.lang.syntax import parse_with_diagnostics
from schedlang.propose import analysis

CPU = resolve_target("llvm")

# --- TVM's own functions (0.27 TVMScript, as TVM's tests write them) ------------------------------


@T.prim_func(s_tir=True)
def argmax_split(
    idx: T.Buffer((128, 128), "int32"),
    val: T.Buffer((128, 128), "float32"),
    argmax_v0: T.Buffer((128,), "int32"),
    argmax_v1: T.Buffer((128,), "float32"),
):
    for i0, i1_0, i1_1 in T.grid(128, 4, 32):
        with T.sblock("argmax"):
            i = T.axis.spatial(128, i0)
            k = T.axis.reduce(128, i1_0 * 32 + i1_1)
            T.reads(idx[i, k], val[i, k])
            T.writes(argmax_v0[i], argmax_v1[i])
            with T.init():
                argmax_v0[i] = -1
                argmax_v1[i] = T.min_value("float32")
            v_argmax_v0: T.let[T.int32] = T.Select(
                argmax_v1[i] >= val[i, k], argmax_v0[i], idx[i, k]
            )
            v_argmax_v1: T.let[T.float32] = T.Select(
                argmax_v1[i] >= val[i, k], argmax_v1[i], val[i, k]
            )
            argmax_v0[i] = v_argmax_v0
            argmax_v1[i] = v_argmax_v1


@T.prim_func(s_tir=True)
def argmin_split_init_update_reordered(
    idx: T.Buffer((128, 128), "int32"),
    val: T.Buffer((128, 128), "float32"),
    argmin_v0: T.Buffer((128,), "int32"),
    argmin_v1: T.Buffer((128,), "float32"),
):
    for i0, i1_0, i1_1 in T.grid(128, 4, 32):
        with T.sblock("argmin"):
            i = T.axis.spatial(128, i0)
            k = T.axis.reduce(128, i1_0 * 32 + i1_1)
            T.reads(idx[i, k], val[i, k])
            T.writes(argmin_v0[i], argmin_v1[i])
            with T.init():
                argmin_v1[i] = T.max_value("float32")
                argmin_v0[i] = -1
            v_argmin_v0: T.let[T.int32] = T.Select(
                argmin_v1[i] <= val[i, k], argmin_v0[i], idx[i, k]
            )
            v_argmin_v1: T.let[T.float32] = T.Select(
                argmin_v1[i] <= val[i, k], argmin_v1[i], val[i, k]
            )
            argmin_v1[i] = v_argmin_v1
            argmin_v0[i] = v_argmin_v0


# fmt: off
@T.prim_func(s_tir=True)
def layer_norm(p_lv6: T.handle, weight1: T.Buffer((T.int64(2560),), "float32"), bias: T.Buffer((T.int64(2560),), "float32"), p_output0: T.handle):  # noqa: E501
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    n = T.int64()
    lv6 = T.match_buffer(p_lv6, (T.int64(1), n, T.int64(2560)))
    var_compute_intermediate = T.match_buffer(p_output0, (T.int64(1), n, T.int64(2560)), "float16")
    A_red_temp_v0_shared = T.sblock_alloc_buffer((T.int64(1), n), scope="shared")
    A_red_temp_v1_shared = T.sblock_alloc_buffer((T.int64(1), n), scope="shared")
    var_T_layer_norm_intermediate = T.sblock_alloc_buffer((T.int64(1), n, T.int64(2560)))
    for ax0_ax1_fused in T.thread_binding(n, thread="blockIdx.x", annotations={"pragma_auto_unroll_max_step": 256, "pragma_unroll_explicit": 1}):  # noqa: E501
        for ax0, ax1, ax2_0 in T.grid(T.int64(1), T.int64(1), T.int64(10)):
            for ax2_1 in T.thread_binding(T.int64(256), thread="threadIdx.x"):
                with T.sblock("A_red_temp"):
                    v_ax0 = T.axis.spatial(T.int64(1), ax0)
                    v_ax1 = T.axis.spatial(n, ax0_ax1_fused + ax1)
                    v_k2 = T.axis.reduce(T.int64(2560), ax2_0 * T.int64(256) + ax2_1)
                    T.reads(lv6[v_ax0, v_ax1, v_k2])
                    T.writes(A_red_temp_v0_shared[v_ax0, v_ax1], A_red_temp_v1_shared[v_ax0, v_ax1])
                    with T.init():
                        A_red_temp_v0_shared[v_ax0, v_ax1] = T.float32(0)
                        A_red_temp_v1_shared[v_ax0, v_ax1] = T.float32(0)
                    v_A_red_temp_v0: T.let[T.float32] = A_red_temp_v0_shared[v_ax0, v_ax1] + lv6[v_ax0, v_ax1, v_k2]  # noqa: E501
                    v_A_red_temp_v1: T.let[T.float32] = A_red_temp_v1_shared[v_ax0, v_ax1] + lv6[v_ax0, v_ax1, v_k2] * lv6[v_ax0, v_ax1, v_k2]  # noqa: E501
                    A_red_temp_v0_shared[v_ax0, v_ax1] = v_A_red_temp_v0
                    A_red_temp_v1_shared[v_ax0, v_ax1] = v_A_red_temp_v1
        for ax2_0 in range(T.int64(10)):
            for ax2_1 in T.thread_binding(T.int64(256), thread="threadIdx.x"):
                with T.sblock("T_layer_norm"):
                    v_ax0 = T.axis.spatial(T.int64(1), T.int64(0))
                    v_ax1 = T.axis.spatial(n, ax0_ax1_fused)
                    v_ax2 = T.axis.spatial(T.int64(2560), ax2_0 * T.int64(256) + ax2_1)
                    T.reads(lv6[v_ax0, v_ax1, v_ax2], A_red_temp_v0_shared[v_ax0, v_ax1], A_red_temp_v1_shared[v_ax0, v_ax1], weight1[v_ax2], bias[v_ax2])  # noqa: E501
                    T.writes(var_T_layer_norm_intermediate[v_ax0, v_ax1, v_ax2])
                    var_T_layer_norm_intermediate[v_ax0, v_ax1, v_ax2] = (lv6[v_ax0, v_ax1, v_ax2] - A_red_temp_v0_shared[v_ax0, v_ax1] * T.float32(0.00039062500000000002)) * T.rsqrt(A_red_temp_v1_shared[v_ax0, v_ax1] * T.float32(0.00039062500000000002) - A_red_temp_v0_shared[v_ax0, v_ax1] * T.float32(0.00039062500000000002) * (A_red_temp_v0_shared[v_ax0, v_ax1] * T.float32(0.00039062500000000002)) + T.float32(1.0000000000000001e-05)) * weight1[v_ax2] + bias[v_ax2]  # noqa: E501
    for i0, i1, i2 in T.grid(T.int64(1), n, T.int64(2560)):
        with T.sblock("compute"):
            v_i0, v_i1, v_i2 = T.axis.remap("SSS", [i0, i1, i2])
            T.reads(var_T_layer_norm_intermediate[v_i0, v_i1, v_i2])
            T.writes(var_compute_intermediate[v_i0, v_i1, v_i2])
            var_compute_intermediate[v_i0, v_i1, v_i2] = T.Cast("float16", var_T_layer_norm_intermediate[v_i0, v_i1, v_i2])  # noqa: E501
# fmt: on


# --- a Bind whose variable indexes a store ----------------------------------------------------


@T.prim_func(s_tir=True)
def shifted_past_the_end(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("B"):
            vi = T.axis.spatial(16, i)
            j: T.let[T.int32] = vi + 1  # b[16] at the last i
            b[j] = a[vi]


@T.prim_func(s_tir=True)
def shifted_around(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("B"):
            vi = T.axis.spatial(16, i)
            j: T.let[T.int32] = (vi + 1) % 16
            b[j] = a[vi]


@T.prim_func(s_tir=True)
def halves(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
    for i in range(16):
        if i < 8:
            with T.sblock("B"):
                vi = T.axis.spatial(16, i)
                b[vi] = a[vi] * T.float32(2)
        else:
            with T.sblock("C"):
                vi = T.axis.spatial(16, i)
                b[vi] = a[vi]


def topi_arg(kind: str, rows: int, cols: int) -> tirx.PrimFunc:
    """topi's argmax or argmin over the rows of a rows x cols int32 matrix: one block whose update
    is two Binds then two stores (te.create_prim_func writes a two-output reduction so)."""
    a = te.placeholder((rows, cols), dtype="int32", name="A")
    return te.create_prim_func([a, getattr(topi, kind)(a, axis=1)])


def lowered(func: tirx.PrimFunc, text: str, target=CPU) -> tirx.PrimFunc:
    schedule, diagnostics = parse_with_diagnostics(text + "\n", "bind.sched")
    assert schedule is not None and not diagnostics, diagnostics
    result = check(schedule, func, target)
    errors = [d for d in result.diagnostics if d.is_error]
    assert not errors, "\n".join(d.render(text + "\n") for d in errors)
    return result.lowered.func


def errors_of(func: tirx.PrimFunc, text: str) -> list[str]:
    schedule, _ = parse_with_diagnostics(text + "\n", "bind.sched")
    return [d.message for d in check(schedule, func, CPU).diagnostics if d.is_error]


def by_hand(func: tirx.PrimFunc, primitives) -> tirx.PrimFunc:
    sch = s_tir.Schedule(func)
    primitives(sch)
    return sch.mod["main"].with_attr(SCHEDULED_ATTR, True)


def _rfactor_inner(block: str, factor: int | None = None):
    def apply(sch: s_tir.Schedule) -> None:
        loops = sch.get_loops(sch.get_sblock(block))
        inner = loops[-1] if factor is None else sch.split(loops[-1], [None, factor])[1]
        sch.rfactor(inner, factor_axis=1)

    return apply


# --- acceptance: TVM's tests --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("func", "block"),
    [(argmax_split, "argmax"), (argmin_split_init_update_reordered, "argmin")],
    ids=["test_reduction_rfactor_argmax", "test_reduction_rfactor_argmin_init_update_reordeded"],
)
def test_rfactor_of_an_argmax_lowers_as_tvm(func, block) -> None:
    got = lowered(func, f"block {block}:\nrfactor i1_1 factor_axis 1")
    tvm.ir.assert_structural_equal(got, by_hand(func, _rfactor_inner(block)))


def test_reverse_compute_inline_of_a_layer_norm_lowers_as_tvm() -> None:
    got = lowered(layer_norm, "reverse_compute_inline compute")
    expected = by_hand(
        layer_norm, lambda sch: sch.reverse_compute_inline(sch.get_sblock("compute"))
    )
    tvm.ir.assert_structural_equal(got, expected)


# --- a Bind's variable is in scope after it -----------------------------------------------------


def test_an_index_through_a_bind_is_checked_both_ways() -> None:
    finding = dataflow.find_unsound(shifted_past_the_end, CPU.to_tvm())
    assert finding is not None and finding.kind == "out of bounds" and finding.point == (16,)
    assert dataflow.find_unsound(shifted_around, CPU.to_tvm()) is None
    assert any("outside the buffer" in m for m in errors_of(shifted_past_the_end, "split i by 4"))
    assert not errors_of(shifted_around, "split i by 4")


def test_a_bind_alone_in_a_loop_body_is_walked() -> None:
    # A For whose body is a single Bind: nothing after it reads the variable.
    a = tirx.decl_buffer((8,), "int32", name="A")
    i, x = tirx.Var("i", "int32"), tirx.Var("x", "int32")
    loop = tirx.For(i, 0, 8, tirx.ForKind.SERIAL, tirx.Bind(x, i + 1))
    func = tirx.PrimFunc(
        [a], tirx.SeqStmt([loop, tirx.BufferStore(a, tirx.IntImm("int32", 0), [0])])
    )
    walk = dataflow._Walk()
    walk.stmt(func.body, "root", (), ())
    assert [access.is_write for access in walk.accesses] == [True]


# --- every walk over statements takes a Bind ----------------------------------------------------


@pytest.mark.parametrize(
    "func",
    [argmax_split, layer_norm, shifted_around, halves],
    ids=["argmax", "layer_norm", "shifted", "halves"],
)
def test_every_statement_walk_takes_a_bind(func) -> None:
    info = opinfo.describe(func)
    assert info.blocks
    assert opinfo.read_buffers(func) and opinfo.non_positive_extent(func) is None
    kernel_size.allocations(func)
    kernel_size.unrolled_loops(func, follows_hint=True)
    gpu_verifier.kernel_uses(func)
    analysis._block_accesses(func)
    analysis.read_strides(func)
    assert without_hints(func).same_as(func)
    lowered_kernel = dataflow.lower_kernel(func, CPU.to_tvm())
    assert lowered_kernel is not None
    for kernel in lowered_kernel:
        kernel_size.allocations(kernel)
        kernel_size.unrolled_loops(kernel, follows_hint=False)
        gpu_verifier.kernel_uses(kernel)


def test_the_proposers_analysis_sees_the_blocks_under_an_if() -> None:
    # It stopped at an IfThenElse (it has no `body`), so it saw neither block that `show` lists.
    assert [block.name for block in opinfo.describe(halves).blocks] == ["B", "C"]
    assert {"B", "C"} <= set(analysis._block_accesses(halves))
    assert analysis.read_strides(halves)["C"] == (1,)


def test_show_lists_the_argmax_block_and_its_loops() -> None:
    (block,) = opinfo.describe(argmax_split).blocks
    assert block.name == "argmax"
    assert [loop.kind for loop in block.loops] == ["spatial", "reduce", "reduce"]
    assert block.writes == ("argmax_v0", "argmax_v1")


# --- fuzz: two-output reductions at odd sizes ---------------------------------------------------


@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    kind=st.sampled_from(["argmax", "argmin"]),
    rows=st.integers(1, 9),
    cols=st.integers(16, 70),  # a split past the extent is refused (partials unwritten)
    factor=st.integers(2, 16),
)
def test_argmax_split_and_rfactored_at_odd_sizes(kind, rows, cols, factor) -> None:
    func = topi_arg(kind, rows, cols)
    text = f"block A_red_temp:\nsplit k1 by {factor}\nrfactor k1.i factor_axis 1"
    expected = by_hand(func, _rfactor_inner("A_red_temp", factor))
    tvm.ir.assert_structural_equal(lowered(func, text), expected)
