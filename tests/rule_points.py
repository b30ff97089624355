"""What a rule's tests ask of the built-in proposer: an op's templates by family, and every knob
point of a template."""

from __future__ import annotations

import itertools

from schedlang.core.ops import Op
from schedlang.core.target import Target
from schedlang.lang.syntax import parse
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Context


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
