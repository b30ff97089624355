"""The checker, as a spec: each wrong schedule and exactly what its author is told.

Every case below is a schedule with a mistake; its golden file (tests/golden/check/<name>.txt) holds
the schedule and the diagnostics rendered as the command line prints them, caret lines included.
Refresh with `pytest --update-golden` and review the diff like code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache

import pytest
from tvm import te, tirx

from schedlang.checker.check import CheckResult, check
from schedlang.core.diagnostics import Severity, render_all
from schedlang.core.target import resolve_target
from schedlang.lang import nodes
from schedlang.lang.statements.loops import Split
from schedlang.lang.syntax import parse

# A fixed CPU (AVX2: 8 x float32), so no golden file depends on the machine running the tests.
CPU = resolve_target('{"kind": "llvm", "mcpu": "skylake", "num-cores": 4}')
# sm_90: 1024 threads per block, threadIdx.z <= 64, 48 KiB of shared memory per block.
GPU = resolve_target("cuda")


# --- ops -----------------------------------------------------------------------------------------


@cache
def matmul(n: int = 64) -> tirx.PrimFunc:
    """C[i, j] = sum over k of A[i, k] * B[k, j]: one reduction block C with axes i, j, k."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, c])


@cache
def two_stage() -> tirx.PrimFunc:
    """B = A * 2 (axes x, y), then C = B + 1 (axes i, j): two blocks, one intermediate buffer."""
    a = te.placeholder((64, 64), name="A")
    b = te.compute((64, 64), lambda x, y: a[x, y] * 2.0, name="B")
    c = te.compute((64, 64), lambda i, j: b[i, j] + 1.0, name="C")
    return te.create_prim_func([a, c])


@cache
def three_stage() -> tirx.PrimFunc:
    """B = A * 2; C = transpose(B) + 1; D = C + B: B has two consumers."""
    a = te.placeholder((64, 64), name="A")
    b = te.compute((64, 64), lambda x, y: a[x, y] * 2.0, name="B")
    c = te.compute((64, 64), lambda i, j: b[j, i] + 1.0, name="C")
    d = te.compute((64, 64), lambda u, v: c[u, v] + b[u, v], name="D")
    return te.create_prim_func([a, d])


@cache
def scale(n: int = 4096) -> tirx.PrimFunc:
    """B[i] = A[i] * 2: one long spatial axis."""
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    return te.create_prim_func([a, b])


@cache
def three_loads(width: int = 16) -> tirx.PrimFunc:
    """B = A * 2 (16 x 16); C[i, j] = B[i, j] + B[i, j + 1] + B[i, j + 2] (16 x width): at a
    width of 16 the function itself reads two columns past B (as TVM's compute_inline test
    `elementwise_multi_loads` does)."""
    a = te.placeholder((16, 16), name="A")
    b = te.compute((16, 16), lambda x, y: a[x, y] * 2.0, name="B")
    c = te.compute((16, width), lambda i, j: b[i, j] + b[i, j + 1] + b[i, j + 2], name="C")
    return te.create_prim_func([a, c])


@cache
def padded(n: int = 9) -> tirx.PrimFunc:
    """P = A with a border of one zero (block P, axes p, q), then B = P * 2: a padding block."""
    a = te.placeholder((n, n), name="A")
    p = te.compute(
        (n + 2, n + 2),
        lambda p, q: tirx.if_then_else(
            tirx.all(p >= 1, p <= n, q >= 1, q <= n), a[p - 1, q - 1], 0.0
        ),
        name="P",
    )
    b = te.compute((n + 2, n + 2), lambda i, j: p[i, j] * 2.0, name="B")
    return te.create_prim_func([a, b])


@cache
def dense_relu() -> tirx.PrimFunc:
    """D = X @ W (block D, axes i, j, k), then E = max(D + 1, 0) (block E, axes i, j)."""
    x = te.placeholder((64, 32), name="X")
    w = te.placeholder((32, 48), name="W")
    k = te.reduce_axis((0, 32), name="k")
    d = te.compute((64, 48), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="D")
    e = te.compute((64, 48), lambda i, j: te.max(d[i, j] + 1.0, 0.0), name="E")
    return te.create_prim_func([x, w, e])


@cache
def row_stats() -> tirx.PrimFunc:
    """M[i] = max over j of A[i, j], then S[x] = sum over r of exp(A[x, r] - M[x]): a reduction
    reading a reduction, as in softmax."""
    a = te.placeholder((64, 64), name="A")
    j = te.reduce_axis((0, 64), name="j")
    m = te.compute((64,), lambda i: te.max(a[i, j], axis=j), name="M")
    r = te.reduce_axis((0, 64), name="r")
    s = te.compute((64,), lambda x: te.sum(te.exp(a[x, r] - m[x]), axis=r), name="S")
    return te.create_prim_func([a, s])


@cache
def example(name: str, **defines: int) -> tirx.PrimFunc:
    """An op of examples/, at the given sizes (the differential fuzzer's reproducers)."""
    from schedlang.core.ops import load_op

    return load_op(f"examples/{name}.py", {k: str(v) for k, v in defines.items()}).func


@cache
def issue_op(name: str, **defines: int) -> tirx.PrimFunc:
    """An op of tests/ops/, at the given sizes (issue 33's reproducers)."""
    from schedlang.core.ops import load_op

    return load_op(f"tests/ops/{name}.py", {k: str(v) for k, v in defines.items()}).func


# Issue 33, found by a differential run on ops not in the project: each checked clean. rfactor
# gives D_rf the storage_align of D, which pads D_rf's dim 1 (`i`) to 2^30 + 1: 512 x 1073741825
# elements wrap in int32 to 512 (a SIGSEGV). ALIGN_FACTOR is the factor, a knob of the near miss.
ALIGN_THEN_RFACTOR = (
    "block D:\n  storage_align D dim 1 factor {factor} offset 1\n  rfactor k\n"
    "block D_rf:\n  reverse_compute_at D i\n  cache_read A global\n"
    "block E:\n  split i by 8\n  cache_read bias local at i.o as bias_x1\n"
)
# `unroll a` (256) around `c`, whose pragma unrolls the 512 iterations of `b`: 131072 statements,
# which LLVM built past the fuzzer's 120 s.
UNROLL_OVER_PRAGMA = (
    "block Y:\n  rfactor b\n  fuse c, b\n  fuse a, c_b\n"
    "block Y_rf:\n  pragma c auto_unroll_max_step=512\n  unroll a\n"
)


def wiped_nest() -> tirx.PrimFunc:
    """The differential fuzzer's nest of seed 18's wiped reduction (fuzz/nests.py)."""
    from fuzz.nests import build_nest
    from tests.findings_20261202 import WIPED_NEST

    return build_nest(WIPED_NEST).func


def guarded_unroll_nest() -> tirx.PrimFunc:
    """The nest of the long run's slow build (tests/findings_20261203.py): 7 x 1024 x 9."""
    from fuzz.nests import build_nest
    from tests.findings_20261203 import GUARDED_UNROLL

    return build_nest(GUARDED_UNROLL).func


def strided_lanes_nest() -> tirx.PrimFunc:
    """The nest of the 2026-12-05 run's hang (tests/findings_20261205.py): 11 x 33 x 18."""
    from fuzz.nests import build_nest
    from tests.findings_20261205 import STRIDED_LANES_NEST

    return build_nest(STRIDED_LANES_NEST).func


def slow_build_nest() -> tirx.PrimFunc:
    """The nest of the second long run's slow build (tests/findings_20261204.py): 18 x 1 x 11."""
    from fuzz.shrink import case_op
    from tests.findings_20261204 import SLOW_BUILD

    return case_op(SLOW_BUILD).func


def depthwise(**defines: int) -> Callable[[], tirx.PrimFunc]:
    return lambda: example("depthwise_conv2d", N=1, C=1, **defines)


# --- cases ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    op: Callable[[], tirx.PrimFunc]
    schedule: str
    gpu: bool = False
    knobs: Mapping[str, int] = field(default_factory=dict)
    strict: bool = False
    template_ok: bool = True


# A GPU matmul tile: blocks of 8x32 threads, one thread per element of C.
GPU_TILE = """\
tile i, j by 8x32
bind i.o blockIdx.y
bind j.o blockIdx.x
bind i.i threadIdx.y
bind j.i threadIdx.x
"""

SLOW_BUILD_TEXT = (
    "block pre:\ncache_read A global\ncompute_at A_global p\nsplit s by 4, *, 8, 32\n"
    "block A_global:\nsplit p by 5, 4\n"
)

CASES = [
    # --- names -----------------------------------------------------------------------------------
    Case("unknown_block", two_stage, "block Cc:\nsplit i by 4\n"),
    Case("block_needed", two_stage, "split i by 4\n"),
    Case("unknown_axis", matmul, "split jj by 4\n"),
    Case("unknown_buffer", matmul, "cache_read a global\n"),
    Case("axis_after_split", matmul, "split i by 16\nvectorize i\n"),
    Case("axis_after_fuse", matmul, "fuse i, j\nparallel i\n"),
    Case("axis_of_other_block", two_stage, "block C:\nparallel x\n"),
    Case("axis_of_moved_block", two_stage, "block C:\ncompute_at B i\nblock B:\nsplit x by 8\n"),
    # --- factors ---------------------------------------------------------------------------------
    Case("factor_zero", matmul, "split i by 0\n"),
    Case("factor_negative", matmul, "split i by *, -4\n"),
    Case("factor_over_extent", matmul, "split i by 128\n"),
    Case("factors_under_extent", matmul, "split i by 4, 8\n"),
    Case("factor_not_divisible", matmul, "split i by 24\n"),
    Case("factor_not_divisible_strict", matmul, "split i by 24\n", strict=True),
    Case("tile_not_divisible", matmul, "tile i, j by 16x24\n"),
    # A warning, not an error: TVM guards the inner loop (tests/test_soundness.py builds it).
    Case("tile_over_extent", lambda: matmul(13), "tile i, j by 32x32\nvectorize j.i\n"),
    # --- knobs -----------------------------------------------------------------------------------
    Case("knob_unbound", matmul, "param TI in [8, 16]\nsplit i by TI\n", template_ok=False),
    Case("knob_unknown", matmul, "param TILE_I in [8, 16]\nsplit i by TILE_J\n"),
    Case("knob_out_of_range", matmul, "param TI in [8, 16]\nsplit i by TI\n", knobs={"TI": 12}),
    Case("knob_not_declared", matmul, "param TI in [8, 16]\nsplit i by TI\n", knobs={"TJ": 8}),
    # --- loop kinds on a CPU ---------------------------------------------------------------------
    Case("parallel_reduction", matmul, "parallel k\n"),
    Case("vectorize_reduction", matmul, "vectorize k\n"),
    Case("vectorize_not_innermost", lambda: matmul(8), "vectorize i\n"),
    Case("vectorize_not_innermost_strict", lambda: matmul(8), "vectorize i\n", strict=True),
    Case("vectorize_too_wide", lambda: scale(64), "vectorize i\n"),
    # Found by fuzzing: LLVM takes minutes to build a 1000-lane vector with strided loads.
    Case("vectorize_far_too_wide", scale, "vectorize i\n"),
    # Found by fuzzing: LLVM's build time explodes past a few thousand copies of a loop body.
    Case("unroll_too_many_copies", lambda: matmul(128), "split j by 64\nunroll j.i\nunroll k\n"),
    Case("auto_unroll_too_many_copies", matmul, "pragma i auto_unroll_max_step=100000\n"),
    Case("unroll_over_pragma", lambda: issue_op("sum_middle"), UNROLL_OVER_PRAGMA),
    # The same `if` in 1024 copies (p's guard): LLVM built it for 36 s (issue 33's long run).
    Case(
        "unroll_under_same_guard", guarded_unroll_nest, "block B_local:\nunroll q\nsplit p by 3\n"
    ),
    # 1024 guarded copies LLVM unrolls with no `unroll`: 71 s (issue 33's second long run).
    Case("self_unrolled_guarded_copies", slow_build_nest, SLOW_BUILD_TEXT),
    # 198 unrolled vectors of 33 strided lanes: 120 s of LLVM (the differential run of 2026-12-05).
    Case(
        "unroll_strided_vectors",
        strided_lanes_nest,
        "block D:\npragma at2 auto_unroll_max_step=512\nvectorize by2\n",
    ),
    # Found by a long-file test: TVM's name for a fused loop doubles with each split and fuse of
    # the same loop; 25 rounds took gigabytes.
    Case("fuse_name_doubles", scale, "split i by 2\nfuse i.o, i.i as i\n" * 7),
    Case("fuse_not_adjacent", matmul, "fuse i, k\n"),
    Case("fuse_inner_first", matmul, "fuse j, i\n"),
    Case("parallel_nested", matmul, "parallel i\nparallel j\n"),
    Case("parallel_holds_parallel", matmul, "parallel j\nparallel i\n"),
    Case("parallel_after_decompose", matmul, "decompose_reduction at k\nparallel i\n"),
    # --- target mismatches -----------------------------------------------------------------------
    Case("bind_on_cpu", matmul, "bind i blockIdx.x\n"),
    Case("parallel_on_gpu", matmul, "bind i blockIdx.x\nbind j threadIdx.x\nparallel k\n", True),
    Case("shared_on_cpu", matmul, "cache_read A shared\n"),
    # --- GPU limits and bindings -----------------------------------------------------------------
    Case(
        "gpu_too_many_threads",
        matmul,
        "split i by 32\nbind i.o blockIdx.x\nbind i.i threadIdx.x\nbind j threadIdx.y\n",
        True,
    ),
    Case(
        "gpu_thread_extent",
        scale,
        "split i by 128\nbind i.o blockIdx.x\nbind i.i threadIdx.z\n",
        True,
    ),
    Case(
        "gpu_thread_axis_two_extents",
        matmul,
        GPU_TILE + "split k by 16\ncache_read A shared at k.o as A_sh\n"
        "block A_sh:\nfuse ax0, ax1\nbind ax0_ax1 threadIdx.x\n",
        True,
    ),
    # Issue 17: TVM unrolls in TIR before the CUDA compiler sees the kernel: minutes, gigabytes.
    Case(
        "gpu_unroll_too_many_copies",
        lambda: matmul(4096),
        "split j by 256\nbind i blockIdx.x\nbind j.o blockIdx.y\nbind j.i threadIdx.x\nunroll k\n",
        True,
    ),
    Case(
        "gpu_unroll_bound_loop", matmul, "bind i blockIdx.x\nbind j threadIdx.x\nunroll i\n", True
    ),
    # Warnings: TVM replaces the binding (tests/test_soundness.py builds both).
    Case(
        "gpu_bind_twice",
        matmul,
        "bind i blockIdx.x\nbind j threadIdx.x\nbind j threadIdx.y\n",
        True,
    ),
    Case(
        "gpu_unroll_bound_inner",
        matmul,
        "split j by 32\nbind i blockIdx.x\nbind j.o threadIdx.y\nbind j.i threadIdx.x\n"
        "unroll j.o\n",
        True,
    ),
    # Not verified on a GPU: still an error there.
    Case(
        "gpu_vectorize_not_innermost",
        matmul,
        "split j by 4\nbind i blockIdx.x\nbind j.o threadIdx.x\nvectorize j.i\n",
        True,
    ),
    Case(
        "gpu_unrolled_outside_kernel",
        matmul,
        "split i by 32\nunroll i.o\nbind i.i blockIdx.x\nbind j threadIdx.x\n",
        True,
    ),
    Case(
        "gpu_warp_memory",
        matmul,
        "bind i blockIdx.x\nbind j threadIdx.x\ncache_read A warp at j\n",
        True,
    ),
    Case(
        "gpu_shared_write_under_guard",
        matmul,
        "split i by 3\nbind i.o blockIdx.y\nbind i.i threadIdx.y\nbind j threadIdx.x\n"
        "cache_write C shared at j\n",
        True,
    ),
    Case(
        "gpu_cross_thread_reduction_order",
        matmul,
        "fuse i, j\nsplit i_j by 64\nbind i_j.o blockIdx.x\nreorder k, i_j.i\nbind k threadIdx.x\n",
        True,
    ),
    Case(
        "gpu_vectorize_too_wide",
        scale,
        "split i by *, 64, 16\nbind i.0 blockIdx.x\nbind i.1 threadIdx.x\nvectorize i.2\n",
        True,
    ),
    Case("gpu_bind_reduction", matmul, "bind i blockIdx.x\nbind k blockIdx.y\n", True),
    Case(
        "gpu_block_not_bound",
        two_stage,
        "block C:\nsplit i by 32\nbind i.o blockIdx.x\nbind i.i threadIdx.x\n",
        True,
    ),
    Case(
        "gpu_shared_memory",
        lambda: matmul(256),
        "tile i, j by 64x16\nbind i.o blockIdx.y\nbind j.o blockIdx.x\nbind i.i threadIdx.y\n"
        "bind j.i threadIdx.x\ncache_read A shared at j.o\n",
        True,
    ),
    Case(
        "gpu_serial_above_threads",
        scale,
        "split i by 256\nbind i.i threadIdx.x\n",
        True,
    ),
    Case(
        "gpu_shared_across_kernels",
        matmul,
        "bind i blockIdx.x\nbind j threadIdx.x\ncache_read A shared as A_sh\n"
        "block A_sh:\nbind ax0 blockIdx.x\nbind ax1 threadIdx.x\n",
        True,
    ),
    # Found by fuzzing: S runs on thread 0 only (it reads M's cross-thread reduction), and its
    # init and update in shared memory need a __syncthreads TVM cannot put in that `if`.
    Case(
        "gpu_accumulate_on_one_thread",
        row_stats,
        "block M:\ncache_write M local\nblock S:\ncompute_inline M_local\ncache_write S shared\n"
        "bind x blockIdx.x\ncompute_at M x\nreverse_compute_at S_shared x\n"
        "block M:\nsplit ax0 by 32\nbind ax0.i threadIdx.x\n",
        True,
    ),
    # Found by stepwise decoding: every reduction loop bound to threads and a copy under it;
    # TVM's LowerCrossThreadReduction binds the loop twice and CompactBufferAllocation
    # segfaults (the split case beside it, each thread reducing first, is accepted).
    Case(
        "gpu_cross_thread_reduction_over_a_copy",
        matmul,
        "bind i blockIdx.x\ncache_read A shared at k\nbind k threadIdx.x\n",
        True,
    ),
    # Found by fuzzing: with 4 elements per thread, LowerWarpMemory fails on the indices.
    Case(
        "gpu_warp_elements_per_thread",
        matmul,
        GPU_TILE.replace("bind j.i threadIdx.x", "split j.i by 4\nbind j.i.o threadIdx.x")
        + "cache_write C warp at j.i.o\n",
        True,
    ),
    # Found by fuzzing: unrolling copies the cross-thread reduction, which TVM cannot lower.
    Case(
        "gpu_unrolled_cross_thread_reduction",
        matmul,
        "split k by 16\nbind k.i threadIdx.x\nbind i blockIdx.x\nunroll j\n",
        True,
    ),
    Case(
        "gpu_global_inside_kernel",
        two_stage,
        "block C:\nsplit i by 16\nbind i.o blockIdx.x\nbind i.i threadIdx.x\ncompute_at B i.o\n"
        "block B:\nsplit ax1 by 16\nbind ax1.i threadIdx.x\n",
        True,
    ),
    # --- blocks and buffers ----------------------------------------------------------------------
    Case("rfactor_spatial", matmul, "rfactor i\n"),
    Case("rfactor_factor_axis", matmul, "split k by 16\nrfactor k.i factor_axis 3\n"),
    # The final block would add up partial results the `if` of the split never wrote: k.o runs
    # 16 iterations, of which only 10 (20 / 2) pass the `if` (garbage in C before this guard).
    Case("rfactor_unwritten_partials", lambda: matmul(20), "split k by 16, *\nrfactor k.o\n"),
    Case("rfactor_over_extent", lambda: matmul(13), "split k by 32\nrfactor k.i\n"),
    Case("decompose_not_reduction", two_stage, "block B:\ndecompose_reduction at x\n"),
    Case(
        "storage_align_dim",
        matmul,
        "cache_read A global as A_g\nstorage_align A_g dim 2 factor 32 offset 1\n",
    ),
    Case("pragma_value", matmul, "pragma i unroll_explicit=2, auto_unroll_max_step=-1\n"),
    Case("set_scope_parameter", matmul, "set_scope C local\n"),
    Case("set_scope_shared_on_cpu", two_stage, "block C:\nset_scope B shared\n"),
    Case("reverse_inline_no_producer", two_stage, "block C:\nreverse_compute_inline B\n"),
    Case("cache_name_clash", matmul, "cache_write C global\ncache_write C_global global\n"),
    Case("compute_at_not_a_producer", two_stage, "block B:\ncompute_at C x\n"),
    Case("reverse_compute_at_not_a_consumer", two_stage, "block C:\nreverse_compute_at B i\n"),
    # Found by fuzzing: TVM's compute_at drops the guard of an rfactor block of a non-divisible
    # split, which then reads past the end of its rows.
    Case("compute_at_drops_guard", matmul, "split k by 7\nrfactor k.i\ncompute_at C_rf i\n"),
    # Issue 17, class A: TVM's rfactor drops the guard of a non-divisible split of a spatial axis
    # from the final reduction block, which then writes past C (heap corruption).
    Case("rfactor_drops_guard", lambda: matmul(67), "split i by 17\nrfactor k\n"),
    # Issue 17, class B: the write-back copies a box holding rows computed in other iterations.
    Case(
        "cache_write_strided_tiles",
        lambda: matmul(100),
        "tile i, j by 10x20\nreorder i.i, j.o, j.i, i.o\ncache_write C global at j.o\n",
    ),
    # Found by the differential run of 2026-12-02: a split's inner part reordered outside its
    # outer part, then a block computed between them (any `at`, not only cache_write's).
    Case(
        "compute_at_between_strided_loops",
        lambda: matmul(64),
        "tile i, j by 16x16\nreorder i.o, j.i, j.o, i.i\ncache_write C global at j.i\n",
    ),
    # ... and loops whose steps overlap under a guard: 11 rows split by 4, 32, * leave a third
    # loop of 1, split again by 16; only the `if` keeps `i.2.i` and `i.1` apart.
    Case(
        "compute_at_overlapping_guarded_loops",
        lambda: matmul(11),
        "split i by 4, 32, *\nsplit i.2 by 16\nreorder i.2.o, i.2.i, i.1\n"
        "cache_write C global at i.1\n",
    ),
    # A loop fused from a spatial and a reduction loop, split, its parts swapped: the init runs
    # after some of the updates (differential run of 2026-12-02).
    Case(
        "reorder_of_fused_reduction_parts",
        matmul,
        "reorder i, k, j\nfuse i, k\nsplit i_k by 8\nreorder i_k.i, i_k.o\n",
    ),
    # Issue 17, class C: the padding block moved into the copy of its input loses its border.
    Case(
        "reverse_compute_at_drops_border",
        padded,
        "block P:\ncache_read A global\nblock A_global:\nreverse_compute_at P ax0\n",
    ),
    # Issue 17, class D: a loop inside a vectorized one (moved outward by reorder).
    Case(
        "compute_at_inside_vectorized",
        dense_relu,
        "block E:\nsplit j by 8\nvectorize j.i\ncache_write E global\nreorder j.i, j.o\n"
        "reverse_compute_at E_global j.o\n",
    ),
    # Issue 17: rfactor of a large matmul makes a C_rf of 4 GB, past int32 indices at 4096^3.
    Case("rfactor_too_large", lambda: matmul(1024), "rfactor k\n"),
    Case(
        "storage_align_overflows",
        matmul,
        "cache_write C global\nstorage_align C dim 0 factor 1073741824 offset 0\n",
    ),
    Case(
        "rfactor_keeps_storage_align",
        lambda: issue_op("dense_relu_rf"),
        ALIGN_THEN_RFACTOR.format(factor=1073741824),
    ),
    # Its strides past 2^31 - 1 wrap in TVM's int32 (to 256 x -1073741568: negative, the size
    # too), and the rule read them so: clean (the long differential run of issue 33).
    Case(
        "rfactor_storage_align_wraps",
        lambda: issue_op("dense_relu_rf"),
        "block D:\n  storage_align D dim 1 factor 12582912 offset 1\n  rfactor k\n",
    ),
    # TVM vectorizes the buffer between two blocks in one vectorized loop as a scalar: wrong values.
    Case("vectorize_two_blocks", two_stage, "block C:\ncompute_at B j\nvectorize j\n"),
    Case(
        "compute_at_vectorized",
        two_stage,
        "block C:\nsplit j by 8\nvectorize j.i\ncompute_at B j.i\n",
    ),
    # --- found by the differential fuzzer (fuzz/FINDINGS.md): clean checks, wrong kernels -------
    # A strided window moved into the loops of its padding block: too small a region.
    Case(
        "reverse_compute_at_window",
        depthwise(H=2, W=1, R=3, stride=3, pad=1),
        "block pad:\nreverse_compute_at depthwise_conv2d w\n",
    ),
    # The final block of an rfactor moved into the rf block's reduction loop: sums of sums.
    Case(
        "reverse_compute_at_into_reduction",
        matmul,
        "split k by 16\nrfactor k.i\nblock C_rf:\nreverse_compute_at C k.o\n",
    ),
    Case("cache_write_at_reduction_loop", matmul, "cache_write C global at k\n"),
    # After split, fuse, split, fuse, TVM sizes the cache 32 x 3 for an 11 x 3 output.
    Case(
        "cache_write_cache_too_large",
        lambda: example("layernorm", rows=11, cols=3),
        "block normalize:\nsplit i by 3\nfuse i.o, i.i, j\nsplit i.o_i.i_j by 32\n"
        "fuse i.o_i.i_j.o, i.o_i.i_j.i\ncache_write normalize global\n",
    ),
    Case("vectorize_extent_one", matmul, "split j by 1\nvectorize j.i\n"),
    # Inlined into `exp`, which `normalize` reads too: TVM drops the buffer.
    Case(
        "reverse_inline_shared_producer",
        lambda: example("softmax", rows=1, cols=1),
        "block row_sum:\nrfactor j\nreverse_compute_inline row_sum_rf\n",
    ),
    # The split after the unroll makes loops LLVM unrolls in each copy: 154 s to build.
    Case(
        "unroll_grows_after_split",
        lambda: example("layernorm", rows=64, cols=97),
        "block normalize:\ncompute_at var i keep_unit_loops\nblock mean:\nunroll i\n"
        "split j by 2, 4, *\n",
    ),
    # --- the kernel as TVM lowers it (schedlang.checker.dataflow), found by differential fuzzing
    # A fused loop's split: TVM computes C over the box of rows B's iteration covers.
    Case(
        "dataflow_unwritten",
        two_stage,
        "block B:\nfuse x, y\nsplit x_y by 6, *\nreverse_compute_at C x_y.o\n",
    ),
    # pad moved into a cache of its input takes over the cache's `if`: the border is never written
    # (refused at the move, by the count of pad's instances; the dataflow rule finds it too).
    Case(
        "dataflow_never_written",
        depthwise(H=1, W=1, R=1, stride=1, pad=1),
        "block pad:\ncache_read data global at w keep_unit_loops\nblock data_global:\n"
        "reverse_compute_at pad ax0\n",
    ),
    # The function itself reads past B, whatever the schedule (TVM's compute_inline test).
    Case("out_of_bounds_as_written", three_loads, "block B:\ncompute_inline B\n"),
    # The second cache is compacted to the first one's unguarded box (SIGSEGV when run).
    Case(
        "dataflow_out_of_bounds",
        lambda: example("depthwise_conv2d", N=1, C=2, H=2, W=7, R=1, stride=1, pad=1),
        "block pad:\ntile n, c, w by 32x1x8\ncache_read data local at c.i\nreorder c.i, c.o\n"
        "cache_read data_local global\n",
    ),
    # The tile in the cache's section swaps the parts of C's fused spatial+reduction loop.
    Case(
        "dataflow_late_init",
        matmul,
        "fuse j, k\ncache_read B global at j_k\nsplit j_k by 5\nblock B_global:\n"
        "tile j_k.o, j_k.i by 3x2\n",
    ),
    # C moved into its own cache's loop: j, inside k.o, runs each k.o step of C twice.
    Case(
        "replayed_reduction",
        matmul,
        "tile i, k by 16x16\ncache_read A global at j\nblock A_global:\nreverse_compute_at C ax1\n",
    ),
    # normalize moved to the outer part of a split of the loop row_sum was computed at.
    Case(
        "partial_reduction_read",
        lambda: example("softmax", rows=1, cols=64),
        "block exp:\ntile i, j by 3x46\nreverse_compute_at row_sum j.o\nsplit j.o by 8, *\n"
        "reverse_compute_at normalize j.o.o\n",
    ),
    # decompose_reduction puts the init under a guarded loop that feeds none of its iterators.
    Case(
        "dataflow_wiped_reduction",
        wiped_nest,
        "block P:\nsplit s by *, 2\nreverse_compute_at A_global u keep_unit_loops\n"
        "tile q, p by 45x16\nreorder p.i, p.o\ndecompose_reduction A_global at p.o\n",
    ),
    # row_sum per point of normalize's fused loop, decomposed inside it: each row summed twice.
    Case(
        "dataflow_replayed_steps",
        lambda: example("softmax", rows=3, cols=3),
        "block normalize:\nfuse i, j\ncompute_at row_sum i_j\nsplit i_j by 16, *, 8, 2\n"
        "block exp:\ndecompose_reduction row_sum at i_j.3\n",
    ),
    # --- TVM's own refusals, mapped to the statement ---------------------------------------------
    Case("tvm_compute_at_consumers", three_stage, "block C:\ncompute_at B i\n"),
    Case("tvm_compute_inline_output", two_stage, "block C:\ncompute_inline C\n"),
    # --- many errors at once, and no cascade -----------------------------------------------------
    Case(
        "several_errors",
        matmul,
        "split i by 0\nvectorize i.i\nsplit q by 4\nparallel k\nfuse i.o, j\nsplit jj by 8\n",
    ),
]


def run(case: Case) -> CheckResult:
    schedule = parse(case.schedule, f"{case.name}.sched")
    return check(
        schedule,
        case.op(),
        GPU if case.gpu else CPU,
        knobs=case.knobs,
        strict=case.strict,
        template_ok=case.template_ok,
    )


def report(case: Case, result: CheckResult) -> str:
    options = ["cuda" if case.gpu else "llvm"]
    options += [f"knobs {dict(case.knobs)}"] if case.knobs else []
    options += ["strict"] if case.strict else []
    options += ["template_ok=False"] if not case.template_ok else []
    return (
        f"-- {case.name}.sched ({', '.join(options)}) --\n{case.schedule}"
        f"-- diagnostics --\n{render_all(result.diagnostics, case.schedule)}\n"
    )


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_diagnostics(case: Case, golden) -> None:
    result = run(case)
    assert result.diagnostics, "a wrong schedule must be reported"
    golden(f"check/{case.name}.txt", report(case, result))
    # A schedule is lowered exactly when it has no errors; warnings alone do not stop it.
    assert (result.lowered is None) == (not result.ok)


WARNING_ONLY = {"factor_not_divisible", "tile_not_divisible", "vectorize_too_wide"}
WARNING_ONLY |= {"gpu_serial_above_threads", "factor_over_extent", "vectorize_not_innermost"}
WARNING_ONLY |= {"gpu_bind_twice", "gpu_unroll_bound_inner"}


@pytest.mark.parametrize("name", sorted(WARNING_ONLY))
def test_warnings_do_not_stop_lowering(name: str) -> None:
    result = run(next(case for case in CASES if case.name == name))
    assert [d.severity for d in result.diagnostics] == [Severity.WARNING]
    assert result.lowered is not None


@pytest.mark.parametrize("name", ["factor_not_divisible", "vectorize_not_innermost"])
def test_strict_turns_warnings_into_errors(name: str) -> None:
    result = run(next(case for case in CASES if case.name == f"{name}_strict"))
    assert [d.severity for d in result.diagnostics] == [Severity.ERROR]
    assert result.lowered is None


def test_tile_over_extent_warns_about_the_factors_only() -> None:
    """`vectorize j.i` around the reduction loop alone is the usual CPU matmul: no warning."""
    result = run(next(case for case in CASES if case.name == "tile_over_extent"))
    assert [d.message.split(":")[0] for d in result.diagnostics] == [
        "factor 32 is larger than the extent 13 of `i`",
        "factor 32 is larger than the extent 13 of `j`",
    ]
    assert result.ok


def test_an_offset_past_the_factor_aligns_as_its_remainder() -> None:
    """TVM pads a stride to `offset` modulo `factor` (issue 32: an offset past the factor was
    refused): a warning, and the kernel allocates what the remainder would."""
    from schedlang.checker.check import kernel_uses, lower_for_verification

    def shared(offset: int) -> tuple:
        text = (
            GPU_TILE + "split k by 16\ncache_read A shared at k.o\n"
            f"storage_align A_shared dim 0 factor 16 offset {offset}\n"
        )
        result = check(parse(text), matmul(), GPU)
        assert result.ok, render_all(result.diagnostics, text)
        kernels = kernel_uses(lower_for_verification(result.lowered.func, GPU))
        return result, [kernel.shared for kernel in kernels]

    past, uses = shared(20)
    assert [d.message for d in past.diagnostics] == [
        "offset 20 is past the factor 16: TVM pads the stride as with offset 4"
    ]
    remainder, same = shared(4)
    assert remainder.diagnostics == [] and uses == same
    assert uses[0][0][1] == 8 * (16 + 4) * 4  # 8 rows of 16, each padded by 4 floats


def test_every_error_is_reported_once_and_nothing_cascades() -> None:
    result = run(next(case for case in CASES if case.name == "several_errors"))
    # split i by 0 (line 1), unknown q (3), parallel k (4), unknown jj (6); nothing for `i.i`
    # (line 2) or `i.o` (line 5), the names the failed split would have made.
    assert [d.span.line for d in result.diagnostics] == [1, 3, 4, 6]
    assert all(d.is_error for d in result.diagnostics)


def test_tvm_errors_are_one_line_without_the_ir() -> None:
    for case in CASES:
        if not case.name.startswith("tvm_"):
            continue
        (diagnostic,) = run(case).diagnostics
        assert diagnostic.message.startswith("TVM cannot apply")
        assert "\n" not in diagnostic.message
        assert "T.sblock" not in diagnostic.message and "s_tir." not in diagnostic.message
        assert diagnostic.span.line == 2  # the statement TVM refused


def test_unbound_knob_does_not_cascade() -> None:
    schedule = parse("param T in [8, 16]\nsplit i by T\nvectorize i.i\nparallel i.o\n")
    result = check(schedule, matmul(), CPU, template_ok=False)
    assert [d.message for d in result.diagnostics] == ["knob `T` has no value"]


def test_template_takes_first_values_when_allowed() -> None:
    schedule = parse("param T in [8, 16]\nsplit i by T\nparallel i.o\n")
    result = check(schedule, matmul(), CPU)
    assert result.diagnostics == [] and result.lowered is not None
    split = result.lowered.schedule.statements[0]
    assert split == Split(nodes.Name("i"), (nodes.IntFactor(8),))


# --- schedules that check clean ------------------------------------------------------------------

# Shared-memory tiles loaded by all threads of the block together, as MetaSchedule does.
COOPERATIVE_FETCH = """\
tile i, j by 8x32
bind i.o blockIdx.y
bind j.o blockIdx.x
split k by 16
reorder k.o, i.i, j.i, k.i
bind i.i threadIdx.y
bind j.i threadIdx.x
cache_read A shared at k.o
cache_read B shared at k.o
block A_shared:
fuse ax0, ax1
split ax0_ax1 by 32
bind ax0_ax1.i threadIdx.x
block B_shared:
fuse ax0, ax1
split ax0_ax1 by 256
split ax0_ax1.i by 32
bind ax0_ax1.i.o threadIdx.y
bind ax0_ax1.i.i threadIdx.x
"""

CLEAN = [
    (matmul, False, "tile i, j by 16x16\nreorder i.o, j.o, k, i.i, j.i\nvectorize j.i\n"),
    # The README's showcase: `j.i` holds only the reduction loop `k`.
    (matmul, False, "tile i, j by 32x32\nvectorize j.i\n"),
    # A shared cache written before the threads are bound.
    (
        matmul,
        True,
        "split k by 16\ncache_read A shared at k.o\nbind i blockIdx.x\nbind j threadIdx.x\n",
    ),
    (matmul, False, "split k by 8\nparallel i\nsplit j by 8\nreorder k.o, k.i, j.i\n"),
    (matmul, False, "parallel i\ndecompose_reduction at k\n"),
    (matmul, False, "split k by 16\nrfactor k.i as C_rf\nblock C_rf:\nparallel k.i\n"),
    (matmul, False, "cache_write C global at j\nsplit k by 4\nunroll k.i\n"),
    (two_stage, False, "block C:\nparallel i\ncompute_at B i\n"),
    (two_stage, False, "block B:\ncompute_inline B\nblock C:\nfuse i, j as ij\nparallel ij\n"),
    (
        matmul,
        True,
        GPU_TILE + "split k by 16\ncache_read A shared at k.o\ncache_write C local at j.i\n",
    ),
    (matmul, True, "fuse i, j\nsplit i_j by 128\nbind i_j.o blockIdx.x\nbind i_j.i threadIdx.x\n"),
    (matmul, True, COOPERATIVE_FETCH),
    (matmul, True, "bind i blockIdx.x\nbind k threadIdx.x\nbind j blockIdx.y\nreorder i, j, k\n"),
    # The other side of gpu_cross_thread_reduction_over_a_copy: a copy under the thread loop of
    # a reduction each thread first runs over `k.o` (TVM moves `k.o` inside the thread loop).
    (
        matmul,
        True,
        "fuse i, j\nbind i_j blockIdx.x\nsplit k by 16\ncache_read A shared at k.i\n"
        "bind k.i threadIdx.x\n",
    ),
]


@pytest.mark.parametrize("op, gpu, text", CLEAN)
def test_clean_schedule_is_lowered(op, gpu: bool, text: str) -> None:
    result = check(parse(text), op(), GPU if gpu else CPU)
    assert result.diagnostics == []
    assert result.lowered is not None
    assert result.lowered.func.attrs["tirx.is_scheduled"]


def test_rfactor_of_a_reduction_over_a_symbolic_row_count_is_checked() -> None:
    """A row sum over `n` rows, `n` symbolic (a decoder's token count): the rfactor guard sizes
    `Y_rf` only where the shape is a constant, and the schedule lowers (it raised a TypeError,
    `int()` of the var `n`, before)."""
    n = tirx.Var("n", "int32")
    x = te.placeholder((n, 64), name="X")
    k = te.reduce_axis((0, 64), name="k")
    y = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="Y")
    func = te.create_prim_func([x, y])
    result = check(parse("split k by 16\nrfactor k.i\n"), func, CPU)
    assert result.diagnostics == []
    assert result.lowered is not None
    assert "Y_rf" in result.lowered.func.script()


def test_rfactor_buffer_is_sized_after_the_compute_at_that_shrinks_it() -> None:
    """`C_rf` of a 1024^3 matmul is 4 GiB as `rfactor k` makes it (refused: the golden
    rfactor_too_large), but `compute_at` at C's `j` leaves it one (i, j)'s 1024 partial sums, and
    at `i` one row's (4 MiB): the checker sizes it as TVM allocates it once every statement is
    applied, and takes both."""
    from schedlang.checker import dataflow, kernel_size

    for at, shape in (("j", (1024, 1, 1)), ("i", (1024, 1, 1024))):
        text = f"rfactor k\ncompute_at C_rf {at}\n"
        result = check(parse(text), matmul(1024), CPU)
        assert result.diagnostics == [], render_all(result.diagnostics, text)
        assert result.lowered is not None
        lowered = dataflow.lower_kernel(result.lowered.func, CPU.to_tvm())
        assert lowered is not None
        sizes = {a.name: a.shape for a in kernel_size.allocations(lowered[0])}
        assert sizes["C.rf"] == shape


# --- the checker never raises --------------------------------------------------------------------

# Every statement kind, tried on every axis and block name of the op (most of them wrong).
TEMPLATES = [
    "split {axis} by 8",
    "split {axis} by *, 2, 4",
    "tile {axis}, {axis} by 4x4",
    "reorder {axis}, j",
    "fuse {axis}, j",
    "bind {axis} threadIdx.x",
    "bind {axis} blockIdx.x",
    "vectorize {axis}",
    "unroll {axis}",
    "parallel {axis}",
    "cache_read {block} shared at {axis}",
    "cache_write {block} local at {axis}",
    "compute_at {block} {axis}",
    "reverse_compute_at {block} {axis}",
    "compute_inline {block}",
    "reverse_compute_inline {block}",
    "rfactor {axis}",
    "decompose_reduction {block} at {axis}",
    "storage_align {block} dim 1 factor 8 offset 1",
    "pragma {axis} auto_unroll_max_step=16",
    "set_scope {block} local",
]


@pytest.mark.parametrize("gpu", [False, True], ids=["llvm", "cuda"])
@pytest.mark.parametrize(
    "op, sections, axes",
    [(two_stage, ("B", "C"), ("x", "y", "i", "j", "i.o")), (matmul, ("C",), ("i", "k", "k.i"))],
    ids=["two_stage", "matmul"],
)
def test_check_never_raises(op, sections, axes, gpu: bool) -> None:
    texts = {
        f"block {section}:\nsplit i by 16\nsplit k by 8\n" + template.format(axis=axis, block=block)
        for section in sections
        for template in TEMPLATES
        for axis in axes
        for block in ("A", *sections)
    }
    for text in sorted(texts):
        result = check(parse(text), op(), GPU if gpu else CPU)
        assert (result.lowered is None) == (not result.ok)


# --- warnings reach the model --------------------------------------------------------------------


def test_a_model_sees_the_warnings_of_a_schedule_that_ran() -> None:
    """The tuner keeps a candidate's warnings with its record; feedback shows them with its time
    (a warning is legal, so the model may keep the schedule, knowing what it costs)."""
    from schedlang.core.ops import load_op
    from schedlang.llm.feedback import entry
    from tests.test_feedback import TARGET, record

    text = "vectorize i\n"
    result = run(Case("feedback", lambda: matmul(8), text))
    assert result.ok
    warnings = render_all(result.diagnostics, text)
    ran = record(7, text, median_s=0.001, extra={"warnings": warnings})
    shown = entry(ran, op=load_op("examples/matmul.py"), target=TARGET)
    assert shown.startswith("#7 ok: ")
    assert "warning: vectorize of `i`, which has `j`, `k` inside it" in shown
