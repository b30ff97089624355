"""The chat a model is asked with (schedlang.llm.proposer's prompt): the system prompt with the
schedlang reference generated from grammar/schedlang.lark and prompts/statements.txt; the op as
`schedlang show` prints it, the target's facts, the user's hint, example schedules for ops of the
same kind (prompts/examples/, and those retrieved from similar ops), the measured history; the
edit and repair requests; and a record's compressed copy of the prompt it was answered from.

    messages = build_messages(context, history, want="template")
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import describe, render_show
from schedlang.core.ops import Op
from schedlang.lang import nodes, statements
from schedlang.llm.backend import FENCE
from schedlang.llm.feedback import entry, is_baseline, render_history, without_comments
from schedlang.llm.grammar import Expr, LarkRules, literal_text, schedlang_grammar
from schedlang.propose.interface import Context, Proposal

if TYPE_CHECKING:
    from schedlang.store.records import Record


# --- prompt files ---------------------------------------------------------------------------------


def prompts_dir() -> Path:
    """prompts/ in a checkout; the packaged copy (`schedlang.prompts`) in an installed wheel."""
    in_checkout = Path(__file__).resolve().parents[2] / "prompts"
    if (in_checkout / "system.md").is_file():
        return in_checkout
    return Path(str(resources.files("schedlang.prompts")))


def read_prompt(name: str) -> str:
    return (prompts_dir() / name).read_text(encoding="utf-8")


# --- the schedlang reference, generated from the grammar ------------------------------------------

# How each NAME of a statement rule reads in the reference.
_NAME_WORDS = {
    "block_header": "BLOCK",
    **{rule: role.upper() for rule, role in statements.name_roles().items()},
    "param": "KNOB",
}
_TERMINAL_WORDS = {"THREAD": "THREAD", "SCOPE": "SCOPE", "PRAGMA_KEY": "KEY", "INT": "INT"}
_TERMINAL_WORDS["PAD_VALUE"] = "pad_value"  # transform_layout's option
_RULE_WORDS = {
    "axis": "AXIS",
    "factor": "FACTOR",
    "value": "VALUE",
    "alias": "NAME",
    "_choices": "CHOICES",
    "_index": "INDEX_EXPR",  # transform_layout's index expressions (recursive)
}


def statement_descriptions() -> dict[str, str]:
    """`block` and `param` from prompts/statements.txt; the other statements from the registry."""
    descriptions = {spec.keyword: spec.description for spec in statements.STATEMENTS}
    for line in read_prompt("statements.txt").splitlines():
        if line.strip() and not line.startswith("#"):
            keyword, _, text = line.partition(":")
            descriptions[keyword.strip()] = text.strip()
    return descriptions


def statement_syntax(grammar: LarkRules, rule: str) -> str:
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
        threads=", ".join(nodes.THREAD_AXES),
        scopes=", ".join(nodes.SCOPES),
        pragma_keys=", ".join(nodes.PRAGMA_KEYS),
    )


# --- examples -------------------------------------------------------------------------------------


def op_kind(op: Op) -> str:
    """matmul, conv, reduction or elementwise: which examples the model sees."""
    from schedlang.propose.analysis import analyse, conv_roles, matmul_roles

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
    parent: Record | None = None,
    history_chars: int = 6000,
    retrieved: Sequence[Proposal] = (),
    static_examples: bool = True,
) -> list[dict[str, str]]:
    """The chat for one answer. `want`: "template", "schedule" or None (either). `parent`: a
    measured record the model is asked to edit. The history (schedlang.llm.feedback) takes at most
    `history_chars` characters. `retrieved`: schedules moved from similar ops' best records
    (schedlang.llm.retrieval), shown before the static examples (none if `static_examples` is
    False)."""
    if want not in _WANTS:
        raise ValueError(f"want must be one of {list(_WANTS)}, not {want!r}")
    op, target = context.op, context.target
    shown = examples_for(op_kind(op), target.is_gpu)[:examples_shown] if static_examples else []
    example_text = "".join(
        f"\nExample ({point.extra.get('example', 'retrieved for a similar op')}):\n"
        f"```schedlang\n{point.text.strip()}\n```\n"
        for point in retrieved
    )
    example_text += "".join(
        f"\nExample ({example.title}):\n```schedlang\n{example.for_prompt}```\n"
        for example in shown
    )
    history_text = render_history(history, op=op, target=target, max_chars=history_chars)
    user = Template(read_prompt("task.md")).substitute(
        op=render_show(describe(op)),
        target=target.describe(),
        hint=f"\nHint from the user: {context.hint.strip()}\n" if context.hint else "",
        examples=example_text,
        history=f"\n{history_text}\n" if history_text else "",
        want=_WANTS[want],
    )
    if parent is not None:
        baseline = next((r for r in history if is_baseline(r)), None)
        measured = entry(parent, op=op, target=target, baseline=baseline, diagnostics=False)
        measured = "\n".join(itertools.takewhile(lambda line: line != FENCE, measured.splitlines()))
        user = (
            Template(read_prompt("edit.md")).substitute(
                parent=parent.id,
                schedule=without_comments(parent.schedule).strip(),
                measured=measured,
            )
            + "\n\n"
            + user.replace(f"Answer with one ```schedlang block{_WANTS[want]}.", "")
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


# --- a record's copy of its prompt ----------------------------------------------------------------


def store_prompt(messages: Sequence[dict[str, str]]) -> dict:
    """A record's copy of its prompt: compressed, with its hash (`stored_prompt` reads it)."""
    body = json.dumps(list(messages), ensure_ascii=False, sort_keys=True).encode()
    return {
        "sha256": hashlib.sha256(body).hexdigest(),
        "zlib_base64": base64.b64encode(zlib.compress(body, 9)).decode("ascii"),
    }


def stored_prompt(extra: dict) -> list[dict[str, str]] | None:
    """The prompt a model record was answered from, or None (not a model record)."""
    stored = extra.get("prompt")
    if not isinstance(stored, dict) or "zlib_base64" not in stored:
        return None
    return json.loads(zlib.decompress(base64.b64decode(stored["zlib_base64"])))
