"""The library's workflows (schedlang.workflows): each returns its result and reports events to the
sink it is given, with no CLI in the loop; the runner is picked by one factory, the device from
the target."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.target import resolve_target
from schedlang.run.runner import LocalRunner, RunnerSettings, make_runner
from schedlang.store.db import Database
from schedlang.tuning.settings import Settings
from schedlang.workflows import events as ev
from tests.planted import doubling_op, fast_settings

LLVM = resolve_target("llvm")
ROOT = Path(__file__).resolve().parent.parent


def test_tune_op_returns_its_result_and_reports_each_candidate(tmp_path):
    from schedlang.propose.interface import Proposal
    from schedlang.workflows import tune_op

    seen: list[ev.Event] = []
    template = Proposal("param T in [4, 8, 16]\nsplit i by T\nvectorize i.i", "template")
    result = tune_op(
        doubling_op(), LLVM, tmp_path / "t.db", settings=fast_settings(trials=3),
        templates=[template], events=seen.append,
    )  # fmt: skip
    assert isinstance(seen[0], ev.Note) and "started a new, empty one" in seen[0].text
    kinds = [type(event).__name__ for event in seen[1:]]
    assert kinds == ["TaskStarted", *["TrialMeasured"] * len(result.records), "TaskFinished"]
    assert result.failure is None and result.best is not None and result.best.is_ok
    assert result.summary["measured"] == len(result.records) == 3
    assert result.decisions and result.op == "double" and result.target == "llvm"
    with Database(tmp_path / "t.db", read_only=True) as db:  # the database holds what it says
        assert db.best(result.best.op_key, result.best.target_key)[0].id == result.best.id


def test_ctrl_c_in_tune_op_is_a_typed_interruption_that_says_what_was_kept(tmp_path):
    """Ctrl-C while the caller shows an event reaches the workflow, which stops its run there
    and says what the database kept."""
    from schedlang.propose.interface import Proposal
    from schedlang.workflows import TuneInterrupted, tune_op

    seen: list[ev.Event] = []

    def show(event: ev.Event) -> None:
        seen.append(event)
        if isinstance(event, ev.TrialMeasured):
            raise KeyboardInterrupt  # as Ctrl-C would, while the first trial is shown

    template = Proposal("param T in [4, 8, 16]\nsplit i by T", "template")
    with pytest.raises(TuneInterrupted) as caught:
        tune_op(
            doubling_op(), LLVM, tmp_path / "t.db", settings=fast_settings(trials=3),
            templates=[template], events=show,
        )  # fmt: skip
    assert caught.value.measured == 1 and caught.value.kept == 1
    assert caught.value.summary["interrupted"] is True
    assert isinstance(seen[-1], ev.TaskFinished)  # the progress display is closed


def test_a_workflows_steps_are_the_callers_to_iterate(tmp_path):
    from schedlang.propose.interface import Proposal
    from schedlang.workflows import tune_op_steps

    template = Proposal("param T in [4, 8]\nsplit i by T", "template")
    steps = tune_op_steps(
        doubling_op(), LLVM, tmp_path / "t.db", settings=fast_settings(trials=2),
        templates=[template],
    )  # fmt: skip
    with pytest.raises(RuntimeError):
        steps.result  # noqa: B018 - not before its steps are spent
    names = [type(event).__name__ for event in steps]
    assert names[-1] == "TaskFinished" and names.count("TrialMeasured") == 2
    assert len(steps.result.records) == 2


def test_tune_model_plans_keeps_the_model_and_reports_each_round(tmp_path, monkeypatch):
    from schedlang.models.model_file import load_model
    from schedlang.workflows import tune_model

    model = load_model(
        str(ROOT / "examples/models/mlp.py"),
        {"batch": "2", "features": "16", "hidden": "16", "layers": "1"},
    )
    seen: list[ev.Event] = []
    result = tune_model(
        model, LLVM, tmp_path / "m.db", trials=2, events=seen.append,
        settings=Settings(repeat=1, min_repeat_ms=1, batch=1, builders=1),
    )  # fmt: skip
    planned = [e for e in seen if isinstance(e, ev.ModelPlanned)]
    rounds = [e for e in seen if isinstance(e, ev.RoundDone)]
    assert len(planned) == 1 and seen[0] is planned[0]  # before anything is measured
    assert rounds and result.trials == sum(len(r.turn.result.records) for r in rounds)
    assert result.verified and len(result.tasks) == len(planned[0].tasks)
    with Database(tmp_path / "m.db", read_only=True) as db:
        assert db.models(), "the model is kept for `schedlang report`"


def test_a_run_that_stops_early_ends_with_a_stopped_event(tmp_path, monkeypatch):
    """Issue 48: an op's run and a model's that converge say so last, and their results hold
    the stop (here a model whose tasks' bests the stand-in scheduler has converged on)."""
    from types import SimpleNamespace

    from schedlang.core.ops import load_op
    from schedlang.models import tune_model as tasks_module
    from schedlang.models.scheduler import GradientScheduler
    from schedlang.propose.interface import Proposal
    from schedlang.tuning import tune as tune_module
    from schedlang.tuning.convergence import Stop
    from schedlang.workflows import tune_model, tune_op
    from tests.test_tune import WIDE, FlatMeasurer

    monkeypatch.setattr(tune_module, "Measurer", FlatMeasurer)
    seen: list[ev.Event] = []
    matmul = load_op(str(ROOT / "examples/matmul.py"), {"M": "32", "N": "32", "K": "32"})
    op = tune_op(
        matmul, LLVM, tmp_path / "t.db", settings=Settings(trials=100, batch=8),
        templates=[Proposal(WIDE, "template")], events=seen.append,
    )  # fmt: skip
    assert isinstance(seen[-1], ev.Stopped) and seen[-1].stop is op.run.stop is not None
    assert op.summary["stopped"] == seen[-1].stop.reason and len(op.records) == 72

    def converged(tasks, target, db, settings, *, trials, **kwargs):
        scheduler = GradientScheduler(tasks, trials, {task.key: 1e-3 for task in tasks})
        scheduler.stop = Stop(0.0, 64, 0.01, 72, 1e-3)
        yield tasks_module.Scheduled(scheduler)

    task = SimpleNamespace(name="dense", key="k-dense", flops=2_000, calls=1)
    monkeypatch.setattr(tasks_module, "model_tasks", lambda *args, **kwargs: [task])
    monkeypatch.setattr(tasks_module, "plan", lambda *args: tasks_module.Plan("other", ("g",)))
    monkeypatch.setattr(tasks_module, "tune_model_steps", converged)
    seen.clear()
    import tvm

    model = SimpleNamespace(name="m", mod=tvm.IRModule())
    result = tune_model(model, LLVM, tmp_path / "m.db", trials=100, events=seen.append)
    assert isinstance(seen[-1], ev.Stopped) and result.stop is seen[-1].stop
    assert result.trials == 0 and result.verified  # the tasks' bests, from the database


def test_build_model_reports_its_steps_in_order_and_returns_the_document(tmp_path):
    from schedlang.models.model_file import load_model
    from schedlang.workflows import build_model

    model = load_model(str(ROOT / "examples/models/mlp.py"), {"batch": "2", "layers": "1"})
    seen: list[ev.Event] = []
    result = build_model(
        model, LLVM, tmp_path / "missing.db", output=tmp_path / "m.so", events=seen.append
    )
    steps = [e.step for e in seen if isinstance(e, ev.BuildStep)]
    assert steps == ["built", "verified", "wrote"]
    assert any(isinstance(e, ev.Note) and e.warning for e in seen)  # the missing database
    assert result.library == tmp_path / "m.so" and result.library.is_file()
    document = result.as_json()
    assert document["verified"] == result.verified and "profile" not in document
    assert len(document["functions"]) == len(result.applied)


def test_evaluate_model_runs_the_arms_with_a_tiny_model_step_by_step(tmp_path):
    """Its steps form, as the others': every line a Note in the caller's hands, then the result;
    run to its end with a sink, the arms resume (nothing left to measure) to the same report."""
    torch = pytest.importorskip("torch")
    from schedlang.llm.evaluate import Evaluation, load_suite
    from schedlang.llm.spec import ModelSpec
    from schedlang.testing.tiny_model import build_tiny_model
    from schedlang.workflows import evaluate_model, evaluate_model_steps

    torch.set_num_threads(1)
    tiny = build_tiny_model(tmp_path / "tiny")
    suite = load_suite(["softmax"], ["rows=16", "cols=16"])
    spec = ModelSpec(str(tiny), max_new_tokens=64, answer_tokens=64)

    def evaluation():
        return Evaluation(suite, LLVM, spec, trials=2, out=tmp_path / "eval.json")

    steps = evaluate_model_steps(evaluation(), tmp_path / "main.db")
    with pytest.raises(RuntimeError):
        steps.result  # noqa: B018 - not before its steps are spent
    seen = list(steps)
    assert seen and all(isinstance(event, ev.Note) for event in seen)
    lines = [event.text for event in seen]
    assert any(line.startswith("[1/1] softmax") for line in lines), lines
    assert any(line.startswith("  [builtin 1/2] ") for line in lines), lines  # each candidate
    result = steps.result
    assert result.out.is_file() and result.table.is_file()
    assert result.markdown == result.table.read_text()
    assert result.report["ops"]

    again: list[str] = []
    rerun = evaluate_model(
        evaluation(), tmp_path / "main.db", events=lambda event: again.append(event.text)
    )
    assert sum("nothing to do" in line for line in again) == 2, again  # builtin and model
    assert rerun.report["ops"] == result.report["ops"]


# --- runners -------------------------------------------------------------------------------------


def test_the_runner_factory_picks_a_local_worker_without_a_tracker():
    runner = make_runner(LLVM, RunnerSettings(run_timeout_s=5), {})
    try:
        assert isinstance(runner, LocalRunner) and runner.parallelism == 1
    finally:
        runner.close()
    assert Settings().runner().is_local and Settings(run_timeout_s=7).runner().run_timeout_s == 7


def test_the_runner_factory_picks_the_rpc_runner_with_a_tracker(monkeypatch):
    from schedlang.run import remote

    made = []

    class StandIn:
        def __init__(self, settings, target, run_timeout_s, env):
            made.append((settings, target, run_timeout_s))

    monkeypatch.setattr(remote, "RemoteRunner", StandIn)
    settings = remote.remote_settings("127.0.0.1:9190", "box", None, None, 30.0)
    # A target this machine cannot run is fine: its kernels run on the tracker's devices.
    arm = resolve_target('{"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}')
    runner = make_runner(arm, RunnerSettings(run_timeout_s=9, remote=settings), {})
    assert isinstance(runner, StandIn) and made == [(settings, arm, 9)]
    with pytest.raises(SchedlangError):  # and here, it is refused before any worker starts
        make_runner(arm, RunnerSettings(), {})


def test_the_device_comes_from_the_target():
    assert LLVM.device() == "cpu"
    assert resolve_target("cuda").device() == "cuda"


def test_the_package_exports_the_workflows():
    import schedlang
    from schedlang import workflows

    for name in ("tune_op", "tune_model", "build_model", "evaluate_model"):
        assert getattr(schedlang, name) is getattr(workflows, name), name
        assert callable(getattr(workflows, f"{name}_steps")), name
    assert schedlang.tune_op.__name__ == "tune_op" and "events" in schedlang.tune_op.__doc__
