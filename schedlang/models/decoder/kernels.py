"""The decoder's own kernels, as `te` computations (and one TIR function that writes the cache in
place): each becomes one PrimFunc of the built module, with the token count `n` and the cached
length `past` symbolic, so a tuner can give each a schedule like any other function.

Layouts, as the network (schedlang.models.decoder.network) passes them:

    hidden      [n, hidden]                      n tokens of this call
    weight      [out / P, in, P]                 column panels (weights.as_panels): P outputs
                                                 side by side for each input, so a decode
                                                 step's GEMV and a prefill's GEMM both stream
                                                 it contiguously (P = 32 where it divides)
    qkv         [n, heads + 2 * kv_heads, head_dim]   q's heads, then k's, then v's
    cache       [2, kv_heads, max_length, head_dim]   one per layer: keys (0), values (1),
                                                 positions contiguous, as attention reads them

Positions: token i of a call sits at position past + i; attention over positions [0, past + n)
with the causal mask (position j is seen by token i when j <= past + i).
"""

from __future__ import annotations

import math

from tvm import te, tirx
from tvm.script import tirx as T

_NEG_INF = -3.4028234663852886e38  # float32's lowest: exp(x - max) of a masked score is 0


def embed(table: te.Tensor, ids: te.Tensor) -> te.Tensor:
    """The rows of table [vocab, hidden] (or its panels [vocab / P, hidden, P], where the LM
    head shares it) the token ids [n] name: [n, hidden]. The ids are checked before the call
    (session.Decoder), so the gather reads no row out of range."""
    (rows,) = ids.shape
    if len(table.shape) == 2:
        return te.compute((rows, table.shape[1]), lambda i, c: table[ids[i], c], name="embedded")
    width = table.shape[2]
    return te.compute(
        (rows, table.shape[1]),
        lambda i, c: table[tirx.floordiv(ids[i], width), c, tirx.floormod(ids[i], width)],
        name="embedded",
    )


def linear(x: te.Tensor, weight: te.Tensor, bias: te.Tensor | None = None) -> te.Tensor:
    """x [n, in] times the matrix [out, in] stored as panels, weight [out / P, in, P],
    transposed (+ bias [out]): [n, out]."""
    rows, width = x.shape
    panels, _, panel = weight.shape
    outputs = panels * panel
    k = te.reduce_axis((0, width), name="k")
    product = te.compute(
        (rows, outputs),
        lambda i, j: te.sum(x[i, k] * weight[j // panel, k, j % panel], axis=k),
        name="matmul",
    )
    if bias is None:
        return product
    return te.compute((rows, outputs), lambda i, j: product[i, j] + bias[j], name="add_bias")


def rotary(qkv: te.Tensor, past: tirx.Var, rotated_heads: int, theta: float) -> te.Tensor:
    """Rotary embeddings on the first `rotated_heads` heads of qkv [n, heads, head_dim] (q's and
    k's; v's pass as they are), token i at position past + i, with transformers' pairing: the
    first half of a head with its second half, frequency theta^(-2f/head_dim). The cosines and
    sines are computed once per (token, frequency), tables [n, head_dim / 2] that every head
    reads (per element, their pow, cos and sin took more than the q/k/v projection)."""
    rows, heads, head_dim = qkv.shape
    half = int(head_dim) // 2

    def angle(i, f):
        inv_freq = tirx.const(1.0, "float32") / tirx.power(
            tirx.const(theta, "float32"),
            f.astype("float32") * tirx.const(2.0 / int(head_dim), "float32"),
        )
        return (past + i).astype("float32") * inv_freq

    cos = te.compute((rows, half), lambda i, j: tirx.cos(angle(i, j)), name="rotary_cos")
    sin = te.compute((rows, half), lambda i, j: tirx.sin(angle(i, j)), name="rotary_sin")

    def rotate(i, h, d):
        f = tirx.floormod(d, half)
        partner = tirx.if_then_else(d < half, -qkv[i, h, d + half], qkv[i, h, d - half])
        rotated = qkv[i, h, d] * cos[i, f] + partner * sin[i, f]
        return tirx.if_then_else(h < rotated_heads, rotated, qkv[i, h, d])

    return te.compute((rows, heads, head_dim), rotate, name="rotary")


def attention(qkv: te.Tensor, cache: te.Tensor, past: tirx.Var, num_heads: int) -> te.Tensor:
    """Causal attention of qkv's q heads over the cache's first past + n positions, grouped:
    q head h reads kv head h // (num_heads / kv_heads). [n, num_heads, head_dim]."""
    rows, _, head_dim = qkv.shape
    kv_heads = cache.shape[1]
    group = num_heads // int(kv_heads)
    total = past + rows
    scale = tirx.const(1.0 / math.sqrt(int(head_dim)), "float32")
    d = te.reduce_axis((0, head_dim), name="d")
    dot = te.compute(
        (num_heads, rows, total),
        lambda h, i, j: te.sum(qkv[i, h, d] * cache[0, h // group, j, d], axis=d),
        name="dot",
    )
    scores = te.compute(
        (num_heads, rows, total),
        lambda h, i, j: tirx.if_then_else(
            j <= past + i, dot[h, i, j] * scale, tirx.const(_NEG_INF, "float32")
        ),
        name="scores",
    )
    j = te.reduce_axis((0, total), name="j")
    top = te.compute((num_heads, rows), lambda h, i: te.max(scores[h, i, j], axis=j), name="top")
    weights = te.compute(
        (num_heads, rows, total), lambda h, i, t: tirx.exp(scores[h, i, t] - top[h, i]), name="exp"
    )
    j2 = te.reduce_axis((0, total), name="j")
    norm = te.compute(
        (num_heads, rows), lambda h, i: te.sum(weights[h, i, j2], axis=j2), name="sum"
    )
    j3 = te.reduce_axis((0, total), name="j")
    weighted = te.compute(
        (rows, num_heads, head_dim),
        lambda i, h, e: te.sum(weights[h, i, j3] * cache[1, h // group, j3, e], axis=j3),
        name="weighted",
    )
    return te.compute(
        (rows, num_heads, head_dim),
        lambda i, h, e: weighted[i, h, e] / norm[h, i],
        name="attention",
    )


def swiglu(gate_up: te.Tensor) -> te.Tensor:
    """silu(gate) * up, of gate_up [n, 2 * intermediate] (gate's columns first)."""
    rows, width = gate_up.shape
    half = int(width) // 2

    def value(i, c):
        gate = gate_up[i, c]
        return gate / (tirx.const(1.0, "float32") + tirx.exp(-gate)) * gate_up[i, c + half]

    return te.compute((rows, half), value, name="swiglu")


def last_row(x: te.Tensor) -> te.Tensor:
    """x [n, hidden]'s last row, [1, hidden]: the only token whose logits a call returns."""
    rows, width = x.shape
    return te.compute((1, width), lambda _, c: x[rows - 1, c], name="last_row")


def cache_append(num_heads: int, kv_heads: int, max_length: int, head_dim: int) -> tirx.PrimFunc:
    """cache[c, g, past + i, :] = qkv[i, num_heads + c * kv_heads + g, :] for the n tokens of a
    call: k's (c = 0) and v's (c = 1) heads written into the cache in place."""
    kvh, length, dim = T.int64(kv_heads), T.int64(max_length), T.int64(head_dim)
    rows, first_k = T.int64(num_heads + 2 * kv_heads), T.int64(num_heads)

    @T.prim_func(private=True, s_tir=True)
    def append(var_cache: T.handle, var_qkv: T.handle, past: T.int64):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        cache = T.match_buffer(var_cache, (T.int64(2), kvh, length, dim), "float32")
        qkv = T.match_buffer(var_qkv, (n, rows, dim), "float32")
        for c, g, i, d in T.grid(T.int64(2), kvh, n, dim):
            with T.sblock("append"):
                vc, vg, vi, vd = T.axis.remap("SSSS", [c, g, i, d])
                cache[vc, vg, past + vi, vd] = qkv[vi, first_k + vc * kvh + vg, vd]

    return append
