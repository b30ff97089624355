"""Layer normalization over the last axis, in three blocks: mean, var, normalize."""

import numpy as np
from tvm import te

import schedlang

EPSILON = 1e-5


def reference(x, gamma, beta):
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPSILON) * gamma + beta


@schedlang.op(reference=reference)
def layernorm(rows: int = 1024, cols: int = 768):
    x = te.placeholder((rows, cols), "float32", name="x")
    gamma = te.placeholder((cols,), "float32", name="gamma")
    beta = te.placeholder((cols,), "float32", name="beta")
    j = te.reduce_axis((0, cols), name="j")
    mean = te.compute((rows,), lambda i: te.sum(x[i, j] / cols, axis=j), name="mean")
    j = te.reduce_axis((0, cols), name="j")
    var = te.compute(
        (rows,),
        lambda i: te.sum((x[i, j] - mean[i]) * (x[i, j] - mean[i]) / cols, axis=j),
        name="var",
    )
    out = te.compute(
        (rows, cols),
        lambda i, j: (x[i, j] - mean[i]) * te.rsqrt(var[i] + EPSILON) * gamma[j] + beta[j],
        name="normalize",
    )
    return te.create_prim_func([x, gamma, beta, out])
