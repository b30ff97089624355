"""Language models that write schedlang: decoding grammars, constrained sampling, backends.

Three parts, each usable on its own:

    decoding grammar  grammar/schedlang.lark rewritten for llguidance (`decoding_grammar`): the
                      parser's language with the whitespace made explicit (so a keyword can never
                      run into a name: the parser rejects `unrollk`, llguidance's lexer would not),
                      statements that the parser's own validation rejects left out (a tile with
                      more axes than factors, two `*` in a split, `pow2(8, 6)`), and optionally
                      bounded (a finite language: a random-weight model must finish) and narrowed
                      to one op's block, buffer and axis names.
    backends          `TransformersBackend` (local weights, llguidance masks applied to the logits
                      through a numpy bitmask) and `OpenAIBackend` (an OpenAI-compatible HTTP
                      server: vLLM, SGLang, llama.cpp, Ollama; the grammar goes along as a
                      structured-output constraint where the server takes one).
    answers           `extract_answer`: the schedlang text in a model's reply (the last
                      ```schedlang fence). A reply is only ever parsed as schedlang, never run.

A reasoning model thinks in free text first. Locally that is two phases: the reasoning is sampled
unconstrained until the model opens a ```schedlang fence (or its budget runs out, and the fence is
written for it), then the answer is sampled under the grammar up to the closing fence. Over HTTP
the grammar itself starts with a lazy free-text part that ends at the fence.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import logging
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.lang import nodes, statements
from schedlang.lang.syntax import grammar_text

if TYPE_CHECKING:
    from schedlang.core.ops import Op

log = logging.getLogger(__name__)

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


# --- the grammar file as data ---------------------------------------------------------------------

# A Lark expression: ("alt", [seq, ...]), ("seq", [item, ...]), ("rep", item, low, high|None),
# ("lit", '"text"'), ("re", "/regex/"), ("ref", name).
Expr = tuple

_LARK_TOKEN = re.compile(
    r'(?P<lit>"(?:\\.|[^"\\])*"i?)|(?P<re>/(?:\\.|[^/\\\n])+/[imslux]*)|(?P<name>[_A-Za-z]\w*)'
    r"|(?P<op>[()|*+?\[\]~]|\.\.)|(?P<num>\d+)|(?P<ws>\s+)|(?P<comment>//[^\n]*)"
)


def _lark_tokens(text: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(text):
        match = _LARK_TOKEN.match(text, position)
        if match is None:
            raise ValueError(f"unexpected {text[position : position + 20]!r} in the grammar")
        position = match.end()
        if match.lastgroup not in ("ws", "comment"):
            tokens.append((match.lastgroup, match.group()))
    return tokens


class _ExprParser:
    """Lark's expression syntax: alternatives, sequences, groups, `?` `*` `+` `[...]` `~n..m`."""

    def __init__(self, text: str):
        self.tokens = _lark_tokens(text)
        self.index = 0

    def parse(self) -> Expr:
        expr = self.alternatives()
        if self.index != len(self.tokens):
            raise ValueError(f"unexpected {self.tokens[self.index][1]!r} in the grammar")
        return expr

    def peek(self) -> str | None:
        return self.tokens[self.index][1] if self.index < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        self.index += 1
        return self.tokens[self.index - 1]

    def alternatives(self) -> Expr:
        options = [self.sequence()]
        while self.peek() == "|":
            self.take()
            options.append(self.sequence())
        return options[0] if len(options) == 1 else ("alt", options)

    def sequence(self) -> Expr:
        items = []
        while self.peek() not in (None, "|", ")", "]"):
            items.append(self.item())
        return items[0] if len(items) == 1 else ("seq", items)

    def item(self) -> Expr:
        kind, text = self.take()
        if text == "(":
            atom = self.alternatives()
            self.take()  # ")"
        elif text == "[":
            atom = ("rep", self.alternatives(), 0, 1)
            self.take()  # "]"
        elif kind in ("lit", "re"):
            atom = (kind, text)
        elif kind == "name":
            atom = ("ref", text)
        else:
            raise ValueError(f"unexpected {text!r} in the grammar")
        while self.peek() in ("?", "*", "+", "~"):
            op = self.take()[1]
            if op == "~":
                low = int(self.take()[1])
                high = low
                if self.peek() == "..":
                    self.take()
                    high = int(self.take()[1])
                atom = ("rep", atom, low, high)
            else:
                atom = ("rep", atom, *{"?": (0, 1), "*": (0, None), "+": (1, None)}[op])
        return atom


@dataclass(frozen=True)
class LarkFile:
    """The rules and terminals of a Lark grammar, by name, as expressions; `%` directives apart."""

    definitions: dict[str, Expr]
    sources: dict[str, str]  # the text of each definition, whitespace collapsed
    directives: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> LarkFile:
        chunks: dict[str, list[str]] = {}
        directives, current = [], None
        for line in text.splitlines():
            stripped = line.strip()
            if not stripped or stripped.startswith("//"):
                continue
            if stripped.startswith("%"):
                directives.append(stripped)
                current = None
            elif line[0].isspace() and current is not None:
                chunks[current].append(stripped)
            else:
                name, _, body = line.partition(":")
                current = name.strip()
                chunks[current] = [body.strip()]
        sources = {name: " ".join(" ".join(parts).split()) for name, parts in chunks.items()}
        definitions = {name: _ExprParser(body).parse() for name, body in sources.items()}
        return cls(definitions, sources, tuple(directives))

    def rules(self) -> list[str]:
        return [name for name in self.definitions if not _is_terminal(name)]

    def statement_rules(self) -> list[str]:
        """The rules `_stmt` lists, in order, and `block_header`."""
        stmt = self.definitions["_stmt"]
        options = stmt[1] if stmt[0] == "alt" else [stmt]
        return ["block_header"] + [option[1] for option in options if option[0] == "ref"]


def _is_terminal(name: str) -> bool:
    return name.lstrip("_").isupper()


def schedlang_grammar() -> LarkFile:
    return LarkFile.parse(grammar_text())


def literal_text(literal: str) -> str:
    """The text a Lark string literal stands for."""
    return json.loads(literal.rstrip("i"))


# --- the grammar used for decoding ----------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """Limits that make the decoding grammar's language finite: a model that never chooses to
    stop (random weights do not) still ends its answer."""

    statements: int = 8  # items of the schedule: statements, block headers, empty lines
    repeats: int = 3  # any other repetition: axes of a reorder, factors of a split, list values
    name_length: int = 8
    axis_parts: int = 3  # `.o`, `.i`, `.0` suffixes of one axis name
    digits: int = 3
    # Knobs are declared first, each at most once, with these names in this order: the parser
    # rejects a knob declared twice, which a grammar cannot otherwise rule out.
    knobs: tuple[str, ...] = ("TI", "TJ", "KU")


@dataclass(frozen=True)
class OpNames:
    """The names a schedule of one op may use: blocks it has or creates, buffers, loop names."""

    blocks: tuple[str, ...]
    buffers: tuple[str, ...]
    loops: tuple[str, ...]
    aliases: tuple[str, ...] = ("ij", "f", "fused", "tiles", "tasks", "nh", "outer", "inner")

    @classmethod
    def of(cls, op: Op) -> OpNames:
        from schedlang.core.opinfo import describe

        info = describe(op)
        blocks = [b.name for b in info.blocks]
        buffers = [b.name for b in info.buffers]
        scopes = [scope.replace(".", "_") for scope in nodes.SCOPES]
        created = [f"{name}_{scope}" for name in [*buffers, *blocks] for scope in scopes]
        created += [f"{b}_{suffix}" for b in blocks for suffix in ("rf", "init")]
        loops = [loop.var for b in info.blocks for loop in b.loops]
        # TVM's names for the loops it makes: copy loops `ax0`…, rfactor parts `k_0`…, init loops.
        loops += [f"ax{n}" for n in range(4)]
        loops += [f"{var}_{n}" for var in dict.fromkeys(loops[:]) for n in range(3)]
        aliases = cls.aliases
        return cls(
            _unique([*blocks, *created, *aliases]),
            _unique(buffers),
            _unique([*loops, *aliases]),
        )


def _unique(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


# How the decoding grammar reads each rule of grammar/schedlang.lark that it changes, as the file
# wrote it when the change was made: if the file's rule differs, the file's rule is used as it is
# (and `DecodingGrammar.stale` says so) rather than a change that no longer fits it.
_ORIGINAL = {
    "tile": '"tile" axis ("," axis)+ "by" factor ("x" factor)+',
    "split": '"split" axis "by" factor ("," factor)*',
    "choice_list": '"[" INT ("," INT)* "]"',
    "choice_pow2": '"pow2" "(" INT "," INT ")"',
    "choice_range": '"range" "(" INT "," INT ("," INT)? ")"',
    "pragma": '"pragma" axis pragma_item ("," pragma_item)*',
}
# Which kind of name each rule's NAME is: per-op grammars admit only that op's names there.
_NAME_ROLES = {
    "block_header": "BLOCK_NAME",
    # Each statement's, from the registry: cache_read's is a buffer, compute_at's a block, ….
    **{rule: f"{role.upper()}_NAME" for rule, role in statements.name_roles().items()},
    "alias": "ALIAS_NAME",
    "param": "KNOB_NAME",
    "value": "KNOB_NAME",
    "_factor": "KNOB_NAME",
    "_xfactor": "KNOB_NAME",
}
# Whether each terminal can start / end with a letter, digit or `_`: two such tokens need a space
# between them. A terminal not listed is assumed to (a space is then required: never wrong).
_WORDY = {
    "SIGNED_INT": (False, True),
    "STAR": (False, False),
    "_SEP": (False, False),
    "_W": (False, False),
}
_MAX_TILE_AXES = 6
_MAX_POW2 = 16


@dataclass(frozen=True)
class DecodingGrammar:
    """The schedlang grammar as llguidance reads it, for one op (or any op)."""

    rules: str  # Lark text defining `schedule` and everything it uses, no `start`
    bounded: bool
    stale: tuple[str, ...] = ()  # changed rules of the file that the derivation left as they are

    def lark(self, frame: str = "fenced") -> str:
        """The grammar with a `start` rule: `answer` is what follows ```schedlang up to and with
        the closing fence; `fenced` starts with the fence; `reasoning` allows free text first."""
        answer = 'schedule _W? "```"'
        starts = {
            "answer": f'start: "\\n" _W? {answer}',
            "fenced": f'start: "```schedlang\\n" _W? {answer}',
            "reasoning": f'start: _reasoning "\\n" _W? {answer}\n'
            "_reasoning[lazy]: /(?s:.*)```schedlang/",
        }
        if frame not in starts:
            raise ValueError(f"unknown frame {frame!r}: one of {', '.join(starts)}")
        return f"%llguidance {{}}\n{starts[frame]}\n{self.rules}"


# Storage scopes a CPU target takes (the checker: shared, shared.dyn and warp need a GPU).
CPU_SCOPES = ("global", "local")


def decoding_grammar(
    names: OpNames | None = None, bounds: Bounds | None = None, *, gpu: bool | None = None
) -> DecodingGrammar:
    """grammar/schedlang.lark rewritten for constrained decoding (see the module's docstring).
    `gpu=False` leaves out what only a GPU takes (`bind`, GPU storage scopes)."""
    source = schedlang_grammar()
    definitions = dict(source.definitions)
    if gpu is False:
        stmt = definitions["_stmt"]
        definitions["_stmt"] = ("alt", [o for o in stmt[1] if o != ("ref", "bind")])
        definitions["SCOPE"] = ("re", f"/{_choice(CPU_SCOPES)}/")
    stale = []
    overrides = _overrides(bounds)
    for name, text in overrides.items():
        if name in _ORIGINAL and source.sources.get(name) != _ORIGINAL[name]:
            stale.append(name)
            log.warning("grammar rule %s changed: decoding uses it as the file has it", name)
            continue
        definitions[name] = _ExprParser(text).parse()
    if bounds is not None:
        # Knobs first, each name once: see Bounds.knobs.
        stmt = definitions["_stmt"]
        definitions["_stmt"] = ("alt", [o for o in stmt[1] if o != ("ref", "param")])
        knobs = []
        for n, knob in enumerate(bounds.knobs):
            definitions[f"_param{n}"] = _ExprParser(f'"param" "{knob}" "in" _choices').parse()
            knobs.append(_ExprParser(f"(_param{n} _SEP)?").parse())
        definitions["start"] = ("seq", [*knobs, definitions["start"]])
    for rule, role in _NAME_ROLES.items():
        if rule in definitions:
            definitions[rule] = _rename(definitions[rule], "NAME", role)
    definitions["schedule"] = definitions.pop("start")
    definitions.update(_terminals(source, names, bounds))
    rules = _Emitter(definitions, bounds).emit("schedule")
    return DecodingGrammar(rules, bounds is not None, tuple(stale))


def _overrides(bounds: Bounds | None) -> dict[str, str]:
    """Rules rewritten so that what the parser's validation rejects cannot be written."""
    tile_axes = min(_MAX_TILE_AXES, bounds.repeats + 1) if bounds else _MAX_TILE_AXES
    tiles = [
        " ".join(['"tile" axis', *['"," axis'] * (n - 1), '"by"', *['_xfactor "x"'] * (n - 1)])
        + " _factor"
        for n in range(2, tile_axes + 1)
    ]
    top = 10 if bounds else _MAX_POW2
    powers = [2**n for n in range(top + 1)]
    pairs = itertools.combinations_with_replacement(powers, 2)
    pow2_pairs = [f'"{low}" "," "{high}"' for low, high in pairs]
    if bounds:
        values = [2**n for n in range(8)]
        pairs = itertools.combinations_with_replacement(values, 2)
        range_pair = " | ".join(f'"{low}" "," "{high}"' for low, high in pairs)
    else:
        range_pair = 'POS "," POS'
    pragma_items = [
        ' "," '.join(f'"{key}" "=" value' for key in keys)
        for count in range(1, len(nodes.PRAGMA_KEYS) + 1)
        for keys in itertools.permutations(nodes.PRAGMA_KEYS, count)
    ]
    return {
        "tile": " | ".join(tiles),
        # One factor, or several with at most one `*`.
        "split": '"split" axis "by" (_factor | _factors)',
        "_factors": '_factor ("," _factor)+ | STAR ("," _factor)+ '
        '| _factor ("," _factor)* "," STAR ("," _factor)*',
        "_factor": "POS | NAME",
        # A factor before the `x` of a tile: a name needs a space before it (`TI x 32`; `TIx32`
        # is one name), a number does not (`32x32`).
        "_xfactor": "POS | NAME _W",
        "choice_list": '"[" POS ("," POS)* "]"',
        "choice_pow2": f'"pow2" "(" ({" | ".join(pow2_pairs)}) ")"',
        "choice_range": f'"range" "(" ({range_pair}) ("," POS)? ")"',
        "pragma": f'"pragma" axis ({" | ".join(pragma_items)})',
    }


def _rename(expr: Expr, old: str, new: str) -> Expr:
    if expr == ("ref", old):
        return ("ref", new)
    if expr[0] in ("alt", "seq"):
        return (expr[0], [_rename(child, old, new) for child in expr[1]])
    if expr[0] == "rep":
        return ("rep", _rename(expr[1], old, new), expr[2], expr[3])
    return expr


def _choice(words: Sequence[str]) -> str:
    return "(?:" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + ")"


def _terminals(source: LarkFile, names: OpNames | None, bounds: Bounds | None) -> dict[str, Expr]:
    name = source.sources["NAME"][1:-1]
    axis = source.sources["AXIS"][1:-1]
    integer = "[0-9]+"
    positive = "[1-9][0-9]*"
    space = "[ \\t]+"
    separator = "(?:#[^\\n]{0,160})?\\n|;"  # a comment only ends a line, and is short
    if bounds:
        name = f"[A-Za-z_][A-Za-z0-9_]{{0,{bounds.name_length - 1}}}"
        axis = f"{name}(?:\\.[A-Za-z0-9_]{{1,2}}){{0,{bounds.axis_parts}}}"
        integer = f"[0-9]{{1,{bounds.digits}}}"
        positive = f"[1-9][0-9]{{0,{bounds.digits - 1}}}"
        space = " {1,2}"
        separator = "[;\\n]"
    roles = dict.fromkeys(["BLOCK_NAME", "BUFFER_NAME", "ALIAS_NAME", "KNOB_NAME"], name)
    if bounds:
        roles["KNOB_NAME"] = _choice(bounds.knobs)
    if names:
        roles["BLOCK_NAME"] = _choice(names.blocks)
        roles["BUFFER_NAME"] = _choice([*names.buffers, *names.blocks])
        roles["ALIAS_NAME"] = _choice(names.aliases)
        part = "\\.(?:o|i|[0-9])"
        parts = f"(?:{part}){{0,{bounds.axis_parts}}}" if bounds else f"(?:{part})*"
        one = f"{_choice(names.loops)}{parts}"
        joins = "{0,2}" if bounds else "*"
        axis = f"{one}(?:_{one}){joins}"
    found = {
        "NAME": name,
        "AXIS": axis,
        "INT": integer,
        "POS": positive,
        "_W": space,
        "_SEP": separator,
        **roles,
    }
    if bounds:
        # transform_layout's indices and tensorize's intrinsic: names of bounded length too.
        found.update(INDEX_VAR=name, INDEX_NAME=name, INTRIN=f"[a-z][a-z0-9_]{{0,{47}}}")
    return {key: ("re", f"/{value}/") for key, value in found.items()}


class _Emitter:
    """Writes the rules reachable from one rule as Lark text, with the whitespace explicit: `_W`
    (required) between two tokens that would otherwise run together, `_W?` elsewhere."""

    def __init__(self, definitions: dict[str, Expr], bounds: Bounds | None):
        self.definitions = definitions
        self.bounds = bounds
        self.edge_cache: dict[str, tuple[frozenset, frozenset, bool]] = {}

    def emit(self, root: str) -> str:
        order, seen, todo = [], set(), [root]
        while todo:
            name = todo.pop(0)
            if name in seen:
                continue
            seen.add(name)
            order.append(name)
            todo += [ref for ref in _refs(self.definitions[name]) if ref not in seen]
        lines = []
        for name in order:
            expr = self.definitions[name]
            body = expr[1] if expr[0] == "re" else self.expr(expr, top=name == root)
            lines.append(f"{name}: {body}")
        return "\n".join(lines) + "\n"

    # Each token's first and last characters: wordy (True) or not (False); and whether it is
    # empty-able.
    def edges(self, expr: Expr) -> tuple[frozenset, frozenset, bool]:
        kind = expr[0]
        if kind == "lit":
            text = literal_text(expr[1])
            if text == "x":  # `32x32`: the parser lets `x` touch its factors
                return frozenset({False}), frozenset({False}), False
            first, last = text[:1], text[-1:]
            return frozenset({_wordy(first)}), frozenset({_wordy(last)}), text == ""
        if kind == "re":
            return frozenset({True}), frozenset({True}), False
        if kind == "ref":
            name = expr[1]
            if _is_terminal(name) and self.definitions.get(name, ("re",))[0] == "re":
                first, last = _WORDY.get(name, (True, True))
                return frozenset({first}), frozenset({last}), False
            if name not in self.edge_cache:
                self.edge_cache[name] = (frozenset({True, False}), frozenset({True, False}), True)
                self.edge_cache[name] = self.edges(self.definitions[name])
            return self.edge_cache[name]
        if kind == "rep":
            first, last, nullable = self.edges(expr[1])
            return first, last, nullable or expr[2] == 0
        if kind == "alt":
            parts = [self.edges(option) for option in expr[1]]
            return (
                frozenset().union(*(p[0] for p in parts)),
                frozenset().union(*(p[1] for p in parts)),
                any(p[2] for p in parts),
            )
        # seq
        first: frozenset = frozenset()
        for item in expr[1]:
            item_first, _, nullable = self.edges(item)
            first |= item_first
            if not nullable:
                break
        last: frozenset = frozenset()
        for item in reversed(expr[1]):
            _, item_last, nullable = self.edges(item)
            last |= item_last
            if not nullable:
                break
        return first, last, all(self.edges(item)[2] for item in expr[1])

    def separator(self, left: frozenset, right: frozenset) -> str:
        return "_W" if True in left and True in right else "_W?"

    def expr(self, expr: Expr, top: bool = False) -> str:
        kind = expr[0]
        if kind in ("lit", "re"):
            return expr[1]
        if kind == "ref":
            return expr[1]
        if kind == "alt":
            return " | ".join(self.expr(option) for option in expr[1])
        if kind == "rep":
            return self.repeat(expr, None, top)
        items, parts = expr[1], []
        before: frozenset = frozenset()
        for index, item in enumerate(items):
            first, last, nullable = self.edges(item)
            sep = self.separator(before, first) if index else None
            if item[0] == "rep":
                parts.append(self.repeat(item, sep, top))
            else:
                if nullable:
                    raise ValueError(f"cannot place the whitespace around {item}: it may be empty")
                parts.append(f"{sep} {self.atom(item)}" if sep else self.atom(item))
            before = last | before if nullable else last
        return " ".join(parts)

    def atom(self, expr: Expr) -> str:
        text = self.expr(expr)
        return f"({text})" if expr[0] in ("alt", "seq") else text

    def repeat(self, expr: Expr, sep: str | None, top: bool) -> str:
        _, item, low, high = expr
        if high is None and self.bounds is not None:
            high = self.bounds.statements if top else self.bounds.repeats
        first, last, _ = self.edges(item)
        inner = self.atom(item)
        head = f"{sep} {inner}" if sep else inner
        if high == 1:
            return f"({head})?" if low == 0 else f"({head})"
        again = f"({self.separator(last, first)} {inner})"
        more_low = max(low - 1, 0)
        if high is None:
            again += "*" if more_low == 0 else f"{{{more_low},}}"
        else:
            again += f"{{{more_low},{high - 1}}}"
        whole = f"{head} {again}"
        return f"({whole})?" if low == 0 else whole


def _wordy(char: str) -> bool:
    return bool(char) and (char.isalnum() or char == "_")


def _refs(expr: Expr) -> list[str]:
    if expr[0] == "ref":
        return [expr[1]]
    if expr[0] in ("alt", "seq"):
        return [ref for child in expr[1] for ref in _refs(child)]
    if expr[0] == "rep":
        return _refs(expr[1])
    return []


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
        return {
            "text": self.text,
            "answer": self.answer,
            "reasoning": self.reasoning,
            "constrained": self.constrained,
            "finish": self.finish,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
        }


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


class Backend(Protocol):
    name: str  # the model, as records name it: "model:<name>"

    def complete(
        self,
        messages: Sequence[dict[str, str]],
        count: int,
        grammar: DecodingGrammar | None = None,
        seed: int | None = None,
    ) -> list[Completion]:
        """`count` replies to a chat; each answer constrained by `grammar` when given."""
        ...

    def continue_batch(self, rows: Sequence[Continuation], seed: int | None = None) -> list[Sample]:
        """Each row's continuation, in order (one batched call where the backend can)."""
        ...


# --- constrained sampling with transformers -------------------------------------------------------


def _require_llm_packages() -> None:
    if "torch" in sys.modules and sys.modules["torch"] is None:
        del sys.modules["torch"]  # blocked by cli.main until a model is wanted
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


class TransformersBackend:
    """A model run in this process with transformers: a hub id (looked up in the local cache
    first) or a folder holding the weights and tokenizer.

    `think`: let the model reason in free text before its ```schedlang answer (a reasoning model
    like VibeThinker needs this); the reasoning gets `max_new_tokens - answer_tokens` tokens, the
    answer `answer_tokens`. Without it the reply starts with the fence.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str | None = None,
        dtype: str | None = None,
        temperature: float = DEFAULT_TEMPERATURE,
        top_p: float = DEFAULT_TOP_P,
        max_new_tokens: int | None = None,
        answer_tokens: int | None = None,
        think: bool = True,
        download: bool = True,
    ):
        _require_llm_packages()
        import torch

        self.model_id = model
        self.name = Path(model).name if Path(model).expanduser().is_dir() else model
        self.temperature = temperature
        self.top_p = top_p
        self.think = think
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        # A reasoning budget that fits the device: thousands of tokens on a GPU; on a CPU a
        # 1.5B model writes about one token a second, so a few hundred.
        on_gpu = not self.device.startswith("cpu")
        default_tokens, default_answer = (
            (GPU_MAX_NEW_TOKENS, 1024) if on_gpu else (CPU_MAX_NEW_TOKENS, 256)
        )
        self.max_new_tokens = max_new_tokens or default_tokens
        self.answer_tokens = min(answer_tokens or default_answer, self.max_new_tokens)
        if dtype is None:
            cuda = self.device.startswith("cuda")
            dtype = "bfloat16" if cuda and torch.cuda.is_bf16_supported() else "float32"
            dtype = "float16" if cuda and dtype == "float32" else dtype
        self.dtype = dtype
        self.tokenizer, self.model = _load(model, self.device, getattr(torch, dtype), download)
        self.vocab_size = int(self.model.config.vocab_size)
        self.eos = _eos_ids(self.tokenizer, self.model)
        self._lltokenizer = None
        self._prototypes: dict[str, Any] = {}
        self._prompt_cache: dict[str, tuple[list[int], Any]] = {}

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False
        )

    def complete(
        self,
        messages: Sequence[dict[str, str]],
        count: int,
        grammar: DecodingGrammar | None = None,
        seed: int | None = None,
    ) -> list[Completion]:
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
        budget = max(self.max_new_tokens - self.answer_tokens, 0)
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
        reasoning = self.max_new_tokens - self.answer_tokens if self.think else 0
        most = reasoning + statements * step_tokens
        return (
            f"model {self.name} on {self.device}: {rate:.1f} tokens/s here; an answer takes up "
            f"to {most} tokens ({reasoning} reasoning, {statements} statements): about "
            f"{_duration(most / rate)} at most"
        )

    def context_length(self) -> int | None:
        """How many tokens the model attends to (prompt and reply together), if it says."""
        config = self.model.config
        value = getattr(config, "max_position_embeddings", None)
        return int(value) if value else None

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(
        self,
        prompts: Sequence[str],
        larks: Sequence[str | None],
        max_new_tokens: int,
        stop_strings: Sequence[str] | None = None,
        *,
        shared: str | None = None,
    ) -> tuple[list[Sample], float]:
        """One continuation per prompt, batched, each constrained by its own llguidance grammar
        where one is given; and the seconds spent on masks. `shared`: text every prompt starts
        with, whose keys and values are computed once and kept for later calls (the rows'
        rest is padded between it and their own tokens)."""
        import torch

        head: list[int] = []
        cache = None
        if shared is not None and all(p.startswith(shared) for p in prompts):
            head, cache = self._cached(shared)
            prompts = [p[len(shared) :] for p in prompts]
        encoded = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        width = max(len(ids) for ids in encoded)
        prompt_length = len(head) + width
        limit = self.context_length()
        if limit is not None and prompt_length + max_new_tokens > limit:
            raise ContextTooLong(
                f"the prompt is {prompt_length} tokens and the reply may take {max_new_tokens}, "
                f"but {self.name} attends to {limit} tokens",
                "shorten --hint, lower --max-new-tokens, or use a model with a longer context",
            )
        pad = self.tokenizer.pad_token_id
        pad = self.eos[0] if pad is None else pad
        input_ids = torch.tensor(
            [head + [pad] * (width - len(ids)) + ids for ids in encoded], dtype=torch.long
        ).to(self.model.device)
        attention = torch.tensor(
            [[1] * len(head) + [0] * (width - len(ids)) + [1] * len(ids) for ids in encoded],
            dtype=torch.long,
        ).to(self.model.device)
        extra: dict[str, Any] = {}
        if cache is not None:
            batch_cache = copy.deepcopy(cache)
            batch_cache.batch_repeat_interleave(len(encoded))
            extra[_cache_argument()] = batch_cache
        processors = []
        if any(lark is not None for lark in larks):
            matchers = [
                None if lark is None else self._prototype(lark).deep_copy() for lark in larks
            ]
            processors.append(
                GrammarLogitsProcessor(matchers, self.vocab_size, prompt_length, self.eos)
            )
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
        if processors:
            from transformers import LogitsProcessorList

            options["logits_processor"] = LogitsProcessorList(processors)
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids, attention_mask=attention, **options, **extra
            )
        samples = []
        for row in output[:, prompt_length:].tolist():
            ended = [n for n, token in enumerate(row) if token in self.eos]
            tokens = row[: ended[0]] if ended else row
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            stopped = bool(ended) or (bool(stop_strings) and any(s in text for s in stop_strings))
            if stop_strings:  # generation stops at the end of the step that wrote a stop string
                cut = min((text.find(s) + len(s) for s in stop_strings if s in text), default=-1)
                text = text[:cut] if cut >= 0 else text
            samples.append(Sample(text, len(tokens), "stop" if stopped else "length"))
        mask_seconds = processors[0].seconds if processors else 0.0
        return samples, mask_seconds

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

    def lltokenizer(self):
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


def _eos_ids(tokenizer, model) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else [ids] if ids is not None else []
    for token in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")):
        if isinstance(token, int) and token >= 0 and token != tokenizer.unk_token_id:
            ids.append(token)
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise SchedlangError(f"{model.name_or_path}: the tokenizer has no end-of-sequence token")
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


# --- an OpenAI-compatible server ------------------------------------------------------------------


class OpenAIBackend:
    """A model behind an OpenAI-compatible chat-completions endpoint (vLLM, SGLang, llama.cpp's
    server, Ollama, …), over plain HTTP with the standard library.

    Each request is one POST to `<endpoint>/v1/chat/completions` with `model`, `messages`, `n`,
    `temperature`, `top_p`, `max_tokens` and `seed`; with a grammar, also
    `"structured_outputs": {"grammar": <Lark text>}` (`grammar_field`: vLLM ≥ 0.12 reads it with
    its llguidance backend; "guided_grammar" for older vLLM, None to send no grammar). The Lark
    text starts with `%llguidance {}`; with `think` it lets the model reason in free text up to
    the ```schedlang fence. A server that answers 400 to the grammar is asked again without it;
    servers that ignore unknown fields (llama.cpp, whose `grammar` is GBNF; Ollama) answer
    unconstrained. Either way every answer is parsed and checked by the caller.

    With `think`, the reasoning gets `max_new_tokens - answer_tokens` tokens. A reply that spends
    them all and never opens the ```schedlang fence gets a second request that continues it with
    the fence written in and the answer under the grammar (`answer_tokens` at most), as the local
    backend does.

    Continuing an assistant message (that second request, and `continue_batch`) uses the
    extension `"continue_final_message": true, "add_generation_prompt": false`, which vLLM
    (≥ 0.6.3; 0.6.4 fixed it echoing the prefix), SGLang (since March 2025, ≈ 0.4.4), TGI
    (≥ 3.0) and llama.cpp's server (the flag since May 2026; it continues a final assistant
    message by default before that) take. OpenAI's own API answers 400 to it: then
    `supports_continuation` turns False, `continue_batch` raises a SchedlangError, and
    `complete` asks afresh for only the answer instead. A server that ignores the flag silently
    starts a new turn after the prefix; that cannot be told from the reply, so such a server
    (or a chat template that rewrites the final assistant message) needs
    `supports_continuation = False` set by hand.

    Connection failures, timeouts, 429 and 5xx are retried `retries` times, waiting `backoff_s`,
    then twice that, …; then a SchedlangError says the server is down.
    """

    concurrency = 8  # requests under way at once (continue_batch, forced answers)

    def __init__(
        self,
        endpoint: str,
        model: str = DEFAULT_MODEL,
        *,
        temperature: float = DEFAULT_TEMPERATURE,
        top_p: float = DEFAULT_TOP_P,
        max_new_tokens: int | None = None,
        answer_tokens: int = 1024,
        think: bool = True,
        grammar_field: str | None = "structured_outputs",
        timeout_s: float = 600.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        api_key: str | None = None,
    ):
        self.url = chat_completions_url(endpoint)
        self.model = model
        self.name = model
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens or GPU_MAX_NEW_TOKENS
        self.answer_tokens = min(answer_tokens, self.max_new_tokens)
        self.think = think
        # Whether the server continues an assistant message: None until a request shows it.
        self.supports_continuation: bool | None = None
        self.grammar_field = grammar_field
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.api_key = (
            api_key or os.environ.get("SCHEDLANG_API_KEY") or os.environ.get("OPENAI_API_KEY")
        )
        self.last_request: dict | None = None  # what was sent last, for audit and tests

    def request_body(
        self,
        messages: Sequence[dict[str, str]],
        count: int,
        grammar: DecodingGrammar | None,
        seed: int | None,
    ) -> dict[str, Any]:
        # With `think`, the answer's budget is kept back for a forced answer (see `complete`).
        budget = self.max_new_tokens
        if self.think and self.max_new_tokens > self.answer_tokens:
            budget = self.max_new_tokens - self.answer_tokens
        lark = grammar.lark("reasoning" if self.think else "fenced") if grammar else None
        return self._body(messages, count, budget, lark, seed)

    def _body(
        self,
        messages: Sequence[dict[str, str]],
        count: int,
        max_tokens: int,
        lark: str | None,
        seed: int | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "n": count,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": max_tokens,
        }
        if seed is not None:
            body["seed"] = seed
        if lark is not None and self.grammar_field:
            if self.grammar_field == "structured_outputs":
                body["structured_outputs"] = {"grammar": lark}
            else:
                body[self.grammar_field] = lark
        return body

    def complete(
        self,
        messages: Sequence[dict[str, str]],
        count: int,
        grammar: DecodingGrammar | None = None,
        seed: int | None = None,
    ) -> list[Completion]:
        body = self.request_body(messages, count, grammar, seed)
        notes = []
        started = time.perf_counter()
        try:
            reply = self._post(body)
        except _GrammarRefused as refusal:
            notes.append(f"the server refused the grammar ({refusal}): sampled unconstrained")
            log.warning("%s refused the grammar (%s): asking without it", self.url, refusal)
            body = self.request_body(messages, count, None, seed)
            reply = self._post(body)
        seconds = time.perf_counter() - started
        constrained = grammar is not None and not notes and bool(self.grammar_field)
        choices = reply.get("choices") or []
        if not choices:
            raise SchedlangError(f"the model server at {self.url} answered with no choices")
        tokens = (reply.get("usage") or {}).get("completion_tokens", 0)
        completions = []
        for choice in choices:
            message = choice.get("message") or {}
            content = message.get("content") or ""
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            answer = extract_answer(content, tagged_only=constrained)
            if answer is None and reasoning:  # a reasoning parser that kept the answer
                answer = extract_answer(reasoning, tagged_only=constrained)
            closed: list[str] = []
            if answer is not None:
                answer, closed = close_answer(answer, choice.get("finish_reason") or "")
            completions.append(
                Completion(
                    text=f"{reasoning}{content}",
                    answer=answer,
                    reasoning=reasoning or content.partition(FENCE)[0],
                    constrained=constrained,
                    finish=choice.get("finish_reason") or "",
                    tokens=tokens // len(choices),
                    seconds=seconds / len(choices),
                    notes=[*notes, *closed],
                )
            )
        cut_short = [c for c in completions if c.answer is None and c.finish == "length"]
        if cut_short:
            self._force_answers(messages, cut_short, grammar if constrained else None, seed)
        return completions

    def _force_answers(
        self,
        messages: Sequence[dict[str, str]],
        replies: list[Completion],
        grammar: DecodingGrammar | None,
        seed: int | None,
    ) -> None:
        """Answers, in place, for replies that spent their budget reasoning: each reply is
        continued with the fence written for it and the answer sampled under the grammar; where
        the server cannot continue a message, the answer is asked for in a new turn."""
        notes = ["the reasoning budget ran out: the answer fence was forced"]
        if self.supports_continuation is not False:

            def rows(lark: str | None) -> list[Continuation]:
                stop = () if lark else (CLOSE_FENCE,)
                return [
                    Continuation(
                        tuple(messages), f"{r.text}\n{FENCE}", lark, self.answer_tokens, stop
                    )
                    for r in replies
                ]

            lark = grammar.lark("answer") if grammar else None
            try:
                try:
                    samples = self._continue(rows(lark), seed)
                except _GrammarRefused as refusal:
                    notes.append(f"the server refused the grammar ({refusal}): answered freely")
                    lark = None
                    samples = self._continue(rows(None), seed)
            except _ContinuationRefused as refusal:
                log.warning("%s cannot continue a message (%s)", self.url, refusal)
            else:
                for reply, sample in zip(replies, samples, strict=True):
                    reply.text = f"{reply.text}\n{FENCE}{sample.text}"
                    reply.answer, closed = answer_after_fence(sample.text, sample.finish)
                    self._answered(reply, sample, lark is not None, [*notes, *closed])
                return
        notes.append("the server cannot continue a message: the answer was asked for afresh")

        def bodies(lark: str | None) -> list[dict[str, Any]]:
            return [
                self._body(
                    [
                        *messages,
                        {"role": "assistant", "content": reply.text},
                        {"role": "user", "content": _ANSWER_NOW},
                    ],
                    1,
                    self.answer_tokens,
                    lark,
                    None if seed is None else seed + n,
                )
                for n, reply in enumerate(replies)
            ]

        lark = grammar.lark("fenced") if grammar else None
        try:
            results = self._post_each(bodies(lark))
        except _GrammarRefused as refusal:
            notes.append(f"the server refused the grammar ({refusal}): answered freely")
            lark = None
            results = self._post_each(bodies(None))
        for reply, (result, seconds) in zip(replies, results, strict=True):
            sample = self._sample(result, seconds)
            reply.text = f"{reply.text}\n{sample.text}"
            reply.answer = extract_answer(sample.text)
            self._answered(reply, sample, lark is not None, notes)

    @staticmethod
    def _answered(reply: Completion, sample: Sample, constrained: bool, notes: list[str]) -> None:
        reply.constrained = constrained
        reply.finish = sample.finish
        reply.tokens += sample.tokens
        reply.seconds += sample.seconds
        reply.notes += notes

    def continue_batch(self, rows: Sequence[Continuation], seed: int | None = None) -> list[Sample]:
        """Each row's continuation, in order: one request per row (`n: 1`, seed `seed + index`),
        `concurrency` of them at once. A row with a prefix sends it as a final assistant message
        with `"continue_final_message": true, "add_generation_prompt": false`; a row without one
        is a plain request. A server that cannot continue a message (see the class) is a
        SchedlangError, and leaves `supports_continuation` False."""
        try:
            return self._continue(rows, seed)
        except _ContinuationRefused as refusal:
            raise SchedlangError(
                f"the model server at {self.url} cannot continue an assistant message: {refusal}",
                "serve the model with vLLM (≥ 0.6.4) or SGLang, which take "
                "`continue_final_message`, or run it here with --model",
            ) from None
        except _GrammarRefused as refusal:
            raise SchedlangError(
                f"the model server at {self.url} refused the decoding grammar: {refusal}",
                "serve the model with vLLM (≥ 0.12 reads `structured_outputs`; older: "
                "grammar_field='guided_grammar'), or run it here with --model",
            ) from None

    def _continue(self, rows: Sequence[Continuation], seed: int | None) -> list[Sample]:
        if self.supports_continuation is False and any(row.prefix for row in rows):
            raise _ContinuationRefused("it refused `continue_final_message` before")
        bodies = []
        for index, row in enumerate(rows):
            messages = list(row.messages)
            if row.prefix:
                messages.append({"role": "assistant", "content": row.prefix})
            row_seed = None if seed is None else seed + index
            body = self._body(messages, 1, row.max_new_tokens, row.lark, row_seed)
            if row.prefix:
                body |= {"continue_final_message": True, "add_generation_prompt": False}
            if row.stop:
                body["stop"] = list(row.stop)
            bodies.append(body)
        return [self._sample(reply, seconds) for reply, seconds in self._post_each(bodies)]

    def _post_each(self, bodies: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
        """Each body posted, `concurrency` at once; the replies in order, with their seconds."""
        from concurrent.futures import ThreadPoolExecutor

        def post(body: dict[str, Any]) -> tuple[dict[str, Any], float]:
            started = time.perf_counter()
            reply = self._post(body)
            return reply, time.perf_counter() - started

        results = []
        pending = list(bodies)
        if pending and self.supports_continuation is None and len(pending) > 1:
            if pending[0].get("continue_final_message"):
                results.append(post(pending.pop(0)))  # one refusal rather than a burst
        if pending:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(pending))) as pool:
                results += pool.map(post, pending)
        return results

    def _sample(self, reply: dict[str, Any], seconds: float) -> Sample:
        choices = reply.get("choices") or []
        if not choices:
            raise SchedlangError(f"the model server at {self.url} answered with no choices")
        choice = choices[0]
        message = choice.get("message") or {}
        # A reasoning parser may file a continuation under reasoning: the text is both.
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        text = f"{reasoning}{message.get('content') or ''}"
        tokens = (reply.get("usage") or {}).get("completion_tokens") or 0
        return Sample(text, int(tokens), choice.get("finish_reason") or "", seconds)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        self.last_request = body
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    reply = json.loads(response.read().decode("utf-8"))
                if body.get("continue_final_message"):
                    self.supports_continuation = True
                return reply
            except urllib.error.HTTPError as err:
                detail = _error_detail(err)
                if err.code == 429 or err.code >= 500:
                    problem = f"HTTP {err.code}: {detail}"
                    continue
                continuing = body.get("continue_final_message")
                if err.code in (400, 422) and continuing and _about_continuation(detail):
                    self.supports_continuation = False
                    raise _ContinuationRefused(f"HTTP {err.code}: {detail}") from None
                if err.code in (400, 422) and _about_context(detail):
                    raise ContextTooLong(
                        f"the model server at {self.url} refused the request: HTTP {err.code}: "
                        f"{detail}",
                        "shorten --hint, or lower --max-new-tokens",
                    ) from None
                if err.code in (400, 422) and _has_grammar(body) and _about_grammar(detail):
                    raise _GrammarRefused(f"HTTP {err.code}: {detail}") from None
                raise SchedlangError(
                    f"the model server at {self.url} refused the request: HTTP {err.code}: "
                    f"{detail}",
                    f"is `{self.model}` the name it serves? pass it with --model",
                ) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
                reason = getattr(err, "reason", err)
                problem = str(reason) or type(reason).__name__
            except json.JSONDecodeError as err:
                problem = f"not JSON: {err}"
        raise SchedlangError(
            f"the model server at {self.url} did not answer: {problem} "
            f"({self.retries + 1} attempts)",
            "start it (e.g. `vllm serve WeiboAI/VibeThinker-1.5B`), or check --endpoint",
        )


def _about_context(detail: str) -> bool:
    """A server's refusal of a prompt longer than the model's context (vLLM: "This model's
    maximum context length is …"; the tiny server: "… attends to N tokens")."""
    return bool(re.search(r"context length|context window|attends to \d+ tokens", detail, re.I))


class _GrammarRefused(Exception):
    pass


class _ContinuationRefused(Exception):
    pass


_ANSWER_NOW = "Your reasoning budget is spent. Answer now with only the ```schedlang block."


def _about_continuation(detail: str) -> bool:
    """A refusal of the final assistant message: vLLM's and transformers' own words, OpenAI's
    unknown argument, "last message must be from the user"."""
    words = r"continue_final_message|add_generation_prompt|(final|last) message|prefill"
    return bool(re.search(words, detail, re.I))


def _has_grammar(body: dict[str, Any]) -> bool:
    return "structured_outputs" in body or "guided_grammar" in body


def _about_grammar(detail: str) -> bool:
    return bool(re.search(r"grammar|structured|guided|guidance|lark", detail, re.I))


def _error_detail(err: urllib.error.HTTPError) -> str:
    try:
        text = err.read().decode("utf-8", "replace")
    except Exception:  # the body is optional
        text = ""
    try:
        message = json.loads(text).get("error", text)
        if isinstance(message, dict):
            message = message.get("message", text)
        text = str(message)
    except (json.JSONDecodeError, AttributeError):
        pass
    return " ".join(text.split())[:300] or err.reason


def chat_completions_url(endpoint: str) -> str:
    """`http://host:8000`, `…/v1` or the full `…/v1/chat/completions`: the full URL."""
    url = endpoint.rstrip("/")
    if not re.match(r"https?://", url):
        raise SchedlangError(
            f"--endpoint {endpoint!r} is not an http(s) URL", "e.g. http://127.0.0.1:8000/v1"
        )
    if url.endswith("/chat/completions"):
        return url
    return f"{url}/chat/completions" if url.endswith("/v1") else f"{url}/v1/chat/completions"
