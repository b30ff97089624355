"""The commands on TVM's own formats, traces and MetaSchedule databases: export, import."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

from schedlang.cli import inputs
from schedlang.cli.app import command, print_diagnostics, warn
from schedlang.cli.options import (
    ArchOpt,
    DbOpt,
    DefineOpt,
    MsDbOpt,
    OpArg,
    ScheduleArgs,
    expands_options,
    option,
)
from schedlang.core.diagnostics import SchedlangError
from schedlang.core.units import format_seconds

if TYPE_CHECKING:
    from schedlang.lang.nodes import Schedule


@dataclass(frozen=True)
class ExportTo:
    """Where `export` writes, and what it takes from the tuning database."""

    ms_db: MsDbOpt = None
    trace_json: str | None = option(
        None, "--trace-json", help="Write the schedule's TVM trace here."
    )
    latency: list[float] | None = option(
        None, "--latency", help="A run time in seconds (repeatable); else measured here."
    )
    from_db: bool = option(
        False, "--from-db", help="Export the best records of the tuning database."
    )
    count: int = option(1, "-n", min=1, help="With --from-db: how many.")
    db_path: DbOpt = None


@dataclass(frozen=True)
class ImportFrom:
    """Where `import` reads, for which target, and where the schedule goes."""

    ms_db: MsDbOpt = None
    trace: str | None = option(None, "--trace", help="A TVM trace as JSON (Trace.as_json).")
    target: str | None = option(
        None, "--target", "-t", help="Only records for this target; checks the result."
    )
    arch: ArchOpt = None
    define: DefineOpt = None
    output: str | None = option(None, "-o", help="Write the schedule here.")
    partial: bool = option(False, "--partial", help="Keep what translates; comment out the rest.")


@command("export")
@expands_options
def export_command(args: ScheduleArgs, to: ExportTo) -> None:
    """Write a schedule as a TVM trace and/or a record in a MetaSchedule database, which stock
    TVM builds with `ms.tir_integration.compile_tir`."""
    from schedlang import interop
    from schedlang.run.latencies import measured_latencies

    ms_db, trace_json, latency, from_db, count = (
        to.ms_db,
        to.trace_json,
        to.latency,
        to.from_db,
        to.count,
    )
    if ms_db is None and trace_json is None:
        raise SchedlangError("nothing to write", "give --ms-db DIR, --trace-json FILE, or both")
    op = inputs.load_op_arg(args.op_file, args.define)
    tgt = inputs.target_arg(args.target, args.arch)
    schedule = inputs.given_schedule(args)
    if from_db:
        if schedule is not None:
            raise SchedlangError("give either a schedule or --from-db, not both")
        from schedlang.workflows.queries import best_schedules, parsed_schedule

        with inputs.open_db(to.db_path, read_only=True) as db:
            records = best_schedules(db, op, tgt, n=count)
        exports: list[tuple[Schedule, dict[str, int], Sequence[float]]] = [
            (parsed_schedule(r), {}, r.latencies_s) for r in records
        ]
    else:
        if schedule is None:
            raise SchedlangError("no schedule: give a .sched file, -s TEXT or --from-db")
        knobs = inputs.knob_values(args.knob)
        times: Sequence[float] = latency or (
            measured_latencies(op, schedule, tgt, knobs, warn=warn) if ms_db else ()
        )
        exports = [(schedule, knobs, times)]
    if trace_json is not None:
        best, knobs, _ = exports[0]
        trace = interop.trace_to_json(interop.to_trace(op.func, best, tgt, knobs))
        inputs.write_text(trace_json, json.dumps(trace) + "\n")
        typer.echo(f"wrote the trace ({len(trace[0])} instructions) to {trace_json}")
    if not ms_db:
        return
    for exported_schedule, knobs, times in exports:
        record = interop.export_metaschedule(
            ms_db, op.func, exported_schedule, tgt, times, knobs=knobs
        )
        runs = len(record.run_secs)
        mean = format_seconds(sum(record.run_secs) / runs)
        done = "added a record" if record.added else "already holds this schedule"
        typer.echo(f"{ms_db}: {done} for {op.name} (mean {mean} over {runs} run{'s' * (runs > 1)})")


@command("import")
@expands_options
def import_command(op_file: OpArg, source: ImportFrom) -> None:
    """Turn a MetaSchedule record (the best one of the op) or a TVM trace into schedlang."""
    from schedlang import interop

    ms_db, trace, target, output, partial = (
        source.ms_db,
        source.trace,
        source.target,
        source.output,
        source.partial,
    )
    arch, define = source.arch, source.define
    if (ms_db is None) == (trace is None):
        raise SchedlangError("give one source: --ms-db DIR or --trace FILE")
    op = inputs.load_op_arg(op_file, define)
    tgt = inputs.target_arg(target, arch) if target is not None else None
    if ms_db is not None:
        result = interop.import_metaschedule(ms_db, op.func, tgt, partial=partial)
    elif trace is not None:  # always: one source given (checked above)
        result = interop.decompile(
            inputs.read_text(trace), op.func, tgt, partial=partial, file=inputs.display_name(trace)
        )
    print_diagnostics(result.render())
    if output is None:
        typer.echo(result.text, nl=False)
        return
    inputs.write_text(output, result.text)
    typer.echo(f"wrote {output}")
