"""bench/bench_models.py's models load as model files (ResNet-18 written in the benchmark, BERT
from transformers' own BertModel), at small sizes here, and its report says what it measured."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from schedlang.core.target import resolve_target
from schedlang.models.model_file import load_model
from schedlang.models.tune_model import model_tasks, plan
from schedlang.propose.builtin import BuiltinProposer

BENCH = Path(__file__).resolve().parent.parent / "bench"
LLVM = resolve_target("llvm")


def test_resnet18_loses_its_batch_norms_and_every_task_has_templates():
    model = load_model(str(BENCH / "models" / "resnet18.py"), {"size": "32"})
    tasks = model_tasks(model, LLVM)
    assert not [t.name for t in tasks if "batch_norm" in t.name]
    plans = {task.name: plan(task, LLVM, BuiltinProposer()) for task in tasks}
    assert all(p.templates for p in plans.values()), plans
    convs = [name for name in plans if "conv2d" in name]
    assert len(convs) >= 11 and all(plans[name].kind == "conv" for name in convs)
    # The pooling, the batch-1 dense and the global mean have recipes of their own.
    assert plans["max_pool2d"].kind == "pool" and plans["max_pool2d"].templates[0] == "pool_rows"
    dense = next(name for name in plans if name.startswith("fused_matmul"))
    assert plans[dense].kind == "gemv" and plans[dense].templates[0] == "gemv_columns"
    assert plans["mean"].templates[0] == "reduce_gather"


def test_bert_comes_from_transformers_bert_model():
    pytest.importorskip("transformers")
    model = load_model(str(BENCH / "models" / "bert.py"), {"layers": "1", "seq": "8"})
    assert model.reference_kind == "PyTorch"
    kinds = {plan(t, LLVM, BuiltinProposer()).kind for t in model_tasks(model, LLVM)}
    assert {"matmul", "rows"} <= kinds  # the projections; layer norm and softmax


def test_the_encoder_layer_is_torchs_own_and_every_task_has_templates():
    model = load_model(str(BENCH / "models" / "encoder.py"), {"seq": "8", "width": "16"})
    assert model.reference_kind == "PyTorch"
    plans = [plan(t, LLVM, BuiltinProposer()) for t in model_tasks(model, LLVM)]
    assert all(p.templates for p in plans)
    assert {"matmul", "rows"} <= {p.kind for p in plans}  # projections; layer norm, softmax


def test_the_report_has_every_row_and_says_why_one_was_skipped():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_models
    finally:
        sys.path.remove(str(BENCH))
    row = {"median_s": 2e-3, "min_s": 1e-3, "max_s": 3e-3}
    result = {
        "model": "m", "cpu": "a CPU", "threads": 2, "repeat": 3, "checked_against": "the reference",
        "metaschedule_wall_s": 12.0,
        "schedlang": {"tasks": 3, "generic_only": ["r"], "uncovered": [], "measured": 8,
                      "wall_s": 30.0},
        "rows": [
            {"label": "schedlang tuned (8 trials)", **row, "x_tuned": 1.0},
            {"label": "MetaSchedule", "skipped": "MetaSchedule failed: no xgboost"},
            {"label": "PyTorch eager", **row, "median_s": 4e-3, "x_tuned": 2.0},
        ],
    }  # fmt: skip
    text = bench_models.markdown(result)
    assert "3 tasks (1 with only the generic template, 0 uncovered), 8 trials measured" in text
    assert "| MetaSchedule | – | – | skipped: MetaSchedule failed: no xgboost |" in text
    assert "| PyTorch eager | 4 ms | 1 ms – 3 ms | 2.00× |" in text


def test_mobilenet_v2_is_torchvisions_architecture():
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(BENCH / "models"))
    try:
        import mobilenet_v2
    finally:
        sys.path.remove(str(BENCH / "models"))
    net = mobilenet_v2.MobileNetV2()
    # torchvision.models.mobilenet_v2() has 3,504,872 parameters and 17 inverted residuals
    assert sum(p.numel() for p in net.parameters()) == 3_504_872
    assert sum(isinstance(m, mobilenet_v2.InvertedResidual) for m in net.modules()) == 17
    depthwise = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d) and m.groups > 1]
    assert len(depthwise) == 17 and all(m.groups == m.in_channels for m in depthwise)
    with torch.no_grad():
        assert net.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 1000)
