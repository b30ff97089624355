"""The model proposer: a language model writes schedules, the checker reviews them.

Each `propose` call is one round:

    prompt     system prompt (prompts/system.md) with the schedlang reference generated from
               grammar/schedlang.lark and prompts/statements.txt; the op as `schedlang show`
               prints it; the target's facts; the user's hint; one or two example schedules for
               ops of the same kind on the same kind of target (prompts/examples/); the history:
               the fastest and the latest candidates with their GFLOP/s, and the checker's
               diagnostics for rejected ones.
    sample     k answers from the backend (schedlang.llm), constrained by the decoding grammar.
    review     each answer is parsed and checked (`schedlang.check.check`, knobs at their first
               values). An answer with a syntax error or a diagnostic gets one repair round: the
               model sees its answer and the rendered diagnostics, and writes it again.
    propose    every answer that was written, as a Proposal whose `extra` holds what the model
               produced (its text, its reasoning, the first answer's diagnostics, the repair), so
               the tuner's database keeps it for audit and replay.

A model's text is only ever parsed as schedlang: nothing it writes is executed.

    backend = TransformersBackend("path/to/VibeThinker-1.5B")
    proposer = ModelProposer(backend, candidates_per_round=4)
    tune(op, target, db, proposer=proposer)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.diagnostics import SchedlangError, render_all
from schedlang.llm import (
    Backend,
    Bounds,
    Completion,
    DecodingGrammar,
    Expr,
    LarkFile,
    OpNames,
    decoding_grammar,
    literal_text,
    schedlang_grammar,
)
from schedlang.ops import Op, describe, render_show
from schedlang.propose import Context, Proposal

if TYPE_CHECKING:
    from schedlang.db import Record

log = logging.getLogger(__name__)


# --- prompt files ---------------------------------------------------------------------------------


def prompts_dir() -> Path:
    """prompts/ in a checkout; the packaged copy (`schedlang.prompts`) in an installed wheel."""
    in_checkout = Path(__file__).resolve().parent.parent / "prompts"
    if (in_checkout / "system.md").is_file():
        return in_checkout
    return Path(str(resources.files("schedlang.prompts")))


def read_prompt(name: str) -> str:
    return (prompts_dir() / name).read_text(encoding="utf-8")


# --- the schedlang reference, generated from the grammar ------------------------------------------

# How each NAME of a statement rule reads in the reference.
_NAME_WORDS = {
    "block_header": "BLOCK",
    "cache_write": "BLOCK",
    "compute_at": "BLOCK",
    "reverse_compute_at": "BLOCK",
    "compute_inline": "BLOCK",
    "reverse_compute_inline": "BLOCK",
    "decompose_reduction": "BLOCK",
    "storage_align": "BLOCK",
    "cache_read": "BUFFER",
    "param": "KNOB",
}
_TERMINAL_WORDS = {"THREAD": "THREAD", "SCOPE": "SCOPE", "PRAGMA_KEY": "KEY", "INT": "INT"}
_RULE_WORDS = {
    "axis": "AXIS",
    "factor": "FACTOR",
    "value": "VALUE",
    "alias": "NAME",
    "_choices": "CHOICES",
}


def statement_descriptions() -> dict[str, str]:
    descriptions = {}
    for line in read_prompt("statements.txt").splitlines():
        if line.strip() and not line.startswith("#"):
            keyword, _, text = line.partition(":")
            descriptions[keyword.strip()] = text.strip()
    return descriptions


def statement_syntax(grammar: LarkFile, rule: str) -> str:
    """A statement's syntax as people read it: `split AXIS by FACTOR[, FACTOR …]`."""
    role = _NAME_WORDS.get(rule, "NAME")

    def render(expr: Expr) -> str:
        kind = expr[0]
        if kind == "lit":
            return literal_text(expr[1])
        if kind == "ref":
            name = expr[1]
            if name == "NAME":
                return role
            if name in _TERMINAL_WORDS or name in _RULE_WORDS:
                return _TERMINAL_WORDS.get(name) or _RULE_WORDS[name]
            if name in grammar.definitions and not name.isupper():
                return render(grammar.definitions[name])
            return name
        if kind == "alt":
            return " | ".join(render(option) for option in expr[1])
        if kind == "seq":
            return " ".join(render(item) for item in expr[1])
        _, item, low, high = expr
        inner = render(item)
        if high == 1:
            return f"[{inner}]" if low == 0 else inner
        more = f"[{inner} …]"
        return f"{inner} {more}" if low >= 1 else more

    text = render(grammar.definitions[rule])
    for before, after in ((" ,", ","), (" [,", "[,"), (" :", ":"), (" =", "="), ("= ", "=")):
        text = text.replace(before, after)
    return text


@cache
def schedlang_reference() -> str:
    """The language as the model reads it: every statement with its generated syntax and a line
    from prompts/statements.txt; then names, knobs and order (prompts/reference.md)."""
    grammar = schedlang_grammar()
    descriptions = statement_descriptions()
    lines = []
    for rule in grammar.statement_rules():
        syntax = statement_syntax(grammar, rule)
        keyword = syntax.split()[0]
        if keyword not in descriptions:
            raise SchedlangError(
                f"prompts/statements.txt has no line for `{keyword}`",
                "every statement of grammar/schedlang.lark needs one",
            )
        lines.append(f"- `{syntax}` — {descriptions[keyword]}")
    return Template(read_prompt("reference.md")).substitute(
        statements="\n".join(lines),
        threads=", ".join(ast.THREAD_AXES),
        scopes=", ".join(ast.SCOPES),
        pragma_keys=", ".join(ast.PRAGMA_KEYS),
    )


# --- examples -------------------------------------------------------------------------------------


def op_kind(op: Op) -> str:
    """matmul, conv, reduction or elementwise: which examples the model sees."""
    from schedlang.propose import analyse, conv_roles, matmul_roles

    view = analyse(op)
    if view is None:
        return "elementwise"
    main = [b for b in view.blocks if b.reduce]
    if len(main) == 1 and matmul_roles(main[0]):
        return "matmul"
    if len(main) == 1 and conv_roles(view, main[0]):
        return "conv"
    return "reduction" if main else "elementwise"


@dataclass(frozen=True)
class Example:
    name: str  # "matmul-cpu"
    text: str  # the schedule, its comment lines describing the op first

    @property
    def title(self) -> str:
        kind, _, device = self.name.partition("-")
        return f"{kind} on a {device.upper()}"

    @property
    def for_prompt(self) -> str:
        lines = [line for line in self.text.splitlines() if not line.startswith("# op:")]
        return "\n".join(lines).strip() + "\n"


def examples() -> list[Example]:
    folder = prompts_dir() / "examples"
    return [
        Example(path.stem, path.read_text(encoding="utf-8"))
        for path in sorted(folder.glob("*.sched"))
    ]


def examples_for(kind: str, gpu: bool) -> list[Example]:
    """The example for this kind of op on this kind of target; with a matmul example too for other
    kinds, as the fullest illustration of the language."""
    device = "gpu" if gpu else "cpu"
    by_name = {example.name: example for example in examples()}
    names = dict.fromkeys([f"{kind}-{device}", f"matmul-{device}"])
    return [by_name[name] for name in names if name in by_name]


# --- history --------------------------------------------------------------------------------------


def render_history(records: Sequence[Record], best: int = 3, latest: int = 3) -> str:
    """The fastest and the latest candidates, compactly: GFLOP/s, or why they failed (with the
    checker's diagnostics, trimmed)."""
    if not records:
        return ""
    ok = sorted((r for r in records if r.is_ok), key=lambda r: -(r.gflops or 0.0))[:best]
    shown = {id(r) for r in ok}
    recent = [r for r in reversed(records) if id(r) not in shown][:latest]
    parts = [f"So far {len(records)} candidates were measured, {sum(r.is_ok for r in records)} ok."]
    if ok:
        parts.append("The fastest:")
        parts += [_render_record(r) for r in ok]
    if recent:
        parts.append("The latest others:")
        parts += [_render_record(r) for r in recent]
    parts.append("Write a schedule that is faster than these, different from all of them.")
    return "\n".join(parts)


def _render_record(record: Record) -> str:
    if record.is_ok:
        head = f"{record.gflops or 0.0:.2f} GFLOP/s"
    else:
        head = f"{record.status}: {record.reason}"
    lines = [line for line in record.schedule.splitlines() if not line.lstrip().startswith("#")]
    text = f"- {head}\n```schedlang\n" + "\n".join(lines).strip() + "\n```"
    diagnostics = record.extra.get("diagnostics") if not record.is_ok else None
    if diagnostics:
        kept = diagnostics.strip().splitlines()
        text += "\n" + "\n".join(kept[:12]) + ("\n…" if len(kept) > 12 else "")
    return text


# --- messages -------------------------------------------------------------------------------------


_WANTS = {
    None: "",
    "template": " holding a template: knobs declared with `param`",
    "schedule": " holding a concrete schedule, without `param`",
}


def build_messages(
    context: Context,
    history: Sequence[Record] = (),
    *,
    examples_shown: int = 2,
    want: str | None = None,
) -> list[dict[str, str]]:
    """The chat for one round. `want`: "template", "schedule" or None (either)."""
    if want not in _WANTS:
        raise ValueError(f"want must be one of {list(_WANTS)}, not {want!r}")
    op, target = context.op, context.target
    shown = examples_for(op_kind(op), target.is_gpu)[:examples_shown]
    example_text = "".join(
        f"\nExample ({example.title}):\n```schedlang\n{example.for_prompt}```\n"
        for example in shown
    )
    history_text = render_history(history)
    user = Template(read_prompt("task.md")).substitute(
        op=render_show(describe(op)),
        target=target.describe(),
        hint=f"\nHint from the user: {context.hint.strip()}\n" if context.hint else "",
        examples=example_text,
        history=f"\n{history_text}\n" if history_text else "",
        want=_WANTS[want],
    )
    system = Template(read_prompt("system.md")).substitute(reference=schedlang_reference())
    return [
        {"role": "system", "content": system.strip()},
        {"role": "user", "content": user.strip()},
    ]


def repair_messages(
    messages: Sequence[dict[str, str]], answer: str, diagnostics: str
) -> list[dict[str, str]]:
    """The chat so far, the model's answer (without its reasoning), and the diagnostics."""
    request = Template(read_prompt("repair.md")).substitute(diagnostics=diagnostics.strip())
    return [
        *messages,
        {"role": "assistant", "content": f"```schedlang\n{answer.strip()}\n```"},
        {"role": "user", "content": request.strip()},
    ]


# --- reviewing an answer --------------------------------------------------------------------------


@dataclass(frozen=True)
class Review:
    text: str  # the schedule text (canonical when it parsed)
    parsed: bool
    ok: bool  # parsed and checked without error
    diagnostics: str  # rendered; "" when there is nothing to say


def review(answer: str, context: Context) -> Review:
    """Parse and check a model's answer; never executes it."""
    from schedlang.check import check
    from schedlang.printer import format_schedule
    from schedlang.syntax import parse_with_diagnostics

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


class ModelProposer:
    """Schedules written by a language model (see the module's docstring).

    `constrain`: sample answers under the decoding grammar (schedlang.llm.decoding_grammar);
    `per_op`: narrow it to the op's names; `bounds`: make it finite (for models that do not stop
    by themselves, such as random weights in tests).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        candidates_per_round: int = 4,
        hint: str | None = None,
        constrain: bool = True,
        per_op: bool = True,
        bounds: Bounds | None = None,
        repair: bool = True,
        want: str | None = None,
        seed: int = 0,
    ):
        self.backend = backend
        self.name = f"model:{backend.name}"
        self.candidates_per_round = max(1, candidates_per_round)
        self.hint = hint
        self.constrain = constrain
        self.per_op = per_op
        self.bounds = bounds
        self.repair = repair
        self.want = want
        self.seed = seed
        self.rounds = 0
        self.unanswered: list[Completion] = []  # replies with no schedlang in them
        self._grammars: dict[str, DecodingGrammar] = {}
        self._returned: set[tuple[str, str]] = set()

    def grammar(self, context: Context) -> DecodingGrammar | None:
        if not self.constrain:
            return None
        key = context.op.func.script() if self.per_op else ""
        if key not in self._grammars:
            names = OpNames.of(context.op) if self.per_op else None
            self._grammars[key] = decoding_grammar(names, self.bounds)
        return self._grammars[key]

    def propose(self, context: Context, history: Sequence[Record], count: int) -> list[Proposal]:
        from schedlang.db import op_key

        if count <= 0:
            return []
        if self.hint and not context.hint:
            context = Context(context.op, context.target, self.hint)
        self.rounds += 1
        messages = build_messages(context, history, want=self.want)
        grammar = self.grammar(context)
        wanted = min(count, self.candidates_per_round)
        replies = self.backend.complete(messages, wanted, grammar, seed=self._seed())
        proposals = []
        for number, reply in enumerate(replies, 1):
            proposal = self._proposal(context, messages, grammar, reply, number, len(replies))
            if proposal is None:
                continue
            key = (op_key(context.op.func), context.target.key, proposal.text)
            if key in self._returned:
                continue
            self._returned.add(key)
            proposals.append(proposal)
        log.info("round %d: %d proposals, %d replies", self.rounds, len(proposals), len(replies))
        return proposals

    def _seed(self) -> int:
        return self.seed * 1_000_003 + self.rounds

    def _proposal(
        self,
        context: Context,
        messages: list[dict[str, str]],
        grammar: DecodingGrammar | None,
        reply: Completion,
        number: int,
        total: int,
    ) -> Proposal | None:
        extra: dict = {
            "model": self.backend.name,
            "round": self.rounds,
            "reply": reply.to_json(),
            "constrained": grammar is not None,
        }
        answer = reply.answer
        if answer is None and _is_schedlang(reply.text):  # a bare answer, with no fence
            answer = reply.text
        if answer is None:
            self.unanswered.append(reply)
            log.warning("reply %d of round %d has no schedlang answer", number, self.rounds)
            return None
        first = review(answer, context)
        final, repaired = first, None
        if not first.ok and self.repair:
            fix = repair_messages(messages, answer, first.diagnostics)
            [repaired] = self.backend.complete(fix, 1, grammar, seed=self._seed() + number)
            extra["first_diagnostics"] = first.diagnostics
            extra["repair"] = repaired.to_json()
            if repaired.answer is not None:
                final = review(repaired.answer, context)
            extra["repaired"] = final.ok
        extra["schedule_text"] = final.text
        extra["final_diagnostics"] = final.diagnostics
        state = "ok" if final.ok else "parsed" if final.parsed else "does not parse"
        note = f"model answer {number}/{total} of round {self.rounds}"
        note += " (repaired)" if repaired is not None and final.ok else ""
        note += f": {state}" if not final.ok else ""
        return Proposal(final.text, self.name, note, extra)


def _is_schedlang(text: str) -> bool:
    from schedlang.syntax import parse_with_diagnostics

    if not text.strip():
        return False
    schedule, diagnostics = parse_with_diagnostics(text, "<reply>")
    return schedule is not None and not any(d.is_error for d in diagnostics)
