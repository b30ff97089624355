"""The schedlang AST: frozen dataclasses with a source span: names, factors, knob value sets,
comments, the frame's statements (`block`, `param`) and the schedule; each statement of the
registry has its class in its family module (schedlang.lang.statements).

Spans do not take part in equality, so `parse(format(ast)) == ast` compares meaning, not layout.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

from schedlang.core.diagnostics import NO_SPAN, Span


@dataclass(frozen=True)
class Node:
    span: Span = field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Name(Node):
    """A reference by name: an axis (`i.o`), a block, a buffer, a knob, a scope or a thread axis."""

    text: str


# --- factors -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntFactor(Node):
    value: int


@dataclass(frozen=True)
class KnobFactor(Node):
    name: str


@dataclass(frozen=True)
class InferredFactor(Node):
    """`*`: the one factor of a split that is derived from the extent and the others."""


Factor = IntFactor | KnobFactor | InferredFactor


# --- knob value sets -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ListChoices(Node):
    values: tuple[int, ...]

    def __iter__(self) -> Iterator[int]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class Pow2Choices(Node):
    """`pow2(lo, hi)`: every power of two from lo to hi inclusive."""

    low: int
    high: int

    def __iter__(self) -> Iterator[int]:
        value = self.low
        while 0 < value <= self.high:
            yield value
            value *= 2

    def __len__(self) -> int:
        if self.low <= 0 or self.high < self.low:
            return 0
        return int(math.log2(self.high // self.low)) + 1


@dataclass(frozen=True)
class RangeChoices(Node):
    """`range(lo, hi[, step])`: lo, lo+step, … up to and including hi."""

    low: int
    high: int
    step: int = 1

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.low, self.high + 1, self.step)) if self.step > 0 else iter(())

    def __len__(self) -> int:
        return len(range(self.low, self.high + 1, self.step)) if self.step > 0 else 0


Choices = ListChoices | Pow2Choices | RangeChoices


# --- statements ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stmt(Node):
    """A statement: the frame's (`block`, `param`, here) or one of the statement registry's, whose
    classes live with the rest of their definitions in their family modules
    (schedlang.lang.statements, which lists them all as STATEMENT_KINDS)."""

    keyword: ClassVar[str]

    def __init_subclass__(cls, keyword: str = "", **kwargs: Any) -> None:
        """`class Split(nodes.Stmt, keyword="split")`: the word that starts the statement."""
        super().__init_subclass__(**kwargs)
        if keyword:
            cls.keyword = keyword


@dataclass(frozen=True)
class BlockHeader(Stmt, keyword="block"):
    """`block C:` — the statements after it schedule block C."""

    block: Name


@dataclass(frozen=True)
class Param(Stmt, keyword="param"):
    """`param TI in [8, 16, 32]` — a knob the tuner searches."""

    name: Name
    choices: Choices


@dataclass(frozen=True)
class Comment(Node):
    """`# text`; `trailing` when it ends the line of the statement before it."""

    text: str
    trailing: bool = False


THREAD_AXES: tuple[str, ...] = tuple(
    f"{kind}.{dim}" for kind in ("blockIdx", "threadIdx", "vthread") for dim in "xyz"
)
SCOPES: tuple[str, ...] = ("global", "shared", "shared.dyn", "local", "warp")
PRAGMA_KEYS: tuple[str, ...] = ("auto_unroll_max_step", "unroll_explicit")


def cache_block_name(source: Name, scope: Name) -> str:
    """The copy block of `cache_read A shared.dyn` is `A_shared_dyn` (TVM says `A_shared.dyn`,
    which a schedule could not name)."""
    return f"{source.text}_{scope.text.replace('.', '_')}"


def derived_axis_names(axis: str, parts: int) -> tuple[str, ...]:
    """A two-way split gives `i.o`, `i.i`; an n-way split gives `i.0` … `i.{n-1}`."""
    if parts == 2:
        return (f"{axis}.o", f"{axis}.i")
    return tuple(f"{axis}.{n}" for n in range(parts))


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule. With every knob bound (or none declared) it is concrete."""

    items: tuple[Stmt | Comment, ...]
    file: str = field(default="<string>", compare=False)
    source: str = field(default="", compare=False, repr=False)
    # Indices of items preceded by a blank line in the source; kept by the formatter.
    blank_before: frozenset[int] = field(default=frozenset(), compare=False, repr=False)

    @property
    def statements(self) -> tuple[Stmt, ...]:
        return tuple(item for item in self.items if isinstance(item, Stmt))

    @property
    def params(self) -> tuple[Param, ...]:
        return tuple(s for s in self.statements if isinstance(s, Param))

    @property
    def is_template(self) -> bool:
        return bool(self.params)

    def knob_space(self) -> dict[str, Choices]:
        return {p.name.text: p.choices for p in self.params}

    def knob_space_size(self) -> int:
        return math.prod(len(p.choices) for p in self.params)

    def iter_knob_values(self) -> Iterator[dict[str, int]]:
        """Every assignment of the knobs, lazily (a space may have 10^12 points)."""
        names = [p.name.text for p in self.params]
        for values in itertools.product(*(p.choices for p in self.params)):
            yield dict(zip(names, values, strict=True))


def to_json(node: object) -> object:
    """The AST as JSON-able data: every node is a dict with its `kind` and its `span`."""
    if isinstance(node, Schedule):
        return {"kind": "Schedule", "file": node.file, "items": [to_json(i) for i in node.items]}
    if is_dataclass(node) and not isinstance(node, type):
        data: dict[str, object] = {"kind": type(node).__name__}
        for f in fields(node):
            if f.name != "span":
                data[f.name] = to_json(getattr(node, f.name))
        span = getattr(node, "span", None)
        if span is not None and span is not NO_SPAN:
            data["span"] = [span.line, span.column, span.end_line, span.end_column]
        return data
    if isinstance(node, tuple | list):
        return [to_json(n) for n in node]
    return node
