"""A GPU schedule that leaves blocks unbound (issue 32): refused wherever schedlang builds it,
returned with a warning where something else finishes it (`apply`, `SchedulePass(partial=True)`
before dlight), as TVM's own schedule tests apply one primitive to a GPU function."""

from __future__ import annotations

import pytest
import tvm
from tvm.s_tir import dlight
from typer.testing import CliRunner

import schedlang
from schedlang import cli
from schedlang.checker.check import check
from schedlang.checker.pipeline import SCHEDULED_ATTR
from schedlang.core.diagnostics import DiagnosticError
from schedlang.core.ops import load_op
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse

CUDA = resolve_target("cuda")
UNBOUND = "is not bound to GPU threads"


@pytest.fixture(scope="module")
def func():
    return load_op("examples/matmul.py", {"M": "64", "N": "64", "K": "64"}).func


@pytest.mark.parametrize("text", ["cache_read A shared", "cache_write C local", "unroll k"])
def test_partial_is_a_warning_and_a_build_an_error(func, text: str) -> None:
    partial = check(parse(text), func, CUDA, partial=True)
    assert partial.lowered is not None
    assert not any(d.is_error for d in partial.diagnostics)
    assert any(UNBOUND in d.message and not d.is_error for d in partial.diagnostics)
    built = check(parse(text), func, CUDA)
    assert built.lowered is None
    assert any(UNBOUND in d.message and d.is_error for d in built.diagnostics)


def test_apply_returns_it_unmarked_and_build_refuses_it(func) -> None:
    scheduled = schedlang.apply(func, "cache_write C local", "cuda")
    assert scheduled.attrs.get(SCHEDULED_ATTR) is None  # for dlight to finish
    with pytest.raises(DiagnosticError, match=UNBOUND):
        schedlang.apply(func, "cache_write C local", "cuda", partial=False)
    with pytest.raises(DiagnosticError, match=UNBOUND):
        schedlang.build(func, "cache_write C local", "cuda", verify=False)
    bound = schedlang.apply(func, "bind i blockIdx.x\nbind j threadIdx.x", "cuda")
    assert bound.attrs[SCHEDULED_ATTR]  # a finished schedule is marked as before


def test_a_partial_pass_then_dlight_builds(func) -> None:
    mod = tvm.IRModule({"main": func})
    # TVM passes the pass's DiagnosticError on as a RuntimeError with its text.
    with pytest.raises((DiagnosticError, RuntimeError), match=UNBOUND):
        schedlang.SchedulePass({"main": "cache_read A shared"}, "cuda")(mod)
    mod = schedlang.SchedulePass({"main": "cache_read A shared"}, "cuda", partial=True)(mod)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    with target:
        mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul(), dlight.gpu.Fallback())(mod)
    assert "A_shared" in mod["main"].script()  # dlight kept the partial schedule's cache
    tvm.compile(mod, target=target)  # CUDA C, built without a GPU


def test_the_cli_checks_for_a_build(tmp_path) -> None:
    result = CliRunner().invoke(
        cli.app, ["check", "examples/matmul.py", "-t", "cuda", "-s", "cache_read A shared"]
    )
    assert result.exit_code == 1
    assert f"error: block A_shared {UNBOUND}" in result.output
