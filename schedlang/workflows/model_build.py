"""Building a whole model with the database's schedules: the workflow behind `build-model`.

    from schedlang.workflows import build_model

    result = build_model(model, target, db, output="model.so", compare=True)
    print(result.comparison.tuned_s if result.comparison else result.verified)

The build (schedlang.models.graph.build_model), then, as asked: its outputs verified against the
model's reference, the library written, each function profiled, the build timed beside the
default one and the model's frameworks. Each step done is a BuildStep event, in that order, so a
caller can show it while the next runs. `build_model_steps` is the same build, its events handed
to the caller one by one.
"""

from __future__ import annotations

import warnings
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedlang.core.diagnostics import SchedlangError, warning
from schedlang.store.db import Database
from schedlang.workflows.database import DatabaseArg, database
from schedlang.workflows.events import (
    BuildStep,
    Event,
    Events,
    Note,
    Steps,
    run_to_end,
)

if TYPE_CHECKING:
    from schedlang.core.target import Target
    from schedlang.models.compare import BuildComparison
    from schedlang.models.function_times import Profile
    from schedlang.models.graph import Applied
    from schedlang.models.model_file import Model
    from schedlang.run.remote import RemoteSettings


@dataclass(frozen=True)
class ModelBuildResult:
    """A model's build and what was asked of it."""

    model: str
    target: str  # the target's kind
    executable: Any  # tvm.runtime.Executable
    applied: list[Applied]  # what each PrimFunc got
    verified: str | None = None  # what the outputs agreed with (None: not verified)
    library: Path | None = None  # the library written (-o)
    profile: Profile | None = None
    profile_error: str | None = None  # why the profiler failed
    comparison: BuildComparison | None = None
    asked: frozenset[str] = field(default_factory=frozenset)  # verify, profile, compare

    def as_json(self) -> dict:
        """The `build-model --json` document, less its head and diagnostics (docs/cli.md)."""
        document: dict[str, Any] = {
            "model": self.model,
            "target": self.target,
            "functions": [
                {"function": a.function, "scheduled": a.summary(), "how": a.how}
                for a in self.applied
            ],
        }
        if "verify" in self.asked:
            document["verified"] = self.verified
        if self.library is not None:
            document["library"] = str(self.library)
        if "profile" in self.asked:
            document["profile"] = (
                {"error": self.profile_error} if self.profile is None else self.profile.as_json()
            )
        if self.comparison is not None:
            document["compare"] = self.comparison.as_json()
        return document


def build_model_steps(
    model: Model,
    target: Target,
    db: DatabaseArg = None,
    *,
    output: str | Path | None = None,
    fuse: bool = True,
    winograd: bool = True,
    fallback: str = "auto",
    verify: bool = True,
    compare: bool = False,
    profile: bool = False,
    repeat: int = 5,
    remote: RemoteSettings | None = None,
) -> Steps[ModelBuildResult]:
    """Build `model` with `db`'s best schedules, then verify it (`verify`; a "not verified" step
    where the target cannot run here, and by `compare`, which verifies against the default build
    too), write the library (`output`), profile it (`profile`) and compare it (`compare`, its
    latencies kept in `db`'s file for `schedlang report`). A wrong build is a SchedlangError
    before anything is written. `db`: the database, open or its path (None: the default one;
    read only, and a missing file reads as empty, with a Note). `remote`: verify on a device
    leased from an RPC tracker (a board the target is for; schedlang.run.leased), the
    reference computed here."""
    if remote is not None and (compare or profile):
        raise SchedlangError(
            "--compare and --profile time the build on this machine, not on a board",
            "verify on the board with --rpc-tracker alone",
        )
    how = {
        "output": output, "fuse": fuse, "winograd": winograd, "fallback": fallback,
        "verify": verify, "compare": compare, "profile": profile, "repeat": repeat,
        "remote": remote,
    }  # fmt: skip
    return Steps(_build_steps(model, target, db, how))


build_model = run_to_end(build_model_steps)


def _build_steps(
    model: Model, target: Target, db: DatabaseArg, how: dict[str, Any]
) -> Generator[Event, None, ModelBuildResult]:
    from schedlang.run.measure import set_runtime_threads

    set_runtime_threads(target.cores if not target.is_gpu else None)
    pending: list[Event] = []  # what each step reported, handed on when it ends
    with database(db, read_only=True, missing_ok=True, events=pending.append) as opened:
        yield from _handed_on(pending)
        built = yield from _build_model(model, target, opened, pending, **how)
    return built


def _handed_on(pending: list[Event]) -> Iterator[Event]:
    while pending:
        yield pending.pop(0)


def _build_model(
    model: Model,
    target: Target,
    db: Database,
    pending: list[Event],
    *,
    output: str | Path | None,
    fuse: bool,
    winograd: bool,
    fallback: str,
    verify: bool,
    compare: bool,
    profile: bool,
    repeat: int,
    remote: RemoteSettings | None,
) -> Generator[Event, None, ModelBuildResult]:
    events = pending.append
    from schedlang.models.graph import StaleRecordWarning
    from schedlang.models.graph import build_model as build
    from schedlang.run.cross import export_for

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StaleRecordWarning)  # each Applied keeps its warnings
        executable, applied = build(
            model.mod, target, db, fuse=fuse, winograd=winograd, fallback=fallback
        )
    events(BuildStep("built", applied))
    yield from _handed_on(pending)
    done: dict[str, Any] = {"asked": frozenset()}
    if verify and not compare:
        verified = _verify(model, target, executable, events, remote)
        done.update(verified=verified, asked={"verify"})
        yield from _handed_on(pending)
    if output:
        # Linked by the target's cross compiler where it is another machine's (run.cross).
        done["library"] = export_for(executable, output, target, remote.cc if remote else None)
        yield BuildStep("wrote", done["library"])
    if profile:
        done.update(_profile(executable, applied, model, target, repeat, events))
        done["asked"] = done["asked"] | {"profile"}
        yield from _handed_on(pending)
    if compare:
        from schedlang.models.compare import compare_builds

        done["comparison"] = compare_builds(model, target, executable, repeat)
        _keep_timings(db, model, target, done["comparison"], events)
        events(BuildStep("compared", done["comparison"]))
        yield from _handed_on(pending)
    asked = frozenset(done.pop("asked"))
    return ModelBuildResult(model.name, target.kind, executable, applied, asked=asked, **done)


def _verify(
    model: Model, target: Target, executable: Any, events: Events, remote: RemoteSettings | None
) -> str | None:
    """What the build's outputs agreed with, or None where it cannot run here (a BuildStep "not
    verified", with why); a disagreement is a SchedlangError. With `remote`, on the board."""
    from schedlang.models.compare import verify_build, verify_on_board
    from schedlang.run.verify import runs_here

    if remote is not None:
        checked = verify_on_board(model, target, executable, remote)
        events(BuildStep("verified", checked))
        return checked

    if not runs_here(target):
        reason = f"this machine cannot run kernels for {target.describe()}"
        events(BuildStep("not verified", reason))
        return None
    checked = verify_build(model, target, executable)
    events(BuildStep("verified", checked))
    return checked


def _profile(
    executable: Any, applied: list, model: Model, target: Target, repeat: int, events: Events
) -> dict[str, Any]:
    """The profile, or why the profiler failed (a Note)."""
    from schedlang.models.function_times import profile_model

    try:
        profile = profile_model(executable, applied, model.inputs, target, repeat)
    except SchedlangError as err:
        events(Note(warning(err.message).render(), warning=True))
        return {"profile_error": err.message}
    events(BuildStep("profiled", profile))
    return {"profile": profile}


def _keep_timings(
    db: Database, model: Model, target: Target, comparison: BuildComparison, events: Events
) -> None:
    """`compare`'s latencies in the database's file (for `schedlang report`), when it can be
    written; one that cannot be is a Note: the comparison stands all the same."""
    from schedlang.models.graph import model_key

    if not Path(str(db.path)).is_file():
        return  # built without a database: none is started for this
    timings = [
        {"label": row.label, "median_s": row.median_s, "skipped": row.skipped}
        for row in comparison.rows
    ]
    try:
        with Database(db.path) as writable:
            writable.add_model_timings(model_key(model.mod), target.key, timings)
    except SchedlangError as err:
        problem = warning(f"the latencies are not kept in the database: {err.message}")
        events(Note(problem.render(), warning=True))
