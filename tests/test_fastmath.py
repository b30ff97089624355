"""`fast_math exp` (`erf`): a block's float32 `exp` (`erf`) becomes schedlang.lang.fastexp's
polynomial.

It parses and prints back; misuse (a block without exp, another dtype, an unknown block or
function) is reported like any checker error (golden files in tests/golden/fastmath/); the
lowered block holds no `exp` call and its loop vectorizes without one; softmax built with it
passes the verifier; and the values at the ends of float32's range match numpy's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx

from schedlang.checker.check import check
from schedlang.checker.pipeline import SCHEDULED_ATTR, lower
from schedlang.core.diagnostics import render_all
from schedlang.core.ops import default_tolerance, load_op
from schedlang.core.target import resolve_target
from schedlang.lang import fastexp, nodes
from schedlang.lang.printer import format_stmt
from schedlang.lang.statements.fastmath import FastMath
from schedlang.lang.syntax import parse, parse_with_diagnostics
from schedlang.run.build import build
from schedlang.run.codegen import compile_func
from schedlang.run.outcome import compare_outputs

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CPU = resolve_target("llvm")


def softmax(rows: int = 64, cols: int = 64):
    return load_op(str(EXAMPLES / "softmax.py"), {"rows": str(rows), "cols": str(cols)}).func


def elementwise_exp(values: int, dtype: str = "float32", function=te.exp):
    x = te.placeholder((values,), dtype, name="x")
    y = te.compute((values,), lambda i: function(x[i]), name="y")
    return te.create_prim_func([x, y])


def exp_of_sum():
    """exp applied inside a reduction block (its body, not its own block)."""
    x = te.placeholder((8, 64), "float32", name="x")
    k = te.reduce_axis((0, 64), name="k")
    s = te.compute((8,), lambda i: te.sum(te.exp(x[i, k]), axis=k), name="s")
    return te.create_prim_func([x, s])


# --- syntax --------------------------------------------------------------------------------------


def test_parses_and_prints_back() -> None:
    (_header, stmt) = parse("block exp:\n  fast_math   exp\n").statements
    assert isinstance(stmt, FastMath) and stmt.function.text == "exp"
    assert format_stmt(stmt) == "fast_math exp"
    assert parse(format_stmt(stmt)).statements == (stmt,)


@pytest.mark.parametrize(
    ("text", "name"),
    [("fast_math tanh\n", "function_unknown"), ("fast_math erff\n", "function_glued")],
)
def test_a_function_without_a_fast_form_is_a_syntax_error(text, name, golden) -> None:
    # `erff` starts with `erf`: it is one unknown word, not `erf` followed by `f`.
    _, diagnostics = parse_with_diagnostics(text, f"{name}.sched")
    golden(
        f"fastmath/{name}.txt",
        f"-- {name}.sched --\n{text}-- diagnostics --\n{render_all(diagnostics, text)}\n",
    )


# --- misuse --------------------------------------------------------------------------------------

MISUSES = [
    ("no_exp_in_block", softmax, "block row_max:\n  fast_math exp\n"),
    ("no_exp_in_op", lambda: load_op(str(EXAMPLES / "matmul.py"),
                                     {"M": "16", "N": "16", "K": "16"}).func, "fast_math exp\n"),
    ("wrong_dtype", lambda: elementwise_exp(64, "float64"), "fast_math exp\n"),
    ("unknown_block", softmax, "block expo:\n  fast_math exp\n"),
    ("twice", softmax, "block exp:\n  fast_math exp\n  fast_math exp\n"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "op", "schedule"), MISUSES, ids=[m[0] for m in MISUSES])
def test_misuse_is_reported(name, op, schedule, golden) -> None:
    result = check(parse(schedule, f"{name}.sched"), op(), CPU)
    assert not result.ok and result.lowered is None
    golden(
        f"fastmath/{name}.txt",
        f"-- {name}.sched --\n{schedule}-- diagnostics --\n"
        f"{render_all(result.diagnostics, schedule)}\n",
    )


def test_a_built_ast_naming_another_function_is_reported() -> None:
    stmt = FastMath(nodes.Name("log"))
    result = check(nodes.Schedule((stmt,)), elementwise_exp(8), CPU)
    assert [d.message for d in result.diagnostics] == ["fast_math has no fast `log`"]


# --- lowering ------------------------------------------------------------------------------------


def test_the_lowered_block_holds_no_exp_and_the_other_blocks_keep_theirs() -> None:
    func = softmax()
    assert "T.exp(" in func.script()
    lowered = lower(parse("block exp:\n  fast_math exp\n"), func, CPU).func
    script = lowered.script()
    assert "T.exp(" not in script
    assert "T.reinterpret" in script and "T.floor" in script
    # Only the named block: a reduction block's exp elsewhere is not touched.
    both = lower(parse("fast_math exp\n"), exp_of_sum(), CPU).func
    assert "T.exp(" not in both.script()


@dataclass(frozen=True)
class Lowering:
    """A schedule and the same thing done by hand on an s_tir.Schedule (tests/test_lower.py
    counts these among its every-statement cases)."""

    name: str
    op: Callable[[], tirx.PrimFunc]
    schedule: str
    by_hand: Callable[[s_tir.Schedule], None]


def _rewrite_then_vectorize(sch: s_tir.Schedule) -> None:
    block = sch.get_sblock("exp")
    fastexp.rewrite_block(sch, block)
    _, j = sch.get_loops(block)
    _, inner = sch.split(j, [None, 8])
    sch.vectorize(inner)


LOWERINGS = [
    Lowering("fast_math_then_vectorize", softmax,
             "block exp:\n  fast_math exp\n  split j by 8\n  vectorize j.i\n",
             _rewrite_then_vectorize),
]  # fmt: skip


@pytest.mark.parametrize("case", LOWERINGS, ids=lambda case: case.name)
def test_lowers_to_the_rewrite_and_the_primitives_after_it(case: Lowering) -> None:
    lowered = lower(parse(case.schedule, f"{case.name}.sched"), case.op(), CPU).func
    sch = s_tir.Schedule(case.op())
    case.by_hand(sch)
    tvm.ir.assert_structural_equal(lowered, sch.mod["main"].with_attr(SCHEDULED_ATTR, True))
    assert "T.vectorized(8)" in lowered.script() and "T.exp(" not in lowered.script()


def test_the_vectorized_loop_calls_no_expf() -> None:
    schedule = "fast_math exp\nsplit i by 8\nvectorize i.i\n"
    func = elementwise_exp(64)
    source = compile_func(lower(parse(schedule), func, CPU).func, CPU).mod.inspect_source("ll")
    assert not re.search(r"@(expf|llvm\.exp)", source)
    assert re.search(r"@llvm\.floor\.v8f32", source), "the floor is a vector instruction"
    # Without the statement, LLVM calls expf per lane.
    plain = lower(parse("split i by 8\nvectorize i.i\n"), func, CPU).func
    assert re.search(r"@(expf|llvm\.exp)", compile_func(plain, CPU).mod.inspect_source("ll"))


# --- values --------------------------------------------------------------------------------------


def test_softmax_with_fast_exp_passes_the_verifier() -> None:
    schedule = (EXAMPLES / "softmax.sched").read_text(encoding="utf-8")  # the example uses it
    assert "block exp:\n  fast_math exp\n" in schedule
    build(softmax(), schedule, CPU)  # raises SchedlangError when the verifier rejects it


EDGES = [-1000.0, -100.0, -88.7, -88.0, -87.5, -87.0, -86.9, -50.0, -1.0, -1e-30, 0.0, 1e-30,
         0.5, 1.0, 10.0, 80.0, 88.0, 88.3, 88.4, 88.7, 88.72, 88.73, 89.5, 1000.0,
         np.inf, -np.inf]  # fmt: skip


@pytest.fixture(scope="module")
def fast_exp_kernel():
    schedule = parse("fast_math exp\nsplit i by 8\nvectorize i.i\n")
    return compile_func(lower(schedule, elementwise_exp(4096), CPU).func, CPU)


def _run(kernel, values: np.ndarray) -> np.ndarray:
    out = tvm.runtime.tensor(np.zeros_like(values), tvm.cpu())
    kernel(tvm.runtime.tensor(values, tvm.cpu()), out)
    return out.numpy()


def test_values_at_the_ends_of_the_range_match_numpy(fast_exp_kernel) -> None:
    kernel = fast_exp_kernel
    values = np.zeros(4096, "float32")
    values[: len(EDGES)] = EDGES
    with np.errstate(over="ignore"):
        want = np.exp(values)
    got = _run(kernel, values)
    ok, reason = compare_outputs([got], [want])
    assert ok, reason
    # Beyond the verifier's tolerance: what expf does at each edge.
    edges = got[: len(EDGES)]
    assert edges[0] == edges[1] == edges[2] == 0.0, "below -87 the result is 0, not garbage"
    assert np.isposinf(edges[EDGES.index(88.73)]) and np.isposinf(edges[EDGES.index(np.inf)])
    assert np.isfinite(edges[EDGES.index(88.72)]), "n = 128 is finite (TVM's fast_exp: inf)"
    assert edges[EDGES.index(-np.inf)] == 0.0


def test_relative_error_is_float32_sized_over_the_whole_range(fast_exp_kernel) -> None:
    kernel = fast_exp_kernel
    rng = np.random.default_rng(0)
    values = rng.uniform(-86.9, 88.72, 4096).astype("float32")
    values[:5] = [-1e-3, 0.0, 1e-3, 0.3465, -0.3465]  # r at the ends of its interval
    got = _run(kernel, values).astype(np.float64)
    want = np.exp(values.astype(np.float64))
    relative = np.abs(got - want) / want
    assert relative.max() < 5e-7  # measured 1.1e-7; TVM's topi.fast_exp reaches ~3e-6 near 88
    assert relative.max() < default_tolerance("float32")[0]


def test_fast_exp_is_the_polynomial_of_the_docs() -> None:
    x = tvm.tirx.Var("x", "float32")
    text = str(fastexp.fast_exp(x))
    assert "exp" not in text.replace("fexp_", "")
    for coefficient in ("0.000198756915", "0.5000000120"):
        assert coefficient in text


# --- erf ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fast_erf_kernel():
    schedule = parse("fast_math erf\nsplit i by 8\nvectorize i.i\n")
    return compile_func(lower(schedule, elementwise_exp(4096, function=te.erf), CPU).func, CPU)


def test_the_vectorized_loop_calls_no_erff(fast_erf_kernel) -> None:
    source = fast_erf_kernel.mod.inspect_source("ll")
    assert not re.search(r"@(erff|llvm\.erf)", source)
    assert re.search(r"fdiv[^\n]*<8 x float>", source), "the divide is a vector instruction"
    # Without the statement, LLVM calls erff per lane.
    plain = lower(parse("split i by 8\nvectorize i.i\n"), elementwise_exp(64, function=te.erf), CPU)
    assert re.search(r"@erff", compile_func(plain.func, CPU).mod.inspect_source("ll"))


def test_erf_error_is_float32_sized_and_saturates(fast_erf_kernel) -> None:
    import math

    rng = np.random.default_rng(0)
    values = rng.uniform(-6.0, 6.0, 4096).astype("float32")
    values[:9] = [0.0, -0.0, 1e-30, -1e-30, 4.0, -4.0, 50.0, -np.inf, np.inf]
    got = _run(fast_erf_kernel, values).astype(np.float64)
    want = np.array([math.erf(v) for v in values.astype(np.float64)])
    assert np.abs(got - want).max() < 1e-6  # absolute (measured 3.2e-7): erf is 0 at 0
    assert got[4] == got[6] == got[8] == pytest.approx(1.0, abs=1e-7) and got[7] == -got[8]
    # Monotonic as erf is, but for float32 rounding (steps back of 3.6e-7 measured, near +-1).
    assert np.all(np.diff(got[np.argsort(values)]) >= -1e-6)


def test_erf_misuse_names_erf() -> None:
    result = check(parse("fast_math erf\n"), elementwise_exp(8), CPU)
    messages = [d.message for d in result.diagnostics]
    assert messages == ["block `y` computes no `erf`: nothing to rewrite"]


# --- the built-in proposer -----------------------------------------------------------------------


def test_the_softmax_template_with_fast_exp_comes_first_and_checks() -> None:
    from schedlang.propose.builtin import BuiltinProposer
    from schedlang.propose.interface import Context

    op = load_op(str(EXAMPLES / "softmax.py"), {"rows": "64", "cols": "64"})
    templates = BuiltinProposer().templates(Context(op, CPU))
    # A 64x64 softmax is little work: each family's one-thread form comes just before it.
    families = [t.extra["family"] for t in templates if not t.extra.get("serial")]
    assert families[:2] == ["rows_fast_exp", "rows"]
    assert templates[0].extra["family"] == "rows_fast_exp"
    assert "block exp:\n  fast_math exp\n" in templates[0].text
    first = {p.name.text: next(iter(p.choices)) for p in parse(templates[0].text).params}
    result = check(parse(templates[0].text), op.func, CPU, knobs=first, template_ok=False)
    assert result.ok, render_all(result.diagnostics, templates[0].text)
    assert "T.exp(" not in result.lowered.func.script()
    # Layer norm computes no exp: no such template.
    layernorm = load_op(str(EXAMPLES / "layernorm.py"), {"rows": "64", "cols": "96"})
    families = [t.extra["family"] for t in BuiltinProposer().templates(Context(layernorm, CPU))]
    assert "rows_fast_exp" not in families and families[0] == "rows"
