"""bench/bench_sample_efficiency.py at a tiny size: the trials schedlang needs to reach
MetaSchedule's latency read off two curves, schedlang's curve measured on a one-layer MLP at a
few trials (built, checked and timed at each checkpoint), and MetaSchedule's records taken in the
order they were measured."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import bench_sample_efficiency as bench  # noqa: E402


def _points(pairs, key="measured_s"):
    return [{"trials": t, key: v} for t, v in pairs]


def test_the_trials_to_reach_metaschedule_and_the_ratio():
    ours = {
        "points": _points([(16, 30e-3), (136, 12.6e-3), (200, 12.5e-3), (1000, 12.3e-3)]),
        "estimates": _points([(8, 40e-3), (128, 13e-3), (136, 12.6e-3)], "estimate_s"),
    }
    theirs = {"points": _points([(16, 60e-3), (1000, 22.8e-3)])}
    result = bench.efficiency(ours, theirs, 1000)
    assert result["metaschedule_s"] == 22.8e-3
    assert result["schedlang_trials"] == 136 and result["ratio"] == pytest.approx(1000 / 136)
    assert result["schedlang_trials_by_estimate"] == 128
    assert result["schedlang_at_same_s"] == 12.3e-3
    # never reached: no ratio, and the page says so
    slow = bench.efficiency(ours, {"points": _points([(1000, 1e-3)])}, 1000)
    assert slow["schedlang_trials"] is None and slow["ratio"] is None
    page = bench.markdown(
        {"model": "m", "trials": 1000, "cpu": "a CPU", "threads": 2, "repeat": 3,
         "schedlang": ours, "metaschedule": theirs, "efficiency": result}
    )  # fmt: skip
    assert "schedlang reaches it by trial 136 (measured, at the checkpoints): **7.4x**" in page
    assert "| 1000 | 12.3 ms | - | 22.8 ms |" in page
    ours["quality"] = {"trials": 894, "slower_than_10x_best": 0.446, "refused_by_checker": 0.139}
    ours["first_round"], ours["gain_after_first_round"] = {"trials": 136}, 0.024
    page = bench.markdown(
        {"model": "m", "trials": 1000, "cpu": "a CPU", "threads": 2, "repeat": 3, "schedlang": ours}
    )
    assert "894 candidates measured, 45% of them slower than ten times" in page
    assert "14% refused by the checker; the estimate gained 2.4% after the first round" in page


def test_checkpoints_end_at_the_budget():
    assert bench.checkpoints_for(100) == [16, 32, 64, 100]
    assert bench.checkpoints_for(6, [4, 2, 9]) == [2, 4, 6]


def test_schedlang_curve_is_measured_at_each_checkpoint_on_a_tiny_model(tmp_path):
    from schedlang.core.target import resolve_target
    from schedlang.models.model_file import load_model

    model = load_model(
        str(ROOT / "examples/models/mlp.py"), {"layers": "1", "batch": "8", "features": "32"}
    )
    # one task: its first round of 8 trials crosses the first checkpoint, then 2 more trials
    curve = bench.schedlang_curve(model, resolve_target("llvm"), 10, [2, 10], tmp_path, 0, 2)
    points = curve["points"]
    assert [p["trials"] for p in points] == [8, 10]
    assert all(p["measured_s"] and p["min_s"] <= p["measured_s"] <= p["max_s"] for p in points)
    assert all(p["estimate_s"] for p in points) and curve["estimates"]
    assert curve["first_round"] == curve["estimates"][0] and curve["gain_after_first_round"] >= 0
    assert curve["quality"]["trials"] == 10


def test_the_trials_quality_counts_slow_and_refused_candidates():
    from types import SimpleNamespace

    def record(key, median_s, status="ok", proposer="builtin", schedule="split i by 2"):
        return SimpleNamespace(op_key=key, median_s=median_s, status=status, proposer=proposer,
                               schedule=schedule, is_ok=status == "ok")  # fmt: skip

    records = [
        record("a", 1.0, proposer="baseline", schedule=""),  # not a trial
        record("a", 2.0), record("a", 25.0), record("a", None, "check_error"),
        record("b", 1.0), record("b", 9.0),
    ]  # fmt: skip
    assert bench.trial_quality(records) == {
        "trials": 5, "slower_than_10x_best": 0.2, "refused_by_checker": 0.2,
    }  # fmt: skip


def test_metaschedule_records_are_read_in_the_order_they_were_measured(tmp_path):
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target

    func = load_op(str(ROOT / "examples/matmul.py"), {"M": "16", "N": "16", "K": "16"}).func
    import tvm

    mod = tvm.IRModule({"main": func})
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    workload = database.commit_workload(mod)
    for factor, seconds in ((1, 3.0), (2, 1.0), (4, 2.0)):  # measured slow, fast, middle
        sch = Schedule(mod)
        sch.split(sch.get_loops(sch.get_sblock("C"))[0], [None, factor])
        database.commit_tuning_record(
            ms.database.TuningRecord(
                sch.trace, workload, [seconds], resolve_target("llvm").to_tvm(),
                ms.arg_info.ArgInfo.from_prim_func(func),
            )
        )  # fmt: skip
    prefix, held = bench.prefix_database(tmp_path, 2)
    assert held == 2
    assert sorted(float(r.run_secs[0]) for r in prefix.get_all_tuning_records()) == [1.0, 3.0]
    assert bench.prefix_database(tmp_path, 10)[1] == 3


def test_the_command_runs_schedlangs_curve_alone_and_writes_its_json(tmp_path):
    """The script as run from the shell (`--no-metaschedule`), end to end at 4 trials: its model
    loaded from the bench's table, the curve measured, the JSON written (its main once failed at
    an import the functions' tests did not reach)."""
    import json

    out = tmp_path / "sample.json"
    args = ["--model", "mlp", "--trials", "4", "--checkpoints", "4", "--repeat", "1"]
    args += ["--no-metaschedule", "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    assert bench.main(args) == 0
    result = json.loads(out.read_text())
    assert result["model"] == "mlp" and "metaschedule" not in result
    assert [p["trials"] for p in result["schedlang"]["points"]][-1] == 4


def test_the_curves_are_drawn_and_redrawn_from_a_runs_json(tmp_path, capsys):
    import json

    ours = {
        "points": _points([(16, 30e-3), (136, 12.6e-3), (1000, 12.3e-3)]),
        "estimates": _points([(128, 13e-3), (136, 12.6e-3)], "estimate_s"),
    }
    theirs = {"points": _points([(16, 60e-3), (1000, 22.8e-3)])}
    result = {"model": "m", "trials": 1000, "cpu": "a CPU", "threads": 2, "repeat": 3,
              "schedlang": ours, "metaschedule": theirs,
              "efficiency": bench.efficiency(ours, theirs, 1000)}  # fmt: skip
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(result))
    picture = tmp_path / "curve.png"
    assert bench.main(["--from-json", str(saved), "--plot", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
    assert "**7.4x** MetaSchedule's sample efficiency" in capsys.readouterr().out
