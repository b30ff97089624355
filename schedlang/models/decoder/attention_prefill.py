"""Causal prefill attention as one fused TIR function: flash attention's online softmax on CPU.

kernels.attention (a chain of `te` computations) materializes [heads, n, past + n] three times
(the scores, their exponentials, and the products' inputs) and computes the causal upper half
only to mask it away; at 1,024 tokens that is most of a prefill's time. This kernel reads each
key and value row once per block of query rows and never forms the [n, past + n] matrix:

    for each (q head h, block of QB query rows), in parallel:
        kv head g = h // G; running max m = -inf, running sum l = 0, acc[QB, head_dim] = 0
        for each block of KB key positions j0.., up to the causal bound of the block's last row:
            for each query row r whose bound past + r reaches the block (j0 <= past + r):
                s[c] = q[r] . k[j0 + c] * scale,  -inf where j0 + c > past + r   (the mask)
                m' = max(m, max s);  p = exp(s - m');  corr = exp(m - m')
                l = l * corr + sum p;  acc[r] = acc[r] * corr + sum_c p[c] * v[j0 + c]
                m = m'
        out[r, h] = acc[r] / l

The causal bound skips the upper half's blocks; inside the diagonal block a masked score gets
p = 0 and its value row is not read. q . k runs 4 key positions at a time in `lanes`-wide partial
sums over head_dim (4 independent vector chains), the exponentials over the key block and the
updates of acc over head_dim are vectorized, a block's max is a tree of vector maxes, and exp is
the polynomial of schedlang.lang.fastexp (LLVM would call `expf` once per score).

Layouts as kernels.attention's (schedlang.models.decoder.kernels): qkv [n, heads + 2 * kv_heads,
head_dim] (q's heads first), the cache [2, kv_heads, max_length, head_dim] (keys at 0, values
at 1) already holding the n new positions at [past, past + n), out [n, heads, head_dim]. `n`
and `past` are symbolic.

The function comes scheduled (`tirx.is_scheduled`): the tuner leaves it out and the build says
"scheduled before". Its knobs (`rows`, the query block QB; `keys`, the key block KB) are chosen
where the network is built (network.Attention), measured in docs/llm-tuning.md.
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.script import tirx as T

from schedlang.lang.fastexp import rewrite

_NEG_INF = -3.4028234663852886e38  # float32's lowest: exp(x - max) of a masked score is 0
_KEYS_AT_ONCE = 4  # key positions whose q . k run side by side: independent FMA chains

KEY_BLOCK = 32  # key positions per online-softmax step (KB), at most


def lanes_of(head_dim: int, widest: int = 16) -> int:
    """The partial sums' width: the widest power of two up to `widest` that divides head_dim."""
    lanes = widest
    while head_dim % lanes:
        lanes //= 2
    return lanes


def key_block(max_length: int, wanted: int = KEY_BLOCK) -> int:
    """A key block that divides the cache's length (so a block never reads past the cache) and
    is a multiple of the positions computed at once, at most `wanted`; 0 when none is."""
    for size in range(wanted - wanted % _KEYS_AT_ONCE, 0, -_KEYS_AT_ONCE):
        if max_length % size == 0:
            return size
    return 0


def attention_prefill(
    num_heads: int, kv_heads: int, max_length: int, head_dim: int, *, rows: int = 16, keys: int = 32
) -> tirx.PrimFunc:
    """The fused causal attention of qkv's q heads over the cache, output [n, heads, head_dim]
    as kernels.attention's; `rows` query rows per task (QB), `keys` key positions per step
    (KB, taken down to a divisor of max_length that is a multiple of 4; max_length must have
    one)."""
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} heads are not a multiple of {kv_heads} kv heads")
    keys = key_block(max_length, keys)
    if keys == 0 or rows < 1:
        raise ValueError(f"no key block divides a cache of {max_length} positions")
    func = _fused(num_heads, kv_heads, max_length, head_dim, rows, keys)
    return func.with_body(rewrite(func.body))


def _dot_block(head_dim: int, keys: int):  # a TVMScript macro
    """score[c] = q[row, h] . k[g, j0 + c] for a block's `keys` positions, 4 at a time, each in
    lanes_of(head_dim) partial sums over head_dim, then the lanes summed as a tree."""
    lanes = lanes_of(head_dim)
    lane, at_once = T.int64(lanes), T.int64(_KEYS_AT_ONCE)
    chunks, quads = T.int64(head_dim // lanes), T.int64(keys // _KEYS_AT_ONCE)

    @T.macro
    def dot_block(qkv, cache, part, score, row, h, g, j0):
        for quad in range(quads):
            for c, ln in T.grid(at_once, lane):
                part[c, ln] = T.float32(0)
            for chunk, c in T.grid(chunks, at_once):
                # (A `T.let` of the operands here is miscompiled by the vectorizer.)
                for ln in T.vectorized(lane):
                    part[c, ln] = (
                        part[c, ln]
                        + qkv[row, h, chunk * lane + ln]
                        * cache[0, g, j0 + quad * at_once + c, chunk * lane + ln]
                    )
            for c in T.unroll(at_once):
                if lanes >= 16:
                    for ln in T.vectorized(8):
                        part[c, ln] = part[c, ln] + part[c, ln + 8]
                if lanes >= 8:
                    for ln in T.vectorized(4):
                        part[c, ln] = part[c, ln] + part[c, ln + 4]
                if lanes >= 4:
                    for ln in T.vectorized(2):
                        part[c, ln] = part[c, ln] + part[c, ln + 2]
                if lanes >= 2:
                    part[c, 0] = part[c, 0] + part[c, 1]
                score[quad * at_once + c] = part[c, 0]

    return dot_block


def _block_max(keys: int):  # a TVMScript macro
    """step[0] = max(start, score's `keys` values): a tree of vector maxes where `keys` is a
    power of two up to 32 (a serial chain of maxes took a sixth of the kernel's time)."""
    kb = T.int64(keys)
    tree = keys in (4, 8, 16, 32)

    @T.macro
    def block_max(score, high, step, start):
        if tree:
            for c in T.vectorized(kb):
                high[c] = score[c]
            if keys >= 32:
                for c in T.vectorized(16):
                    high[c] = T.max(high[c], high[c + 16])
            if keys >= 16:
                for c in T.vectorized(8):
                    high[c] = T.max(high[c], high[c + 8])
            if keys >= 8:
                for c in T.vectorized(4):
                    high[c] = T.max(high[c], high[c + 4])
            for c in T.vectorized(2):
                high[c] = T.max(high[c], high[c + 2])
            step[0] = T.max(start, T.max(high[0], high[1]))
        else:
            step[0] = start
            for c in range(kb):
                step[0] = T.max(step[0], score[c])

    return block_max


def _online_step(head_dim: int, keys: int):  # a TVMScript macro
    """Row r's running max, sum and acc moved on by a key block of which it sees positions
    j0 + c < seen (the others masked: p = 0, their value rows not read)."""
    kb, dim = T.int64(keys), T.int64(head_dim)
    scale, lowest = T.float32(1.0 / math.sqrt(head_dim)), T.float32(_NEG_INF)
    block_max = _block_max(keys)

    @T.macro
    def online_step(cache, acc, top, total, score, high, step, r, seen, g, j0):
        for c in T.vectorized(kb):
            score[c] = T.Select(j0 + c < seen, score[c] * scale, lowest)
        block_max(score, high, step, top[r])
        step[1] = T.exp(top[r] - step[0])  # the correction of what was summed before
        top[r] = step[0]
        for c in T.vectorized(kb):
            score[c] = T.exp(score[c] - step[0])
        total[r] = total[r] * step[1]
        for c in range(kb):
            total[r] = total[r] + score[c]
        for d in T.vectorized(dim):
            acc[r, d] = acc[r, d] * step[1]
        for c in range(T.min(kb, seen - j0)):
            for d in T.vectorized(dim):
                acc[r, d] = acc[r, d] + score[c] * cache[1, g, j0 + c, d]

    return online_step


def _fused(
    num_heads: int, kv_heads: int, max_length: int, head_dim: int, rows: int, keys: int
) -> tirx.PrimFunc:
    group = T.int64(num_heads // kv_heads)
    heads, kvh = T.int64(num_heads), T.int64(kv_heads)
    length, dim, width = T.int64(max_length), T.int64(head_dim), T.int64(num_heads + 2 * kv_heads)
    qb, kb = T.int64(rows), T.int64(keys)
    partials = (T.int64(_KEYS_AT_ONCE), T.int64(lanes_of(head_dim)))
    lowest = T.float32(_NEG_INF)
    dot_block, online_step = _dot_block(head_dim, keys), _online_step(head_dim, keys)

    @T.prim_func(private=True, s_tir=True)
    def attention_prefill(var_qkv: T.handle, var_cache: T.handle, past: T.int64, var_out: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        n = T.int64()
        qkv = T.match_buffer(var_qkv, (n, width, dim), "float32")
        cache = T.match_buffer(var_cache, (T.int64(2), kvh, length, dim), "float32")
        out = T.match_buffer(var_out, (n, heads, dim), "float32")
        blocks = (n + qb - T.int64(1)) // qb
        for task in T.parallel(heads * blocks):
            with T.sblock("task"):
                T.reads(qkv[0:n, 0:width, 0:dim], cache[0:2, 0:kvh, 0:length, 0:dim])
                T.writes(out[0:n, 0:heads, 0:dim])
                acc = T.sblock_alloc_buffer((qb, dim), "float32")
                top = T.sblock_alloc_buffer((qb,), "float32")
                total = T.sblock_alloc_buffer((qb,), "float32")
                score = T.sblock_alloc_buffer((kb,), "float32")
                high = T.sblock_alloc_buffer((kb,), "float32")  # the block's max, as a tree
                part = T.sblock_alloc_buffer(partials, "float32")
                step = T.sblock_alloc_buffer((2,), "float32")  # the block's max, its correction
                h = task // blocks
                first = task % blocks * qb
                for r in range(qb):
                    top[r] = lowest
                    total[r] = T.float32(0)
                    for d in T.vectorized(dim):
                        acc[r, d] = T.float32(0)
                # Up to the causal bound of the block's last row: no key past it is read.
                for kblock in range((past + T.min(first + qb, n) + kb - T.int64(1)) // kb):
                    for r in range(T.min(qb, n - first)):
                        seen = past + first + r + T.int64(1)  # row r sees positions < seen
                        if kblock * kb < seen:
                            j0 = kblock * kb
                            dot_block(qkv, cache, part, score, first + r, h, h // group, j0)
                            online_step(
                                cache, acc, top, total, score, high, step, r, seen, h // group, j0
                            )
                for r in range(T.min(qb, n - first)):
                    for d in T.vectorized(dim):
                        out[first + r, h, d] = acc[r, d] / total[r]

    return attention_prefill
