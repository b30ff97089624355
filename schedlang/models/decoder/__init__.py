"""Decoder-only LLMs (the Qwen2 and Llama families) built by schedlang: a prefill of any prompt
length and a one-token decode sharing a KV cache that lives across calls.

    from schedlang.models import decoder
    model = decoder.load("checkpoint/", max_length=512)   # or a transformers model object
    result = model.generate([1, 2, 3], new_tokens=16)
    result.tokens, result.prefill_tokens_per_s, result.decode_tokens_per_s

Modules, in the order a load runs them: config (what a transformers config says, checked),
weights (read once, laid out for the kernels), network and kernels (the decoder in
`tvm.relax.frontend.nn`, its own TE kernels), build (the Relax pipeline, with a pass slot for
schedules), session (the built decoder, its weights and cache, greedy generation).
"""

from __future__ import annotations

from typing import Any

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.target import Target, as_target
from schedlang.models.decoder.config import ARCHITECTURES, DecoderConfig
from schedlang.models.decoder.session import Decoder, Generation

__all__ = ["ARCHITECTURES", "Decoder", "DecoderConfig", "Generation", "load"]

DEFAULT_MAX_LENGTH = 2048


def load(
    source: Any,
    max_length: int | None = None,
    target: Target | str = "llvm",
    schedule: Any = None,
) -> Decoder:
    """Build the decoder of `source` (a transformers causal LM, a (config, state_dict) pair, or a
    checkpoint folder) for `target` with a cache of `max_length` tokens (default: the model's
    maximum position, at most 2,048), its weights loaded. `schedule` is a pass over the
    PrimFuncs (schedlang.models.graph.ApplySchedlangDatabase); without one the kernels are
    built as TVM builds them unscheduled (build.py says why not dlight's)."""
    from schedlang.models.decoder.build import compile_decoder, export
    from schedlang.models.decoder.weights import check, laid_out, read_source

    config, tensors = read_source(source)
    if max_length is None:
        max_length = min(config.max_position_embeddings, DEFAULT_MAX_LENGTH)
    check_length("max_length", max_length)
    check(config, tensors)
    target = as_target(target)
    mod, names = export(config, max_length)
    executable = compile_decoder(mod, target, schedule)
    return Decoder(executable, config, laid_out(config, tensors), names, max_length, target)


def check_length(what: str, value: Any) -> int:
    """`value` as a positive integer, or one error line naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchedlangError(f"{what} must be a positive integer, got {value!r}")
    return value


def generate_random_prompt(
    source: Any,
    prompt_tokens: int,
    new_tokens: int,
    *,
    max_length: int | None = None,
    seed: int = 0,
    target: Target | str = "llvm",
    schedule: Any = None,
) -> tuple[Decoder, Generation]:
    """What `schedlang generate` runs: the decoder of `source` built with a cache just long
    enough (or `max_length`), then greedy decoding of `new_tokens` tokens after a prompt of
    `prompt_tokens` token ids drawn with `seed` (a model with random weights has no text).
    `schedule`: as `load`'s (`generate --db`: ApplySchedlangDatabase); with one, the cache's
    length defaults to the model's maximum, as `tune_decoder`'s does, so the records apply."""
    import numpy as np

    check_length("prompt tokens", prompt_tokens)
    check_length("new tokens", new_tokens)
    if max_length is None and schedule is None:
        max_length = prompt_tokens + new_tokens
    if max_length is not None:  # else the model's maximum: what tune-model tuned (records' keys)
        check_length("max_length", max_length)
        _check_prompt(prompt_tokens, max_length)
    model = load(source, max_length, target, schedule)
    _check_prompt(prompt_tokens, model.max_length)
    prompt = np.random.default_rng(seed).integers(0, model.config.vocab_size, prompt_tokens)
    return model, model.generate(prompt.tolist(), new_tokens)


def _check_prompt(prompt_tokens: int, max_length: int) -> None:
    if prompt_tokens > max_length:
        raise SchedlangError(
            f"a prompt of {prompt_tokens} tokens is longer than the maximum length {max_length}"
        )
