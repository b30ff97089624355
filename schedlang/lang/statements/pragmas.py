"""Annotations: `pragma`."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from schedlang.core.diagnostics import Span
from schedlang.lang import nodes
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import Axis, Items, format_factor
from schedlang.lang.statements.base import checked_loop, compiler, int_value, loop
from schedlang.lang.statements.decoding import Choice, StepPattern, StepView
from schedlang.lang.statements.decompiling import TraceReader, Untranslatable, join_items
from schedlang.lang.statements.facets import Syntax
from schedlang.lang.statements.loop_kinds import record_unrolled

if TYPE_CHECKING:
    from schedlang.lang.loop import Loop
    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker


@dataclass(frozen=True)
class PragmaItem(nodes.Node):
    key: nodes.Name
    value: nodes.Factor


@dataclass(frozen=True)
class Pragma(nodes.Stmt, keyword="pragma"):
    axis: nodes.Name
    items: tuple[PragmaItem, ...]


class PragmaItems(Items):
    """A pragma's items, each value a factor: `auto_unroll_max_step=16, unroll_explicit=1`."""

    def matches(self, child: Any) -> bool:
        return isinstance(child, PragmaItem)

    def value_text(self, value: Any) -> str:
        return format_factor(value)

    def factors(self, value: Any) -> tuple[nodes.Factor, ...]:
        return tuple(item.value for item in value)

    def bind(self, value: Any, factor: Any) -> Any:
        return tuple(replace(item, value=factor(item.value)) for item in value)


# fmt: off
PRAGMA = Syntax("pragma", Pragma, "pragmas", (Axis(), PragmaItems()),
    example="e.g. `pragma i.o auto_unroll_max_step=16, unroll_explicit=1`",
    description="annotate a loop, e.g. auto_unroll_max_step=16 to unroll what is below it.",
    summary=("`pragma a key=v`", '`sch.annotate(loop, "pragma_key", v)`', "—"))
# fmt: on

STATEMENTS = (PRAGMA,)


@facets.guard(PRAGMA)
def guard_pragma(c: Checker, stmt: Pragma, block: str) -> None:
    c.axis(stmt.axis, block)
    for item in stmt.items:
        assert isinstance(item.value, nodes.IntFactor)
        value = item.value.value
        # The parser only lets these keys through; a schedule built as an AST is checked too,
        # since the key becomes a TVM annotation on the loop.
        if not c.require_known(
            item.key, nodes.PRAGMA_KEYS, f"unknown pragma key `{item.key.text}`", "pragma keys"
        ):
            continue
        if item.key.text == "unroll_explicit":
            c.require(
                value in (0, 1), f"unroll_explicit takes 0 or 1, got {value}", item.value.span
            )
        elif c.require(
            value >= 0, f"{item.key.text} must be at least 0, got {value}", item.value.span
        ):
            auto_unroll_fits(c, value, c.axis(stmt.axis, block), block, item.value.span)


def auto_unroll_fits(c: Checker, max_step: int, loop: Loop, block: str, span: Span) -> None:
    """auto_unroll_max_step unrolls the loops under the pragma up to `max_step` iterations of
    the body: on a CPU, as many copies as `unroll` makes. Found by fuzzing."""
    most = c.target.unroll_max_copies
    loops = c.nest.loops(block)
    iterations = math.prod(x.extent or 1 for x in loops[loops.index(loop) :])
    copies = min(max_step, iterations)
    c.require(
        copies <= most,
        f"auto_unroll_max_step={max_step} unrolls {copies} iterations under `{loop.name}`, "
        f"more than the {most} {compiler(c)} builds in seconds",
        span,
        f"use at most {most}, e.g. auto_unroll_max_step=512",
    )


@facets.lower(PRAGMA)
def lower_pragma(nest: Nest, block: str, stmt: Pragma) -> None:
    for item in stmt.items:
        nest.sch.annotate(
            loop(nest, block, stmt.axis), f"pragma_{item.key.text}", int_value(item.value)
        )


# The annotation key of each pragma, as TVM writes it.
PRAGMA_ATTRS = {f"pragma_{key}": key for key in nodes.PRAGMA_KEYS}


@facets.reads_instruction(PRAGMA)
def _reads_pragma(attrs: list[Any]) -> bool:
    return str(attrs[0]) in PRAGMA_ATTRS


@facets.decompile(PRAGMA, "Annotate")
def decompile_pragma(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    from tvm import tirx

    key = str(attrs[0])
    if not reader.is_loop(inputs[0]):
        raise Untranslatable(f"schedlang annotates only loops, with {', '.join(PRAGMA_ATTRS)}")
    block, axis = reader.axis(inputs[0])
    value = reader.value(inputs[1])
    if value is None:
        raise Untranslatable(f"`{key}` takes an integer in schedlang, not {inputs[1]!r}")
    # MetaSchedule annotates a loop once per block under it: say it once.
    current = reader.nest.sch.get(checked_loop(reader.nest, block, axis).rv).annotations.get(key)
    if isinstance(current, int | tirx.IntImm) and int(current) == value:
        return
    item = PragmaItem(nodes.Name(PRAGMA_ATTRS[key]), nodes.IntFactor(value))
    reader.emit(block, Pragma(nodes.Name(axis), (item,)))


@facets.absorbs(PRAGMA)
def _absorbs_pragma(first: Pragma, second: nodes.Stmt) -> Pragma | None:
    """Pragmas of one loop with no key in common are one line."""
    if not isinstance(second, Pragma) or first.axis != second.axis:
        return None
    return join_items(first, second)


# auto_unroll_max_step values offered to a model (the templates write 1 to 512).
UNROLL_STEPS = ("0", "1", "2", "4", "8", "16", "32", "64", "128", "256", "512")


@facets.steps(PRAGMA)
def _pragma_steps(view: StepView, block: str, _: None) -> list[StepPattern]:
    """auto_unroll_max_step on a CPU loop (a parallel one too: the templates' place for it), on
    a GPU a bound loop's (an annotated loop is never bound after)."""
    return [
        StepPattern(
            (
                f"pragma {loop.name} auto_unroll_max_step=",
                Choice(UNROLL_STEPS),
                ", unroll_explicit=",
                Choice(("0", "1")),
            )
        )
        for loop in view.loops(block)
        if (loop.thread is not None) == view.gpu
    ]


facets.provenance(PRAGMA)(record_unrolled)
