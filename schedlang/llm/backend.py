"""What every backend shares: the interface the proposers call (`Backend`), the sampling settings,
the reply's parts (`Completion`, `Continuation`, `Sample`) and the answer in a reply.

Three backends implement it: `schedlang.llm.local.TransformersBackend` (local weights, llguidance
masks applied to the logits), `schedlang.llm.compiled.CompiledBackend` (the same, the model run on
schedlang's own decoder build) and `schedlang.llm.openai_backend.OpenAIBackend` (an
OpenAI-compatible HTTP server: vLLM, SGLang, llama.cpp, Ollama; the grammar goes along as a
structured-output constraint where the server takes one). The grammar they constrain answers by
is `schedlang.llm.grammar`'s.

A reasoning model thinks in free text first. Locally that is two phases: the reasoning is sampled
unconstrained until the model opens a ```schedlang fence (or its budget runs out, and the fence is
written for it), then the answer is sampled under the grammar up to the closing fence. Over HTTP
the grammar itself starts with a lazy free-text part that ends at the fence. Either way the answer
is the schedlang text after the fence (`extract_answer`), only ever parsed, never run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple

from schedlang.core.diagnostics import SchedlangError

if TYPE_CHECKING:
    from schedlang.llm.grammar import DecodingGrammar

DEFAULT_MODEL = "WeiboAI/VibeThinker-1.5B"
FENCE = "```schedlang"
CLOSE_FENCE = "```"
# Tokens per reply (reasoning and answer) by default: on a GPU or a server, and for a local model
# on a CPU.
GPU_MAX_NEW_TOKENS = 8192
CPU_MAX_NEW_TOKENS = 768
# VibeThinker's model card: temperature 0.6 (or 1.0), top_p 0.95, top_k disabled.
DEFAULT_TEMPERATURE = 0.6
DEFAULT_TOP_P = 0.95


# --- answers --------------------------------------------------------------------------------------

_FENCED = re.compile(r"```[ \t]*([A-Za-z]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)


def extract_answer(text: str, *, tagged_only: bool = False) -> str | None:
    """The schedlang in a reply: the last ```schedlang block (an unclosed one at the end counts),
    else (unless `tagged_only`: a reply sampled under a grammar, whose answer can only follow
    its ```schedlang fence) the last fenced block of any language; None when there is none."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCED.finditer(text)]
    tagged = [body for tag, body in blocks if tag in ("schedlang", "sched")]
    if tagged:
        return tagged[-1]
    return blocks[-1][1] if blocks and not tagged_only else None


def answer_after_fence(body: str, finish: str) -> tuple[str, list[str]]:
    """The answer in what a model wrote after its opening fence: up to the closing fence, or (cut
    by the budget) to its last complete line; and the notes that say what was forced."""
    return close_answer(body.split(CLOSE_FENCE)[0].removeprefix("\n"), finish)


class ContextTooLong(SchedlangError):
    """The prompt and the reply's budget do not fit the model's context (the message names both
    numbers where the backend knows them)."""


def close_answer(answer: str, finish: str) -> tuple[str, list[str]]:
    """An answer cut by the token budget ("length") ends at its last complete line, as if the
    closing fence had been written there; and the note that says so."""
    if finish != "length" or answer.endswith("\n") or "\n" not in answer:
        return answer, []
    kept = answer[: answer.rindex("\n") + 1]
    return kept, ["the answer budget ran out: the closing fence was forced after its last line"]


@dataclass
class Completion:
    """One reply of a model: what it wrote, split into its reasoning and its schedlang answer."""

    text: str  # everything the model wrote
    answer: str | None  # the schedlang text; None when there is none
    reasoning: str = ""
    constrained: bool = False  # the answer was sampled under the grammar
    finish: str = ""  # "stop", "length", …
    tokens: int = 0
    seconds: float = 0.0
    mask_seconds: float = 0.0  # time spent computing grammar masks
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Its fields but `mask_seconds`, `seconds` rounded to the millisecond."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "mask_seconds"}
        return {**data, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Continuation:
    """One row of a batched continuation: the assistant has written `prefix` in reply to
    `messages`; the model writes on, constrained by `lark` (a whole llguidance grammar, with its
    own `start`) when given, for at most `max_new_tokens`, stopping at any of `stop`."""

    messages: tuple[dict[str, str], ...]
    prefix: str
    lark: str | None
    max_new_tokens: int
    stop: tuple[str, ...] = ()


@dataclass
class Sample:
    """What a continuation wrote: its text, its token count, and why it ended ("stop" at a stop
    string, the grammar's end or the end-of-turn token; "length" at `max_new_tokens`)."""

    text: str
    tokens: int
    finish: str
    seconds: float = 0.0


class Ask(NamedTuple):
    """One `complete` call: `reply_count` replies to the chat `messages`, each answer constrained
    by `grammar` when given. (Not `count`: a tuple's `count` method has that name.)"""

    messages: Sequence[dict[str, str]]
    reply_count: int
    grammar: DecodingGrammar | None = None
    seed: int | None = None


class Backend:
    """A model that writes schedlang: what the proposers call (a stand-in in a test needs only
    `name`, `complete` and `continue_batch`), and the sampling settings both backends take.

    `think`: the model reasons in free text before its ```schedlang answer (a reasoning model like
    VibeThinker needs this); the reasoning gets `max_new_tokens - answer_tokens` tokens, the answer
    `answer_tokens`. Without it the reply starts with the fence.
    """

    name: str  # the model, as records name it: "model:<name>"

    def __init__(
        self,
        name: str,
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        answer_tokens: int,
        think: bool,
    ):
        self.name = name
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.answer_tokens = min(answer_tokens, max_new_tokens)
        self.think = think

    @property
    def reasoning_tokens(self) -> int:
        """What the reasoning may take (with `think`): the reply's budget less the answer's."""
        return max(self.max_new_tokens - self.answer_tokens, 0)

    def complete(
        self,
        messages: Sequence[dict[str, str]],
        count: int,
        grammar: DecodingGrammar | None = None,
        seed: int | None = None,
    ) -> list[Completion]:
        """`count` replies to a chat; each answer constrained by `grammar` when given."""
        return self.replies(Ask(messages, count, grammar, seed))

    def replies(self, ask: Ask) -> list[Completion]:
        """`complete`, as each backend does it."""
        raise NotImplementedError

    def continue_batch(self, rows: Sequence[Continuation], seed: int | None = None) -> list[Sample]:
        """Each row's continuation, in order (one batched call where the backend can)."""
        raise NotImplementedError
