"""The statements of issue 14, as a spec: `annotate`, `blockize`, `add_unit_loop`, `reindex`,
`pad`, `decompose_padding`, `compute_at … index`, `cache_read … for`, and the names of what they
make (nested blocks, the loops compute_at makes).

For each: it parses and prints back; it lowers to exactly TVM's primitive applied by hand
(`tvm.ir.assert_structural_equal`); its misuse gets the diagnostics in
tests/golden/statements_new/<name>.txt; and a schedule using it builds and computes what the
unscheduled function computes.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx
from tvm.script import tirx as T

from schedlang.checker.check import check
from schedlang.checker.pipeline import SCHEDULED_ATTR, lower
from schedlang.core.diagnostics import render_all
from schedlang.core.ops import from_primfunc, random_inputs
from schedlang.core.target import resolve_target
from schedlang.lang import nodes
from schedlang.lang.printer import format_stmt
from schedlang.lang.statements.annotation import Annotate, AnnotationItem
from schedlang.lang.statements.blocks import (
    AddUnitLoop,
    Blockize,
    DecomposePadding,
    Pad,
    Reindex,
    ReindexCacheRead,
    ReindexCacheWrite,
)
from schedlang.lang.statements.buffers import CacheRead
from schedlang.lang.statements.index_maps import IndexInt, IndexOp
from schedlang.lang.statements.index_maps import IndexVar as IV
from schedlang.lang.statements.moving import ComputeAt, ReverseComputeAt
from schedlang.lang.syntax import parse, parse_with_diagnostics
from schedlang.run.codegen import compile_func

CPU = resolve_target('{"kind": "llvm", "mcpu": "skylake", "num-cores": 4}')
GPU = resolve_target("cuda")
N = nodes.Name

# --- ops -----------------------------------------------------------------------------------------


@cache
def matmul(n: int = 32, m: int | None = None, k: int | None = None) -> tirx.PrimFunc:
    """C[i, j] = sum over k of A[i, k] * B[k, j]."""
    m, k = m or n, k or n
    a = te.placeholder((n, k), name="A")
    b = te.placeholder((k, m), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


def ragged() -> tirx.PrimFunc:
    """A 30 x 30 x 30 matmul: no tile of 16 divides it."""
    return matmul(30)


@cache
def two_stage() -> tirx.PrimFunc:
    """B = A * 2 (axes x, y); C = B + 1 (axes i, j)."""
    a = te.placeholder((32, 32), name="A")
    b = te.compute((32, 32), lambda x, y: a[x, y] * 2.0, name="B")
    c = te.compute((32, 32), lambda i, j: b[i, j] + 1.0, name="C")
    return te.create_prim_func([a, c])


@cache
def three_stage() -> tirx.PrimFunc:
    """B = A * 2; C = transpose(B) + 1; D = C + B: B has two consumers."""
    a = te.placeholder((32, 32), name="A")
    b = te.compute((32, 32), lambda x, y: a[x, y] * 2.0, name="B")
    c = te.compute((32, 32), lambda i, j: b[j, i] + 1.0, name="C")
    d = te.compute((32, 32), lambda u, v: c[u, v] + b[u, v], name="D")
    return te.create_prim_func([a, d])


# --- parse and print -----------------------------------------------------------------------------

I = nodes.IntFactor  # noqa: E741
PARSED = [
    ("blockize j.i", Blockize(N("j.i"))),
    ("blockize j.i as C_tile", Blockize(N("j.i"), N("C_tile"))),
    ("add_unit_loop i", AddUnitLoop(N("i"))),
    ("add_unit_loop block as u0", AddUnitLoop(None, N("u0"))),
    ("reindex A", Reindex(N("A"))),
    ("reindex C as C_r", Reindex(N("C"), N("C_r"))),
    ("pad by 16, 16, 1", Pad((I(16), I(16), I(1)))),
    ("decompose_padding at i0", DecomposePadding(None, N("i0"))),
    ("decompose_padding A_pad at i0", DecomposePadding(N("A_pad"), N("i0"))),
    (
        "annotate k.o software_pipeline_stage=[0, 1], software_pipeline_order=[1, 0]",
        Annotate(
            N("k.o"),
            None,
            (
                AnnotationItem(N("software_pipeline_stage"), (I(0), I(1))),
                AnnotationItem(N("software_pipeline_order"), (I(1), I(0))),
            ),
        ),
    ),
    (
        "annotate block A_l double_buffer_scope=0",
        Annotate(None, N("A_l"), (AnnotationItem(N("double_buffer_scope"), I(0)),)),
    ),
    (
        "reindex_cache_read A global (i, j, k) -> (i, k)",
        ReindexCacheRead(N("A"), N("global"), (N("i"), N("j"), N("k")), (IV("i"), IV("k"))),
    ),
    (
        "reindex_cache_write C local (i, j, k) -> (j // 4, i) as C_l",
        ReindexCacheWrite(
            N("C"),
            N("local"),
            (N("i"), N("j"), N("k")),
            (IndexOp("//", IV("j"), IndexInt(4)), IV("i")),
            N("C_l"),
        ),
    ),
    ("compute_at B i index 0", ComputeAt(N("B"), N("i"), index=I(0))),
    (
        "reverse_compute_at C x.o keep_unit_loops index 1",
        ReverseComputeAt(N("C"), N("x.o"), True, I(1)),
    ),
    ("cache_read B global for C", CacheRead(N("B"), N("global"), consumers=(N("C"),))),
    (
        "cache_read A shared for C, D at k.o keep_unit_loops as A_sh",
        CacheRead(N("A"), N("shared"), N("k.o"), N("A_sh"), True, (N("C"), N("D"))),
    ),
]


@pytest.mark.parametrize(("text", "expected"), PARSED, ids=[t for t, _ in PARSED])
def test_parses_and_prints_back(text, expected):
    (stmt,) = parse(text).statements
    assert stmt == expected
    assert format_stmt(stmt) == text


def test_annotation_lists_take_any_spacing():
    (stmt,) = parse("annotate k software_pipeline_order = [ 1,0 ]").statements
    assert format_stmt(stmt) == "annotate k software_pipeline_order=[1, 0]"


# --- lowering: the statement is TVM's primitive --------------------------------------------------


def _loops(sch: s_tir.Schedule, block: str) -> list:
    return sch.get_loops(sch.get_sblock(block))


def _blockize(sch):
    _, j, _ = _loops(sch, "C")
    _, ji = sch.split(j, [None, 16])
    sch.blockize(ji)


def _blockize_inner(sch):
    _blockize(sch)
    _, k = _loops(sch, "C")
    sch.split(k, [None, 4])
    i, _ = _loops(sch, "C_o")
    sch.parallel(i)


def _add_unit_loop(sch):
    i, _, _ = _loops(sch, "C")
    sch.add_unit_loop(i)
    sch.add_unit_loop(sch.get_sblock("C"))


def _reindex(sch):
    sch.reindex(sch.get_sblock("C"), ("read", 0))
    sch.reindex(sch.get_sblock("C"), ("write", 0))


def _pad(sch):
    sch.pad_einsum(sch.get_sblock("C"), [16, 16, 16])


def _decompose_padding(sch):
    _pad(sch)
    block = sch.get_sblock("A_pad")
    sch.decompose_padding(block, _loops(sch, "A_pad")[0])


def _reindex_cache(sch):
    c = sch.get_sblock("C")
    sch.reindex_cache_read(c, 0, "global", lambda i, j, k: (i, k))
    sch.reindex_cache_write(c, 0, "global", lambda i, j, k: (j, i))


def _pipeline(sch):
    c = sch.get_sblock("C")
    _, _, k = _loops(sch, "C")
    ko, _ = sch.split(k, [None, 8])
    copy = sch.cache_read(c, 0, "global")
    sch.compute_at(copy, ko)
    sch.annotate(ko, "software_pipeline_stage", [0, 1])
    sch.annotate(ko, "software_pipeline_order", [0, 1])
    sch.annotate(copy, "double_buffer_scope", 0)


def _compute_at_index(sch):
    i, _ = _loops(sch, "C")
    sch.compute_at(sch.get_sblock("B"), i, index=0)


def _reverse_compute_at_index(sch):
    x, _ = _loops(sch, "B")
    xo, _ = sch.split(x, [None, 8])
    sch.reverse_compute_at(sch.get_sblock("C"), xo, index=1)


def _moved_loops_named(sch):
    i, _ = _loops(sch, "C")
    io, _ = sch.split(i, [None, 8])
    sch.compute_at(sch.get_sblock("B"), io)
    _, _, y = _loops(sch, "B")
    sch.vectorize(y)


def _cache_read_for(sch):
    sch.cache_read(sch.get_sblock("C"), 0, "global", consumer_blocks=[sch.get_sblock("C")])


@dataclass(frozen=True)
class Lowering:
    name: str
    op: Callable[[], tirx.PrimFunc]
    schedule: str
    by_hand: Callable[[s_tir.Schedule], None]


LOWERINGS = [
    Lowering("blockize", matmul, "split j by 16\nblockize j.i\n", _blockize),
    # The inner block keeps its name; the outer one is C_o.
    Lowering(
        "blockize_nested_names",
        matmul,
        "split j by 16\nblockize j.i\nblock C:\nsplit k by 4\nblock C_o:\nparallel i\n",
        _blockize_inner,
    ),
    Lowering(
        "blockize_as",
        matmul,
        "split j by 16\nblockize j.i as C_tile\nblock C:\nsplit k by 4\nblock C_tile:\n"
        "parallel i\n",
        _blockize_inner,
    ),
    Lowering(
        "add_unit_loop", matmul, "add_unit_loop i as u0\nadd_unit_loop block\n", _add_unit_loop
    ),
    Lowering("reindex", matmul, "reindex A\nreindex C\n", _reindex),
    Lowering(
        "reindex_cache",
        matmul,
        "reindex_cache_read A global (i, j, k) -> (i, k)\n"
        "reindex_cache_write C global (i, j, k) -> (j, i)\n",
        _reindex_cache,
    ),
    Lowering("pad", ragged, "pad by 16, 16, 16\n", _pad),
    Lowering(
        "decompose_padding",
        ragged,
        "pad by 16, 16, 16\nblock A_pad:\ndecompose_padding at i0\n",
        _decompose_padding,
    ),
    Lowering(
        "annotate",
        matmul,
        "split k by 8\ncache_read A global at k.o as A_l\n"
        "annotate k.o software_pipeline_stage=[0, 1], software_pipeline_order=[0, 1]\n"
        "annotate block A_l double_buffer_scope=0\n",
        _pipeline,
    ),
    Lowering(
        "compute_at_index", two_stage, "block C:\ncompute_at B i index 0\n", _compute_at_index
    ),
    Lowering(
        "reverse_compute_at_index",
        two_stage,
        "block B:\nsplit x by 8\nreverse_compute_at C x.o index 1\n",
        _reverse_compute_at_index,
    ),
    # compute_at's new loops are named after B's iteration variables (x, y) ...
    Lowering(
        "compute_at_names_loops",
        two_stage,
        "block C:\nsplit i by 8\ncompute_at B i.o\nblock B:\nvectorize y\n",
        _moved_loops_named,
    ),
    # ... and the names TVM gives them (ax0, ax1) still work.
    Lowering(
        "compute_at_old_names",
        two_stage,
        "block C:\nsplit i by 8\ncompute_at B i.o\nblock B:\nvectorize ax1\n",
        _moved_loops_named,
    ),
    Lowering(
        "cache_read_for", three_stage, "block C:\ncache_read B global for C\n", _cache_read_for
    ),
]


@pytest.mark.parametrize("case", LOWERINGS, ids=lambda case: case.name)
def test_lowers_to_the_primitive(case: Lowering) -> None:
    scheduled = lower(parse(case.schedule, f"{case.name}.sched"), case.op(), CPU).func
    sch = s_tir.Schedule(case.op())
    case.by_hand(sch)
    tvm.ir.assert_structural_equal(scheduled, sch.mod["main"].with_attr(SCHEDULED_ATTR, True))


def _nest_after(op, text):
    result = check(parse(text), op(), CPU)
    assert result.ok, render_all(result.diagnostics, text)
    from schedlang.checker.check import check_prefix

    return check_prefix(parse(text), op(), CPU).nest


def test_moved_loops_take_the_block_variables_names() -> None:
    nest = _nest_after(two_stage, "block C:\nsplit i by 8\ncompute_at B i.o\n")
    assert [x.name for x in nest.loops("B")] == ["i.o", "x", "y"]


def test_a_cache_blocks_moved_loops_keep_their_names() -> None:
    # A cache block's variables are v0, v1: nothing better than ax0, ax1.
    nest = _nest_after(matmul, "split k by 8\ncache_read A global at k.o\n")
    assert [x.name for x in nest.loops("A_global")] == ["i", "j", "k.o", "ax0"]


def test_nested_blocks_are_named() -> None:
    nest = _nest_after(matmul, "split j by 16\nblockize j.i\n")
    assert nest.block_names() == ["C_o"]
    assert nest.nested_block_names() == ["C"] or "C" in nest.nested_block_names()
    assert nest.has_block("C") and nest.has_block("C_o")
    assert [x.name for x in nest.loops("C")] == ["j.i", "k"]
    assert [x.name for x in nest.loops("C_o")] == ["i", "j.o"]


# --- misuse: what the author is told -------------------------------------------------------------


@dataclass(frozen=True)
class Misuse:
    name: str
    op: Callable[[], tirx.PrimFunc]
    schedule: str
    gpu: bool = False


MISUSES = [
    Misuse("blockize_unknown_axis", matmul, "blockize q\n"),
    Misuse("blockize_name_taken", matmul, "split j by 16\nblockize j.i as C\n"),
    Misuse("blockize_outer_axis_in_inner_block", matmul,
           "split j by 16\nblockize j.i\nblock C:\nparallel i\n"),
    Misuse("add_unit_loop_name_taken", matmul, "add_unit_loop i as j\nadd_unit_loop k\n"
           "add_unit_loop block\n"),
    Misuse("reindex_unknown_buffer", matmul, "reindex D\n"),
    Misuse("reindex_cache_map", matmul,
           "reindex_cache_read A global (i, j) -> (i, q)\n"
           "reindex_cache_write A global (i, j, k) -> (i, k)\n"
           "reindex_cache_read B shared (i, i, k) -> (k // 0, i)\n"),
    Misuse("pad_count", ragged, "pad by 16, 16\n"),
    Misuse("pad_nothing", matmul, "pad by 16, 16, 8\n"),
    Misuse("pad_zero", ragged, "pad by 16, 0, 16\n"),
    Misuse("decompose_padding_reduction", ragged, "decompose_padding C at i\n"),
    Misuse("annotate_stage_length", matmul,
           "split k by 8\ncache_read A global at k.o\n"
           "annotate k.o software_pipeline_stage=[0, 0, 1], software_pipeline_order=[0, 1]\n"),
    Misuse("annotate_order_not_a_permutation", matmul,
           "split k by 8\ncache_read A global at k.o\n"
           "annotate k.o software_pipeline_stage=[0, 1], software_pipeline_order=[1, 1]\n"),
    Misuse("annotate_stage_without_order", matmul,
           "split k by 8\ncache_read A global at k.o\n"
           "annotate k.o software_pipeline_stage=[0, 1]\n"),
    Misuse("annotate_wrong_target_and_type", matmul,
           "annotate i double_buffer_scope=0, pragma_unroll_explicit=[1]\n"
           "annotate block C software_pipeline_stage=[0]\n"),
    Misuse("annotate_unknown_key", matmul, "annotate k software_pipeline_stages=[0]\n"
           "annotate block C double_buffer_scopes=0\n"),
    Misuse("annotate_async_on_cpu", matmul, "annotate k software_pipeline_async_stages=[0]\n"),
    Misuse("annotate_double_buffer_index", matmul, "annotate block C double_buffer_scope=1\n"),
    Misuse("annotate_unroll_values", matmul,
           "annotate k pragma_unroll_explicit=2, pragma_auto_unroll_max_step=-1\n"),
    Misuse("compute_at_index_out_of_range", two_stage, "block C:\ncompute_at B i index 3\n"),
    Misuse("reverse_compute_at_index_before_its_producer", three_stage,
           "block B:\nreverse_compute_at C x index 0\n"),
    Misuse("cache_read_for_unknown_block", three_stage, "block C:\ncache_read B global for E\n"),
    Misuse("cache_read_for_non_reader", three_stage,
           "block C:\ncache_read B global for B, C, C\n"),
]  # fmt: skip


@pytest.mark.parametrize("case", MISUSES, ids=lambda case: case.name)
def test_misuse_is_reported(case: Misuse, golden) -> None:
    result = check(parse(case.schedule, f"{case.name}.sched"), case.op(), GPU if case.gpu else CPU)
    assert not result.ok and result.lowered is None
    rendered = render_all(result.diagnostics, case.schedule)
    golden(
        f"statements_new/{case.name}.txt",
        f"-- {case.name}.sched --\n{case.schedule}-- diagnostics --\n{rendered}\n",
    )


def test_a_key_that_is_no_annotation_is_a_syntax_error(golden) -> None:
    # MetaSchedule's hints are inputs of its postprocessors, which schedlang does not run.
    text = "annotate block C meta_schedule.vectorize=8\n"
    _, diagnostics = parse_with_diagnostics(text, "annotate_hint.sched")
    golden(
        "statements_new/annotate_hint.txt",
        f"-- annotate_hint.sched --\n{text}-- diagnostics --\n{render_all(diagnostics, text)}\n",
    )


def test_an_unknown_key_in_a_built_ast_is_reported() -> None:
    stmt = Annotate(N("k"), None, (AnnotationItem(N("vectorize_me"), I(1)),))
    result = check(nodes.Schedule((stmt,)), matmul(), CPU)
    assert [d.message for d in result.diagnostics] == ["unknown annotation key `vectorize_me`"]


# --- built and run: each statement computes what the function computes ---------------------------

BUILDS = [
    ("blockize", matmul, "split j by 16\nblockize j.i\nblock C:\nsplit k by 4\n"
     "block C_o:\nparallel i\n"),
    ("add_unit_loop", matmul, "add_unit_loop i\nadd_unit_loop block as w\n"),
    ("reindex", matmul, "reindex A\nreindex C\n"),
    ("reindex_cache", matmul, "reindex_cache_read B global (i, j, k) -> (j, k)\n"
     "reindex_cache_write C global (i, j, k) -> (j, i)\n"),
    ("pad_and_decompose_padding", ragged, "tile i, j by 16x16\npad by 16, 16, 16\n"
     "block A_pad:\ndecompose_padding at i0\n"),
    ("annotate", matmul, "split k by 8\ncache_read A global at k.o as A_l\n"
     "annotate k.o software_pipeline_stage=[0, 1], software_pipeline_order=[1, 0]\n"
     "annotate block A_l double_buffer_scope=0\n"),
    ("compute_at_index", two_stage, "block C:\nsplit i by 8\ncompute_at B i.o index 0\n"
     "block B:\nvectorize y\n"),
    ("cache_read_for", three_stage, "block D:\ncache_read B global for D\n"),
]  # fmt: skip


def _run(func: tirx.PrimFunc, args: list[np.ndarray]) -> list[np.ndarray]:
    executable = compile_func(func, CPU_HERE)
    tensors = [tvm.runtime.tensor(a, tvm.cpu()) for a in args]
    executable(*tensors)
    return [t.numpy() for t in tensors]


CPU_HERE = resolve_target("llvm")


@pytest.mark.parametrize(("name", "op", "schedule"), BUILDS, ids=[b[0] for b in BUILDS])
def test_builds_and_computes_the_same(name, op, schedule) -> None:
    func = op()
    scheduled = lower(parse(schedule, f"{name}.sched"), func, CPU_HERE).func
    args = random_inputs(from_primfunc(func))
    expected = _run(func, [a.copy() for a in args])
    got = _run(scheduled, [a.copy() for a in args])
    np.testing.assert_allclose(got[-1], expected[-1], rtol=1e-4, atol=1e-4)


# --- the MetaSchedule round trip: a trace decompiles back to the statement ------------------------


@pytest.mark.parametrize("case", LOWERINGS, ids=lambda case: case.name)
def test_trace_decompiles_to_the_same_schedule(case: Lowering) -> None:
    from schedlang import interop

    lowered = lower(parse(case.schedule, f"{case.name}.sched"), case.op(), CPU)
    imported = interop.decompile(lowered.trace, case.op(), CPU)
    assert imported.complete and not [d for d in imported.diagnostics if d.is_error]
    again = lower(parse(imported.text, "<imported>"), case.op(), CPU)
    tvm.ir.assert_structural_equal(again.func, lowered.func)


# --- naming: nested blocks of an op, the rfactor block -------------------------------------------


@T.prim_func(s_tir=True)
def _nested(a: T.Buffer((16, 16), "float32"), b: T.Buffer((16, 16), "float32")):
    for i in range(16):
        with T.sblock("row"):
            vi = T.axis.spatial(16, i)
            for j in range(16):
                with T.sblock("scale"):
                    vj = T.axis.spatial(16, j)
                    b[vi, vj] = a[vi, vj] * T.float32(2.0)


def test_a_block_nested_in_the_ops_script_is_scheduled_by_its_name() -> None:
    scheduled = lower(parse("block scale:\nsplit j by 4\nvectorize j.i\n"), _nested, CPU).func
    sch = s_tir.Schedule(_nested)
    (j,) = _loops(sch, "scale")
    _, inner = sch.split(j, [None, 4])
    sch.vectorize(inner)
    tvm.ir.assert_structural_equal(scheduled, sch.mod["main"].with_attr(SCHEDULED_ATTR, True))


def test_an_unknown_block_suggests_a_nested_block_too() -> None:
    source = "block scal:\nsplit j by 4\n"
    text = render_all(check(parse(source), _nested, CPU).diagnostics, source)
    assert "unknown block `scal`" in text
    assert "did you mean `scale`?" in text and "blocks: row, scale" in text


def test_the_rfactor_block_is_scheduled_by_its_name() -> None:
    text = "split k by 8\nrfactor k.i as C_part\nblock C_part:\nparallel i\n"
    scheduled = lower(parse(text), matmul(), CPU).func
    sch = s_tir.Schedule(matmul())
    _, _, k = _loops(sch, "C")
    _, ki = sch.split(k, [None, 8])
    part = sch.rfactor(ki, 0)
    sch.parallel(sch.get_loops(part)[0])
    tvm.ir.assert_structural_equal(scheduled, sch.mod["main"].with_attr(SCHEDULED_ATTR, True))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to build for CUDA")
def test_an_async_pipeline_builds_with_cp_async_on_cuda() -> None:
    from schedlang.run.codegen import source

    text = (
        "tile i, j by 8x16\nbind i.o blockIdx.y\nbind j.o blockIdx.x\nbind i.i threadIdx.y\n"
        "bind j.i threadIdx.x\nsplit k by 8\ncache_read A shared at k.o as A_sh\n"
        "annotate k.o software_pipeline_stage=[0, 1], software_pipeline_order=[0, 1], "
        "software_pipeline_async_stages=[0]\n"
    )
    built = compile_func(lower(parse(text), matmul(64), GPU).func, GPU)
    cuda = source(built, GPU)
    # Two stages in flight: the 8 x 8 tile of A twice, filled by asynchronous copies.
    assert "cp.async" in cuda and "float A_shared_ptr[128]" in cuda


def test_a_number_out_of_range_in_an_annotation_list_is_a_syntax_error() -> None:
    # Found by the constrained-decoding test: it crashed the parser's builder.
    text = "annotate k software_pipeline_stage=[9788009999906, 1]\n"
    _, diagnostics = parse_with_diagnostics(text)
    assert [d.message for d in diagnostics] == [
        "integer 9788009999906 is too large: the limit is 2^31-1 (2147483647)"
    ]


def test_pad_sizes_each_padded_buffer_by_the_variables_it_uses() -> None:
    """C_pad of a matmul spans i and j only: counted over k too, `pad by 4, 16, 1` at
    1000x999x997 was refused as 3.7 GiB when the buffers hold about 4 MB each."""
    func = matmul(1000, 999, 997)
    assert check(parse("pad by 4, 16, 1"), func, CPU).ok
    result = check(parse("pad by 65536, 65536, 1"), func, CPU)
    [error] = result.diagnostics
    assert "`C_pad` would hold 4294967296 elements" in error.message
