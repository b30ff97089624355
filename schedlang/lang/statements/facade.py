"""What a statement's guard, soundness rule and bookkeeping may use of the checker: `Checker`.

The checker (schedlang.checker.check) passes itself to every `guard`, `soundness`, `record` and
`provenance` of a `Statement`; this Protocol is all of it they touch, so the statements never
import the checker. tests/test_registry.py keeps the two in step: each member here is used by a
statement module and defined by the checker, and a statement module uses no other.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from schedlang.core.diagnostics import Span
    from schedlang.core.target import Target
    from schedlang.lang import nodes
    from schedlang.lang.loop import Loop
    from schedlang.lang.nest import Nest


@dataclass(frozen=True)
class MadeBuffer:
    """A buffer a statement makes whose size waits for the end of the schedule: a later
    `compute_at` (or `reverse_compute_at`) of the block that writes it leaves it what one
    iteration of that loop touches, as TVM allocates it (an rfactor's partial sums computed at
    each position: one position's, not every position's)."""

    name: str
    elements: int  # as the statement makes it
    dtype: str
    span: Span
    notes: tuple[str, ...]


class Checker(Protocol):
    """The checker as the statements see it: the live schedule, the target, reporting, name
    resolution (which raises the checker's skip for a name an earlier error left undefined), and
    what earlier statements did."""

    nest: Nest  # the live schedule, every statement so far applied
    target: Target
    param_buffers: set[str]  # the function's parameters: memory the caller owns
    decomposed: dict[str, int]  # block → line of its decompose_reduction
    read_caches: set[str]  # the copy blocks made by cache_read
    buffer_made_by: dict[str, Span]  # cache buffer → its cache_read/cache_write/set_scope
    aligned_by: dict[str, Span]  # buffer → its storage_align
    unrolled_by: dict[object, Span]  # loop sref → its unroll, pragma or annotate
    vectorized: list[tuple[int | None, nodes.Name]]  # (extent, axis) of each vectorize
    made_buffers: dict[str, MadeBuffer]  # buffer → what made it, sized once all are applied

    # --- reporting: `require` reports when `condition` fails, and returns it ---------------------

    def error(self, message: str, span: Span | None, *notes: str) -> None: ...

    def warn(self, message: str, span: Span | None, *notes: str) -> None: ...

    def warn_or_error(self, message: str, span: Span | None, *notes: str) -> None: ...

    def require(self, condition: bool, message: str, span: Span | None, *notes: str) -> bool: ...

    def require_known(
        self, name: nodes.Name, known: Collection[str], message: str, what: str
    ) -> bool: ...

    # --- name resolution -------------------------------------------------------------------------

    def axis(self, name: nodes.Name, block: str) -> Loop: ...

    def axes(self, names: Iterable[nodes.Name], block: str) -> list[Loop]: ...

    def existing_block(self, name: nodes.Name) -> str: ...

    def distinct(self, names: tuple[nodes.Name, ...]) -> None: ...

    def factor_fits(self, factor: int, loop: Loop, span: Span, what: str = "factor") -> bool: ...

    def new_names_free(self, names: Iterable[str], block: str, span: Span) -> None: ...

    # --- what earlier statements bound -----------------------------------------------------------

    def record_bind(self, thread: str, extent: int | None, span: Span) -> None: ...

    def kernel_threads(self, block: str, besides: Loop) -> dict[str, tuple[int, int]]: ...
