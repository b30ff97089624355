"""E = max(A @ B + bias, 0) at 256 x 512 . 512 x 384: the dense layer of issue 33, whose
`storage_align` on the accumulator followed by `rfactor` checked clean and crashed."""

from tvm import te

import schedlang


def reference(A, B, bias):
    return (A @ B + bias).clip(min=0)


@schedlang.op(reference=reference)
def dense_relu_rf(M: int = 256, N: int = 384, K: int = 512, dtype: str = "float32"):
    A = te.placeholder((M, K), dtype, name="A")
    B = te.placeholder((K, N), dtype, name="B")
    bias = te.placeholder((N,), dtype, name="bias")
    k = te.reduce_axis((0, K), name="k")
    D = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="D")
    E = te.compute((M, N), lambda i, j: te.max(D[i, j] + bias[j], te.const(0, dtype)), name="E")
    return te.create_prim_func([A, B, bias, E])
