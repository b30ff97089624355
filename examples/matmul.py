"""C[i, j] = sum_k A[i, k] * B[k, j]: the square fp32 matmul every schedule is measured on."""

from tvm import te

import schedlang


def reference(A, B):
    return A @ B


@schedlang.op(reference=reference)
def matmul(M: int = 1024, N: int = 1024, K: int = 1024, dtype: str = "float32"):
    A = te.placeholder((M, K), dtype, name="A")
    B = te.placeholder((K, N), dtype, name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return te.create_prim_func([A, B, C])
