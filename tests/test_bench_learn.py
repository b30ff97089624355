"""bench/bench_learn.py's figures: best GFLOP/s after 8, 16 and 64 trials from each arm's trials
in order, the geometric means, and the trials to reach 90% of the op's best."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def bench_learn():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_learn
    finally:
        sys.path.remove(str(BENCH))
    return bench_learn


def test_the_figures_come_from_each_arms_trials_in_order(bench_learn) -> None:
    # Two ops; the model arms ran 16 trials, the built-in 64; a failed trial is None.
    rows = [
        {"op": "matmul", "shape": {"M": "128"}, "trials": {
            "trained": [None, 10.0] + [5.0] * 6 + [40.0] + [1.0] * 7,
            "builtin-cold": [20.0] * 8 + [30.0] * 8 + [50.0] + [1.0] * 47,
        }},
        {"op": "softmax", "shape": {"rows": "64"}, "trials": {
            "trained": [2.0] * 16,
            "builtin-cold": [1.0] * 63 + [8.0],
        }},
    ]  # fmt: skip
    means = bench_learn.summarise(rows, ["trained", "builtin-cold"])
    matmul, softmax = rows
    assert matmul["best_gflops"]["trained"] == {"8": 10.0, "16": 40.0}  # no 64: it ran 16
    assert matmul["best_gflops"]["builtin-cold"] == {"8": 20.0, "16": 30.0, "64": 50.0}
    assert matmul["reached_90"] == {"trained": None, "builtin-cold": 17}  # 90% of 50
    assert softmax["reached_90"] == {"trained": None, "builtin-cold": 64}
    assert means["trained"]["8"] == pytest.approx((10.0 * 2.0) ** 0.5)
    assert means["builtin-cold"]["64"] == pytest.approx((50.0 * 8.0) ** 0.5)
    assert "64" not in means["trained"]  # no arm is credited with trials it did not run
    text = bench_learn.markdown({"arms": ["trained", "builtin-cold"], "rows": rows,
                                 "geomean": means})  # fmt: skip
    assert "| matmul | M=128 | 10.0 / 40.0 / – | 20.0 / 30.0 / 50.0 |" in text
    assert "| matmul | – | 17 |" in text
    assert "| geomean | | 4.5 / 8.9 / – | 4.5 / 5.5 / 20.0 |" in text
