"""Tune schedule templates by measurement.

A template is a schedule with knobs; a candidate is a template with every knob bound. Each
candidate is checked and lowered here, built in parallel worker processes, then verified and timed
one at a time in a runner process (schedlang.run.sandbox), so timings don't disturb each other and a
crashing kernel only costs its own candidate; or, with `Settings.remote`, on devices leased from a
TVM RPC tracker, several at once (schedlang.run.remote). Every result goes to the database at once:
a rerun resumes from it and never measures a candidate twice.

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
import json
import queue
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from schedlang.checker.check import check
from schedlang.core.diagnostics import SchedlangError, render_all
from schedlang.core.opinfo import describe, flop_count, render_show, schedule_names
from schedlang.core.ops import Op, random_inputs, reference_outputs
from schedlang.core.target import Target, require_runs_here
from schedlang.lang import nodes
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Context, Proposal, Proposer
from schedlang.run.measure import output_indices
from schedlang.run.outcome import Outcome
from schedlang.run.packing import may_prepack, split_prepacked
from schedlang.run.sandbox import JobError, MeasureJob, Worker, WorkerCrash, WorkerTimeout
from schedlang.run.verify import unread_outputs
from schedlang.store.db import Database, claim_owner
from schedlang.store.records import Record, Status, current_versions, op_key
from schedlang.tuning.costmodel import CostModel, resolve
from schedlang.tuning.search import Candidate, KnobSearch, next_batch, search_of

if TYPE_CHECKING:
    from schedlang.run.remote import RemoteSettings


@dataclass(frozen=True)
class Settings:
    trials: int = 32
    seed: int = 0
    batch: int = 8  # candidates built in parallel, then run one by one
    builders: int = 2
    build_timeout_s: float = 120.0
    run_timeout_s: float = 60.0
    repeat: int = 5
    min_repeat_ms: int = 100
    slow_run_s: float | None = 1.0  # a kernel slower than this is timed with fewer repeats
    baseline: bool = False  # first measure the unscheduled build, unless the database has it
    max_rounds_without_new: int = 3
    remote: RemoteSettings | None = None  # measure on devices leased from an RPC tracker
    # The cost model (schedlang.tuning.costmodel): "auto" (LightGBM if installed), "lightgbm",
    # "off". Off unless asked for: in the recorded 64-trial run (docs/benchmarks.md) it found
    # conv2d's best later than the plain search and did not help the other ops.
    cost_model: str = "off"
    cost_model_pool: int = 4  # points lowered and ranked per slot of a batch
    cost_model_explore: float = 0.25  # of a batch, the share drawn at random from the pool's rest
    cost_model_min_records: int = 8  # verified records before the model ranks anything


# --- measurement ---------------------------------------------------------------------------------


class LocalRunner:
    """Runs candidates one at a time in a runner worker on this machine."""

    parallelism = 1
    cross_compiler = None

    def __init__(self, settings: Settings, env: dict[str, str]):
        self.settings = settings
        self.worker = Worker("runner", env)

    def close(self) -> None:
        self.worker.close()

    def run(self, job: MeasureJob) -> Outcome:
        try:
            return self.worker.call(
                "measure",
                self.settings.run_timeout_s,
                measurement=replace(job, slow_run_s=self.settings.slow_run_s),
            )
        except (WorkerTimeout, WorkerCrash, JobError) as exc:
            return _failed("run", exc, Status.RUN_ERROR)


class Workers:
    """The processes a run measures in: builders, and a runner here or devices leased from an RPC
    tracker. A run makes its own; `tune_model` keeps one set for all of a model's rounds, where
    starting them again (each imports TVM) took 2 s of a 9 s round. Started on first use."""

    def __init__(self, target: Target, settings: Settings, log_path: Path):
        if settings.remote is None:
            require_runs_here(target)  # a kernel with instructions this CPU lacks dies of SIGILL
        env = {
            "TVM_NUM_THREADS": str(target.cores if not target.is_gpu else 1),
            "SCHEDLANG_WORKER_LOG": str(log_path),
        }
        if settings.remote is None:
            self.runner: Any = LocalRunner(settings, env)
        else:
            from schedlang.run.remote import RemoteRunner

            self.runner = RemoteRunner(settings.remote, target, settings.run_timeout_s, env)
        self.builders = [Worker(f"builder{n}", env) for n in range(settings.builders)]

    def close(self) -> None:
        for worker in self.builders:
            worker.close()
        self.runner.close()


class Measurer:
    """Builds candidates in parallel workers, then runs them in a runner: a worker here running
    one at a time, or (`settings.remote`) devices leased from an RPC tracker, several at once.
    `workers` are used and left running; without them the measurer starts and stops its own."""

    def __init__(
        self, op: Op, target: Target, settings: Settings, work_dir: Path, *,
        workers: Workers | None = None,
    ):  # fmt: skip
        import tvm

        self.op, self.target, self.settings, self.work_dir = op, target, settings, work_dir
        self.own = workers is None
        self.workers = workers or Workers(target, settings, work_dir / "workers.log")
        self.runner, self.builders = self.workers.runner, self.workers.builders
        self.idle_builders: queue.Queue[Worker] = queue.Queue()
        for worker in self.builders:
            self.idle_builders.put(worker)
        self.flops = flop_count(op.func)
        self.outputs = output_indices(op)
        self.poison = unread_outputs(op.func, self.outputs)  # NaN before the verification run
        self.args_path = work_dir / "args.npz"
        self.expected_path = work_dir / "expected.npz"
        args = random_inputs(op, settings.seed)
        np.savez(self.args_path, *args)
        expected = reference_outputs(op, [a.copy() for a in args])
        if expected is not None:
            np.savez(self.expected_path, *expected)
        else:  # on this machine, in a builder: the runner may be a remote device
            try:
                self.builders[0].call(
                    "reference",
                    settings.build_timeout_s + settings.run_timeout_s,
                    func_json=tvm.ir.save_json(op.func),
                    args_path=str(self.args_path),
                    out_path=str(self.expected_path),
                    outputs=self.outputs,
                )
            except (WorkerCrash, WorkerTimeout, JobError) as exc:
                self.close()
                raise SchedlangError(
                    f"no reference outputs for {op.name}: its unscheduled build failed ({exc})",
                    "give the op a numpy reference (`@schedlang.op(reference=...)`); "
                    "SCHEDLANG_TRACEBACK=1 shows the worker's traceback",
                ) from None
        self.target_json = json.dumps(target.tvm_config)
        self.count = 0
        # text -> a lowered PrimFunc already made (by the cost model's features), or None
        self.prelowered: Callable[[str], Any] | None = None

    def close(self) -> None:
        if self.own:
            self.workers.close()

    def measure(
        self, candidates: Sequence[Candidate], *, repeat: int | None = None
    ) -> Iterator[tuple[Candidate, Outcome]]:
        """(candidate, outcome) for each, in order.
        `repeat` replaces `settings.repeat` for these candidates.

        If the runner cannot go on (a SchedlangError: no remote device left), the outcomes that
        finished are yielded first, then the error is raised."""
        lowered = [self._lower(c) for c in candidates]
        runs = ThreadPoolExecutor(self.runner.parallelism)
        repeat = self.settings.repeat if repeat is None else repeat
        try:
            with ThreadPoolExecutor(len(self.builders)) as pool:
                builds = [
                    None
                    if isinstance(result, Outcome)  # a check error: no build
                    else pool.submit(self._build, index, result.json)
                    for index, result in enumerate(lowered)
                ]
                if self.settings.remote is None:
                    # Here the builders and the runner share the cores: a kernel timed while
                    # LLVM compiles the rest of the batch beside it is timed slow (the best of a
                    # round was its 7th or 8th candidate in 17 of 32 rounds). Time after them.
                    wait([build for build in builds if build is not None])
                futures = [
                    None if build is None else runs.submit(self._run, build, repeat, result)
                    for build, result in zip(builds, lowered, strict=True)
                ]
                for index, (candidate, result, future) in enumerate(
                    zip(candidates, lowered, futures, strict=True)
                ):
                    if future is None:
                        yield candidate, result
                        continue
                    try:
                        outcome = future.result()
                    except SchedlangError:
                        runs.shutdown(wait=True, cancel_futures=True)
                        for later, later_result, later_future in zip(
                            candidates[index + 1 :],
                            lowered[index + 1 :],
                            futures[index + 1 :],
                            strict=True,
                        ):
                            if later_future is None:
                                yield later, later_result
                            elif _finished(later_future):
                                yield later, later_future.result()
                        raise
                    yield candidate, outcome
        finally:  # on Ctrl-C, not waiting for the run in flight: close() kills its worker
            runs.shutdown(wait=False, cancel_futures=True)

    def _lower(self, candidate: Candidate) -> Outcome | Lowered:
        func = self.prelowered(candidate.text) if self.prelowered else None
        if func is not None:
            return self._saved(func)
        result = check(candidate.schedule, self.op.func, self.target, template_ok=False)
        if result.lowered is None:
            text = render_all(result.diagnostics, candidate.schedule.source)
            first = next(d for d in result.diagnostics if d.is_error)
            return Outcome(Status.CHECK_ERROR, first.message, diagnostics=text)
        if warnings := [d for d in result.diagnostics if not d.is_error]:
            # Kept with the record, so a model sees them with its result (schedlang.llm.feedback).
            candidate.extra["warnings"] = render_all(warnings, candidate.schedule.source)
        return self._saved(result.lowered.func)

    def _saved(self, func: Any) -> Lowered:
        """The function to build, as JSON: with `prepack`ed blocks, the module of the whole
        function, its packing and its kernel (the kernel alone is timed: schedlang.run.packing)."""
        import tvm

        text = tvm.ir.save_json(func)
        if may_prepack(text) and (split := split_prepacked(func, self.outputs)) is not None:
            module, packed = split
            weights = [(w.index, w.shape, w.dtype) for w in packed]
            return Lowered(tvm.ir.save_json(module), weights)
        return Lowered(text)

    def _build(self, index: int, func_json: str) -> Outcome | str:
        worker = self.idle_builders.get()  # each worker serves one job at a time
        try:
            return self._build_on(worker, index, func_json)
        finally:
            self.idle_builders.put(worker)

    def _build_on(self, worker: Worker, index: int, func_json: str) -> Outcome | str:
        self.count += 1
        path = self.work_dir / f"candidate{self.count}_{index}.so"
        cross = {"cc": self.runner.cross_compiler} if self.runner.cross_compiler else {}
        try:
            worker.call(
                "build",
                self.settings.build_timeout_s,
                func_json=func_json,
                target_json=self.target_json,
                out_path=str(path),
                **cross,
            )
        except (WorkerTimeout, WorkerCrash, JobError) as exc:
            return _failed("build", exc, Status.BUILD_ERROR)
        return str(path)

    def _run(self, build: Future, repeat: int, lowered: Lowered) -> Outcome:
        built = build.result()
        if isinstance(built, Outcome):  # did not build
            return built
        job = MeasureJob(
            lib_path=built,
            args_path=str(self.args_path),
            expected_path=str(self.expected_path),
            outputs=self.outputs,
            device="cpu" if self.target.kind == "llvm" else self.target.kind,
            repeat=repeat,
            min_repeat_ms=self.settings.min_repeat_ms,
            poison=self.poison if self.settings.remote is None else None,
            prepacked=lowered.prepacked,
        )
        try:
            return self.runner.run(job)
        finally:
            Path(built).unlink(missing_ok=True)


@dataclass(frozen=True)
class Lowered:
    """A candidate checked and lowered, to build: its JSON and the weights its kernel takes
    packed (None: it is timed whole)."""

    json: str
    prepacked: list[tuple[int, tuple[int, ...], str]] | None = None


def _finished(future: Future) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _failed(job: str, exc: Exception, error_status: Status) -> Outcome:
    """The outcome of a `job` whose worker call raised: the worker timed out or crashed (the
    reason names the job), or the job itself failed with an error (`error_status`)."""
    if isinstance(exc, WorkerTimeout):
        return Outcome(Status.TIMEOUT, f"{job}: {exc}")
    if isinstance(exc, WorkerCrash):
        return Outcome(Status.CRASH, f"{job}: {exc}")
    return Outcome(error_status, str(exc))


# --- the tuning loop -----------------------------------------------------------------------------


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


def tune(
    op: Op,
    target: Target,
    db: Database,
    *,
    settings: Settings = Settings(),
    templates: Sequence[Proposal] = (),
    proposer: Proposer | None = None,
    hint: str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    workers: Workers | None = None,
) -> TuneResult:
    """Measure up to `settings.trials` new candidates from `templates` and/or `proposer`, in
    `workers` if given (left running), else in workers of this run's own."""
    started = time.time()
    use_model, note = resolve(settings.cost_model)
    if note:
        print(f"note: {note}", file=sys.stderr)
    proposer = proposer or (None if templates else BuiltinProposer())
    run = _Run(Context(op, target, hint), db, settings, proposer, on_progress)
    run.begin(templates, note, use_model)
    run.add_proposals(templates)
    with tempfile.TemporaryDirectory(prefix="schedlang-tune-") as work_dir:
        try:
            run.prepare(Path(work_dir), workers)
            run.measure_rounds()
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
        on_progress: Callable[[Progress], None] | None,
    ):
        # The proposer may read the database (a warm start) and write to this run's log.
        self.context = replace(context, db=db, log=self.log)
        self.op, self.target = context.op, context.target
        self.db = db
        self.settings = settings
        self.proposer = proposer
        self.on_progress = on_progress
        self.rng = random.Random(settings.seed)
        self.key, self.target_key = op_key(context.op.func), context.target.key
        self.searches: list[tuple[KnobSearch, Proposal]] = []
        self.pending: list[Candidate] = []  # concrete proposals waiting to be measured
        self.measured: list[Record] = []
        self.reused = 0
        self.model: CostModel | None = None
        self.measurer: Measurer | None = None
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
                failed = _failed_record(
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
            search = search_of(self.searches, candidate)
            if search is not None and set(candidate.knobs) == set(search.space):
                search.seen.add(search.key(candidate.knobs))

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
            raise SchedlangError(f"nothing to tune: no template or schedule for {self.op.name}")
        self.measurer = self.measurer or Measurer(
            self.op, self.target, self.settings, work_dir, workers=workers
        )
        if self.model is not None:
            self.measurer.prelowered = self.model.featurizer.take_lowered

    def measure_rounds(self) -> None:
        """Batches measured until the trials are spent, or rounds bring nothing new to measure."""
        settings, progress = self.settings, self.progress
        idle_rounds = 0
        while progress.done < settings.trials and idle_rounds < settings.max_rounds_without_new:
            batch = next_batch(
                self.searches,
                self.pending,
                min(settings.batch, settings.trials - progress.done),
                self.rng,
                self.log,
                self.model,
                settings.cost_model_pool,
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
            self._measure(fresh)
            if progress.done < settings.trials:
                self.ask_proposer()

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

    def _measure(self, fresh: list[Candidate]) -> None:
        assert self.measurer is not None
        progress = self.progress
        for candidate, outcome in self.measurer.measure(fresh):
            record = _record(
                self.op,
                self.target,
                candidate,
                outcome,
                self.measurer.flops,
                self.settings.seed,
                self.run_id,
            )
            record = replace(record, id=_save(self.db, record))
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
            if self.on_progress:
                self.on_progress(progress)

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
    record = _record(op, target, candidate, outcome, measurer.flops, settings.seed, run_id)
    if not record.is_ok:
        log(f"baseline (the unscheduled build) not saved: {record.status}: {record.reason}")
        return record
    record = replace(record, id=_save(db, record))
    log(f"measured #{record.id}: baseline {record.status} {record.gflops or 0:.2f} GFLOP/s")
    return record


def _save(db: Database, record: Record) -> int:
    """db.add; if the database refuses (locked too long, deleted, damaged), the error also says
    which measurement it did not save, since the tuner stops there."""
    try:
        return db.add(record)
    except SchedlangError as err:
        result = f"{record.gflops:.2f} GFLOP/s" if record.gflops else str(record.status)
        schedule = "; ".join(line.strip() for line in record.schedule.splitlines() if line.strip())
        err.notes = (*err.notes, f"not saved: the candidate just measured ({result}): {schedule}")
        raise


def _record(
    op, target, candidate: Candidate, outcome: Outcome, flops: int, seed: int, run_id: int
) -> Record:
    extra = {**candidate.extra, **outcome.extra, "run_id": run_id}
    extra["names"] = schedule_names(op.func)  # what the schedule names: see schedlang.models.graph
    if outcome.diagnostics:
        extra["diagnostics"] = outcome.diagnostics
    return _new_record(
        op, target, candidate.text, candidate.proposer, seed, outcome.status, outcome.reason, extra,
        knobs=candidate.knobs, template=candidate.template, latencies=outcome.latencies_s,
        flops=flops,
    )  # fmt: skip


def _failed_record(
    op, target, proposal: Proposal, diagnostics: str, seed: int, run_id: int
) -> Record:
    """The record of a proposal that does not parse; it keeps its run id, like `_record`'s."""
    reason = diagnostics.splitlines()[0] if diagnostics else "does not parse"
    extra = {**proposal.extra, "diagnostics": diagnostics, "run_id": run_id}
    return _new_record(
        op, target, proposal.text, proposal.proposer, seed, Status.CHECK_ERROR, reason, extra
    )


def _new_record(
    op: Op,
    target: Target,
    schedule: str,
    proposer: str,
    seed: int,
    status: Status,
    reason: str,
    extra: dict,
    *,
    knobs: dict[str, int] | None = None,
    template: str | None = None,
    latencies: Sequence[float] = (),
    flops: int = 0,
) -> Record:
    """A record made now, with the versions of schedlang and TVM; GFLOP/s from the median."""
    median = float(np.median(latencies)) if latencies else None
    schedlang_version, tvm_version = current_versions()
    return Record(
        op_key=op_key(op.func),
        op_name=op.name,
        target_key=target.key,
        target=target.tvm_config,
        schedule=schedule,
        knobs=knobs or {},
        template=template,
        status=status,
        reason=reason,
        latencies_s=latencies,
        median_s=median,
        gflops=flops / median / 1e9 if median else None,
        proposer=proposer,
        seed=seed,
        created_at=time.time(),
        schedlang_version=schedlang_version,
        tvm_version=tvm_version,
        extra=extra,
    )


# --- reading the database ------------------------------------------------------------------------


def best_records(db: Database, op: Op, target: Target, n: int = 1) -> list[Record]:
    """The `n` fastest verified records of `op` on `target`; SchedlangError when there is none."""
    records = db.best(op_key(op.func), target.key, n=n)
    if not records:
        raise SchedlangError(
            f"no verified schedule for {op.name} on this target in the tuning database",
            "run `schedlang tune` first (records are never shared across targets)",
        )
    return records


def record_schedule(record: Record) -> nodes.Schedule:
    """A record's schedule, parsed; diagnostics name the record (`<db #12>`)."""
    return parse(record.schedule, f"<db #{record.id}>")
