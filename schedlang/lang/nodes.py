"""The schedlang AST: frozen dataclasses, one per statement kind, each with a source span.

Spans do not take part in equality, so `parse(format(ast)) == ast` compares meaning, not layout.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from typing import ClassVar

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


# Every statement class, in the order defined: this module's, then those of the statement
# registry's family modules (schedlang.lang.statements, which the parser imports), so a new
# statement's class lives with the rest of its definition. Read as STATEMENT_KINDS and KEYWORDS
# below.
_STATEMENT_KINDS: list[type[Stmt]] = []


@dataclass(frozen=True)
class Stmt(Node):
    keyword: ClassVar[str]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "keyword" in cls.__dict__:  # not a base of several (`LoopStmt`)
            _STATEMENT_KINDS.append(cls)


@dataclass(frozen=True)
class BlockHeader(Stmt):
    """`block C:` — the statements after it schedule block C."""

    keyword: ClassVar[str] = "block"
    block: Name


@dataclass(frozen=True)
class Param(Stmt):
    """`param TI in [8, 16, 32]` — a knob the tuner searches."""

    keyword: ClassVar[str] = "param"
    name: Name
    choices: Choices


@dataclass(frozen=True)
class Split(Stmt):
    """`split i by 32` → i.o, i.i; `split i by *, 4, 8` → i.0, i.1, i.2."""

    keyword: ClassVar[str] = "split"
    axis: Name
    factors: tuple[Factor, ...]

    @property
    def parts(self) -> tuple[Factor, ...]:
        """The factor of each resulting loop, outer to inner (outer inferred if omitted)."""
        if len(self.factors) == 1:
            return (InferredFactor(span=self.axis.span), *self.factors)
        return self.factors

    @property
    def derived_names(self) -> tuple[str, ...]:
        return derived_axis_names(self.axis.text, len(self.parts))


@dataclass(frozen=True)
class Tile(Stmt):
    """`tile i, j by 32x32` → i.o, j.o, i.i, j.i (Halide: split each, outer loops first)."""

    keyword: ClassVar[str] = "tile"
    axes: tuple[Name, ...]
    factors: tuple[Factor, ...]


@dataclass(frozen=True)
class Reorder(Stmt):
    keyword: ClassVar[str] = "reorder"
    axes: tuple[Name, ...]


@dataclass(frozen=True)
class Fuse(Stmt):
    """`fuse i.o, j.o` → `i.o_j.o`; `fuse i.o, j.o as ij` → `ij`."""

    keyword: ClassVar[str] = "fuse"
    axes: tuple[Name, ...]
    alias: Name | None = None

    @property
    def fused_name(self) -> str:
        return self.alias.text if self.alias else "_".join(a.text for a in self.axes)


@dataclass(frozen=True)
class Bind(Stmt):
    keyword: ClassVar[str] = "bind"
    axis: Name
    thread: Name


@dataclass(frozen=True)
class LoopStmt(Stmt):
    """A statement that changes how one loop of the current block runs."""

    axis: Name


class Vectorize(LoopStmt):
    keyword: ClassVar[str] = "vectorize"


class Unroll(LoopStmt):
    keyword: ClassVar[str] = "unroll"


class Parallel(LoopStmt):
    keyword: ClassVar[str] = "parallel"


def _require_at(stmt: CacheRead | CacheWrite) -> None:
    # `keep_unit_loops` belongs to `at`: the copy block is moved only when `at` is given.
    if stmt.keep_unit_loops and stmt.at is None:
        raise ValueError(f"{stmt.keyword}: keep_unit_loops needs `at`")


@dataclass(frozen=True)
class CacheRead(Stmt):
    """`cache_read A shared [for B, …] [at k.o [keep_unit_loops]] [as A_sh]`: the current block
    reads A through a copy."""

    keyword: ClassVar[str] = "cache_read"
    buffer: Name
    scope: Name
    at: Name | None = None
    alias: Name | None = None
    keep_unit_loops: bool = False
    # `for B, D`: only these blocks read the copy (TVM's consumer_blocks); all readers if empty.
    consumers: tuple[Name, ...] = ()

    def __post_init__(self) -> None:
        _require_at(self)


@dataclass(frozen=True)
class CacheWrite(Stmt):
    """`cache_write C local [at j.o [keep_unit_loops]] [as C_acc]`: block C accumulates in a copy
    written back."""

    keyword: ClassVar[str] = "cache_write"
    block: Name
    scope: Name
    at: Name | None = None
    alias: Name | None = None
    keep_unit_loops: bool = False

    def __post_init__(self) -> None:
        _require_at(self)


@dataclass(frozen=True)
class MoveStmt(Stmt):
    """`compute_at B k.o [keep_unit_loops] [index N]` (and `reverse_compute_at`): with the option,
    B keeps the loops of extent 1 it gets under k.o (TVM's preserve_unit_loops)."""

    block: Name
    axis: Name
    keep_unit_loops: bool = False
    # `index N`: the block goes at position N among the loop's children (TVM's `index`); last
    # when not given.
    index: IntFactor | None = None


class ComputeAt(MoveStmt):
    keyword: ClassVar[str] = "compute_at"


class ReverseComputeAt(MoveStmt):
    keyword: ClassVar[str] = "reverse_compute_at"


@dataclass(frozen=True)
class InlineStmt(Stmt):
    """`compute_inline B` (and `reverse_compute_inline`): block B disappears into another."""

    block: Name


class ComputeInline(InlineStmt):
    keyword: ClassVar[str] = "compute_inline"


class ReverseComputeInline(InlineStmt):
    keyword: ClassVar[str] = "reverse_compute_inline"


@dataclass(frozen=True)
class Rfactor(Stmt):
    """`rfactor k.i [factor_axis 1] [as C_rf]`: the factored axis goes at position `factor_axis`
    of the new buffer's shape (first when not given)."""

    keyword: ClassVar[str] = "rfactor"
    axis: Name
    alias: Name | None = None
    factor_axis: IntFactor | None = None

    @property
    def factor_position(self) -> int:
        return self.factor_axis.value if self.factor_axis is not None else 0


@dataclass(frozen=True)
class DecomposeReduction(Stmt):
    keyword: ClassVar[str] = "decompose_reduction"
    block: Name | None
    axis: Name


@dataclass(frozen=True)
class StorageAlign(Stmt):
    """`storage_align A_shared dim 0 factor 32 offset 1`: pad a buffer's rows against bank
    conflicts."""

    keyword: ClassVar[str] = "storage_align"
    block: Name
    dim: IntFactor
    factor: IntFactor
    offset: IntFactor


@dataclass(frozen=True)
class PragmaItem(Node):
    key: Name
    value: Factor


@dataclass(frozen=True)
class Pragma(Stmt):
    keyword: ClassVar[str] = "pragma"
    axis: Name
    items: tuple[PragmaItem, ...]


@dataclass(frozen=True)
class Comment(Node):
    """`# text`; `trailing` when it ends the line of the statement before it."""

    text: str
    trailing: bool = False


def __getattr__(name: str) -> tuple:
    """`STATEMENT_KINDS` (block header and param first) and their `KEYWORDS`, the registry's
    included once schedlang.lang.statements is imported."""
    if name == "STATEMENT_KINDS":
        return tuple(_STATEMENT_KINDS)
    if name == "KEYWORDS":
        return tuple(kind.keyword for kind in _STATEMENT_KINDS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
