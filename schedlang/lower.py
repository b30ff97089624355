"""Check a schedule and lower it: `lower(schedule, func, target)` → a scheduled PrimFunc.

The pipeline's entry point: the checker (schedlang.check) walks the statements over a live
schedule, applying each one that passes its guards (schedlang.lowering), so the checked schedule
is the lowered one. Lowering is pure: `func` is never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping

from tvm import tirx

from schedlang import ast, make_callable
from schedlang.check import check
from schedlang.diagnostics import DiagnosticError
from schedlang.lowering import (
    SCHEDULED_ATTR,
    Lowered,
    apply_statement,
    bind_knobs,
    finish,
    tvm_reason,
)
from schedlang.target import Target

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
    schedule: ast.Schedule,
    func: tirx.PrimFunc,
    target: Target,
    knobs: Mapping[str, int] | None = None,
    *,
    strict: bool = False,
) -> Lowered:
    """Check and apply a concrete schedule (or a template with every knob given in `knobs`)."""
    result = check(schedule, func, target, knobs=knobs, strict=strict, template_ok=False)
    if result.lowered is None:
        raise DiagnosticError(result.diagnostics, schedule.source)
    return result.lowered


# Importing this module rebinds the package attribute `lower` to it: let
# `schedlang.lower(...)` still call lower().
make_callable(__name__)
