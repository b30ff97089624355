"""Tuning one op: the workflow behind `schedlang tune`.

    from schedlang.workflows import tune_op

    result = tune_op(op, target, db, settings=Settings(trials=16))
    print(result.best.gflops if result.best else result.failure)

`tune_op` measures candidates into the database (schedlang.tuning.tune), then reads back what the
run did: the `tune --json` document, the database's best record, the run's decisions, and the
tuning curve when asked for. Ctrl-C raises `TuneInterrupted`, which says what was kept.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schedlang.propose.interface import Proposal, Proposer
from schedlang.store.db import Database
from schedlang.store.records import Record, op_key
from schedlang.tuning.settings import Settings
from schedlang.workflows.database import DatabaseArg, database
from schedlang.workflows.events import (
    Events,
    Note,
    TaskFinished,
    TaskStarted,
    TrialMeasured,
    ignore,
)

if TYPE_CHECKING:
    from schedlang.core.ops import Op
    from schedlang.core.target import Target
    from schedlang.tuning.tune import Progress, TuneResult

DEFAULT_SETTINGS = Settings()


@dataclass(frozen=True)
class OpTuneResult:
    """What a `tune_op` run did and where the op stands."""

    op: str
    target: str  # the target's kind
    run: TuneResult  # this run: its records in order, reused, wall time, baseline, notes
    best: Record | None  # the database's fastest verified record of the op, from any run
    summary: dict  # the `tune --json` document (docs/cli.md)
    failure: str | None  # why the run failed as a whole (nothing verified), else None
    decisions: tuple[str, ...]  # the run's log of decisions, from the database
    plot: str | None  # the tuning curve written, when asked for

    @property
    def records(self) -> list[Record]:
        return self.run.records


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C during `tune_op`: what this run measured and what the database keeps of the op."""

    def __init__(self, summary: dict, measured: int, kept: int, db_path: str, plot: str | None):
        super().__init__("interrupted")
        self.summary, self.measured, self.kept = summary, measured, kept
        self.db_path, self.plot = db_path, plot


def proposer_named(
    name: str, templates: Sequence[Proposal] = (), *, events: Events = ignore, **how: Any
) -> Proposer | None:
    """The proposer `name` stands for: schedlang.llm.spec.make_proposer, `how` its keywords
    (model, seed, log_prompts, warm_start); for a model run here, how long an answer may take,
    as a Note."""
    from schedlang.llm.spec import make_proposer

    chosen = make_proposer(name, templates, **how)
    model = how.get("model")
    if name == "model" and model is not None and not model.endpoint:
        limits, backend = chosen.limits, chosen.backend  # type: ignore[union-attr]
        events(Note(backend.expected_time(limits.statements, limits.step_tokens)))
    return chosen


def tune_op(
    op: Op,
    target: Target,
    db: DatabaseArg = None,
    *,
    settings: Settings = DEFAULT_SETTINGS,
    templates: Sequence[Proposal] = (),
    proposer: Proposer | None = None,
    hint: str | None = None,
    plot: str | None = None,
    events: Events = ignore,
) -> OpTuneResult:
    """Measure up to `settings.trials` candidates of `op` from `templates` and/or `proposer` (the
    built-in one when neither is given) into `db`; write the tuning curve to `plot` if given.
    Each candidate measured is a TrialMeasured event. TuneInterrupted on Ctrl-C. `db`: the
    database, open or its path (None: the default one)."""
    if plot:
        from schedlang.tuning.plot import require_matplotlib

        require_matplotlib()  # before tuning, not after
    with database(db, events=events) as opened:
        return _tune_op(op, target, opened, settings, templates, proposer, hint, plot, events)


def _tune_op(
    op: Op,
    target: Target,
    db: Database,
    settings: Settings,
    templates: Sequence[Proposal],
    proposer: Proposer | None,
    hint: str | None,
    plot: str | None,
    events: Events,
) -> OpTuneResult:
    from schedlang.tuning.summary import finished_summary

    started = time.time()
    try:
        run = tune_reporting(
            op, target, db, settings=settings, templates=templates, proposer=proposer, hint=hint,
            events=events,
        )  # fmt: skip
    except KeyboardInterrupt:
        raise _interrupted(op, target, db, started, settings, plot, events) from None
    summary, failure = finished_summary(op, target, db, run, settings.trials, plot=plot)
    if plot:
        _write_plot(op, target, db, run.records, run.baseline, plot, settings, events)
    best = next(iter(db.best(op_key(op.func), target.key)), None)
    decisions = tuple(db.decisions(run.run_id))
    return OpTuneResult(op.name, target.kind, run, best, summary, failure, decisions, plot)


def tune_reporting(
    op: Op, target: Target, db: Database, *, settings: Settings, events: Events = ignore, **how: Any
) -> TuneResult:
    """schedlang.tuning.tune.tune (`how`: its templates, proposer, hint, workers), its progress
    as events: TaskStarted, a TrialMeasured per candidate, TaskFinished however it ends. A
    model's rounds are tuned by this too."""
    from schedlang.tuning.tune import tune

    def measured(progress: Progress) -> None:
        if progress.last is not None:
            events(
                TrialMeasured(
                    op.name, progress.done, progress.total, progress.failures, progress.last,
                    progress.best,
                )
            )  # fmt: skip

    events(TaskStarted(op.name, settings.trials))
    try:
        return tune(op, target, db, settings=settings, on_progress=measured, **how)
    finally:
        events(TaskFinished(op.name))


def _interrupted(
    op: Op,
    target: Target,
    db: Database,
    started: float,
    settings: Settings,
    plot: str | None,
    events: Events,
) -> TuneInterrupted:
    """What a run stopped by Ctrl-C kept, read back from the database; its partial curve drawn."""
    from schedlang.tuning.summary import interrupted_run

    run = interrupted_run(op, target, db, started)
    summary = run.summary(op, target, db, settings.trials, plot=plot)
    drawn = None
    if plot and run.records:
        _write_plot(op, target, db, run.records, run.baseline, plot, settings, events, note=True)
        drawn = plot
    return TuneInterrupted(summary, len(run.records), run.kept, str(db.path), drawn)


def _write_plot(
    op: Op,
    target: Target,
    db: Database,
    records: list[Record],
    baseline: Record | None,
    plot: str,
    settings: Settings,
    events: Events,
    *,
    note: bool = False,
) -> None:
    """The tuning curve with its baselines (schedlang.tuning.plot.baselines); a baseline that
    cannot be measured is left out with a Note."""
    from schedlang.tuning.plot import baselines, tuning_curve

    local = settings.runner().is_local
    lines = baselines(op, target, db, baseline, local=local, note=lambda text: events(Note(text)))
    title = f"{op.name} on {target.kind}{' (interrupted)' if note else ''}"
    tuning_curve(records, plot, title=title, baselines=lines)
