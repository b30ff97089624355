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
    schedlang report DB [-o report.html] [--open]
    schedlang export OP.py [SCHEDULE] [--ms-db DIR] [--trace-json FILE] [--from-db]
    schedlang import OP.py (--ms-db DIR | --trace FILE) [-o FILE] [--partial]
    schedlang tune-model MODEL.py [--trials N] [--db PATH]
    schedlang build-model MODEL.py [--db PATH] [-o lib.so] [--compare] [--profile] [--json]
    schedlang generate MODEL [--prompt-tokens N] [--new-tokens N] [--max-length N]
    schedlang eval-model (--model DIR|ID | --endpoint URL --model-name NAME) [--ops OP,…]
                         [-D [OP.]NAME=V] [--trials N] [--metaschedule] [-o OUT]
    schedlang eval-model --compare A.json B.json
    schedlang dataset DB -o DATA.jsonl [--split FRACTION] [--seed S]
    schedlang train DB|DATA.jsonl -o DIR [--base MODEL] [--steps N] [--seed S] [--resume]

A schedule is taken the same way by every command that takes one: `OP [SCHEDULE]` positional,
`-s TEXT` inline, `--schedule FILE` as an alias of the positional. `python -m schedlang` is the
same program. docs/cli.md documents the JSON output (`--json`) and the exit codes.

Each command calls library functions and prints their result. Exit codes: 0 success; 1 a problem
with the input (diagnostics on stderr, or `fmt --check` found files to reformat); 2 a bug in
schedlang ("internal error", with `SCHEDLANG_TRACEBACK=1` or `--verbose` to see the traceback;
click also uses 2 for a bad command line); 130 interrupted (Ctrl-C); 141, silently, when the
reader of stdout closed it (`| head`).

The package, one module per command group (each parses its options, calls the library, renders
the result):

    app.py       the typer app, how commands report (JSON, diagnostics, exit codes), `@command`
    options.py   options several commands take, declared once; option groups, `@expands_options`
    inputs.py    reading op files, targets, schedules, knob values, the database
    compile.py   fmt, parse, show, check, compile, run
    tune.py      tune
    db.py        best, history, report
    llm.py       eval-model
    learn.py     dataset, train
    model.py     tune-model, build-model
    generate.py  generate
    remote.py    rpc-status, rpc-server
    interop.py   export, import

Adding a command: put it in the module of its group (or a new one, imported below in the order
`--help` lists the commands), decorate it with `@command()` (not `@app.command()`), so that a
`SchedlangError` it raises becomes rendered diagnostics on stderr and exit code 1 rather than a
traceback. Options another command already takes come from options.py; a group of options goes
in a dataclass, taken as one parameter with `@expands_options`. Import heavy modules (tvm, the op
loader, lowering) inside the command body: `--version`, `fmt` and `parse` must start fast.
"""

from __future__ import annotations

import sys

import typer

from schedlang.cli.app import (
    INTERNAL_ERROR_EXIT,
    OUTPUT,
    SIGPIPE_EXIT,
    app,
    broken_pipe,
    command,
    internal_error,
    print_diagnostics,
    reports_errors,
)
from schedlang.core.diagnostics import SchedlangError
from schedlang.core.imports import defer_torch

# The command modules register their commands on `app` when imported, in the order `--help`
# lists them.
# isort: off
from schedlang.cli import compile  # noqa: F401
from schedlang.cli import tune  # noqa: F401
from schedlang.cli import db  # noqa: F401
from schedlang.cli import llm  # noqa: F401
from schedlang.cli import learn  # noqa: F401
from schedlang.cli import model  # noqa: F401
from schedlang.cli import generate  # noqa: F401
from schedlang.cli import remote  # noqa: F401
from schedlang.cli import interop  # noqa: F401
# isort: on

__all__ = [
    "INTERNAL_ERROR_EXIT",
    "OUTPUT",
    "SIGPIPE_EXIT",
    "SchedlangError",
    "app",
    "command",
    "main",
    "reports_errors",
]


def main(prog_name: str | None = None) -> None:
    """Console-script entry point (and `python -m schedlang`'s): errors that escape a command (in
    typer itself, or in a command not registered with `@command`) are still reported without a
    traceback."""
    # tvm_ffi imports torch whenever it is installed (the llm extra): 3 of the 4.5 s every command
    # spends importing TVM. Lifted for a user's op or model file and for a local model.
    defer_torch()
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
