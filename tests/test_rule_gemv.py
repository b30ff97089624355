"""The GEMV rule (schedlang/propose/rules/gemv.py): a matmul of at most four rows (a batch-1
dense, y = x W + b) gets `gemv_columns` when W is read W[k, j] (the columns vectorized and
accumulated in registers over all of k) or `gemv_dot` when it is W[j, k] (a dot product per
column, vectorized along k by rfactor), then the generic template; a matmul of more rows keeps
the matmul templates.

Every knob point checks, and the first point of each template builds and matches numpy, with
and without a bias, at one row and at three.
"""

from __future__ import annotations

import pytest
from tvm import te

from schedlang.core.ops import Op, from_primfunc
from schedlang.core.target import resolve_target
from schedlang.propose.analysis import analyse
from schedlang.propose.builtin import op_kind
from schedlang.propose.rules.gemv import Gemv
from tests.rule_points import check_every_point
from tests.rule_points import families as rule_families

CPU = resolve_target("llvm")


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
    params = [x, w]
    if bias:
        b = te.placeholder((n,), "float32", name="b")
        y = te.compute((rows, n), lambda i, j: y[i, j] + b[j], name="Z")
        params.append(b)

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
