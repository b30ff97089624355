"""bench/bench_kinds.py's sorting of layers into kinds: onnxruntime's profile nodes by their
operator and weight shapes (plain and NCHWc-blocked), and the table of both systems."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import bench_kinds as bench  # noqa: E402


def _node(op, *shapes):
    return {"cat": "Node", "args": {"op_name": op,
            "input_type_shape": [{"float": list(s)} for s in shapes]}}  # fmt: skip


def test_onnxruntime_nodes_are_sorted_by_operator_and_weight():
    assert bench.node_kind(_node("FusedConv", (1, 96, 56, 56), (96, 1, 3, 3))) == "depthwise 3x3"
    assert bench.node_kind(_node("Conv", (1, 16, 56, 56), (96, 16, 1, 1))) == "pointwise 1x1"
    assert bench.node_kind(_node("Conv", (1, 3, 224, 224), (32, 3, 3, 3))) == "stem 3x3"
    blocked = _node("NchwcConv", (1, 16, 56, 56), (12, 2, 1, 1, 8, 8))
    assert bench.node_kind(blocked) == "pointwise 1x1"
    assert bench.node_kind(_node("ReorderOutput", (1, 16, 56, 56))) == "layout"
    assert bench.node_kind(_node("Gemm", (1, 1280), (1000, 1280))) == "classifier"
    assert bench.node_kind(_node("Add", (1, 16), (1, 16))) == "other"
    assert bench.weight_kind([96, 1, 3, 3]) == "depthwise 3x3"
    assert bench.weight_kind([96, 16]) is None


def test_the_table_sets_both_systems_side_by_side():
    result = {
        "cpu": "a CPU", "threads": 2, "repeat": 5,
        "schedlang": {"total_s": 4e-3, "builtins_s": 1e-4,
                      "kinds_s": {"depthwise 3x3": 2e-3, "pointwise 1x1": 2e-3}},
        "onnxruntime": {"total_s": 2e-3, "kinds_s": {"depthwise 3x3": 1e-3, "pointwise 1x1": 1e-3}},
    }  # fmt: skip
    page = bench.markdown(result)
    assert "| depthwise 3x3 | 2.000 ms | 1.000 ms | 2.00 |" in page
    assert "| **all kernels** | 4.000 ms | 2.000 ms | 2.00 |" in page
    assert "| classifier | 0.000 ms | 0.000 ms | - |" in page
