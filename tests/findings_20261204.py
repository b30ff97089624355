# ruff: noqa: E501
"""The finding of issue 33's second long differential run (2026-12-04: fuzz/diff_run.py over live
cases, seeds 3340 and 3341, 21,107 schedules checked clean): one that checked clean and took LLVM
119 s to build in the run (71 s of CPU replayed alone). Refused since by
the checker's count of what LLVM unrolls by itself where a split's guard folds the copies
(schedlang.checker.kernel_rules.self_unrolled_copies_fit); and the third long run's (seed 3350, on
that checker): `unroll`ed loops around such copies."""

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

# fmt: off
# Seed 3350 of the third long run (75 s in the run, 31.5 s of CPU alone): `unroll z` (16) and
# `unroll x.o` (4) around `w` (17) and `y.1` (4), where `tile x, y, k by 4x4x1` split a y of 1:
# the guard keeps 17 of the 68 copies, LLVM unrolls them, 4352 in all. Without `unroll z`: 0.1 s;
# with `split z by 4` and `unroll z.i`: 0.3 s; with a y tile of 1 (no guard): 1.1 s.
UNROLLED_AROUND_FOLDED_NEST = NestSpec(kind='window', spatial=(('x', 16), ('y', 1), ('z', 16), ('w', 17)), reduce=(('k', 3), ('r', 1)), reducer='max', dtype='float32', main='out', producer='A_pad', consumer='D', pad=0, epilogue=())
UNROLLED_AROUND_FOLDED = Case(
    text='block out:\n  unroll z\n  reorder z, x\n  compute_at A_pad k\n  tile x, y, k by 4x4x1\n  unroll x.o\n  unroll r\n  decompose_reduction at y.o\nblock D:\n',
    gpu=False, nest=UNROLLED_AROUND_FOLDED_NEST,
)
# fmt: on

# fmt: off
# Seed 3361 of the third long run: computed wrong values. C's reduction runs over loops fused from
# `q` (spatial) and `s` (its reduction) and tiled, under `p`: its init runs only where every loop
# feeding `rk` is at its first value, which for most points of C comes after their first update.
# The late-init rule listed the update's points at once and gave up past 2^20 (2,021,760 here);
# it now checks slices of them (the loops of `i` and `l`, which feed nothing else).
LATE_INIT_NEST = NestSpec(kind='matmul', spatial=(('i', 10), ('j', 67), ('l', 3)), reduce=(('rk', 31),), reducer='sum', dtype='int32', main='C', producer='B_local', consumer='post', pad=0, epilogue=())
LATE_INIT_MANY_POINTS = Case(
    text='block B_local:\n  fuse q, s\n  split q_s by 1755\n  cache_read A global at q_s.o keep_unit_loops as A_c1\n  compute_at A_c1 q_s.i\n  reorder q_s.i, q_s.o\n  reverse_compute_at C q_s.o\n  tile p, q_s.i, q_s.o by 3x3x32\n  split q_s.o.i by 2\n',
    gpu=False, nest=LATE_INIT_NEST,
)
# fmt: on
