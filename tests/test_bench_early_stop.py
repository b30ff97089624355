"""bench/bench_early_stop.py at a tiny size: a default run (the stopping rule on) against a
finished full run's database, both built, checked and timed side by side."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import bench_early_stop as bench  # noqa: E402
import bench_sample_efficiency as sample  # noqa: E402


def test_a_default_run_is_timed_beside_a_full_runs_build(tmp_path, capsys):
    from schedlang.core.target import resolve_target
    from schedlang.models.model_file import load_model

    defines = {"layers": "1", "batch": "8", "features": "32"}
    model = load_model(str(ROOT / "examples/models/mlp.py"), defines)
    full = tmp_path / "full"
    full.mkdir()
    sample.schedlang_curve(model, resolve_target("llvm"), 6, [6], full, 0, 2)
    args = ["--model", "mlp", "--trials", "8", "--against", str(full / "schedlang.db")]
    args += [f"-D{k}={v}" for k, v in defines.items()]
    args += ["--repeat", "3", "--work-dir", str(tmp_path / "stop"), "--out", str(tmp_path / "o")]
    assert bench.main(args) == 0
    page = capsys.readouterr().out
    result = __import__("json").loads((tmp_path / "o").read_text())
    assert result["full"]["trials"] == 6 and result["stopped"]["trials"] <= 8
    assert result["stopped"]["estimate_s"] > 0 and result["quality_estimated"] > 0
    assert result["quality_measured"] > 0
    labels = [row["label"] for row in result["rows"]]
    assert labels[:3] == ["tuned", "full run (6 trials)", "default (tvm.compile)"]
    assert "| stopped run (default) |" in page and "Quality (full over stopped)" in page
