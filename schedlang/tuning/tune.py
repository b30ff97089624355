"""Tune schedule templates by measurement.

A template is a schedule with knobs; a candidate is a template with every knob bound. This module
is the run: proposals in, batches of candidates out, each measured (schedlang.tuning.measurer:
checked, built in workers, run by a runner of schedlang.run.runner) and its record saved
(schedlang.tuning.saving). Every result goes to the database at once: a rerun resumes from it
and never measures a candidate twice.

Each template's knobs are searched by schedlang.tuning.search. When asked for
(`Settings.cost_model`; off by default), once enough candidates are verified, a cost model
(schedlang.tuning.costmodel) ranks a pool of such points, several per slot, by their lowered TIR
before any is built; the batch is its best picks plus a random exploration share of the rest.
Every random decision, and every pick with its predicted GFLOP/s, is logged to the database's run
log, so a seeded run can be audited and reproduced.

A kernel whose verification run takes longer than `Settings.slow_run_s` is timed with fewer
repeats (schedlang.run.sandbox.slow_timing): a random schedule of a large op may run for seconds,
and `repeat` full runs of it would eat the budget. With `Settings.baseline`, a run first measures
the op's unscheduled build (the empty schedule, proposer "baseline"), once per database: what the
proposers' candidates are compared with. It is not a trial, and its failure stops nothing.
"""

from __future__ import annotations

import contextlib
import random
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import describe, render_show
from schedlang.core.ops import Op
from schedlang.core.target import Target
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Context, NothingToTune, Proposal, Proposer
from schedlang.store.db import Database, claim_owner
from schedlang.store.records import Record, op_key
from schedlang.tuning.convergence import Convergence, Stop, model_curve
from schedlang.tuning.costmodel import CostModel, resolve
from schedlang.tuning.measurer import Measurer, Workers
from schedlang.tuning.saving import measured_record, save_record, unparsed_record
from schedlang.tuning.search import (
    Candidate,
    KnobSearch,
    Screen,
    next_batch,
    prelowered,
    search_of,
)
from schedlang.tuning.settings import Settings

__all__ = ["NothingToTune", "Progress", "Settings", "TuneResult", "Workers", "tune"]


DEFAULT_SETTINGS = Settings()


@dataclass
class Progress:
    """What a progress display needs after each candidate."""

    done: int = 0
    total: int = 0
    failures: int = 0
    skipped: int = 0  # already in the database
    best: Record | None = None
    last: Record | None = None
    baseline: Record | None = None  # the unscheduled build (Settings.baseline), once known
    stop: Stop | None = None  # why the run stopped before its trials were spent (early_stop)


@dataclass
class TuneResult:
    records: list[Record]  # measured in this run, in order
    best: Record | None
    run_id: int
    wall_s: float
    reused: int  # candidates found in the database instead of measured
    # The unscheduled build (Settings.baseline): measured in this run, or found in the database;
    # not among `records`. A failed one (status not ok) is not saved to the database.
    baseline: Record | None = None
    notes: list[str] = field(default_factory=list)  # one line each, for the user
    cost_model: dict = field(default_factory=dict)  # what the cost model did and what it cost
    stop: Stop | None = None  # why it stopped before its trials were spent (Settings.early_stop)
    refused: dict[str, int] = field(default_factory=dict)  # the screen's reasons: no trial each


def tune(
    op: Op,
    target: Target,
    db: Database,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    **how: Any,
) -> TuneResult:
    """`tune_steps` run to its end (`how`: its keywords: settings, templates, proposer, hint,
    workers), `on_progress` called after each candidate."""
    steps = tune_steps(op, target, db, **how)
    try:
        while True:
            try:
                progress = next(steps)
            except StopIteration as finished:
                return finished.value
            if on_progress:
                on_progress(progress)
    finally:  # the workers stopped and the claims released, whatever `on_progress` raised
        steps.close()


def tune_steps(
    op: Op,
    target: Target,
    db: Database,
    *,
    settings: Settings = DEFAULT_SETTINGS,
    templates: Sequence[Proposal] = (),
    proposer: Proposer | None = None,
    hint: str | None = None,
    workers: Workers | None = None,
) -> Generator[Progress, None, TuneResult]:
    """Measure up to `settings.trials` new candidates from `templates` and/or `proposer`, in
    `workers` if given (left running), else in workers of this run's own: the Progress after
    each candidate (the same object, updated), then the result (the generator's return value)."""
    started = time.time()
    use_model, note = resolve(settings.cost_model)
    if note:
        print(f"note: {note}", file=sys.stderr)
    proposer = proposer or (None if templates else BuiltinProposer())
    run = _Run(Context(op, target, hint), db, settings, proposer)
    run.begin(templates, note, use_model)
    run.add_proposals(templates)
    with tempfile.TemporaryDirectory(prefix="schedlang-tune-") as work_dir:
        try:
            run.prepare(Path(work_dir), workers)
            yield from run.measure_rounds()
        finally:
            run.close()
    return run.result(time.time() - started)


class _Run:
    """One tuning run: the knob searches of its templates, the concrete proposals waiting, what
    it measured, and its log of decisions in the database."""

    def __init__(
        self,
        context: Context,
        db: Database,
        settings: Settings,
        proposer: Proposer | None,
    ):
        # The proposer may read the database (a warm start) and write to this run's log.
        self.context = replace(context, db=db, log=self.log)
        self.op, self.target = context.op, context.target
        self.db = db
        self.settings = settings
        self.proposer = proposer
        self.rng = random.Random(settings.seed)
        self.key, self.target_key = op_key(context.op.func), context.target.key
        self.searches: list[tuple[KnobSearch, Proposal]] = []
        self.pending: list[Candidate] = []  # concrete proposals waiting to be measured
        self.measured: list[Record] = []
        self.reused = 0
        self.model: CostModel | None = None
        self.measurer: Measurer | None = None
        self.screen: Screen | None = None
        self.progress = Progress(total=settings.trials)

    def begin(self, templates: Sequence[Proposal], note: str | None, use_model: bool) -> None:
        """The run's row and log in the database, its claims, the cost model, the best so far."""
        settings = self.settings
        self.notes = [note] if note else []
        self.run_id = self.db.start_run(
            self.key,
            self.target_key,
            settings.seed,
            self.proposer.name if self.proposer else "template",
            {
                "trials": settings.trials,
                "templates": [t.text for t in templates],
                "cost_model": settings.cost_model if use_model else "off",
                # What a dataset of the records shows a model (schedlang.learn.dataset): the op
                # as `schedlang show` prints it, and the target's facts.
                "op": render_show(describe(self.op)),
                "target_facts": self.target.to_json(),
            },
        )
        # The op's function: `schedlang report` lowers a record's schedule without the op file.
        self.db.add_op(self.key, self.op.name, self.op.func.script())
        if note:
            self.log(note)
        # Another tuner on the same database skips what this one is measuring, and the other way
        # round; a claim outlives a candidate's longest measurement only if its tuner died.
        self.owner = claim_owner(self.run_id)
        self.claim_s = settings.batch * (settings.build_timeout_s + settings.run_timeout_s) + 60
        self.history = self.db.records(self.key, self.target_key)
        if use_model:
            self.model = CostModel(
                self.op,
                self.target,
                seed=settings.seed,
                log=self.log,
                min_records=settings.cost_model_min_records,
                explore=settings.cost_model_explore,
            )
            for old in reversed(self.history):  # the latest first, up to the model's limit
                self.model.observe(old, earlier=True)
        self.progress.best = next(iter(self.db.best(self.key, self.target_key)), None)

    def log(self, text: str) -> None:
        self.db.log_decision(self.run_id, text)

    def add_proposals(self, proposals: Sequence[Proposal]) -> None:
        """Templates become knob searches (seeded from the history), schedules wait in
        `pending`; a proposal that does not parse is recorded as a check error."""
        for proposal in proposals:
            try:
                schedule = parse(proposal.text, f"<{proposal.proposer}>")
            except SchedlangError as err:
                failed = unparsed_record(
                    self.op, self.target, proposal, err.render(), self.settings.seed, self.run_id
                )
                self.measured.append(replace(failed, id=self.db.add(failed)))
                continue
            if not schedule.is_template:
                # A point of a template (a warm start's) is measured as one of its points.
                self.pending.append(
                    Candidate(
                        schedule, dict(proposal.knobs), proposal.template, proposal.proposer,
                        proposal.extra,
                    )
                )  # fmt: skip
                if proposal.extra.get("why"):
                    self.log(f"schedule: {proposal.note}; why: {proposal.extra['why']}")
                continue
            search = KnobSearch(schedule, random.Random(self.rng.random()), self.log)
            for old in self.history:
                if old.template == format_schedule(schedule) and old.knobs:
                    search.record(old.knobs, old.gflops)
            self.searches.append((search, proposal))
            self.log(
                f"template {len(self.searches)}: {proposal.note or proposal.proposer} "
                f"({search.size} points)"
                + (f"; why: {proposal.extra['why']}" if proposal.extra.get("why") else "")
            )
        for candidate in self.pending:  # its search draws no point already waiting
            drawn_by = search_of(self.searches, candidate)
            if drawn_by is not None and set(candidate.knobs) == set(drawn_by.space):
                drawn_by.seen.add(drawn_by.key(candidate.knobs))

    def ask_proposer(self) -> None:
        if self.proposer is not None:
            history = self.db.records(self.key, self.target_key)
            proposals = self.proposer.propose(self.context, history, count=self.settings.batch)
            self.add_proposals(proposals)

    def prepare(self, work_dir: Path, workers: Workers | None = None) -> None:
        """The baseline (before the first round, so that a proposer sees it), the proposer's
        first proposals, and the measurer."""
        progress = self.progress
        if self.settings.baseline:
            self.measurer = Measurer(self.op, self.target, self.settings, work_dir, workers=workers)
            progress.baseline = _baseline(
                self.db, self.measurer, self.op, self.target, self.settings, self.run_id, self.log
            )
            if progress.baseline.is_ok and _faster(progress.baseline, progress.best):
                progress.best = progress.baseline
        self.ask_proposer()
        if not self.searches and not self.pending:
            raise NothingToTune(f"nothing to tune: no template or schedule for {self.op.name}")
        self.measurer = self.measurer or Measurer(
            self.op, self.target, self.settings, work_dir, workers=workers
        )
        # issue 48: no trial on a point the checker refuses; its lowering goes on to the measurer
        self.screen = Screen(self.op, self.target) if self.settings.screen else None
        self.measurer.prelowered = prelowered(self.screen, self.model)

    def measure_rounds(self) -> Iterator[Progress]:
        """Batches measured until the trials are spent, or rounds bring nothing new to measure."""
        settings, progress = self.settings, self.progress
        idle_rounds = 0
        rule, offset = self._stopping_rule()
        while progress.done < settings.trials and idle_rounds < settings.max_rounds_without_new:
            if self._stopped(rule):
                break
            batch = next_batch(
                self.searches,
                self.pending,
                min(settings.batch, settings.trials - progress.done),
                self.rng,
                self.log,
                self.model,
                settings.cost_model_pool,
                self.screen,
            )
            fresh = self._not_yet_measured(batch)
            if not fresh:
                idle_rounds += 1
                self.ask_proposer()
                live = any(not s.exhausted() for s, _ in self.searches)
                if not batch and not live and not self.pending:
                    break
                continue
            idle_rounds = 0
            yield from self._measure(fresh)
            if rule is not None and progress.best is not None:
                rule.observe(offset + progress.done, progress.best.median_s)
            if progress.done < settings.trials and not self._stopped(rule):
                self.ask_proposer()

    def _stopped(self, rule: Convergence | None) -> bool:
        """Whether the stopping rule says stop (`progress.stop`, logged once, says why)."""
        if rule is not None and self.progress.stop is None:
            self.progress.stop = rule.stop()
            if self.progress.stop is not None:
                self.log(f"stopped: {self.progress.stop.reason}")
        return self.progress.stop is not None

    def _stopping_rule(self) -> tuple[Convergence | None, int]:
        """With `early_stop`, the rule on the op's best against trials, the database's curve of
        the op replayed into it (a stopped run resumes where it left, and stops at once if it
        had converged), and the trials of the earlier runs this run counts on from."""
        if not self.settings.early_stop:
            return None, 0
        rule = Convergence()
        rule.replay(model_curve(self.history, {self.key: 1}))
        return rule, sum(record.proposer != "baseline" for record in self.history)

    def _not_yet_measured(self, batch: list[Candidate]) -> list[Candidate]:
        """The candidates of `batch` to measure: not repeated in it, not in the database, and
        not claimed by another tuner (each of those counted as skipped)."""
        fresh = []
        texts: set[str] = set()  # a template whose knobs change nothing repeats itself
        for candidate in batch:
            if candidate.text in texts:
                self.log(f"skipped a repeat in the batch: {candidate.knobs or candidate.text}")
                continue
            texts.add(candidate.text)
            existing = self.db.get(self.key, self.target_key, candidate.text)
            if existing is not None:
                self.reused += 1
                self._skipped(candidate, existing.gflops)
                continue
            if not self.db.claim(
                self.key, self.target_key, candidate.text, self.owner, self.claim_s
            ):
                self.log(f"skipped, another tuner is measuring it: {candidate.text!r}")
                self._skipped(candidate, None)
                continue
            fresh.append(candidate)
        return fresh

    def _skipped(self, candidate: Candidate, gflops: float | None) -> None:
        self.progress.skipped += 1
        if (search := search_of(self.searches, candidate)) is not None:
            search.record(candidate.knobs, gflops)

    def _measure(self, fresh: list[Candidate]) -> Iterator[Progress]:
        assert self.measurer is not None
        progress = self.progress
        for candidate, outcome in self.measurer.measure(fresh):
            record = measured_record(
                self.op,
                self.target,
                candidate,
                outcome,
                self.measurer.flops,
                self.settings.seed,
                self.run_id,
            )
            record = replace(record, id=save_record(self.db, record))
            self.db.release(self.owner, candidate.text)
            self.measured.append(record)
            if self.model is not None:
                self.model.observe(record)
            if (search := search_of(self.searches, candidate)) is not None:
                search.record(candidate.knobs, record.gflops)
            progress.done += 1
            progress.last = record
            if not record.is_ok:
                progress.failures += 1
            elif _faster(record, progress.best):
                progress.best = record
            self.log(f"measured #{record.id}: {record.status} {record.gflops or 0:.2f} GFLOP/s")
            yield progress

    def close(self) -> None:
        """The workers stopped, the cost model's cost logged, this run's claims released."""
        if self.measurer is not None:
            self.measurer.close()
        with contextlib.suppress(SchedlangError):  # the database may be what failed
            if self.model is not None and self.model.fits:
                figures = _model_figures(self.model)
                self.log(
                    f"cost model: {figures['fits']} fits in {figures['fit_s']:.1f} s; "
                    f"{figures['schedules_featurized']} schedules lowered and described, "
                    f"{figures['feature_ms_per_schedule']:.0f} ms each"
                )
            self.db.release(self.owner)

    def result(self, wall_s: float) -> TuneResult:
        best = next(iter(self.db.best(self.key, self.target_key)), None)
        return TuneResult(
            self.measured,
            best,
            self.run_id,
            wall_s,
            self.reused,
            self.progress.baseline,
            self.notes,
            _model_figures(self.model),
            self.progress.stop,
            dict(self.screen.reasons) if self.screen is not None else {},
        )


def _model_figures(model: CostModel | None) -> dict:
    if model is None:
        return {}
    features = model.featurizer
    return {
        "fits": model.fits,
        "fit_s": round(model.fit_seconds, 3),
        "schedules_featurized": features.count,
        "feature_ms_per_schedule": round(features.cost_ms(), 2),
        "examples": len(model.examples),
    }


def _faster(record: Record, best: Record | None) -> bool:
    return best is None or (record.median_s or 1e9) < (best.median_s or 1e9)


def _baseline(
    db: Database,
    measurer: Measurer,
    op: Op,
    target: Target,
    settings: Settings,
    run_id: int,
    log: Callable[[str], None],
) -> Record:
    """The op's unscheduled build: the database's ok record of the empty schedule, else measured
    now with one repeat (of at least min_repeat_ms) and saved. A failure (timeout, crash) is
    returned, not saved: the database keeps one record per schedule, and a later run may measure
    it again."""
    existing = db.get(op_key(op.func), target.key, "")
    if existing is not None and existing.is_ok:
        log(f"baseline: #{existing.id} from the database")
        return existing
    candidate = Candidate(parse("", "<baseline>"), {}, None, "baseline", {"baseline": True})
    [(_, outcome)] = list(measurer.measure([candidate], repeat=1))
    record = measured_record(op, target, candidate, outcome, measurer.flops, settings.seed, run_id)
    if not record.is_ok:
        log(f"baseline (the unscheduled build) not saved: {record.status}: {record.reason}")
        return record
    record = replace(record, id=save_record(db, record))
    log(f"measured #{record.id}: baseline {record.status} {record.gflops or 0:.2f} GFLOP/s")
    return record
