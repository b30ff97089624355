"""Reading what a command was given: op files, targets, schedules, knob values, the database;
checking a schedule (its warnings to stderr); writing a file. Errors are SchedlangErrors, so that
`@command` renders them."""

from __future__ import annotations

import sys
from pathlib import Path

from schedlang.cli.app import warn
from schedlang.cli.options import ScheduleArgs
from schedlang.core.diagnostics import DiagnosticError, SchedlangError, error, render_all

STDIN = "-"


def read_text(path: str) -> str:
    """A source file's text, or stdin's for `-`."""
    from schedlang.lang.syntax import read_source

    if path != STDIN:
        return read_source(path)
    data = sys.stdin.buffer.read()
    if b"\0" in data[:8192]:  # as a file with NUL bytes is (syntax.read_source)
        raise DiagnosticError([error("<stdin> is binary data, not a schedule")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DiagnosticError(
            [error(f"<stdin> is not valid UTF-8 (byte 0x{data[exc.start]:02x})")]
        ) from None


def display_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path


def open_db(path: str | None, *, read_only: bool = False, missing_ok: bool = False):
    """The tuning database at `path`, else the default one (schedlang.workflows.database); its
    warnings (a missing file read as empty, a new file started) to stderr."""
    from schedlang.workflows.database import open_database

    return open_database(
        path, read_only=read_only, missing_ok=missing_ok, events=lambda note: warn(note.text)
    )


def load_op_arg(spec: str, defines: list[str] | None):
    from schedlang.core.ops import load_op, parse_defines, split_op_spec

    path, name = split_op_spec(spec)
    return load_op(path, parse_defines(defines or []), name=name)


def target_arg(spec: str, arch: str | None):
    from schedlang.core.target import resolve_target

    return resolve_target(spec, arch=arch)


def runnable_target_arg(spec: str, arch: str | None):
    """target_arg for a command that runs kernels here: refused up front when this machine's
    CPU cannot run them (schedlang.core.target.require_runs_here), rather than dying of SIGILL."""
    from schedlang.core.target import require_runs_here

    tgt = target_arg(spec, arch)
    require_runs_here(tgt)
    return tgt


def knob_values(items: list[str] | None) -> dict[str, int]:
    values: dict[str, int] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip().lstrip("-").isdigit():
            raise SchedlangError(f"bad knob value `{item}`", "write it as NAME=INT, e.g. -k TI=32")
        from schedlang.lang.syntax import INT_LIMIT, INT_LIMIT_TEXT

        digits = value.strip().lstrip("-").lstrip("0") or "0"
        if len(digits) > len(str(INT_LIMIT)) or int(digits) > INT_LIMIT:
            limit = f"the limit is {INT_LIMIT_TEXT} either way"
            raise SchedlangError(f"-k {name.strip()}: integer too large: {limit}")
        values[name.strip()] = int(value)
    return values


def schedule_arg(file: str | None, text: str | None, option: str | None = None):
    """The schedule from the SCHEDULE argument, --schedule FILE or -s TEXT (None when none was
    given: the default schedule, or an error, as the command decides)."""
    from schedlang.lang.syntax import parse

    given = [
        form
        for form, value in (
            (f"SCHEDULE ({file})", file),
            (f"--schedule {option}", option),
            ("-s TEXT", text),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise SchedlangError(
            f"give the schedule once, not {' and '.join(given)}",
            "a .sched file as the argument after the op (or --schedule FILE), or -s TEXT inline",
        )
    file = file if file is not None else option
    if file is not None:
        return parse(read_text(file), display_name(file))
    if text is not None:
        return parse(text, "<-s>")
    return None


def checked(op, schedule, target, knobs, strict: bool, template_ok: bool = False):
    """Check and lower; warnings to stderr; a DiagnosticError if anything is wrong."""
    from schedlang.checker.check import check

    result = check(schedule, op.func, target, knobs=knobs, strict=strict, template_ok=template_ok)
    warnings = [d for d in result.diagnostics if not d.is_error]
    if result.lowered is None:
        raise DiagnosticError(result.diagnostics, schedule.source)
    warn(render_all(warnings, schedule.source))
    return result.lowered


def given_schedule(args: ScheduleArgs):
    """The schedule of a command that takes `ScheduleArgs` (None when none was given)."""
    return schedule_arg(args.schedule_file, args.text, args.schedule_option)


def write_text(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as err:
        raise SchedlangError(f"cannot write {path}: {err.strerror}") from None
