"""Round trips with TVM's own formats: traces, and MetaSchedule's JSON database.

Export. A schedule lowers to the TVM trace that applied it (`to_trace`, `trace_to_json`); that
trace, with the op as MetaSchedule normalizes it and the measured run times, is a tuning record
in a MetaSchedule `JSONDatabase` folder (`export_metaschedule`, `export_best`), which stock TVM
reads: `ms.tir_integration.compile_tir(database, func, target)` builds the schedlang schedule.

Import. `from_trace(trace, func)` turns a trace (a `Trace` or its JSON) back into schedlang text,
and `from_metaschedule(db_dir, func)` does so for the best tuning record of an op. MetaSchedule's
sampled decisions become constants; its `meta_schedule.*` hints either become the statements
MetaSchedule's postprocessors would have made of them, or, for pure bookkeeping, are dropped
with a note; an instruction schedlang has no statement for is an error naming it and its position
in the trace (`--partial` keeps what translates and comments the rest out).

How the decompiler stays honest: TVM replays the trace on one schedule (the reference) and calls
back before each instruction; the callback translates the instruction into schedlang statements
and applies them to a second schedule through schedlang's own lowering (`apply_statement`), so the
names it writes are the ones schedlang gives. The two functions are compared after every
instruction, so a statement that does not do exactly what the instruction did is reported at that
instruction. The finished text is then parsed, checked and lowered like any schedule and compared
with the trace applied directly.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV

from schedlang.checker.pipeline import SCHEDULED_ATTR, apply_statement, lower, tvm_reason
from schedlang.core.diagnostics import (
    Diagnostic,
    DiagnosticError,
    SchedlangError,
    Severity,
    Span,
    error,
    error_line,
    render_all,
)
from schedlang.core.target import Target, as_target, resolve_target
from schedlang.lang import nodes, statements
from schedlang.lang.nest import Nest
from schedlang.lang.printer import format_schedule
from schedlang.lang.statements import annotation, blocks

IMPORTED = "<imported>"  # the file name diagnostics about an imported schedule carry
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
# MetaSchedule's stand-in run time for a candidate that failed (SortTuningRecordByMeanRunSecs).
_FAILED_RUN_S = 1e9

# Instructions that only look something up or sample a value: no statement of their own.
_LOOKUPS = {
    "GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers", "GetOutputBlocks",
}  # fmt: skip
_SAMPLES = {"SamplePerfectTile", "SamplePartitionedTile", "SampleCategorical"}
_STATEMENTS = statements.instructions()  # instruction → the schedlang statement it becomes
SUPPORTED_INSTRUCTIONS = frozenset(
    {*_LOOKUPS, *_SAMPLES, *_STATEMENTS, "SampleComputeLocation", "Unannotate", "EnterPostproc"}
)
_PRAGMAS = {f"pragma_{key}": key for key in nodes.PRAGMA_KEYS}
_HINT = "meta_schedule."
# Hints MetaSchedule's RewriteParallelVectorizeUnroll postprocessor turns into fuse, parallel,
# vectorize and unroll pragmas (and then removes).
_PARALLEL_HINTS = {
    f"{_HINT}{k}" for k in ("parallel", "vectorize", "unroll_explicit", "unroll_implicit")
}
# Block annotations only MetaSchedule's own rules read; TVM drops block annotations when it lowers
# (LowerOpaqueBlock), so they do not change the built code.
BOOKKEEPING_HINTS = frozenset(
    f"{_HINT}{k}"
    for k in (
        "tiling_structure",
        "random_compute_producer",
        "thread_extent_low_inclusive",
        "thread_extent_high_inclusive",
    )
)


# --- export ---------------------------------------------------------------------------------------


def to_trace(
    func: tirx.PrimFunc,
    schedule: nodes.Schedule | str,
    target: Target | str,
    knobs: Mapping[str, int] | None = None,
) -> s_tir.Trace:
    """The TVM trace of a checked schedule: replayed on `s_tir.Schedule(func)` it gives the
    scheduled function."""
    schedule = schedule if isinstance(schedule, nodes.Schedule) else _parse(schedule, "<schedule>")
    require_traceable(schedule)
    return lower(schedule, func, as_target(target), knobs).trace


def require_traceable(schedule: nodes.Schedule) -> None:
    """A trace holds TVM schedule primitives only: `fast_math` rewrites the block's TIR itself,
    so a trace (and a MetaSchedule record) of a schedule using it would build the kernel without
    it. Refused instead of exported wrong."""
    from schedlang.lang.statements.fastmath import FastMath

    for stmt in schedule.statements:
        if isinstance(stmt, FastMath):
            raise SchedlangError(
                f"{stmt.span}: `fast_math` rewrites the "
                "block's TIR itself, not through a TVM schedule primitive, so a TVM trace or "
                "MetaSchedule record cannot hold it",
                "export the schedule without `fast_math` (its kernel then calls expf), or build "
                "the kernel with `schedlang compile`",
            )


def trace_to_json(trace: s_tir.Trace) -> list:
    """The trace as TVM writes it in a tuning record (`[instructions, decisions]`), in plain JSON
    types: `json.dumps` takes it, `Trace.apply_json_to_schedule` replays it."""
    return _plain(trace.as_json(remove_postproc=False))


def trace_from_json(data: Any, func: tirx.PrimFunc) -> s_tir.Trace:
    """A trace read from its JSON form (text or data), replayed once on `func` to check it."""
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as err:
            raise SchedlangError(f"the trace is not valid JSON: {err}", _TRACE_FORM) from None
    if not (
        isinstance(data, list)
        and len(data) == 2
        and all(isinstance(part, list) for part in data)
        and all(isinstance(inst, list) and len(inst) == 4 for inst in data[0])
    ):
        raise SchedlangError("this JSON is not a TVM trace", _TRACE_FORM)
    decided = {entry[0] for entry in data[1] if isinstance(entry, list) and entry}
    _require_decisions([(str(inst[0]), index in decided) for index, inst in enumerate(data[0])])
    sch = s_tir.Schedule(func)
    try:
        s_tir.Trace.apply_json_to_schedule(data, sch)
    except Exception as exc:  # TVM's own refusal: malformed, or made for another op
        raise SchedlangError(
            f"the trace does not apply to this op: {tvm_reason(exc)}",
            "is it the trace of another op, or of other shapes?",
        ) from None
    return sch.trace


def _require_decisions(samples: list[tuple[str, bool]]) -> None:
    """TVM samples afresh where a decision is missing: the schedule would not be the one saved."""
    for index, (kind, decided) in enumerate(samples):
        if kind.startswith("Sample") and not decided:
            raise SchedlangError(
                f"instruction #{index} of the trace ({kind}) has no decision",
                "this is a design space, not a schedule: import a trace whose values were "
                "chosen (a MetaSchedule tuning record, or a sampled design space)",
            )


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
    db_dir: str | os.PathLike[str],
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
    schedule = schedule if isinstance(schedule, nodes.Schedule) else _parse(schedule, "<schedule>")
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
    if not _same(replayed.mod["main"], lowered.func):
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
    db_dir: str | os.PathLike[str],
    database,
    target: Target | str,
    funcs: Iterable[tirx.PrimFunc],
    n: int = 1,
) -> list[ExportedRecord]:
    """Export the `n` fastest verified records of each op in `funcs` on `target` from a schedlang
    tuning database (`schedlang.store.db.Database`). Records store an op's structural hash, not the
    op
    itself, so the ops to export are given; an op without records is skipped."""
    from schedlang.store.records import op_key

    target = as_target(target)
    exported = []
    for func in funcs:
        for record in database.best(op_key(func), target.key, n):
            schedule = _parse(record.schedule, f"<db #{record.id}>")
            exported.append(export_metaschedule(db_dir, func, schedule, target, record.latencies_s))
    if not exported:
        raise SchedlangError(
            "no verified schedule for these ops on this target in the tuning database",
            "run `schedlang tune` first (records are never shared across targets)",
        )
    return exported


def open_metaschedule(db_dir: str | os.PathLike[str], *, create: bool = False):
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


# --- import: MetaSchedule database --------------------------------------------------------------


@dataclass(frozen=True)
class MetaScheduleRecord:
    """The best tuning record of an op: its trace, mean run time and target."""

    trace: s_tir.Trace
    mean_s: float
    run_secs: tuple[float, ...]
    target: tvm.target.Target | None


def best_metaschedule_record(
    db_dir: str | os.PathLike[str],
    func: tirx.PrimFunc | tvm.IRModule,
    target: Target | str | None = None,
) -> MetaScheduleRecord:
    """The fastest valid record of `func` (a PrimFunc, or a workload IRModule) in the MetaSchedule
    database in `db_dir`, on `target` when one is given (MetaSchedule itself ignores targets)."""
    wanted = _single_func(func)
    database = open_metaschedule(db_dir)
    records = database.get_all_tuning_records()
    same_op = [r for r in records if _same(_single_func(r.workload.mod), wanted)]
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
    db_dir: str | os.PathLike[str],
    func: tirx.PrimFunc | tvm.IRModule,
    target: Target | str | None = None,
    *,
    partial: bool = False,
) -> str:
    """The best MetaSchedule record of `func` as schedlang text, headed by a comment saying where
    it came from."""
    return import_metaschedule(db_dir, func, target, partial=partial).text


def import_metaschedule(
    db_dir: str | os.PathLike[str],
    func: tirx.PrimFunc | tvm.IRModule,
    target: Target | str | None = None,
    *,
    partial: bool = False,
) -> Decompiled:
    """`from_metaschedule`, with the diagnostics: the record's target checks the text unless
    `target` is given."""
    record = best_metaschedule_record(db_dir, func, target)
    if target is None:
        target = _schedlang_target(record.target) if record.target is not None else None
    runs = len(record.run_secs)
    where = f"{_seconds(record.mean_s)} (mean of {runs} run{'s' * (runs != 1)})"
    on = f" on {json.dumps(_config(record.target))}" if record.target is not None else ""
    return decompile(
        record.trace,
        _single_func(func),
        target,
        partial=partial,
        file=f"<{db_dir}: best record>",
        header=f"imported from the MetaSchedule database {db_dir}: {where}{on}",
    )


# --- import: traces -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decompiled:
    text: str  # schedlang, canonically formatted
    diagnostics: tuple[Diagnostic, ...]  # notes and warnings (and, with partial, what is left out)
    source: str  # the trace as Python, one instruction per line: what the diagnostics point at
    complete: bool  # every instruction translated, and the text lowers to the trace's function

    def render(self) -> str:
        """The diagnostics as text: those about the trace against its Python form, those about
        the imported schedule (the checker's) against the text."""
        on_text = [d for d in self.diagnostics if d.span is not None and d.span.file == IMPORTED]
        on_trace = [d for d in self.diagnostics if d not in on_text]
        parts = (render_all(on_trace, self.source), render_all(on_text, self.text))
        return "\n\n".join(part for part in parts if part)


def from_trace(
    trace: s_tir.Trace | list | str,
    func: tirx.PrimFunc,
    target: Target | str | None = None,
    *,
    partial: bool = False,
) -> str:
    """A trace (a `Trace`, or its JSON as data or text) as schedlang text for `func`."""
    return decompile(trace, func, target, partial=partial).text


def decompile(
    trace: s_tir.Trace | list | str,
    func: tirx.PrimFunc,
    target: Target | str | None = None,
    *,
    partial: bool = False,
    file: str = "<trace>",
    header: str | None = None,
) -> Decompiled:
    """Translate a trace into schedlang. Raises DiagnosticError (pointing at the instructions, in
    the trace's Python form) when an instruction has no schedlang equivalent; with `partial`, the
    translated part is returned with the rest commented out instead."""
    if not isinstance(trace, s_tir.Trace):
        trace = trace_from_json(trace, func)
    _require_decisions([(i.kind.name, trace.get_decision(i) is not None) for i in trace.insts])
    if target is None:
        bound = any(inst.kind.name == "Bind" for inst in trace.insts)
        target = "cuda" if bound else "llvm"
    target = as_target(target)
    trace, applied_hints = _apply_parallel_hints(trace, func)
    decompiler = _Decompiler(trace, func, target, partial, file, header)
    if applied_hints:
        decompiler.notes.append(
            Diagnostic(
                Severity.NOTE,
                "the trace's parallel, vectorize and unroll hints were applied as MetaSchedule's "
                "RewriteParallelVectorizeUnroll postprocessor applies them",
                decompiler.span(applied_hints[0]),
            )
        )
    return decompiler.run()


def _apply_parallel_hints(trace: s_tir.Trace, func: tirx.PrimFunc) -> tuple[s_tir.Trace, list]:
    """A design space (a trace not post-processed) still holds MetaSchedule's parallel, vectorize
    and unroll hints: apply them the way MetaSchedule does before it builds a candidate, so they
    become instructions the decompiler translates. Returns the trace and the hints' positions."""
    pending: dict[str, int] = {}
    for index, inst in enumerate(trace.insts):
        key = str(inst.attrs[0]) if inst.attrs else ""
        if inst.kind.name == "Annotate" and key in _PARALLEL_HINTS:
            pending.setdefault(key, index)
        elif inst.kind.name == "Unannotate":
            pending.pop(key, None)
    if not pending:
        return trace, []
    from tvm.s_tir import meta_schedule as ms

    sch = s_tir.Schedule(func)
    try:
        trace.apply_to_schedule(sch, remove_postproc=False)
    except Exception as exc:  # TVM's own refusal: a trace made for another op
        raise SchedlangError(f"the trace does not apply to this op: {tvm_reason(exc)}") from None
    sch.enter_postproc()
    if not ms.postproc.RewriteParallelVectorizeUnroll().apply(sch):
        raise SchedlangError(
            "MetaSchedule's RewriteParallelVectorizeUnroll postprocessor rejects this trace's "
            "parallel, vectorize and unroll hints",
        )
    return sch.trace, sorted(pending.values())


class _Problem(Exception):
    """An instruction schedlang cannot express: the message, then notes."""

    def __init__(self, message: str, *notes: str):
        super().__init__(message)
        self.message = message
        self.notes = notes


class _Decompiler:
    def __init__(
        self,
        trace: s_tir.Trace,
        func: tirx.PrimFunc,
        target: Target,
        partial: bool,
        file: str,
        header: str | None,
    ):
        self.trace = trace
        self.func = func
        self.target = target
        self.partial = partial
        self.file = file
        self.header = header
        self.lines = _python_lines(trace)
        self.source = "\n".join(self.lines)
        self.reference = s_tir.Schedule(func)  # TVM replays the trace here
        self.nest = Nest(s_tir.Schedule(func))  # schedlang's statements are applied here
        self.items: list[nodes.Stmt | nodes.Comment] = []
        self.origins: list[int] = []  # per item, the instruction it came from
        self.blank_before: set[int] = set()
        self.section: str | None = None
        self.index = -1
        self.stopped_at: int | None = None
        self.problems: list[Diagnostic] = []
        self.notes: list[Diagnostic] = []
        self.hints: list[tuple[int, object, str]] = []  # (instruction, block or loop, key)
        self.locations: dict[str, int] = {}  # block → its sampled compute location decision
        self.postproc_at: int | None = None
        self.changed = False  # whether the last instruction can have changed the function
        self.deferred = False  # skip the next comparison: the instruction after completes it
        self.pending: int | None = None  # the instruction a skipped comparison would blame

    # --- driving ---------------------------------------------------------------------------------

    def run(self) -> Decompiled:
        if not self.partial:  # every instruction schedlang lacks, in one report
            for index, inst in enumerate(self.trace.insts):
                reason = _static_problem(inst.kind.name, list(inst.attrs))
                if reason is not None:
                    self.problems.append(self.error(index, *reason))
            if self.problems:
                raise DiagnosticError(self.problems, self.source)
        try:
            self.trace.apply_to_schedule(self.reference, False, self.on_instruction)
        except Exception as exc:  # TVM refused an instruction of the trace itself
            self.problems.append(
                self.error(
                    self.index,
                    f"TVM cannot apply this instruction to the op: {tvm_reason(exc)}",
                    "is the trace made for another op, or other shapes?",
                )
            )
            raise DiagnosticError(self.problems, self.source) from None
        if self.stopped_at is None:
            self.compare()
        if self.stopped_at is None:
            self.leftover_hints()
        if self.problems and not self.partial:
            raise DiagnosticError(self.problems, self.source)
        items, origins, blank = _merged(self.items, self.origins, self.blank_before)
        complete = self.stopped_at is None and not self.problems
        text = self.render(items, blank)
        if complete:
            self.verify(text, items, origins)
        found = sorted(self.problems, key=lambda d: d.span.line if d.span else 0)
        if self.partial:  # asked for: what is left out is reported, not fatal
            found = [replace(d, severity=Severity.WARNING) for d in found]
        return Decompiled(text, (*self.notes, *found), self.source, complete)

    def on_instruction(self, inst, inputs, attrs, decision):
        """TVM's callback before each instruction: the states after the previous one are compared,
        then this one is translated. Nothing may escape into TVM: problems are recorded."""
        if self.stopped_at is not None:
            return decision
        try:
            self.compare()
            self.index += 1
            if self.stopped_at is None:
                kind = inst.kind.name
                reason = _static_problem(kind, list(attrs))
                if reason is not None:
                    raise _Problem(*reason)
                self.changed = kind not in _LOOKUPS and kind not in _SAMPLES
                self.translate(kind, list(inputs), list(attrs), decision)
        except _Problem as problem:
            self.stop(self.error(self.index, problem.message, *problem.notes))
        except Exception as exc:  # a bug here must not become a crash inside TVM's replay
            self.stop(
                self.error(
                    self.index,
                    f"cannot translate this instruction: {exc!r}",
                    "this is a bug in schedlang's decompiler; please report it with the trace",
                )
            )
        return decision

    def stop(self, diagnostic: Diagnostic, at: int | None = None) -> None:
        """Stop translating at instruction `at` (default: this one); what came from it goes."""
        at = self.index if at is None else at
        keep = [i for i, origin in enumerate(self.origins) if origin < at]
        self.items = [self.items[i] for i in keep]
        self.origins = [self.origins[i] for i in keep]
        self.blank_before = {i for i in self.blank_before if i < len(self.items)}
        self.problems.append(diagnostic)
        self.stopped_at = at

    def compare(self) -> None:
        """The reference (hints aside) and schedlang's schedule must be equal after every
        instruction; the first one where they are not is reported."""
        if self.index < 0 or self.stopped_at is not None or not self.changed:
            return
        if self.deferred:  # an instruction whose effect the next one completes
            self.deferred = False
            self.pending = self.index if self.pending is None else self.pending
            return
        if _same(without_hints(self.reference.mod["main"]), self.nest.sch.mod["main"]):
            self.pending = None
            return
        at = self.index if self.pending is None else self.pending
        inst = self.trace.insts[at]
        self.stop(
            self.error(
                at,
                f"schedlang's `{_STATEMENTS.get(inst.kind.name, inst.kind.name)}` does not give "
                f"the same loop nest as this instruction: {_divergence(inst)}",
                "import with --partial to get the schedule up to here, then edit it",
            ),
            at,
        )

    # --- diagnostics -----------------------------------------------------------------------------

    def span(self, index: int) -> Span:
        line = self.lines[index] if 0 <= index < len(self.lines) else ""
        return Span(self.file, index + 1, 1, index + 1, len(line) + 1)

    def error(self, index: int, message: str, *notes: str) -> Diagnostic:
        kind = self.trace.insts[index].kind.name if 0 <= index < len(self.lines) else "?"
        return error(
            message, self.span(index), f"instruction #{index} of the trace ({kind})", *notes
        )

    # --- translation -----------------------------------------------------------------------------

    def translate(self, kind: str, inputs: list, attrs: list, decision) -> None:
        if kind in _LOOKUPS or kind in _SAMPLES:
            return
        if kind == "EnterPostproc":
            self.postproc_at = len(self.items)
            return
        if kind == "SampleComputeLocation":
            self.locations[self.block_name(inputs[0])] = int(decision)
            return
        if kind in ("Annotate", "Unannotate"):
            self.annotation(kind, inputs, attrs)
            return
        handler = getattr(self, f"on_{kind}", None)
        if handler is None:
            raise _Problem(f"schedlang has no statement for `{kind}`")
        handler(inputs, attrs)

    def on_Split(self, inputs, attrs) -> None:
        block, axis = self.axis(inputs[0])
        factors = [self.value(f) for f in inputs[1:]]
        if len(factors) == 2 and factors[0] is None and factors[1] is not None:
            parts: tuple[nodes.Factor, ...] = (nodes.IntFactor(factors[1]),)
        else:
            parts = tuple(
                nodes.InferredFactor() if f is None else nodes.IntFactor(f) for f in factors
            )
        self.emit(block, nodes.Split(nodes.Name(axis), parts))

    def on_Fuse(self, inputs, attrs) -> None:
        if len(inputs) == 1:
            # MetaSchedule "fuses" a single loop to rename it, which also makes it serial; it
            # then parallelizes (or vectorizes) it again, which schedlang's loop already is.
            self.deferred = True
            return
        block, axes = self.axes(inputs)
        self.emit(block, nodes.Fuse(tuple(nodes.Name(a) for a in axes)))

    def on_Reorder(self, inputs, attrs) -> None:
        block, axes = self.axes(inputs)
        self.emit(block, nodes.Reorder(tuple(nodes.Name(a) for a in axes)))

    def on_Parallel(self, inputs, attrs) -> None:
        self.loop_kind(inputs[0], nodes.Parallel, "parallel")

    def on_Vectorize(self, inputs, attrs) -> None:
        self.loop_kind(inputs[0], nodes.Vectorize, "vectorized")

    def on_Unroll(self, inputs, attrs) -> None:
        self.loop_kind(inputs[0], nodes.Unroll, "unrolled")

    def loop_kind(self, loop_rv, statement: type[nodes.Stmt], annotation: str) -> None:
        block, axis = self.axis(loop_rv)
        if self.nest.find(block, axis).annotation != annotation:  # else it is already so
            self.emit(block, statement(nodes.Name(axis)))

    def on_Bind(self, inputs, attrs) -> None:
        block, axis = self.axis(inputs[0])
        if self.nest.find(block, axis).thread != str(attrs[0]):
            self.emit(block, nodes.Bind(nodes.Name(axis), nodes.Name(str(attrs[0]))))

    def on_CacheRead(self, inputs, attrs) -> None:
        block = self.block_name(inputs[0])
        index, scope = int(attrs[0]), str(attrs[1])
        buffer = self.nest.reads(block)[index]
        if self.nest.reads(block).index(buffer) != index:
            raise _Problem(
                f"block {block} reads `{buffer}` in several regions; schedlang caches the first"
            )
        readers = list(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else []
        consumers = tuple(nodes.Name(self.block_name(rv)) for rv in readers)
        self.emit(
            block, nodes.CacheRead(nodes.Name(buffer), nodes.Name(scope), consumers=consumers)
        )

    def on_CacheWrite(self, inputs, attrs) -> None:
        block = self.block_name(inputs[0])
        self.emit(block, nodes.CacheWrite(nodes.Name(block), nodes.Name(str(attrs[1]))))

    def on_ComputeAt(self, inputs, attrs, reverse: bool = False) -> None:
        moved = self.block_name(inputs[0])
        if self.reference.get_sref(inputs[1]).stmt is None:  # a sampled "root" or "inline"
            if self.locations.get(moved) == -2:
                self.emit(self.other_section(moved), nodes.ComputeInline(nodes.Name(moved)))
            return
        block, axis = self.axis(inputs[1], exclude=moved)
        kind = nodes.ReverseComputeAt if reverse else nodes.ComputeAt
        keep = bool(attrs[0])  # preserve_unit_loops
        position = int(attrs[1])  # -1: last, -2: first
        index = None if position == -1 else nodes.IntFactor(0 if position == -2 else position)
        stmt = kind(nodes.Name(moved), nodes.Name(axis), keep, index)
        self.emit(block, stmt)
        # MetaSchedule asks to keep unit loops on every move; say so only where one was kept
        # (where none is made, both give the same nest).
        if keep and not self.unit_loops_below(moved, axis):
            self.items[-1] = replace(stmt, keep_unit_loops=False)

    def on_ReverseComputeAt(self, inputs, attrs) -> None:
        self.on_ComputeAt(inputs, attrs, reverse=True)

    def on_ComputeInline(self, inputs, attrs) -> None:
        inlined = self.block_name(inputs[0])
        self.emit(self.other_section(inlined), nodes.ComputeInline(nodes.Name(inlined)))

    def on_ReverseComputeInline(self, inputs, attrs) -> None:
        inlined = self.block_name(inputs[0])
        self.emit(self.other_section(inlined), nodes.ReverseComputeInline(nodes.Name(inlined)))

    def on_RFactor(self, inputs, attrs) -> None:
        block, axis = self.axis(inputs[0])
        position = int(attrs[0])
        if position < 0:  # TVM counts from the end as numpy does; schedlang from the front
            buffer = self.nest.write_buffer(block)
            position += (len(buffer.shape) if buffer is not None else 0) + 1
        factor_axis = nodes.IntFactor(position) if position else None
        self.emit(block, nodes.Rfactor(nodes.Name(axis), factor_axis=factor_axis))

    def on_DecomposeReduction(self, inputs, attrs) -> None:
        owner = self.block_name(inputs[0])
        owner_loops = [loop.name for loop in self.nest.loops(owner)]
        _, axis = self.axis(inputs[1], prefer=owner)
        if axis not in owner_loops:
            raise _Problem(f"the loop is not a loop of block {owner}")
        self.emit(owner, nodes.DecomposeReduction(None, nodes.Name(axis)))

    def on_StorageAlign(self, inputs, attrs) -> None:
        block = self.block_name(inputs[0])
        dim, factor, offset = (nodes.IntFactor(int(a)) for a in attrs[1:4])
        self.emit(block, nodes.StorageAlign(nodes.Name(block), dim, factor, offset))

    def on_SetScope(self, inputs, attrs) -> None:
        block = self.block_name(inputs[0])
        set_scope = statements.BY_KEYWORD["set_scope"].node  # its class is the registry's
        self.emit(block, set_scope(nodes.Name(block), nodes.Name(str(attrs[1]))))

    def on_TransformLayout(self, inputs, attrs) -> None:
        from schedlang.lang.statements import layout  # the statement's class and its index maps

        block = self.block_name(inputs[0])
        index, written = int(attrs[0]), int(attrs[1]) == 1
        buffer = (self.nest.writes(block) if written else self.nest.reads(block))[index]
        if buffer in {param.name for param in self.nest.sch.mod["main"].params}:
            raise _Problem(
                f"schedlang transforms only buffers a schedule made; `{buffer}` is a parameter "
                "of the function"
            )
        if bool(attrs[3]):
            raise _Problem("schedlang checks that a map is bijective (assume_injective_transform)")
        mapping, pad = inputs[1], attrs[2]
        if pad is not None and not (
            isinstance(pad, tirx.IntImm | tirx.FloatImm) and float(pad.value).is_integer()
        ):
            raise _Problem(f"schedlang pads with an integer constant, not `{pad}`")
        try:
            outputs = tuple(layout.from_tvm(e) for e in mapping.final_indices)
        except ValueError as exc:
            raise _Problem(str(exc)) from None
        indices = tuple(nodes.Name(v.name) for v in mapping.initial_indices)
        pad_value = None if pad is None else nodes.IntFactor(int(pad.value))
        node = layout.TransformLayout(nodes.Name(buffer), indices, outputs, pad_value)
        self.emit(block, node)

    def on_Tensorize(self, inputs, attrs) -> None:
        if not isinstance(inputs[0], LoopRV):
            raise _Problem("schedlang tensorizes the loops from one inward, not a block")
        block, axis = self.axis(inputs[0])
        tensorize = statements.BY_KEYWORD["tensorize"].node  # its class is the registry's
        self.emit(block, tensorize(nodes.Name(axis), nodes.Name(str(attrs[0]))))

    def on_Blockize(self, inputs, attrs) -> None:
        if not isinstance(inputs[0], LoopRV):
            raise _Problem("schedlang blockizes the loops from one inward, not a list of blocks")
        if not bool(attrs[0]):
            raise _Problem("schedlang's blockize keeps unit iterators (preserve_unit_iters=True)")
        block, axis = self.axis(inputs[0])
        self.emit(block, blocks.Blockize(nodes.Name(axis)))

    def on_AddUnitLoop(self, inputs, attrs) -> None:
        if isinstance(inputs[0], LoopRV):
            block, axis = self.axis(inputs[0])
            around: nodes.Name | None = nodes.Name(axis)
        else:
            block, around = self.block_name(inputs[0]), None
        # TVM calls every unit loop `u`; schedlang names each one apart.
        taken = {loop.name for loop in self.nest.loops(block)}
        name = next(n for n in ("u", *(f"u{i}" for i in range(1, 1000))) if n not in taken)
        alias = nodes.Name(name) if name != "u" else None
        self.emit(block, blocks.AddUnitLoop(around, alias))

    def on_ReIndex(self, inputs, attrs) -> None:
        block = self.block_name(inputs[0])
        index, written = int(attrs[0]), int(attrs[1]) == 1
        buffers = self.nest.writes(block) if written else self.nest.reads(block)
        buffer = buffers[index]
        if buffers.index(buffer) != index or (not written and buffer in self.nest.writes(block)):
            raise _Problem(f"block {block} uses `{buffer}` in several regions; schedlang "
                           "reindexes its written region, or else its first read one")  # fmt: skip
        self.emit(block, blocks.Reindex(nodes.Name(buffer)))

    def on_PadEinsum(self, inputs, attrs) -> None:
        block = self.block_name(inputs[0])
        multiples = tuple(nodes.IntFactor(int(m)) for m in attrs[0])
        self.emit(block, blocks.Pad(multiples))

    def on_DecomposePadding(self, inputs, attrs) -> None:
        owner = self.block_name(inputs[0])
        _, axis = self.axis(inputs[1], prefer=owner)
        if axis not in [loop.name for loop in self.nest.loops(owner)]:
            raise _Problem(f"the loop is not a loop of block {owner}")
        self.emit(owner, blocks.DecomposePadding(None, nodes.Name(axis)))

    def on_ReindexCacheRead(self, inputs, attrs, write: bool = False) -> None:
        from schedlang.lang.statements import layout

        block = self.block_name(inputs[0])
        index, scope = int(attrs[0]), str(attrs[1])
        buffers = self.nest.writes(block) if write else self.nest.reads(block)
        buffer = buffers[index]
        if buffers.index(buffer) != index:
            raise _Problem(f"block {block} uses `{buffer}` in several regions; schedlang caches "
                           "the first")  # fmt: skip
        mapping = inputs[1]
        try:
            outputs = tuple(layout.from_tvm(e) for e in mapping.final_indices)
        except ValueError as exc:
            raise _Problem(str(exc)) from None
        indices = tuple(nodes.Name(v.name) for v in mapping.initial_indices)
        kind = blocks.ReindexCacheWrite if write else blocks.ReindexCacheRead
        self.emit(block, kind(nodes.Name(buffer), nodes.Name(scope), indices, outputs))

    def on_ReindexCacheWrite(self, inputs, attrs) -> None:
        self.on_ReindexCacheRead(inputs, attrs, write=True)

    def annotate(self, key: str, inputs: list) -> None:
        """An annotation schedlang's `annotate` takes (software pipelining, double buffering)."""
        raw = inputs[1]
        if isinstance(raw, int | tirx.IntImm):
            value: Any = nodes.IntFactor(int(raw))
        else:
            try:
                value = tuple(nodes.IntFactor(int(v)) for v in raw)
            except TypeError:
                raise _Problem(f"`{key}` takes integers in schedlang, not {raw!r}") from None
        item = annotation.AnnotationItem(nodes.Name(key), value)
        if isinstance(inputs[0], LoopRV):
            block, axis = self.axis(inputs[0])
            self.emit(block, annotation.Annotate(nodes.Name(axis), None, (item,)))
        else:
            block = self.block_name(inputs[0])
            self.emit(block, annotation.Annotate(None, nodes.Name(block), (item,)))

    def annotation(self, kind: str, inputs: list, attrs: list) -> None:
        key = str(attrs[0])
        if key.startswith(_HINT):
            # Kept aside: a postprocessor consumes it later in the trace (Unannotate), or, for
            # bookkeeping only, it is dropped at the end with a note.
            if kind == "Annotate":
                self.hints.append((self.index, inputs[0], key))
            else:
                sref = self.reference.get_sref(inputs[0])
                self.hints = [
                    h
                    for h in self.hints
                    if not (h[2] == key and self.reference.get_sref(h[1]).same_as(sref))
                ]
            return
        if key not in _PRAGMAS:
            self.annotate(key, inputs)
            return
        if not isinstance(inputs[0], LoopRV):
            raise _Problem(f"schedlang annotates only loops, with {', '.join(_PRAGMAS)}")
        block, axis = self.axis(inputs[0])
        value = self.value(inputs[1])
        if value is None:
            raise _Problem(f"`{key}` takes an integer in schedlang, not {inputs[1]!r}")
        # MetaSchedule annotates a loop once per block under it: say it once.
        current = self.nest.sch.get(self.nest.find(block, axis).rv).annotations.get(key)
        if isinstance(current, int | tirx.IntImm) and int(current) == value:
            return
        item = nodes.PragmaItem(nodes.Name(_PRAGMAS[key]), nodes.IntFactor(value))
        self.emit(block, nodes.Pragma(nodes.Name(axis), (item,)))

    def leftover_hints(self) -> None:
        dropped: dict[str, list[int]] = {}
        for index, target, key in self.hints:
            if key in BOOKKEEPING_HINTS and isinstance(target, SBlockRV):
                dropped.setdefault(key, []).append(index)
                continue
            self.problems.append(
                self.error(
                    index,
                    f"schedlang has no statement for MetaSchedule's hint `{key}`",
                    "it is left for a MetaSchedule postprocessor, and this trace does not apply "
                    "it: import a post-processed trace (a tuning record)",
                )
            )
        for key, indices in dropped.items():
            self.notes.append(
                Diagnostic(
                    Severity.NOTE,
                    f"dropped MetaSchedule's bookkeeping annotation `{key}` "
                    f"({len(indices)}x): TVM drops it when it builds",
                    self.span(indices[0]),
                )
            )

    # --- names -----------------------------------------------------------------------------------

    def value(self, value) -> int | None:
        """An integer input: a constant, or a sampled value (its decision)."""
        if value is None or isinstance(value, str):
            return None
        if isinstance(value, tirx.Var):
            value = self.reference.get(value)
        return int(value) if isinstance(value, int | tirx.IntImm) else None

    def unit_loops_below(self, block: str, axis: str) -> bool:
        """Whether block `block` has a loop of extent 1 inside its loop `axis` (in the nest)."""
        loops = self.nest.loops(block)
        names = [loop.name for loop in loops]
        inside = loops[names.index(axis) + 1 :] if axis in names else []
        return any(loop.extent == 1 for loop in inside)

    def block_name(self, block_rv) -> str:
        """schedlang's name for a block of the reference (the same block exists in the nest)."""
        tvm_name = self.reference.get(block_rv).name_hint
        aliases = {tvm: alias for alias, tvm in self.nest.block_aliases.items()}
        return aliases.get(tvm_name, tvm_name)

    def axis(self, loop_rv, exclude: str | None = None, prefer: str | None = None):
        """(a block under the loop, the loop's schedlang name in it). The two states are equal, so
        the loop is at the same position among the loops of the same block in the nest."""
        sref = self.reference.get_sref(loop_rv)
        under = [(self.block_name(rv), rv) for rv in self.reference.get_child_blocks(loop_rv)]
        under = [(name, rv) for name, rv in under if name != exclude]
        if not under:
            raise _Problem("the loop holds no block that schedlang could name it by")
        names = [name for name, _ in under]
        # The current section reads best; otherwise the last block, the one the others feed.
        block = next((b for b in (prefer, self.section) if b in names), names[-1])
        block_rv = under[names.index(block)][1]
        loops = self.reference.get_loops(block_rv)
        position = next(
            i for i, rv in enumerate(loops) if self.reference.get_sref(rv).same_as(sref)
        )
        return block, self.nest.loops(block)[position].name

    def axes(self, loop_rvs: list) -> tuple[str, list[str]]:
        """A block under all the loops (under the innermost one), and their names in it."""
        block, _ = self.axis(loop_rvs[-1])
        return block, [self.axis(rv, prefer=block)[1] for rv in loop_rvs]

    def other_section(self, leaving: str) -> str:
        """A section for a statement that makes block `leaving` disappear."""
        blocks = [b for b in self.nest.block_names() if b != leaving]
        if self.section in blocks:
            return self.section
        return blocks[0] if blocks else leaving

    # --- output ----------------------------------------------------------------------------------

    def emit(self, block: str, stmt: nodes.Stmt) -> None:
        try:
            apply_statement(self.nest, block, stmt)
        except (s_tir.ScheduleError, RuntimeError, ValueError) as exc:
            raise _Problem(f"schedlang's `{stmt.keyword}` fails here: {tvm_reason(exc)}") from None
        if self.postproc_at is not None:
            if self.items:
                self.blank_before.add(len(self.items))
            self.add(nodes.Comment("MetaSchedule's postprocessing"))
            self.postproc_at = None
            self.section = None  # a header after the comment, for the reader
        if block != self.section:
            if self.items and not isinstance(self.items[-1], nodes.Comment):
                self.blank_before.add(len(self.items))
            self.add(nodes.BlockHeader(nodes.Name(block)))
            self.section = block
        self.add(stmt)

    def add(self, item: nodes.Stmt | nodes.Comment) -> None:
        self.items.append(item)
        self.origins.append(self.index)

    def render(self, items: list[nodes.Stmt | nodes.Comment], blank: set[int]) -> str:
        items = list(items)
        if self.header is not None:
            items.insert(0, nodes.Comment(self.header))
            blank = {i + 1 for i in blank} | ({1} if len(items) > 1 else set())
        if self.stopped_at is not None:
            if items:
                blank.add(len(items))
            items.append(nodes.Comment(f"not translated, from instruction #{self.stopped_at} on:"))
            items += [nodes.Comment(line) for line in self.lines[self.stopped_at :]]
        return format_schedule(nodes.Schedule(tuple(items), IMPORTED, "", frozenset(blank)))

    def verify(self, text: str, items: list, origins: list[int]) -> None:
        """The text must parse, check clean, and lower to the trace's function."""
        from schedlang.checker.check import check

        schedule = _parse(text, IMPORTED)
        result = check(schedule, self.func, self.target)
        lines = [s.span.line for s in schedule.statements if not isinstance(s, nodes.BlockHeader)]
        emitted = [
            origin
            for item, origin in zip(items, origins, strict=True)
            if isinstance(item, nodes.Stmt) and not isinstance(item, nodes.BlockHeader)
        ]
        by_line = dict(zip(lines, emitted, strict=True))

        def traced(d: Diagnostic) -> Diagnostic:
            origin = by_line.get(d.span.line) if d.span else None
            if origin is None:
                return d
            return replace(d, notes=(*d.notes, f"from instruction #{origin}: {self.lines[origin]}"))

        if not result.ok or result.lowered is None:
            raise DiagnosticError([traced(d) for d in result.diagnostics], text)
        self.notes += [traced(d) for d in result.diagnostics]
        if not _same(result.lowered.func, without_hints(self.reference.mod["main"])):
            raise SchedlangError(
                "the imported schedule does not lower to the trace's function",
                "this is a bug in schedlang's decompiler; please report it with the trace",
            )


def _merged(
    items: list[nodes.Stmt | nodes.Comment], origins: list[int], blank_before: set[int]
) -> tuple[list[nodes.Stmt | nodes.Comment], list[int], set[int]]:
    """The statements as a person writes them: `cache_read A s` then `compute_at A_s x` is
    `cache_read A s at x` (likewise for cache_write), and pragmas on one loop are one line."""
    merged: list[nodes.Stmt | nodes.Comment] = []
    merged_origins: list[int] = []
    blank: set[int] = set()
    for index, (item, origin) in enumerate(zip(items, origins, strict=True)):
        previous = merged[-1] if merged and index not in blank_before else None
        match previous, item:
            case nodes.CacheRead(at=None) as cache, nodes.ComputeAt(block=moved) as move if (
                moved.text == nodes.cache_block_name(cache.buffer, cache.scope)
            ):
                merged[-1] = replace(cache, at=move.axis, keep_unit_loops=move.keep_unit_loops)
                continue
            case nodes.CacheWrite(at=None) as cache, nodes.ReverseComputeAt(
                block=moved
            ) as move if moved.text == nodes.cache_block_name(cache.block, cache.scope):
                merged[-1] = replace(cache, at=move.axis, keep_unit_loops=move.keep_unit_loops)
                continue
            case annotation.Annotate() as first, annotation.Annotate() as second if _joinable(
                first, second
            ):
                # A pipeline's stages and order are one statement: neither builds alone.
                merged[-1] = replace(first, items=first.items + second.items)
                continue
            case nodes.Pragma() as first, nodes.Pragma() as second if (
                first.axis == second.axis
                and not {i.key.text for i in first.items} & {i.key.text for i in second.items}
            ):
                merged[-1] = replace(first, items=first.items + second.items)
                continue
        if index in blank_before and merged:
            blank.add(len(merged))
        merged.append(item)
        merged_origins.append(origin)
    return merged, merged_origins, blank


def _joinable(first: annotation.Annotate, second: annotation.Annotate) -> bool:
    """Two annotations of one loop or block with no key in common."""
    keys = {item.key.text for item in first.items}
    same = (first.axis, first.block) == (second.axis, second.block)
    return same and not keys & {item.key.text for item in second.items}


def _static_problem(kind: str, attrs: list) -> tuple[str, ...] | None:
    """(message, notes…) when the instruction itself has no schedlang equivalent."""
    if kind not in SUPPORTED_INSTRUCTIONS:
        return (
            f"schedlang has no statement for `{kind}`",
            "schedlang's statements: " + ", ".join(statements.BY_KEYWORD),
        )
    if kind == "Split" and len(attrs) > 1 and bool(attrs[1]):
        return ("schedlang's split guards a non-divisible tail; this one disables that "
                "(disable_predication=True)",)  # fmt: skip
    if kind == "Bind" and str(attrs[0]) not in nodes.THREAD_AXES:
        return (f"schedlang binds loops to {', '.join(nodes.THREAD_AXES)}, not `{attrs[0]}`",)
    if kind in ("CacheRead", "CacheWrite") and str(attrs[1]) not in nodes.SCOPES:
        return (f"schedlang caches in {', '.join(nodes.SCOPES)}, not `{attrs[1]}`",)
    if kind in ("ReindexCacheRead", "ReindexCacheWrite") and str(attrs[1]) not in nodes.SCOPES:
        return (f"schedlang caches in {', '.join(nodes.SCOPES)}, not `{attrs[1]}`",)
    if kind == "CacheWrite" and int(attrs[0]) != 0:
        return ("schedlang's cache_write caches a block's first written buffer; this caches "
                f"buffer #{int(attrs[0])}",)  # fmt: skip
    if kind == "SetScope" and str(attrs[1]) not in nodes.SCOPES:
        return (f"schedlang's set_scope takes {', '.join(nodes.SCOPES)}, not `{attrs[1]}`",)
    if kind == "SetScope" and int(attrs[0]) != 0:
        return ("schedlang's set_scope sets a block's first written buffer; this sets buffer "
                f"#{int(attrs[0])}",)  # fmt: skip
    if kind == "StorageAlign" and int(attrs[0]) != 0:
        return ("schedlang aligns a block's first written buffer; this aligns buffer "
                f"#{int(attrs[0])}",)  # fmt: skip
    if kind in ("Annotate", "Unannotate"):
        key = str(attrs[0])
        known = key in _PRAGMAS or key in annotation.KEYS
        if not key.startswith(_HINT) and (kind == "Unannotate" or not known):
            return (
                f"schedlang has no statement for the annotation `{key}`",
                "schedlang annotates with " + ", ".join(annotation.KEYS),
            )
    return None


def _python_lines(trace: s_tir.Trace) -> list[str]:
    """One line of Python per instruction, as diagnostics quote them. TVM 0.27 cannot print a
    trace with DecomposePadding (its printer rejects its own loop argument): each instruction is
    then named by its kind and attributes."""
    try:
        return [" ".join(line.split("\n")) for line in trace.as_python(False)]
    except (TypeError, RuntimeError):
        return [f"{inst.kind.name}(attrs={list(inst.attrs)})" for inst in trace.insts]


def _divergence(inst) -> str:
    """Why schedlang's statement differs from this instruction, as far as its attributes say."""
    kind, attrs = inst.kind.name, list(inst.attrs)
    if kind == "Fuse" and len(inst.inputs) == 1:
        return ("it fuses one loop alone, which makes a parallel, vectorized, unrolled or bound "
                "loop serial again; schedlang cannot")  # fmt: skip
    if kind in ("Split", "Fuse") and attrs and not bool(attrs[0]):
        return ("it drops loops of extent 1 (preserve_unit_iters=False); schedlang's "
                f"`{_STATEMENTS[kind]}` keeps them")  # fmt: skip
    if kind == "CacheWrite" and len(inst.inputs) > 1 and list(inst.inputs[1]):
        return ("it redirects only some readers (consumer_blocks); schedlang's "
                f"`{_STATEMENTS[kind]}` redirects all of them")  # fmt: skip
    return "the two functions differ"


# --- helpers --------------------------------------------------------------------------------------

_TRACE_FORM = (
    "a trace's JSON is [instructions, decisions], as `Trace.as_json()` or "
    "`schedlang export --trace-json` writes it"
)


def _parse(text: str, file: str) -> nodes.Schedule:
    from schedlang.lang.syntax import parse

    return parse(text, file)


def _schedlang_target(target: tvm.target.Target) -> Target:
    config = {k: v for k, v in _config(target).items() if k not in ("keys", "tag")}
    return resolve_target(json.dumps(config))


def _config(target: tvm.target.Target) -> dict:
    """A TVM target as plain JSON, for comparing targets."""
    return _plain(dict(target.export()))


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, tirx.IntImm):
        return int(value)
    if isinstance(value, tirx.FloatImm):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Iterable):
        return [_plain(v) for v in value]
    return str(value)


def _single_func(mod: tirx.PrimFunc | tvm.IRModule) -> tirx.PrimFunc:
    if isinstance(mod, tirx.PrimFunc):
        return mod
    funcs = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    if len(funcs) != 1:
        raise SchedlangError(f"expected a workload with one PrimFunc, got {len(funcs)}")
    return funcs[0]


def _same(a: tirx.PrimFunc, b: tirx.PrimFunc) -> bool:
    """Structurally equal, whatever the attributes naming or marking the function."""
    for attr in ("global_symbol", SCHEDULED_ATTR, "tirx.noalias"):
        a, b = a.without_attr(attr), b.without_attr(attr)
    return bool(tvm_ffi.structural_equal(a, b))


def _valid_secs(record) -> tuple[float, ...]:
    secs = tuple(float(s) for s in record.run_secs or ())
    return secs if secs and all(0 < s < _FAILED_RUN_S for s in secs) else ()


def without_hints(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` without MetaSchedule's `meta_schedule.*` annotations on its blocks and loops.
    Rebuilt from the IR rather than by unannotating a copy of the schedule: done from inside the
    decompiler's replay callback, that breaks TVM's replay (TVM 0.27 fails with
    `unordered_map::at`)."""
    body = _strip_hints(func.body)
    return func if body.same_as(func.body) else func.with_body(body)


def _strip_hints(stmt):
    """`stmt` with the hint annotations of its blocks and loops removed (the same object when it
    has none)."""
    if isinstance(stmt, s_tir.SBlockRealize):
        block = _strip_hints(stmt.block)
        if block.same_as(stmt.block):
            return stmt
        return s_tir.SBlockRealize(list(stmt.iter_values), stmt.predicate, block)
    if isinstance(stmt, s_tir.SBlock | tirx.For):
        body = _strip_hints(stmt.body)
        kept = {k: v for k, v in stmt.annotations.items() if not str(k).startswith(_HINT)}
        if body.same_as(stmt.body) and len(kept) == len(stmt.annotations):
            return stmt
        if isinstance(stmt, tirx.For):
            return tirx.For(
                stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, kept,
                stmt.step,
            )  # fmt: skip
        return s_tir.SBlock(
            stmt.iter_vars, stmt.reads, stmt.writes, stmt.name_hint, body, stmt.init,
            stmt.alloc_buffers, stmt.match_buffers, kept,
        )  # fmt: skip
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_strip_hints(s) for s in stmt.seq]
        if all(new.same_as(old) for new, old in zip(seq, stmt.seq, strict=True)):
            return stmt
        return tirx.SeqStmt(seq)
    if isinstance(stmt, tirx.IfThenElse):
        then_case = _strip_hints(stmt.then_case)
        else_case = _strip_hints(stmt.else_case) if stmt.else_case is not None else None
        if then_case.same_as(stmt.then_case) and (
            else_case is None or else_case.same_as(stmt.else_case)
        ):
            return stmt
        return tirx.IfThenElse(stmt.condition, then_case, else_case)
    return stmt


def _seconds(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"
