"""What a proposer is: it reads an op and a target (a `Context`) and writes schedlang text, a
template with `param` knobs for the tuner to search or a concrete schedule (a `Proposal`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from schedlang.core.diagnostics import SchedlangError

if TYPE_CHECKING:  # no TVM at import: a consumer may only need these names
    from schedlang.core.ops import Op
    from schedlang.core.target import Target
    from schedlang.store.db import Database
    from schedlang.store.records import Record


class NothingToTune(SchedlangError):
    """No template and no schedule to measure: the proposer has none for the op, or a task's
    templates are spent. What goes on past it (a model's other tasks, an evaluation's other
    arms) catches this type."""


@dataclass(frozen=True)
class Context:
    op: Op
    target: Target
    hint: str | None = None
    # What a proposer may read besides the op's history: the database (the records of other ops,
    # for a warm start), and where its decisions go in the tuner's run log.
    db: Database | None = field(default=None, compare=False)
    log: Callable[[str], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Proposal:
    text: str  # schedlang text: a template (with `param` knobs) or a concrete schedule
    proposer: str  # "builtin", "model:<id>", …
    note: str = ""  # one line: what the template is
    extra: dict = field(default_factory=dict)
    # A concrete schedule that is a point of a template: the template's text, and its knobs.
    template: str | None = None
    knobs: dict[str, int] = field(default_factory=dict)


class Proposer(Protocol):
    name: str

    def propose(self, context: Context, history: Sequence[Record], count: int) -> list[Proposal]:
        """At most `count` proposals not returned before; [] when there is nothing more."""
        ...
