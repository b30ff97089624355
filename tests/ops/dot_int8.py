"""C[i, j] = sum_k A[i, k] * B[j, k] in int8, accumulated in int32: an int8 GEMM with both operands
k-contiguous, the shape LLVM's loop vectorizer turns into Arm's `sdot` on a part with +dotprod."""

import numpy as np
from tvm import te

import schedlang


def reference(A, B):
    return A.astype(np.int32) @ B.astype(np.int32).T


@schedlang.op(reference=reference)
def dot_int8(M: int = 16, N: int = 16, K: int = 64):
    A = te.placeholder((M, K), "int8", name="A")
    B = te.placeholder((N, K), "int8", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute(
        (M, N),
        lambda i, j: te.sum(A[i, k].astype("int32") * B[j, k].astype("int32"), axis=k),
        name="C",
    )
    return te.create_prim_func([A, B, C])
