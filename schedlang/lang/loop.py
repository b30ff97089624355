"""What the checker and the lowering know about one loop, without TVM: its schedlang name, extent,
kind and binding (schedlang.lang.nest reads them off a live schedule)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tvm import s_tir

    from schedlang.core.diagnostics import Span


class LoopKind(StrEnum):
    SPATIAL = "spatial"
    REDUCE = "reduce"
    MIXED = "spatial+reduce"
    OUTER = "outer"  # binds no iterator of this block (e.g. a loop it was computed at)


@dataclass(frozen=True)
class Loop:
    name: str
    rv: s_tir.LoopRV = field(compare=False, repr=False)
    extent: int | None
    kind: LoopKind
    thread: str | None  # the thread axis it is bound to, if any
    annotation: str | None  # "parallel", "vectorized", "unrolled" or None


@dataclass
class Consumed:
    """How an axis stopped existing, for "`i` was split into `i.o`, `i.i` at line 2"."""

    how: str
    line: int
    into: tuple[str, ...]
    span: Span | None = None  # the statement that did it
