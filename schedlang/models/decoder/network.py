"""The decoder as a `tvm.relax.frontend.nn` module: two entry points that share a KV cache.

    prefill(input_ids [n], past, caches) -> logits [1, vocab]   n tokens at positions past...
    decode(input_ids [1], past, caches)  -> logits [1, vocab]   one token at position past

`n` and `past` are symbolic: one build serves every prompt length up to the cache's length.
`caches` holds one tensor per layer, [2, kv_heads, max_length, head_dim] (keys, values), made
once by the caller and written in place by each call (kernels.cache_append through
`call_tir_inplace`), so it lives across calls and is never copied. Both entry points return the
logits of the last token only: generation needs no other, and the LM head over n rows would be
the largest GEMM of a prefill.

Weights are the module's parameters (`export_tvm` makes them inputs of each function), never
constants: the built library holds no weight, the caller passes them once loaded (weights.py).
Their layouts are the kernels': q, k and v's projections fused into one [heads + 2 * kv_heads
rows of head_dim, hidden] matrix, gate and up into one, every matrix of a projection (and the LM
head) stored as column panels [out / P, in, P] (weights.as_panels), computed once at load.
"""

from __future__ import annotations

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from schedlang.models.decoder import kernels
from schedlang.models.decoder.attention_prefill import attention_prefill, key_block
from schedlang.models.decoder.config import DecoderConfig
from schedlang.models.decoder.weights import panel_shape


def _matrix(rows: int, columns: int) -> nn.Parameter:
    """A projection's [rows, columns] matrix, stored as panels (weights.as_panels)."""
    return nn.Parameter(panel_shape(rows, columns), "float32")


def _linear(x: Tensor, weight: nn.Parameter, bias: nn.Parameter | None, name: str) -> Tensor:
    args = [x, weight] if bias is None else [x, weight, bias]
    return op.tensor_expr_op(kernels.linear, name, args)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        self.config = config
        rows = config.qkv_heads * config.head_dim
        self.qkv = _matrix(rows, config.hidden_size)
        self.qkv_bias = nn.Parameter((rows,), "float32") if config.qkv_bias else None
        self.o = _matrix(config.hidden_size, config.num_heads * config.head_dim)
        self.o_bias = nn.Parameter((config.hidden_size,), "float32") if config.o_bias else None

    def forward(self, x: Tensor, past, cache: Tensor, fused: bool = False) -> Tensor:
        config = self.config
        rows = x.shape[0]
        qkv = _linear(x, self.qkv, self.qkv_bias, "qkv_proj")
        qkv = op.reshape(qkv, (rows, config.qkv_heads, config.head_dim))
        rotated_heads = config.num_heads + config.num_kv_heads
        qkv = op.tensor_expr_op(
            kernels.rotary, "rotary", [qkv, past, rotated_heads, config.rope_theta]
        )
        cache = op.tensor_ir_inplace_op(
            kernels.cache_append(
                config.num_heads, config.num_kv_heads, cache.shape[2], config.head_dim
            ),
            "cache_append",
            [cache, qkv, past],
            inplace_indices=[0],
            out=Tensor.placeholder(cache.shape, cache.dtype),
        )
        # Prefill: the fused kernel (attention_prefill.py), already scheduled; it needs a key
        # block dividing the cache's length (any multiple of 4 has one).
        if fused and key_block(int(cache.shape[2])) > 0:
            func = attention_prefill(
                config.num_heads, config.num_kv_heads, cache.shape[2], config.head_dim
            )
            shape = (rows, config.num_heads, config.head_dim)
            out = op.tensor_ir_op(
                func, "attention_prefill", [qkv, cache, past], Tensor.placeholder(shape, "float32")
            )
        else:
            out = op.tensor_expr_op(
                kernels.attention, "attention", [qkv, cache, past, config.num_heads]
            )
        out = op.reshape(out, (rows, config.num_heads * config.head_dim))
        return _linear(out, self.o, self.o_bias, "o_proj")


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        self.gate_up = _matrix(2 * config.intermediate_size, config.hidden_size)
        self.down = _matrix(config.hidden_size, config.intermediate_size)

    def forward(self, x: Tensor) -> Tensor:
        gate_up = _linear(x, self.gate_up, None, "gate_up_proj")
        hidden = op.tensor_expr_op(kernels.swiglu, "swiglu", [gate_up])
        return _linear(hidden, self.down, None, "down_proj")


class Layer(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        self.eps = config.rms_norm_eps
        self.input_norm = nn.Parameter((config.hidden_size,), "float32")
        self.attn = Attention(config)
        self.post_norm = nn.Parameter((config.hidden_size,), "float32")
        self.mlp = MLP(config)

    def forward(self, x: Tensor, past, cache: Tensor, fused: bool = False) -> Tensor:
        normed = op.rms_norm(x, self.input_norm, axes=[-1], epsilon=self.eps)
        x = x + self.attn(normed, past, cache, fused)
        return x + self.mlp(op.rms_norm(x, self.post_norm, axes=[-1], epsilon=self.eps))


class DecoderNetwork(nn.Module):
    def __init__(self, config: DecoderConfig, fused_prefill: bool = True) -> None:
        self.config = config
        self.fused_prefill = fused_prefill
        table = (config.vocab_size, config.hidden_size)
        # Tied: the table is the LM head's matrix too, so it is stored as the head's panels.
        tied = config.tie_word_embeddings
        self.embed = _matrix(*table) if tied else nn.Parameter(table, "float32")
        self.layers = nn.ModuleList([Layer(config) for _ in range(config.num_layers)])
        self.norm = nn.Parameter((config.hidden_size,), "float32")
        self.lm_head = None if tied else _matrix(*table)

    def forward(self, input_ids: Tensor, past, caches: list[Tensor], fused: bool = False) -> Tensor:
        x = op.tensor_expr_op(kernels.embed, "embed", [self.embed, input_ids])
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, past, cache, fused)
        last = op.tensor_expr_op(kernels.last_row, "last_row", [x])
        last = op.rms_norm(last, self.norm, axes=[-1], epsilon=self.config.rms_norm_eps)
        head = self.embed if self.lm_head is None else self.lm_head
        return _linear(last, head, None, "lm_head")

    def prefill(self, input_ids: Tensor, past, caches: list[Tensor]) -> Tensor:
        return self.forward(input_ids, past, caches, self.fused_prefill)

    def decode(self, input_ids: Tensor, past, caches: list[Tensor]) -> Tensor:
        return self.forward(input_ids, past, caches)

    def spec(self, max_length: int) -> dict:
        config = self.config
        cache = nn.spec.Tensor((2, config.num_kv_heads, max_length, config.head_dim), "float32")
        caches = [cache] * config.num_layers
        modes = {"param_mode": "packed", "effect_mode": "none"}
        return {
            "prefill": {
                "input_ids": nn.spec.Tensor(["n"], "int32"),
                "past": int,
                "caches": caches,
                "$": modes,
            },
            "decode": {
                "input_ids": nn.spec.Tensor([1], "int32"),
                "past": int,
                "caches": caches,
                "$": modes,
            },
        }
