"""`schedlang report`: the page's contents read from a database (made here from records, no TVM
run), its charts (golden SVG), bad input (an empty, damaged, foreign or newer file), and a page
written whole or not at all. tests/test_report_browser.py opens the report of a real tuning run
in Chromium."""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedlang.cli import app
from schedlang.core.diagnostics import SchedlangError
from schedlang.report import charts
from schedlang.report.contents import failure_groups, read_contents
from schedlang.report.page import write_report, write_whole
from schedlang.store.db import Database
from schedlang.store.records import Record, Status

CPU = '{"kind":"llvm","mcpu":"skylake"}'


def record(schedule: str, gflops: float | None, **changes) -> Record:
    base = Record(
        op_key="00ff00ff00ff00ff", op_name="matmul", target_key=CPU,
        target={"kind": "llvm", "mcpu": "skylake"}, schedule=schedule, knobs={}, template=None,
        status=Status.OK if gflops else Status.BUILD_ERROR, reason="" if gflops else "boom",
        latencies_s=(1e-3,) if gflops else (), median_s=2.0 / gflops / 1e3 if gflops else None,
        gflops=gflops, proposer="builtin", seed=0, created_at=1_700_000_000.0,
        schedlang_version="0.1.0", tvm_version="0.27.0",
    )  # fmt: skip
    return replace(base, **changes)


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """An op's tuning: its unscheduled build, five trials (two failed alike, one otherwise), a
    MetaSchedule record; and a model of one function, timed."""
    path = tmp_path / "tune.db"
    with Database(path) as db:
        db.add(record("", 10.0, proposer="baseline", created_at=1.0))
        for index, (text, gflops) in enumerate(
            [("split i by 4", 20.0), ("split i by 8", None), ("split i by 16", 50.0),
             ("split i by 32", None), ("split i by 64", 30.0)], start=2,
        ):  # fmt: skip
            reason = f"TVM rejected factor {index}" if gflops is None else ""
            db.add(record(text, gflops, created_at=float(index), reason=reason))
        db.add(
            record("split i by 3", None, status=Status.WRONG, reason="max error 0.5", created_at=9)
        )
        db.add(record("split j by 2", 40.0, proposer="metaschedule", created_at=10.0))
        db.add_model("m0", "mlp", CPU, [{"key": "00ff00ff00ff00ff", "name": "dense", "calls": 2}])
        db.add_model_timings(
            "m0", CPU,
            [{"label": "tuned", "median_s": 1e-4}, {"label": "numpy", "median_s": 4e-4},
             {"label": "PyTorch eager", "skipped": "torch is not installed"}],
        )  # fmt: skip
    return path


def test_contents_of_an_op_curve_baselines_best_and_failures(database: Path) -> None:
    contents = read_contents(database, lower_best=False)
    assert contents.problems == [] and contents.records == 8
    [op] = contents.ops
    assert op.title == "matmul on llvm -mcpu=skylake"
    # the trials, in order; the unscheduled build and MetaSchedule's record are baselines
    assert [r.schedule for r in op.records][:2] == ["split i by 4", "split i by 8"]
    assert len(op.records) == 6
    assert op.baselines == {"unscheduled": 10.0, "MetaSchedule": 40.0}
    assert [b.record.gflops for b in op.best] == [50.0, 30.0, 20.0]
    assert op.statuses == {"ok": 3, "build_error": 2, "wrong": 1}
    assert [(g.status, g.reason, g.count) for g in op.failures] == [
        ("build_error", "TVM rejected factor N", 2),
        ("wrong", "max error N", 1),
    ]
    assert op.failures[0].example.schedule == "split i by 8"  # the first of its group


def test_contents_of_a_model_time_before_and_after_and_its_latencies(database: Path) -> None:
    [model] = read_contents(database, lower_best=False).models
    assert model.name == "mlp" and model.target == "llvm -mcpu=skylake"
    [task] = model.tasks
    # two calls: the unscheduled build's time and the best time, each twice
    assert task.before_s == pytest.approx(2 * 2.0 / 10.0 / 1e3)
    assert task.after_s == pytest.approx(2 * 2.0 / 50.0 / 1e3)
    assert task.trials == 6  # not the unscheduled build, not MetaSchedule's record
    # the estimate after each trial: the unscheduled build until a trial beats it, calls included
    assert [t for t, _ in model.curve] == [1, 2, 3, 4, 5, 6]
    assert [round(v * 1e6) for _, v in model.curve] == [200, 200, 80, 80, 80, 80]
    assert model.tuned_s == pytest.approx(task.after_s)
    assert model.timings == [
        ("tuned", 1e-4, None),
        ("numpy", 4e-4, None),
        ("PyTorch eager", None, "torch is not installed"),
    ]


def test_failures_are_grouped_by_reason_whatever_their_numbers_and_names() -> None:
    failed = [
        record("a", None, reason="split factor 3 does not divide 64"),
        record("b", None, reason="split factor 5 does not divide 128"),
        record("c", None, reason="no block `C` in matmul"),
        record("d", None, reason="no block `D` in matmul"),
        record("e", None, reason="no block `E` in matmul", status=Status.CHECK_ERROR),
    ]
    groups = failure_groups(failed)
    assert [(g.status, g.reason, g.count, g.example.schedule) for g in groups] == [
        ("build_error", "no block `…` in matmul", 2, "c"),
        ("build_error", "split factor N does not divide N", 2, "a"),
        ("check_error", "no block `…` in matmul", 1, "e"),
    ]


def test_the_page_shows_everything_and_fetches_nothing(database: Path, tmp_path: Path) -> None:
    output = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(database), "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert f"wrote {output} (8 records, 1 ops and targets, 1 models)" in result.output
    html = output.read_text()
    # the model's four charts (time per function, estimate against trials, trials per function,
    # end to end), the op's curve
    assert html.count("<svg") == 5
    assert 'aria-label="estimated latency of mlp against trials"' in html
    assert '<td class="name">dense</td>' in html  # the table of functions by full name
    assert '<span class="k">split</span>' in html  # highlighted schedules
    assert "TVM rejected factor N" in html and "<details><summary>record #3</summary>" in html
    assert "skipped: torch is not installed" in html and "4.00x" in html
    assert "the database does not keep this op&#39;s function" in html  # no TIR without it
    # self-contained: nothing to fetch, no script
    assert "<script" not in html and "http://" not in html.replace('"http://www.w3.org', "")
    assert "https://" not in html and "src=" not in html
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_curve_svg_golden(golden) -> None:
    svg = charts.curve_svg(
        {"builtin": [20.0, None, 50.0, 30.0], "model:qwen": [None, 35.0]},
        {"unscheduled": 10.0, "MetaSchedule": 40.0},
        "tuning curve of matmul",
    )
    golden("report/curve.svg", svg + "\n")


def test_bar_charts_golden(golden) -> None:
    functions = charts.function_bars_svg(
        [("dense", 4e-4, 8e-5), ("fused_conv2d_winograd_transform_add_relu_1", 1e-4, 2e-5),
         ("softmax", 1e-4, None)],
        "time per function of mlp",
    )  # fmt: skip
    curve = charts.latency_curve_svg(
        [(136, 12.6e-3), (144, 12.58e-3), (184, 12.5e-3), (1000, 12.3e-3)], "estimate"
    )
    trials = charts.trial_bars_svg([("dense", 24), ("softmax", 8)], "trials of mlp")
    latencies = charts.latency_bars_svg(
        [("tuned", 1e-4), ("default (tvm.compile)", 2.5e-4), ("numpy", 4e-4)], "latency of mlp"
    )
    golden("report/bars.svg", "\n".join((functions, curve, trials, latencies)) + "\n")


def test_the_tuned_bars_are_scaled_to_the_tuned_model_not_the_untuned_one() -> None:
    # untuned 1.87 s, tuned 12 ms (issue 48): scaled to the untuned model each bar was a sliver
    svg = charts.function_bars_svg(
        [("conv", 1.5, 9e-3), ("dense", 0.37, 3e-3)], "time per function"
    )
    widths = [float(w) for w in re.findall(r'class="bar after"[^>]* width="([\d.]+)"', svg)]
    shares = re.findall(r'data-share="([\d.]+)"', svg)
    assert shares == ["0.7500", "0.2500"]  # of the tuned total
    assert widths[0] > 150 and widths[0] / widths[1] == pytest.approx(3, rel=0.01)
    assert "untuned 1.5 s, 167x" in svg and 'data-before="1.5"' in svg
    assert charts.speedup(1070.4) == "1,070x" and charts.speedup(82.44) == "82.4x"


def test_long_function_names_are_shortened_in_the_middle_and_whole_on_hover() -> None:
    name = "fused_conv2d_winograd_transform_add_relu_1"
    short = charts.short_name(name)
    assert len(short) == charts.NAME_CHARS and "…" in short
    assert short.startswith("fused_conv2d") and short.endswith("add_relu_1")
    assert charts.short_name("dense") == "dense"
    svg = charts.trial_bars_svg([(name, 3)], "trials")
    assert f"<title>{name}</title>{short}</text>" in svg


def test_ticks_are_round_numbers() -> None:
    assert charts.nice_ticks(54.0) == [0, 20, 40, 60]
    assert charts.nice_ticks(0.9) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert charts.nice_ticks(0.0) == [0.0, 1.0]


# --- bad input -----------------------------------------------------------------------------------


def report(database: Path, tmp_path: Path):
    output = tmp_path / "out.html"
    return CliRunner().invoke(app, ["report", str(database), "-o", str(output)]), output


def test_an_empty_database_gives_a_page_that_says_so(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    Database(path).close()
    result, output = report(path, tmp_path)
    assert result.exit_code == 0, result.output
    assert "The database holds no tuning records" in output.read_text()


def test_an_empty_file_gives_a_page_that_says_what_could_not_be_read(tmp_path: Path) -> None:
    path = tmp_path / "zero.db"
    path.write_bytes(b"")
    result, output = report(path, tmp_path)
    assert result.exit_code == 0, result.output
    html = output.read_text()
    assert "Not everything in this database could be read" in html
    assert "is an empty file: no tuning database was written to it" in html


def test_a_damaged_database_gives_a_page_of_what_could_be_read(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    with Database(path) as db:
        for number in range(300):
            db.add(record(f"split i by {number}", 1.0 + number, created_at=float(number)))
    os.truncate(path, path.stat().st_size * 6 // 10)
    result, output = report(path, tmp_path)
    assert result.exit_code == 0, result.output
    assert "damaged" in result.stderr  # said on stderr too
    html = output.read_text()
    assert f"the tuning database {path} is damaged" in html
    assert "records could not be read and are left out" in html
    [op] = read_contents(path).ops
    assert 0 < len(op.records) < 300


def test_a_database_of_a_newer_schedlang_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    Database(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    result, output = report(path, tmp_path)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {path} was written by a newer schedlang")
    assert "Traceback" not in result.output and not output.exists()


def test_another_programs_file_and_a_missing_one_are_errors(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    result, output = report(other, tmp_path)
    assert result.exit_code == 1 and "not a schedlang database" in result.stderr
    result, output = report(tmp_path / "nowhere.db", tmp_path)
    assert result.exit_code == 1 and "no tuning database at" in result.stderr
    assert not output.exists()


def test_an_older_database_reads_without_models_or_functions(database: Path, tmp_path: Path):
    with sqlite3.connect(database) as conn:
        conn.execute("DROP TABLE ops")
        conn.execute("DROP TABLE models")
        conn.execute("PRAGMA user_version = 2")
    contents = read_contents(database)
    assert contents.problems == [] and contents.models == [] and len(contents.ops) == 1
    assert "does not keep this op's function" in contents.ops[0].best[0].why_no_tir


def test_a_page_is_written_whole_or_not_at_all(tmp_path: Path, monkeypatch) -> None:
    page = tmp_path / "report.html"
    page.write_text("the old page")

    def no_rename(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(SchedlangError, match=r"cannot write .*No space left on device"):
        write_whole(page, "the new page")
    assert page.read_text() == "the old page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no temporary left
    monkeypatch.undo()
    write_whole(page, "the new page")
    assert page.read_text() == "the new page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_write_report_into_a_missing_folder_is_an_error(database: Path, tmp_path: Path) -> None:
    with pytest.raises(SchedlangError, match="cannot write"):
        write_report(database, tmp_path / "no" / "such" / "report.html", lower_best=False)
