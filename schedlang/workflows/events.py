"""What a workflow reports while it runs: small frozen events.

A workflow function (`tune_op`) hands each event to the sink it is given, any callable taking an
Event (the default drops them):

    tune_op(op, target, db, events=lambda event: print(event))

or, its `_steps` form (`tune_op_steps`), gives them to the caller, who iterates and shows each
as it comes, so that control stays with the caller; the result is read after the last:

    steps = tune_op_steps(op, target, db)
    for event in steps:
        print(event)
    result = steps.result

Events report, they decide nothing: a workflow's result is its return value.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from schedlang.models.tune_model import Turn
    from schedlang.store.records import Record
    from schedlang.tuning.convergence import Stop


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
class Stopped:
    """The run of `name` (an op, or a model) stopped before its trials were spent: it converged,
    or every task stalled (schedlang.tuning.convergence; `stop.reason` is the line for the user).
    Without early stopping (`Settings.early_stop`) there is none."""

    name: str
    stop: Stop


@dataclass(frozen=True)
class ModelPlanned:
    """A model's tasks and what the built-in proposer found for each, before any is measured."""

    model: str
    target: str  # the target's kind
    tasks: list[Any]  # models.graph.Task, heaviest first
    plans: dict[str, Any]  # by task key: models.tune_model.Plan
    trials: int
    lengths: tuple[int, ...] = ()  # where its symbolic functions are measured
    variables: tuple[str, ...] = ()  # its symbolic variables


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


@dataclass(frozen=True)
class DecoderPlanned:
    """A decoder's tuning begins: its kernels, the cache's length, the lengths measured."""

    model: str
    target: str  # the target's kind
    kernels: int
    max_length: int
    lengths: tuple[int, ...]
    trials: int  # per kernel and length


@dataclass(frozen=True)
class KernelTuned:
    """One of a decoder's kernels, or a model's function with symbolic extents, got its
    schedule (or none, with why): models.lengths.KernelChoice."""

    choice: Any


Event = (
    Note | TaskStarted | TrialMeasured | TaskFinished | Stopped | ModelPlanned | RoundDone
    | BuildStep | DecoderPlanned | KernelTuned
)  # fmt: skip
Events = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The default sink: events are dropped."""


R = TypeVar("R")
T = TypeVar("T")


class Steps(Generic[R]):
    """A workflow running, step by step: iterate it for its events, then read `result`.

    Ctrl-C while the caller shows an event: `interrupt()`, and the next step hands it to the
    workflow, which ends as Ctrl-C anywhere else ends it (its own interruption, what it kept)."""

    def __init__(self, steps: Generator[Event, None, R]):
        self._steps = steps
        self._interrupted = False
        self._result: R | None = None
        self._done = False

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        try:
            if self._interrupted:
                self._interrupted = False
                return self._steps.throw(KeyboardInterrupt())
            return next(self._steps)
        except StopIteration as finished:
            self._result, self._done = finished.value, True
            raise StopIteration from None

    @property
    def result(self) -> R:
        if not self._done:
            raise RuntimeError("the workflow has not finished: iterate its steps first")
        return self._result  # type: ignore[return-value]

    def interrupt(self) -> None:
        self._interrupted = True

    def close(self) -> None:
        """Stop the workflow where it is (its workers stopped, its claims released)."""
        self._steps.close()


def as_events(
    steps: Generator[T, None, R], event: Callable[[T], Event | None]
) -> Generator[Event, None, R]:
    """Each step of a lower layer's generator as the event `event` makes of it (None: no event
    for that step), then its result (the generator's return value). `steps` is closed when this
    is (the caller's Ctrl-C, an error, `Steps.close`), which stops its workers."""
    with closing(steps):
        while True:
            try:
                step = next(steps)
            except StopIteration as finished:
                return finished.value
            made = event(step)
            if made is not None:
                yield made


def run_steps(steps: Steps[R], events: Events = ignore) -> R:
    """Each event of `steps` to `events`, then the result; Ctrl-C in `events` goes to the
    workflow."""
    with closing(steps):
        for event in steps:
            try:
                events(event)
            except KeyboardInterrupt:
                steps.interrupt()
    return steps.result


def run_to_end(steps: Callable[..., Steps[R]]) -> Callable[..., R]:
    """The workflow function of a `_steps` form: the same arguments, and `events=` (a sink, the
    default drops them); it runs `steps` to its end (run_steps) and returns the result. Its
    signature and docstring are the steps form's, `events` added, so `help()` and editors show
    every parameter."""

    def workflow(*args: Any, events: Events = ignore, **how: Any) -> R:
        return run_steps(steps(*args, **how), events)

    signature = inspect.signature(steps)
    parameters = list(signature.parameters.values())
    at = len(parameters)
    if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD:
        at -= 1
    events = inspect.Parameter(
        "events", inspect.Parameter.KEYWORD_ONLY, default=ignore, annotation="Events"
    )
    parameters.insert(at, events)
    returns = signature.return_annotation
    if isinstance(returns, str) and returns.startswith("Steps[") and returns.endswith("]"):
        returns = returns.removeprefix("Steps[").removesuffix("]")
    workflow.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=returns
    )
    workflow.__name__ = workflow.__qualname__ = steps.__name__.removesuffix("_steps")
    workflow.__module__ = steps.__module__
    workflow.__doc__ = (
        f"{steps.__doc__ or ''}\n\n`{steps.__name__}` run to its end, each event to `events`; "
        "returns the result."
    )
    return workflow
