"""Y[i, j] = sum_k X[i, k, j]: a reduction over the middle axis of a 3-D tensor (issue 15)."""

from tvm import te

import schedlang


def reference(X):
    return X.sum(axis=1)


@schedlang.op(reference=reference)
def sum_axis1(A: int = 256, R: int = 512, B: int = 256, dtype: str = "float32"):
    X = te.placeholder((A, R, B), dtype, name="X")
    k = te.reduce_axis((0, R), name="k")
    Y = te.compute((A, B), lambda i, j: te.sum(X[i, k, j], axis=k), name="Y")
    return te.create_prim_func([X, Y])
