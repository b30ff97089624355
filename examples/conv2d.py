"""A ResNet 3x3 convolution, NCHW: out[n, k, h, w] = sum_{rc, ry, rx} pad[...] * weight[...].

Padding is its own block `pad`, so a schedule can inline it (or compute it at a tile of `conv2d`).
"""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from tvm import te

import schedlang


def reference(data, weight, *, R=3, stride=1, pad=1):
    padded = np.pad(data, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = sliding_window_view(padded, (R, R), axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("nchwyx,kcyx->nkhw", windows, weight)


@schedlang.op(reference=reference)
def conv2d(
    N: int = 1,
    C: int = 64,
    H: int = 56,
    W: int = 56,
    K: int = 64,
    R: int = 3,
    stride: int = 1,
    pad: int = 1,
    dtype: str = "float32",
):
    data = te.placeholder((N, C, H, W), dtype, name="data")
    weight = te.placeholder((K, C, R, R), dtype, name="weight")
    out_h = (H + 2 * pad - R) // stride + 1
    out_w = (W + 2 * pad - R) // stride + 1
    padded = te.compute(
        (N, C, H + 2 * pad, W + 2 * pad),
        lambda n, c, h, w: te.if_then_else(
            te.all(h >= pad, h < H + pad, w >= pad, w < W + pad),
            data[n, c, h - pad, w - pad],
            te.const(0, dtype),
        ),
        name="pad",
    )
    rc = te.reduce_axis((0, C), name="rc")
    ry = te.reduce_axis((0, R), name="ry")
    rx = te.reduce_axis((0, R), name="rx")
    out = te.compute(
        (N, K, out_h, out_w),
        lambda n, k, h, w: te.sum(
            padded[n, rc, h * stride + ry, w * stride + rx] * weight[k, rc, ry, rx],
            axis=[rc, ry, rx],
        ),
        name="conv2d",
    )
    return te.create_prim_func([data, weight, out])
