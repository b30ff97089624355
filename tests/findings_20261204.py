# ruff: noqa: E501
"""The finding of issue 33's second long differential run (2026-12-04: fuzz/diff_run.py over live
cases, seeds 3340 and 3341, 21,107 schedules checked clean): one that checked clean and took LLVM
119 s to build in the run (71 s of CPU replayed alone). Not yet refused: the checker's unroll
budget counts `unroll` statements and pragmas, and the short loops LLVM unrolls inside them, but
not a nest of short guarded loops that LLVM unrolls by itself with no `unroll` at all."""

from fuzz.cases import Case
from fuzz.nests import NestSpec

# fmt: off
# `split s by 4, *, 8, 32` of an s of extent 1: 4 x 8 x 32 = 1024 iterations of `pre`, each under
# the guard `((s_0 + s_1) * 8 + s_2) * 32 + s_3 < 1 and p_0 * 4 + p_1 < 18`, inside `split p by
# 5, 4` (p of 18) where A_global is computed. Measured alone: 71.3 s of CPU; without `split p by
# 5, 4`, 0.1 s; with `split s by *, 8, 32` instead (256 iterations), 1.6 s; without the
# storage_align, 71.8 s; without rfactor and decompose_reduction, 63.9 s.
GUARDED_SHORT_LOOPS = NestSpec(kind='matmul', spatial=(('at', 18), ('by', 1), ('x', 11)), reduce=(('in', 1),), reducer='sum', dtype='int32', main='out', producer='pre', consumer='post', pad=0, epilogue=())
SLOW_BUILD = Case(
    text='block pre:\n  cache_read A global\n  compute_at A_global p\n  split s by 4, *, 8, 32\nblock out:\n  rfactor in\nblock A_global:\n  storage_align A_global dim 1 factor 64 offset 1\nblock pre:\n  decompose_reduction out at at\nblock out_init:\n  fuse by_init, x_init as f11\nblock A_global:\n  split p by 5, 4\n',
    gpu=False, nest=GUARDED_SHORT_LOOPS,
)
# fmt: on
