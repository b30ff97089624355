"""Runners: where a built kernel is verified and timed, behind one small interface.

    runner = make_runner(target, RunnerSettings(run_timeout_s=60), env)
    outcome = runner.run(job)  # a MeasureJob: the library, its arguments, the device
    runner.close()

A runner takes a library built on this machine (by the tuner's builders, with the runner's
`cross_compiler` when it has one) and gives back its Outcome: verified, then timed. There are two:

- `LocalRunner`: one sandboxed worker on this machine (schedlang.run.sandbox), one candidate at a
  time, so that timings don't disturb each other and a crash costs one candidate;
- `RemoteRunner` (schedlang.run.remote): devices leased from a TVM RPC tracker, several at once.

A third kind goes beside them as a module of run/ with a class of this Protocol, and a branch in
`make_runner`: a batch runner for a GPU machine without a compiler (build here, copy the batch's
libraries there, run them, read the outcomes back) would take its jobs in `run` and may keep
`parallelism` at the batch size. Nothing above run/ names a runner's class.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from schedlang.core.target import Target, require_runs_here
from schedlang.run.outcome import Outcome
from schedlang.run.sandbox import JobError, MeasureJob, Worker, WorkerCrash, WorkerTimeout
from schedlang.store.records import Status

if TYPE_CHECKING:
    from schedlang.run.remote import RemoteSettings


class Runner(Protocol):
    """Verifies and times built kernels; `run` may be called from `parallelism` threads at once."""

    parallelism: int  # jobs in flight at once
    cross_compiler: str | None  # the compiler a library must be built with for its devices

    def run(self, job: MeasureJob) -> Outcome:
        """The job's outcome; a failed kernel is an Outcome, not an exception. A SchedlangError
        means the runner cannot go on (no device left)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RunnerSettings:
    """What picks and configures a runner: `remote` (RPC tracker settings) or this machine."""

    run_timeout_s: float = 60.0
    slow_run_s: float | None = 1.0  # a kernel slower than this is timed with fewer repeats (here)
    remote: RemoteSettings | None = None

    @property
    def is_local(self) -> bool:
        """Whether kernels run on this machine, beside the builders (then timed after them)."""
        return self.remote is None


class LocalRunner:
    """Runs candidates one at a time in a runner worker on this machine."""

    parallelism = 1
    cross_compiler: str | None = None  # this machine's compiler builds what runs here

    def __init__(self, settings: RunnerSettings, env: dict[str, str]):
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
            return worker_failure("run", exc, Status.RUN_ERROR)


def make_runner(target: Target, settings: RunnerSettings, env: dict[str, str]) -> Runner:
    """The runner `settings` ask for: devices of an RPC tracker (`settings.remote`), else a worker
    here, once this machine is known to run `target`'s kernels (an instruction this CPU lacks
    kills the kernel with SIGILL)."""
    if settings.remote is not None:
        from schedlang.run.remote import RemoteRunner

        return RemoteRunner(settings.remote, target, settings.run_timeout_s, env)
    require_runs_here(target)
    return LocalRunner(settings, env)


def worker_failure(job: str, exc: Exception, error_status: Status) -> Outcome:
    """The outcome of a `job` whose worker call raised: the worker timed out or crashed (the
    reason names the job), or the job itself failed with an error (`error_status`)."""
    if isinstance(exc, WorkerTimeout):
        return Outcome(Status.TIMEOUT, f"{job}: {exc}")
    if isinstance(exc, WorkerCrash):
        return Outcome(Status.CRASH, f"{job}: {exc}")
    return Outcome(error_status, str(exc))
