"""A built decoder with its weights and its KV cache: prefill, decode, greedy generation.

    decoder = Decoder(executable, config, weights, names, max_length, target)
    logits = decoder.prefill([1, 2, 3])      # the prompt's last token's logits
    logits = decoder.decode(token)           # the next token's, the cache one longer
    result = decoder.generate(prompt, 32)    # greedy: tokens, prefill and decode tokens/s
    decoder.reset()                          # an empty cache (nothing is cleared: positions
                                             # past the length are never read)

The weights go to the device once, here; the cache (one tensor per layer) is allocated once and
written in place by every call. `length` counts the tokens it holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.target import Target, as_target
from schedlang.models.decoder.config import DecoderConfig


@dataclass(frozen=True)
class Generation:
    """What `generate` produced and how fast."""

    prompt_tokens: int
    tokens: tuple[int, ...]  # the new tokens, in order
    prefill_s: float
    decode_s: float  # every decode step together (one fewer than the new tokens)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("inf")

    @property
    def decode_tokens_per_s(self) -> float:
        steps = len(self.tokens) - 1
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else float("nan")


class Decoder:
    """A built decoder, its weights loaded and its cache allocated."""

    def __init__(
        self,
        executable: tvm.runtime.Executable,
        config: DecoderConfig,
        weights: Iterable[tuple[str, np.ndarray]],
        names: Sequence[str],
        max_length: int,
        target: Target | str = "llvm",
    ) -> None:
        from schedlang.run.measure import device_for

        self.config = config
        self.max_length = max_length
        self.device = device_for(as_target(target))
        self.vm = relax.VirtualMachine(executable, self.device)
        # Each weight to the device as it comes (weights.laid_out makes one fused copy at a time).
        on_device = {name: tvm.runtime.tensor(array, self.device) for name, array in weights}
        self.params = [on_device[name] for name in names]
        shape = (2, config.num_kv_heads, max_length, config.head_dim)
        self.caches = [
            tvm.runtime.tensor(np.zeros(shape, "float32"), self.device)
            for _ in range(config.num_layers)
        ]
        self.length = 0

    def reset(self) -> None:
        self.length = 0

    def prefill(self, input_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The logits [vocab] after the tokens `input_ids`, appended to the cache."""
        ids = self._checked(input_ids)
        return self._run("prefill", ids)

    def decode(self, token: int) -> np.ndarray:
        """The logits [vocab] after one more token."""
        return self._run("decode", self._checked([token]))

    def _run(self, function: str, ids: np.ndarray) -> np.ndarray:
        logits = self.vm[function](
            tvm.runtime.tensor(ids, self.device),
            tvm.runtime.ShapeTuple([self.length]),
            self.caches,
            self.params,
        )
        self.length += len(ids)
        return logits.numpy()[0]

    def _checked(
        self, input_ids: Sequence[int] | np.ndarray, used: int | None = None
    ) -> np.ndarray:
        ids = np.asarray(input_ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise SchedlangError("input ids must be a non-empty list of token ids (integers)")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            bad = int(ids[(ids < 0) | (ids >= self.config.vocab_size)][0])
            raise SchedlangError(
                f"token id {bad} is outside the vocabulary (0 to {self.config.vocab_size - 1})"
            )
        used = self.length if used is None else used
        if used + ids.size > self.max_length:
            raise SchedlangError(
                f"{ids.size} more tokens do not fit: the cache holds {self.max_length} "
                f"(max_length), {used} used",
                "load the model with a larger max_length, or reset() it",
            )
        return ids.astype("int32")

    def generate(
        self, prompt_ids: Sequence[int], new_tokens: int, eos_token_id: int | None = None
    ) -> Generation:
        """Greedy decoding from an empty cache: the prompt prefilled, then one token at a time,
        `new_tokens` of them (fewer when `eos_token_id` is given and comes)."""
        if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
            raise SchedlangError(f"new_tokens must be a positive integer, got {new_tokens!r}")
        prompt = self._checked(prompt_ids, used=0)
        if prompt.size + new_tokens - 1 > self.max_length:
            raise SchedlangError(
                f"{prompt.size} prompt tokens and {new_tokens} new ones do not fit: the cache "
                f"holds {self.max_length} (max_length)"
            )
        self.reset()
        start = time.perf_counter()
        token = int(np.argmax(self.prefill(prompt)))
        prefill_s = time.perf_counter() - start
        tokens = [token]
        start = time.perf_counter()
        while len(tokens) < new_tokens and token != eos_token_id:
            token = int(np.argmax(self.decode(token)))
            tokens.append(token)
        return Generation(int(prompt.size), tuple(tokens), prefill_s, time.perf_counter() - start)
