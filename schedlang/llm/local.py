"""A model run in this process: what every such backend shares (`LocalBackend`: the tokenizer and
chat template, llguidance's token masks applied to the logits through a numpy bitmask, replies
and batched continuations), `TransformersBackend` (transformers' `generate`), and the loading of
its weights. `schedlang.llm.compiled.CompiledBackend` is the other `LocalBackend`.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import socket
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.core.imports import allow_torch
from schedlang.llm.backend import (
    CLOSE_FENCE,
    CPU_MAX_NEW_TOKENS,
    DEFAULT_MODEL,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    FENCE,
    GPU_MAX_NEW_TOKENS,
    Ask,
    Backend,
    Completion,
    ContextTooLong,
    Continuation,
    Sample,
    answer_after_fence,
)

if TYPE_CHECKING:
    import llguidance

log = logging.getLogger(__name__)


# --- constrained sampling with transformers -------------------------------------------------------


def require_llm_packages() -> None:
    allow_torch()  # deferred by the CLI until a model is wanted
    missing = []
    for module in ("torch", "transformers", "llguidance"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise SchedlangError(
            f"a local model needs {', '.join(missing)}, which is not installed",
            "install them with: pip install 'schedlang[llm]' (torch: pip install torch, a CPU or "
            "CUDA build), or use a model server with --endpoint URL",
        )


class GrammarLogitsProcessor:
    """A transformers LogitsProcessor: one llguidance matcher per sequence of the batch, its
    token mask applied with numpy (llguidance.torch's is torch.compile'd: ~30 s on first use).

    Once a matcher's grammar is complete, its mask allows only the end-of-sequence token, and that
    mask is kept: the answer ends there.
    """

    def __init__(self, matchers: list, vocab_size: int, prompt_length: int, eos: Sequence[int]):
        import numpy as np

        self.matchers = matchers
        self.vocab_size = vocab_size
        self.prompt_length = prompt_length
        self.eos = set(eos)
        self.done = [False] * len(matchers)
        self.bitmask = np.full((len(matchers), (vocab_size + 31) // 32), -1, dtype=np.int32)
        self.seconds = 0.0
        self.steps = 0

    def __call__(self, input_ids, scores):
        import numpy as np
        import torch
        from llguidance.numpy import fill_next_token_bitmask

        started = time.perf_counter()
        generated = input_ids.shape[1] - self.prompt_length
        for row, matcher in enumerate(self.matchers):
            if matcher is None:  # this row is not constrained
                self.bitmask[row] = -1
                continue
            if generated > 0 and not self.done[row]:
                token = int(input_ids[row, -1])
                if token in self.eos or not matcher.consume_token(token):
                    self.done[row] = True  # finished (the rest is padding), or off the grammar
            if self.done[row]:
                self.bitmask[row] = -1
            else:
                fill_next_token_bitmask(matcher, self.bitmask, row)
        bits = np.unpackbits(self.bitmask.view(np.uint8), axis=1, bitorder="little")
        allowed = torch.from_numpy(bits[:, : scores.shape[1]].astype(bool))
        scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
        self.seconds += time.perf_counter() - started
        self.steps += 1
        return scores


class Sampling(TypedDict, total=False):
    """The sampling settings and budgets a local backend takes (`LocalBackend`, `Backend`)."""

    temperature: float
    top_p: float
    max_new_tokens: int | None  # None: the device's default
    answer_tokens: int | None
    think: bool


@dataclass(frozen=True)
class Batch:
    """What `LocalBackend.generate` asks a backend for: the rows' prompts as tokens (the shared
    text's, `head`, then each row's rest), each row's grammar, the budget and the stop strings."""

    head: list[int]
    rows: list[list[int]]
    larks: Sequence[str | None]
    max_new_tokens: int
    stop_strings: Sequence[str] | None
    shared: str | None  # the text `head` encodes; None when there is no head


class LocalBackend(Backend):
    """A model run in this process, whatever runs it: its tokenizer and chat template, llguidance's
    masks, the two phases of a reply and the batched continuations. A subclass loads the model
    (`tokenizer`, `eos`, `vocab_size`) and gives `generate` (one continuation per prompt) and
    `context_length`: `TransformersBackend` below, or `schedlang.llm.compiled.CompiledBackend`
    (a model built by schedlang, stepped through its KV cache). `think`, `max_new_tokens` and
    `answer_tokens`: see `Backend`; by default a budget that fits the device.
    """

    tokenizer: Any
    eos: list[int]  # the end-of-turn token first
    vocab_size: int  # the model's logits (Qwen's output layer is larger than its tokenizer)

    def __init__(
        self,
        model: str,
        *,
        on_gpu: bool,
        temperature: float = DEFAULT_TEMPERATURE,
        top_p: float = DEFAULT_TOP_P,
        max_new_tokens: int | None = None,
        answer_tokens: int | None = None,
        think: bool = True,
    ):
        self.model_id = model
        # A reasoning budget that fits the device: thousands of tokens on a GPU; on a CPU a
        # 1.5B model writes about one token a second, so a few hundred.
        default_tokens, default_answer = (
            (GPU_MAX_NEW_TOKENS, 1024) if on_gpu else (CPU_MAX_NEW_TOKENS, 256)
        )
        super().__init__(
            Path(model).name if Path(model).expanduser().is_dir() else model,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens or default_tokens,
            answer_tokens=answer_tokens or default_answer,
            think=think,
        )
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._prototypes: dict[str, Any] = {}

    def where(self) -> str:
        """What runs the model, as `expected_time` says it ("cpu", "cuda", …)."""
        raise NotImplementedError

    def context_length(self) -> int | None:
        """How many tokens the model attends to (prompt and reply together), if it says."""
        raise NotImplementedError

    def generate(
        self,
        prompts: Sequence[str],
        larks: Sequence[str | None],
        max_new_tokens: int,
        stop_strings: Sequence[str] | None = None,
        *,
        shared: str | None = None,
    ) -> tuple[list[Sample], float]:
        """One continuation per prompt, each constrained by its own llguidance grammar where one
        is given; and the seconds spent on masks. `shared`: text every prompt starts with, whose
        keys and values the backend keeps for later calls. Every backend splits the prompts the
        same way (the same tokens): `shared`'s tokens, then each prompt's rest encoded on its
        own."""
        head: list[int] = []
        if shared is not None and all(p.startswith(shared) for p in prompts):
            head = self.tokenizer(shared, add_special_tokens=False)["input_ids"]
            prompts = [p[len(shared) :] for p in prompts]
        rows = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        prompt_length = len(head) + max(len(ids) for ids in rows)
        limit = self.context_length()
        if limit is not None and prompt_length + max_new_tokens > limit:
            raise ContextTooLong(
                f"the prompt is {prompt_length} tokens and the reply may take {max_new_tokens}, "
                f"but {self.name} attends to {limit} tokens",
                "shorten --hint, lower --max-new-tokens, or use a model with a longer context",
            )
        shared = shared if head else None
        return self._generate(Batch(head, rows, larks, max_new_tokens, stop_strings, shared))

    def _generate(self, batch: Batch) -> tuple[list[Sample], float]:
        """`generate`, as each backend does it."""
        raise NotImplementedError

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False
        )

    def replies(self, ask: Ask) -> list[Completion]:
        messages, count, grammar, seed = ask
        if seed is not None:
            import torch

            torch.manual_seed(seed)
        prompt = self.chat_prompt(messages)
        lark = grammar.lark("answer") if grammar else None
        stops = None if grammar else [CLOSE_FENCE]
        if not self.think:
            started = time.perf_counter()
            samples, mask_s = self.sample(prompt + FENCE, count, self.max_new_tokens, lark, stops)
            seconds = (time.perf_counter() - started) / max(count, 1)
            return [self._completion("", s, lark, seconds, mask_s / max(count, 1)) for s in samples]
        budget = self.reasoning_tokens
        completions = []
        started = time.perf_counter()
        thoughts, _ = self.sample(prompt, count, budget, None, [FENCE]) if budget else ([], 0.0)
        thinking_s = (time.perf_counter() - started) / max(count, 1)
        for index in range(count):
            started = time.perf_counter()
            thought = thoughts[index] if thoughts else Sample("", 0, "length")
            reasoning, fence, _ = thought.text.partition(FENCE)
            notes = [] if fence else ["the reasoning budget ran out: the answer fence was forced"]
            [answer], mask_s = self.sample(
                prompt + reasoning + FENCE, 1, self.answer_tokens, lark, stops
            )
            completion = self._completion(reasoning, answer, lark, 0.0, mask_s)
            completion.tokens += thought.tokens
            completion.seconds = time.perf_counter() - started + thinking_s
            completion.notes += notes
            completions.append(completion)
        return completions

    def _completion(
        self, reasoning: str, answer: Sample, lark: str | None, seconds: float, mask_s: float
    ) -> Completion:
        text, notes = answer_after_fence(answer.text, answer.finish)
        return Completion(
            text=reasoning + FENCE + answer.text,
            answer=text,
            reasoning=reasoning,
            constrained=lark is not None,
            finish=answer.finish,
            tokens=answer.tokens,
            seconds=seconds,
            mask_seconds=mask_s,
            notes=notes,
        )

    def sample(
        self,
        prompt: str,
        count: int,
        max_new_tokens: int,
        lark: str | None = None,
        stop_strings: Sequence[str] | None = None,
    ) -> tuple[list[Sample], float]:
        """`count` continuations of `prompt` (text, special tokens included), each constrained
        by the llguidance grammar `lark` when given; and the seconds spent on masks."""
        return self.generate([prompt] * count, [lark] * count, max_new_tokens, stop_strings)

    def continue_batch(self, rows: Sequence[Continuation], seed: int | None = None) -> list[Sample]:
        """Each row's continuation: one batched `generate` per distinct chat, whose prompt is
        computed once and kept (the rows' prefixes follow it, padded to one length)."""
        if not rows:
            return []
        if seed is not None:
            import torch

            torch.manual_seed(seed)
        groups: dict[str, list[int]] = {}
        for index, row in enumerate(rows):
            groups.setdefault(self.chat_prompt(row.messages), []).append(index)
        samples: list[Sample | None] = [None] * len(rows)
        for chat, indices in groups.items():
            chosen = [rows[i] for i in indices]
            started = time.perf_counter()
            found, _ = self.generate(
                [chat + row.prefix for row in chosen],
                [row.lark for row in chosen],
                max(row.max_new_tokens for row in chosen),
                sorted({stop for row in chosen for stop in row.stop}),
                shared=chat,
            )
            seconds = (time.perf_counter() - started) / len(chosen)
            for index, row, sample in zip(indices, chosen, found, strict=True):
                sample.seconds = seconds
                if sample.tokens > row.max_new_tokens:  # a shorter budget than the batch's
                    sample.finish = "length"
                samples[index] = sample
        return [s for s in samples if s is not None]

    def tokens_per_second(self, tokens: int = 16) -> float:
        """Measured: one short unconstrained continuation of a short prompt."""
        prompt = self.chat_prompt([{"role": "user", "content": "Schedule a matmul."}])
        started = time.perf_counter()
        [sample], _ = self.generate([prompt], [None], tokens)
        return max(sample.tokens, 1) / max(time.perf_counter() - started, 1e-6)

    def expected_time(self, statements: int = 8, step_tokens: int = 48) -> str:
        """One line for the user before a run: the speed measured here and what an answer may
        take at most (its reasoning budget, then `statements` steps)."""
        rate = self.tokens_per_second()
        reasoning = self.reasoning_tokens if self.think else 0
        most = reasoning + statements * step_tokens
        return (
            f"model {self.name} on {self.where()}: {rate:.1f} tokens/s here; an answer takes up "
            f"to {most} tokens ({reasoning} reasoning, {statements} statements): about "
            f"{_duration(most / rate)} at most"
        )

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _masks(
        self, larks: Sequence[str | None], prompt_length: int
    ) -> GrammarLogitsProcessor | None:
        """The processor applying each row's grammar (a fresh matcher per row), or None when no
        row has one."""
        if all(lark is None for lark in larks):
            return None
        matchers = [None if lark is None else self._prototype(lark).deep_copy() for lark in larks]
        return GrammarLogitsProcessor(matchers, self.vocab_size, prompt_length, self.eos)

    def _decode(self, rows: list[list[int]], stop_strings: Sequence[str] | None) -> list[Sample]:
        """Each row of generated tokens as text, up to the end of sequence or a stop string."""
        samples = []
        for row in rows:
            ended = [n for n, token in enumerate(row) if token in self.eos]
            tokens = row[: ended[0]] if ended else row
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            stopped = bool(ended) or any(s in text for s in stop_strings or ())
            if stop_strings:  # generation stops at the end of the step that wrote a stop string
                cut = min((text.find(s) + len(s) for s in stop_strings if s in text), default=-1)
                text = text[:cut] if cut >= 0 else text
            samples.append(Sample(text, len(tokens), "stop" if stopped else "length"))
        return samples

    def lltokenizer(self) -> llguidance.LLTokenizer:
        """The llguidance view of the tokenizer (≈3 s to build at a 151k vocabulary: cached)."""
        if self._lltokenizer is None:
            import llguidance.hf

            self._lltokenizer = llguidance.hf.from_tokenizer(
                self.tokenizer, n_vocab=self.vocab_size, eos_token=self.eos[0]
            )
        return self._lltokenizer

    def _prototype(self, lark: str):
        if lark not in self._prototypes:
            import llguidance

            matcher = llguidance.LLMatcher(
                self.lltokenizer(), llguidance.LLMatcher.grammar_from_lark(lark), log_level=1
            )
            if matcher.is_error():
                raise SchedlangError(
                    "llguidance rejected the decoding grammar",
                    matcher.get_error().splitlines()[0],
                )
            self._prototypes[lark] = matcher
        return self._prototypes[lark]


class TransformersBackend(LocalBackend):
    """A model run with transformers: a hub id (looked up in the local cache first, downloaded
    when `download`) or a folder holding the weights and tokenizer, on `device` (CUDA when torch
    sees a GPU) in `dtype` (on CUDA bfloat16 where supported, else float16; float32 on a CPU)."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str | None = None,
        dtype: str | None = None,
        download: bool = True,
        **sampling: Unpack[Sampling],
    ):
        require_llm_packages()
        import torch

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        super().__init__(model, on_gpu=not self.device.startswith("cpu"), **sampling)
        if dtype is None:
            cuda = self.device.startswith("cuda")
            dtype = "bfloat16" if cuda and torch.cuda.is_bf16_supported() else "float32"
            dtype = "float16" if cuda and dtype == "float32" else dtype
        self.dtype = dtype
        self.tokenizer, self.model = _load(model, self.device, getattr(torch, dtype), download)
        self.vocab_size = int(self.model.config.vocab_size)
        self.eos = eos_ids(self.tokenizer, self.model.generation_config, self.model.name_or_path)
        self._prompt_cache: dict[str, tuple[list[int], Any]] = {}

    def where(self) -> str:
        return self.device

    def context_length(self) -> int | None:
        config = self.model.config
        value = getattr(config, "max_position_embeddings", None)
        return int(value) if value else None

    def _generate(self, batch: Batch) -> tuple[list[Sample], float]:
        """The rows batched, their rest padded between the shared head and their own tokens;
        the head's keys and values computed once and kept for later calls."""
        import torch

        head, rows = batch.head, batch.rows
        cache = self._cached(batch.shared)[1] if batch.shared is not None else None
        width = max(len(ids) for ids in rows)
        prompt_length = len(head) + width
        pad = self.tokenizer.pad_token_id
        pad = self.eos[0] if pad is None else pad
        input_ids = torch.tensor(
            [head + [pad] * (width - len(ids)) + ids for ids in rows], dtype=torch.long
        ).to(self.model.device)
        attention = torch.tensor(
            [[1] * len(head) + [0] * (width - len(ids)) + [1] * len(ids) for ids in rows],
            dtype=torch.long,
        ).to(self.model.device)
        extra: dict[str, Any] = {}
        if cache is not None:
            batch_cache = copy.deepcopy(cache)
            batch_cache.batch_repeat_interleave(len(rows))
            extra[_cache_argument()] = batch_cache
        masks = self._masks(batch.larks, prompt_length)
        options = self._sampling_options(batch.max_new_tokens, pad, batch.stop_strings)
        if masks is not None:
            from transformers import LogitsProcessorList

            options["logits_processor"] = LogitsProcessorList([masks])
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids, attention_mask=attention, **options, **extra
            )
        samples = self._decode(output[:, prompt_length:].tolist(), batch.stop_strings)
        return samples, masks.seconds if masks is not None else 0.0

    def _sampling_options(
        self, max_new_tokens: int, pad: int, stop_strings: Sequence[str] | None
    ) -> dict[str, Any]:
        """`model.generate`'s arguments for the sampling settings and the stop strings."""
        options: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "eos_token_id": self.eos,
            "pad_token_id": pad,
        }
        if self.temperature > 0:
            options |= {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p}
            options["top_k"] = 0
        else:
            options["do_sample"] = False
        if stop_strings:
            options |= {"stop_strings": list(stop_strings), "tokenizer": self.tokenizer}
        return options

    def _cached(self, text: str) -> tuple[list[int], Any]:
        """The token ids of `text`, and the model's keys and values for all of them but the last
        (`generate` needs at least one token to feed): computed once, the last few kept."""
        if text not in self._prompt_cache:
            import torch

            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            with torch.inference_mode():
                output = self.model(
                    torch.tensor([ids[:-1]], dtype=torch.long).to(self.model.device),
                    use_cache=True,
                )
            while len(self._prompt_cache) >= 4:
                self._prompt_cache.pop(next(iter(self._prompt_cache)))
            self._prompt_cache[text] = (ids, output.past_key_values)
        head, cache = self._prompt_cache[text]
        return list(head), cache


@functools.cache
def _cache_argument() -> str:
    """How `generate` takes a prompt's keys and values: `cache` from transformers 5 (which
    deprecates `past_key_values`), `past_key_values` before."""
    import transformers

    return "cache" if int(transformers.__version__.split(".")[0]) >= 5 else "past_key_values"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def eos_ids(tokenizer, generation_config, name: str) -> list[int]:
    """The tokens that end a reply: the generation config's and the tokenizer's, the chat's
    end-of-turn token first."""
    ids = generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else [ids] if ids is not None else []
    for token in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")):
        if isinstance(token, int) and token >= 0 and token != tokenizer.unk_token_id:
            ids.append(token)
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise SchedlangError(f"{name}: the tokenizer has no end-of-sequence token")
    # The chat's end-of-turn token first: it is what ends an answer.
    if tokenizer.eos_token_id in ids:
        ids.remove(tokenizer.eos_token_id)
        ids.insert(0, tokenizer.eos_token_id)
    return ids


def how_to_get(model: str) -> str:
    return (
        f"download it once on a machine with internet: `hf download {model} --local-dir DIR` "
        f"(older huggingface_hub: `huggingface-cli download {model} --local-dir DIR`), copy DIR "
        "here, then pass --model DIR; or serve it with vLLM and pass --endpoint URL"
    )


def _looks_like_path(model: str) -> bool:
    """A hub id is `org/name`; anything else names a folder."""
    return model.startswith(("/", ".", "~")) or model.count("/") != 1


def _load(model: str, device: str, dtype, download: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model).expanduser()
    if path.is_dir() or _looks_like_path(model):
        if not (path / "config.json").is_file():
            what = "has no config.json" if path.is_dir() else "does not exist"
            raise SchedlangError(
                f"no model in {path}: the folder {what}", how_to_get(DEFAULT_MODEL)
            )
        download = False

    def load(local_only: bool):
        tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=local_only)
        weights = AutoModelForCausalLM.from_pretrained(
            model, local_files_only=local_only, dtype=dtype
        )
        return tokenizer, weights

    try:
        tokenizer, weights = load(local_only=True)
    except (OSError, ValueError) as err:
        if not download:
            raise SchedlangError(
                f"cannot load the model {model}: {error_line(err, first=True)}", how_to_get(model)
            ) from None
        unreachable = _hub_unreachable()
        if unreachable:
            raise SchedlangError(
                f"the weights of {model} are not on this machine and the model hub cannot be "
                f"reached ({unreachable})",
                how_to_get(model),
            ) from None
        log.info("%s is not in the local cache: downloading it", model)
        try:
            tokenizer, weights = load(local_only=False)
        except Exception as err2:  # no such model, no access, interrupted download
            raise SchedlangError(
                f"cannot download the weights of {model}: {error_line(err2, first=True)}",
                how_to_get(model),
            ) from None
    weights.to(device)
    weights.eval()
    return tokenizer, weights


def _hub_unreachable() -> str:
    """Why the model hub cannot be reached, or "" if it may be: a quick look before a download
    whose own retries take about a minute to give up."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY")):
        return ""  # only the proxy knows
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as err:
        return f"{host}: {err.strerror or err}"
    return ""
