"""Tune a Relax model: its distinct PrimFuncs (tasks), each with its share of the trials.

    tasks = model_tasks(model, target, trials=64)
    for task, outcome in tune_model(tasks, target, db, Settings(seed=0)):
        ...  # a TuneResult, or the SchedlangError that stopped that task (the others go on)

The built-in proposer tunes each task, with trials shared by flops x calls (graph.split_trials).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.target import Target
from schedlang.models.graph import Model, Task, extract_tasks, split_trials
from schedlang.propose.builtin import BuiltinProposer
from schedlang.store.db import Database
from schedlang.tuning.tune import Settings, TuneResult, tune


def model_tasks(
    model: Model, target: Target, trials: int, *, fuse: bool = True
) -> list[tuple[Task, int]]:
    """The model's tasks, each with its share of `trials`; SchedlangError when it has none."""
    tasks = extract_tasks(model.mod, target, fuse=fuse)
    if not tasks:
        raise SchedlangError(f"model {model.name} has no PrimFunc to tune")
    return list(zip(tasks, split_trials(tasks, trials), strict=True))


def tune_model(
    tasks: Sequence[tuple[Task, int]],
    target: Target,
    db: Database,
    settings: Settings,
    *,
    tune_task: Callable[..., TuneResult] = tune,
) -> Iterator[tuple[Task, TuneResult | SchedlangError]]:
    """Tune each task with a trial share (none: skipped) and the built-in proposer; yield each
    task's result, or the error that stopped it. `tune_task` is `tune` or one with its signature
    (a progress display around it)."""
    for task, share in tasks:
        if share == 0:
            continue
        try:
            result = tune_task(
                task.op,
                target,
                db,
                settings=replace(settings, trials=share),
                templates=[],
                proposer=BuiltinProposer(),
            )
        except SchedlangError as err:
            yield task, err
            continue
        yield task, result
