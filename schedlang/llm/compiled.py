"""The proposer's model run on schedlang's own build: `CompiledBackend`, a `LocalBackend` that steps
a model through its KV cache one token at a time instead of calling transformers' `generate`.

    backend = CompiledBackend("checkpoint/", build)   # build(folder, db) -> a StepModel
    samples, _ = backend.generate([prompt], [None], 32)

The model is any `StepModel`: the logits after a prefill and after each one-token decode, its
cache holding positions [0, length), so that setting `length` back rolls it back.
`schedlang.models.decoder` builds one (its `Decoder`, built with a tuning database's schedules
when one is named). This layer sits below `models`, so the backend is handed the function that
builds it (`BuildStepModel`); `schedlang.workflows` passes it (`ModelSpec.backend(build=...)`).

What it shares with `TransformersBackend` is all of `LocalBackend`: the tokenizer, the prompt's
split into the shared chat and each row's rest, llguidance's masks (the same
`GrammarLogitsProcessor`), the replies' two phases and the batched continuations. Each step
follows transformers' `generate`: the model's repetition penalty, the grammar's mask, then
temperature and top-p (transformers' own warpers); the highest score under greedy decoding, else
one token drawn from the softmax; stopping at an end-of-sequence token, at `max_new_tokens`, or
where transformers' `StopStringCriteria` sees a stop string. Under greedy decoding its tokens are
transformers' (tests/test_compiled_backend.py).

The rows of a batch are decoded one after another (the cache holds one sequence). The cache is
kept across rows and calls: a prompt is prefilled only from its first token that differs from the
tokens the cache holds (the chat and the statements so far come back at every step of stepwise
decoding), and a backtrack, another row or another chat rolls the cache back to what they share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Unpack

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.llm.backend import DEFAULT_MODEL, Sample
from schedlang.llm.local import (
    Batch,
    GrammarLogitsProcessor,
    LocalBackend,
    Sampling,
    eos_ids,
    how_to_get,
    require_llm_packages,
)

if TYPE_CHECKING:
    import numpy as np


class StepModel(Protocol):
    """A causal LM that keeps its own KV cache (schedlang.models.decoder.Decoder is one)."""

    max_length: int  # the positions its cache holds
    length: int  # the positions in use: setting it back rolls the cache back

    def prefill(self, input_ids: Sequence[int]) -> np.ndarray:
        """The logits after `input_ids`, appended to the cache."""
        ...

    def decode(self, token: int) -> np.ndarray:
        """The logits after one more token."""
        ...


# A checkpoint folder, a tuning database (None: none) and the cache's length -> the model, built.
BuildStepModel = Callable[[str, str | None, int], StepModel]
# The cache's length by default, if the model attends that far: a proposer's prompt (reference,
# examples, history) with a reply's budget takes about 3,000 tokens.
DEFAULT_CONTEXT = 4096
# A long prompt is prefilled in chunks: the same logits, bit for bit, and faster (measured
# 2026-12-06 on the tiny Qwen2, unscheduled, one thread: 3,000 tokens in 5.4 s at once, 2.8 s in
# chunks of 256, 2.7 s in chunks of 64), and what a step allocates stays bounded.
PREFILL_CHUNK = 256


class CompiledBackend(LocalBackend):
    """A checkpoint folder (or a hub id already in the local cache), built by `build` with the
    schedules of the tuning database `model_db` when given and a cache of `max_length` tokens
    (default: the model's maximum, at most 4,096), run on this machine's CPU. Sampling and
    budgets as `TransformersBackend`'s (see `Backend`)."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        build: BuildStepModel | None = None,
        *,
        model_db: str | None = None,
        max_length: int | None = None,
        **sampling: Unpack[Sampling],
    ):
        if build is None:
            raise SchedlangError(
                "--model-runtime schedlang needs schedlang's decoder build",
                "ask through schedlang.workflows (proposer_named, evaluate_model), which passes "
                "it, or pass build=schedlang.workflows.decoder_model.proposer_decoder",
            )
        require_llm_packages()
        if model_db is not None and not Path(model_db).is_file():
            raise SchedlangError(
                f"no tuning database at {model_db} (--model-db)",
                "tune the model into one first: schedlang tune-model CHECKPOINT --db DB",
            )
        super().__init__(model, on_gpu=False, **sampling)
        folder = checkpoint_folder(model)
        self.tokenizer, config, generation = _read_tokenizer(folder)
        self.vocab_size = int(config.vocab_size)
        self.eos = eos_ids(self.tokenizer, generation, str(folder))
        self.repetition_penalty = generation.repetition_penalty
        self.model_db = model_db
        if max_length is None:
            most = getattr(config, "max_position_embeddings", None) or DEFAULT_CONTEXT
            max_length = min(int(most), DEFAULT_CONTEXT)
        self.model = build(str(folder), model_db, max_length)
        self.model.length = 0
        self._in_cache: list[int] = []  # the tokens at positions [0, model.length)
        # Since the model was built: tokens reused from the cache, prefilled and decoded, and
        # the times the cache was rolled back.
        self.reused = self.prefilled = self.decoded = self.rollbacks = 0

    def where(self) -> str:
        return "cpu, schedlang's build"

    def forget(self) -> None:
        """An empty cache: the next prompt is prefilled whole (a benchmark's cold start)."""
        self.model.length = 0
        self._in_cache = []

    def context_length(self) -> int | None:
        return self.model.max_length

    def _generate(self, batch: Batch) -> tuple[list[Sample], float]:
        """The rows one after another, each from the cache as far as it holds their tokens."""
        stops = None
        if batch.stop_strings:
            from transformers import StopStringCriteria

            stops = StopStringCriteria(self.tokenizer, list(batch.stop_strings))
        rows, mask_seconds = [], 0.0
        for ids, lark in zip(batch.rows, batch.larks, strict=True):
            masks = self._masks([lark], len(batch.head) + len(ids))
            rows.append(self._continue(batch.head + ids, masks, batch.max_new_tokens, stops))
            mask_seconds += masks.seconds if masks is not None else 0.0
        return self._decode(rows, batch.stop_strings), mask_seconds

    def _continue(
        self,
        ids: list[int],
        masks: GrammarLogitsProcessor | None,
        max_new_tokens: int,
        stops: Any,
    ) -> list[int]:
        """The tokens generated after `ids`, as transformers' `generate` chooses them."""
        import torch

        processors = self._processors(masks)
        logits = self._prefill(ids)
        sequence = torch.tensor([ids], dtype=torch.long)
        generated: list[int] = []
        while True:
            scores = torch.from_numpy(logits).to(torch.float32)[None]
            for processor in processors:
                scores = processor(sequence, scores)
            if self.temperature > 0:
                token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1)[0, 0])
            else:
                token = int(torch.argmax(scores, dim=-1)[0])
            generated.append(token)
            sequence = torch.cat([sequence, torch.tensor([[token]], dtype=torch.long)], dim=1)
            if token in self.eos or len(generated) >= max_new_tokens:
                return generated
            if stops is not None and bool(stops(sequence, scores)[0]):
                return generated
            logits = self.model.decode(token)
            self._in_cache.append(token)
            self.decoded += 1

    def _processors(self, masks: GrammarLogitsProcessor | None) -> list[Any]:
        """What `generate` applies to the logits, in its order: the model's repetition penalty,
        the grammar's mask, then (sampling) temperature and top-p; top-k is off."""
        from transformers import (
            RepetitionPenaltyLogitsProcessor,
            TemperatureLogitsWarper,
            TopPLogitsWarper,
        )

        processors: list[Any] = []
        if self.repetition_penalty is not None and self.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(self.repetition_penalty))
        if masks is not None:
            processors.append(masks)
        if self.temperature > 0:
            if self.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(self.temperature))
            if self.top_p < 1.0:
                processors.append(TopPLogitsWarper(self.top_p))
        return processors

    def _prefill(self, ids: list[int]) -> np.ndarray:
        """The logits after `ids`: the cache rolled back to the tokens it shares with them (all
        but the last at most: a prefill needs one), the rest prefilled `PREFILL_CHUNK` tokens at a
        time."""
        cached, common = self._in_cache, 0
        limit = min(len(cached), len(ids) - 1)
        while common < limit and cached[common] == ids[common]:
            common += 1
        self.rollbacks += common < len(cached)
        self.model.length = common
        self._in_cache = cached[:common]
        for start in range(common, len(ids), PREFILL_CHUNK):
            logits = self.model.prefill(ids[start : start + PREFILL_CHUNK])
            self._in_cache = ids[: start + PREFILL_CHUNK]
        self.reused += common
        self.prefilled += len(ids) - common
        return logits


def checkpoint_folder(model: str) -> Path:
    """The folder holding `model`: itself, or a hub id's snapshot in the local Hugging Face
    cache (never downloaded here); a SchedlangError that says how to get it otherwise."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SchedlangError(
                f"no model in {path}: the folder has no config.json", how_to_get(DEFAULT_MODEL)
            )
        return path
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:
        raise SchedlangError(
            f"no model in {path}: the folder does not exist", how_to_get(DEFAULT_MODEL)
        )
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # not in the cache (nothing is downloaded here), or no huggingface_hub
        raise SchedlangError(
            f"the weights of {model} are not in the local Hugging Face cache", how_to_get(model)
        ) from None


def _read_tokenizer(folder: Path) -> tuple[Any, Any, Any]:
    """The tokenizer, the model's config and its generation config, as transformers reads them
    (a folder without generation_config.json: the one the model's config implies)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config: Any  # transformers' PreTrainedConfig
    try:
        tokenizer, config = (
            auto.from_pretrained(folder, local_files_only=True)
            for auto in (AutoTokenizer, AutoConfig)
        )
    except (OSError, ValueError, KeyError) as err:  # a file missing or damaged
        raise SchedlangError(f"cannot read {folder}: {error_line(err, first=True)}") from None
    try:
        generation = GenerationConfig.from_pretrained(folder, local_files_only=True)
    except OSError:
        generation = GenerationConfig.from_model_config(config)
    return tokenizer, config, generation
