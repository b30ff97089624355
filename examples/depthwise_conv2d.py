"""A depthwise 3x3 convolution, NCHW: each channel c is convolved with its own 3x3 filter."""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from tvm import te

import schedlang


def reference(data, weight, *, R=3, stride=1, pad=1):
    padded = np.pad(data, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = sliding_window_view(padded, (R, R), axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("nchwyx,cyx->nchw", windows, weight)


@schedlang.op(reference=reference)
def depthwise_conv2d(
    N: int = 1,
    C: int = 128,
    H: int = 56,
    W: int = 56,
    R: int = 3,
    stride: int = 1,
    pad: int = 1,
    dtype: str = "float32",
):
    data = te.placeholder((N, C, H, W), dtype, name="data")
    weight = te.placeholder((C, R, R), dtype, name="weight")
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
    ry = te.reduce_axis((0, R), name="ry")
    rx = te.reduce_axis((0, R), name="rx")
    out = te.compute(
        (N, C, out_h, out_w),
        lambda n, c, h, w: te.sum(
            padded[n, c, h * stride + ry, w * stride + rx] * weight[c, ry, rx], axis=[ry, rx]
        ),
        name="depthwise_conv2d",
    )
    return te.create_prim_func([data, weight, out])
