"""Check a schedule and lower it: `lower(schedule, func, target)` → a scheduled PrimFunc.

The pipeline's entry point: the checker (schedlang.checker.check) walks the statements over a live
schedule, applying each one that passes its guards (schedlang.checker.primitives), so the checked
schedule is the lowered one. Lowering is pure: `func` is never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping

from tvm import tirx

from schedlang.checker.check import check
from schedlang.checker.primitives import (
    SCHEDULED_ATTR,
    Lowered,
    apply_statement,
    bind_knobs,
    finish,
    tvm_reason,
)
from schedlang.core.diagnostics import DiagnosticError
from schedlang.core.target import Target
from schedlang.lang import nodes

__all__ = [
    "SCHEDULED_ATTR",
    "Lowered",
    "apply_statement",
    "bind_knobs",
    "finish",
    "lower",
    "tvm_reason",
]


def lower(
    schedule: nodes.Schedule,
    func: tirx.PrimFunc,
    target: Target,
    knobs: Mapping[str, int] | None = None,
    *,
    strict: bool = False,
    partial: bool = False,
) -> Lowered:
    """Check and apply a concrete schedule (or a template with every knob given in `knobs`);
    `partial`: the result is finished by something else before a build (schedlang.check)."""
    result = check(
        schedule, func, target, knobs=knobs, strict=strict, template_ok=False, partial=partial
    )
    if result.lowered is None:
        raise DiagnosticError(result.diagnostics, schedule.source)
    return result.lowered
