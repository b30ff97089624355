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

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from lark import Token

from schedlang.lang import nodes

# The kinds of name a statement takes, by the AST field that holds it.
Role = Literal["block", "axis", "buffer", "knob", "scope", "thread", "alias", "key"]

# What the `keep_unit_loops` rule becomes until its statement is built.
KEEP_UNIT_LOOPS = object()


class Aliased:
    """The name after `as`, told apart from the axes before it until the statement is built."""

    def __init__(self, name: nodes.Name):
        self.name = name


class Children:
    """A grammar rule's children, read left to right by the statement's arguments; `builder` is
    the parser's (schedlang.lang.syntax), which makes names and integers with their spans."""

    def __init__(self, builder: Any, children: list):
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
    """One argument: the AST `field` it fills, the `word` written before it (`at`, `by`, `for`),
    and whether it may be left out (`optional`; then the field is None, or empty)."""

    field: str
    word: str | None = None
    optional: bool = False
    role: ClassVar[Role | None] = None
    many: ClassVar[bool] = False  # a run of values, each written apart: `i, j` (a tuple)
    absent: ClassVar[Any] = None

    def matches(self, child: Any) -> bool:
        raise NotImplementedError

    def value(self, child: Any, children: Children) -> Any:
        """The AST value of one child."""
        return child

    def take(self, children: Children) -> dict[str, Any]:
        """The fields this argument fills, read from `children`: its value, or a run of them."""
        word = children.peek()  # a word that is a named terminal (`pad_value`) stays a child
        if self.word and isinstance(word, Token) and word == self.word and not self.matches(word):
            children.take()
        found = []
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
        return item.text

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
        return self.matches(Token("NAME", "x"))


@dataclass(frozen=True)
class Axis(Arg):
    """A loop of the current block: `i.o`. `consumed`: the statement replaces it by new loops.
    `written_absent`: what stands for it when left out (`add_unit_loop block`)."""

    field: str = "axis"
    consumed: bool = False
    written_absent: str | None = None
    role: ClassVar[Role | None] = "axis"

    def matches(self, child: Any) -> bool:
        return isinstance(child, nodes.Name)

    def write(self, stmt: nodes.Stmt) -> str | None:
        if getattr(stmt, self.field) is None and self.written_absent:
            return self.written_absent
        return super().write(stmt)


@dataclass(frozen=True)
class Axes(Axis):
    """Loops of the current block, one or more: `i.o, j.o`."""

    field: str = "axes"
    many: ClassVar[bool] = True


@dataclass(frozen=True)
class Terminal(Arg):
    """A name the grammar reads as one terminal: the kinds below, or `Word(field, terminal=…)`
    for a name of no role (an intrinsic, a math function)."""

    terminal: ClassVar[str] = "NAME"

    def matches(self, child: Any) -> bool:
        return isinstance(child, Token) and child.type == self.terminal

    def value(self, child: Any, children: Children) -> Any:
        return children.name(child)


@dataclass(frozen=True)
class Block(Terminal):
    """A block by name. `moved`: the statement moves this block into the current one's loop."""

    field: str = "block"
    moved: bool = False
    role: ClassVar[Role | None] = "block"


@dataclass(frozen=True)
class Blocks(Block):
    """Blocks by name, one or more: `for B, D`."""

    many: ClassVar[bool] = True


@dataclass(frozen=True)
class Buffer(Terminal):
    field: str = "buffer"
    role: ClassVar[Role | None] = "buffer"


@dataclass(frozen=True)
class Scope(Terminal):
    """A memory scope: `shared`, `local`, …"""

    field: str = "scope"
    role: ClassVar[Role | None] = "scope"
    terminal: ClassVar[str] = "SCOPE"


@dataclass(frozen=True)
class Thread(Terminal):
    """A thread axis: `threadIdx.x`."""

    field: str = "thread"
    role: ClassVar[Role | None] = "thread"
    terminal: ClassVar[str] = "THREAD"


@dataclass(frozen=True)
class Word(Terminal):
    """A name of no role, read as the grammar terminal `grammar_terminal` (INTRIN, MATH_FN)."""

    grammar_terminal: str = "NAME"

    def matches(self, child: Any) -> bool:
        return isinstance(child, Token) and child.type == self.grammar_terminal


@dataclass(frozen=True)
class Int(Arg):
    """An integer: `index 2`, `dim 0`."""

    def matches(self, child: Any) -> bool:
        literal = isinstance(child, Token) and child.type in ("INT", "SIGNED_INT")
        return literal or isinstance(child, nodes.IntFactor)

    def value(self, child: Any, children: Children) -> Any:
        return child if isinstance(child, nodes.IntFactor) else children.int(child)

    def text_of(self, item: Any) -> str:
        return str(item.value)


@dataclass(frozen=True)
class Ints(Int):
    """Integers, one or more: `16, 16, 8`."""

    many: ClassVar[bool] = True


@dataclass(frozen=True)
class Factors(Arg):
    """Loop factors, each a number, a knob or `*`: the statement's knob-able values."""

    field: str = "factors"
    role: ClassVar[Role | None] = "knob"
    many: ClassVar[bool] = True

    def matches(self, child: Any) -> bool:
        return isinstance(child, nodes.IntFactor | nodes.KnobFactor | nodes.InferredFactor)

    def text_of(self, item: Any) -> str:
        return format_factor(item)

    def factors(self, value: Any) -> tuple[nodes.Factor, ...]:
        return value

    def bind(self, value: Any, factor: Any) -> Any:
        return tuple(factor(f) for f in value)


@dataclass(frozen=True)
class PragmaItems(Arg):
    """`key=value` pairs, each value a factor: `auto_unroll_max_step=16, unroll_explicit=1`."""

    field: str = "items"
    role: ClassVar[Role | None] = "key"
    many: ClassVar[bool] = True

    def matches(self, child: Any) -> bool:
        return isinstance(child, nodes.PragmaItem)

    def text_of(self, item: Any) -> str:
        return f"{item.key.text}={format_factor(item.value)}"

    def factors(self, value: Any) -> tuple[nodes.Factor, ...]:
        return tuple(item.value for item in value)

    def bind(self, value: Any, factor: Any) -> Any:
        return tuple(replace(item, value=factor(item.value)) for item in value)


@dataclass(frozen=True)
class Alias(Arg):
    """The name a new block or loop gets: `as ij`."""

    field: str = "alias"
    word: str | None = "as"
    optional: bool = True
    role: ClassVar[Role | None] = "alias"

    def matches(self, child: Any) -> bool:
        return isinstance(child, Aliased)

    def value(self, child: Any, children: Children) -> Any:
        return child.name


@dataclass(frozen=True)
class KeepUnitLoops(Arg):
    """`keep_unit_loops`: a moved block keeps the loops of extent 1 it gets (TVM's
    preserve_unit_loops)."""

    field: str = "keep_unit_loops"
    optional: bool = True
    absent: ClassVar[Any] = False

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
