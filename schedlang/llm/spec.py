"""Proposers by name: `builtin` (schedlang.propose.builtin) or `model` (a language model, asked as a
`ModelSpec` says: schedlang.llm.proposer). What `schedlang tune --proposer` and `eval-model` use.

A model run here runs on transformers (`runtime="transformers"`, the default) or on schedlang's
own build of it (`runtime="schedlang"`: schedlang.llm.compiled). The build lives in a layer
above this one (schedlang.models.decoder), so `backend` and `make_proposer` are handed the
function that builds it; schedlang.workflows passes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schedlang.core.diagnostics import SchedlangError, one_of
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Proposal, Proposer

if TYPE_CHECKING:
    from schedlang.llm.backend import Backend
    from schedlang.llm.compiled import BuildStepModel

PROPOSERS = ("builtin", "model")
# What runs a model on this machine: transformers, or schedlang's build of it.
RUNTIMES = ("transformers", "schedlang")


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
    runtime: str = "transformers"  # a model run here: on transformers or on schedlang's build
    model_db: str | None = None  # runtime "schedlang": the tuning database it is built with
    model_max_length: int | None = None  # runtime "schedlang": its cache (default: up to 4,096)

    def backend(self, build: BuildStepModel | None = None) -> Backend:
        """The backend that asks the model. `build`: for `runtime="schedlang"`, what builds the
        model (schedlang.models.decoder.load_tuned; schedlang.workflows passes it)."""
        from schedlang.llm.compiled import CompiledBackend
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
        self._check_runtime()
        if self.endpoint:
            return OpenAIBackend(self.endpoint, self.model, **sampling)
        if trained_info(self.model) is not None:  # trained here: it answers without reasoning
            sampling["think"] = False
        if self.runtime == "schedlang":
            return CompiledBackend(
                self.model,
                build,
                model_db=self.model_db,
                max_length=self.model_max_length,
                **sampling,
            )
        return TransformersBackend(self.model, **sampling)

    def _check_runtime(self) -> None:
        if self.runtime not in RUNTIMES:
            raise SchedlangError(
                f"unknown model runtime `{self.runtime}`", one_of(RUNTIMES, "runtimes")
            )
        if self.endpoint and self.runtime != "transformers":
            raise SchedlangError(
                f"--model-runtime {self.runtime} runs the model here; --endpoint asks a server"
            )
        for flag, value in (("db", self.model_db), ("max-length", self.model_max_length)):
            if value is not None and self.runtime != "schedlang":
                raise SchedlangError(f"--model-{flag} goes with --model-runtime schedlang")

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
    build: BuildStepModel | None = None,
) -> Proposer | None:
    """The proposer `name` stands for; None when the templates alone are tuned (`builtin` with
    templates given). `model` says which model and how to ask it (`name` "model"), `build` what
    builds it for `runtime="schedlang"` (ModelSpec.backend). Without `warm_start` the built-in
    proposer starts cold: no points moved from similar ops' records."""
    if name == "builtin":
        if templates:
            return None
        return BuiltinProposer() if warm_start else BuiltinProposer(transfers=0)
    if name == "model":
        if model is None:
            raise SchedlangError("--proposer model needs a model")
        return model.proposer(model.backend(build), seed, log_prompts=log_prompts)
    raise SchedlangError(f"unknown proposer `{name}`", f"proposers: {', '.join(PROPOSERS)}")
