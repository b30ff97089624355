"""The GEMV rule (schedlang/propose/rules/gemv.py): a matmul of at most four rows (a batch-1
dense, y = x W + b) gets `gemv_columns` when W is read W[k, j] (the columns vectorized and
accumulated in registers over all of k) or `gemv_dot` when it is W[j, k] (a dot product per
column, vectorized along k by rfactor) or `gemv_panels` when W is stored as column panels
W[j // P, k, j % P] (a decoder's projections: each panel's P columns in registers over all of
k), then the generic template; a matmul of more rows keeps the matmul templates, and with W in
panels `matmul_panels` reads them as they are (no copy).

Every knob point checks, and the first point of each template builds and matches numpy, with
and without a bias, at one row and at three.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from schedlang.checker.check import check
from schedlang.core.diagnostics import render_all
from schedlang.core.ops import Op, from_primfunc
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse
from schedlang.propose.analysis import analyse
from schedlang.propose.builtin import op_kind
from schedlang.propose.rules.gemv import Gemv
from schedlang.run.codegen import compile_func
from tests.rule_points import check_every_point, every_point
from tests.rule_points import families as rule_families

CPU = resolve_target("llvm")


def _with_bias(params: list, y: te.Tensor, bias: bool) -> tuple[list, te.Tensor]:
    """The GEMV's parameters and output, with `+ b` (b of the output's columns) when `bias`."""
    if not bias:
        return params, y
    rows, n = y.shape
    b = te.placeholder((n,), "float32", name="b")
    return [*params, b], te.compute((rows, n), lambda i, j: y[i, j] + b[j], name="Z")


def dense(rows: int, n: int = 200, k: int = 64, transposed: bool = False, bias: bool = True) -> Op:
    """Y = X W (+ b): W is K x N, or N x K read transposed (`transposed`, a Linear's weight)."""
    x = te.placeholder((rows, k), "float32", name="X")
    w = te.placeholder((n, k) if transposed else (k, n), "float32", name="W")
    r = te.reduce_axis((0, k), name="k")
    y = te.compute(
        (rows, n),
        lambda i, j: te.sum(x[i, r] * (w[j, r] if transposed else w[r, j]), axis=r),
        name="Y",
    )
    params, y = _with_bias([x, w], y, bias)

    def reference(x, w, b=None):
        out = x @ (w.T if transposed else w)
        return out + b if b is not None else out

    name = f"dense{rows}_{'t' if transposed else 'n'}{'_bias' if bias else ''}"
    return from_primfunc(te.create_prim_func([*params, y]), name, reference)


def families(op: Op) -> dict[str, str]:
    return rule_families(op, CPU)


def test_applies_to_a_few_rows_not_to_a_matmul() -> None:
    assert Gemv().applies(analyse(dense(1)), CPU) and Gemv().applies(analyse(dense(4)), CPU)
    assert not Gemv().applies(analyse(dense(16)), CPU)
    assert op_kind(dense(1), CPU) == "gemv" and op_kind(dense(16), CPU) == "matmul"


def test_the_weight_layout_chooses_the_template() -> None:
    assert list(families(dense(1))) == ["gemv_columns", "generic"]
    assert list(families(dense(1, transposed=True))) == ["gemv_dot", "generic"]
    columns = families(dense(1))["gemv_columns"]
    assert "reverse_compute_inline Z" in columns and "vectorize j.i" in columns
    assert "rfactor k.i" in families(dense(1, transposed=True))["gemv_dot"]


@pytest.mark.parametrize("transposed", [False, True], ids=["W[k,j]", "W[j,k]"])
@pytest.mark.parametrize(("rows", "bias"), [(1, True), (3, True), (1, False)])
def test_every_knob_point_checks_and_the_first_matches_numpy(rows, bias, transposed) -> None:
    op = dense(rows, transposed=transposed, bias=bias)
    written = {k: v for k, v in families(op).items() if k.startswith("gemv")}
    assert len(written) == 1
    check_every_point(op, written, CPU)


def paneled(rows: int, n: int = 256, k: int = 64, panel: int = 32, bias: bool = True) -> Op:
    """Y = X W (+ b) with W [n, k] stored as panels [n / P, k, P] (decoder.weights.as_panels)."""
    x = te.placeholder((rows, k), "float32", name="X")
    w = te.placeholder((n // panel, k, panel), "float32", name="W")
    r = te.reduce_axis((0, k), name="k")
    y = te.compute(
        (rows, n), lambda i, j: te.sum(x[i, r] * w[j // panel, r, j % panel], axis=r), name="Y"
    )
    params, y = _with_bias([x, w], y, bias)

    def reference(x, w, b=None):
        out = x @ w.transpose(1, 0, 2).reshape(k, n)
        return out + b if b is not None else out

    return from_primfunc(te.create_prim_func([*params, y]), f"panels{rows}", reference)


def test_weights_in_panels_get_gemv_panels_and_matmul_panels_without_a_copy() -> None:
    assert list(families(paneled(1))) == ["gemv_panels", "generic"]
    text = families(paneled(1))["gemv_panels"]
    assert "split j by *, 32" in text and "vectorize j.i" in text and "rfactor" not in text
    matmul = families(paneled(16, bias=False))
    assert list(matmul) == ["matmul_panels", "matmul_tiled"]
    assert "cache_read" not in matmul["matmul_panels"]  # B is in panels already
    assert "split j by *, 32" in matmul["matmul_panels"]


@pytest.mark.parametrize(("rows", "bias", "panel"), [(1, True, 32), (3, True, 32), (1, False, 8)])
def test_every_gemv_panels_point_checks_and_the_first_matches_numpy(rows, bias, panel) -> None:
    op = paneled(rows, bias=bias, panel=panel)
    check_every_point(op, {"gemv_panels": families(op)["gemv_panels"]}, CPU)


def test_every_matmul_panels_point_on_panels_checks_and_the_first_matches_numpy() -> None:
    op = paneled(16, bias=False)
    check_every_point(op, {"matmul_panels": families(op)["matmul_panels"]}, CPU)


def test_matmul_panels_at_a_symbolic_row_count_runs_whole_row_blocks_unguarded() -> None:
    """A prefill's GEMM: the schedule chosen at 128 rows, built once with the row count symbolic
    (decoder.tuning). The partition hint splits the row blocks into whole ones, whose register
    tile has no guard, and the tail; right at any row count (one row, a tail or none). At 128
    rows, one row block, both cores share the row block's column panels."""
    text = families(paneled(128, bias=False))["matmul_panels"]
    assert "pragma_loop_partition_hint=1" in text
    wide = families(paneled(128, n=64 * CPU.cores, bias=False))["matmul_panels"]
    assert "parallel j.o" in wide and "annotate i.1 pragma_loop_partition_hint=1" in wide
    symbolic = paneled(te.var("n"), bias=False)
    knobs = every_point(text)[0]
    result = check(parse(text), symbolic.func, CPU, knobs=knobs, template_ok=False)
    assert result.ok, render_all(result.diagnostics, text)
    partitioned: list[str] = []

    @tvm.instrument.pass_instrument
    class Keep:
        def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
            if info.name == "s_tir.LoopPartition":
                partitioned.append(mod["main"].script())

    with tvm.transform.PassContext(opt_level=3, instruments=[Keep()]):
        built = compile_func(result.lowered.func, CPU)
    # Two copies of the tile: the whole tiles' or row blocks' (every guard folded to True) and
    # the tail's.
    assert partitioned and partitioned[0].count("T.bool(True)") >= 3
    rng = np.random.default_rng(0)
    for rows in (1, 13, 16, 120, 128, 1024):
        x = rng.standard_normal((rows, 64), dtype="float32")
        w = rng.standard_normal((8, 64, 32), dtype="float32")
        y = tvm.runtime.tensor(np.zeros((rows, 256), "float32"))
        built(tvm.runtime.tensor(x), tvm.runtime.tensor(w), y)
        want = x @ w.transpose(1, 0, 2).reshape(64, 256)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
