"""TVM's own `tensorize` of an int8 GEMM C[i, j] += A[i, k] * B[j, k] on B as it is (unpacked):
what the checker refuses, built straight through `tvm.s_tir` to show what TVM makes of it."""

from __future__ import annotations

from tvm import s_tir, tirx


def tensorized_by_tvm(func: tirx.PrimFunc, lanes: int, intrinsic: str) -> tirx.PrimFunc:
    """`func` with j split by `lanes` and k by 4, reordered (i, j.o, k.o, j.i, k.i), the reduction
    decomposed, and `intrinsic` tensorized at j.i: TVM accepts it whatever B's layout."""
    from schedlang.lang.statements.tensorize import intrinsics

    intrinsics()
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    j_o, j_i = sch.split(j, [None, lanes])
    k_o, k_i = sch.split(k, [None, 4])
    sch.reorder(i, j_o, k_o, j_i, k_i)
    sch.decompose_reduction(block, k_o)
    sch.tensorize(j_i, intrinsic)
    return sch.mod["main"]
