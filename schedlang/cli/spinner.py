"""A spinner with the time elapsed on stderr while a build runs long (`compile` and `run`).

LLVM takes seconds to minutes on a large kernel, and a command that sits silent that long looks
hung. The library tells when a build starts and ends (`schedlang.run.build.watching_builds`);
this shows a rich status line once a build has run `DELAY_S`, and nothing for a quick one: only
on a terminal, and not with --quiet or --json.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from schedlang.cli.app import OUTPUT
from schedlang.core.units import format_seconds

if TYPE_CHECKING:
    from schedlang.core.target import Target

DELAY_S = 1.0  # a build shorter than this shows nothing


class Elapsed:
    """`building for llvm (3.2 s)`: rich renders it anew on each frame of the spinner."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic):
        self.what, self.clock, self.started = what, clock, clock()

    def __rich__(self) -> str:
        return f"{self.what} ({format_seconds(self.clock() - self.started)})"


class DelayedStatus:
    """A context manager: `start(text)` is called with an `Elapsed` once `delay_s` has passed
    inside it (never if it ends first), and the status it returned is stopped at the end.
    `start` is a rich Console's `status`; a test gives its own."""

    def __init__(self, what: str, start: Callable[[Any], Any], delay_s: float | None = None):
        self.what, self.start = what, start
        self.delay_s = DELAY_S if delay_s is None else delay_s
        self.status: Any = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def __enter__(self) -> DelayedStatus:
        text = Elapsed(self.what)
        self._timer = threading.Timer(self.delay_s, self._show, (text,))
        self._timer.daemon = True
        self._timer.start()
        return self

    def _show(self, text: Elapsed) -> None:
        with self._lock:
            if self._timer is not None:  # not ended meanwhile
                self.status = self.start(text)
                self.status.start()

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self.status is not None:
                self.status.stop()
                self.status = None


def shows_spinner() -> bool:
    return sys.stderr.isatty() and not OUTPUT.quiet and not OUTPUT.json


@contextmanager
def build_spinner() -> Iterator[None]:
    """Within it, a build that runs past DELAY_S shows a spinner (when `shows_spinner()`)."""
    if not shows_spinner():
        yield
        return
    from rich.console import Console

    from schedlang.run.build import watching_builds

    console = Console(stderr=True)

    def watcher(target: Target) -> DelayedStatus:
        return DelayedStatus(f"building for {target.kind}", console.status)

    with watching_builds(watcher):
        yield
