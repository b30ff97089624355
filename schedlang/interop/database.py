"""MetaSchedule's JSON database, both ways.

Export: a schedule's trace, with the op as MetaSchedule normalizes it and the measured run times,
is a tuning record in a MetaSchedule `JSONDatabase` folder (`export_metaschedule`, `export_best`),
which stock TVM reads: `ms.tir_integration.compile_tir(database, func, target)` builds the
schedlang schedule. Import: `from_metaschedule(db_dir, func)` decompiles the best tuning record
of an op (schedlang.interop.decompiler).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import tvm
from tvm import s_tir, tirx

from schedlang.checker.pipeline import lower
from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.core.target import Target, as_target, resolve_target
from schedlang.core.units import format_seconds
from schedlang.interop.decompiler import Decompiled, decompile
from schedlang.interop.traces import (
    as_schedule,
    parse_schedule,
    plain_json,
    require_traceable,
    same_function,
    trace_to_json,
)
from schedlang.lang import nodes

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
Folder = str | os.PathLike[str]  # a MetaSchedule database: its two files' folder
# An op, or MetaSchedule's workload module of it (TVM's classes are untyped: Any to mypy).
Workload: TypeAlias = "tirx.PrimFunc | tvm.IRModule"
# MetaSchedule's stand-in run time for a candidate that failed (SortTuningRecordByMeanRunSecs).
_FAILED_RUN_S = 1e9


def workload(func: tirx.PrimFunc, global_symbol: str | None = None) -> tvm.IRModule:
    """The op as MetaSchedule stores and looks it up: `compile_tir` (and Relax's
    `MetaScheduleApplyDatabase`) normalize a PrimFunc with TVM's registered `normalize_mod`
    (`IRModule({"main": func})` with `global_symbol` and `tirx.noalias` set) and find records by
    structural equality with it. Relax looks a function up under its own symbol: pass it."""
    if global_symbol is not None:
        func = func.with_attr("global_symbol", global_symbol)
    return tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")(func)


@dataclass(frozen=True)
class ExportedRecord:
    db_dir: Path
    trace_json: list
    run_secs: tuple[float, ...]
    target: dict
    added: bool  # False when the database already held this schedule for this op and target


def export_metaschedule(
    db_dir: Folder,
    func: tirx.PrimFunc,
    schedule: nodes.Schedule | str,
    target: Target | str,
    latencies: Sequence[float],
    *,
    knobs: Mapping[str, int] | None = None,
    global_symbol: str | None = None,
) -> ExportedRecord:
    """Append the schedule to the MetaSchedule JSON database in `db_dir` (created if missing): the
    op's workload, once, and a tuning record with its trace, `latencies` as run_secs and the
    target. MetaSchedule picks the record with the lowest mean run time."""
    from tvm.s_tir import meta_schedule as ms

    run_secs = _run_secs(latencies)
    target = as_target(target)
    schedule = as_schedule(schedule)
    require_traceable(schedule)
    lowered = lower(schedule, func, target, knobs)
    trace_json = trace_to_json(lowered.trace)
    if not trace_json[0]:
        raise SchedlangError(
            "an empty schedule has an empty trace, which MetaSchedule ignores",
            "export a schedule with at least one statement",
        )
    mod = workload(func, global_symbol)
    replayed = s_tir.Schedule(mod)
    s_tir.Trace.apply_json_to_schedule(trace_json, replayed)  # what MetaSchedule will do
    if not same_function(replayed.mod["main"], lowered.func):
        raise SchedlangError(  # would be a bug in TVM's trace serialization or in schedlang
            "the exported trace does not replay to the scheduled function",
            "please report it with the op and the schedule",
        )
    database = open_metaschedule(db_dir, create=True)
    committed = database.commit_workload(mod)
    tvm_target = target.to_tvm()
    for record in database.get_top_k(committed, len(database)):
        if trace_to_json(record.trace) == trace_json and _config(record.target) == _config(
            tvm_target
        ):
            return ExportedRecord(Path(db_dir), trace_json, run_secs, _config(tvm_target), False)
    database.commit_tuning_record(
        ms.database.TuningRecord(
            lowered.trace,
            committed,
            list(run_secs),
            tvm_target,
            ms.arg_info.ArgInfo.from_prim_func(func),
        )
    )
    return ExportedRecord(Path(db_dir), trace_json, run_secs, _config(tvm_target), True)


def export_best(
    db_dir: Folder,
    database,
    target: Target | str,
    funcs: Iterable[tirx.PrimFunc],
    n: int = 1,
) -> list[ExportedRecord]:
    """Export the `n` fastest verified records of each op in `funcs` on `target` from a schedlang
    tuning database (`schedlang.store.db.Database`). Records store an op's structural hash, not
    the op itself, so the ops to export are given; an op without records is skipped."""
    from schedlang.store.records import op_key

    target = as_target(target)
    exported = []
    for func in funcs:
        for record in database.best(op_key(func), target.key, n):
            schedule = parse_schedule(record.schedule, f"<db #{record.id}>")
            exported.append(export_metaschedule(db_dir, func, schedule, target, record.latencies_s))
    if not exported:
        raise SchedlangError(
            "no verified schedule for these ops on this target in the tuning database",
            "run `schedlang tune` first (records are never shared across targets)",
        )
    return exported


def open_metaschedule(db_dir: Folder, *, create: bool = False):
    """The MetaSchedule `JSONDatabase` in `db_dir` (its two files); with `create`, made if
    missing."""
    from tvm.s_tir import meta_schedule as ms

    folder = Path(db_dir)
    files = (folder / WORKLOAD_FILE, folder / RECORD_FILE)
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SchedlangError(f"cannot create {folder}: {err.strerror}") from None
    elif not all(path.is_file() for path in files):
        raise SchedlangError(
            f"{folder} is not a MetaSchedule database",
            f"expected {WORKLOAD_FILE} and {RECORD_FILE} in it (the work_dir of a tuning run)",
        )
    try:
        return ms.database.JSONDatabase(
            path_workload=str(files[0]), path_tuning_record=str(files[1]), allow_missing=create
        )
    except Exception as exc:  # TVM's reader: a malformed line, a trace for another op
        raise SchedlangError(
            f"cannot read the MetaSchedule database in {folder}: {error_line(exc)}"
        ) from None


def _run_secs(latencies: Sequence[float]) -> tuple[float, ...]:
    values = tuple(float(t) for t in latencies)
    if not values or not all(math.isfinite(t) and 0 < t < _FAILED_RUN_S for t in values):
        raise SchedlangError(
            f"run times must be positive numbers of seconds, got {list(values)}",
            "MetaSchedule ignores a record without a valid run time",
        )
    return values


# --- import --------------------------------------------------------------


@dataclass(frozen=True)
class MetaScheduleRecord:
    """The best tuning record of an op: its trace, mean run time and target."""

    trace: s_tir.Trace
    mean_s: float
    run_secs: tuple[float, ...]
    target: tvm.target.Target | None


def best_metaschedule_record(
    db_dir: Folder, func: Workload, target: Target | str | None = None
) -> MetaScheduleRecord:
    """The fastest valid record of `func` (a PrimFunc, or a workload IRModule) in the MetaSchedule
    database in `db_dir`, on `target` when one is given (MetaSchedule itself ignores targets)."""
    wanted = _single_func(func)
    database = open_metaschedule(db_dir)
    records = database.get_all_tuning_records()
    same_op = [r for r in records if same_function(_single_func(r.workload.mod), wanted)]
    valid = [(r, _valid_secs(r)) for r in same_op]
    valid = [(r, secs) for r, secs in valid if secs]
    wanted_target = None if target is None else _config(as_target(target).to_tvm())
    chosen = [
        (r, secs)
        for r, secs in valid
        if wanted_target is None or (r.target is not None and _config(r.target) == wanted_target)
    ]
    if not chosen:
        if not same_op:
            raise SchedlangError(
                f"no record of this op among the {len(records)} records in {db_dir}",
                "is the database from tuning another op, or other shapes?",
            )
        if not valid:
            raise SchedlangError(
                f"the {len(same_op)} records of this op in {db_dir} have no valid run time",
                "every candidate failed to build or run",
            )
        targets = sorted({json.dumps(_config(r.target)) for r, _ in valid if r.target})
        raise SchedlangError(
            f"no record of this op for this target in {db_dir}",
            f"records of this op exist for: {'; '.join(targets) or 'no recorded target'}",
            "pass one of those targets, or none for the best on any",
        )
    record, secs = min(chosen, key=lambda item: sum(item[1]) / len(item[1]))
    return MetaScheduleRecord(record.trace, sum(secs) / len(secs), secs, record.target)


def from_metaschedule(
    db_dir: Folder, func: Workload, target: Target | str | None = None, *, partial: bool = False
) -> str:
    """The best MetaSchedule record of `func` as schedlang text, headed by a comment saying where
    it came from."""
    return import_metaschedule(db_dir, func, target, partial=partial).text


def import_metaschedule(
    db_dir: Folder, func: Workload, target: Target | str | None = None, *, partial: bool = False
) -> Decompiled:
    """`from_metaschedule`, with the diagnostics: the record's target checks the text unless
    `target` is given."""
    record = best_metaschedule_record(db_dir, func, target)
    if target is None:
        target = _schedlang_target(record.target) if record.target is not None else None
    runs = len(record.run_secs)
    where = f"{format_seconds(record.mean_s)} (mean of {runs} run{'s' * (runs != 1)})"
    on = f" on {json.dumps(_config(record.target))}" if record.target is not None else ""
    return decompile(
        record.trace,
        _single_func(func),
        target,
        partial=partial,
        file=f"<{db_dir}: best record>",
        header=f"imported from the MetaSchedule database {db_dir}: {where}{on}",
    )


def _schedlang_target(target: tvm.target.Target) -> Target:
    config = {k: v for k, v in _config(target).items() if k not in ("keys", "tag")}
    return resolve_target(json.dumps(config))


def _config(target: tvm.target.Target) -> dict:
    """A TVM target as plain JSON, for comparing targets."""
    return plain_json(dict(target.export()))


def _single_func(mod: Workload) -> tirx.PrimFunc:
    if isinstance(mod, tirx.PrimFunc):
        return mod
    funcs = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    if len(funcs) != 1:
        raise SchedlangError(f"expected a workload with one PrimFunc, got {len(funcs)}")
    return funcs[0]


def _valid_secs(record) -> tuple[float, ...]:
    secs = tuple(float(s) for s in record.run_secs or ())
    return secs if secs and all(0 < s < _FAILED_RUN_S for s in secs) else ()
