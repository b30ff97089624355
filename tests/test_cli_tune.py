"""`schedlang tune`, `best`, `history` and `compile --from-db`, end to end on a small matmul."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedlang.cli import app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SMALL = ["-D", "M=32", "-D", "N=32", "-D", "K=32"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    work = tmp_path_factory.mktemp("tune")
    db, plot = work / "t.db", work / "curve.png"
    result = CliRunner().invoke(
        app,
        [
            "tune",
            str(EXAMPLES / "matmul.py"),
            *SMALL,
            "--trials",
            "4",
            "--db",
            str(db),
            "--plot",
            str(plot),
            "--seed",
            "3",
        ],
    )
    return result, db, plot


def test_tune_measures_prints_the_best_schedule_and_plots(tuned):
    result, db, plot = tuned
    assert result.exit_code == 0, result.output
    assert "4 measured" in result.output
    assert "best (" in result.output and "block C:" in result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_best_prints_a_concrete_schedule(tuned):
    _, db, _ = tuned
    result = CliRunner().invoke(app, ["best", str(EXAMPLES / "matmul.py"), *SMALL, "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "GFLOP/s" in result.output and "param" not in result.output


def test_best_for_another_shape_or_target_finds_nothing(tuned):
    _, db, _ = tuned
    other_shape = ["-D", "M=64", "-D", "N=32", "-D", "K=32"]
    result = CliRunner().invoke(
        app, ["best", str(EXAMPLES / "matmul.py"), *other_shape, "--db", str(db)]
    )
    assert result.exit_code == 1 and "no verified schedule" in result.output
    result = CliRunner().invoke(
        app, ["best", str(EXAMPLES / "matmul.py"), *SMALL, "--target", "cuda", "--db", str(db)]
    )
    assert result.exit_code == 1 and "no verified schedule" in result.output


def test_history_exports_csv_and_json(tuned):
    _, db, _ = tuned
    result = CliRunner().invoke(app, ["history", "--db", str(db), "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 4 and {row["status"] for row in rows} == {"ok"}
    result = CliRunner().invoke(app, ["history", "--db", str(db), "--format", "json"])
    records = json.loads(result.stdout)
    assert len(records) == 4 and all(r["latencies_s"] for r in records)


def test_compile_from_db_uses_the_best_schedule(tuned, tmp_path):
    _, db, _ = tuned
    result = CliRunner().invoke(
        app,
        [
            "compile",
            str(EXAMPLES / "matmul.py"),
            *SMALL,
            "--from-db",
            "--db",
            str(db),
            "--emit",
            "tir",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "T.parallel" in result.stdout or "T.vectorized" in result.stdout


def test_tune_with_a_broken_template_reports_it_without_a_traceback(tmp_path):
    template = tmp_path / "bad.sched"
    template.write_text("param T in [4, 8]\nblock C:\n  split q by T\n")
    result = CliRunner().invoke(
        app,
        [
            "tune",
            str(EXAMPLES / "matmul.py"),
            *SMALL,
            "--template",
            str(template),
            "--trials",
            "2",
            "--db",
            str(tmp_path / "t.db"),
        ],
    )
    assert "Traceback" not in result.output
    assert "check_error" in result.output and "unknown axis `q`" in result.output
