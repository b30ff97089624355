"""What the front end promises, for any input: shared by tests/test_fuzz.py and the harnesses.

1. Parsing returns a schedule or Diagnostics (`parse_with_diagnostics` never raises; `parse` raises
   only DiagnosticError), every error span lies inside the text, and a schedule that parses prints
   back (`format_schedule`) to text that reparses to the same AST.
2. `check` returns a CheckResult, lowered exactly when it has no error, and its diagnostics render.
3. A schedule that checks clean builds with `tvm.compile` (llvm, or CUDA C for cuda) and, on llvm,
   computes what the reference computes, writes nothing out of bounds and reads nothing it did not
   write: it runs once in a sandbox worker, its outputs and scratch buffers poisoned and every
   argument inside guard bytes (fuzz/differential.py). When it does not, the checker let a bad
   schedule through: a checker bug.
4. A schedule that checks clean builds within BUILD_LIMIT_S: a slower build ("slow_build") is a
   checker bug too, one the unroll, vector-width and buffer-size rules should have refused. A
   build that never ends is caught by the hard cap, which ends the process ("hang" in
   fuzz/diff_run.py).

A schedule with errors is repaired (the statements with errors dropped, a block section whose
header has an error dropped whole) and checked again, a few times, so that most random schedules
end up clean and reach the build. A property that does not hold raises PropertyFailure with the
case; any other exception escaping is itself the finding.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TextIO

from fuzz.cases import Case, case_op
from fuzz.differential import run_differential
from schedlang.core.diagnostics import Diagnostic, DiagnosticError, SchedlangError, render_all
from schedlang.core.target import Target, resolve_target
from schedlang.lang import nodes
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse, parse_with_diagnostics

MAX_REPAIRS = 3
HARD_CAP_S = 120.0  # one input, parse to verified run
# One check-clean schedule's build (tvm.compile, poisoned on llvm). The checker's build-time
# limits aim at seconds (unroll_max_copies: 2048 statements build in about 2 s on 2 cores);
# half the hard cap leaves room for a loaded machine and still tells a slow build from a hang.
BUILD_LIMIT_S = 60.0
HANG_DIR = Path(__file__).resolve().parent / "crashes"


class PropertyFailure(AssertionError):
    """The front end broke a promise on this input; `kind` says how (a key of
    differential.VERDICTS, "slow_build" (property 4), or "internal" for the front end's own
    promises), `schedule` is the schedule that checked clean, when one did."""

    def __init__(self, message: str, kind: str = "internal", schedule: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.schedule = schedule


@dataclass(frozen=True)
class Outcome:
    """How far an input got: "syntax" (syntax errors), "diagnosed" (errors no repair removed),
    "built" (checked clean and built) or "verified" (and ran correctly on llvm)."""

    stage: str
    repairs: int = 0
    seconds: float = 0.0  # all of it
    build_seconds: float = 0.0  # building (and, for "verified", running) alone


@contextmanager
def hard_cap(what: str, seconds: float = HARD_CAP_S) -> Iterator[None]:
    """Past `seconds`, write `what` (the input) and every thread's stack to
    fuzz/crashes/hang-<pid>.txt and to stderr, and end the process: a hang inside TVM's C++ code
    cannot be interrupted, and pytest's capture would swallow a report written only to stderr.

    A timer thread reports (TVM releases the GIL while it compiles); faulthandler is the backstop
    for code that holds the GIL."""
    _path, report = _hang_report()

    def give_up() -> None:
        text = f"input ran past the hard cap of {seconds:g} s:\n{what}\n"
        for stream in (report, sys.__stderr__):
            stream.write(text)
            stream.flush()
            faulthandler.dump_traceback(file=stream)
        os._exit(3)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(seconds + 10, exit=True, file=report)
    try:
        yield
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()


@cache
def _hang_report() -> tuple[Path, TextIO]:
    """This process's hang report, open for faulthandler; removed at a normal exit."""
    HANG_DIR.mkdir(exist_ok=True)
    path = HANG_DIR / f"hang-{os.getpid()}.txt"
    report = path.open("w", encoding="utf-8")

    def remove() -> None:
        report.close()
        path.unlink(missing_ok=True)

    atexit.register(remove)
    return path, report


# --- 1. parsing ----------------------------------------------------------------------------------


def parse_property(text: str, file: str = "fuzz.sched") -> nodes.Schedule | None:
    """The parser's promises on `text`; the schedule when it has no syntax error."""
    schedule, diagnostics = parse_with_diagnostics(text, file)
    render_all(diagnostics, text)
    _spans_inside(diagnostics, text)
    if schedule is None or any(d.is_error for d in diagnostics):
        try:
            parse(text, file)
        except DiagnosticError:
            return None
        raise PropertyFailure(f"parse accepts what parse_with_diagnostics rejects:\n{text!r}")
    formatted = format_schedule(schedule)
    try:
        reparsed = parse(formatted, file)
    except DiagnosticError as err:
        raise PropertyFailure(
            f"the formatted schedule does not parse: {err.render()}\n{text!r}\n→ {formatted!r}"
        ) from None
    if reparsed != schedule:
        raise PropertyFailure(f"formatting changes the meaning:\n{text!r}\n→ {formatted!r}")
    if format_schedule(reparsed) != formatted:
        raise PropertyFailure(f"formatting is not idempotent:\n{formatted!r}")
    return schedule


def _spans_inside(diagnostics: list[Diagnostic], text: str) -> None:
    lines = text.count("\n") + 1
    for diagnostic in diagnostics:
        span = diagnostic.span
        if span is not None and not 1 <= span.line <= lines:
            raise PropertyFailure(f"diagnostic at line {span.line} of a {lines}-line text")


# --- 2 and 3. checking, building, running --------------------------------------------------------


@cache
def target_of(gpu: bool) -> Target:
    return resolve_target("cuda" if gpu else "llvm")


def run_case(case: Case, *, run: bool = True) -> Outcome:
    """Every property on one case; raises PropertyFailure when one does not hold."""
    start = time.perf_counter()
    schedule = parse_property(case.text)
    if schedule is None:
        return Outcome("syntax", seconds=time.perf_counter() - start)
    op, target = case_op(case), target_of(case.gpu)
    lowered, repairs = None, 0
    while lowered is None:
        result = checked(schedule, op.func, target, case)
        lowered = result.lowered
        if lowered is not None:
            break
        repaired = drop_errors(schedule, result.diagnostics)
        if repaired is None or repairs == MAX_REPAIRS:
            return Outcome("diagnosed", repairs, time.perf_counter() - start)
        schedule, repairs = repaired, repairs + 1
    stage, build_seconds = build_and_compare(op, lowered, target, case, run=run and not case.gpu)
    return Outcome(stage, repairs, time.perf_counter() - start, build_seconds)


def checked(schedule: nodes.Schedule, func, target: Target, case: Case):
    from schedlang.checker.check import check

    result = check(schedule, func, target)  # anything it raises is a finding
    render_all(result.diagnostics, schedule.source)
    _spans_inside(result.diagnostics, schedule.source)
    if (result.lowered is None) == result.ok:
        raise PropertyFailure(f"lowered={result.lowered is not None} but ok={result.ok}")
    return result


def drop_errors(schedule: nodes.Schedule, diagnostics: list[Diagnostic]) -> nodes.Schedule | None:
    """The schedule without the statements that have errors, reparsed; None when an error has no
    line to blame or nothing would change."""
    errors = [d for d in diagnostics if d.is_error]
    if any(d.span is None for d in errors):
        return None
    bad = {d.span.line for d in errors}
    kept: list[nodes.Stmt] = []
    skipping = False
    for stmt in schedule.statements:
        if isinstance(stmt, nodes.BlockHeader):
            skipping = stmt.span.line in bad
        if not skipping and stmt.span.line not in bad:
            kept.append(stmt)
    if len(kept) == len(schedule.statements):
        return None
    text = format_schedule(nodes.Schedule(tuple(kept)))
    return parse(text, schedule.file)


def build_and_compare(op, lowered, target: Target, case: Case, *, run: bool) -> tuple[str, float]:
    """("built" or "verified", seconds the build and run took). On llvm with `run`, the
    differential run (fuzz/differential.py); otherwise a build."""
    from schedlang.run.build import compile_func

    schedule_text = format_schedule(lowered.schedule)
    start = time.perf_counter()
    if run:
        verdict = run_differential(op, lowered.func, target=target)
        if not verdict.ok:
            raise PropertyFailure(
                f"{verdict.describe()}\n{_describe(case, schedule_text)}",
                verdict.kind,
                schedule_text,
            )
        built_in_time(verdict.build_seconds, case, schedule_text)
        return "verified", time.perf_counter() - start
    try:
        compile_func(lowered.func, target)
    except SchedlangError as err:
        raise PropertyFailure(
            f"checks clean but does not build: {err.render()}\n{_describe(case, schedule_text)}",
            "build_error",
            schedule_text,
        ) from None
    built_in_time(time.perf_counter() - start, case, schedule_text)
    return "built", time.perf_counter() - start


def built_in_time(seconds: float, case: Case, schedule_text: str) -> None:
    """Property 4: the build of a check-clean schedule took at most BUILD_LIMIT_S."""
    if seconds > BUILD_LIMIT_S:
        raise PropertyFailure(
            f"checks clean but takes {seconds:.0f} s to build, more than {BUILD_LIMIT_S:g} s\n"
            + _describe(case, schedule_text),
            "slow_build",
            schedule_text,
        )


def _describe(case: Case, schedule_text: str) -> str:
    return f"{case.describe()}\nchecked clean as:\n{schedule_text}"
