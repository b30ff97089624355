"""What the whole-schedule rules read of the checker: the `CheckerState` Protocol.

The statements see the checker as `Checker` (schedlang.lang.statements.facade); the rules that run
once every statement is checked (schedlang.checker.kernel_rules, gpu_rules, gpu_verifier) see it as
this extension of it: the function as written, every finding so far, and where each block came
from. The checker (schedlang.checker.check) is the one implementation; the rules never import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from schedlang.lang.statements.facade import Checker

if TYPE_CHECKING:
    from schedlang.core.diagnostics import Diagnostic, Span


@dataclass(frozen=True)
class Bound:
    """One `bind` statement: the thread axis, the loop's extent and where it was written."""

    thread: str
    extent: int | None
    span: Span


class CheckerState(Checker, Protocol):
    """The checker after its pass over the statements, as the whole-schedule rules see it."""

    written: object  # tirx.PrimFunc: the function as written, before any statement
    partial: bool  # a GPU block may stay unbound: something else finishes it
    diagnostics: list[Diagnostic]  # every finding so far, in the order found
    block_spans: dict[str, Span]  # block → the start of its first section
    created_by: dict[str, Span]  # block → the statement that created it
    moved_by: dict[str, Span]  # block → the last compute_at that moved it
    unknown_blocks: set[str]  # blocks an earlier error left undefined
    failed_binds: set[str]  # blocks with a rejected `bind`: already reported
    unbound: dict[str, Diagnostic]  # GPU blocks with no thread binding, and what says so
    binds: list[Bound]  # every `bind`, in order

    def kernel_of(self, block: str) -> object: ...

    def bind_span(self, thread: str, extent: int | None) -> Span | None: ...
