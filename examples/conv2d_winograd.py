"""A 3x3 convolution (padding 1, stride 1, batch 1) computed with Winograd F(4x4, 3x3): the
function schedlang.models.winograd writes for a model's 3x3 convolution, as an op.

It takes the input X [N, CI, H, W] (NCHW) and the transformed weight U [6, 6, CI, CO]
(`schedlang.models.winograd.transformed_weight` of an OIHW weight: done once, ahead of time, as a
model's build does it) and computes out [N, CO, H, W] in six blocks (winograd_pad, the input
transform's two steps, the 36 matmuls winograd_gemm, the inverse transform's two steps). The
built-in proposer's `winograd` template schedules it. The reference is the same algorithm in
numpy, so it holds for any U, not only for a transformed 3x3 weight.
"""

import numpy as np

import schedlang
from schedlang.models.winograd import TILE, conv_function, transform_matrices


def reference(data, u):
    a, b, _ = transform_matrices(TILE)
    n, _, h, w = data.shape
    rows, cols = -(-h // TILE), -(-w // TILE)
    alpha = TILE + 2
    padded = np.zeros((n, data.shape[1], rows * TILE + 2, cols * TILE + 2), "float64")
    padded[:, :, 1 : h + 1, 1 : w + 1] = data
    # tiles[n, c, r, q, 6, 6]: the input tile of each 4x4 output tile
    tiles = np.stack(
        [
            np.stack([padded[:, :, r * TILE : r * TILE + alpha, q * TILE : q * TILE + alpha]
                      for q in range(cols)], axis=2)
            for r in range(rows)
        ],
        axis=2,
    )  # fmt: skip
    v = np.einsum("ie,ncrqij,jf->efncrq", b, tiles, b)
    m = np.einsum("efncrq,efco->efnorq", v, u.astype("float64"))
    y = np.einsum("ei,efnorq,fj->norqij", a, m, a)
    out = y.transpose(0, 1, 2, 4, 3, 5).reshape(n, u.shape[3], rows * TILE, cols * TILE)
    return out[:, :, :h, :w]


@schedlang.op(reference=reference)
def conv2d_winograd(N: int = 1, C: int = 64, H: int = 56, W: int = 56, K: int = 64):
    return conv_function(N, C, K, H, W)
