"""A workflow's events shown on stderr: a progress bar per tuning run (a line per candidate when
stderr is not a terminal, or with --verbose), notes as lines; what a command adds (a model's
plans, its rounds, a build's steps) it renders in its own handler."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from schedlang.cli.app import OUTPUT, info, warn
from schedlang.workflows.events import (
    Event,
    Note,
    TaskFinished,
    TaskStarted,
    TrialMeasured,
)

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class TuneProgress:
    """The sink a tuning command passes: a rich progress bar from TaskStarted to TaskFinished,
    on stderr, so that stdout holds only the result (`tune --json > summary.json`); the events it
    does not show go to `then`."""

    def __init__(self, then: Callable[[Event], None] | None = None):
        self.then = then
        self.terminal = sys.stderr.isatty()
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, TaskStarted):
            self._start(event)
        elif isinstance(event, TrialMeasured):
            self._measured(event)
        elif isinstance(event, TaskFinished):
            if self.bar is not None:
                self.bar.stop()
                self.bar = None
        elif isinstance(event, Note):
            (warn if event.warning else info)(event.text)
        elif self.then is not None:
            self.then(event)

    def _start(self, event: TaskStarted) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        columns = (
            TextColumn("[bold]tuning {task.fields[op]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("best {task.fields[best]}  failed {task.fields[failed]}"),
            TimeElapsedColumn(),
        )
        console = Console(stderr=True)
        self.bar = Progress(*columns, console=console, disable=not self.terminal or OUTPUT.quiet)
        self.bar.start()
        self.task = self.bar.add_task("tune", total=event.trials, op=event.name, best="-", failed=0)

    def _measured(self, event: TrialMeasured) -> None:
        best = f"{event.best.gflops:.1f} GFLOP/s" if event.best else "-"
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=event.done, best=best, failed=event.failures)
        if OUTPUT.quiet:
            return
        if not self.terminal or OUTPUT.verbose:  # --verbose: a line per candidate on a terminal too
            last = event.last
            figure = f"{last.gflops:.2f} GFLOP/s" if last.gflops else last.reason
            typer.echo(f"[{event.done}/{event.total}] {last.status}: {figure}", err=True)
