"""The fused causal prefill attention (schedlang/models/decoder/attention_prefill.py) against
numpy's softmax attention: grouped heads, a cached prefix, tails of both blocks, and a cache
whose positions past the call's are NaN (a kernel that read them would give NaN)."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import tvm

from schedlang.models.decoder.attention_prefill import attention_prefill, key_block, lanes_of


@cache
def _built(heads: int, kv_heads: int, max_length: int, head_dim: int, rows: int):
    func = attention_prefill(heads, kv_heads, max_length, head_dim, rows=rows)
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")


def _reference(qkv, cache_, heads, kv_heads, past):
    rows, _, head_dim = qkv.shape
    group, total = heads // kv_heads, past + rows
    out = np.zeros((rows, heads, head_dim), "float64")
    hidden = np.arange(total)[None, :] > (past + np.arange(rows))[:, None]
    for h in range(heads):
        keys, values = cache_[0, h // group, :total], cache_[1, h // group, :total]
        scores = qkv[:, h].astype("float64") @ keys.T / np.sqrt(head_dim)
        scores[hidden] = -np.inf
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, h] = weights / weights.sum(axis=1, keepdims=True) @ values
    return out


@pytest.mark.parametrize(
    ("heads", "kv_heads", "max_length", "head_dim", "rows", "past", "rows_per_task"),
    [
        (12, 2, 64, 128, 13, 5, 16),  # the 1.5B config's heads, one partial query block
        (12, 2, 64, 128, 13, 5, 4),  # several query blocks, the last a tail of 1
        (4, 2, 48, 16, 30, 0, 8),  # the tiny config's: key blocks of 24, lanes of 16
        (6, 3, 40, 12, 1, 17, 16),  # one token (decode's shape) and head_dim of 4-lane chunks
        (2, 1, 8, 8, 5, 2, 4),  # key blocks of 8 (their max a tree), lanes of 8
        (4, 2, 4, 4, 3, 1, 2),  # key blocks of 4, lanes of 4
        (12, 2, 2048, 128, 77, 300, 16),  # key blocks of 32, past and n off every block
    ],
)
def test_the_kernel_gives_softmax_attention(
    heads, kv_heads, max_length, head_dim, rows, past, rows_per_task
):
    rng = np.random.default_rng(heads + rows + past)
    qkv = rng.standard_normal((rows, heads + 2 * kv_heads, head_dim)).astype("float32")
    cache_ = np.full((2, kv_heads, max_length, head_dim), np.nan, "float32")
    cache_[:, :, : past + rows] = rng.standard_normal((2, kv_heads, past + rows, head_dim))
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((rows, heads, head_dim), "float32"), dev)
    args = [tvm.runtime.tensor(qkv, dev), tvm.runtime.tensor(cache_, dev)]
    _built(heads, kv_heads, max_length, head_dim, rows_per_task)(*args, past, out)
    expected = _reference(qkv, cache_, heads, kv_heads, past)
    np.testing.assert_allclose(out.numpy(), expected, atol=2e-6, rtol=1e-5)


def test_it_comes_scheduled_with_n_and_past_symbolic():
    func = attention_prefill(12, 2, 2048, 128)
    assert func.attrs["tirx.is_scheduled"]
    assert [p.name for p in func.params] == ["qkv", "cache", "past", "out"]
    text = func.script()
    assert "qkv: T.Buffer((n, T.int64(16), T.int64(128))" in text and "past: T.int64" in text


def test_blocks_and_lanes_fit_the_shapes():
    assert key_block(2048) == 32 and key_block(48) == 24 and key_block(40) == 20
    assert key_block(10) == 0  # no multiple of 4 divides it: the network keeps kernels.attention
    assert lanes_of(128) == 16 and lanes_of(12) == 4 and lanes_of(7) == 1
    with pytest.raises(ValueError, match="no key block"):
        attention_prefill(4, 2, 10, 16)
    with pytest.raises(ValueError, match="not a multiple"):
        attention_prefill(5, 2, 16, 16)


def test_a_cache_no_key_block_divides_keeps_kernels_attention_in_prefill():
    from schedlang.models.decoder.build import export, kernels
    from schedlang.models.decoder.config import DecoderConfig

    config = DecoderConfig(
        architecture="Qwen2ForCausalLM", vocab_size=64, hidden_size=32, intermediate_size=48,
        num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6,
        rope_theta=1e6, qkv_bias=True, o_bias=False, tie_word_embeddings=True,
        max_position_embeddings=64,
    )  # fmt: skip
    names = {max_length: {k.name for k in kernels(export(config, max_length)[0])}
             for max_length in (10, 12)}  # fmt: skip
    assert "attention_prefill" not in names[10] and "attention1" in names[10]
    assert "attention_prefill" in names[12] and "attention1" not in names[12]
