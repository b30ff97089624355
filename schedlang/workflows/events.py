"""What a workflow reports while it runs: small frozen events, handed to a sink the caller passes.

    def show(event: Event) -> None:
        if isinstance(event, TrialMeasured):
            print(event.done, event.last.status)

    tune_op(op, target, db, events=show)

A sink is any callable taking an Event; the default drops them. Events report, they decide
nothing: a workflow's result is its return value, never something a sink hands back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from schedlang.models.tune_model import Turn
    from schedlang.store.records import Record


@dataclass(frozen=True)
class Note:
    """A line for the user: what a workflow decided or could not do (an estimate, a warning:
    `warning`, a rendered diagnostic)."""

    text: str
    warning: bool = False


@dataclass(frozen=True)
class TaskStarted:
    """A tuning run of one op (or a round of one of a model's tasks) begins: `trials` to measure."""

    name: str
    trials: int


@dataclass(frozen=True)
class TrialMeasured:
    """A candidate measured: `done` of `total` this run, its record, the best so far."""

    name: str
    done: int
    total: int
    failures: int
    last: Record
    best: Record | None


@dataclass(frozen=True)
class TaskFinished:
    """The run (or round) of `name` ended, normally, by an error or by Ctrl-C."""

    name: str


@dataclass(frozen=True)
class ModelPlanned:
    """A model's tasks and what the built-in proposer found for each, before any is measured."""

    model: str
    target: str  # the target's kind
    tasks: list[Any]  # models.graph.Task, heaviest first
    plans: dict[str, Any]  # by task key: models.tune_model.Plan
    trials: int


@dataclass(frozen=True)
class RoundDone:
    """One round of one of a model's tasks: what it measured, or the error that stopped it."""

    turn: Turn


@dataclass(frozen=True)
class BuildStep:
    """A step of a model's build done: "built", "verified" (or "not verified"), "wrote",
    "profiled", "compared"; `detail` its result (or why it was not done)."""

    step: str
    detail: Any = None


Event = Note | TaskStarted | TrialMeasured | TaskFinished | ModelPlanned | RoundDone | BuildStep
Events = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The default sink: events are dropped."""
