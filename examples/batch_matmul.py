"""C[b, i, j] = sum_k A[b, i, k] * B[b, k, j]: 8 independent 256x256x256 matmuls."""

from tvm import te

import schedlang


def reference(A, B):
    return A @ B


@schedlang.op(reference=reference)
def batch_matmul(batch: int = 8, M: int = 256, N: int = 256, K: int = 256, dtype: str = "float32"):
    A = te.placeholder((batch, M, K), dtype, name="A")
    B = te.placeholder((batch, K, N), dtype, name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((batch, M, N), lambda b, i, j: te.sum(A[b, i, k] * B[b, k, j], axis=k), name="C")
    return te.create_prim_func([A, B, C])
