"""What a statement's `Trace` facet reads a TVM trace instruction with (schedlang.lang.statements.
facets): the `TraceReader` the decompiler (schedlang.interop.decompiler) is, the `Untranslatable`
error, and the helpers of several families' decompile handlers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from schedlang.lang import nodes

if TYPE_CHECKING:
    from tvm import s_tir

    from schedlang.lang.nest import Nest


class Untranslatable(Exception):
    """A trace instruction schedlang cannot express: the message, then notes."""

    def __init__(self, message: str, *notes: str):
        super().__init__(message)
        self.message = message
        self.notes = notes


class TraceReader(Protocol):
    """What a statement's `decompile(reader, inputs, attrs)` reads its TVM trace instruction with
    (schedlang.interop.decompiler). `reference` is the schedule TVM replays the trace on, `nest`
    schedlang's, equal to it after every instruction; the names are schedlang's."""

    nest: Nest
    reference: s_tir.Schedule

    def block_name(self, block_rv: Any) -> str:
        """schedlang's name for a block of the reference."""

    def axis(
        self, loop_rv: Any, exclude: str | None = None, prefer: str | None = None
    ) -> tuple[str, str]:
        """(a block under the loop, the loop's schedlang name in it)."""

    def axes(self, loop_rvs: list[Any]) -> tuple[str, list[str]]:
        """A block under all the loops, and their names in it."""

    def value(self, value: Any) -> int | None:
        """An integer input: a constant, or a sampled value (its decision)."""

    def is_loop(self, rv: Any) -> bool:
        """Whether an input is a loop (else a block)."""

    def location(self, block: str) -> int | None:
        """The compute location sampled for `block` (-2: inline, -1: root), if any."""

    def other_section(self, leaving: str) -> str:
        """A section for a statement that makes block `leaving` disappear."""

    def emit(self, block: str, stmt: nodes.Stmt) -> None:
        """Apply `stmt` to the nest and write it, in block `block`'s section."""

    def restate(self, stmt: nodes.Stmt) -> None:
        """Write the statement just emitted as `stmt` instead (it does the same)."""

    def defer(self) -> None:
        """Compare the two schedules only after the next instruction, which completes this one."""


# How a statement reads one instruction of a TVM trace: its inputs and attrs are TVM objects.
Decompile = Callable[[TraceReader, list[Any], list[Any]], None]


class _WithItems(Protocol):
    """A statement of key = value items (pragma, annotate): a dataclass."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def items(self) -> tuple[Any, ...]: ...


_Joined = TypeVar("_Joined", bound=_WithItems)


def join_items(first: _Joined, second: _WithItems) -> _Joined | None:
    """`first` with the items (key = value) of `second` after its own, or None when the two
    set a key in common."""
    if {item.key.text for item in first.items} & {item.key.text for item in second.items}:
        return None
    return replace(first, items=first.items + second.items)


def owner_and_loop(reader: TraceReader, inputs: list[Any]) -> tuple[str, str]:
    """The block an instruction changes (its first input) and the name of the loop of it that
    the instruction names (its second input)."""
    owner = reader.block_name(inputs[0])
    _, axis = reader.axis(inputs[1], prefer=owner)
    if axis not in [loop.name for loop in reader.nest.loops(owner)]:
        raise Untranslatable(f"the loop is not a loop of block {owner}")
    return owner, axis


# Shared by the cache statements (buffers: cache_read/cache_write; blocks: reindex_cache_*); here,
# not in buffers, so that blocks does not import buffers: the AST classes register in family order.
def cache_scope_untranslatable(attrs: list[Any]) -> tuple[str, ...] | None:
    """A cache instruction's scope (its second attribute) that schedlang has no name for."""
    if str(attrs[1]) not in nodes.SCOPES:
        return (f"schedlang caches in {', '.join(nodes.SCOPES)}, not `{attrs[1]}`",)
    return None
