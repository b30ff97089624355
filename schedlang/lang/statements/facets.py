"""A statement, split by concern: one small record per layer that reads it, keyed by keyword.

    Syntax      how it is written: keyword, AST class, arguments (schedlang.lang.statements.args),
                example, description, summary row; the builder, printer, roles, knob factors,
                and the axes and blocks it consumes, moves and makes follow from it
    Checking    its guard, soundness rule and bookkeeping, run by schedlang.checker.check
    Lowering    the `s_tir.Schedule` primitives it applies (schedlang.checker.primitives)
    Trace       the TVM trace instruction it reads back (schedlang.interop.decompiler)
    Decoding    the steps stepwise decoding offers with it (schedlang.llm.stepwise)

Each family module declares its statements' `Syntax` (`STATEMENTS`) and their other facets
(`FACETS`) next to the code they name; the registry (schedlang.lang.statements) keys each kind of
facet by keyword, and tests/test_registry.py checks that every keyword has every facet it needs.
Guards and lowerings take the checker or the live nest as an argument (the checker as the
`Checker` Protocol of facade.py): this package imports nothing above schedlang.lang.nest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from schedlang.lang import nodes
from schedlang.lang.statements.args import Arg, Axis, Block, Builder, Children, Role

if TYPE_CHECKING:
    from lark.tree import Meta

    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.decoding import StepPattern, StepView
    from schedlang.lang.statements.decompiling import Decompile
    from schedlang.lang.statements.facade import Checker


def _nothing(*_: object) -> tuple[()]:
    return ()


def _says_nothing(*_: object) -> None:
    return None


def _reads_any(_attrs: list[Any]) -> bool:
    return True


@dataclass(frozen=True)
class Syntax:
    """How a statement is written, and what follows from its arguments. `creates_axes(stmt)` and
    `creates_blocks(stmt, current block)` are the names of the loops and blocks it makes."""

    keyword: str
    node: type[nodes.Stmt]
    family: str
    args: tuple[Arg, ...]
    example: str  # shown under a syntax error inside the statement
    description: str  # one line for the model's reference (prompts/)
    # The row of the summary table in docs/language.md: syntax, primitive(s), what it creates.
    summary: tuple[str, str, str]
    # What a syntax error says a NAME right after the keyword should be, when not its role's word.
    name_after: str | None = None
    creates_axes: Callable[[Any], tuple[str, ...]] = _nothing
    creates_blocks: Callable[[Any, str], tuple[str, ...]] = _nothing

    @property
    def rule(self) -> str:
        """The grammar rule (grammar/schedlang.lark) that parses it."""
        return self.keyword

    @property
    def roles(self) -> dict[str, Role]:
        """AST field → the kind of name it holds."""
        return {arg.field: arg.role for arg in self.args if arg.role}

    @property
    def name_role(self) -> Role | None:
        """The role of the grammar rule's bare NAME token, for the decoding grammar and the
        model's reference."""
        return next((arg.role for arg in self.args if arg.takes_name), None)

    def build(self, builder: Builder, meta: Meta, children: list[Any]) -> nodes.Stmt:
        """The AST node of the rule's children (the parser's `builder` makes names and spans)."""
        cursor = Children(builder, children)
        fields: dict[str, Any] = {}
        for arg in self.args:
            fields.update(arg.take(cursor))
        assert cursor.at == len(children), f"`{self.keyword}` left {children[cursor.at :]} unread"
        return self.node(**fields, span=builder._at(meta))

    def format(self, stmt: nodes.Stmt) -> str:
        """The statement in canonical form."""
        written = (arg.write(stmt) for arg in self.args)
        return " ".join([self.keyword, *(text for text in written if text is not None)])

    def factors(self, stmt: nodes.Stmt) -> tuple[nodes.Factor, ...]:
        """The knob-able factors in it."""
        return tuple(f for arg in self.args for f in arg.factors(getattr(stmt, arg.field)))

    @property
    def takes_knobs(self) -> bool:
        return any(type(arg).factors is not Arg.factors for arg in self.args)

    def bind_factors(self, stmt: Any, factor: Callable[[nodes.Factor], nodes.Factor]) -> Any:
        """The statement with each knob-able factor mapped by `factor`."""
        changed = {arg.field: arg.bind(getattr(stmt, arg.field), factor) for arg in self.args}
        return replace(stmt, **changed)

    def consumes_axes(self, stmt: Any) -> tuple[str, ...]:
        """The loops it replaces by new ones (those of its arguments declared `consumed`)."""
        consumed: list[nodes.Name] = []
        for arg in self.args:
            if isinstance(arg, Axis) and arg.consumed:
                value = getattr(stmt, arg.field)
                consumed += value if arg.many else [value]
        return tuple(name.text for name in consumed)

    def moves_block(self, stmt: Any) -> str | None:
        """The block it moves into another block's loop."""
        moved = next((a for a in self.args if isinstance(a, Block) and a.moved), None)
        return getattr(stmt, moved.field).text if moved else None


def copy_block(target: str) -> Callable[[Any, str], tuple[str, ...]]:
    """`creates_blocks` of a cache whose AST field `target` names what it copies: its `as`
    name, else the target's name and the scope's (`A_shared`)."""

    def creates(stmt: Any, block: str) -> tuple[str, ...]:
        return (
            stmt.alias.text
            if stmt.alias
            else nodes.cache_block_name(getattr(stmt, target), stmt.scope),
        )

    return creates


@dataclass(frozen=True)
class Checking:
    """`guard(checker, stmt, block)` reports through the checker (as facade.py types it) and may
    raise its skip, before the statement is applied; the rest run after it is applied."""

    statement: Syntax
    guard: Callable[[Checker, Any, str], None]
    # What TVM applies without complaint but computes wrong.
    soundness: Callable[[Checker, Any, str], None] | None = None
    # What the GPU verifier's findings, which name no statement, are traced back to.
    record: Callable[[Checker, Any, str], None] | None = None
    # What the checker remembers of it on any target.
    provenance: Callable[[Checker, Any, str], None] | None = None


@dataclass(frozen=True)
class Lowering:
    """`lower(nest, block, stmt)` applies the checked, knob-free statement to the live schedule."""

    statement: Syntax
    lower: Callable[[Nest, str, Any], None]


@dataclass(frozen=True)
class Trace:
    """The TVM trace `instruction` the statement is read back from: `decompile(reader, inputs,
    attrs)` emits the statements it becomes."""

    statement: Syntax
    instruction: str
    decompile: Decompile
    # (the instruction's attributes) → whether this statement reads it (where two read one).
    reads_instruction: Callable[[list[Any]], bool] = _reads_any
    # What the instruction's attributes ask that schedlang cannot do: (message, notes…) or None.
    untranslatable: Callable[[list[Any]], tuple[str, ...] | None] = _says_nothing
    # (inputs, attributes) → why the statement does not do what its instruction did, as far as
    # the instruction says (the decompiler found the two functions differ), or None.
    divergence: Callable[[list[Any], list[Any]], str | None] = _says_nothing
    # (it, the statement after it) → the one statement a person writes for both, or None.
    absorbs: Callable[[Any, Any], Any] = _says_nothing


# What a statement's steps range over in a block: "block", once (the item is None); "free loop",
# each loop of `view.free(block)`; "other block", each block but this one.
StepsOver = Literal["block", "free loop", "other block"]


@dataclass(frozen=True)
class Decoding:
    """The steps stepwise decoding offers with a statement in a block: `write(view, block, item)`
    for each item it ranges `over`, each a text or a `StepPattern`. Statements of a family that
    range over the same loops or blocks are offered together, item by item (`bind` and `unroll`
    loop by loop)."""

    statement: Syntax
    write: Callable[[StepView, str, Any], Iterable[str | StepPattern]]
    over: StepsOver = "block"


Facet = Checking | Lowering | Trace | Decoding
F = TypeVar("F", Checking, Lowering, Trace, Decoding)


# --- declaring facets ----------------------------------------------------------------------------

# Facet kind → keyword → the fields declared so far (its functions are declared one by one).
_DECLARED: dict[type, dict[str, dict[str, Any]]] = {}
Declared = TypeVar("Declared", bound=Callable[..., Any])


def _declarer(kind: type, field: str, *given: str) -> Callable[..., Callable[[Declared], Declared]]:
    """A decorator factory: `@facets.guard(SPLIT)` above a function declares it the `guard` of
    split's `Checking` facet; the arguments after the statement are the facet's fields `given`
    (`@facets.decompile(SPLIT, "Split")`: its instruction), or named ones (`over=`)."""

    def declare(statement: Syntax, *values: Any, **named: Any) -> Callable[[Declared], Declared]:
        def register(function: Declared) -> Declared:
            fields = _DECLARED.setdefault(kind, {}).setdefault(statement.keyword, {})
            assert field not in fields, f"`{statement.keyword}` declares two {field}"
            fields.update(zip(given, values, strict=True), **named)
            fields.update(statement=statement, **{field: function})
            return function

        return register

    return declare


guard = _declarer(Checking, "guard")
soundness = _declarer(Checking, "soundness")
record = _declarer(Checking, "record")
provenance = _declarer(Checking, "provenance")
lower = _declarer(Lowering, "lower")
decompile = _declarer(Trace, "decompile", "instruction")
reads_instruction = _declarer(Trace, "reads_instruction")
untranslatable = _declarer(Trace, "untranslatable")
divergence = _declarer(Trace, "divergence")
absorbs = _declarer(Trace, "absorbs")
steps = _declarer(Decoding, "write")  # with what it ranges `over`, unless a block


def declared(kind: type[F]) -> dict[str, F]:
    """Keyword → its facet of `kind`, from the functions declared so far (a facet lacking a
    required field, such as a `Checking` without a guard, fails here)."""
    return {keyword: kind(**fields) for keyword, fields in _DECLARED.get(kind, {}).items()}
