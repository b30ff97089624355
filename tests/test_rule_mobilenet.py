"""MobileNetV2's functions get templates made for them (issue 47): in a tiny MobileNetV2-like
network (tests/models/mobilenet_block.py: stem, one inverted residual, the 1x1 conv to 1280
channels, the pool and the 1280 -> 1000 classifier), as the model importer fuses it,

- the depthwise 3x3 conv with its bias and ReLU6 (`clip`) gets `depthwise_fused` first (the tile
  vectorized along the NCHW row, accumulated in registers, the clip folded into its write-back);
- each pointwise 1x1 conv, with its clip or its residual add, gets `conv_prepacked` first (a
  pixels x output-channels register tile, the weight packed once, the epilogue folded);
- the classifier, a batch-1 dense, gets `gemv_columns` (every weight read once);

and every knob point of those templates checks clean, the first of each matching the reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlang.core.target import resolve_target
from schedlang.models.graph import Task, extract_tasks
from schedlang.models.model_file import load_model
from tests.rule_points import check_every_point, families

pytest.importorskip("torch")

CPU = resolve_target("llvm")
MODEL = Path(__file__).resolve().parent / "models" / "mobilenet_block.py"


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    return {t.name: t for t in extract_tasks(load_model(str(MODEL)).mod, CPU)}


def _weight_shape(task: Task) -> tuple[int, ...] | None:
    shapes = [b.shape for b in task.op.inputs if b.name == "param_0"]
    return tuple(int(d) for d in shapes[0]) if shapes else None


def _kinds(tasks: dict[str, Task]) -> dict[str, list[Task]]:
    kinds: dict[str, list[Task]] = {"depthwise": [], "pointwise": [], "classifier": []}
    for task in tasks.values():
        shape = _weight_shape(task)
        if "matmul" in task.name:
            kinds["classifier"].append(task)
        elif shape and len(shape) == 4 and shape[1] == 1 and shape[2:] == (3, 3):
            kinds["depthwise"].append(task)
        elif shape and len(shape) == 4 and shape[2:] == (1, 1):
            kinds["pointwise"].append(task)
    return kinds


def test_the_tiny_network_has_each_kind_of_mobilenet_function(tasks) -> None:
    kinds = _kinds(tasks)
    assert [t.name for t in kinds["depthwise"]] and all(
        "clip" in t.name for t in kinds["depthwise"]
    ), list(tasks)
    pointwise = [t.name for t in kinds["pointwise"]]
    assert sum("clip" in name for name in pointwise) == 2, pointwise  # expand, and to 1280
    assert sum("add_add" in name for name in pointwise) == 1, pointwise  # project + residual
    assert len(kinds["classifier"]) == 1, list(tasks)


@pytest.mark.parametrize(
    ("kind", "family"),
    [("depthwise", "depthwise_fused"), ("pointwise", "conv_prepacked"),
     ("classifier", "gemv_columns")],
)  # fmt: skip
def test_each_mobilenet_function_gets_its_template_first_checked_and_right(
    tasks, kind, family
) -> None:
    for task in _kinds(tasks)[kind]:
        written = families(task.op, CPU)
        assert next(iter(written)) == family, (task.name, list(written))
        check_every_point(task.op, {family: written[family]}, CPU)


def test_the_depthwise_template_folds_the_clip_and_vectorizes_the_row(tasks) -> None:
    (task,) = _kinds(tasks)["depthwise"]
    text = families(task.op, CPU)["depthwise_fused"]
    assert "reverse_compute_inline compute" in text  # the clip, in the write-back
    assert "vectorize xx.i" in text and "parallel tasks" in text
    assert "block compute:" not in text  # no pass of its own
