"""Measuring candidates: each checked and lowered here, built in parallel worker processes, then
verified and timed by a runner (schedlang.run.runner): a sandboxed worker here, one at a time, or
devices leased from an RPC tracker, several at once. A crash, a hang or a wrong result is the
candidate's Outcome, never the run's end.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schedlang.checker.check import check
from schedlang.core.diagnostics import SchedlangError, render_all
from schedlang.core.opinfo import flop_count
from schedlang.core.ops import Op, random_inputs, reference_outputs
from schedlang.core.target import Target
from schedlang.run.measure import output_indices
from schedlang.run.outcome import Outcome
from schedlang.run.packing import may_prepack, split_prepacked
from schedlang.run.runner import Runner, make_runner, worker_failure
from schedlang.run.sandbox import JobError, MeasureJob, Worker, WorkerCrash, WorkerTimeout
from schedlang.run.verify import unread_outputs
from schedlang.store.records import Status
from schedlang.tuning.search import Candidate
from schedlang.tuning.settings import Settings


class Workers:
    """The processes a run measures in: builders, and a runner here or devices leased from an RPC
    tracker. A run makes its own; `tune_model` keeps one set for all of a model's rounds, where
    starting them again (each imports TVM) took 2 s of a 9 s round. Started on first use."""

    def __init__(self, target: Target, settings: Settings, log_path: Path):
        env = {
            "TVM_NUM_THREADS": str(target.cores if not target.is_gpu else 1),
            "SCHEDLANG_WORKER_LOG": str(log_path),
        }
        self.runner: Runner = make_runner(target, settings.runner(), env)
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
                # Each candidate's build with what it builds, or its check error (no build).
                builds: list[tuple[Future[Outcome | str], Lowered] | Outcome] = [
                    result
                    if isinstance(result, Outcome)
                    else (pool.submit(self._build, index, result.json), result)
                    for index, result in enumerate(lowered)
                ]
                if self.settings.runner().is_local:
                    # Here the builders and the runner share the cores: a kernel timed while
                    # LLVM compiles the rest of the batch beside it is timed slow (the best of a
                    # round was its 7th or 8th candidate in 17 of 32 rounds). Time after them.
                    wait([build[0] for build in builds if not isinstance(build, Outcome)])
                futures: list[Future[Outcome] | Outcome] = [
                    build
                    if isinstance(build, Outcome)
                    else runs.submit(self._run, build[0], repeat, build[1])
                    for build in builds
                ]
                for index, (candidate, future) in enumerate(zip(candidates, futures, strict=True)):
                    if isinstance(future, Outcome):
                        yield candidate, future
                        continue
                    try:
                        outcome = future.result()
                    except SchedlangError:
                        runs.shutdown(wait=True, cancel_futures=True)
                        for later, later_future in zip(
                            candidates[index + 1 :], futures[index + 1 :], strict=True
                        ):
                            if isinstance(later_future, Outcome):
                                yield later, later_future
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
            return worker_failure("build", exc, Status.BUILD_ERROR)
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
            device=self.target.device(),
            repeat=repeat,
            min_repeat_ms=self.settings.min_repeat_ms,
            poison=self.poison if self.settings.runner().is_local else None,
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
