"""The model proposer: a language model writes schedules, the checker reviews them.

Each `propose` call is one round:

    prompt     (schedlang.llm.messages) system prompt (prompts/system.md) with the schedlang
               reference generated from grammar/schedlang.lark and prompts/statements.txt; the op
               as `schedlang show` prints it; the target's facts (peaks included); the user's
               hint; one or two example schedules for ops of the same kind on the same kind of
               target (prompts/examples/); the history as schedlang.llm.feedback renders it
               (latency, rates, speedups, share of peak, knobs, diagnostics), cut to fit the
               model's context. Once something has run, half the answers are asked to edit one of
               the fastest schedules (prompts/edit.md).
    sample     k answers in one batched call: per statement (schedlang.llm.stepwise, the default),
               under one grammar for the whole answer (schedlang.llm.grammar.decoding_grammar), or
               free.
    review     each answer is parsed and checked (`schedlang.checker.check.check`, knobs at
               their first values). A whole or free answer with a problem gets one repair round:
               the model sees its answer and the rendered diagnostics, and writes it again.
    propose    every answer that was written and not proposed before, as a Proposal whose
               `extra` holds what the model produced and how it was asked (the prompt, seed,
               sampling, grammar, the step log, the record it edits), so the tuner's database
               keeps it for audit and replay.

A model's text is only ever parsed as schedlang: nothing it writes is executed.

    backend = TransformersBackend("path/to/VibeThinker-1.5B")
    proposer = ModelProposer(backend, candidates_per_round=4)
    tune(op, target, db, proposer=proposer)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang.core.diagnostics import SchedlangError, render_all
from schedlang.core.opinfo import describe, render_show
from schedlang.llm.backend import (
    CLOSE_FENCE,
    FENCE,
    Backend,
    Completion,
    ContextTooLong,
    Continuation,
)
from schedlang.llm.feedback import is_baseline
from schedlang.llm.grammar import Bounds, DecodingGrammar, OpNames, decoding_grammar
from schedlang.llm.messages import build_messages, repair_messages, store_prompt
from schedlang.llm.retrieval import retrieve_examples
from schedlang.llm.stepwise import StepDecoder, StepLimits
from schedlang.llm.trained import compact_messages, trained_info
from schedlang.propose.builtin import op_kind as rules_kind
from schedlang.propose.interface import Context, Proposal
from schedlang.propose.warmstart import nest_of

if TYPE_CHECKING:
    from schedlang.store.records import Record

log = logging.getLogger(__name__)


EXAMPLES = ("both", "retrieved", "static")


# --- reviewing an answer --------------------------------------------------------------------------


@dataclass(frozen=True)
class Review:
    text: str  # the schedule text (canonical when it parsed)
    parsed: bool
    ok: bool  # parsed and checked without error
    diagnostics: str  # rendered; "" when there is nothing to say


def review(answer: str, context: Context) -> Review:
    """Parse and check a model's answer; never executes it."""
    from schedlang.checker.check import check
    from schedlang.lang.printer import format_schedule
    from schedlang.lang.syntax import parse_with_diagnostics

    schedule, diagnostics = parse_with_diagnostics(answer, "<answer>")
    if schedule is None or any(d.is_error for d in diagnostics):
        return Review(answer, False, False, render_all(diagnostics, answer))
    try:
        result = check(schedule, context.op.func, context.target, template_ok=True)
    except SchedlangError as err:
        return Review(format_schedule(schedule), True, False, err.render())
    found = [*diagnostics, *result.diagnostics]
    rendered = render_all(found, answer) if found else ""
    return Review(format_schedule(schedule), True, result.ok, rendered)


# --- the proposer ---------------------------------------------------------------------------------

DECODINGS = ("stepwise", "whole", "none")


@dataclass(frozen=True)
class _Request:
    """One answer asked for: its chat, and the record it edits (None: a fresh schedule)."""

    messages: tuple[dict[str, str], ...]
    parent: Record | None = None


class ModelProposer:
    """Schedules written by a language model (see the module's docstring).

    `decoding`: "stepwise" (default: each statement sampled under a grammar built from the
    checker's state after the ones before, and checked; schedlang.llm.stepwise), "whole" (the whole
    answer under one grammar, schedlang.llm.grammar.decoding_grammar: what a server that takes one
    grammar per request gets), or "none" (unconstrained; the answer is still parsed and
    checked). `per_op` narrows the whole-answer grammar to the op's names; `bounds` makes it
    finite. `beam`: once candidates have run, up to half the answers of a round edit one of the
    `beam` fastest (each child records its parent's id). `log_prompts`: a folder that gets every
    prompt and reply.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        candidates_per_round: int = 4,
        hint: str | None = None,
        decoding: str | None = None,
        constrain: bool = True,
        per_op: bool = True,
        bounds: Bounds | None = None,
        repair: bool = True,
        want: str | None = None,
        seed: int = 0,
        beam: int = 3,
        limits: StepLimits | None = None,
        log_prompts: str | Path | None = None,
        prompt_chars: int = 6000,
        examples: str = "both",
        retrieve: int = 2,
    ):
        if examples not in EXAMPLES:
            raise SchedlangError(f"unknown examples `{examples}`", f"one of: {', '.join(EXAMPLES)}")
        if decoding is None:
            decoding = "none" if not constrain else "whole" if bounds else "stepwise"
        if decoding not in DECODINGS:
            raise SchedlangError(
                f"unknown decoding `{decoding}`", f"one of: {', '.join(DECODINGS)}"
            )
        self.backend = backend
        self.name = f"model:{backend.name}"
        self.candidates_per_round = max(1, candidates_per_round)
        self.hint = hint
        self.decoding = decoding
        self.per_op = per_op
        self.bounds = bounds
        self.repair = repair
        self.want = want
        self.seed = seed
        self.beam = beam
        self.log_prompts = Path(log_prompts) if log_prompts else None
        self.prompt_chars = prompt_chars
        self.examples = examples
        self.retrieve = retrieve if examples != "static" else 0
        # A model `schedlang train` wrote is asked as it was trained (schedlang.llm.trained).
        self.trained = trained_info(getattr(backend, "model_id", "")) is not None
        # A trained model writes whole schedules as it saw them measured: longer than the 8
        # statements a general model is held to.
        self.limits = limits or (StepLimits(statements=24) if self.trained else StepLimits())
        self._retrieved: dict[str, list[Proposal]] = {}
        self._nests: dict[str, dict | None] = {}
        self.rounds = 0
        self.unanswered: list[Completion] = []  # replies with no schedlang in them
        self._grammars: dict[str, DecodingGrammar] = {}
        self._steppers: dict[str, StepDecoder] = {}
        self._returned: set[tuple[str, str, str]] = set()

    @property
    def constrain(self) -> bool:
        return self.decoding != "none"

    def grammar(self, context: Context) -> DecodingGrammar | None:
        """The whole-answer grammar (decoding "whole"; also the repair round's)."""
        if self.decoding == "none":
            return None
        gpu = context.target.is_gpu
        key = (context.op.func.script() if self.per_op else "") + f"gpu={gpu}"
        if key not in self._grammars:
            names = OpNames.of(context.op) if self.per_op else None
            self._grammars[key] = decoding_grammar(names, self.bounds, gpu=gpu)
        return self._grammars[key]

    def stepper(self, context: Context) -> StepDecoder:
        key = context.op.func.script() + context.target.key
        if key not in self._steppers:
            self._steppers[key] = StepDecoder(
                context.op, context.target, self.limits, templates=self.want != "schedule"
            )
        return self._steppers[key]

    def settings(self) -> dict:
        """How answers are sampled, for each record: enough to ask again the same way."""
        backend = self.backend
        sampling = {
            name: getattr(backend, name)
            for name in ("temperature", "top_p", "max_new_tokens", "answer_tokens", "think")
            if hasattr(backend, name)
        }
        grammar = {"decoding": self.decoding, "per_op": self.per_op}
        if self.bounds is not None:
            grammar["bounds"] = dataclasses.asdict(self.bounds)
        if self.decoding == "stepwise":
            grammar["limits"] = dataclasses.asdict(self.limits)
        return {"sampling": sampling, "grammar": grammar, "want": self.want}

    # --- one round -------------------------------------------------------------------------------

    def propose(self, context: Context, history: Sequence[Record], count: int) -> list[Proposal]:
        from schedlang.store.records import op_key

        if count <= 0:
            return []
        if self.hint and not context.hint:
            context = replace(context, hint=self.hint)
        self.rounds += 1
        wanted = min(count, self.candidates_per_round)
        seed = self._seed()
        chars = self.prompt_chars
        while True:  # a server's context is learnt from its refusal: the history shrinks
            requests = self.requests(context, history, wanted, chars)
            try:
                replies, steps = self._ask(context, requests, seed)
                break
            except ContextTooLong as err:
                if chars <= 0:
                    raise
                log.warning("%s: asking again with a shorter history", err.message)
                chars = _shorter(chars)
        proposals = []
        for number, (request, reply, step_log) in enumerate(
            zip(requests, replies, steps, strict=True), 1
        ):
            proposal = self._proposal(context, request, reply, step_log, number, len(replies), seed)
            if proposal is None:
                continue
            key = (op_key(context.op.func), context.target.key, proposal.text)
            if key in self._returned:  # the same schedule again: not built twice
                log.info("round %d: answer %d repeats an earlier one", self.rounds, number)
                continue
            self._returned.add(key)
            proposals.append(proposal)
        self._log_round(requests, replies)
        log.info("round %d: %d proposals, %d replies", self.rounds, len(proposals), len(replies))
        return proposals

    def requests(
        self, context: Context, history: Sequence[Record], count: int, chars: int | None = None
    ) -> list[_Request]:
        """`count` answers to ask for: up to half edit the fastest schedules so far (a beam of
        `beam` parents, in turn), the rest are written afresh. `chars`: the history's budget."""
        chars = self.prompt_chars if chars is None else chars
        fresh = self.messages(context, history, chars=chars)
        parents = _fastest(history, self.beam) if not self.trained else []
        edits = count // 2 if parents else 0
        requests = [
            _Request(tuple(self.messages(context, history, parent, chars=chars)), parent)
            for parent in (parents[n % len(parents)] for n in range(edits))
        ]
        requests += [_Request(tuple(fresh))] * (count - edits)
        return requests

    def messages(
        self,
        context: Context,
        history: Sequence[Record],
        parent: Record | None = None,
        *,
        chars: int | None = None,
    ) -> list[dict[str, str]]:
        """The chat for one answer, its history cut to `chars` (default `prompt_chars`) and,
        where the backend can count tokens, to what fits the model's context."""
        if self.trained:
            op_text, facts = render_show(describe(context.op)), context.target.describe()
            return compact_messages(op_text, facts)
        chars = self.prompt_chars if chars is None else chars
        retrieved = self.retrieved(context)
        while True:
            messages = build_messages(
                context, history, want=self.want, parent=parent, history_chars=chars,
                retrieved=retrieved, static_examples=self.examples != "retrieved",
            )  # fmt: skip
            if self._fits(messages) or chars <= 0:
                return messages
            chars = _shorter(chars)

    def retrieved(self, context: Context) -> list[Proposal]:
        """The examples retrieved for the op (`retrieve_examples`), once per op and target."""
        if self.retrieve <= 0:
            return []
        key = context.op.func.script() + context.target.key
        if key not in self._retrieved:
            self._retrieved[key] = retrieve_examples(context, self.retrieve)
        return self._retrieved[key]

    def nest(self, context: Context) -> dict | None:
        """The op's nest as the built-in proposer keeps it (schedlang.store.similar), once per op
        and target: kept in every record of the model, so that retrieval finds its schedules."""
        key = context.op.func.script() + context.target.key
        if key not in self._nests:
            self._nests[key] = nest_of(context.op, rules_kind(context.op, context.target))
        return self._nests[key]

    def _fits(self, messages: Sequence[dict[str, str]]) -> bool:
        # A local model counts its prompt's tokens; a server's backend has none of the three.
        limit = getattr(self.backend, "context_length", lambda: None)()
        count = getattr(self.backend, "count_tokens", None)
        chat_prompt = getattr(self.backend, "chat_prompt", None)
        if not limit or count is None or chat_prompt is None:
            return True
        return count(chat_prompt(messages)) + getattr(self.backend, "max_new_tokens", 0) <= limit

    def _seed(self) -> int:
        return self.seed * 1_000_003 + self.rounds

    def _ask(
        self, context: Context, requests: Sequence[_Request], seed: int
    ) -> tuple[list[Completion], list[dict | None]]:
        if self.decoding == "stepwise":
            return self._ask_stepwise(context, requests, seed)
        grammar = self.grammar(context)
        groups: dict[str, list[int]] = {}  # one call per distinct chat
        for index, request in enumerate(requests):
            groups.setdefault(json.dumps(request.messages), []).append(index)
        by_index: dict[int, Completion] = {}
        for number, indices in enumerate(groups.values()):
            messages = list(requests[indices[0]].messages)
            answers = self.backend.complete(
                messages, len(indices), grammar, seed=seed + 7919 * number
            )
            by_index.update(zip(indices, answers, strict=True))
        replies = [by_index[i] for i in range(len(requests))]
        return replies, [None] * len(replies)

    def _ask_stepwise(
        self, context: Context, requests: Sequence[_Request], seed: int
    ) -> tuple[list[Completion], list[dict | None]]:
        """Reasoning first (free text up to the opening fence, which is written for the model
        when its budget runs out), then the answer a statement at a time."""
        backend = self.backend
        started = time.perf_counter()
        think = getattr(backend, "think", False)
        budget = getattr(backend, "max_new_tokens", 0) - getattr(backend, "answer_tokens", 0)
        thoughts = [""] * len(requests)
        notes: list[list[str]] = [[] for _ in requests]
        tokens = [0] * len(requests)
        if think and budget > 0:
            rows = [Continuation(r.messages, "", None, budget, (FENCE,)) for r in requests]
            for index, sample in enumerate(backend.continue_batch(rows, seed=seed)):
                thoughts[index] = sample.text.partition(FENCE)[0]
                tokens[index] += sample.tokens
                # A server leaves the stop string out: "stop" is the fence, or the model ended.
                if sample.finish == "length":
                    notes[index].append("the reasoning budget ran out: the answer fence was forced")
        stepper = self.stepper(context)
        prefixes = [f"{thought}{FENCE}\n" for thought in thoughts]
        answers = stepper.decode(backend, [r.messages for r in requests], prefixes, seed=seed)
        seconds = (time.perf_counter() - started) / max(len(requests), 1)
        replies = []
        for index, answer in enumerate(answers):
            ending = CLOSE_FENCE if answer.ended == "model" else ""
            replies.append(
                Completion(
                    text=prefixes[index] + answer.text + ending,
                    answer=answer.text,
                    reasoning=thoughts[index],
                    constrained=True,
                    finish=answer.ended,
                    tokens=tokens[index] + answer.tokens,
                    seconds=seconds,
                    notes=notes[index],
                )
            )
        return replies, [answer.to_json() for answer in answers]

    def _proposal(
        self,
        context: Context,
        request: _Request,
        reply: Completion,
        step_log: dict | None,
        number: int,
        total: int,
        seed: int,
    ) -> Proposal | None:
        extra: dict = {
            "model": self.backend.name,
            "round": self.rounds,
            "reply": reply.to_json(),
            "constrained": reply.constrained,
            "seed": seed,
            "prompt": store_prompt(request.messages),
            **self.settings(),
        }
        if nest := self.nest(context):
            extra["nest"] = nest  # found by retrieval for ops like this one
        if step_log is not None:
            extra["steps"] = step_log
        if request.parent is not None:
            extra["parent"] = request.parent.id
        answer = reply.answer
        if answer is None and _is_schedlang(reply.text):  # a bare answer, with no fence
            answer = reply.text
        if answer is None:
            self.unanswered.append(reply)
            log.warning("reply %d of round %d has no schedlang answer", number, self.rounds)
            return None
        first = review(answer, context)
        final, repaired = first, None
        if not first.ok and self.repair and self.decoding != "stepwise":
            fix = repair_messages(request.messages, answer, first.diagnostics)
            grammar = self.grammar(context)
            extra["first_diagnostics"] = first.diagnostics
            try:
                [repaired] = self.backend.complete(fix, 1, grammar, seed=seed + number)
            except ContextTooLong as err:  # the answer and its diagnostics made it too long
                extra["repair_skipped"] = err.message
            else:
                extra["repair"] = repaired.to_json()
                if repaired.answer is not None:
                    final = review(repaired.answer, context)
                extra["repaired"] = final.ok
        extra["schedule_text"] = final.text
        extra["final_diagnostics"] = final.diagnostics
        state = "ok" if final.ok else "parsed" if final.parsed else "does not parse"
        note = f"model answer {number}/{total} of round {self.rounds}"
        note += f", editing #{request.parent.id}" if request.parent is not None else ""
        note += " (repaired)" if repaired is not None and final.ok else ""
        note += f": {state}" if not final.ok else ""
        return Proposal(final.text, self.name, note, extra)

    def _log_round(self, requests: Sequence[_Request], replies: Sequence[Completion]) -> None:
        if self.log_prompts is None:
            return
        folder = self.log_prompts / f"round-{self.rounds:03d}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for number, (request, reply) in enumerate(zip(requests, replies, strict=True), 1):
                prompt = "\n\n".join(f"## {m['role']}\n\n{m['content']}" for m in request.messages)
                (folder / f"prompt-{number}.md").write_text(prompt + "\n", encoding="utf-8")
                (folder / f"reply-{number}.json").write_text(
                    json.dumps(reply.to_json(), indent=1) + "\n", encoding="utf-8"
                )
        except OSError as err:
            raise SchedlangError(
                f"cannot write the prompt log in {folder}: {err.strerror or err}",
                "check --log-prompts",
            ) from None


def _shorter(chars: int) -> int:
    """The next, smaller budget of a history that did not fit: half, and none below 400."""
    return chars // 2 if chars > 400 else 0


def _fastest(history: Sequence[Record], n: int) -> list[Record]:
    """The `n` fastest measured schedules, one per schedule text, with a record id."""
    ok = sorted(
        (r for r in history if r.is_ok and r.median_s and r.id is not None and not is_baseline(r)),
        key=lambda r: r.median_s or 0.0,  # every one has a time: those without are left out
    )
    seen, kept = set(), []
    for record in ok:
        if record.schedule not in seen:
            seen.add(record.schedule)
            kept.append(record)
    return kept[:n]


def _is_schedlang(text: str) -> bool:
    from schedlang.lang.syntax import parse_with_diagnostics

    if not text.strip():
        return False
    schedule, diagnostics = parse_with_diagnostics(text, "<reply>")
    return schedule is not None and not any(d.is_error for d in diagnostics)
