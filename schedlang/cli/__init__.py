"""The `schedlang` command line: a thin layer over the library.

    schedlang --version
    schedlang fmt FILE... [--check] [--diff]
    schedlang parse FILE --emit ast
    schedlang show OP.py
    schedlang check OP.py [SCHEDULE] [-s TEXT] [--target llvm|cuda|JSON] [--json]
    schedlang compile OP.py [SCHEDULE] [-s TEXT] [-o lib.so] [--emit tir|trace|source]
    schedlang run OP.py [SCHEDULE] [-s TEXT]
    schedlang tune OP.py [TEMPLATE...] [--trials N] [--seed S] [--db PATH] [--plot PNG] [--json]
                         [--list-templates]
                         [--rpc-tracker HOST:PORT --rpc-key KEY [--rpc-devices N] [--rpc-cc CC]]
    schedlang rpc-status --rpc-tracker HOST:PORT
    schedlang rpc-server --rpc-tracker HOST:PORT --rpc-key KEY [--host 127.0.0.1]
    schedlang best OP.py [--target …] [--json]
    schedlang history [OP.py] [--format table|csv|json]
    schedlang export OP.py [SCHEDULE] [--ms-db DIR] [--trace-json FILE] [--from-db]
    schedlang import OP.py (--ms-db DIR | --trace FILE) [-o FILE] [--partial]
    schedlang tune-model MODEL.py [--trials N] [--db PATH]
    schedlang build-model MODEL.py [--db PATH] [-o lib.so] [--compare]
    schedlang eval-model (--model DIR|ID | --endpoint URL --model-name NAME) [--ops OP,…]
                         [-D [OP.]NAME=V] [--trials N] [--metaschedule] [-o OUT.json]
    schedlang eval-model --compare A.json B.json

A schedule is taken the same way by every command that takes one: `OP [SCHEDULE]` positional,
`-s TEXT` inline, `--schedule FILE` as an alias of the positional. `python -m schedlang` is the
same program. docs/cli.md documents the JSON output (`--json`) and the exit codes.

Each command calls library functions and prints their result. Exit codes: 0 success; 1 a problem
with the input (diagnostics on stderr, or `fmt --check` found files to reformat); 2 a bug in
schedlang ("internal error", with `SCHEDLANG_TRACEBACK=1` or `--verbose` to see the traceback;
click also uses 2 for a bad command line); 130 interrupted (Ctrl-C); 141, silently, when the
reader of stdout closed it (`| head`).

Adding a command: decorate it with `@command()` (not `@app.command()`), so that a `SchedlangError`
it raises becomes rendered diagnostics on stderr and exit code 1 rather than a traceback. Import
heavy modules (tvm, the op loader, lowering) inside the command body: `--version`, `fmt` and `parse`
must start fast.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, ParamSpec, TypeVar

import typer

from schedlang import __version__
from schedlang.core.diagnostics import DiagnosticError, SchedlangError, error, render_all, warning

if TYPE_CHECKING:
    from schedlang.lang.nodes import Schedule

STDIN = "-"
INTERNAL_ERROR_EXIT = 2
# When the reader of stdout goes away (`| head`), exit as a C program killed by SIGPIPE appears to
# the shell (128 + 13), as `yes`, `git log` and `grep` do: quietly, yet not claiming the output
# was written in full.
SIGPIPE_EXIT = 141

app = typer.Typer(
    name="schedlang",
    help="A schedule language for Apache TVM.",
    no_args_is_help=True,
    # `schedlang --install-completion` (bash, zsh, fish, PowerShell); files complete as files.
    add_completion=True,
    # Our own handler (`main`, `command`) turns an unexpected exception into two lines, not a
    # page of traceback.
    pretty_exceptions_enable=False,
)

P = ParamSpec("P")
R = TypeVar("R")

# Version of the JSON documents `--json` prints (docs/cli.md); raised when a field changes meaning
# or goes away, not when one is added.
JSON_SCHEMA = 1


@dataclass
class Output:
    """How the running command reports: set by the global and per-command options."""

    command: str = ""
    json: bool = False
    quiet: bool = False  # errors only on stderr; stdout keeps the command's result
    verbose: bool = False  # more detail, and the traceback of an internal error


OUTPUT = Output()


def set_output(*, json_output: bool = False, quiet: bool = False, verbose: bool = False) -> None:
    """Options of one command, on top of the global `schedlang --quiet/--verbose`."""
    if quiet and verbose:
        raise SchedlangError("give --quiet or --verbose, not both")
    OUTPUT.json = OUTPUT.json or json_output
    OUTPUT.quiet = OUTPUT.quiet or quiet
    OUTPUT.verbose = OUTPUT.verbose or verbose
    if OUTPUT.quiet and OUTPUT.verbose:
        raise SchedlangError("give --quiet or --verbose, not both")


def info(text: str) -> None:
    """A message for the user on stderr (what was written, what was used); not with --quiet."""
    if not OUTPUT.quiet:
        typer.echo(text, err=True)


def emit_json(document: dict) -> None:
    """One JSON document on stdout: {"schema", "command", "ok", …} (docs/cli.md)."""
    head = {"schema": JSON_SCHEMA, "command": OUTPUT.command}
    typer.echo(json.dumps({**head, **document}, indent=2, default=str))


def diagnostics_json(diagnostics, source: str | None = None) -> list[dict]:
    return [d.to_json(source) for d in diagnostics]


# --- errors → stderr ---------------------------------------------------------------------------


def fail(err: SchedlangError) -> NoReturn:
    """Print an error's diagnostics to stderr (with --json: as JSON on stdout) and exit 1."""
    if OUTPUT.json:
        source = getattr(err, "source", None)
        emit_json({"ok": False, "diagnostics": diagnostics_json(err.diagnostics(), source)})
    else:
        print_diagnostics(err.render())
    raise typer.Exit(1)


def internal_error(exc: BaseException) -> NoReturn:
    if os.environ.get("SCHEDLANG_TRACEBACK") or OUTPUT.verbose:
        import traceback

        traceback.print_exception(exc)
    message = str(exc).strip().splitlines()
    detail = f": {message[0]}" if message else ""
    if OUTPUT.json:
        text = f"internal error: {type(exc).__name__}{detail}"
        emit_json({"ok": False, "diagnostics": [error(text).to_json()]})
    typer.echo(f"internal error: {type(exc).__name__}{detail}", err=True)
    typer.echo(
        "this is a bug in schedlang; please report it with the command you ran and its input "
        "(set SCHEDLANG_TRACEBACK=1 to see the traceback)",
        err=True,
    )
    raise typer.Exit(INTERNAL_ERROR_EXIT)


def reports_errors(function: Callable[P, R]) -> Callable[P, R]:
    """Run a command so that a SchedlangError exits 1 with its diagnostics, and any other
    exception exits 2 as an internal error; never a traceback."""

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.exceptions.TyperException):
            raise  # typer's own: a usage error exits 2 with the usage line
        except SchedlangError as err:
            fail(err)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except BrokenPipeError as exc:
            broken_pipe(exc)
        except Exception as exc:
            internal_error(exc)

    return run


def broken_pipe(exc: BrokenPipeError) -> NoReturn:
    """Exit quietly with SIGPIPE_EXIT when the reader of stdout went away; any other broken pipe
    (a worker's, a socket's) is an internal error."""
    if not stdout_closed():
        internal_error(exc)
    quiet_stdout()
    raise typer.Exit(SIGPIPE_EXIT)


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (`schedlang history | head -1`)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):  # no poll(), or no real stdout (CliRunner)
        return False
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in events)


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def command(name: str | None = None, **options) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`@app.command()` for a schedlang command: registers `function` wrapped in
    `reports_errors`, and returns it unwrapped for direct calls."""

    def register(function: Callable[P, R]) -> Callable[P, R]:
        command_name = name or function.__name__.replace("_", "-")

        @functools.wraps(function)
        def named(*args: P.args, **kwargs: P.kwargs) -> R:
            OUTPUT.command = command_name
            return function(*args, **kwargs)

        app.command(name, **options)(reports_errors(named))
        return function

    return register


_SEVERITY = re.compile(r"(?m)(?:^|(?<=: ))(error|warning)(?=: )")
_MARKERS = re.compile(r"(?m)(?<=\| )\s*\^~*$")
_NOTES = re.compile(r"(?m)^\s*= note:")
_NUMBER_LIST = re.compile(r"\[\n\s*((?:-?\d+,\n\s*)*-?\d+)\n\s*\]")


def warn(text: str) -> None:
    """Rendered warnings to stderr, unless --quiet."""
    if not OUTPUT.quiet:
        print_diagnostics(text)


def print_diagnostics(text: str) -> None:
    """Rendered diagnostics to stderr; coloured only when stderr is a terminal, so tests and pipes
    see exactly the plain text."""
    if not text:
        return
    if not sys.stderr.isatty() or os.environ.get("NO_COLOR"):
        typer.echo(text, err=True)
        return
    from rich.console import Console
    from rich.text import Text

    styled = Text(text)
    styled.highlight_regex(_SEVERITY, lambda word: "bold red" if word == "error" else "bold yellow")
    styled.highlight_regex(_MARKERS, "bold green")
    styled.highlight_regex(_NOTES, "bold cyan")
    Console(stderr=True, highlight=False, soft_wrap=True).print(styled)


# --- reading and writing -----------------------------------------------------------------------


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


# --- commands ----------------------------------------------------------------------------------


def _tvm_version() -> str:
    # From the installed package's metadata: importing tvm itself takes seconds.
    for distribution in ("apache-tvm", "tvm"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"schedlang {__version__}")
        typer.echo(f"TVM {_tvm_version()}")
        raise typer.Exit()


QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="Errors only on stderr: no progress, no notes.")
]
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v", help="More detail (each candidate, the tuner's decisions, tracebacks)."
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout (see docs/cli.md).")
]


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the versions of schedlang and TVM.",
            is_eager=True,
            callback=_print_version,
        ),
    ] = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """A schedule language for Apache TVM."""
    if quiet and verbose:
        typer.echo("error: give --quiet or --verbose, not both", err=True)
        raise typer.Exit(1)
    # One invocation's options (tests run many invocations in one process).
    OUTPUT.command, OUTPUT.json, OUTPUT.quiet, OUTPUT.verbose = "", False, quiet, verbose


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
            typer.echo(_unified_diff(text, formatted, name), nl=False)
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


# --- ops, targets, schedules -------------------------------------------------------------------


# Shell completion: commands, options and targets complete from here; a file argument offers no
# words, and the shell's script (`--install-completion`) then completes it as a file.


def complete_target(incomplete: str) -> list[str]:
    return [kind for kind in ("llvm", "cuda") if kind.startswith(incomplete)]


OpArg = Annotated[
    str,
    typer.Argument(
        help="An op file (FILE.py or FILE.py:NAME).",
        metavar="OP",
    ),
]
TargetOpt = Annotated[
    str,
    typer.Option(
        "--target",
        "-t",
        help="llvm (this CPU), cuda, a JSON target dict or file.",
        autocompletion=complete_target,
    ),
]
ArchOpt = Annotated[str | None, typer.Option("--arch", help="GPU architecture, e.g. sm_90.")]
DefineOpt = Annotated[
    list[str] | None, typer.Option("--define", "-D", help="A shape parameter: -D N=512.")
]
KnobOpt = Annotated[list[str] | None, typer.Option("--knob", "-k", help="A knob value: -k TI=32.")]
# Every command that takes a schedule takes it the same way: `OP [SCHEDULE]`, `-s TEXT` inline,
# `--schedule FILE` as an alias of the positional (issue 15, item 7).
ScheduleArg = Annotated[
    str | None,
    typer.Argument(
        help="The .sched file; - for stdin.",
        metavar="SCHEDULE",
    ),
]
ScheduleOpt = Annotated[
    str | None,
    typer.Option(
        "--schedule",
        help="The .sched file, as an option (the same as the SCHEDULE argument).",
    ),
]
TextOpt = Annotated[str | None, typer.Option("-s", "--text", help="A schedule given inline.")]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Treat warnings (e.g. guards TVM adds) as errors.")
]


DbOpt = Annotated[
    str | None,
    typer.Option("--db", help="The tuning database (default: $SCHEDLANG_DB or the user cache)."),
]
RpcTrackerOpt = Annotated[
    str | None,
    typer.Option("--rpc-tracker", help="Measure on devices leased from this TVM RPC tracker."),
]
RpcKeyOpt = Annotated[
    str | None, typer.Option("--rpc-key", help="--rpc-tracker: the devices' key, e.g. rasp4.")
]


def open_db(path: str | None, *, read_only: bool = False, missing_ok: bool = False):
    """The tuning database at `path`, else `default_db_path()`.

    read_only: for commands that only read it; a missing file is an error, never created.
    missing_ok (with read_only): a missing file is a warning, and reads as an empty database.
    """
    from schedlang.store.db import Database, default_db_path

    where = Path(path) if path else default_db_path()
    try:
        db = Database(where, read_only=read_only)
    except SchedlangError as err:
        if not (read_only and missing_ok and not where.exists()):
            raise
        warn(render_all([warning(err.message, None, *err.notes)]))
        return Database(":memory:")  # SQLite's in-memory database: empty, and never saved
    if getattr(db, "created", False):
        warn(f"warning: no tuning database at {db.path}: started a new, empty one")
    return db


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


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
def check_command(
    op_file: OpArg,
    schedule_file: ScheduleArg = None,
    text: TextOpt = None,
    schedule_option: ScheduleOpt = None,
    target: TargetOpt = "llvm",
    arch: ArchOpt = None,
    define: DefineOpt = None,
    knob: KnobOpt = None,
    strict: StrictOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Check a schedule against an op and a target; print every diagnostic."""
    from schedlang.checker.check import check

    set_output(json_output=as_json, quiet=quiet, verbose=verbose)
    op = load_op_arg(op_file, define)
    schedule = schedule_arg(schedule_file, text, schedule_option)
    if schedule is None:
        raise SchedlangError("no schedule: give a .sched file or -s TEXT")
    tgt = target_arg(target, arch)
    result = check(schedule, op.func, tgt, knobs=knob_values(knob), strict=strict, template_ok=True)
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
def compile_command(
    op_file: OpArg,
    schedule_file: ScheduleArg = None,
    text: TextOpt = None,
    schedule_option: ScheduleOpt = None,
    target: TargetOpt = "llvm",
    arch: ArchOpt = None,
    define: DefineOpt = None,
    knob: KnobOpt = None,
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
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Schedule and build an op; write a library, or print its TIR, trace or source.

    A library for this machine is verified first: the kernel runs once in a worker process on
    poisoned buffers and is compared with the reference; a wrong kernel is not written."""
    from schedlang.run.build import compile_func, export, source

    set_output(quiet=quiet, verbose=verbose)
    op = load_op_arg(op_file, define)
    tgt = target_arg(target, arch)
    schedule = schedule_arg(schedule_file, text, schedule_option)
    if from_db:
        if schedule is not None:
            raise SchedlangError("give either a schedule or --from-db, not both")
        schedule = _best_schedule(op, tgt, db_path)
    lowered = checked(op, schedule, tgt, knob_values(knob), strict) if schedule else None
    func = lowered.func if lowered else op.func
    if emit is CompileEmit.TIR:
        typer.echo(func.script())
        return
    if emit is CompileEmit.TRACE:
        if lowered is None:
            raise SchedlangError("--emit trace needs a schedule")
        typer.echo(lowered.trace_python())
        return
    executable = compile_func(func, tgt)
    if emit is CompileEmit.SOURCE:
        typer.echo(source(executable, tgt))
        return
    if verify and lowered is not None:
        _verify_before_writing(op, executable, tgt)
    path = export(executable, output or f"{Path(op_file.split(':')[0]).stem}.so")
    typer.echo(f"wrote {path}")


def _verify_before_writing(op, executable, tgt) -> None:
    from schedlang.run.verify import runs_here, verify_build

    if not runs_here(tgt):
        warn(f"warning: not verified: this machine cannot run kernels for {tgt.describe()}")
        return
    reason = verify_build(op, executable, tgt)
    info(f"verified: {reason}")


def _best_schedule(op, tgt, db_path: str | None):
    from schedlang.tuning.tune import record_schedule

    with open_db(db_path, read_only=True) as db:
        [best] = best_records_of(db, op, tgt)
    info(f"using the best schedule from the database: {best.gflops:.2f} GFLOP/s")
    return record_schedule(best)


def best_records_of(db, op, tgt, n: int = 1) -> list:
    """tune.best_records, and when there is none, what the database does hold for an op of that
    name: the same op on other targets, or other shapes (`-D`) of it on this one."""
    from schedlang.store.records import op_key
    from schedlang.tuning.tune import best_records

    try:
        return best_records(db, op, tgt, n=n)
    except SchedlangError:
        pass
    key = op_key(op.func)
    shape = ", ".join(f"{name}={value}" for name, value in op.params.items())
    this = f"{op.name} ({shape})" if shape else op.name
    other_targets, other_shapes = {}, 0
    for version, target_key, count in db.versions_of(op.name):
        if version == key:
            other_targets[_target_kind(target_key)] = count
        elif target_key == tgt.key:
            other_shapes += count
    notes = []
    if other_shapes:
        defines = " ".join(f"-D {name}={value}" for name, value in op.params.items())
        notes.append(
            f"the database has {other_shapes} verified record{'s' * (other_shapes != 1)} of "
            f"`{op.name}` on {tgt.kind} for another shape (or another definition of the op): "
            f"records are per shape; tune this one with "
            f"`schedlang tune {op.path or op.name}{' ' + defines if defines else ''}`"
        )
    if other_targets:
        where = ", ".join(f"{kind} ({count})" for kind, count in sorted(other_targets.items()))
        notes.append(
            f"it has verified records of this op for other targets: {where}; records are "
            "never shared across targets: give --target, or tune for this one"
        )
    if not notes:
        notes.append("run `schedlang tune` first")
    raise SchedlangError(
        f"no verified schedule for {this} on {tgt.kind} in the tuning database ({db.path})",
        *notes,
    )


def _target_kind(target_key: str) -> str:
    try:
        return str(json.loads(target_key).get("kind", target_key))
    except (ValueError, AttributeError):
        return target_key


@command("run")
def run_command(
    op_file: OpArg,
    schedule_file: ScheduleArg = None,
    text: TextOpt = None,
    schedule_option: ScheduleOpt = None,
    target: TargetOpt = "llvm",
    arch: ArchOpt = None,
    define: DefineOpt = None,
    knob: KnobOpt = None,
    strict: StrictOpt = False,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Timed repeats.")] = 5,
    baseline: Annotated[
        bool, typer.Option("--baseline/--no-baseline", help="Also time the unscheduled build.")
    ] = True,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Build, verify against the reference, and time; compare with the unscheduled build."""
    from schedlang.run.measure import set_runtime_threads

    set_output(quiet=quiet, verbose=verbose)
    op = load_op_arg(op_file, define)
    tgt = runnable_target_arg(target, arch)
    set_runtime_threads(tgt.cores if not tgt.is_gpu else None)
    from schedlang.core.opinfo import format_flops
    from schedlang.run.build import compile_func
    from schedlang.run.measure import device_for, time_kernel
    from schedlang.run.verify import verify_build

    schedule = schedule_arg(schedule_file, text, schedule_option)
    lowered = checked(op, schedule, tgt, knob_values(knob), strict) if schedule else None
    device_for(tgt)  # no device: say so before building anything
    executable = compile_func(lowered.func if lowered else op.func, tgt)
    # In a worker first: a kernel that crashes or writes out of bounds must not run in this process.
    reason = verify_build(op, executable, tgt)
    timing = time_kernel(op, executable, tgt, repeat=repeat)
    label = schedule.file if schedule else "unscheduled"
    typer.echo(f"{op.name} on {tgt.kind} ({format_flops(timing.flops)}): verified, {reason}")
    typer.echo(_timing_line(label, timing))
    if baseline and lowered is not None:
        plain = time_kernel(op, compile_func(op.func, tgt), tgt, repeat=1, min_repeat_ms=0)
        typer.echo(_timing_line("unscheduled", plain))
        typer.echo(f"  speedup {plain.median_s / timing.median_s:.1f}x over the unscheduled build")


# --- tuning and its database -------------------------------------------------------------------


def _timing_line(label: str, timing) -> str:
    return f"  {label:<24} {format_seconds(timing.median_s):>10}  {timing.gflops:8.2f} GFLOP/s"


def _list_templates() -> None:
    """`tune --list-templates`: the kinds of template the built-in proposer writes, per target, in
    the order it tries them, with the op shapes each matches and its knobs."""
    import textwrap
    from dataclasses import asdict

    from schedlang.propose import builtin

    describe = getattr(builtin, "describe_templates", None)
    if describe is None:
        raise SchedlangError(
            "this version of the built-in proposer cannot list its templates "
            "(schedlang.propose.builtin.describe_templates is missing)"
        )
    templates = describe()
    if OUTPUT.json:
        emit_json({"ok": True, "templates": [asdict(t) for t in templates], "diagnostics": []})
        return
    headings = {"cpu": "CPU (--target llvm)", "gpu": "GPU (--target cuda)"}
    for kind in dict.fromkeys(t.target for t in templates):
        typer.echo(f"{headings.get(kind, kind)}, in the order they are tried:")
        for t in (t for t in templates if t.target == kind):
            space = f"up to {t.space} knob points{' per block' if t.per_block else ''}"
            typer.echo(f"  {t.name}  ({space})")
            for label, text in (("matches: ", t.matches), ("knobs:   ", t.knobs)):
                typer.echo(
                    textwrap.fill(
                        text,
                        width=100,
                        initial_indent=f"    {label}",
                        subsequent_indent=" " * (4 + len(label)),
                        break_on_hyphens=False,
                    )
                )
        typer.echo("")
    typer.echo("`schedlang tune OP --show-templates` prints the ones written for an op.")


@command("tune")
def tune_command(
    op_file: Annotated[
        str | None,
        typer.Argument(help="An op file (FILE.py or FILE.py:NAME).", metavar="OP"),
    ] = None,
    template_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Templates (or schedules) to search instead of the built-in proposer's.",
            metavar="TEMPLATE",
        ),
    ] = None,
    target: TargetOpt = "llvm",
    arch: ArchOpt = None,
    define: DefineOpt = None,
    trials: Annotated[int, typer.Option("--trials", min=1, help="Candidates to measure.")] = 32,
    template: Annotated[
        list[str] | None,
        typer.Option("--template", help="A .sched template (repeatable); as TEMPLATE..."),
    ] = None,
    proposer: Annotated[
        str, typer.Option("--proposer", help="builtin, or model (see `schedlang tune --help`).")
    ] = "builtin",
    seed: Annotated[int, typer.Option("--seed", help="Seed of every random decision.")] = 0,
    db_path: DbOpt = None,
    build_timeout: Annotated[float, typer.Option("--build-timeout", help="Seconds.")] = 120.0,
    run_timeout: Annotated[float, typer.Option("--run-timeout", help="Seconds.")] = 60.0,
    plot: Annotated[
        str | None, typer.Option("--plot", help="Write a tuning curve (PNG) here.")
    ] = None,
    show_templates: Annotated[
        bool, typer.Option("--show-templates", help="Print the templates being searched.")
    ] = False,
    model: Annotated[
        str, typer.Option("--model", help="--proposer model: a hub id or a folder of weights.")
    ] = "WeiboAI/VibeThinker-1.5B",
    endpoint: Annotated[
        str | None,
        typer.Option("--endpoint", help="--proposer model: an OpenAI-compatible server's URL."),
    ] = None,
    hint: Annotated[
        str | None,
        typer.Option(
            "--hint",
            help="Advice for the model; for the built-in proposer, templates it names go first.",
        ),
    ] = None,
    candidates_per_round: Annotated[
        int, typer.Option("--candidates-per-round", min=1, help="--proposer model: answers asked.")
    ] = 4,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-new-tokens",
            min=16,
            help="--proposer model: tokens per reply, reasoning included (default: 8192 on a "
            "GPU or a server, 768 for a local model on a CPU).",
        ),
    ] = None,
    answer_tokens: Annotated[
        int | None,
        typer.Option(
            "--answer-tokens",
            min=16,
            help="--proposer model: of --max-new-tokens, those for the answer (the rest is for "
            "reasoning; default 1024 on a GPU or a server, 256 on a CPU).",
        ),
    ] = None,
    decoding: Annotated[
        str,
        typer.Option(
            "--decoding",
            help="--proposer model: stepwise (each statement constrained by the checker's "
            "state, then checked), whole (one grammar for the whole answer), or none.",
        ),
    ] = "stepwise",
    log_prompts: Annotated[
        str | None,
        typer.Option("--log-prompts", help="--proposer model: write every prompt and reply here."),
    ] = None,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0)] = 0.6,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0)] = 0.95,
    rpc_tracker: RpcTrackerOpt = None,
    rpc_key: RpcKeyOpt = None,
    rpc_devices: Annotated[
        int | None,
        typer.Option("--rpc-devices", help="--rpc-tracker: devices measuring at once (all free)."),
    ] = None,
    rpc_cc: Annotated[
        str | None,
        typer.Option("--rpc-cc", help="--rpc-tracker: cross compiler, e.g. aarch64-linux-gnu-g++."),
    ] = None,
    rpc_timeout: Annotated[
        float, typer.Option("--rpc-timeout", help="--rpc-tracker: seconds to wait for a device.")
    ] = 60.0,
    cost_model: Annotated[
        str,
        typer.Option(
            "--cost-model",
            help="off, lightgbm or auto (LightGBM when installed): rank knob points by a model "
            "trained on the measured ones before building them.",
        ),
    ] = "off",
    list_templates: Annotated[
        bool,
        typer.Option(
            "--list-templates",
            help="List the op shapes the built-in proposer has templates for (no OP needed).",
        ),
    ] = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Tune an op: search schedule templates by measuring candidates; results go to the database.

    Ctrl-C stops it: what was measured stays in the database (and in the --plot curve), and the
    same command run again goes on from there."""
    from schedlang.llm.spec import ModelSpec, make_proposer
    from schedlang.propose.builtin import BuiltinProposer
    from schedlang.propose.interface import Context, Proposal
    from schedlang.run.remote import remote_settings
    from schedlang.tuning.tune import Settings

    set_output(json_output=as_json, quiet=quiet, verbose=verbose)
    if list_templates:
        _list_templates()
        return
    if op_file is None:
        raise typer.BadParameter("missing: give the op to tune", param_hint="'OP'")
    remote = remote_settings(rpc_tracker, rpc_key, rpc_devices, rpc_cc, rpc_timeout)
    op = load_op_arg(op_file, define)
    tgt = target_arg(target, arch) if remote else runnable_target_arg(target, arch)
    templates = [
        Proposal(read_text(path), "template", note=display_name(path))
        for path in [*(template_args or []), *(template or [])]
    ]
    spec = ModelSpec(
        model=model,
        endpoint=endpoint,
        decoding=decoding,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        answer_tokens=answer_tokens,
        candidates_per_round=candidates_per_round,
        hint=hint,
    )
    chosen = make_proposer(proposer, templates, model=spec, seed=seed, log_prompts=log_prompts)
    if proposer == "model" and not endpoint:
        limits, backend = chosen.limits, chosen.backend  # a ModelProposer
        info(backend.expected_time(limits.statements, limits.step_tokens))
    if show_templates:
        for proposal in templates or BuiltinProposer().templates(Context(op, tgt)):
            header = "" if proposal.text.lstrip().startswith("#") else f"# {proposal.note}\n"
            typer.echo(header + proposal.text, err=OUTPUT.json)
    if plot:
        from schedlang.tuning.plot import require_matplotlib

        require_matplotlib()  # before tuning, not after
    settings = Settings(
        trials=trials,
        seed=seed,
        build_timeout_s=build_timeout,
        run_timeout_s=run_timeout,
        remote=remote,
        # The model is told each candidate's speedup over the unscheduled build.
        baseline=proposer == "model",
        cost_model=cost_model,
    )
    if remote is not None:
        info(f"measuring on devices `{remote.key}` of the RPC tracker {remote.tracker}")
    with open_db(db_path) as db:
        started = time.time()
        try:
            result = _tune_with_progress(
                op, tgt, db, settings=settings, templates=templates, proposer=chosen, hint=hint
            )
        except KeyboardInterrupt:
            _interrupted(op, tgt, db, started, trials, plot, remote)
            raise typer.Exit(130) from None
        summary = tune_summary(op, tgt, db, result.records, trials, plot=plot)
        summary.update(run_id=result.run_id, reused=result.reused, wall_s=round(result.wall_s, 3))
        summary["baseline"] = _baseline_json(result.baseline)
        failure = _nothing_verified(result, summary)
        if failure:
            summary.update(ok=False, diagnostics=[error(failure).to_json()])
        if plot:
            _write_plot(op, tgt, db, result.records, result.baseline, plot, remote)
        if OUTPUT.json:
            emit_json(summary)
        else:
            if OUTPUT.verbose:
                for line in db.decisions(result.run_id):
                    typer.echo(f"  decision: {line}", err=True)
            _print_tune_summary(op, tgt, db, result)
            if plot:
                info(f"wrote {plot}")
        if failure:
            if not OUTPUT.json:
                typer.echo(f"error: {failure}", err=True)
            raise typer.Exit(1)


def _nothing_verified(result, summary: dict) -> str | None:
    """Why a tuning run failed as a whole: after it, the database holds no verified schedule for
    the op and target (every candidate it measured failed, or it found only failures there)."""
    from collections import Counter

    if summary["best"] is not None:
        return None
    statuses = Counter(str(r.status) for r in result.records)
    kinds = ", ".join(f"{n} {status}" for status, n in statuses.most_common())
    measured = f"{len(result.records)} measured" + (f" ({kinds})" if kinds else "")
    reused = f"; {result.reused} found in the database had failed before" if result.reused else ""
    return (
        f"no candidate verified: {measured}{reused}, and the database holds no verified schedule "
        "for this op and target; `--verbose` lists every reason, and "
        "`schedlang check OP SCHEDULE` shows a schedule's problems"
    )


def tune_summary(op, tgt, db, records, trials: int, *, plot: str | None) -> dict:
    """The `tune --json` document (docs/cli.md), less what only a finished run knows."""
    from schedlang.store.records import op_key

    best = next(iter(db.best(op_key(op.func), tgt.key)), None)
    return {
        "ok": True,
        "interrupted": False,
        "op": op.name,
        "target": tgt.kind,
        "db": str(db.path),
        "run_id": None,
        "trials": trials,
        "measured": len(records),
        "verified": sum(r.is_ok for r in records),
        "failed": sum(not r.is_ok for r in records),
        "reused": None,
        "wall_s": None,
        "baseline": None,
        "best": best.to_json() if best is not None else None,
        "records": [
            {
                "id": r.id,
                "status": r.status.value,
                "gflops": r.gflops,
                "median_s": r.median_s,
                "knobs": r.knobs,
                "proposer": r.proposer,
                "reason": r.reason,
            }
            for r in records
        ],
        "plot": plot,
        "diagnostics": [],
    }


def _baseline_json(record) -> dict | None:
    if record is None:
        return None
    return {
        "status": record.status.value,
        "gflops": record.gflops,
        "median_s": record.median_s,
        "reason": record.reason,
    }


def _interrupted(op, tgt, db, started: float, trials: int, plot: str | None, remote) -> None:
    """Ctrl-C during `tune`: say what was kept, draw what there is, and how to go on."""
    from schedlang.store.records import op_key

    key = op_key(op.func)
    runs = [run for run in db.runs(key, tgt.key) if run["started_at"] >= started - 1]
    run_id = runs[-1]["id"] if runs else None
    records, baseline = [], None
    for record in db.records(key, tgt.key):
        if run_id is None or record.extra.get("run_id") != run_id:
            continue
        if record.extra.get("baseline"):
            baseline = record
        else:
            records.append(record)
    kept = db.count(key, tgt.key)
    summary = tune_summary(op, tgt, db, records, trials, plot=plot if records else None)
    summary.update(
        ok=False,
        interrupted=True,
        run_id=run_id,
        wall_s=round(time.time() - started, 3),
        baseline=_baseline_json(baseline),
    )
    if plot and records:
        _write_plot(op, tgt, db, records, baseline, plot, remote, note=" (interrupted)")
    if OUTPUT.json:
        emit_json(summary)
    measured = f"{len(records)} candidate{'s' * (len(records) != 1)} measured in this run"
    typer.echo(
        f"interrupted: {measured}; {kept} record{'s' * (kept != 1)} of {op.name} on {tgt.kind} "
        f"kept in {db.path}",
        err=True,
    )
    if plot and records:
        typer.echo(f"wrote the partial tuning curve to {plot}", err=True)
    typer.echo(
        "rerun the same command to go on: measured candidates are read back from the database, "
        "not measured again",
        err=True,
    )


def _write_plot(op, tgt, db, records, baseline, plot: str, remote, *, note: str = "") -> None:
    """The tuning curve with its baselines (schedlang.tuning.plot.baselines); a baseline that
    cannot be
    measured is left out with a note."""
    from schedlang.tuning.plot import baselines, tuning_curve

    lines = baselines(op, tgt, db, baseline, local=remote is None, note=info)
    tuning_curve(records, plot, title=f"{op.name} on {tgt.kind}{note}", baselines=lines)


def _tune_with_progress(op, tgt, db, *, settings, templates=(), proposer=None, hint=None):
    """`tune` with a progress bar (a line per candidate when stderr is not a terminal)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]tuning {task.fields[op]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best {task.fields[best]}  failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    )
    from rich.console import Console

    # On stderr, so that stdout holds only the result (`tune --json > summary.json`).
    terminal = sys.stderr.isatty()
    console = Console(stderr=True)
    with Progress(*columns, console=console, disable=not terminal or OUTPUT.quiet) as bar:
        task = bar.add_task("tune", total=settings.trials, op=op.name, best="-", failed=0)

        def update(progress) -> None:
            best = f"{progress.best.gflops:.1f} GFLOP/s" if progress.best else "-"
            bar.update(task, completed=progress.done, best=best, failed=progress.failures)
            if OUTPUT.quiet or progress.last is None:
                return
            if not terminal or OUTPUT.verbose:  # --verbose: a line per candidate on a terminal too
                last = progress.last
                figure = f"{last.gflops:.2f} GFLOP/s" if last.gflops else last.reason
                typer.echo(f"[{progress.done}/{progress.total}] {last.status}: {figure}", err=True)

        from schedlang.tuning.tune import tune

        return tune(
            op,
            tgt,
            db,
            settings=settings,
            templates=templates,
            proposer=proposer,
            hint=hint,
            on_progress=update,
        )


def _print_tune_summary(op, tgt, db, result) -> None:
    from rich.console import Console
    from rich.table import Table

    from schedlang.store.records import op_key

    best = next(iter(db.best(op_key(op.func), tgt.key)), None)
    if OUTPUT.quiet:  # the result alone: the best schedule
        if best is not None:
            typer.echo(best.schedule.rstrip())
        return
    ok = [r for r in result.records if r.is_ok]
    table = Table(
        title=f"{op.name} on {tgt.kind}: {len(result.records)} measured, "
        f"{len(ok)} ok, {result.reused} reused, {result.wall_s:.0f} s"
    )
    for column in ("#", "GFLOP/s", "median", "status", "knobs"):
        table.add_column(column)
    top = sorted(ok, key=lambda r: r.median_s or 1e9)[:5]
    for index, record in enumerate(top, 1):
        knobs = " ".join(f"{k}={v}" for k, v in record.knobs.items())
        table.add_row(
            str(index),
            f"{record.gflops:.2f}",
            format_seconds(record.median_s),
            str(record.status),
            knobs,
        )
    Console(soft_wrap=True).print(table)
    failed = [r for r in result.records if not r.is_ok]
    for record in failed if OUTPUT.verbose else failed[:5]:
        typer.echo(f"  {record.status}: {record.reason}")
    if len(failed) > 5 and not OUTPUT.verbose:
        typer.echo(f"  … and {len(failed) - 5} more failures (--verbose lists them)")
    if best is not None:
        typer.echo(f"best ({best.gflops:.2f} GFLOP/s, {format_seconds(best.median_s)}):")
        typer.echo(best.schedule.rstrip())


@command("best")
def best_command(
    op_file: OpArg,
    target: TargetOpt = "llvm",
    arch: ArchOpt = None,
    define: DefineOpt = None,
    db_path: DbOpt = None,
    count: Annotated[int, typer.Option("-n", min=1, help="How many to show.")] = 1,
    as_json: JsonOpt = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="The schedules alone, without their # header.")
    ] = False,
) -> None:
    """The fastest verified schedules for an op on a target, from the database."""
    set_output(json_output=as_json, quiet=quiet)
    op = load_op_arg(op_file, define)
    tgt = target_arg(target, arch)
    with open_db(db_path, read_only=True) as db:
        best = best_records_of(db, op, tgt, n=count)
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
        gap = "\n" if index + 1 < len(best) or not OUTPUT.quiet else ""
        typer.echo(record.schedule.rstrip() + gap)


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
    from schedlang.store.records import export_csv, export_json, op_key
    from schedlang.store.schema import DamagedDatabaseError

    key = op_key(load_op_arg(op_file, define).func) if op_file else None
    target_key = target_arg(target, None).key if target else None
    try:
        with open_db(db_path, read_only=True) as db:
            records = db.records(key, target_key, limit=limit)
    except DamagedDatabaseError as err:
        records = _salvaged_records(err, db_path, key, target_key, limit)
    if output_format is HistoryFormat.CSV:
        export_csv(records, sys.stdout)
        return
    if output_format is HistoryFormat.JSON:
        export_json(records, sys.stdout)
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


def _salvaged_records(err: SchedlangError, db_path: str | None, key, target_key, limit) -> list:
    """The records of a damaged database that can still be read, with a warning saying so."""
    from schedlang.store.db import default_db_path, salvage_records

    records, lost, exact = salvage_records(Path(db_path) if db_path else default_db_path())
    records = [
        r
        for r in sorted(records, key=lambda r: (r.created_at, r.id))
        if key in (None, r.op_key) and target_key in (None, r.target_key)
    ][:limit]
    if exact or lost:
        unread = f"{'' if exact else 'at least '}{lost} could not be read"
    else:
        unread = "how many could not be read is not known"
    note = f"listing the {len(records)} records that can still be read; {unread}"
    warn(render_all([warning(err.message, None, note)]))
    return records


# --- scoring a model (schedlang.llm.evaluate)
# -------------------------------------------------------


@command("eval-model")
def eval_model_command(
    model: Annotated[
        str | None,
        typer.Option("--model", help="A hub id or a folder of weights, run here (transformers)."),
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="An OpenAI-compatible server's URL.")
    ] = None,
    model_name: Annotated[
        str | None, typer.Option("--model-name", help="--endpoint: the name the server serves.")
    ] = None,
    ops: Annotated[
        list[str] | None,
        typer.Option(
            "--ops", help="Example names or op files, comma-separated (default: every example)."
        ),
    ] = None,
    define: Annotated[
        list[str] | None,
        typer.Option(
            "--define",
            "-D",
            help="A shape parameter of every op that has it (-D N=512) or of one (-D matmul.M=64).",
        ),
    ] = None,
    target: TargetOpt = "llvm",
    arch: ArchOpt = None,
    trials: Annotated[int, typer.Option("--trials", min=1, help="Trials per op and arm.")] = 32,
    seed: Annotated[int, typer.Option("--seed", help="Seed of every random decision.")] = 0,
    decoding: Annotated[
        str, typer.Option("--decoding", help="stepwise, whole or none (see `tune --help`).")
    ] = "stepwise",
    temperature: Annotated[float, typer.Option("--temperature", min=0.0)] = 0.6,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0)] = 0.95,
    max_new_tokens: Annotated[
        int | None, typer.Option("--max-new-tokens", min=16, help="Tokens per reply.")
    ] = None,
    answer_tokens: Annotated[
        int | None, typer.Option("--answer-tokens", min=16, help="Of those, the answer's.")
    ] = None,
    candidates_per_round: Annotated[
        int, typer.Option("--candidates-per-round", min=1, help="Answers asked per round.")
    ] = 4,
    hint: Annotated[str | None, typer.Option("--hint", help="Advice for the model.")] = None,
    metaschedule: Annotated[
        bool,
        typer.Option(
            "--metaschedule/--no-metaschedule",
            help="Also tune with MetaSchedule (needs xgboost; minutes per op to start).",
        ),
    ] = False,
    db_path: DbOpt = None,
    out: Annotated[
        str, typer.Option("--out", "-o", help="The report (JSON); its table goes beside it (.md).")
    ] = "eval.json",
    work: Annotated[
        str | None,
        typer.Option("--work", help="Each arm's database (default: beside --out, OUT.runs/)."),
    ] = None,
    label: Annotated[str | None, typer.Option("--label", help="The run's name in tables.")] = None,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option(
            "--compare", help="Compare two reports per op (A.json B.json).", metavar="A B"
        ),
    ] = None,
) -> None:
    """Score a model: per op, the model loop, the built-in proposer (and MetaSchedule) with the
    same trial budget; figures to OUT.json and a table to OUT.md; records to the database."""
    from schedlang.llm import evaluate

    if compare:
        first, second = (evaluate.load_report(path) for path in compare)
        table = evaluate.render_comparison(first, second, evaluate.compare(first, second))
        typer.echo(table, nl=False)
        return
    if endpoint and not (model_name or model):
        raise SchedlangError("--endpoint needs --model-name NAME: the model the server serves")
    if not endpoint and model_name:
        raise SchedlangError("--model-name goes with --endpoint URL; a local model is --model")
    if not endpoint and model is None:
        raise SchedlangError(
            "which model? give --model DIR|ID (run here) or --endpoint URL --model-name NAME"
        )
    from schedlang.llm.proposer import DECODINGS

    if decoding not in DECODINGS:
        raise SchedlangError(f"unknown decoding `{decoding}`", f"one of: {', '.join(DECODINGS)}")
    suite = evaluate.load_suite(ops or [], define or [])
    tgt = runnable_target_arg(target, arch)
    spec = evaluate.ModelSpec(
        model=(model_name or model) if endpoint else model,  # type: ignore[arg-type]
        endpoint=endpoint,
        decoding=decoding,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        answer_tokens=answer_tokens,
        candidates_per_round=candidates_per_round,
        hint=hint,
    )
    evaluation = evaluate.Evaluation(
        suite,
        tgt,
        spec,
        trials=trials,
        seed=seed,
        out=Path(out),
        work=Path(work) if work else None,
        metaschedule=metaschedule,
        label=label,
    )
    with open_db(db_path) as db:
        report = evaluate.run_evaluation(
            evaluation, db, echo=lambda text: typer.echo(text, err=True)
        )
    typer.echo(evaluate.markdown(report), nl=False)
    typer.echo(f"wrote {out} and {Path(out).with_suffix('.md')}", err=True)


# --- whole models (Relax) ----------------------------------------------------------------------

ModelArg = Annotated[str, typer.Argument(help="A model file (FILE.py or FILE.py:NAME).")]
FuseOpt = Annotated[
    bool, typer.Option("--fuse/--no-fuse", help="Fuse operators as tvm.compile does (default).")
]


def load_model_arg(spec: str, defines: list[str] | None):
    from schedlang.core.ops import parse_defines, split_op_spec
    from schedlang.models.graph import load_model

    path, name = split_op_spec(spec)
    return load_model(path, parse_defines(defines or []), name=name)


@command("tune-model")
def tune_model_command(
    model_file: ModelArg,
    target: TargetOpt = "llvm",
    arch: ArchOpt = None,
    define: DefineOpt = None,
    trials: Annotated[
        int, typer.Option("--trials", min=1, help="Candidates in all, shared by flops x calls.")
    ] = 64,
    seed: Annotated[int, typer.Option("--seed", help="Seed of every random decision.")] = 0,
    db_path: DbOpt = None,
    fuse: FuseOpt = True,
    build_timeout: Annotated[float, typer.Option("--build-timeout", help="Seconds.")] = 120.0,
    run_timeout: Annotated[float, typer.Option("--run-timeout", help="Seconds.")] = 60.0,
) -> None:
    """Tune every distinct PrimFunc of a Relax model with the built-in proposer."""
    from schedlang.core.opinfo import format_flops
    from schedlang.models.tune_model import model_tasks, tune_model
    from schedlang.tuning.tune import Settings

    model = load_model_arg(model_file, define)
    tgt = target_arg(target, arch)
    tasks = model_tasks(model, tgt, trials, fuse=fuse)
    typer.echo(f"model {model.name}: {len(tasks)} task{'s' * (len(tasks) != 1)} on {tgt.kind}")
    width = max(len(task.name) for task, _ in tasks)
    for task, share in tasks:
        flops = format_flops(task.flops) if task.flops is not None else "? FLOP"
        trials_text = f"{share} trial{'s' * (share != 1)}"
        if task.flops is None:
            trials_text += " (flops unknown: symbolic shapes are not tuned)"
        typer.echo(f"  {task.name:<{width}}  {task.calls} x {flops:>10}  {trials_text}")
    settings = Settings(seed=seed, build_timeout_s=build_timeout, run_timeout_s=run_timeout)
    with open_db(db_path) as db:
        done = tuned = 0
        try:
            for task, result in tune_model(tasks, tgt, db, settings, tune_task=_tune_with_progress):
                done += 1
                if isinstance(result, SchedlangError):
                    typer.echo(f"{task.name}: not tuned: {result.message}", err=True)
                    continue
                ok = sum(record.is_ok for record in result.records)
                tuned += result.best is not None
                best = (
                    f"best {result.best.gflops:.2f} GFLOP/s" if result.best else "nothing verified"
                )
                typer.echo(f"{task.name}: {len(result.records)} measured, {ok} ok, {best}")
        except KeyboardInterrupt:
            typer.echo(
                f"interrupted: {done} of {len(tasks)} tasks done; every candidate measured so far "
                f"is kept in {db.path}",
                err=True,
            )
            typer.echo(
                "rerun the same command to go on: measured candidates are read back from the "
                "database, not measured again",
                err=True,
            )
            raise typer.Exit(130) from None
    if tasks and not tuned:
        typer.echo(
            f"error: no function of {model_file} got a verified schedule ({done} of {len(tasks)} "
            "tried); `--verbose` lists every reason",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(f"build it with: schedlang build-model {model_file} --target {target}")


@command("build-model")
def build_model_command(
    model_file: ModelArg,
    target: TargetOpt = "llvm",
    arch: ArchOpt = None,
    define: DefineOpt = None,
    db_path: DbOpt = None,
    output: Annotated[str | None, typer.Option("-o", help="Library to write (.so).")] = None,
    fuse: FuseOpt = True,
    fallback: Annotated[
        str, typer.Option("--fallback", help="For functions without a record: dlight or none.")
    ] = "dlight",
    compare: Annotated[
        bool, typer.Option("--compare", help="Verify and time against tvm.compile's build.")
    ] = False,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Timed repeats.")] = 5,
) -> None:
    """Build a Relax model with the database's best schedules; print what each function got."""
    import warnings

    from schedlang.run.measure import set_runtime_threads

    tgt = runnable_target_arg(target, arch) if compare else target_arg(target, arch)
    set_runtime_threads(tgt.cores if not tgt.is_gpu else None)
    from schedlang.models.graph import StaleRecordWarning, build_model
    from schedlang.run.build import export

    model = load_model_arg(model_file, define)
    with open_db(db_path, read_only=True, missing_ok=True) as db, warnings.catch_warnings():
        warnings.simplefilter("ignore", StaleRecordWarning)  # printed from the report below
        executable, applied = build_model(model.mod, tgt, db, fuse=fuse, fallback=fallback)
    width = max((len(a.function) for a in applied), default=0)
    typer.echo(f"model {model.name} on {tgt.kind}:")
    for item in applied:
        typer.echo(f"  {item.function:<{width}}  {item.summary()}")
        for problem in item.warnings:
            warn(warning(problem).render())
    tuned = sum(item.record is not None for item in applied)
    typer.echo(f"{tuned} of {len(applied)} functions scheduled from the database")
    if output:
        typer.echo(f"wrote {export(executable, output)}")
    if compare:
        _compare_builds(model, tgt, executable, repeat)


def _compare_builds(model, tgt, executable, repeat: int) -> None:
    from schedlang.models.graph import build_default, median, run_model, time_model, time_reference
    from schedlang.run.outcome import compare_outputs

    default = build_default(model.mod, tgt)
    numpy = time_reference(model, repeat)  # first: TVM's pool threads spin for a while after a run
    outputs = run_model(executable, model.inputs, tgt)
    ok, reason = compare_outputs(outputs, run_model(default, model.inputs, tgt))
    if not ok:
        raise SchedlangError(f"the tuned build and the default build disagree: {reason}")
    expected = model.expected_outputs()
    if expected is not None:
        ok, reason = compare_outputs(outputs, expected)
        if not ok:
            raise SchedlangError(f"the tuned build differs from the model's reference: {reason}")
    tuned_s = median(time_model(executable, model.inputs, tgt, repeat=repeat))
    default_s = median(time_model(default, model.inputs, tgt, repeat=repeat))
    checked_against = "the default build and the reference" if expected else "the default build"
    typer.echo(f"outputs agree with {checked_against}; medians of {repeat} timed runs:")
    typer.echo(f"  tuned    {format_seconds(tuned_s):>10}")
    typer.echo(f"  default  {format_seconds(default_s):>10}  ({default_s / tuned_s:.1f}x tuned)")
    if numpy is not None:
        numpy_s = median(numpy)
        typer.echo(f"  numpy    {format_seconds(numpy_s):>10}  ({numpy_s / tuned_s:.2f}x tuned)")


# --- remote devices (TVM RPC) ------------------------------------------------------------------


@command("rpc-status")
def rpc_status_command(
    rpc_tracker: Annotated[str, typer.Option("--rpc-tracker", help="The tracker: HOST:PORT.")],
) -> None:
    """The devices registered with a TVM RPC tracker: per key, how many, free, requests waiting."""
    from schedlang.run.remote import TrackerClient, parse_tracker, render_summary

    address = parse_tracker(rpc_tracker)
    with TrackerClient(address) as tracker:
        typer.echo(render_summary(address, tracker.summary()))


@command("rpc-server")
def rpc_server_command(
    rpc_tracker: Annotated[str, typer.Option("--rpc-tracker", help="The tracker: HOST:PORT.")],
    rpc_key: Annotated[str, typer.Option("--rpc-key", help="The key to register under.")],
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; 0.0.0.0 exposes it to the network.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, help="First port to try.")
    ] = 9090,
    port_end: Annotated[
        int, typer.Option("--port-end", min=1, max=65535, help="Last port to try.")
    ] = 9199,
) -> None:
    """Serve this machine to a tracker as a device (TVM's RPC server, outliving crashing
    kernels) until interrupted. Anyone who reaches it can run code here: trusted networks only."""
    # A server never sees a torch tensor; tvm_ffi imports torch (seconds) whenever it can.
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    from schedlang.run.remote import parse_tracker, serve

    serve(
        parse_tracker(rpc_tracker),
        rpc_key,
        host,
        port,
        port_end,
        on_start=lambda text: typer.echo(text, err=True),
    )


# --- TVM's own formats: traces and MetaSchedule databases ---------------------------------------

MsDbOpt = Annotated[
    str | None,
    typer.Option("--ms-db", help="A MetaSchedule database folder (JSONDatabase work_dir)."),
]


@command("export")
def export_command(
    op_file: OpArg,
    schedule_file: ScheduleArg = None,
    text: TextOpt = None,
    schedule_option: ScheduleOpt = None,
    target: TargetOpt = "llvm",
    arch: ArchOpt = None,
    define: DefineOpt = None,
    knob: KnobOpt = None,
    ms_db: MsDbOpt = None,
    trace_json: Annotated[
        str | None, typer.Option("--trace-json", help="Write the schedule's TVM trace here.")
    ] = None,
    latency: Annotated[
        list[float] | None,
        typer.Option("--latency", help="A run time in seconds (repeatable); else measured here."),
    ] = None,
    from_db: Annotated[
        bool, typer.Option("--from-db", help="Export the best records of the tuning database.")
    ] = False,
    count: Annotated[int, typer.Option("-n", min=1, help="With --from-db: how many.")] = 1,
    db_path: DbOpt = None,
) -> None:
    """Write a schedule as a TVM trace and/or a record in a MetaSchedule database, which stock
    TVM builds with `ms.tir_integration.compile_tir`."""
    from schedlang import interop

    if ms_db is None and trace_json is None:
        raise SchedlangError("nothing to write", "give --ms-db DIR, --trace-json FILE, or both")
    op = load_op_arg(op_file, define)
    tgt = target_arg(target, arch)
    schedule = schedule_arg(schedule_file, text, schedule_option)
    if from_db:
        if schedule is not None:
            raise SchedlangError("give either a schedule or --from-db, not both")
        from schedlang.tuning.tune import record_schedule

        with open_db(db_path, read_only=True) as db:
            records = best_records_of(db, op, tgt, n=count)
        exports = [(record_schedule(r), {}, r.latencies_s) for r in records]
    else:
        if schedule is None:
            raise SchedlangError("no schedule: give a .sched file, -s TEXT or --from-db")
        knobs = knob_values(knob)
        times = latency or (_measured_latencies(op, schedule, tgt, knobs) if ms_db else ())
        exports = [(schedule, knobs, times)]
    if trace_json is not None:
        best, knobs, _ = exports[0]
        trace = interop.trace_to_json(interop.to_trace(op.func, best, tgt, knobs))
        _write_text(trace_json, json.dumps(trace) + "\n")
        typer.echo(f"wrote the trace ({len(trace[0])} instructions) to {trace_json}")
    for exported_schedule, knobs, times in exports if ms_db else ():
        record = interop.export_metaschedule(
            ms_db, op.func, exported_schedule, tgt, times, knobs=knobs
        )
        runs = len(record.run_secs)
        mean = format_seconds(sum(record.run_secs) / runs)
        done = "added a record" if record.added else "already holds this schedule"
        typer.echo(f"{ms_db}: {done} for {op.name} (mean {mean} over {runs} run{'s' * (runs > 1)})")


def _measured_latencies(op, schedule, tgt, knobs) -> tuple[float, ...]:
    from schedlang.core.target import require_runs_here
    from schedlang.run.build import compile_func
    from schedlang.run.measure import set_runtime_threads, time_kernel, verify

    require_runs_here(tgt)
    set_runtime_threads(tgt.cores if not tgt.is_gpu else None)
    lowered = checked(op, schedule, tgt, knobs, strict=False)
    executable = compile_func(lowered.func, tgt)
    ok, reason = verify(op, executable, tgt)
    if not ok:
        raise SchedlangError(f"wrong result: {reason}", "a wrong schedule is not exported")
    return time_kernel(op, executable, tgt).latencies_s


@command("import")
def import_command(
    op_file: OpArg,
    ms_db: MsDbOpt = None,
    trace: Annotated[
        str | None, typer.Option("--trace", help="A TVM trace as JSON (Trace.as_json).")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option("--target", "-t", help="Only records for this target; checks the result."),
    ] = None,
    arch: ArchOpt = None,
    define: DefineOpt = None,
    output: Annotated[str | None, typer.Option("-o", help="Write the schedule here.")] = None,
    partial: Annotated[
        bool,
        typer.Option("--partial", help="Keep what translates; comment out the rest."),
    ] = False,
) -> None:
    """Turn a MetaSchedule record (the best one of the op) or a TVM trace into schedlang."""
    from schedlang import interop

    if (ms_db is None) == (trace is None):
        raise SchedlangError("give one source: --ms-db DIR or --trace FILE")
    op = load_op_arg(op_file, define)
    tgt = target_arg(target, arch) if target is not None else None
    if ms_db is not None:
        result = interop.import_metaschedule(ms_db, op.func, tgt, partial=partial)
    else:
        result = interop.decompile(
            read_text(trace), op.func, tgt, partial=partial, file=display_name(trace)
        )
    print_diagnostics(result.render())
    if output is None:
        typer.echo(result.text, nl=False)
        return
    _write_text(output, result.text)
    typer.echo(f"wrote {output}")


def _write_text(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as err:
        raise SchedlangError(f"cannot write {path}: {err.strerror}") from None


# --- entry point -------------------------------------------------------------------------------


def main(prog_name: str | None = None) -> None:
    """Console-script entry point (and `python -m schedlang`'s): errors that escape a command (in
    typer itself, or in a command not registered with `@command`) are still reported without a
    traceback."""
    # tvm_ffi imports torch whenever it is installed (the llm extra): 3 of the 4.5 s every command
    # spends importing TVM. Only a local model needs torch; llm._require_llm_packages lifts this.
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    try:
        app(prog_name=prog_name)
    except SchedlangError as err:
        print_diagnostics(err.render())
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except Exception as exc:
        try:
            if isinstance(exc, BrokenPipeError):
                broken_pipe(exc)
            internal_error(exc)
        except typer.Exit as exit_:
            sys.exit(exit_.exit_code)
