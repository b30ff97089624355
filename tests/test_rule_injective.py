"""The injective rule (schedlang/propose/rules/injective.py): an op of spatial blocks only gets its
intermediate blocks inlined, then the generic schedule (`injective`) or, where a block reads its
input transposed, a tiled copy (`injective_tiled`).

It applies to a reshape + transpose + broadcast-add chain and not to a matmul or a row sum; both
templates check clean at every knob point, below and above the size that goes parallel; the
first point of each builds and matches numpy; a block TVM will not inline is scheduled on its
own; and the strides it reads are those of a transpose.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm import te
from tvm.script import tirx as T

from schedlang.checker.check import check
from schedlang.core.diagnostics import render_all
from schedlang.core.ops import Op, from_primfunc
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse
from schedlang.propose.analysis import analyse, inlined, read_strides
from schedlang.propose.builtin import BuiltinProposer, write_templates
from schedlang.propose.interface import Context
from schedlang.propose.rules.injective import SERIAL_BELOW, Injective
from schedlang.run.build import compile_func
from schedlang.run.measure import verify
from tests.rule_points import every_point

CPU = resolve_target("llvm")


def chain(rows: int, cols: int) -> Op:
    """Out[j, i] = X.reshape(rows, cols)[i, j] + bias[i]: a reshape, a transpose, a broadcast
    add, as Relax fusion leaves a PyTorch `x.view(...).transpose(0, 1) + b`."""
    x = te.placeholder((rows * cols,), "float32", name="X")
    bias = te.placeholder((rows,), "float32", name="bias")
    shaped = te.compute((rows, cols), lambda i, j: x[i * cols + j], name="reshape")
    flipped = te.compute((cols, rows), lambda j, i: shaped[i, j], name="transpose")
    out = te.compute((cols, rows), lambda j, i: flipped[j, i] + bias[i], name="add")
    func = te.create_prim_func([x, bias, out])
    return from_primfunc(func, "chain", lambda x, b: x.reshape(rows, cols).T + b[None, :])


def scaled_reshape(rows: int, cols: int) -> Op:
    """Out = 2 * X.reshape(rows, cols): no transpose, only `injective`."""
    x = te.placeholder((rows * cols,), "float32", name="X")
    shaped = te.compute((rows, cols), lambda i, j: x[i * cols + j], name="reshape")
    out = te.compute((rows, cols), lambda i, j: shaped[i, j] * 2.0, name="scale")
    return from_primfunc(
        te.create_prim_func([x, out]), "scaled", lambda x: 2 * x.reshape(rows, cols)
    )


def gelu(rows: int, cols: int) -> Op:
    """GELU as Relax legalizes it: x * (0.5 + erf(x / sqrt 2) * 0.5), one block an operation."""
    import math

    x = te.placeholder((rows, cols), "float32", name="X")
    scaled = te.compute((rows, cols), lambda i, j: x[i, j] * 0.70710678, name="scaled")
    erf = te.compute((rows, cols), lambda i, j: te.erf(scaled[i, j]), name="erf")
    half = te.compute((rows, cols), lambda i, j: erf[i, j] * 0.5, name="half")
    shifted = te.compute((rows, cols), lambda i, j: half[i, j] + 0.5, name="shifted")
    out = te.compute((rows, cols), lambda i, j: x[i, j] * shifted[i, j], name="gelu")
    erf_np = np.vectorize(math.erf)
    return from_primfunc(
        te.create_prim_func([x, out]), "gelu", lambda x: x * (0.5 + erf_np(x / 2**0.5) * 0.5)
    )


def matmul() -> Op:
    a = te.placeholder((32, 16), "float32", name="A")
    b = te.placeholder((16, 48), "float32", name="B")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((32, 48), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return from_primfunc(te.create_prim_func([a, b, c]), "matmul", lambda a, b: a @ b)


def row_sum() -> Op:
    x = te.placeholder((8, 64), "float32", name="x")
    k = te.reduce_axis((0, 64), name="k")
    total = te.compute((8,), lambda i: te.sum(x[i, k], axis=k), name="total")
    return from_primfunc(te.create_prim_func([x, total]), "row_sum", lambda x: x.sum(axis=1))


def families(op: Op) -> dict[str, str]:
    proposer = BuiltinProposer()
    templates = proposer.templates(Context(op, CPU))
    assert not proposer.dropped, [p.note for p in proposer.dropped]
    return {t.extra["family"]: t.text for t in templates}


def test_applies_to_a_spatial_chain_not_to_a_matmul_or_a_reduction() -> None:
    rule = Injective()
    assert rule.applies(analyse(chain(16, 32)), CPU)
    assert not rule.applies(analyse(matmul()), CPU)
    assert not rule.applies(analyse(row_sum()), CPU)
    assert "injective" not in families(matmul()) and "injective" not in families(row_sum())


def test_a_transpose_chain_gets_the_tiled_copy_first_then_the_inlined_chain() -> None:
    written = families(chain(16, 32))
    assert list(written) == ["injective_tiled", "injective", "generic"]
    tiled = written["injective_tiled"]
    for line in ("compute_inline reshape", "compute_inline transpose", "vectorize i.i"):
        assert line in tiled
    assert "parallel" not in tiled  # 512 outputs: one thread
    assert "injective_tiled" not in families(scaled_reshape(16, 32))


@pytest.mark.parametrize("make_op", [chain, scaled_reshape])
@pytest.mark.parametrize("shape", [(16, 32), (512, 1024)], ids=["serial", "parallel"])
def test_every_knob_point_checks_and_the_first_matches_numpy(make_op, shape) -> None:
    op = make_op(*shape)
    written = {k: v for k, v in families(op).items() if k.startswith("injective")}
    assert "injective" in written
    parallel = shape[0] * shape[1] >= SERIAL_BELOW
    for family, text in written.items():
        assert ("parallel" in text) == parallel, family
        points = every_point(text)
        for index, knobs in enumerate(points):
            result = check(parse(text), op.func, CPU, knobs=knobs, template_ok=False)
            assert result.ok, f"{family} at {knobs}:\n{render_all(result.diagnostics, text)}"
            if index == 0:
                ok, reason = verify(op, compile_func(result.lowered.func, CPU), CPU)
                assert ok, f"{family} at {knobs}: {reason}"


@T.prim_func(s_tir=True)
def _guarded(X: T.Buffer((64, 32), "float32"), Y: T.Buffer((64, 32), "float32")):
    half = T.alloc_buffer((64, 32), "float32")
    doubled = T.alloc_buffer((64, 32), "float32")
    for i, j in T.grid(64, 32):
        with T.sblock("half"):
            vi, vj = T.axis.remap("SS", [i, j])
            doubled[vi, vj] = X[vi, vj] * T.float32(2)
    for i, j in T.grid(64, 32):
        with T.sblock("guarded"):
            vi, vj = T.axis.remap("SS", [i, j])
            if vj < 16:
                half[vi, vj] = doubled[vi, vj]
            else:
                half[vi, vj] = T.float32(0)
    for i, j in T.grid(64, 32):
        with T.sblock("out"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = half[vi, vj] + T.float32(1)


def test_a_block_tvm_will_not_inline_is_scheduled_on_its_own() -> None:
    """The `guarded` block is an `if`, not a single store: TVM refuses to inline it."""

    def reference(x):
        return np.where(np.arange(32) < 16, 2 * x, 0).astype("float32") + 1

    op = from_primfunc(_guarded, "guarded", reference)
    assert inlined(analyse(op)).blocks == ("half",)
    text = families(op)["injective"]
    assert "compute_inline half" in text and "compute_inline guarded" not in text
    assert "block guarded:" in text
    result = check(parse(text), op.func, CPU, knobs=every_point(text)[0], template_ok=False)
    assert result.ok, render_all(result.diagnostics, text)
    ok, reason = verify(op, compile_func(result.lowered.func, CPU), CPU)
    assert ok, reason


def test_strides_read_along_the_innermost_loop() -> None:
    """Contiguous 1, transposed the input's row length, before and after inlining."""
    op = chain(16, 32)
    strides = read_strides(op.func)
    assert strides["transpose"] == (32,)  # shaped[i, j] along i: a row of 32
    assert strides["add"] == (1, 1)  # flipped[j, i] and bias[i] along i
    found = inlined(analyse(op))
    assert found.blocks == ("reshape", "transpose")
    assert sorted(found.strides["add"]) == [1, 32]  # bias[i]; X[i * 32 + j], along i


def test_widened_tiles_check_at_every_point() -> None:
    """Widened, the tile sides take other divisors, none under 4 (a 1-wide row: no vector)."""
    op = chain(16, 32)
    drafts = {d.family: d.text for d in write_templates(op, CPU, wide=True)}
    text = drafts["injective_tiled"]
    for knobs in every_point(text):
        assert min(knobs.values()) >= 4, knobs
        result = check(parse(text), op.func, CPU, knobs=knobs, template_ok=False)
        assert result.ok, f"{knobs}:\n{render_all(result.diagnostics, text)}"


@pytest.mark.parametrize("rows", [8, 128])  # 8 x 1024 on one thread, 128 x 1024 parallel
def test_a_gelu_computes_its_erf_as_a_polynomial_and_matches(rows: int) -> None:
    op = gelu(rows, 1024)
    draft = next(d for d in write_templates(op, CPU) if d.family == "injective")
    # Once the blocks before it are inlined, the output block computes the erf: it is rewritten.
    assert "fast_math erf" in draft.text.split("block gelu:")[1]
    assert ("parallel" in draft.text) == (rows * 1024 >= 1 << 14), draft.text
    result = check(parse(draft.text), op.func, CPU, knobs=every_point(draft.text)[0])
    assert result.ok, render_all(result.diagnostics, draft.text)
    assert "T.erf" not in result.lowered.func.script()
    ok, reason = verify(op, compile_func(result.lowered.func, CPU), CPU)
    assert ok, reason


def rotary_like(rows: int, heads: int, half: int) -> Op:
    """A cos table per (row, frequency), read by every head (a rotary embedding's), then the
    same table's read made cheap (a plain scale): only the first is kept out of its reader."""
    x = te.placeholder((rows, heads, 2 * half), "float32", name="X")
    table = te.compute(
        (rows, half), lambda i, j: te.cos((i * half + j).astype("float32") * 0.01), name="table"
    )
    out = te.compute(
        (rows, heads, 2 * half), lambda i, h, d: x[i, h, d] * table[i, d % half], name="out"
    )

    def reference(x):
        angles = (np.arange(rows)[:, None] * half + np.arange(half)[None, :]) * 0.01
        cosines = np.cos(angles.astype("float32"))
        return x * np.concatenate([cosines, cosines], axis=1)[:, None, :]

    return from_primfunc(te.create_prim_func([x, out]), "rotary_like", reference)


def test_a_math_table_read_by_broadcast_is_not_inlined_and_matches() -> None:
    """Inlined, the cosine would run once per head and element, not once per (row, frequency):
    the table stays a block of its own, every template keeps it, and the first point matches.
    A broadcast of a cheap block (the reshape of `chain`) is still inlined."""
    op = rotary_like(13, 6, 32)
    assert inlined(analyse(op)).blocks == ()
    found = BuiltinProposer().templates(Context(op, CPU))
    assert found and all("compute_inline table" not in t.text for t in found)
    text = found[0].text
    result = check(parse(text), op.func, CPU, knobs=every_point(text)[0], template_ok=False)
    assert result.ok, render_all(result.diagnostics, text)
    ok, reason = verify(op, compile_func(result.lowered.func, CPU), CPU)
    assert ok, reason
    assert inlined(analyse(chain(16, 32))).blocks == ("reshape", "transpose")
