"""bench/bench_modes.py's arithmetic: rounds counted in the fast and the slow mode against each
system's fastest round anywhere, and each thread's allowed CPUs read from /proc."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import bench_modes as bench  # noqa: E402


def test_rounds_are_counted_slow_against_the_systems_fastest_round_anywhere():
    processes = [
        {"setting": "alone", "systems": ["schedlang"], "thread_cpus": {"0-1": 3},
         "medians_s": {"schedlang": [6e-3, 6.1e-3, 11e-3]}},
        {"setting": "interleaved", "systems": ["schedlang", "onnxruntime"],
         "thread_cpus": {"0-1": 4, "0": 2},
         "medians_s": {"schedlang": [10.5e-3, 11e-3], "onnxruntime": [4e-3, 6e-3]}},
    ]  # fmt: skip
    table = bench.modes(processes, slow=1.3)
    alone = table["alone | schedlang"]
    assert (alone["fast"], alone["slow"]) == (2, 1) and alone["floor_s"] == 6e-3
    mixed = table["interleaved | schedlang"]
    assert (mixed["fast"], mixed["slow"]) == (0, 2)  # the floor is the alone process's 6 ms
    assert mixed["process_medians_s"] == [pytest.approx(10.75e-3)]
    ort = table["interleaved | onnxruntime"]
    assert (ort["fast"], ort["slow"]) == (1, 1)
    page = bench.markdown({
        "cpu": "a CPU", "threads": 2, "processes": 1, "rounds": 3, "runs": 30, "slow": 1.3,
        "modes": table, "processes_run": processes,
    })  # fmt: skip
    assert "| interleaved | schedlang | 0 / 2 | 10.75 | 6.00 |" in page
    assert "{'0-1': 4, '0': 2}" in page


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="no /proc")
def test_every_thread_of_this_process_is_counted_by_its_allowed_cpus():
    counts = bench._thread_cpus()
    assert sum(counts.values()) == len(os.listdir("/proc/self/task"))
    assert all(cpus and cpus[0].isdigit() for cpus in counts)
