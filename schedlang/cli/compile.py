"""The commands on one schedule: fmt, parse, show (an op), check, compile, run."""

from __future__ import annotations

import difflib
import json
import re
import statistics
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from schedlang.cli.app import (
    OUTPUT,
    command,
    diagnostics_json,
    emit_json,
    info,
    print_diagnostics,
    print_schedule,
    set_output,
    warn,
)
from schedlang.cli.inputs import (
    STDIN,
    checked,
    display_name,
    given_schedule,
    knob_values,
    load_op_arg,
    open_db,
    read_text,
    runnable_target_arg,
    target_arg,
)
from schedlang.cli.options import (
    DbOpt,
    DefineOpt,
    JsonOpt,
    OpArg,
    RpcKeyOpt,
    RpcTrackerOpt,
    ScheduleArgs,
    StrictOpt,
    Verbosity,
    expands_options,
)
from schedlang.cli.spinner import build_spinner
from schedlang.core.diagnostics import DiagnosticError, SchedlangError, render_all
from schedlang.core.units import format_seconds

if TYPE_CHECKING:
    from collections.abc import Callable

    from schedlang.core.target import Target
    from schedlang.lang.nodes import Schedule

_NUMBER_LIST = re.compile(r"\[\n\s*((?:-?\d+,\n\s*)*-?\d+)\n\s*\]")


@command("fmt")
def fmt(
    files: Annotated[list[str], typer.Argument(help="Schedules to format in place; - for stdin.")],
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if a file would change.")
    ] = False,
    diff: Annotated[
        bool, typer.Option("--diff", help="Write nothing; print what would change as a diff.")
    ] = False,
) -> None:
    """Rewrite schedules in the canonical format (`-` formats stdin to stdout)."""
    from schedlang.lang.printer import format_schedule
    from schedlang.lang.syntax import parse

    failed = would_change = False
    for path in files:
        name = display_name(path)
        try:
            text = read_text(path)
            schedule = parse(text, name)
            formatted = format_schedule(schedule)
        except SchedlangError as err:
            print_diagnostics(err.render())
            failed = True
            continue
        _check_same_meaning(formatted, schedule)
        if diff and formatted != text:
            print_schedule(_unified_diff(text, formatted, name).rstrip("\n"), language="diff")
        if check or diff:
            if formatted != text:
                would_change = True
                if check:
                    typer.echo(f"would reformat {name}", err=True)
        elif path == STDIN:
            typer.echo(formatted, nl=False)
        elif formatted != text:
            Path(path).write_bytes(formatted.encode("utf-8"))
            info(f"reformatted {name}")
    if failed or (check and would_change):
        raise typer.Exit(1)


def _check_same_meaning(formatted: str, schedule: Schedule) -> None:
    """Guard against a formatter bug destroying a file: the output must parse back to the same
    schedule (an internal error, exit 2, otherwise)."""
    from schedlang.lang.syntax import parse

    try:
        reparsed = parse(formatted, schedule.file)
    except SchedlangError:
        reparsed = None
    if reparsed != schedule:
        raise RuntimeError(f"formatting {schedule.file} would change its meaning")


def _unified_diff(before: str, after: str, name: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"{name} (original)",
        tofile=f"{name} (formatted)",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


class Emit(StrEnum):
    """The stage `parse` stops after; later stages add theirs."""

    AST = "ast"


@command("parse")
def parse_command(
    file: Annotated[str, typer.Argument(help="The schedule to parse; - for stdin.")],
    emit: Annotated[Emit, typer.Option("--emit", help="What to print.")] = Emit.AST,
) -> None:
    """Parse a schedule and print it as JSON."""
    from schedlang.lang.nodes import to_json
    from schedlang.lang.syntax import parse_with_diagnostics

    name = display_name(file)
    text = read_text(file)
    schedule, diagnostics = parse_with_diagnostics(text, name)
    if schedule is None or any(d.is_error for d in diagnostics):
        raise DiagnosticError(diagnostics, text)
    warn(render_all(diagnostics, text))  # warnings
    if emit is Emit.AST:
        typer.echo(_compact_number_lists(json.dumps(to_json(schedule), indent=2)))


def _compact_number_lists(text: str) -> str:
    """Lists of numbers (spans, knob values) on one line: `"span": [1, 7, 1, 9]`. Only lists that
    json.dumps laid out over lines match: a string in JSON never holds a raw newline."""
    return _NUMBER_LIST.sub(lambda match: "[" + " ".join(match.group(1).split()) + "]", text)


@command("show")
def show(
    op_file: OpArg,
    define: DefineOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    script: Annotated[bool, typer.Option("--script", help="Also print the TVMScript.")] = False,
) -> None:
    """Blocks, loop axes (extent, spatial/reduce), buffers and flops of an op."""
    from dataclasses import asdict

    from schedlang.core.opinfo import describe, render_show

    op = load_op_arg(op_file, define)
    info = describe(op)
    if as_json:
        typer.echo(json.dumps(asdict(info), indent=2, default=str))
    else:
        typer.echo(render_show(info))
    if script:
        typer.echo(op.func.script())


@command("check")
@expands_options
def check_command(
    args: ScheduleArgs,
    strict: StrictOpt = False,
    as_json: JsonOpt = False,
    *,
    talk: Verbosity,
) -> None:
    """Check a schedule against an op and a target; print every diagnostic."""
    from schedlang.checker.check import check

    set_output(json_output=as_json, quiet=talk.quiet, verbose=talk.verbose)
    op = load_op_arg(args.op_file, args.define)
    schedule = given_schedule(args)
    if schedule is None:
        raise SchedlangError("no schedule: give a .sched file or -s TEXT")
    tgt = target_arg(args.target, args.arch)
    knobs = knob_values(args.knob)
    result = check(schedule, op.func, tgt, knobs=knobs, strict=strict, template_ok=True)
    if result.lowered is None:
        raise DiagnosticError(result.diagnostics, schedule.source)
    kind = "template" if schedule.is_template else "schedule"
    size = schedule.knob_space_size() if schedule.is_template else None
    if OUTPUT.json:
        emit_json(
            {
                "ok": True,
                "file": schedule.file,
                "op": op.name,
                "target": tgt.kind,
                "kind": kind,
                "knob_settings": size,
                "diagnostics": diagnostics_json(result.diagnostics, schedule.source),
            }
        )
        return
    warn(render_all(result.diagnostics, schedule.source))
    if not OUTPUT.quiet:
        extra = f", {size} knob settings" if size is not None else ""
        typer.echo(f"{schedule.file}: {kind} ok for {op.name} on {tgt.kind}{extra}")


class CompileEmit(StrEnum):
    LIBRARY = "library"
    TIR = "tir"
    TRACE = "trace"
    SOURCE = "source"


@command("compile")
@expands_options
def compile_command(
    args: ScheduleArgs,
    strict: StrictOpt = False,
    output: Annotated[str | None, typer.Option("-o", help="Library to write (.so).")] = None,
    emit: Annotated[CompileEmit, typer.Option("--emit", help="What to produce.")] = (
        CompileEmit.LIBRARY
    ),
    from_db: Annotated[
        bool, typer.Option("--from-db", help="Use the best schedule in the tuning database.")
    ] = False,
    db_path: DbOpt = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify",
            help="Run the kernel once in a worker against the reference before writing it.",
        ),
    ] = True,
    *,
    talk: Verbosity,
) -> None:
    """Schedule and build an op; write a library, or print its TIR, trace or source.

    A library for this machine is verified first: the kernel runs once in a worker process on
    poisoned buffers and is compared with the reference; a wrong kernel is not written."""
    from schedlang.run.build import compile_func, source
    from schedlang.run.cross import export_for

    op, tgt, schedule = _given(args, talk, target_arg)
    if from_db:
        if schedule is not None:
            raise SchedlangError("give either a schedule or --from-db, not both")
        schedule = _best_schedule(op, tgt, db_path)
    lowered = checked(op, schedule, tgt, knob_values(args.knob), strict) if schedule else None
    func = lowered.func if lowered else op.func
    if emit is CompileEmit.TIR:
        typer.echo(func.script())
        return
    if emit is CompileEmit.TRACE:
        if lowered is None:
            raise SchedlangError("--emit trace needs a schedule")
        typer.echo(lowered.trace_python())
        return
    with build_spinner():
        executable = compile_func(func, tgt)
    if emit is CompileEmit.SOURCE:
        typer.echo(source(executable, tgt))
        return
    if verify and lowered is not None:
        _verify_before_writing(op, executable, tgt)
    path = export_for(executable, output or f"{Path(args.op_file.split(':')[0]).stem}.so", tgt)
    typer.echo(f"wrote {path}")


def _given(args: ScheduleArgs, talk: Verbosity, target_of: Callable[..., Target]):
    """What compile and run are given, in this order: the op, its target (`target_of`:
    `target_arg`, or `runnable_target_arg` to run kernels here) and the schedule, if any; the
    output first set as the verbosity options say."""
    set_output(quiet=talk.quiet, verbose=talk.verbose)
    op = load_op_arg(args.op_file, args.define)
    return op, target_of(args.target, args.arch), given_schedule(args)


def _verify_before_writing(op, executable, tgt) -> None:
    from schedlang.run.verify import runs_here, verify_build

    if not runs_here(tgt):
        warn(f"warning: not verified: this machine cannot run kernels for {tgt.describe()}")
        return
    reason = verify_build(op, executable, tgt)
    info(f"verified: {reason}")


def _best_schedule(op, tgt, db_path: str | None):
    from schedlang.workflows.queries import best_schedule

    with open_db(db_path, read_only=True) as db:
        best, schedule = best_schedule(db, op, tgt)
    info(f"using the best schedule from the database: {best.gflops:.2f} GFLOP/s")
    return schedule


@command("run")
@expands_options
def run_command(
    args: ScheduleArgs,
    strict: StrictOpt = False,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Timed repeats.")] = 5,
    baseline: Annotated[
        bool, typer.Option("--baseline/--no-baseline", help="Also time the unscheduled build.")
    ] = True,
    rpc_tracker: RpcTrackerOpt = None,
    rpc_key: RpcKeyOpt = None,
    rpc_cc: Annotated[
        str | None,
        typer.Option("--rpc-cc", help="--rpc-tracker: cross compiler, e.g. aarch64-linux-gnu-g++."),
    ] = None,
    *,
    talk: Verbosity,
) -> None:
    """Build, verify against the reference, and time; compare with the unscheduled build.

    With --rpc-tracker, on a device leased from a TVM RPC tracker (docs/remote.md) instead."""
    from schedlang.run.measure import set_runtime_threads

    if rpc_tracker is not None or rpc_key is not None or rpc_cc is not None:
        _run_on_board(args, strict, repeat, (rpc_tracker, rpc_key, rpc_cc), talk)
        return

    op, tgt, schedule = _given(args, talk, runnable_target_arg)
    set_runtime_threads(tgt.cores if not tgt.is_gpu else None)
    from schedlang.core.opinfo import format_flops
    from schedlang.run.build import compile_func
    from schedlang.run.measure import device_for, output_indices, time_kernel
    from schedlang.run.packing import split_prepacked
    from schedlang.run.verify import verify_build

    lowered = checked(op, schedule, tgt, knob_values(args.knob), strict) if schedule else None
    device_for(tgt)  # no device: say so before building anything
    # A schedule that `prepack`s a weight: its packing, once, apart from the kernel, timed alone
    # as a built model runs it (as the tuner times it: schedlang.run.packing).
    split = split_prepacked(lowered.func, output_indices(op)) if lowered else None
    with build_spinner():
        executable = compile_func(split[0] if split else lowered.func if lowered else op.func, tgt)
    # In a worker first: a kernel that crashes or writes out of bounds must not run in this process.
    reason = verify_build(op, executable, tgt)
    timing = time_kernel(op, executable, tgt, repeat=repeat, prepacked=split[1] if split else ())
    label = schedule.file if schedule else "unscheduled"
    typer.echo(f"{op.name} on {tgt.kind} ({format_flops(timing.flops)}): verified, {reason}")
    if split:
        typer.echo("  the weights it prepacks packed once beforehand; the kernel timed alone")
    typer.echo(_timing_line(label, timing))
    if baseline and lowered is not None:
        with build_spinner():
            plain_build = compile_func(op.func, tgt)
        plain = time_kernel(op, plain_build, tgt, repeat=1, min_repeat_ms=0)
        typer.echo(_timing_line("unscheduled", plain))
        typer.echo(f"  speedup {plain.median_s / timing.median_s:.1f}x over the unscheduled build")


def _run_on_board(args: ScheduleArgs, strict: bool, repeat: int, rpc, talk: Verbosity) -> None:
    """`run --rpc-tracker`: cross-built here, verified and timed on a leased device."""
    from schedlang.core.opinfo import flop_count, format_flops
    from schedlang.run.build import compile_func
    from schedlang.run.leased import run_on_board
    from schedlang.run.remote import remote_settings

    tracker, key, cc = rpc
    remote = remote_settings(tracker, key, cc=cc)
    # Never None: without a tracker, remote_settings rejects the --rpc-key or --rpc-cc given.
    assert remote is not None
    op, tgt, schedule = _given(args, talk, target_arg)
    lowered = checked(op, schedule, tgt, knob_values(args.knob), strict) if schedule else None
    with build_spinner():
        executable = compile_func(lowered.func if lowered else op.func, tgt)
    outcome = run_on_board(op, executable, tgt, remote, repeat=repeat)
    emulated = "; an emulator: its timing means nothing" if outcome.extra.get("emulated") else ""
    device = f"{outcome.extra.get('device')} (key {remote.key}{emulated})"
    if not outcome.is_ok:
        raise SchedlangError(f"{op.name} on {device}: {outcome.status}: {outcome.reason}")
    label = schedule.file if schedule else "unscheduled"
    flops = flop_count(op.func)
    typer.echo(f"{op.name} on {device} ({format_flops(flops)}): verified, {outcome.reason}")
    median_s = statistics.median(outcome.latencies_s)
    gflops = flops / median_s / 1e9 if median_s > 0 else 0.0
    typer.echo(f"  {label:<24} {format_seconds(median_s):>10}  {gflops:8.2f} GFLOP/s")


def _timing_line(label: str, timing) -> str:
    return f"  {label:<24} {format_seconds(timing.median_s):>10}  {timing.gflops:8.2f} GFLOP/s"
