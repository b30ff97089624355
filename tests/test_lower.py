"""Lowering, as a spec: what each statement does to the loop nest.

For every statement kind, the schedule is lowered and compared two ways:
- structurally (`tvm.ir.assert_structural_equal`) with the same function scheduled by calling the
  `tvm.s_tir.Schedule` primitives by hand: this is what the statement means;
- with a golden file of the TVMScript (tests/golden/lower/<name>.txt), to read and review the nest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import pytest
import tvm
from tvm import s_tir, te, tirx

from schedlang.checker.pipeline import SCHEDULED_ATTR, Lowered, bind_knobs, lower
from schedlang.core.diagnostics import DiagnosticError
from schedlang.core.target import resolve_target
from schedlang.lang import nodes, statements
from schedlang.lang.statements.loops import Tile
from schedlang.lang.syntax import parse

CPU = resolve_target('{"kind": "llvm", "mcpu": "skylake", "num-cores": 4}')
GPU = resolve_target("cuda")


# --- ops -----------------------------------------------------------------------------------------


def matmul() -> tirx.PrimFunc:
    """C[i, j] = sum over k of A[i, k] * B[k, j], 64 x 64 x 64."""
    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, c])


def two_stage() -> tirx.PrimFunc:
    """B = A * 2 (axes x, y); C = B + 1 (axes i, j)."""
    a = te.placeholder((64, 64), name="A")
    b = te.compute((64, 64), lambda x, y: a[x, y] * 2.0, name="B")
    c = te.compute((64, 64), lambda i, j: b[i, j] + 1.0, name="C")
    return te.create_prim_func([a, c])


def scale() -> tirx.PrimFunc:
    """B[i] = A[i] * 2, 256 long."""
    a = te.placeholder((256,), name="A")
    b = te.compute((256,), lambda i: a[i] * 2.0, name="B")
    return te.create_prim_func([a, b])


def row_sum() -> tirx.PrimFunc:
    """B[i] = sum over k of A[i, k], 64 x 64: a row reduction, as in softmax."""
    a = te.placeholder((64, 64), name="A")
    k = te.reduce_axis((0, 64), name="k")
    b = te.compute((64,), lambda i: te.sum(a[i, k], axis=k), name="B")
    return te.create_prim_func([a, b])


def conv2d() -> tirx.PrimFunc:
    """A 3x3 convolution with zero padding 1: block `pad`, then reduction block `conv`."""
    data = te.placeholder((1, 4, 8, 8), name="data")
    weight = te.placeholder((8, 4, 3, 3), name="weight")
    pad = te.compute(
        (1, 4, 10, 10),
        lambda n, c, h, w: te.if_then_else(
            te.all(h >= 1, h <= 8, w >= 1, w <= 8), data[n, c, h - 1, w - 1], 0.0
        ),
        name="pad",
    )
    rc = te.reduce_axis((0, 4), name="rc")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    conv = te.compute(
        (1, 8, 8, 8),
        lambda n, f, y, x: te.sum(
            pad[n, rc, y + ry, x + rx] * weight[f, rc, ry, rx], axis=[rc, ry, rx]
        ),
        name="conv",
    )
    return te.create_prim_func([data, weight, conv])


# --- what each statement means, by hand ----------------------------------------------------------


def loops(sch: s_tir.Schedule, block: str) -> list[s_tir.LoopRV]:
    return sch.get_loops(sch.get_sblock(block))


def split_2way(sch):
    i, _, _ = loops(sch, "C")
    sch.split(i, factors=[None, 16])


def split_nway(sch):
    i, _, _ = loops(sch, "C")
    sch.split(i, factors=[None, 4, 8])


def tile_2d(sch):
    i, j, _ = loops(sch, "C")
    i_o, i_i = sch.split(i, factors=[None, 16])
    j_o, j_i = sch.split(j, factors=[None, 8])
    sch.reorder(i_o, j_o, i_i, j_i)


def tile_3d(sch):
    i, j, k = loops(sch, "C")
    i_o, i_i = sch.split(i, factors=[None, 8])
    j_o, j_i = sch.split(j, factors=[None, 8])
    k_o, k_i = sch.split(k, factors=[None, 4])
    sch.reorder(i_o, j_o, k_o, i_i, j_i, k_i)


def reorder(sch):
    i, j, k = loops(sch, "C")
    sch.reorder(k, i, j)


def fuse(sch):
    i, j, _ = loops(sch, "C")
    sch.split(sch.fuse(i, j), factors=[None, 64])


def fuse_as(sch):
    i, j, _ = loops(sch, "C")
    sch.parallel(sch.fuse(i, j))


def bind(sch):
    i, j, _ = loops(sch, "C")
    outer, inner = sch.split(sch.fuse(i, j), factors=[None, 128])
    sch.bind(outer, "blockIdx.x")
    sch.bind(inner, "threadIdx.x")


def vectorize(sch):
    (i,) = loops(sch, "B")
    _, inner = sch.split(i, factors=[None, 8])
    sch.vectorize(inner)


def unroll(sch):
    _, _, k = loops(sch, "C")
    _, inner = sch.split(k, factors=[None, 4])
    sch.unroll(inner)


def parallel(sch):
    i, _, _ = loops(sch, "C")
    sch.parallel(i)


def cache_read(sch):
    sch.cache_read(sch.get_sblock("C"), 0, "global")


def cache_read_at(sch):
    _, _, k = loops(sch, "C")
    k_o, _ = sch.split(k, factors=[None, 8])
    copy = sch.cache_read(sch.get_sblock("C"), 0, "global")
    sch.compute_at(copy, k_o)


def cache_read_as(sch):
    copy = sch.cache_read(sch.get_sblock("C"), 1, "global")
    sch.parallel(sch.get_loops(copy)[0])


def cache_write(sch):
    sch.cache_write(sch.get_sblock("C"), 0, "global")


def cache_write_at(sch):
    _, j, _ = loops(sch, "C")
    j_o, _ = sch.split(j, factors=[None, 16])
    write_back = sch.cache_write(sch.get_sblock("C"), 0, "global")
    sch.reverse_compute_at(write_back, j_o)


def compute_at(sch):
    i, _ = loops(sch, "C")
    i_o, _ = sch.split(i, factors=[None, 8])
    sch.compute_at(sch.get_sblock("B"), i_o)


def reverse_compute_at(sch):
    x, _ = loops(sch, "B")
    x_o, _ = sch.split(x, factors=[None, 8])
    sch.reverse_compute_at(sch.get_sblock("C"), x_o)


def compute_at_keep_unit_loops(sch):
    i, _ = loops(sch, "C")
    _, i_i = sch.split(i, factors=[None, 8])
    sch.compute_at(sch.get_sblock("B"), i_i, preserve_unit_loops=True)


def cache_write_at_keep_unit_loops(sch):
    _, j, _ = loops(sch, "C")
    write_back = sch.cache_write(sch.get_sblock("C"), 0, "global")
    sch.reverse_compute_at(write_back, j, preserve_unit_loops=True)


def compute_inline(sch):
    sch.compute_inline(sch.get_sblock("pad"))


def reverse_compute_inline(sch):
    sch.reverse_compute_inline(sch.get_sblock("C"))


def rfactor(sch):
    _, _, k = loops(sch, "C")
    _, k_i = sch.split(k, factors=[None, 16])
    sch.rfactor(k_i, factor_axis=0)


def rfactor_factor_axis(sch):
    _, k = loops(sch, "B")
    _, k_i = sch.split(k, factors=[None, 16])
    sch.rfactor(k_i, factor_axis=1)


def decompose_reduction(sch):
    _, _, k = loops(sch, "C")
    k_o, _ = sch.split(k, factors=[None, 8])
    sch.decompose_reduction(sch.get_sblock("C"), k_o)


def storage_align(sch):
    i, j, k = loops(sch, "C")
    i_o, i_i = sch.split(i, factors=[None, 8])
    j_o, j_i = sch.split(j, factors=[None, 32])
    sch.reorder(i_o, j_o, i_i, j_i)
    sch.bind(i_o, "blockIdx.y")
    sch.bind(j_o, "blockIdx.x")
    sch.bind(i_i, "threadIdx.y")
    sch.bind(j_i, "threadIdx.x")
    k_o, _ = sch.split(k, factors=[None, 16])
    copy = sch.cache_read(sch.get_sblock("C"), 0, "shared")
    sch.compute_at(copy, k_o)
    sch.storage_align(copy, 0, 0, 32, 1)


def set_scope(sch):
    sch.set_scope(sch.get_sblock("B"), 0, "local")


def pragma(sch):
    i, _, _ = loops(sch, "C")
    sch.annotate(i, "pragma_auto_unroll_max_step", 16)
    sch.annotate(i, "pragma_unroll_explicit", 0)


@dataclass(frozen=True)
class Case:
    name: str
    op: Callable[[], tirx.PrimFunc]
    schedule: str
    by_hand: Callable[[s_tir.Schedule], None]
    gpu: bool = False


GPU_TILE = """\
tile i, j by 8x32
bind i.o blockIdx.y
bind j.o blockIdx.x
bind i.i threadIdx.y
bind j.i threadIdx.x
"""

CASES = [
    Case("split_2way", matmul, "split i by 16\n", split_2way),
    Case("split_nway", matmul, "split i by *, 4, 8\n", split_nway),
    Case("tile_2d", matmul, "tile i, j by 16x8\n", tile_2d),
    Case("tile_3d", matmul, "tile i, j, k by 8x8x4\n", tile_3d),
    Case("reorder", matmul, "reorder k, i, j\n", reorder),
    Case("fuse", matmul, "fuse i, j\nsplit i_j by 64\n", fuse),
    Case("fuse_as", matmul, "fuse i, j as ij\nparallel ij\n", fuse_as),
    Case(
        "bind",
        matmul,
        "fuse i, j\nsplit i_j by 128\nbind i_j.o blockIdx.x\nbind i_j.i threadIdx.x\n",
        bind,
        gpu=True,
    ),
    Case("vectorize", scale, "split i by 8\nvectorize i.i\n", vectorize),
    Case("unroll", matmul, "split k by 4\nunroll k.i\n", unroll),
    Case("parallel", matmul, "parallel i\n", parallel),
    Case("cache_read", matmul, "cache_read A global\n", cache_read),
    Case("cache_read_at", matmul, "split k by 8\ncache_read A global at k.o\n", cache_read_at),
    Case(
        "cache_read_as",
        matmul,
        "cache_read B global as B_pack\nblock B_pack:\nparallel ax0\n",
        cache_read_as,
    ),
    Case("cache_write", matmul, "cache_write C global\n", cache_write),
    Case("cache_write_at", matmul, "split j by 16\ncache_write C global at j.o\n", cache_write_at),
    Case("compute_at", two_stage, "block C:\nsplit i by 8\ncompute_at B i.o\n", compute_at),
    Case(
        "reverse_compute_at",
        two_stage,
        "block B:\nsplit x by 8\nreverse_compute_at C x.o\n",
        reverse_compute_at,
    ),
    # B[i, 0:64] is computed per i.i: its loop over i, of extent 1, stays.
    Case(
        "compute_at_keep_unit_loops",
        two_stage,
        "block C:\nsplit i by 8\ncompute_at B i.i keep_unit_loops\n",
        compute_at_keep_unit_loops,
    ),
    # One element of C written back per j: two loops of extent 1.
    Case(
        "cache_write_at_keep_unit_loops",
        matmul,
        "cache_write C global at j keep_unit_loops\n",
        cache_write_at_keep_unit_loops,
    ),
    Case("compute_inline", conv2d, "block conv:\ncompute_inline pad\n", compute_inline),
    Case(
        "reverse_compute_inline",
        two_stage,
        "block B:\nreverse_compute_inline C\n",
        reverse_compute_inline,
    ),
    Case("rfactor", matmul, "split k by 16\nrfactor k.i\n", rfactor),
    # The partial sums of row i are B_rf[i, 0:16]: the factored axis second, as MetaSchedule has it.
    Case(
        "rfactor_factor_axis",
        row_sum,
        "split k by 16\nrfactor k.i factor_axis 1\n",
        rfactor_factor_axis,
    ),
    Case(
        "decompose_reduction",
        matmul,
        "split k by 8\ndecompose_reduction at k.o\n",
        decompose_reduction,
    ),
    Case(
        "storage_align",
        matmul,
        GPU_TILE + "split k by 16\ncache_read A shared at k.o as A_sh\n"
        "storage_align A_sh dim 0 factor 32 offset 1\n",
        storage_align,
        gpu=True,
    ),
    Case("set_scope", two_stage, "block C:\nset_scope B local\n", set_scope),
    Case(
        "pragma",
        matmul,
        "pragma i auto_unroll_max_step=16, unroll_explicit=0\n",
        pragma,
    ),
]


@cache
def lowered(case: Case) -> Lowered:
    return lower(parse(case.schedule, f"{case.name}.sched"), case.op(), GPU if case.gpu else CPU)


def scheduled_by_hand(case: Case) -> tirx.PrimFunc:
    sch = s_tir.Schedule(case.op())
    case.by_hand(sch)
    return sch.mod["main"].with_attr(SCHEDULED_ATTR, True)


def test_every_statement_kind_has_a_case() -> None:
    covered = {type(stmt) for case in CASES for stmt in parse(case.schedule).statements}
    # Issue 14's statements are specified in tests/test_statements_new.py.
    from tests.test_statements_new import LOWERINGS

    covered |= {type(stmt) for case in LOWERINGS for stmt in parse(case.schedule).statements}
    # transform_layout and tensorize: in tests/test_layout_tensorize.py.
    from tests.test_layout_tensorize import LOWERINGS as LAYOUT_LOWERINGS

    covered |= {type(s) for case in LAYOUT_LOWERINGS for s in parse(case.schedule).statements}
    # fast_math: in tests/test_fastmath.py.
    from tests.test_fastmath import LOWERINGS as FAST_MATH_LOWERINGS

    covered |= {type(s) for case in FAST_MATH_LOWERINGS for s in parse(case.schedule).statements}
    # prepack: in tests/test_prepack.py.
    from tests.test_prepack import PREPACKED

    covered |= {type(s) for s in parse(PREPACKED).statements}
    assert covered == set(statements.STATEMENT_KINDS) - {nodes.Param}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_statement_means_its_primitives(case: Case) -> None:
    tvm.ir.assert_structural_equal(lowered(case).func, scheduled_by_hand(case))


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_lowered_script(case: Case, golden) -> None:
    schedule = "".join(f"#   {line}\n" for line in case.schedule.splitlines())
    target = "cuda" if case.gpu else "llvm"
    golden(f"lower/{case.name}.txt", f"# {target}:\n{schedule}\n{lowered(case).script()}\n")


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_trace_replays(case: Case) -> None:
    sch = s_tir.Schedule(case.op())
    lowered(case).trace.apply_to_schedule(sch, remove_postproc=False)
    tvm.ir.assert_structural_equal(
        sch.mod["main"].with_attr(SCHEDULED_ATTR, True), lowered(case).func
    )


def test_lowering_is_pure() -> None:
    func = matmul()
    before = func.script()
    text = "tile i, j by 16x16\ncache_write C global at j.o\nparallel i.o\ndecompose_reduction at k"
    scheduled = lower(parse(text), func, CPU).func
    assert func.script() == before
    tvm.ir.assert_structural_equal(func, matmul())
    assert SCHEDULED_ATTR not in (func.attrs or {})
    assert scheduled.script() != before


def test_bind_knobs_substitutes_values() -> None:
    template = parse("param TI in [8, 16]\nparam TJ in pow2(4, 32)\ntile i, j by TI x TJ\n")
    concrete = bind_knobs(template, {"TI": 16, "TJ": 8})
    assert concrete.statements == (
        Tile((nodes.Name("i"), nodes.Name("j")), (nodes.IntFactor(16), nodes.IntFactor(8))),
    )
    assert not concrete.is_template
    by_template = lower(template, matmul(), CPU, {"TI": 16, "TJ": 8}).func
    by_text = lower(parse("tile i, j by 16x8\n"), matmul(), CPU).func
    tvm.ir.assert_structural_equal(by_template, by_text)


def test_lower_needs_every_knob() -> None:
    template = parse("param TI in [8, 16]\nsplit i by TI\n")
    with pytest.raises(DiagnosticError, match="knob `TI` has no value"):
        lower(template, matmul(), CPU)


def test_lower_reports_every_error() -> None:
    with pytest.raises(DiagnosticError) as raised:
        lower(parse("split i by 0\nparallel k\n"), matmul(), CPU)
    assert [d.span.line for d in raised.value.diagnostics()] == [1, 2]


def test_derived_names_resolve_in_later_statements() -> None:
    text = """\
split i by *, 2, 4
fuse i.0, i.1 as outer
split k by 8
reorder outer, k.o, i.2, j, k.i
parallel outer
unroll k.i
"""
    sch = s_tir.Schedule(matmul())
    i, j, k = loops(sch, "C")
    i0, i1, i2 = sch.split(i, factors=[None, 2, 4])
    outer = sch.fuse(i0, i1)
    k_o, k_i = sch.split(k, factors=[None, 8])
    sch.reorder(outer, k_o, i2, j, k_i)
    sch.parallel(outer)
    sch.unroll(k_i)
    tvm.ir.assert_structural_equal(
        lower(parse(text), matmul(), CPU).func, sch.mod["main"].with_attr(SCHEDULED_ATTR, True)
    )


def test_trace_keeps_only_the_primitives() -> None:
    trace = lowered(CASES[0]).trace
    assert [inst.kind.name for inst in trace.insts] == ["GetSBlock", "GetLoops", "Split"]


def test_the_options_change_the_nest() -> None:
    """Without `keep_unit_loops` the loop of extent 1 goes; without `factor_axis 1` the factored
    axis comes first."""
    kept = lower(
        parse("block C:\nsplit i by 8\ncompute_at B i.i keep_unit_loops\n"), two_stage(), CPU
    )
    dropped = lower(parse("block C:\nsplit i by 8\ncompute_at B i.i\n"), two_stage(), CPU)
    assert "T.grid(1, 64)" in kept.script() and "T.grid(1, 64)" not in dropped.script()
    second = lower(parse("split k by 16\nrfactor k.i factor_axis 1\n"), row_sum(), CPU)
    first = lower(parse("split k by 16\nrfactor k.i\n"), row_sum(), CPU)
    assert "T.sblock_alloc_buffer((64, 16))" in second.script()
    assert "T.sblock_alloc_buffer((16, 64))" in first.script()
