"""Row-wise softmax in four blocks: row_max, exp, row_sum, normalize."""

import numpy as np
from tvm import te

import schedlang


def reference(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@schedlang.op(reference=reference)
def softmax(rows: int = 1024, cols: int = 1024):
    x = te.placeholder((rows, cols), "float32", name="x")
    j = te.reduce_axis((0, cols), name="j")
    row_max = te.compute((rows,), lambda i: te.max(x[i, j], axis=j), name="row_max")
    exp = te.compute((rows, cols), lambda i, j: te.exp(x[i, j] - row_max[i]), name="exp")
    j = te.reduce_axis((0, cols), name="j")
    row_sum = te.compute((rows,), lambda i: te.sum(exp[i, j], axis=j), name="row_sum")
    out = te.compute((rows, cols), lambda i, j: exp[i, j] / row_sum[i], name="normalize")
    return te.create_prim_func([x, out])
