"""PyTorch and ONNX models in (issue 28, items 1 and 7): a torch.nn.Module with example inputs, an
ExportedProgram and an .onnx file load as models, build, and agree with the framework that runs
them today; what cannot be imported is one error line."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from schedlang.cli import app
from schedlang.core.diagnostics import SchedlangError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)

MODELS = Path(__file__).resolve().parent / "models"
CONVNET = str(MODELS.parent.parent / "examples" / "models" / "convnet.py")
ATTENTION = str(MODELS / "attention.py")


def build_and_compare(path: str, tmp_path: Path) -> str:
    result = CliRunner().invoke(
        app,
        ["build-model", path, "--target", "llvm", "--compare", "--db", str(tmp_path / "db")],
    )
    assert result.exit_code == 0, result.output
    assert "outputs agree with the default build and the reference" in result.output
    return result.output


@pytest.mark.parametrize("path", [CONVNET, ATTENTION], ids=["convnet", "attention"])
def test_a_pytorch_module_builds_and_agrees_with_pytorch(path, tmp_path):
    output = build_and_compare(path, tmp_path)
    assert "\n  PyTorch " in output  # the reference is labelled by what ran it


def test_a_pytorch_model_keeps_batch_norm_statistics_and_its_inputs():
    from schedlang.models.model_file import load_model

    model = load_model(CONVNET, {"size": "12"})
    assert model.reference_kind == "PyTorch"
    assert [a.shape for a in model.inputs] == [(1, 3, 12, 12)]
    (expected,) = model.expected_outputs()
    assert expected.shape == (1, 10) and np.isfinite(expected).all()


def test_an_exported_program_is_a_model_too(tmp_path):
    from schedlang.models.model_file import load_model

    file = tmp_path / "exported.py"
    file.write_text(
        textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(MODELS)!r})
        import schedlang
        from attention import Attention

        @schedlang.model
        def exported(seq: int = 8):
            torch.manual_seed(0)
            return torch.export.export(Attention().eval(), (torch.randn(1, seq, 32),))
    """)
    )
    model = load_model(str(file))
    assert [a.shape for a in model.inputs] == [(1, 8, 32)]
    assert model.reference_kind == "PyTorch"


def test_an_onnx_file_is_a_model(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import torch

    from schedlang.models.model_file import load_model

    definition = load_model(CONVNET)  # the same network, exported to ONNX by torch
    onnx_file = tmp_path / "convnet.onnx"
    net = _convnet_module()
    torch.onnx.export(net, (torch.from_numpy(definition.inputs[0]),), onnx_file, dynamo=False)
    output = build_and_compare(str(onnx_file), tmp_path)
    assert "\n  onnxruntime " in output


def _convnet_module():
    import sys

    folder = str(Path(CONVNET).parent)
    sys.path.insert(0, folder)
    try:
        import convnet
    finally:
        sys.path.remove(folder)
    net, _ = convnet.convnet.fn()
    return net.eval()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "class Odd(torch.nn.Module):\n"
            "    def forward(self, x):\n"
            "        return torch.erfinv(x) + 1\n\n"
            "@schedlang.model\n"
            "def odd():\n"
            "    return Odd(), (torch.rand(4, 4),)\n",
            "TVM's PyTorch frontend does not convert `aten.erfinv` in model `odd`",
        ),
        (
            "class Branchy(torch.nn.Module):\n"
            "    def forward(self, x):\n"
            "        return x * 2 if x.sum() > 0 else x\n\n"
            "@schedlang.model\n"
            "def branchy():\n"
            "    return Branchy(), (torch.rand(4),)\n",
            "torch.export cannot trace model `branchy`",
        ),
        (
            "@schedlang.model\ndef bare():\n    return torch.nn.Linear(4, 4)\n",
            "returned a torch.nn.Module without example inputs",
        ),
    ],
    ids=["unsupported-operator", "untraceable", "no-example-inputs"],
)
def test_a_model_torch_cannot_give_is_one_error_line(tmp_path, body, message):
    file = tmp_path / "bad.py"
    file.write_text("import torch\nimport schedlang\n\n" + body)
    result = CliRunner().invoke(
        app, ["build-model", str(file), "--target", "llvm", "--db", str(tmp_path / "db")]
    )
    assert result.exit_code == 1, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_file_that_is_not_onnx_is_one_error(tmp_path):
    pytest.importorskip("onnx")
    from schedlang.models.model_file import load_model

    fake = tmp_path / "broken.onnx"
    fake.write_bytes(b"not a protobuf")
    with pytest.raises(SchedlangError, match="not an ONNX model"):
        load_model(str(fake))


def test_batch_norm_is_folded_into_the_convolutions():
    """TVM's inference passes (schedlang.models.graph.inference_passes) run before the tasks are
    cut: no batch-norm function is left to schedule (issue 28, item 2)."""
    from schedlang.models.graph import extract_tasks
    from schedlang.models.model_file import load_model

    names = [task.name for task in extract_tasks(load_model(CONVNET).mod, "llvm")]
    assert not [name for name in names if "batch_norm" in name], names
    assert any(name.startswith("fused_conv2d") for name in names), names


@pytest.mark.parametrize(
    ("path", "defines", "tasks"),
    [(CONVNET, ["size=8", "channels=4"], 5), (ATTENTION, ["seq=8", "width=16"], 11)],
    ids=["convnet", "attention"],
)
def test_a_pytorch_module_tuned_then_built_gets_every_function_from_the_database(
    path, defines, tasks, tmp_path
):
    """Issue 28, item 7: a trial per task of tune-model, then build-model: every function gets a
    measured record (a schedule, or the unscheduled build where it measured fastest), and the
    outputs equal PyTorch's."""
    import json

    db = str(tmp_path / "db")
    args = [arg for d in defines for arg in ("-D", d)]
    result = CliRunner().invoke(
        app, ["tune-model", path, *args, "--trials", str(tasks), "--db", db, "--seed", "1"]
    )
    assert result.exit_code == 0, result.output
    assert f"{tasks} of {tasks} tasks have templates" in result.output
    result = CliRunner().invoke(app, ["build-model", path, *args, "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["verified"] == "the reference (PyTorch)"
    assert {f["how"] for f in document["functions"]} == {"schedlang"}, document["functions"]
