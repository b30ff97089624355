"""The typer app and how every command reports: output options, JSON documents, diagnostics on
stderr, the exit codes (the package docstring lists them), and `@command`, which registers a
command so that none of that is written again in it."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Annotated, NoReturn, ParamSpec, TypeVar

import typer

from schedlang import __version__
from schedlang.cli.options import QuietOpt, VerboseOpt
from schedlang.core.diagnostics import SchedlangError, error

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
    color: bool = True  # `--no-color` turns it off; so does NO_COLOR, or output that is no terminal


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


def warn(text: str) -> None:
    """Rendered warnings to stderr, unless --quiet."""
    if not OUTPUT.quiet:
        print_diagnostics(text)


def colors(stream) -> bool:
    """Whether to colour what goes to `stream` (sys.stdout, sys.stderr): only a terminal, and not
    with `--no-color` or NO_COLOR (https://no-color.org), so that tests and pipes see plain text."""
    return OUTPUT.color and not os.environ.get("NO_COLOR") and stream.isatty()


def print_schedule(text: str, language: str = "schedlang") -> None:
    """A schedule (or, with language="diff", a diff of schedules) on stdout, highlighted by the
    schedlang lexer (schedlang.lang.lexer) where `colors` allows."""
    if not colors(sys.stdout):
        typer.echo(text)
        return
    from rich.console import Console
    from rich.syntax import Syntax

    from schedlang.lang.lexer import SchedlangLexer

    lexer = SchedlangLexer() if language == "schedlang" else language
    # The terminal's own colours (ansi_*) and background: readable on a light or dark terminal.
    syntax = Syntax(text, lexer, theme="ansi_dark", background_color="default", word_wrap=False)
    Console(file=sys.stdout, force_terminal=True, soft_wrap=True).print(syntax)


def print_diagnostics(text: str) -> None:
    """Rendered diagnostics to stderr; coloured only where `colors` allows, so tests and pipes
    see exactly the plain text."""
    if not text:
        return
    if not colors(sys.stderr):
        typer.echo(text, err=True)
        return
    from rich.console import Console
    from rich.text import Text

    styled = Text(text)
    styled.highlight_regex(_SEVERITY, lambda word: "bold red" if word == "error" else "bold yellow")
    styled.highlight_regex(_MARKERS, "bold green")
    styled.highlight_regex(_NOTES, "bold cyan")
    Console(stderr=True, highlight=False, soft_wrap=True).print(styled)


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
    no_color: Annotated[
        bool,
        typer.Option(
            "--no-color", help="No colours, even on a terminal (as the NO_COLOR variable does)."
        ),
    ] = False,
) -> None:
    """A schedule language for Apache TVM."""
    if quiet and verbose:
        typer.echo("error: give --quiet or --verbose, not both", err=True)
        raise typer.Exit(1)
    # One invocation's options (tests run many invocations in one process).
    OUTPUT.command, OUTPUT.json, OUTPUT.quiet, OUTPUT.verbose = "", False, quiet, verbose
    OUTPUT.color = not no_color
