"""Tune a Relax model: its distinct PrimFuncs (tasks), the trials shared by a task scheduler.

    tasks = model_tasks(model, target)
    for turn in tune_model(tasks, target, db, Settings(seed=0), trials=200):
        ...  # a Turn: one round of one task, its result (or the error that stopped it)

`--trials N` is the model's whole budget: the gradient-based scheduler (models.scheduler) measures
every task first, then gives each next round to the task that promises the largest drop in the
model's latency. Each task is tuned by the built-in proposer; `plan` says what it sees in a task
(its kind, its checked templates) before anything is measured. With `Settings.early_stop` (the
default) the run also stops once the model's estimate has converged, or every task has stalled
(models.scheduler, schedlang.tuning.convergence); the scheduler's `stop` says why.

A task with symbolic extents (a prompt's length) is not the scheduler's: it is tuned at the
model's `lengths` (`model_lengths`: `--lengths`, or 1, 16, 128, 512 up to the variables' upper
bound) by schedlang.models.lengths, one schedule for every length chosen by the sum of its
relative times, recorded under its own key. It gets its share of the trials (as many per task
as the static ones get on average), split over the lengths; the scheduler shares the rest.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.ops import from_primfunc
from schedlang.core.target import Target
from schedlang.models.graph import Task, extract_tasks
from schedlang.models.lengths import (
    DEFAULT_LENGTHS,
    LengthTuner,
    check_lengths,
    default_lengths,
    every_var_at,
    specialize,
    symbolic_vars,
)
from schedlang.models.model_file import Model, symbolic_lengths
from schedlang.models.scheduler import GradientScheduler, TaskState
from schedlang.propose.builtin import BuiltinProposer, op_kind
from schedlang.propose.interface import Context
from schedlang.store.db import Database
from schedlang.tuning.convergence import Convergence, database_curve
from schedlang.tuning.measurer import Workers
from schedlang.tuning.tune import NothingToTune, Settings, TuneResult, tune_steps

# How each candidate of a model's task is timed (`tune-model --repeat`, `--min-repeat-ms`): 3
# repeats of at least 40 ms, where one op's `tune` takes 5 of 100. ResNet-18 at 200 trials tuned
# in 250 s instead of 353 s for a build as fast (25.8 against 26.1 ms; docs/models.md): at model
# scale the timing was a third of the tuning, and the task scheduler compares rounds, not
# candidates a few percent apart.
REPEAT, MIN_REPEAT_MS = 3, 40


def model_tasks(
    model: Model, target: Target, *, fuse: bool = True, winograd: bool = True
) -> list[Task]:
    """The model's tasks, heaviest first; SchedlangError when it has none."""
    tasks = extract_tasks(model.mod, target, fuse=fuse, winograd=winograd)
    if not tasks:
        raise SchedlangError(f"model {model.name} has no PrimFunc to tune")
    return tasks


@dataclass(frozen=True)
class Plan:
    """What the built-in proposer sees in a task before anything is measured."""

    kind: str  # the recipe's kind (matmul, conv, rows, reduction, …) or "other"
    templates: tuple[str, ...]  # the families that checked clean, best first
    why_none: str = ""  # when no template covers the task: why
    serial: bool = False  # the templates come on one thread too (little work: Target.serial_work)
    lengths: tuple[int, ...] = ()  # a symbolic task: the lengths it is tuned at

    @property
    def generic_only(self) -> bool:
        return self.templates == ("generic",)


def plan(
    task: Task, target: Target, proposer: BuiltinProposer, lengths: tuple[int, ...] = ()
) -> Plan:
    """The task's kind and its templates, checked (by `proposer`, which keeps them for tuning);
    a symbolic task's at the longest of `lengths`."""
    op = task.op
    measured_at: tuple[int, ...] = ()
    if task.flops is None and symbolic_vars(task.op.func):
        if not lengths:
            return Plan("other", (), "symbolic shapes: no lengths to tune it at")
        func = specialize(task.op.func, every_var_at(task.op.func, max(lengths)))
        op, measured_at = from_primfunc(func, task.name), lengths
    elif task.flops is None:
        return Plan("other", (), "its flops cannot be counted")
    try:
        kind = op_kind(op, target)
        templates = proposer.templates(Context(op, target))
    except SchedlangError as err:
        return Plan("other", (), err.message)
    if not templates:
        return Plan(kind, (), proposer.no_template_error(Context(op, target)).message)
    families = tuple(dict.fromkeys(p.extra["family"] for p in templates))
    serial = any(p.extra.get("serial") for p in templates)
    return Plan(kind, families, serial=serial, lengths=measured_at)


def plan_tasks(
    tasks: Sequence[Task],
    target: Target,
    *,
    warm_start: bool = True,
    lengths: tuple[int, ...] = (),
) -> tuple[dict[str, Plan], dict[str, BuiltinProposer]]:
    """Each task's plan and the proposer that checked its templates (for `tune_model` to go on
    with), both by task key; without `warm_start` the proposers start cold (no transfers). A
    symbolic task is planned for `lengths` (`model_lengths`)."""
    transfers = {} if warm_start else {"transfers": 0}
    proposers = {task.key: BuiltinProposer(**transfers) for task in tasks}
    plans = {task.key: plan(task, target, proposers[task.key], lengths) for task in tasks}
    return plans, proposers


def model_lengths(model: Model, lengths: Sequence[int] | None = None) -> tuple[int, ...]:
    """The lengths a model's symbolic tasks are tuned at: `lengths` (positive, up to the
    smallest upper bound of its symbolic variables), or 1, 16, 128 and 512 up to that bound
    (and the bound itself below 512); () for a model without symbolic variables."""
    maximum = model_maximum(model)
    if maximum is None:
        return ()
    if lengths is None:
        return default_lengths(maximum)
    return check_lengths(lengths, maximum, "the model's maximum of")


def model_maximum(model: Model) -> int | None:
    """The smallest upper bound of the model's symbolic variables (512 when none has one);
    None for a model without symbolic variables."""
    bounds = symbolic_lengths(model.mod)
    if not bounds:
        return None
    uppers = [upper for _, upper in bounds.values() if upper is not None]
    return min(uppers) if uppers else DEFAULT_LENGTHS[-1]


@dataclass(frozen=True)
class Turn:
    """One round of one task: what it measured (`result`), or the error that stopped the task;
    neither when a task measured before has nothing left to measure (its templates are spent)."""

    state: TaskState
    trials: int  # asked for
    result: TuneResult | None
    error: SchedlangError | None
    scheduler: GradientScheduler


@dataclass(frozen=True)
class Scheduled:
    """Yielded by `tune_model_steps` before its first round: the run's scheduler, whose `stop`
    says why the run stopped early, also when it stopped before any round (a rerun of a
    converged run)."""

    scheduler: GradientScheduler


def tune_model(
    *args: Any, tune_task: Callable[..., TuneResult] | None = None, **how: Any
) -> Iterator[Turn]:
    """The Turns of `tune_model_steps` (`args`, `how`: its arguments); `tune_task` is `tune` or
    one with its signature."""
    steps = tune_steps if tune_task is None else _without_progress(tune_task)
    for item in tune_model_steps(*args, tune_task=steps, **how):
        if isinstance(item, Turn):
            yield item


def tune_model_steps(
    tasks: Sequence[Task],
    target: Target,
    db: Database,
    settings: Settings,
    *,
    trials: int,
    proposers: dict[str, BuiltinProposer] | None = None,
    tune_task: Callable[..., Generator[Any, None, TuneResult]] = tune_steps,
    lengths: tuple[int, ...] = (),
    max_length: int | None = None,
) -> Iterator[Any]:
    """`trials` candidates in all, in rounds chosen by the gradient-based scheduler; a task's
    best record in `db` is where it starts (nothing measured again). `proposers` (by task key)
    carry templates checked by `plan`. Yields the Scheduled scheduler, then what each round's
    `tune_task` (`tune_steps` or one with its signature) yields as it measures, then the round's
    Turn. With `settings.early_stop` the scheduler's stopping rule starts from the database's
    curve of these tasks (`database_curve`): a stopped run resumes where it left. A symbolic
    task is tuned first at `lengths` (its KernelChoice yielded), with its share of `trials`, and
    checked up to `max_length` (default: the longest of `lengths`)."""
    proposers = proposers if proposers is not None else {}
    tunable = [task for task in tasks if task.flops is not None]
    symbolic = [t for t in tasks if t.flops is None and lengths and symbolic_vars(t.op.func)]
    per_length = max(1, trials // max(1, len(tunable) + len(symbolic)) // max(1, len(lengths)))
    trials = max(0, trials - per_length * len(lengths) * len(symbolic))
    known = {}
    for task in tunable:
        best = db.best(task.key, target.key)
        if best and best[0].median_s is not None:
            known[task.key] = float(best[0].median_s)
    rule = Convergence() if settings.early_stop else None
    scheduler = GradientScheduler(
        tunable, trials, known, round_trials=settings.batch, convergence=rule
    )
    if rule is not None:
        scheduler.resume(database_curve(db, {t.key: t.calls for t in tunable}, target.key))
    yield Scheduled(scheduler)
    with tempfile.TemporaryDirectory(prefix="schedlang-model-") as work_dir:
        workers = Workers(target, settings, Path(work_dir) / "workers.log")
        try:
            for task in symbolic:
                how = replace(settings, trials=per_length)
                tuner = LengthTuner(task, target, db, how, workers, max_length or max(lengths))
                yield tuner.run(lengths)
            yield from _rounds(scheduler, target, db, settings, proposers, tune_task, workers)
        finally:
            workers.close()


def _rounds(
    scheduler: GradientScheduler,
    target: Target,
    db: Database,
    settings: Settings,
    proposers: dict[str, BuiltinProposer],
    tune_task: Callable[..., Generator[Any, None, TuneResult]],
    workers: Workers,
) -> Iterator[Any]:
    """The scheduler's rounds, each measured in the same `workers`."""
    while (turn := scheduler.next()) is not None:
        state, count = turn
        proposer = proposers.setdefault(state.task.key, BuiltinProposer())
        started = time.perf_counter()
        try:
            result = yield from tune_task(
                state.task.op,
                target,
                db,
                # On a CPU the unscheduled build is measured too: a task keeps it when no
                # candidate beats it (little work, where threads cost more than they save).
                # The model's rule, not the op's, stops the run: a round is not cut short.
                settings=replace(
                    settings, trials=count, baseline=not target.is_gpu, early_stop=False
                ),
                templates=[],
                proposer=proposer.again(),
                workers=workers,
            )
        except SchedlangError as err:
            if state.best_s and isinstance(err, NothingToTune):
                scheduler.record(state, 0, state.latency_s)  # its templates are spent
                yield Turn(state, count, None, None, scheduler)
                continue
            scheduler.fail(state, err.message)
            yield Turn(state, count, None, err, scheduler)
            continue
        best_s = result.best.median_s if result.best is not None else None
        if (baseline := result.baseline) is not None and baseline.is_ok and baseline.median_s:
            best_s = min(best_s or baseline.median_s, baseline.median_s)
        seconds = time.perf_counter() - started
        scheduler.record(state, len(result.records), best_s, seconds)
        yield Turn(state, count, result, None, scheduler)


def _without_progress(
    tune_task: Callable[..., TuneResult],
) -> Callable[..., Generator[Any, None, TuneResult]]:
    """A function with `tune`'s signature as one with `tune_steps`': its result, no progress."""

    def steps(*args: Any, **kwargs: Any) -> Generator[Any, None, TuneResult]:
        yield from ()
        return tune_task(*args, **kwargs)

    return steps
