"""Proposers by name: `builtin` (schedlang.propose.builtin) or `model` (a language model, asked as a
`ModelSpec` says: schedlang.llm.proposer). What `schedlang tune --proposer` and `eval-model` use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schedlang.core.diagnostics import SchedlangError
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Proposal, Proposer

PROPOSERS = ("builtin", "model")


@dataclass(frozen=True)
class ModelSpec:
    """Which model, and how it is asked: everything a rerun needs to ask the same way."""

    model: str  # a hub id or a folder of weights; with `endpoint`, the name the server serves
    endpoint: str | None = None
    decoding: str = "stepwise"
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int | None = None  # None: the backend's default for its device
    answer_tokens: int | None = None
    candidates_per_round: int = 4
    hint: str | None = None
    examples: str = "both"  # in the prompt: retrieved from the database, static, or both

    def backend(self):
        from schedlang.llm.local import TransformersBackend
        from schedlang.llm.openai_backend import OpenAIBackend
        from schedlang.llm.trained import trained_info

        sampling: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
        }
        if self.answer_tokens is not None:
            sampling["answer_tokens"] = self.answer_tokens
        if self.endpoint:
            return OpenAIBackend(self.endpoint, self.model, **sampling)
        if trained_info(self.model) is not None:  # trained here: it answers without reasoning
            sampling["think"] = False
        return TransformersBackend(self.model, **sampling)

    def proposer(self, backend, seed: int, rounds: int = 0, log_prompts: str | None = None):
        """A ModelProposer that goes on after `rounds` rounds (its seeds go on too); every
        prompt and reply is written to `log_prompts` when given."""
        from schedlang.llm.proposer import ModelProposer

        proposer = ModelProposer(
            backend,
            candidates_per_round=self.candidates_per_round,
            hint=self.hint,
            decoding=self.decoding,
            seed=seed,
            log_prompts=log_prompts,
            examples=self.examples,
        )
        proposer.rounds = rounds
        return proposer


def make_proposer(
    name: str,
    templates: Sequence[Proposal] = (),
    *,
    model: ModelSpec | None = None,
    seed: int = 0,
    log_prompts: str | None = None,
    warm_start: bool = True,
) -> Proposer | None:
    """The proposer `name` stands for; None when the templates alone are tuned (`builtin` with
    templates given). `model` says which model and how to ask it (`name` "model"). Without
    `warm_start` the built-in proposer starts cold: no points moved from similar ops' records."""
    if name == "builtin":
        if templates:
            return None
        return BuiltinProposer() if warm_start else BuiltinProposer(transfers=0)
    if name == "model":
        if model is None:
            raise SchedlangError("--proposer model needs a model")
        return model.proposer(model.backend(), seed, log_prompts=log_prompts)
    raise SchedlangError(f"unknown proposer `{name}`", f"proposers: {', '.join(PROPOSERS)}")
