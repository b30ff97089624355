"""A built model measured as a user would (issue 28, item 5): `build-model --profile` times each
PrimFunc the Relax VM calls, `--compare` puts the tuned build beside the default build and the
frameworks the model comes from, one thread count for all, and `--json` gives both as one
document. A baseline or a profiler that cannot run is a line saying why, never a traceback."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedlang.cli import app
from schedlang.core.target import resolve_target
from schedlang.models.baselines import _missing
from schedlang.models.function_times import profile_model
from schedlang.models.graph import build_model, call_counts, to_tir
from schedlang.models.model_file import load_model
from schedlang.store.db import Database

ROOT = Path(__file__).resolve().parent.parent
MLP = str(ROOT / "examples" / "models" / "mlp.py")
ATTENTION = str(ROOT / "tests" / "models" / "attention.py")
# four layers: the hidden → hidden function is called twice
MLP_DEFINES = {"batch": "4", "features": "32", "hidden": "64", "layers": "4"}
MLP_ARGS = [arg for key, value in MLP_DEFINES.items() for arg in ("-D", f"{key}={value}")]
LLVM = resolve_target("llvm")
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)


@pytest.fixture(scope="module")
def mlp_build():
    model = load_model(MLP, MLP_DEFINES)
    executable, applied = build_model(model.mod, LLVM, Database(":memory:"))
    return model, executable, applied


def build(*args: str, tmp_path: Path):
    return CliRunner().invoke(
        app, ["build-model", *args, "--target", "llvm", "--db", str(tmp_path / "t.db")]
    )


def test_the_profile_has_a_row_per_built_function_with_its_calls(mlp_build):
    model, executable, applied = mlp_build
    profile = profile_model(executable, applied, model.inputs, LLVM, repeat=3)
    assert {row.function for row in profile.rows} == {item.function for item in applied}
    assert {row.function: row.calls for row in profile.rows} == call_counts(to_tir(model.mod, LLVM))
    assert math.isclose(sum(row.share for row in profile.rows), 1.0, rel_tol=1e-9)
    totals = [row.total_s for row in profile.rows]
    assert totals == sorted(totals, reverse=True) and all(t > 0 for t in totals)
    assert math.isclose(profile.total_s, sum(totals))
    twice = next(row for row in profile.rows if row.calls == 2)
    assert math.isclose(twice.per_call_s * 2, twice.total_s)
    assert {row.scheduled for row in profile.rows} == {"unscheduled"}  # an empty database


def test_build_model_profile_prints_each_function_and_the_total(tmp_path):
    result = build(MLP, *MLP_ARGS, "--profile", "--repeat", "2", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert "profile, medians of 2 runs of main:" in result.output
    assert "calls   per call      total   share  scheduled" in result.output
    assert "  fused_matmul1_add_relu      2 " in result.output
    assert "\n  total " in result.output


def test_build_model_profile_json_is_one_document_with_the_rows(tmp_path):
    result = build(MLP, *MLP_ARGS, "--profile", "--repeat", "2", "--json", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["ok"] and document["command"] == "build-model"
    names = [f["function"] for f in document["functions"]]
    rows = document["profile"]["functions"]
    assert sorted(row["function"] for row in rows) == sorted(names)
    assert math.isclose(sum(row["share"] for row in rows), 1.0, rel_tol=1e-9)
    assert all(row["per_call_s"] > 0 and row["scheduled"] == "unscheduled" for row in rows)
    assert "compare" not in document


def test_a_profiler_that_fails_is_one_line(tmp_path, monkeypatch):
    from tvm import relax

    def refuse(self, hook):
        raise RuntimeError("no instrument on this VM")

    monkeypatch.setattr(relax.VirtualMachine, "set_instrument", refuse)
    result = build(MLP, *MLP_ARGS, "--profile", "--repeat", "1", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert "warning: the profiler failed on llvm: no instrument on this VM" in result.output
    assert "Traceback" not in result.output

    result = build(MLP, *MLP_ARGS, "--profile", "--repeat", "1", "--json", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["profile"] == {"error": "the profiler failed on llvm: no instrument on this VM"}


def test_compare_json_of_a_numpy_model_has_the_builds_and_numpy(tmp_path):
    result = build(MLP, *MLP_ARGS, "--compare", "--repeat", "2", "--json", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    compare = json.loads(result.stdout)["compare"]
    # TVM's thread count, which every row ran with (set to the target's cores when unset)
    assert compare["threads"] == int(os.environ["TVM_NUM_THREADS"]) and compare["repeat"] == 2
    assert compare["checked_against"] == "the default build and the reference (numpy)"
    labels = [row["label"] for row in compare["rows"]]
    assert labels == ["tuned", "default (tvm.compile)", "numpy"]
    for row in compare["rows"]:
        assert row["min_s"] <= row["median_s"] <= row["max_s"]
        assert len(row["latencies_s"]) == 2
    assert compare["rows"][0]["x_tuned"] == 1.0


@pytest.fixture(scope="module")
def attention_compare(tmp_path_factory):
    """One --compare of the PyTorch attention block, as JSON (torch.compile takes seconds)."""
    folder = tmp_path_factory.mktemp("attention")
    result = build(ATTENTION, "--compare", "--repeat", "3", "--json", tmp_path=folder)
    assert result.exit_code == 0, result.output
    return {row["label"]: row for row in json.loads(result.stdout)["compare"]["rows"]}


# Slow (`attention_compare` runs torch.compile's inductor, a minute or more): the PyTorch rows of
# --compare are test_a_baseline_that_fails_is_a_row_saying_why's, onnxruntime's export
# test_a_transformer_layer_is_exported_by_torch_export_where_the_tracer_fails's.
@pytest.mark.slow
@needs_torch
def test_compare_puts_pytorch_eager_and_torch_compile_beside_the_builds(attention_compare):
    rows = attention_compare
    assert list(rows)[:4] == ["tuned", "default (tvm.compile)", "PyTorch eager", "torch.compile"]
    assert rows["PyTorch eager"]["median_s"] > 0
    if shutil.which("cc") or shutil.which("gcc"):  # inductor needs a C compiler
        assert "skipped" not in rows["torch.compile"], rows["torch.compile"]
        assert rows["torch.compile"]["x_tuned"] > 0


@pytest.mark.slow
@needs_torch
def test_a_torch_model_is_exported_to_onnxruntime_when_it_is_installed(attention_compare):
    label = "onnxruntime (exported)" if not _missing("onnxruntime") else "onnxruntime"
    row = attention_compare[label]
    if _missing("onnxruntime"):
        assert row["skipped"] == "onnxruntime is not installed (pip install onnxruntime)"
    else:
        assert row["median_s"] > 0


@needs_torch
@pytest.mark.skipif(_missing("onnxruntime") is not None, reason="onnxruntime is not installed")
def test_a_transformer_layer_is_exported_by_torch_export_where_the_tracer_fails(tmp_path):
    from schedlang.models.baselines import _exported_to_onnxruntime

    model = load_model(str(ROOT / "bench" / "models" / "encoder.py"), {"seq": "8", "width": "32"})
    module, expected = model.reference.module, model.expected_outputs()
    row = _exported_to_onnxruntime(module, model.inputs, 2, str(tmp_path), expected)
    if _missing("onnxscript"):
        assert "needs onnxscript" in row.skipped
        return
    # The TorchScript tracer fails on the layer's attention; torch.export's exporter does not,
    # and what onnxruntime computes is checked against the module's outputs before it is timed.
    assert row.label == "onnxruntime (exported, torch.export)" and row.once() > 0, row
    wrong = [e + 1.0 for e in expected]
    row = _exported_to_onnxruntime(module, model.inputs, 2, str(tmp_path), wrong)
    assert row.skipped.startswith("its outputs differ from the model's"), row


@needs_torch
def test_a_baseline_that_fails_is_a_row_saying_why(tmp_path, monkeypatch):
    import torch

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C compiler found\nwhere it looked: ...")

    monkeypatch.setattr(torch, "compile", no_compiler)
    result = build(ATTENTION, "-D", "seq=4", "--compare", "--repeat", "1", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if "torch.compile" in line]
    assert line.split() == [
        "torch.compile", "skipped:", "torch.compile", "failed:", "RuntimeError:", "no", "C",
        "compiler", "found",
    ]  # fmt: skip
    assert "\n  PyTorch eager " in result.output and "x tuned)" in result.output
    assert "Traceback" not in result.output


def test_a_missing_package_is_named_with_how_to_install_it():
    assert _missing("json") is None
    assert _missing("no_such_framework") == (
        "no_such_framework is not installed (pip install no_such_framework)"
    )


def test_the_rows_are_timed_in_turns_a_repeat_of_each_per_round(monkeypatch):
    from schedlang.models import baselines

    monkeypatch.setattr(baselines, "PAUSE_S", 0.0)
    order: list[str] = []

    def runner(label: str, seconds: float) -> baselines.Runner:
        return baselines.Runner(label, lambda: order.append(label) or seconds)

    rows = baselines.interleave(
        [runner("tuned", 1.0), baselines.Runner("numpy", skipped="why"), runner("default", 2.0)], 3
    )
    # Round by round, not row by row: a slow spell of the machine falls on every row alike.
    assert order == ["tuned", "default"] * 3
    assert [row.latencies for row in rows] == [(1.0,) * 3, (), (2.0,) * 3]
    assert rows[1].skipped == "why"
