"""What schedlang reads from a transformers config: the shapes of a decoder and the variants of
its architecture it builds, each checked with one error line naming what is not supported.

    config = DecoderConfig.from_hf(hf_config_dict, architecture="Qwen2ForCausalLM")

Both families share one structure (RMSNorm before attention and before the MLP, rotary
embeddings on q and k, grouped-query attention, a SwiGLU MLP); they differ in their biases:
Qwen2 has biases on q, k and v, Llama on q, k, v and o where `attention_bias` says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schedlang.core.diagnostics import SchedlangError

ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")
_BY_MODEL_TYPE = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


@dataclass(frozen=True)
class DecoderConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool
    o_bias: bool
    tie_word_embeddings: bool
    max_position_embeddings: int

    @property
    def qkv_heads(self) -> int:
        """Rows of the fused q/k/v projection, in heads: q's, then k's, then v's."""
        return self.num_heads + 2 * self.num_kv_heads

    @staticmethod
    def from_hf(config: Mapping[str, Any], architecture: str | None = None) -> DecoderConfig:
        """The decoder a transformers config (its `to_dict()`, or config.json) describes."""
        architecture = architecture or _architecture_of(config)
        if architecture not in ARCHITECTURES:
            raise SchedlangError(
                f"unsupported architecture {architecture}: schedlang builds "
                f"{', '.join(ARCHITECTURES)}"
            )
        where = f"{architecture} config"
        hidden = _positive(config, "hidden_size", where)
        heads = _positive(config, "num_attention_heads", where)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        if kv_heads < 1 or heads % kv_heads:
            raise SchedlangError(
                f"{where}: {heads} attention heads do not share {kv_heads} key/value heads evenly"
            )
        if head_dim % 2:
            raise SchedlangError(f"{where}: head_dim {head_dim} is odd: rotary embeddings pair it")
        _check_supported(config, architecture, where)
        llama = architecture == "LlamaForCausalLM"
        return DecoderConfig(
            architecture=architecture,
            vocab_size=_positive(config, "vocab_size", where),
            hidden_size=hidden,
            intermediate_size=_positive(config, "intermediate_size", where),
            num_layers=_positive(config, "num_hidden_layers", where),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(config),
            qkv_bias=bool(config.get("attention_bias", False)) if llama else True,
            o_bias=bool(config.get("attention_bias", False)) if llama else False,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config.get("max_position_embeddings") or 2048),
        )


def _architecture_of(config: Mapping[str, Any]) -> str:
    listed = config.get("architectures") or []
    if listed:
        return str(listed[0])
    model_type = str(config.get("model_type", "unknown"))
    return _BY_MODEL_TYPE.get(model_type, f"of model type `{model_type}`")


def _positive(config: Mapping[str, Any], key: str, where: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchedlangError(f"{where}: `{key}` must be a positive integer, got {value!r}")
    return value


def _rope_scaling(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """transformers 5 writes `rope_parameters`, 4.x `rope_theta` and `rope_scaling`."""
    return config.get("rope_parameters") or config.get("rope_scaling") or {}


def _rope_theta(config: Mapping[str, Any]) -> float:
    theta = _rope_scaling(config).get("rope_theta", config.get("rope_theta", 10000.0))
    if not isinstance(theta, int | float) or not math.isfinite(theta) or theta <= 0:
        raise SchedlangError(f"rope_theta must be a positive number, got {theta!r}")
    return float(theta)


def _check_supported(config: Mapping[str, Any], architecture: str, where: str) -> None:
    scaling = _rope_scaling(config)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type != "default":
        raise SchedlangError(
            f"{where}: rope scaling `{rope_type}` is not supported: schedlang builds the "
            "default rotary embedding only"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise SchedlangError(
            f"{where}: activation `{config.get('hidden_act')}` is not supported: schedlang "
            "builds SwiGLU with silu"
        )
    if config.get("mlp_bias", False):
        raise SchedlangError(f"{where}: MLP biases (`mlp_bias`) are not supported")
    if config.get("use_sliding_window", False):
        raise SchedlangError(f"{where}: sliding-window attention is not supported")
