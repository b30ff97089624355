"""The decoding grammar: grammar/schedlang.lark rewritten for llguidance (`decoding_grammar`).

It is the parser's language with the whitespace made explicit (so a keyword can never run into a
name: the parser rejects `unrollk`, llguidance's lexer would not), with the statements that the
parser's own validation rejects left out (`pow2(8, 6)`; a tile with more axes than factors, two
`*` in a split, a pragma key twice: these as `schedlang.lang.syntax.LIST_RULES` declares them for
the parser's validation), and optionally bounded (a finite language: a random-weight model must
finish) and narrowed to one op's block, buffer and axis names.

The grammar file is read by lark itself: the parser's own `Lark` object keeps what lark's grammar
loader (`lark.load_grammar`) made of it, each rule and terminal as lark's EBNF tree
(`Grammar.rule_defs`, `term_defs`), and the rules rewritten here are Lark text loaded the same way,
over the file (`%override`), so that lark checks every name they use. This module only reads those
trees into the small expressions below and writes them out again for llguidance, whose Lark
dialect (`%llguidance`, `x{m,n}` repeats, `[lazy]`) lark cannot write.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lark import Token, Tree
from lark.exceptions import GrammarError
from lark.grammar import Symbol
from lark.load_grammar import Grammar, load_grammar

from schedlang.lang import nodes, statements
from schedlang.lang.syntax import LIST_RULES, PARSER, grammar_text

if TYPE_CHECKING:
    from schedlang.core.ops import Op

log = logging.getLogger(__name__)


# --- the grammar file, as lark loads it -----------------------------------------------------------

# A Lark expression: ("alt", [seq, ...]), ("seq", [item, ...]), ("rep", item, low, high|None),
# ("lit", '"text"'), ("re", "/regex/"), ("ref", name).
Expr = tuple

_REPEATS = {"?": (0, 1), "*": (0, None), "+": (1, None)}


def _expr(tree: Tree | Symbol) -> Expr:
    """One definition as lark's grammar loader left it (`expansions` of `expansion`s of `expr`,
    `maybe`, `value`, `literal`), as an expression."""
    if isinstance(tree, Symbol):
        return ("ref", tree.name)
    kind, children = tree.data, tree.children
    if kind in ("expansions", "expansion"):
        parts = [_expr(child) for child in children]
        return parts[0] if len(parts) == 1 else ("alt" if kind == "expansions" else "seq", parts)
    if kind == "maybe":
        return ("rep", _expr(children[0]), 0, 1)
    if kind == "expr":
        item, op, *counts = children
        if op == "~":  # `item~n` or `item~n..m`
            return ("rep", _expr(item), int(str(counts[0])), int(str(counts[-1])))
        return ("rep", _expr(item), *_REPEATS[str(op)])
    if kind == "value":
        return _expr(children[0])
    if kind == "literal":
        token = children[0]
        assert isinstance(token, Token)  # a literal's one child
        return ("lit" if token.type == "STRING" else "re", str(token))
    raise ValueError(f"the grammar uses `{kind}`, which the decoding grammar cannot rewrite")


@dataclass(frozen=True)
class LarkRules:
    """The rules and terminals of a Lark grammar, by name, as expressions."""

    definitions: dict[str, Expr]

    @classmethod
    def of(cls, grammar: Grammar) -> LarkRules:
        definitions = {str(name): _expr(tree) for name, _, tree, _ in grammar.rule_defs}
        for name, (tree, _) in grammar.term_defs:
            if tree is not None:  # not a `%declare`d one
                definitions[name] = _expr(tree)
        return cls(definitions)

    def statement_rules(self) -> list[str]:
        """The rules `_stmt` lists, in order, and `block_header`."""
        stmt = self.definitions["_stmt"]
        options = stmt[1] if stmt[0] == "alt" else [stmt]
        return ["block_header"] + [option[1] for option in options if option[0] == "ref"]


def _is_terminal(name: str) -> bool:
    return name.lstrip("_").isupper()


@functools.cache
def schedlang_grammar() -> LarkRules:
    """grammar/schedlang.lark as the parser (schedlang.lang.syntax.PARSER) loaded it."""
    return LarkRules.of(PARSER.grammar)


def with_rules(rules: Mapping[str, str], declared: Sequence[str] = ()) -> LarkRules:
    """The grammar file with `rules` (Lark text, by name) in place of its own rules of those
    names or beside them, loaded by lark, which checks that every name they use is defined
    (`declared`: terminals defined later, by hand)."""
    own = schedlang_grammar().definitions
    lines = [grammar_text()]
    lines += [f"%declare {' '.join(declared)}"] if declared else []
    for name, text in rules.items():
        lines.append(f"%override {name}: {text}" if name in own else f"{name}: {text}")
    grammar, _ = load_grammar("\n".join(lines) + "\n", "<decoding grammar>", [], False)
    return LarkRules.of(grammar)


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
    stale = _stale_rules()
    for name in stale:
        log.warning("grammar rule %s changed: decoding uses it as the file has it", name)
    definitions.update(_rewritten(bounds, stale))
    if bounds is not None:
        # Knobs first, each name once: see Bounds.knobs.
        stmt = definitions["_stmt"]
        definitions["_stmt"] = ("alt", [o for o in stmt[1] if o != ("ref", "param")])
        knobs = [
            ("rep", ("seq", [("ref", f"_param{n}"), ("ref", "_SEP")]), 0, 1)
            for n in range(len(bounds.knobs))
        ]
        definitions["start"] = ("seq", [*knobs, definitions["start"]])
    for rule, role in _NAME_ROLES.items():
        if rule in definitions:
            definitions[rule] = _rename(definitions[rule], "NAME", role)
    definitions["schedule"] = definitions.pop("start")
    definitions.update(_terminals(source, names, bounds))
    rules = _Emitter(definitions, bounds).emit("schedule")
    return DecodingGrammar(rules, bounds is not None, stale)


@functools.cache
def _stale_rules() -> tuple[str, ...]:
    """The rules of the file that differ from how `_ORIGINAL` reads them (or that lark cannot
    load in the file's place: a rule they use is gone)."""
    own = schedlang_grammar().definitions
    stale = []
    for name, text in _ORIGINAL.items():
        try:
            original = with_rules({name: text}).definitions[name]
        except GrammarError:
            original = None
        if own.get(name) != original:
            stale.append(name)
    return tuple(stale)


@functools.cache
def _rewritten(bounds: Bounds | None, stale: tuple[str, ...]) -> dict[str, Expr]:
    """The rules `_overrides` rewrites, the stale ones left out, and the knobs' own rules."""
    texts = {name: text for name, text in _overrides(bounds).items() if name not in stale}
    for n, knob in enumerate(bounds.knobs if bounds else ()):
        texts[f"_param{n}"] = f'"param" "{knob}" "in" _choices'
    loaded = with_rules(texts, declared=["POS", "_W"]).definitions
    return {name: loaded[name] for name in texts}


def _overrides(bounds: Bounds | None) -> dict[str, str]:
    """Rules rewritten so that what the parser's validation rejects cannot be written: the
    factors and keys of `LIST_RULES`, and knob values."""
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
    return {
        **_factor_rules(bounds),
        "_factor": "POS | NAME",
        # A factor before the `x` of a tile: a name needs a space before it (`TI x 32`; `TIx32`
        # is one name), a number does not (`32x32`).
        "_xfactor": "POS | NAME _W",
        "choice_list": '"[" POS ("," POS)* "]"',
        "choice_pow2": f'"pow2" "(" ({" | ".join(pow2_pairs)}) ")"',
        "choice_range": f'"range" "(" ({range_pair}) ("," POS)? ")"',
        **_key_rules(),
    }


def _factor_rules(bounds: Bounds | None) -> dict[str, str]:
    """split and tile as `LIST_RULES` has them: `*` where and as often as a split may have it,
    a tile's factors one per axis."""
    split, tile = LIST_RULES["split"], LIST_RULES["tile"]
    if split.inferred > 1 or not tile.per_axis or tile.inferred:
        raise NotImplementedError(f"no decoding grammar is written for {split} and {tile}")
    tile_axes = min(_MAX_TILE_AXES, bounds.repeats + 1) if bounds else _MAX_TILE_AXES
    tiles = [
        " ".join(['"tile" axis', *['"," axis'] * (n - 1), '"by"', *['_xfactor "x"'] * (n - 1)])
        + " _factor"
        for n in range(2, tile_axes + 1)
    ]
    rules = {"tile": " | ".join(tiles), "split": '"split" axis "by" _factor ("," _factor)*'}
    if split.inferred:
        # One factor, or several with at most one `*`: never `*` alone.
        rules["split"] = '"split" axis "by" (_factor | _factors)'
        rules["_factors"] = (
            '_factor ("," _factor)+ | STAR ("," _factor)+ '
            '| _factor ("," _factor)* "," STAR ("," _factor)*'
        )
    return rules


def _key_rules() -> dict[str, str]:
    """pragma as `LIST_RULES` has it: each key at most once, in any order."""
    if not LIST_RULES["pragma"].keys_once:
        return {}
    pragma_items = [
        ' "," '.join(f'"{key}" "=" value' for key in keys)
        for count in range(1, len(nodes.PRAGMA_KEYS) + 1)
        for keys in itertools.permutations(nodes.PRAGMA_KEYS, count)
    ]
    return {"pragma": f'"pragma" axis ({" | ".join(pragma_items)})'}


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


def _terminals(source: LarkRules, names: OpNames | None, bounds: Bounds | None) -> dict[str, Expr]:
    name = source.definitions["NAME"][1][1:-1]
    axis = source.definitions["AXIS"][1][1:-1]
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
        # transform_layout's indices and tensorize's intrinsic: names of bounded length too; and
        # the negative integers and integer lists (annotate's values) of as many digits as the
        # others, which the parser's int32 range then always takes (-99943339444 did not parse).
        found.update(INDEX_VAR=name, INDEX_NAME=name, INTRIN=f"[a-z][a-z0-9_]{{0,{47}}}")
        element = f"-?{integer}"
        found.update(
            SIGNED_INT=f"-{integer}",
            INT_LIST=f"\\[[ \\t]*{element}([ \\t]*,[ \\t]*{element}){{0,7}}[ \\t]*\\]",
        )
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
            head, tail = text[:1], text[-1:]
            return frozenset({_wordy(head)}), frozenset({_wordy(tail)}), text == ""
        if kind == "re":
            return frozenset({True}), frozenset({True}), False
        if kind == "ref":
            name = expr[1]
            if _is_terminal(name) and self.definitions.get(name, ("re",))[0] == "re":
                starts, ends = _WORDY.get(name, (True, True))
                return frozenset({starts}), frozenset({ends}), False
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
        first = frozenset[bool]()
        for item in expr[1]:
            item_first, _, nullable = self.edges(item)
            first |= item_first
            if not nullable:
                break
        last = frozenset[bool]()
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
