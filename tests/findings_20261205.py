# ruff: noqa: E501
"""The hang of the differential run on the loosened checker (2026-12-05, seed 5200: fuzz/diff_run.py
over live cases, 13,983 schedules checked clean): one that checked clean and took LLVM 120 s to
build (znver4). Refused since by the unroll rule's weight of a vector of strided lanes
(schedlang.checker.kernel_size._strided_lanes, schedlang.checker.kernel_rules.unrolled_statements_fit)."""

from fuzz.cases import Case
from fuzz.nests import NestSpec

# fmt: off
# VectorizeLoop runs before UnrollLoop: `by2` (33 lanes) becomes vector statements, and the
# pragma then unrolls both `x2` (18) and `at2` (11) around them, 198 statements of 33 lanes 18
# elements apart (a gather and a scatter each). Measured alone (CPU seconds of the build, -mcpu
# znver4): 120 s; 132 statements of 33 lanes 54 s, 88 of 33 6.2 s, 198 of 16 6.1 s, 44 of 64
# 14 s; 44 of 33 1.9 s, 88 of 17 0.9 s, 198 of 8 0.6 s; `vectorize x2` (adjacent lanes) 0.1 s.
STRIDED_LANES_NEST = NestSpec(kind='elementwise', spatial=(('at', 11), ('by', 33), ('x', 18)), reduce=(), reducer='sum', dtype='float32', main='C', producer='B_local', consumer='D', pad=0, epilogue=())
UNROLLED_STRIDED_LANES = Case(
    text='block D:\n  pragma at2 auto_unroll_max_step=512\n  vectorize by2\n',
    gpu=False, nest=STRIDED_LANES_NEST,
)
# fmt: on
