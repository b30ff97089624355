"""Y[a, c] = sum_b X[a, b, c] at 256 x 512 x 256: the middle-axis sum of issue 33, whose unroll
of a fused rfactor loop checked clean and kept LLVM busy past the fuzzer's cap."""

from tvm import te

import schedlang


def reference(X):
    return X.sum(axis=1)


@schedlang.op(reference=reference)
def sum_middle(A: int = 256, B: int = 512, C: int = 256, dtype: str = "float32"):
    X = te.placeholder((A, B, C), dtype, name="X")
    b = te.reduce_axis((0, B), name="b")
    Y = te.compute((A, C), lambda a, c: te.sum(X[a, b, c], axis=b), name="Y")
    return te.create_prim_func([X, Y])
