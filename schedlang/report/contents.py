"""What a report shows, read from a tuning database: per op and target its records in the order
they were measured, its baselines, its best schedules (lowered again from the function the
database kept, `Database.op_script`) and its failures grouped by reason; per model its tasks'
time before and after tuning and their trials, its estimated latency against trials (the curve
the stopping rule reads, schedlang.tuning.convergence), and its end-to-end latencies.

A file that cannot be read whole still gives contents: what can be read (`salvage_records`), and
`problems` saying what could not. Only a file written by a newer schedlang is an error, since
reading it could mislead: `read_contents` raises SchedlangError then.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from schedlang.core.diagnostics import SchedlangError
from schedlang.store.db import Database, salvage_records
from schedlang.store.records import Record
from schedlang.store.schema import DamagedDatabaseError, missing_database
from schedlang.tuning.convergence import model_curve

BEST_SHOWN = 3  # best schedules per op and target, each with its lowered TIR


@dataclass(frozen=True)
class Best:
    record: Record
    tir: str | None  # the scheduled function as TVMScript; None when it cannot be made
    why_no_tir: str = ""


@dataclass(frozen=True)
class FailureGroup:
    status: str
    reason: str  # the group's reason, its numbers as N
    count: int
    example: Record


@dataclass(frozen=True)
class OpSection:
    op_name: str
    op_key: str
    target: str  # one line: kind and its options (mcpu, arch)
    records: list[Record]  # measured candidates in time order: the curve's trials
    baselines: dict[str, float]  # GFLOP/s by name
    best: list[Best]
    failures: list[FailureGroup]
    statuses: dict[str, int]

    @property
    def title(self) -> str:
        return f"{self.op_name} on {self.target}"


@dataclass(frozen=True)
class TaskTime:
    name: str
    calls: int
    before_s: float | None  # the unscheduled build's time, all its calls
    after_s: float | None  # the best verified time (or the unscheduled one, when faster)
    trials: int = 0  # candidates measured (not its unscheduled build, not MetaSchedule's)


@dataclass(frozen=True)
class ModelSection:
    name: str
    target: str
    tasks: list[TaskTime]
    timings: list[tuple[str, float | None, str | None]]  # (label, median_s, why skipped)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (trials, estimated latency)

    @property
    def tuned_s(self) -> float:
        """The tuned functions' times summed: the model's estimated latency."""
        return sum(task.after_s or 0 for task in self.tasks)


@dataclass
class Contents:
    path: Path
    ops: list[OpSection] = field(default_factory=list)
    models: list[ModelSection] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what could not be read
    records: int = 0


def read_contents(path: Path, *, lower_best: bool = True) -> Contents:
    """The report's contents of the database at `path`; `lower_best=False` leaves out the lowered
    TIR (no TVM needed). SchedlangError for a file that is missing, another program's or of a
    newer schema."""
    contents = Contents(path)
    if not path.is_file():
        raise missing_database(path)
    if path.stat().st_size == 0:
        contents.problems.append(f"{path} is an empty file: no tuning database was written to it")
        return contents
    scripts: Callable[[str], str | None] = lambda key: None  # noqa: E731
    try:
        with Database(path, read_only=True) as db:
            records = db.records()
            try:
                models = db.models()
            except (SchedlangError, ValueError) as err:
                contents.problems.append(f"the models cannot be read: {_message(err)}")
                models = []
            found = {r.op_key: db.op_script(r.op_key) for r in records}
            scripts = found.get
    except DamagedDatabaseError as err:  # another error (a newer or foreign file) stops here
        contents.problems.append(err.message)
        records, models = _salvaged(path, contents)
    contents.records = len(records)
    contents.ops = [
        _op_section(group, scripts, lower_best) for group in _by_op_and_target(records).values()
    ]
    contents.models = [_model_section(m, records) for m in models]
    return contents


def _salvaged(path: Path, contents: Contents) -> tuple[list[Record], list[dict]]:
    try:
        records, lost, exact = salvage_records(path)
    except Exception as exc:  # noqa: BLE001 - whatever SQLite says of a file it cannot read
        contents.problems.append(f"no record could be read: {_message(exc)}")
        return [], []
    if lost or not exact:
        count = f"{'' if exact else 'at least '}{lost}"
        contents.problems.append(f"{count} records could not be read and are left out")
    contents.problems.append(
        f"showing the {len(records)} records that could be read; models and lowered TIR are "
        "left out"
    )
    return records, []


def _message(err: BaseException) -> str:
    return err.message if isinstance(err, SchedlangError) else str(err) or type(err).__name__


def _by_op_and_target(records: list[Record]) -> dict[tuple[str, str], list[Record]]:
    groups: dict[tuple[str, str], list[Record]] = {}
    for record in sorted(records, key=lambda r: (r.created_at, r.id or 0)):
        groups.setdefault((record.op_key, record.target_key), []).append(record)
    return groups


def target_line(config: dict) -> str:
    """`llvm -mcpu=znver3`, `cuda -arch=sm_90`: the kind and the options that tell targets apart."""
    parts = [str(config.get("kind", "?"))]
    for name in ("mcpu", "arch", "num-cores"):
        if config.get(name) not in (None, ""):
            parts.append(f"-{name}={config[name]}")
    return " ".join(parts)


def _op_section(
    records: list[Record], scripts: Callable[[str], str | None], lower_best: bool
) -> OpSection:
    first = records[0]
    unscheduled = [r for r in records if r.schedule == "" and r.is_ok and r.gflops]
    metaschedule = [r for r in records if r.proposer == "metaschedule" and r.is_ok and r.gflops]
    trials = [r for r in records if r.schedule != "" and r.proposer != "metaschedule"]
    baselines: dict[str, float] = {}
    if unscheduled:  # each with its GFLOP/s (the filters above)
        baselines["unscheduled"] = unscheduled[-1].gflops or 0.0
    if metaschedule:
        baselines["MetaSchedule"] = max(r.gflops or 0.0 for r in metaschedule)
    ok = sorted(
        (r for r in trials if r.is_ok and r.median_s is not None), key=lambda r: r.median_s or 0.0
    )
    script = scripts(first.op_key)
    best = [_best(r, script, lower_best) for r in ok[:BEST_SHOWN]]
    statuses: dict[str, int] = {}
    for record in trials:
        statuses[str(record.status)] = statuses.get(str(record.status), 0) + 1
    return OpSection(
        op_name=first.op_name,
        op_key=first.op_key,
        target=target_line(first.target),
        records=trials,
        baselines=baselines,
        best=best,
        failures=failure_groups(trials),
        statuses=statuses,
    )


def failure_groups(records: list[Record]) -> list[FailureGroup]:
    """The failed records by status and reason (numbers and names in quotes made alike), the
    largest group first, each with its first record as the example."""
    groups: dict[tuple[str, str], list[Record]] = {}
    for record in records:
        if record.is_ok:
            continue
        reason = record.reason.strip().splitlines()[0] if record.reason.strip() else "no reason"
        reason = re.sub(r"`[^`]*`", "`…`", reason)
        reason = re.sub(r"\d+(\.\d+)?", "N", reason)
        groups.setdefault((str(record.status), reason), []).append(record)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    return [FailureGroup(status, reason, len(rs), rs[0]) for (status, reason), rs in ordered]


def _best(record: Record, script: str | None, lower_best: bool) -> Best:
    if not lower_best:
        return Best(record, None, "")
    if script is None:
        why = (
            "the database does not keep this op's function (tuned before schedlang kept it): "
            "`schedlang compile OP --from-db --emit tir` shows it"
        )
        return Best(record, None, why)
    try:
        return Best(record, lowered_tir(script, record))
    except SchedlangError as err:
        return Best(record, None, f"cannot be lowered again here: {err.message}")
    except Exception as exc:  # noqa: BLE001 - TVM's own errors: the report goes on without it
        return Best(record, None, f"cannot be lowered again here: {type(exc).__name__}: {exc}")


def lowered_tir(script: str, record: Record) -> str:
    """The record's schedule applied to the op's function (TVMScript, as the database kept it)."""
    import tvm

    from schedlang.checker.pipeline import lower
    from schedlang.core.target import resolve_target
    from schedlang.lang.syntax import parse

    func = tvm.script.from_source(script)
    target = resolve_target(record.target_key)
    return lower(parse(record.schedule, f"record #{record.id}"), func, target).script()


def _model_section(model: dict, records: list[Record]) -> ModelSection:
    target_key = model["target_key"]
    tasks, calls, theirs = [], {}, []
    for task in model["tasks"]:
        mine = [r for r in records if r.op_key == task["key"] and r.target_key == target_key]
        ok = [r.median_s for r in mine if r.is_ok and r.median_s is not None]
        plain = [r.median_s for r in mine if r.schedule == "" and r.is_ok and r.median_s]
        calls[task["key"]] = int(task.get("calls") or 1)
        ours = [r for r in mine if r.proposer != "metaschedule"]
        theirs += ours
        tasks.append(
            TaskTime(
                name=str(task.get("name", "?")),
                calls=calls[task["key"]],
                before_s=plain[-1] * calls[task["key"]] if plain else None,
                after_s=min(ok) * calls[task["key"]] if ok else None,
                trials=sum(1 for r in ours if r.schedule != "" and r.proposer != "baseline"),
            )
        )
    timings = [
        (label, value.get("median_s"), value.get("skipped"))
        for label, value in model.get("timings", {}).items()
    ]
    try:
        target = target_line(json.loads(target_key))
    except ValueError:
        target = "?"
    return ModelSection(str(model["name"]), target, tasks, timings, model_curve(theirs, calls))
