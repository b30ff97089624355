"""The reduction rule's `reduce_gather` (schedlang/propose/rules/reduction.py): a reduction along
contiguous axes that whole vectors do not divide (ResNet-18's global average pool, a mean over
7 x 7 of 1 x 512 x 7 x 7, as Relax legalizes it: a sum then a divide) gets its reduction loops
outside V lanes of the innermost output axis, accumulated in registers, the divide folded into
the write-back; before, only the generic template.

Every knob point checks and the first builds and matches numpy; a row sum whose length whole
vectors divide keeps `generic_rfactor` and gets no `reduce_gather`.
"""

from __future__ import annotations

import itertools

from tvm import te, topi

from schedlang.checker.check import check
from schedlang.core.diagnostics import render_all
from schedlang.core.ops import Op, from_primfunc
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse
from schedlang.propose.builtin import BuiltinProposer, op_kind
from schedlang.propose.interface import Context
from schedlang.run.build import compile_func
from schedlang.run.measure import verify

CPU = resolve_target("llvm")


def mean(channels: int = 64, side: int = 7) -> Op:
    x = te.placeholder((1, channels, side, side), "float32", name="x")
    total = topi.sum(x, axis=(2, 3), keepdims=True)
    out = te.compute(total.shape, lambda *i: total(*i) / float(side * side), name="T_divide")
    func = te.create_prim_func([x, out])
    return from_primfunc(func, "mean", lambda x: x.mean(axis=(2, 3), keepdims=True))


def row_sum(cols: int) -> Op:
    x = te.placeholder((8, cols), "float32", name="x")
    out = topi.sum(x, axis=1)
    return from_primfunc(te.create_prim_func([x, out]), "row_sum", lambda x: x.sum(axis=1))


def families(op: Op) -> dict[str, str]:
    proposer = BuiltinProposer()
    templates = proposer.templates(Context(op, CPU))
    assert not proposer.dropped, [p.note for p in proposer.dropped]
    return {t.extra["family"]: t.text for t in templates if not t.extra.get("serial")}


def test_a_mean_over_7x7_gets_the_gather_first() -> None:
    op = mean()
    assert op_kind(op, CPU) == "reduction"
    written = families(op)
    assert list(written) == ["reduce_gather", "generic"]
    text = written["reduce_gather"]
    assert "split ax1 by V" in text and "vectorize ax1.i" in text
    assert "reverse_compute_inline T_divide" in text


def test_a_row_sum_of_whole_vectors_keeps_rfactor() -> None:
    assert list(families(row_sum(64))) == ["generic_rfactor", "generic"]
    assert "reduce_gather" in families(row_sum(49))


def test_every_knob_point_checks_and_the_first_matches_numpy() -> None:
    for op in (mean(), mean(channels=40, side=5), row_sum(49)):
        text = families(op)["reduce_gather"]
        params = parse(text).params
        names = [p.name.text for p in params]
        grid = itertools.product(*(p.choices for p in params))
        for index, values in enumerate(grid):
            knobs = dict(zip(names, values, strict=True))
            result = check(parse(text), op.func, CPU, knobs=knobs, template_ok=False)
            assert result.ok, f"{op.name} at {knobs}:\n{render_all(result.diagnostics, text)}"
            if index == 0:
                ok, reason = verify(op, compile_func(result.lowered.func, CPU), CPU)
                assert ok, f"{op.name} at {knobs}: {reason}"
