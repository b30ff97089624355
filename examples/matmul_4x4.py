"""A 4x4x4 matmul: small enough to read every loop of its schedule."""

from tvm import te

import schedlang


def reference(A, B):
    return A @ B


@schedlang.op(reference=reference)
def matmul_4x4(M: int = 4, N: int = 4, K: int = 4, dtype: str = "float32"):
    A = te.placeholder((M, K), dtype, name="A")
    B = te.placeholder((K, N), dtype, name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return te.create_prim_func([A, B, C])
