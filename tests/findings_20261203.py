# ruff: noqa: E501
"""The two findings of the long differential run of issue 33 (fuzz/diff_run.py over live cases,
stopped at input 12,273): schedules that checked clean that TVM could not build, or built for
minutes. Shrunk by hand to the statements that matter; the message is the start of the first
error the checker now gives."""

from fuzz.cases import Case
from fuzz.nests import NestSpec

# fmt: off
# The rfactor block keeps C's storage_align, which pads dim 2 of C_rf (18 x 13 x 2 x 97) to a
# stride of 2^30 + 1: the strides above it pass 2^31 - 1 and TVM's int32 wraps them negative, and
# the size too. TVM: "Literal value -27917287398 exceeds range of int32".
WRAPPED_STRIDES = NestSpec(kind='dense', spatial=(('i', 13), ('j', 2), ('i_j', 97)), reduce=(('in', 18),), reducer='sum', dtype='int32', main='C', producer='B_local', consumer=None, pad=0, epilogue=('T_add', 'T_relu'))
# `unroll q` (1024) under the guard of `split p by 3` (p of 7), the same `if` in every copy:
# LLVM built it for 36 s alone (past the fuzzer's 120 s cap on the loaded machine).
GUARDED_UNROLL = NestSpec(kind='matmul', spatial=(('at', 7), ('by', 9)), reduce=(('k', 1024),), reducer='sum', dtype='int32', main='out', producer='B_local', consumer=None, pad=0, epilogue=())

FINDINGS = [
    (Case(text='block C:\n  storage_align C dim 2 factor 1073741824 offset 1\n  rfactor in\n', gpu=False, nest=WRAPPED_STRIDES), '`C_rf` as TVM lays it out (18 x 13 x 2 x 97, strides 27917287450, 2147483650, 1073741825, 1) needs 502511174100 elements'),
    (Case(text='block B_local:\n  unroll q\n  split p by 3\nblock out:\n  rfactor k\n', gpu=False, nest=GUARDED_UNROLL), 'unrolling `q` makes 1024 copies of the loop body, weighing 4096, more than the 2048'),
]
# fmt: on
