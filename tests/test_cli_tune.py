"""`schedlang tune`, `best`, `history` and `compile --from-db`, end to end on a small matmul."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedlang.cli import app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SMALL = ["-D", "M=32", "-D", "N=32", "-D", "K=32"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    from schedlang.tuning import plot as plot_module

    work = tmp_path_factory.mktemp("tune")
    db, plot = work / "t.db", work / "curve.png"
    drawn = []
    real_curve = plot_module.tuning_curve

    def curve(records, path, **options):
        drawn.append(options)
        return real_curve(records, path, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plot_module, "tuning_curve", curve)
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
                "--json",
            ],
        )
    TUNED_PLOTS[:] = drawn
    return result, db, plot


TUNED_PLOTS: list[dict] = []  # the options the fixture's tuning curve was drawn with


def test_tune_json_summarises_the_run_and_plots(tuned):
    result, db, plot = tuned
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert {k: summary[k] for k in ("schema", "command", "ok", "interrupted", "op", "target")} == {
        "schema": 1,
        "command": "tune",
        "ok": True,
        "interrupted": False,
        "op": "matmul",
        "target": "llvm",
    }
    assert (summary["trials"], summary["measured"], summary["db"]) == (4, 4, str(db))
    assert summary["verified"] + summary["failed"] == 4 and summary["reused"] == 0
    assert [r["status"] for r in summary["records"]] == ["ok"] * 4
    assert all(r["gflops"] > 0 and r["median_s"] > 0 for r in summary["records"])
    best = summary["best"]
    assert "block C:" in best["schedule"] and best["gflops"] == max(
        r["gflops"] for r in summary["records"]
    )
    assert summary["baseline"] is None and summary["diagnostics"] == []
    assert summary["plot"] == str(plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    [options] = TUNED_PLOTS
    assert options["title"] == "matmul on llvm"
    baselines = options["baselines"]
    assert set(baselines) == {"unscheduled", "numpy"}  # no MetaSchedule record to compare with
    assert all(value > 0 for value in baselines.values())
    assert "[4/4] ok:" in result.stderr  # progress stays on stderr


def test_best_json_gives_the_records(tuned):
    _, db, _ = tuned
    result = CliRunner().invoke(
        app, ["best", str(EXAMPLES / "matmul.py"), *SMALL, "--db", str(db), "-n", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["command"], document["ok"], document["op"]) == ("best", True, "matmul")
    first, second = document["records"]
    assert first["median_s"] <= second["median_s"] and first["status"] == "ok"
    assert "block C:" in first["schedule"] and first["latencies_s"]


def test_best_quiet_prints_the_schedule_alone(tuned, tmp_path):
    _, db, _ = tuned
    result = CliRunner().invoke(
        app, ["best", str(EXAMPLES / "matmul.py"), *SMALL, "--db", str(db), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert "GFLOP/s" not in result.stdout and "block C:" in result.stdout
    sched = tmp_path / "best.sched"
    sched.write_text(result.stdout)
    check = CliRunner().invoke(app, ["check", str(EXAMPLES / "matmul.py"), str(sched), *SMALL])
    assert check.exit_code == 0, check.output


def test_compile_from_db_for_another_shape_says_so(tuned):
    """It said `no verified schedule for matmul on this target`, blaming the target."""
    _, db, _ = tuned
    other = ["-D", "M=32", "-D", "N=64", "-D", "K=32"]
    result = CliRunner().invoke(
        app,
        ["compile", str(EXAMPLES / "matmul.py"), *other, "--from-db", "--db", str(db)],
    )
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "error: no verified schedule for matmul (M=32, N=64, K=32, dtype=float32) on llvm in the "
        f"tuning database ({db})\n"
    )
    assert "4 verified records of `matmul` on llvm for another shape" in result.stderr
    assert f"schedlang tune {EXAMPLES / 'matmul.py'} -D M=32 -D N=64 -D K=32" in result.stderr
    assert "other targets" not in result.stderr


def test_compile_from_db_for_another_target_names_the_targets_it_has(tuned):
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
            "-t",
            "cuda",
            "--emit",
            "tir",
        ],
    )
    assert result.exit_code == 1
    assert "no verified schedule for matmul (M=32, N=32, K=32, dtype=float32) on cuda" in (
        result.stderr
    )
    assert "verified records of this op for other targets: llvm (4)" in result.stderr
    assert "another shape" not in result.stderr


def test_compile_from_db_with_a_negative_shape_names_the_parameter(tuned):
    _, db, _ = tuned
    result = CliRunner().invoke(
        app,
        ["compile", str(EXAMPLES / "matmul.py"), "-D", "N=-5", "--from-db", "--db", str(db)],
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("error: -D N=-5: shape parameter `N` must be positive\n")
    assert "flops" not in result.output


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
    args = ["tune", str(EXAMPLES / "matmul.py"), *SMALL, "--template", str(template)]
    args += ["--trials", "2", "--db", str(tmp_path / "t.db")]
    result = CliRunner().invoke(app, args)
    assert "Traceback" not in result.output
    # Not one candidate verified: the run failed, and says so after its summary. The checker
    # refused both points before they were proposed (issue 48): no trial spent on either.
    assert result.exit_code == 1, result.output
    assert (
        "error: no candidate verified: 0 measured; 2 refused by the checker before building: "
        "unknown axis `q`" in result.output
    )
    # Again, with --json: the points are refused again, nothing is measured, and the database
    # still holds no verified schedule: the run fails again.
    again = CliRunner().invoke(app, [*args, "--json"])
    assert again.exit_code == 1, again.output
    summary = json.loads(again.stdout)
    assert summary["ok"] is False and summary["measured"] == 0 and summary["best"] is None
    assert summary["refused"] == 2
    (diagnostic,) = summary["diagnostics"]
    assert diagnostic["severity"] == "error"
    assert "the database holds no verified schedule" in diagnostic["message"]


def test_ctrl_c_during_tune_keeps_the_records_says_so_and_plots_them(tmp_path, monkeypatch):
    """It exited 130 with no word; now: what was kept, where, the partial curve, and how to go
    on. The template is given as the argument after the op (`tune OP TEMPLATE`)."""
    from schedlang.tuning import tune as tune_module

    template = tmp_path / "t.sched"
    template.write_text("param T in [2, 4, 8, 16]\nsplit j by T\n")
    real_steps = tune_module.tune_steps

    def interrupted_after_one(*args, **kwargs):
        steps = real_steps(*args, **kwargs)
        with contextlib.closing(steps):
            for state in steps:
                yield state
                if state.done == 1:
                    os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C would

    monkeypatch.setattr(tune_module, "tune_steps", interrupted_after_one)
    from schedlang.tuning import plot as plot_module

    titles = []
    real_curve = plot_module.tuning_curve

    def curve(records, path, **options):
        titles.append(options["title"])
        return real_curve(records, path, **options)

    monkeypatch.setattr(plot_module, "tuning_curve", curve)
    db, plot = tmp_path / "t.db", tmp_path / "partial.png"
    # Python's own handler, whatever started the tests: a shell's background job ignores SIGINT.
    launched_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = CliRunner().invoke(
            app,
            [
                "tune",
                str(EXAMPLES / "matmul.py"),
                str(template),
                *SMALL,
                "--trials",
                "3",
                "--db",
                str(db),
                "--plot",
                str(plot),
                "--json",
            ],
        )
    finally:
        signal.signal(signal.SIGINT, launched_with)
    assert result.exit_code == 130, result.output
    summary = json.loads(result.stdout)
    assert (summary["ok"], summary["interrupted"], summary["measured"]) == (False, True, 1)
    assert summary["plot"] == str(plot) and summary["records"][0]["status"] == "ok"
    assert "Traceback" not in result.output
    assert (
        f"interrupted: 1 candidate measured in this run; 1 record of matmul on llvm kept in {db}\n"
        in result.stderr
    )
    assert f"wrote the partial tuning curve to {plot}\n" in result.stderr
    assert "rerun the same command to go on" in result.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert titles == ["matmul on llvm (interrupted)"]
    history = CliRunner().invoke(app, ["history", "--db", str(db), "--format", "json"])
    [record] = json.loads(history.stdout)
    assert record["template"] is not None and record["status"] == "ok"


def test_list_templates_describes_the_builtin_proposer_without_an_op():
    from schedlang.propose.builtin import describe_templates

    templates = describe_templates()
    result = CliRunner().invoke(app, ["tune", "--list-templates"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "CPU (--target llvm), in the order they are tried:"
    first = templates[0]
    assert lines[1] == f"  {first.name}  (up to {first.space} knob points)"
    assert lines[2] == "    matches: " + first.matches[: len(lines[2]) - len("    matches: ")]
    assert "GPU (--target cuda), in the order they are tried:" in lines
    assert all(f"  {t.name}  (up to {t.space} knob points" in result.stdout for t in templates)
    result = CliRunner().invoke(app, ["tune", "--list-templates", "--json"])
    document = json.loads(result.stdout)
    assert [t["name"] for t in document["templates"]] == [t.name for t in templates]
    assert set(document["templates"][0]) >= {"name", "target", "matches", "knobs", "space"}


def test_tune_without_an_op_is_a_usage_error():
    result = CliRunner().invoke(app, ["tune", "--trials", "2"])
    assert result.exit_code == 2 and "missing: give the op to tune" in result.output


def test_list_templates_without_the_description_says_so(monkeypatch):
    from schedlang.propose import builtin

    monkeypatch.delattr(builtin, "describe_templates", raising=False)
    result = CliRunner().invoke(app, ["tune", "--list-templates"])
    assert result.exit_code == 1
    assert "describe_templates is missing" in result.stderr


# --- the tuning curve ----------------------------------------------------------------------------


def _record(gflops: float | None, status: str = "ok", proposer: str = "builtin"):
    from schedlang.store.records import Record

    return Record(
        op_key="k",
        op_name="matmul",
        target_key="t",
        target={},
        schedule="",
        knobs={},
        template=None,
        status=status,
        reason="",
        latencies_s=(),
        median_s=1 / gflops if gflops else None,
        gflops=gflops,
        proposer=proposer,
        seed=0,
        created_at=0.0,
        schedlang_version="",
        tvm_version="",
    )


def test_the_curve_is_steps_with_labelled_baselines_and_whole_trials():
    pytest.importorskip("matplotlib")
    import math

    import matplotlib.pyplot as plt

    from schedlang.tuning.plot import best_so_far, draw_curve

    records = [_record(None, "crash"), _record(2.0), _record(1.0), _record(5.0)]
    curve = best_so_far(records)
    assert math.isnan(curve[0]) and curve[1:] == [2.0, 2.0, 5.0]
    figure = draw_curve(records, baselines={"unscheduled": 0.5, "numpy": 3.0})
    try:
        [axes] = figure.axes
        step = axes.lines[0]
        assert step.get_drawstyle() == "steps-post"
        labels = [text.get_text() for text in axes.get_legend().get_texts()]
        assert labels == ["builtin", "unscheduled (0.5 GFLOP/s)", "numpy (3 GFLOP/s)"]
        assert {line.get_ydata()[0] for line in axes.lines[2:]} == {0.5, 3.0}
        assert all(float(tick).is_integer() for tick in axes.get_xticks())
    finally:
        plt.close(figure)


def test_plot_without_matplotlib_says_how_to_install_it_here(monkeypatch):
    import sys

    from schedlang.core.diagnostics import SchedlangError
    from schedlang.tuning.plot import require_matplotlib

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    with pytest.raises(SchedlangError) as info:
        require_matplotlib()
    assert info.value.message == "--plot needs matplotlib, which is not installed"
    assert info.value.notes == (
        f"install it into this Python: `{sys.executable} -m pip install matplotlib`",
    )


def test_plot_baselines_leave_out_what_cannot_be_measured_and_say_why(monkeypatch):
    from types import SimpleNamespace

    from schedlang.tuning import plot

    def broken(*args):
        raise RuntimeError("InternalError: cannot build the unscheduled op")

    monkeypatch.setattr(plot, "unscheduled_gflops", broken)
    monkeypatch.setattr(plot, "numpy_gflops", lambda op: 3.0)
    monkeypatch.setattr(plot, "metaschedule_gflops", lambda db, op, target: 7.0)
    cpu, notes = SimpleNamespace(is_gpu=False), []
    lines = plot.baselines(None, cpu, None, note=notes.append)
    assert lines == {"numpy": 3.0, "MetaSchedule": 7.0}
    assert notes == [
        "note: the plot has no unscheduled baseline: "
        "RuntimeError: InternalError: cannot build the unscheduled op"
    ]
    # Measured on remote devices: nothing timed here; the tuner's own unscheduled measurement.
    gpu = SimpleNamespace(is_gpu=True)
    lines = plot.baselines(None, gpu, None, _record(0.5, proposer="baseline"), local=False)
    assert lines == {"unscheduled": 0.5, "MetaSchedule": 7.0}


def test_tune_model_times_each_candidate_as_told(tmp_path, monkeypatch):
    """--repeat and --min-repeat-ms reach the tuner's settings (3 and 40 ms unless given: a
    model's default, shorter than one op's `tune`)."""
    seen = []

    def settings_of(tasks, tgt, db, settings, *args, **kwargs):
        seen.append((settings.repeat, settings.min_repeat_ms))
        yield from ()

    _tune_model_with(monkeypatch, tmp_path, settings_of)
    _tune_model_with(monkeypatch, tmp_path, settings_of, "--repeat", "5", "--min-repeat-ms", "100")
    assert seen == [(3, 40), (5, 100)]
    # The CLI writes the defaults as literals (it must not import the tuner to start): the same
    # as the tuner's own.
    from schedlang.models.tune_model import MIN_REPEAT_MS, REPEAT

    assert seen[0] == (REPEAT, MIN_REPEAT_MS)


def _tune_model_with(monkeypatch, tmp_path, tune_model, *options: str):
    """`schedlang tune-model mlp.py` over two tasks (dense, relu), `tune_model` standing in for
    the tuner: it gets the tasks and yields turns, rounds of one task each."""
    from types import SimpleNamespace

    from schedlang.cli import model as model_commands
    from schedlang.models import tune_model as tune_model_module

    tasks = [
        SimpleNamespace(name="dense", key="k-dense", flops=2_000_000, calls=2),
        SimpleNamespace(name="relu", key="k-relu", flops=4_000, calls=1),
    ]
    import tvm

    model = SimpleNamespace(name="mlp", mod=tvm.IRModule())  # its module keys it in the database
    monkeypatch.setattr(model_commands, "load_model_arg", lambda spec, defines: model)
    monkeypatch.setattr(tune_model_module, "model_tasks", lambda *args, **kwargs: tasks)
    monkeypatch.setattr(
        tune_model_module, "plan", lambda *args: tune_model_module.Plan("other", ("generic",))
    )
    monkeypatch.setattr(tune_model_module, "tune_model_steps", tune_model)
    db = tmp_path / "t.db"
    args = ["tune-model", "mlp.py", "--trials", "3", "--db", str(db), *options]
    return CliRunner().invoke(app, args), db


def _turns(tasks, trials, results):
    """The turns of a scheduler over `tasks`, each result (or SchedlangError) one round."""
    from schedlang.models.scheduler import GradientScheduler
    from schedlang.models.tune_model import Turn

    scheduler = GradientScheduler(tasks, trials)
    for state, result in zip(scheduler.states, results, strict=False):
        if isinstance(result, Exception):
            scheduler.fail(state, result.message)
            yield Turn(state, 1, None, result, scheduler)
            continue
        best = result.best.median_s if result.best else None
        scheduler.record(state, len(result.records), best)
        yield Turn(state, 1, result, None, scheduler)


def test_ctrl_c_during_tune_model_says_what_was_kept(tmp_path, monkeypatch):
    from schedlang.core.diagnostics import SchedlangError

    def interrupted(tasks, *args, trials, **kwargs):
        yield from _turns(tasks, trials, [SchedlangError("no template for it")])
        raise KeyboardInterrupt

    result, db = _tune_model_with(monkeypatch, tmp_path, interrupted)
    assert result.exit_code == 130, result.output
    assert "dense: not tuned: no template for it" in result.stderr
    assert (
        f"interrupted after 0 of 3 trials; every candidate measured so far is kept in {db}\n"
        in result.stderr
    )
    assert "rerun the same command to go on" in result.stderr


def test_tune_model_fails_when_no_function_verifies(tmp_path, monkeypatch):
    """Like `tune` with nothing verified: exit 1, and no "build it with" as if it had worked."""
    from types import SimpleNamespace

    from schedlang.core.diagnostics import SchedlangError

    def nothing_verified(tasks, *args, trials, **kwargs):
        failed = SimpleNamespace(records=[SimpleNamespace(is_ok=False)], best=None)
        yield from _turns(tasks, trials, [SchedlangError("no template for it"), failed])

    result, _ = _tune_model_with(monkeypatch, tmp_path, nothing_verified)
    assert result.exit_code == 1, result.output
    assert "relu: 1 measured, 0 ok, nothing verified" in result.output
    assert "error: no function of mlp.py got a verified schedule (2 of 2 tried)" in result.stderr
    assert "build it with" not in result.output


def test_tune_passes_the_hint_to_the_builtin_proposer(tmp_path, monkeypatch):
    """`--hint` reached only the model; the built-in proposer reads it too (templates it names go
    first), so `tune` hands it to the tuner whichever proposer runs."""
    from schedlang.tuning import tune as tune_module

    seen = {}

    def recorded(*args, hint=None, **kwargs):
        seen["hint"] = hint
        raise KeyboardInterrupt  # stop before anything is built

    monkeypatch.setattr(tune_module, "tune_steps", recorded)
    result = CliRunner().invoke(
        app,
        [
            "tune",
            str(EXAMPLES / "matmul.py"),
            *SMALL,
            "--trials",
            "1",
            "--db",
            str(tmp_path / "t.db"),
            "--hint",
            "the tiled one",
        ],
    )
    assert result.exit_code == 130, result.output
    assert seen == {"hint": "the tiled one"}


def test_tune_stops_once_converged_says_why_and_no_early_stop_measures_more(tmp_path, monkeypatch):
    """Issue 48: a flat curve (every candidate a millisecond) stops 64 trials after its first
    point, with the reason on stdout and in --json; run again it stops at once, and
    --no-early-stop measures more."""
    from schedlang.tuning import tune as tune_module
    from tests.test_tune import WIDE, FlatMeasurer

    monkeypatch.setattr(tune_module, "Measurer", FlatMeasurer)
    template = tmp_path / "wide.sched"
    template.write_text(WIDE)
    base = [
        "tune",
        str(EXAMPLES / "matmul.py"),
        str(template),
        *SMALL,
        "--db",
        str(tmp_path / "t.db"),
    ]
    reason = "converged: 0.0% over the last 64 trials (margin 1%, window 64)"
    result = CliRunner().invoke(app, [*base, "--trials", "80", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["stopped"] == reason and summary["measured"] == 72
    result = CliRunner().invoke(app, [*base, "--trials", "80"])
    assert result.exit_code == 0, result.output
    assert "0 measured" in result.stdout
    assert f"stopped: {reason}; --no-early-stop spends every --trials\n" in result.stdout
    result = CliRunner().invoke(app, [*base, "--trials", "8", "--no-early-stop", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["stopped"] is None and summary["measured"] == 8


def test_tune_model_early_stop_is_on_unless_told_and_says_why_it_stopped(tmp_path, monkeypatch):
    from schedlang.models.scheduler import GradientScheduler
    from schedlang.models.tune_model import Scheduled
    from schedlang.tuning.convergence import Stop

    seen = []

    def stopped(tasks, tgt, db, settings, *args, trials, **kwargs):
        seen.append(settings.early_stop)
        scheduler = GradientScheduler(tasks, trials, {task.key: 1e-3 for task in tasks})
        scheduler.stop = Stop(0.004, 64, 0.01, 136, 3e-3)
        yield Scheduled(scheduler)

    result, _ = _tune_model_with(monkeypatch, tmp_path, stopped)
    assert result.exit_code == 0, result.output
    assert (
        "stopped: converged: 0.4% over the last 64 trials (margin 1%, window 64); "
        "--no-early-stop spends every --trials\n" in result.stdout
    )
    assert "0 trials measured" in result.stdout  # the tasks' bests came from the database
    _tune_model_with(monkeypatch, tmp_path, stopped, "--no-early-stop")
    assert seen == [True, False]
