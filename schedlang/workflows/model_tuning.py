"""Tuning a whole model: the workflow behind `schedlang tune-model`.

    from schedlang.workflows import tune_model

    result = tune_model(model, target, db, trials=64)
    for state in result.states:
        print(state.task.name, state.trials, state.latency_s)

The model's tasks are extracted and planned (what the built-in proposer sees in each: a
ModelPlanned event), the model is kept in the database for `schedlang report`, then the trials
go where the model's time is (schedlang.models.tune_model), each round a RoundDone event; a run
that stops early (converged, or every task stalled) ends with a Stopped event. A function with
symbolic extents (a prompt's length) is tuned at the model's lengths first, a KernelTuned event
each (schedlang.models.lengths).
`tune_model_steps` is the same run, its events handed to the caller one by one.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import schedlang.models.tune_model as tasks_module  # by module: a test stands in for its rounds
from schedlang.models.lengths import KernelChoice, measured_lengths
from schedlang.models.tune_model import MIN_REPEAT_MS, REPEAT
from schedlang.store.db import Database
from schedlang.tuning.settings import Settings  # what tune_model takes; the CLI's import of it
from schedlang.workflows.database import DatabaseArg, database
from schedlang.workflows.events import (
    Event,
    KernelTuned,
    ModelPlanned,
    Note,
    RoundDone,
    Steps,
    Stopped,
    run_to_end,
)
from schedlang.workflows.op_tuning import tune_events

if TYPE_CHECKING:
    from schedlang.core.target import Target
    from schedlang.models.graph import Task
    from schedlang.models.model_file import Model
    from schedlang.models.scheduler import GradientScheduler, TaskState
    from schedlang.models.tune_model import Plan
    from schedlang.tuning.convergence import Stop

MODEL_SETTINGS = Settings(repeat=REPEAT, min_repeat_ms=MIN_REPEAT_MS)


@dataclass(frozen=True)
class ModelTuneResult:
    """Where a model's tasks stand after `tune_model`."""

    model: str
    target: str  # the target's kind
    tasks: tuple[Task, ...]  # every task, heaviest first
    plans: dict[str, Plan]  # by task key
    states: tuple[TaskState, ...]  # the tuned tasks: trials, best latency, error
    trials: int  # measured, of all tasks' rounds
    estimate_s: float | None  # the model's latency estimated from its tasks' best times
    unmeasured: int  # tasks without a verified time
    stop: Stop | None = None  # why the run stopped before its trials were spent (early stop)
    choices: tuple[KernelChoice, ...] = ()  # the symbolic tasks, tuned at `lengths`
    lengths: tuple[int, ...] = ()  # where the symbolic tasks were measured
    # the model's symbolic variables, each with the lengths its functions were measured at
    variables: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        """Whether any task got a verified schedule."""
        return any(state.latency_s is not None for state in self.states) or any(
            choice.schedule.strip() for choice in self.choices
        )


class ModelTuneInterrupted(KeyboardInterrupt):
    """Ctrl-C during `tune_model`: how many trials were measured (all kept in the database)."""

    def __init__(self, spent: int, trials: int, db_path: str):
        super().__init__("interrupted")
        self.spent, self.trials, self.db_path = spent, trials, db_path


def tune_model_steps(
    model: Model,
    target: Target,
    db: DatabaseArg = None,
    *,
    trials: int = 64,
    settings: Settings = MODEL_SETTINGS,
    fuse: bool = True,
    winograd: bool = True,
    warm_start: bool = True,
    lengths: tuple[int, ...] | None = None,
) -> Steps[ModelTuneResult]:
    """`trials` candidates in all over the model's tasks, in the rounds of the gradient-based
    task scheduler; SchedlangError when the model has no task, ModelTuneInterrupted on Ctrl-C.
    Symbolic functions are tuned at `lengths` (default: models.tune_model.model_lengths').
    `db`: the database, open or its path (None: the default one), opened once the plans are made."""
    how = (trials, settings, fuse, winograd, warm_start, lengths)
    return Steps(_tune_model(model, target, db, *how))


tune_model = run_to_end(tune_model_steps)


def _tune_model(
    model: Model,
    target: Target,
    db: DatabaseArg,
    trials: int,
    settings: Settings,
    fuse: bool,
    winograd: bool,
    warm_start: bool,
    given_lengths: tuple[int, ...] | None,
) -> Generator[Event, None, ModelTuneResult]:
    from schedlang.models.model_file import symbolic_lengths

    lengths = tasks_module.model_lengths(model, given_lengths)
    variables = tuple(symbolic_lengths(model.mod))
    tasks = tasks_module.model_tasks(model, target, fuse=fuse, winograd=winograd)
    plans, proposers = tasks_module.plan_tasks(
        tasks, target, warm_start=warm_start, lengths=lengths
    )
    yield ModelPlanned(model.name, target.kind, tasks, plans, trials, lengths, variables)
    choices: list[KernelChoice] = []
    notes: list[Note] = []
    with database(db, events=notes.append) as opened:
        yield from notes
        keep_model(opened, model, target, tasks)
        tuned = [task for task in tasks if plans[task.key].templates]
        scheduler: GradientScheduler | None = None
        try:
            for item in tasks_module.tune_model_steps(
                tuned, target, opened, settings, trials=trials, proposers=proposers,
                tune_task=tune_events, lengths=lengths,
                max_length=tasks_module.model_maximum(model),
            ):  # fmt: skip
                if isinstance(item, KernelChoice):
                    choices.append(item)
                    yield KernelTuned(item)
                elif isinstance(item, tasks_module.Scheduled):
                    scheduler = item.scheduler
                elif isinstance(item, tasks_module.Turn):
                    scheduler = item.scheduler
                    yield RoundDone(item)
                else:
                    yield item
        except KeyboardInterrupt:
            spent = scheduler.measured if scheduler else 0
            raise ModelTuneInterrupted(spent, trials, str(opened.path)) from None
    measured = measured_lengths(choices, variables, lengths)
    if scheduler is None:
        return ModelTuneResult(
            model.name, target.kind, tuple(tasks), plans, (), 0, None, 0,
            choices=tuple(choices), lengths=lengths, variables=measured,
        )  # fmt: skip
    if scheduler.stop is not None:
        yield Stopped(model.name, scheduler.stop)
    total, unmeasured = scheduler.estimate_s()
    return ModelTuneResult(
        model.name, target.kind, tuple(tasks), plans, tuple(scheduler.states), scheduler.measured,
        total, unmeasured, scheduler.stop, choices=tuple(choices), lengths=lengths,
        variables=measured,
    )  # fmt: skip


def keep_model(db: Database, model: Model, target: Target, tasks: list[Task]) -> None:
    """The model and its tasks in the database, for `schedlang report`'s chart of its time."""
    from schedlang.models.graph import model_key

    described = [{"key": t.key, "name": t.name, "calls": t.calls, "flops": t.flops} for t in tasks]
    db.add_model(model_key(model.mod), model.name, target.key, described)
