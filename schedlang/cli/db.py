"""The commands that read the tuning database: best, history, report."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from schedlang.cli.app import OUTPUT, command, emit_json, print_schedule, set_output, warn
from schedlang.cli.inputs import load_op_arg, open_db, target_arg
from schedlang.cli.options import DbOpt, DefineOpt, JsonOpt, OpArg, TargetArgs, expands_options
from schedlang.core.diagnostics import render_all, warning
from schedlang.core.units import format_seconds


@command("best")
@expands_options
def best_command(
    op_file: OpArg,
    where: TargetArgs,
    db_path: DbOpt = None,
    count: Annotated[int, typer.Option("-n", min=1, help="How many to show.")] = 1,
    as_json: JsonOpt = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="The schedules alone, without their # header.")
    ] = False,
) -> None:
    """The fastest verified schedules for an op on a target, from the database."""
    from schedlang.workflows.queries import best_schedules

    set_output(json_output=as_json, quiet=quiet)
    op = load_op_arg(op_file, where.define)
    tgt = target_arg(where.target, where.arch)
    with open_db(db_path, read_only=True) as db:
        best = best_schedules(db, op, tgt, n=count)
    if OUTPUT.json:
        emit_json(
            {
                "ok": True,
                "op": op.name,
                "target": tgt.kind,
                "records": [record.to_json() for record in best],
                "diagnostics": [],
            }
        )
        return
    for index, record in enumerate(best):
        if not OUTPUT.quiet:  # --quiet: the schedules alone, e.g. to write a .sched file
            typer.echo(
                f"# {op.name} on {tgt.kind}: {record.gflops:.2f} GFLOP/s, median "
                f"{format_seconds(record.median_s)} over {len(record.latencies_s)} repeats; "
                f"proposed by {record.proposer}"
            )
        print_schedule(record.schedule.rstrip())
        if index + 1 < len(best) or not OUTPUT.quiet:
            typer.echo("")


class HistoryFormat(StrEnum):
    TABLE = "table"
    CSV = "csv"
    JSON = "json"


@command("history")
def history_command(
    op_file: Annotated[str | None, typer.Argument(help="Only this op's records.")] = None,
    target: Annotated[str | None, typer.Option("--target", "-t", help="Only this target.")] = None,
    define: DefineOpt = None,
    db_path: DbOpt = None,
    output_format: Annotated[HistoryFormat, typer.Option("--format")] = HistoryFormat.TABLE,
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many.")] = None,
) -> None:
    """List or export the database's records (table, CSV or JSON); from a damaged database,
    every record that can still be read."""
    from schedlang.workflows.queries import export_records, history

    op = load_op_arg(op_file, define) if op_file else None
    tgt = target_arg(target, None) if target else None
    found = history(db_path, op, tgt, limit=limit, events=lambda note: warn(note.text))
    if found.damaged is not None:  # a damaged database: the records that can still be read
        warn(render_all([warning(found.damaged.message, None, found.note)]))
    records = found.records
    if output_format is not HistoryFormat.TABLE:
        export_records(records, output_format.value, sys.stdout)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(records)} records")
    for column in ("id", "op", "target", "status", "GFLOP/s", "median", "proposer", "reason"):
        table.add_column(column)
    for record in records:
        table.add_row(
            str(record.id),
            record.op_name,
            record.target.get("kind", "?"),
            str(record.status),
            f"{record.gflops:.2f}" if record.gflops else "-",
            format_seconds(record.median_s),
            record.proposer,
            record.reason[:60],
        )
    Console(soft_wrap=True).print(table)


@command("report")
def report_command(
    db_file: Annotated[
        Path | None,
        typer.Argument(help="The tuning database (default: --db's, $SCHEDLANG_DB or the cache's)."),
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path(
        "report.html"
    ),
    open_it: Annotated[
        bool, typer.Option("--open", help="Open the page in the default browser.")
    ] = False,
) -> None:
    """Write one HTML page on a database: tuning curves and baselines, the best schedules with
    their lowered TIR, failures by reason, and each model's time before and after tuning."""
    from schedlang.report.page import write_report
    from schedlang.workflows.queries import database_path

    contents = write_report(database_path(db_file), output)
    if contents.problems:
        warn(render_all([warning(problem) for problem in contents.problems]))
    what = f"{len(contents.ops)} ops and targets, {len(contents.models)} models"
    typer.echo(f"wrote {output} ({contents.records} records, {what})")
    if open_it:
        import webbrowser

        if not webbrowser.open(output.resolve().as_uri()):
            warn(f"warning: no browser to open; open {output} in one")
