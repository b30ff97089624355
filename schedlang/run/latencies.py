"""A schedule's run times measured here, for a record that stock TVM reads (`export --ms-db`)."""

from __future__ import annotations

from collections.abc import Callable

from schedlang.checker.check import check
from schedlang.core.diagnostics import DiagnosticError, SchedlangError, render_all
from schedlang.core.target import require_runs_here
from schedlang.run.build import compile_func
from schedlang.run.measure import set_runtime_threads, time_kernel, verify


def measured_latencies(
    op, schedule, tgt, knobs: dict[str, int], *, warn: Callable[[str], None]
) -> tuple[float, ...]:
    """Check, build, verify and time `schedule`; the seconds of each timed run. Warnings go to
    `warn` as rendered text; a wrong result is a SchedlangError (it must not be exported)."""
    require_runs_here(tgt)
    set_runtime_threads(tgt.cores if not tgt.is_gpu else None)
    result = check(schedule, op.func, tgt, knobs=knobs, strict=False)
    if result.lowered is None:
        raise DiagnosticError(result.diagnostics, schedule.source)
    warnings = [d for d in result.diagnostics if not d.is_error]
    if warnings:
        warn(render_all(warnings, schedule.source))
    executable = compile_func(result.lowered.func, tgt)
    ok, reason = verify(op, executable, tgt)
    if not ok:
        raise SchedlangError(f"wrong result: {reason}", "a wrong schedule is not exported")
    return time_kernel(op, executable, tgt).latencies_s
