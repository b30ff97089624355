"""Tuning one op: the workflow behind `schedlang tune`.

    from schedlang.workflows import tune_op

    result = tune_op(op, target, db, settings=Settings(trials=16))
    print(result.best.gflops if result.best else result.failure)

`tune_op` measures candidates into the database (schedlang.tuning.tune), then reads back what the
run did: the `tune --json` document, the database's best record, the run's decisions, and the
tuning curve when asked for. Ctrl-C raises `TuneInterrupted`, which says what was kept.
`tune_op_steps` is the same run, its events handed to the caller one by one.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Proposal and Settings are what tune_op takes: the CLI imports them from here (tests/test_layers).
from schedlang.propose.interface import Proposal, Proposer
from schedlang.store.db import Database
from schedlang.store.records import Record, op_key
from schedlang.tuning.settings import Settings
from schedlang.workflows.database import DatabaseArg, database
from schedlang.workflows.events import (
    Event,
    Note,
    Steps,
    Stopped,
    TaskFinished,
    TaskStarted,
    TrialMeasured,
    as_events,
    run_to_end,
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

    def __init__(
        self, summary: dict, measured: int, kept: int, db_path: str, plot: str | None,
        notes: list[Note],
    ):  # fmt: skip
        super().__init__("interrupted")
        self.summary, self.measured, self.kept = summary, measured, kept
        self.db_path, self.plot, self.notes = db_path, plot, notes


def proposer_named(name: str, templates: Sequence[Proposal] = (), **how: Any) -> Proposer | None:
    """The proposer `name` stands for: schedlang.llm.spec.make_proposer, `how` its keywords
    (model, seed, log_prompts, warm_start); a model on `runtime="schedlang"` is built by
    schedlang.workflows.decoder_model.proposer_decoder."""
    from schedlang.llm.spec import make_proposer
    from schedlang.workflows.decoder_model import proposer_decoder

    return make_proposer(name, templates, build=proposer_decoder, **how)


def expected_time(proposer: Proposer | None) -> str | None:
    """For a model run on this machine, one line on how long an answer may take; else None."""
    backend = getattr(proposer, "backend", None)
    if backend is None or not hasattr(backend, "expected_time"):
        return None
    limits = proposer.limits  # type: ignore[union-attr]
    return backend.expected_time(limits.statements, limits.step_tokens)


def tune_op_steps(
    op: Op,
    target: Target,
    db: DatabaseArg = None,
    *,
    settings: Settings = DEFAULT_SETTINGS,
    templates: Sequence[Proposal] = (),
    proposer: Proposer | None = None,
    hint: str | None = None,
    plot: str | None = None,
) -> Steps[OpTuneResult]:
    """Measure up to `settings.trials` candidates of `op` from `templates` and/or `proposer` (the
    built-in one when neither is given) into `db`; write the tuning curve to `plot` if given.
    Each candidate measured is a TrialMeasured event. TuneInterrupted on Ctrl-C. `db`: the
    database, open or its path (None: the default one)."""
    if plot:
        from schedlang.tuning.plot import require_matplotlib

        require_matplotlib()  # before tuning, not after
    how = {"templates": templates, "proposer": proposer, "hint": hint}
    return Steps(_tune_op(op, target, db, settings, plot, how))


tune_op = run_to_end(tune_op_steps)


def _tune_op(
    op: Op, target: Target, db: DatabaseArg, settings: Settings, plot: str | None, how: dict
) -> Generator[Event, None, OpTuneResult]:
    from schedlang.tuning.summary import finished_summary

    notes: list[Note] = []
    with database(db, events=notes.append) as opened:
        yield from notes
        started = time.time()
        try:
            run = yield from tune_events(op, target, opened, settings=settings, **how)
        except KeyboardInterrupt:
            raise _interrupted(op, target, opened, started, settings, plot) from None
        summary, failure = finished_summary(op, target, opened, run, settings.trials, plot=plot)
        if plot:
            yield from _write_plot(op, target, opened, run.records, run.baseline, plot, settings)
        best = next(iter(opened.best(op_key(op.func), target.key)), None)
        decisions = tuple(opened.decisions(run.run_id))
    return OpTuneResult(op.name, target.kind, run, best, summary, failure, decisions, plot)


def tune_events(
    op: Op, target: Target, db: Database, *, settings: Settings, **how: Any
) -> Generator[Event, None, TuneResult]:
    """schedlang.tuning.tune.tune_steps (`how`: its templates, proposer, hint, workers), its
    progress as events: TaskStarted, a TrialMeasured per candidate, TaskFinished however it
    ends, then Stopped if it stopped early. A model's rounds are tuned by this too."""
    from schedlang.tuning.tune import tune_steps

    yield TaskStarted(op.name, settings.trials)
    try:
        result = yield from _trials(op.name, tune_steps(op, target, db, settings=settings, **how))
    except GeneratorExit:
        raise
    except BaseException:
        yield TaskFinished(op.name)  # the progress display closed, then the error goes on
        raise
    yield TaskFinished(op.name)
    if result.stop is not None:
        yield Stopped(op.name, result.stop)
    return result


def _trials(
    name: str, steps: Generator[Progress, None, TuneResult]
) -> Generator[Event, None, TuneResult]:
    """Each candidate measured as a TrialMeasured event; the run stopped if this is."""

    def measured(progress: Progress) -> TrialMeasured | None:
        if progress.last is None:
            return None
        return TrialMeasured(
            name, progress.done, progress.total, progress.failures, progress.last, progress.best
        )

    return as_events(steps, measured)


def _interrupted(
    op: Op, target: Target, db: Database, started: float, settings: Settings, plot: str | None
) -> TuneInterrupted:
    """What a run stopped by Ctrl-C kept, read back from the database; its partial curve drawn."""
    from schedlang.tuning.summary import interrupted_run

    run = interrupted_run(op, target, db, started)
    summary = run.summary(op, target, db, settings.trials, plot=plot)
    drawn, notes = None, []
    if plot and run.records:
        notes = list(
            _write_plot(op, target, db, run.records, run.baseline, plot, settings, note=True)
        )
        drawn = plot
    return TuneInterrupted(summary, len(run.records), run.kept, str(db.path), drawn, notes)


def _write_plot(
    op: Op,
    target: Target,
    db: Database,
    records: list[Record],
    baseline: Record | None,
    plot: str,
    settings: Settings,
    *,
    note: bool = False,
) -> Iterator[Note]:
    """The tuning curve with its baselines (schedlang.tuning.plot.baselines); a baseline that
    cannot be measured is left out with a Note."""
    from schedlang.tuning.plot import baselines, tuning_curve

    notes: list[Note] = []
    local = settings.runner().is_local
    lines = baselines(
        op, target, db, baseline, local=local, note=lambda text: notes.append(Note(text))
    )
    title = f"{op.name} on {target.kind}{' (interrupted)' if note else ''}"
    tuning_curve(records, plot, title=title, baselines=lines)
    yield from notes
