"""The kinds of argument a statement takes, each declared once with the AST field it fills.

A statement lists its arguments in the order it is written (`split`: `Axis(), Factors(word="by")`)
and everything that follows from them follows from that list (schedlang.lang.statements.facets):
the parser's builder takes each one's value from the grammar rule's children, left to right; the
printer writes each one (its `word` first, none when an optional one is absent), joined by spaces;
the role of each name (`roles`, read by the decoding grammar and the model's reference) is its
kind's; the knob-able factors are those of `Factors`; the axes it consumes and the block it moves
are those declared so.

A kind reads the grammar's children as lark leaves them: an `axis` rule is already a `nodes.Name`,
a `factor` a factor node, `_as` an `Aliased`, `keep_unit_loops` the `KEEP_UNIT_LOOPS` marker, and
a terminal (NAME, SCOPE, INT, …) a lark `Token`. A family with an argument of its own (annotate's
items, a layout's index map) declares its kind in its module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from lark import Token
from lark.tree import Meta

from schedlang.core.diagnostics import Span
from schedlang.lang import nodes

# The kinds of name a statement takes, by the AST field that holds it.
Role = Literal["block", "axis", "buffer", "knob", "scope", "thread", "alias", "key"]

# What the `keep_unit_loops` rule becomes until its statement is built.
KEEP_UNIT_LOOPS = object()


class Aliased:
    """The name after `as`, told apart from the axes before it until the statement is built."""

    def __init__(self, name: nodes.Name):
        self.name = name


class Builder(Protocol):
    """What the statements need of the parser's builder (schedlang.lang.syntax, a layer above)."""

    def _at(self, meta: Meta) -> Span: ...

    def _name(self, token: Token) -> nodes.Name: ...

    def _int(self, token: Token) -> nodes.IntFactor: ...


class Children:
    """A grammar rule's children, read left to right by the statement's arguments; `builder` is
    the parser's (schedlang.lang.syntax), which makes names and integers with their spans."""

    def __init__(self, builder: Builder, children: list[Any]):
        self.builder = builder
        self.items = children
        self.at = 0

    def peek(self) -> Any:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self) -> Any:
        self.at += 1
        return self.items[self.at - 1]

    def name(self, token: Token) -> nodes.Name:
        return self.builder._name(token)

    def int(self, token: Token) -> nodes.IntFactor:
        return self.builder._int(token)


@dataclass(frozen=True)
class Arg:
    """One argument: the AST `field` it fills (by default its kind's role: `block`, `scope`), the
    `word` written before it (`at`, `by`, `for`), and whether it may be left out (`optional`;
    then the field is None, or empty). A kind says, as class keywords, the role of the names it
    holds, whether it is a run of values (`many`: a tuple, `i, j`), and the grammar terminal it
    reads (`terminal`, for a name)."""

    field: str = ""
    word: str | None = None
    optional: bool = False
    role: ClassVar[Role | None] = None
    many: ClassVar[bool] = False
    terminal: ClassVar[str | None] = None
    absent: ClassVar[Any] = None

    def __init_subclass__(cls, **kind: Any) -> None:
        super().__init_subclass__()
        for name, value in kind.items():
            assert name in ("role", "many", "terminal", "absent"), f"no kind keyword {name}"
            setattr(cls, name, value)

    def __post_init__(self) -> None:
        if not self.field:
            object.__setattr__(self, "field", self.role)

    def matches(self, child: Any) -> bool:
        """Whether a child of the grammar rule is this argument's (a name: of its terminal)."""
        return isinstance(child, Token) and child.type == self.terminal

    def value(self, child: Any, children: Children) -> Any:
        """The AST value of one child (a name: the `nodes.Name` of its token)."""
        return children.name(child) if self.terminal else child

    def take(self, children: Children) -> dict[str, Any]:
        """The fields this argument fills, read from `children`: its value, or a run of them."""
        word = children.peek()  # a word that is a named terminal (`pad_value`) stays a child
        if self.word and isinstance(word, Token) and word == self.word and not self.matches(word):
            children.take()
        found: list[Any] = []
        while self.matches(children.peek()) and (self.many or not found):
            found.append(self.value(children.take(), children))
        if self.many:
            return {self.field: tuple(found)}
        return {self.field: found[0] if found else self.absent}

    def text(self, value: Any) -> str:
        """The value as written."""
        if self.many:
            return ", ".join(self.text_of(item) for item in value)
        return self.text_of(value)

    def text_of(self, item: Any) -> str:
        text: str = item.text
        return text

    def write(self, stmt: nodes.Stmt) -> str | None:
        """The argument as written in `stmt`, its word first; None when it is absent."""
        value = getattr(stmt, self.field)
        if value is None or value == () or value is False:
            return None
        return f"{self.word} {self.text(value)}" if self.word else self.text(value)

    def factors(self, value: Any) -> tuple[nodes.Factor, ...]:
        """The knob-able factors in the value (none but for `Factors` and pragma items)."""
        return ()

    def bind(self, value: Any, factor: Any) -> Any:
        """The value with each of its factors mapped by `factor`."""
        return value

    @property
    def takes_name(self) -> bool:
        """Whether it reads the grammar's bare NAME token (a block or buffer name)."""
        return self.terminal == "NAME"


@dataclass(frozen=True)
class Axis(Arg, role="axis"):
    """A loop of the current block: `i.o`. `consumed`: the statement replaces it by new loops.
    `written_absent`: what stands for it when left out (`add_unit_loop block`)."""

    consumed: bool = False
    written_absent: str | None = None

    def matches(self, child: Any) -> bool:
        return isinstance(child, nodes.Name)

    def write(self, stmt: nodes.Stmt) -> str | None:
        if getattr(stmt, self.field) is None and self.written_absent:
            return self.written_absent
        return super().write(stmt)


@dataclass(frozen=True)
class Axes(Axis, many=True):
    """Loops of the current block, one or more: `i.o, j.o`."""

    field: str = "axes"


@dataclass(frozen=True)
class Block(Arg, role="block", terminal="NAME"):
    """A block by name. `moved`: the statement moves this block into the current one's loop."""

    moved: bool = False


def named_block(stmt: Any, block: str) -> str:
    """The block an optional `Block()` names (`decompose_reduction C at k`), else `block`, the
    current one."""
    return stmt.block.text if stmt.block else block


class Blocks(Block, many=True):
    """Blocks by name, one or more: `for B, D`."""


class Buffer(Arg, role="buffer", terminal="NAME"):
    """A buffer by name."""


class Scope(Arg, role="scope", terminal="SCOPE"):
    """A memory scope: `shared`, `local`, …"""


class Thread(Arg, role="thread", terminal="THREAD"):
    """A thread axis: `threadIdx.x`."""


class Intrinsic(Arg, terminal="INTRIN"):
    """A tensor intrinsic registered with TVM: `mma_f16f16f32`."""


class MathFunction(Arg, terminal="MATH_FN"):
    """A function `fast_math` rewrites: `exp`."""


class Int(Arg):
    """An integer: `index 2`, `dim 0`."""

    def matches(self, child: Any) -> bool:
        literal = isinstance(child, Token) and child.type in ("INT", "SIGNED_INT")
        return literal or isinstance(child, nodes.IntFactor)

    def value(self, child: Any, children: Children) -> Any:
        return child if isinstance(child, nodes.IntFactor) else children.int(child)

    def text_of(self, item: Any) -> str:
        return str(item.value)


class Ints(Int, many=True):
    """Integers, one or more: `16, 16, 8`."""


@dataclass(frozen=True)
class Factors(Arg, role="knob", many=True):
    """Loop factors, each a number, a knob or `*`: the statement's knob-able values."""

    field: str = "factors"

    def matches(self, child: Any) -> bool:
        return isinstance(child, nodes.IntFactor | nodes.KnobFactor | nodes.InferredFactor)

    def text_of(self, item: Any) -> str:
        return format_factor(item)

    def factors(self, value: Any) -> tuple[nodes.Factor, ...]:
        factors: tuple[nodes.Factor, ...] = value
        return factors

    def bind(self, value: Any, factor: Any) -> Any:
        return tuple(factor(f) for f in value)


@dataclass(frozen=True)
class Items(Arg, role="key", many=True):
    """`key=value` pairs, each written `key=value_text(value)`."""

    field: str = "items"

    def text_of(self, item: Any) -> str:
        return f"{item.key.text}={self.value_text(item.value)}"

    def value_text(self, value: Any) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Alias(Arg, role="alias"):
    """The name a new block or loop gets: `as ij`."""

    word: str | None = "as"
    optional: bool = True

    def matches(self, child: Any) -> bool:
        return isinstance(child, Aliased)

    def value(self, child: Any, children: Children) -> Any:
        return child.name


@dataclass(frozen=True)
class KeepUnitLoops(Arg, absent=False):
    """`keep_unit_loops`: a moved block keeps the loops of extent 1 it gets (TVM's
    preserve_unit_loops)."""

    field: str = "keep_unit_loops"

    def matches(self, child: Any) -> bool:
        return child is KEEP_UNIT_LOOPS

    def value(self, child: Any, children: Children) -> Any:
        return True

    def write(self, stmt: nodes.Stmt) -> str | None:
        return "keep_unit_loops" if getattr(stmt, self.field) else None


def format_factor(factor: nodes.Factor) -> str:
    match factor:
        case nodes.IntFactor(value=value):
            return str(value)
        case nodes.KnobFactor(name=name):
            return name
        case nodes.InferredFactor():
            return "*"
    raise TypeError(f"not a factor: {factor!r}")
