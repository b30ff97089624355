"""What a rule's tests ask of the built-in proposer: an op's templates by family, every knob
point of a template, and each point checked (the first one run against the reference)."""

from __future__ import annotations

import itertools

from schedlang.checker.check import check
from schedlang.core.diagnostics import render_all
from schedlang.core.ops import Op
from schedlang.core.target import Target
from schedlang.lang.syntax import parse
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Context
from schedlang.run.build import compile_func
from schedlang.run.measure import verify


def families(op: Op, target: Target) -> dict[str, str]:
    """The op's templates on `target` by family (their parallel forms), none dropped."""
    proposer = BuiltinProposer()
    templates = proposer.templates(Context(op, target))
    assert not proposer.dropped, [p.note for p in proposer.dropped]
    return {t.extra["family"]: t.text for t in templates if not t.extra.get("serial")}


def every_point(text: str) -> list[dict[str, int]]:
    params = parse(text).params
    names = [p.name.text for p in params]
    grid = itertools.product(*(p.choices for p in params))
    return [dict(zip(names, values, strict=True)) for values in grid]


def check_every_point(op: Op, written: dict[str, str], target: Target) -> None:
    """Every knob point of each template in `written` (by family) checks clean on `target`, and
    the first point of each computes what the op's reference does."""
    for family, text in written.items():
        for index, knobs in enumerate(every_point(text)):
            result = check(parse(text), op.func, target, knobs=knobs, template_ok=False)
            assert result.ok, f"{family} at {knobs}:\n{render_all(result.diagnostics, text)}"
            if index == 0:
                ok, reason = verify(op, compile_func(result.lowered.func, target), target)
                assert ok, f"{family} at {knobs}: {reason}"
