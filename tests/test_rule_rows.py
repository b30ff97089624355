"""The rows rule (schedlang/propose/rules/rows.py) on row-wise ops of more than two axes, as
Relax legalizes a PyTorch model's: a layer norm over the last axis of 1 x S x D (its mean a block
of the row loops only) and a softmax over the last axis of 1 x H x S x S followed by a copy
(`fused_softmax_broadcast_to`). Their row loops are fused into one parallel loop, every other
block is computed per row inside it, and they get `rows` (and `rows_fast_exp` for the softmax)
before the reduction rule's `generic_rfactor`, which they got before.

The first point and eight seeded points check, and the first point builds and matches numpy.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from tvm import te, topi

from schedlang.checker.check import check
from schedlang.core.diagnostics import render_all
from schedlang.core.ops import Op, from_primfunc
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse
from schedlang.propose.analysis import analyse, row_blocks
from schedlang.propose.builtin import BuiltinProposer, op_kind
from schedlang.propose.interface import Context
from schedlang.run.build import compile_func
from schedlang.run.measure import verify

CPU = resolve_target("llvm")


def layer_norm(seq: int = 16, dim: int = 64) -> Op:
    x = te.placeholder((1, seq, dim), "float32", name="x")
    gamma = te.placeholder((dim,), "float32", name="gamma")
    beta = te.placeholder((dim,), "float32", name="beta")
    out = topi.nn.layer_norm(x, gamma, beta, axis=[2], epsilon=1e-5)

    def reference(x, gamma, beta):
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * gamma + beta

    return from_primfunc(te.create_prim_func([x, gamma, beta, out]), "layer_norm", reference)


def softmax_copy(heads: int = 2, seq: int = 32) -> Op:
    x = te.placeholder((1, heads, seq, seq), "float32", name="x")
    soft = topi.nn.softmax(x, axis=-1)
    out = te.compute(soft.shape, lambda *i: soft(*i), name="T_broadcast_to")

    def reference(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return from_primfunc(te.create_prim_func([x, out]), "softmax_copy", reference)


def templates(op: Op) -> dict[str, str]:
    proposer = BuiltinProposer()
    found = proposer.templates(Context(op, CPU))
    assert not proposer.dropped, [p.note for p in proposer.dropped]
    return {t.extra["family"]: t.text for t in found if not t.extra.get("serial")}


def test_row_loops_of_more_than_one_axis_make_rows() -> None:
    assert row_blocks(analyse(layer_norm()), CPU.cores)
    assert row_blocks(analyse(softmax_copy()), CPU.cores)
    assert op_kind(layer_norm(), CPU) == "rows" and op_kind(softmax_copy(), CPU) == "rows"
    assert list(templates(layer_norm())) == ["rows", "generic"]
    assert list(templates(softmax_copy())) == ["rows_fast_exp", "rows", "generic"]


def test_the_row_loops_are_fused_and_every_block_computed_per_row() -> None:
    text = templates(layer_norm())["rows"]
    assert "fuse ax0, ax1 as row" in text and "parallel row.o" in text
    for block in ("x_sum", "x_sum_rf", "x_mean", "x_var_sum", "x_var_sum_rf"):
        assert f"compute_at {block} row.i" in text
    assert "block x_mean:" not in text  # its loops are the row's: nothing left to schedule
    softmax = templates(softmax_copy())["rows_fast_exp"]
    assert "fuse i0, i1, i2 as row" in softmax and "compute_at T_softmax_norm row.i" in softmax


@pytest.mark.parametrize("make_op", [layer_norm, softmax_copy])
def test_sampled_points_check_and_the_first_matches_numpy(make_op) -> None:
    op = make_op()
    for family, text in templates(op).items():
        if not family.startswith("rows"):
            continue
        params = parse(text).params
        rng = random.Random(0)
        points = [{p.name.text: next(iter(p.choices)) for p in params}]
        points += [{p.name.text: rng.choice(list(p.choices)) for p in params} for _ in range(8)]
        for index, knobs in enumerate(points):
            result = check(parse(text), op.func, CPU, knobs=knobs, template_ok=False)
            assert result.ok, f"{family} at {knobs}:\n{render_all(result.diagnostics, text)}"
            if index == 0:
                ok, reason = verify(op, compile_func(result.lowered.func, CPU), CPU)
                assert ok, f"{family} at {knobs}: {reason}"
