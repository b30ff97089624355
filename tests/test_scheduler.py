"""The model's task scheduler (schedlang.models.scheduler, MetaSchedule's gradient-based one) and
`tune_model`'s rounds, with a tuner standing in for `tune`: which task gets the next trials, how
the budget is spent, where a task with a record in the database starts."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from schedlang.core.target import resolve_target
from schedlang.models.graph import Task
from schedlang.models.scheduler import ALPHA, WINDOW, GradientScheduler, TaskState
from schedlang.models.tune_model import tune_model
from schedlang.propose.interface import NothingToTune
from schedlang.tuning.tune import Settings


def _task(name: str, calls: int = 1, flops: int | None = 100) -> Task:
    return Task(name, SimpleNamespace(name=name), f"key-{name}", (name,), calls, flops)  # type: ignore[arg-type]


def test_every_task_gets_a_first_round_heaviest_first_sharing_the_budget():
    scheduler = GradientScheduler([_task("a"), _task("b"), _task("c")], trials=6)
    order = []
    while (turn := scheduler.next()) is not None and len(order) < 3:
        state, trials = turn
        order.append((state.task.name, trials))
        scheduler.record(state, trials, 1e-3)
    assert order == [("a", 2), ("b", 2), ("c", 2)]
    assert scheduler.next() is None and scheduler.left == 0 and scheduler.measured == 6


def test_a_model_of_many_tasks_gets_a_smaller_first_round_and_full_rounds_after():
    from schedlang.models.scheduler import FIRST_ROUND_MIN, FIRST_ROUND_TRIALS, ROUND_TRIALS

    def first(tasks: int, trials: int = 1000) -> int:
        scheduler = GradientScheduler([_task(f"t{i}") for i in range(tasks)], trials)
        return scheduler.next()[1]

    assert first(10) == ROUND_TRIALS  # ResNet-18-sized models keep a whole batch a task
    assert first(18) * 18 <= FIRST_ROUND_TRIALS  # 7 a task: 126 trials
    assert first(32) == 4  # MobileNetV2: 128 trials, not 256
    assert first(200) == FIRST_ROUND_MIN  # never fewer than two a task
    assert first(32, trials=64) == 2  # a small budget shares itself as before
    scheduler = GradientScheduler([_task(f"t{i}") for i in range(32)], 1000)
    _first_rounds(scheduler, [1e-3] * 32)
    assert scheduler.measured == 128 and scheduler.next()[1] == ROUND_TRIALS


def test_the_next_round_goes_to_the_largest_promised_drop_times_calls():
    slow, fast = _task("slow"), _task("fast", calls=10)
    scheduler = GradientScheduler([slow, fast], trials=100, round_trials=4)
    for best in (8e-3, 1e-3):
        state, trials = scheduler.next()
        scheduler.record(state, trials, best)
    # forward terms: 8 ms x 1 call against 1 ms x 10 calls: the one called ten times wins
    state, trials = scheduler.next()
    assert (state.task.name, trials) == ("fast", 4)


@pytest.mark.parametrize("timed", [True, False])
def test_the_next_round_goes_where_the_drop_per_second_of_tuning_is_largest(timed):
    dear, cheap = _task("dear"), _task("cheap")
    scheduler = GradientScheduler([dear, cheap], trials=100, round_trials=4)
    # dear: 2 ms, its 4 trials took 40 s (an unrolled 7x7 window LLVM builds slowly); cheap: 1 ms
    # in 2 s. Per trial dear promises twice the drop; per second of tuning a tenth of it.
    for best, seconds in ((2e-3, 40.0), (1e-3, 2.0)):
        state, trials = scheduler.next()
        scheduler.record(state, trials, best, seconds if timed else None)
    assert scheduler.next()[0].task is (cheap if timed else dear)
    assert scheduler.states[0].trial_s == (10.0 if timed else None)


def test_a_task_not_yet_timed_counts_as_the_median_trial():
    a, b, c = _task("a"), _task("b"), _task("c")
    scheduler = GradientScheduler([a, b, c], trials=100, round_trials=4)
    for best, seconds in ((1e-3, 4.0), (1e-3, 40.0), (1.5e-3, None)):
        state, trials = scheduler.next()
        scheduler.record(state, trials, best, seconds)
    # c is untimed: it counts as the median of a (1 s) and b (10 s), here b's 10 s (the upper
    # median), so a's 1 ms at 1 s a trial beats c's 1.5 ms at 10 s.
    assert scheduler.next()[0].task is a


def test_the_gradient_is_metaschedules():
    state = TaskState(_task("t", calls=2), best_s=[8.0, 4.0, 2.0, 1.0])
    backward, forward = (8.0 - 1.0) / WINDOW, 1.0 / 4
    assert state.gradient() == pytest.approx((ALPHA * backward + (1 - ALPHA) * forward) * 2)
    # with fewer rounds than the window: the forward term alone
    assert TaskState(_task("u"), best_s=[3.0, 2.0]).gradient() == pytest.approx(0.8 * 2.0 / 2)


def test_a_task_with_a_record_starts_from_it_and_others_are_measured_first():
    scheduler = GradientScheduler([_task("old"), _task("new")], trials=10, known={"key-old": 1.0})
    state, _ = scheduler.next()
    assert state.task.name == "new"


def test_spent_failed_and_unverified_tasks_get_no_more_rounds():
    spent, broken, unverified, good = (_task(n) for n in ("spent", "broken", "unverified", "good"))
    scheduler = GradientScheduler([spent, broken, unverified, good], trials=100)
    for state in list(scheduler.states):
        if state.task is broken:
            scheduler.fail(state, "no template")
            continue
        assert scheduler.next()[0] is state
        measured = 0 if state.task is spent else 3
        scheduler.record(state, measured, None if state.task is unverified else 1e-3)
    assert [s.task.name for s in scheduler.states if s.alive] == ["unverified", "good"]
    assert scheduler.next()[0].task is good
    assert scheduler.estimate_s() == (pytest.approx(2e-3), 2)  # spent and good; 2 unknown
    assert math.isinf(scheduler.states[2].best_s[-1])


class _FakeDb:
    def __init__(self, bests: dict[str, float], records: list | None = None):
        self.bests = bests
        self.saved = records or []  # what earlier runs measured: the stopping rule's curve

    def best(self, key, target_key):
        return [SimpleNamespace(median_s=self.bests[key])] if key in self.bests else []

    def records(self, key, target_key):
        return [record for record in self.saved if record.op_key == key]


def test_tune_model_spends_the_budget_in_rounds_and_goes_on_after_an_error():
    calls = []

    def fake_tune(op, target, db, *, settings, templates, proposer, workers):
        calls.append((op.name, settings.trials))
        if op.name == "bad":
            raise NothingToTune("nothing to tune: no template")
        latency = {"big": 4e-3, "small": 1e-4}[op.name] / (1 + len(calls))
        records = [SimpleNamespace(is_ok=True)] * settings.trials
        return SimpleNamespace(
            records=records, best=SimpleNamespace(median_s=latency), baseline=None
        )

    tasks = [_task("big"), _task("bad"), _task("small"), _task("symbolic", flops=None)]
    turns = list(
        tune_model(
            tasks, resolve_target("llvm"), _FakeDb({}), Settings(batch=4), trials=20,
            tune_task=fake_tune,
        )
    )  # fmt: skip
    assert [name for name, _ in calls[:3]] == ["big", "bad", "small"]  # each measured first
    # no lengths given: a symbolic task is neither the scheduler's nor tuned at lengths
    assert "symbolic" not in {name for name, _ in calls}
    assert turns[1].error is not None and ("bad", 4) not in calls[3:]
    assert sum(t for name, t in calls if name != "bad") == 20
    assert {name for name, _ in calls[3:]} == {"big"}  # where the time is


def test_tune_model_measures_every_round_in_one_set_of_workers_and_stops_them():
    from schedlang.tuning.measurer import Workers

    pids, seen = [], []

    def fake_tune(op, target, db, *, settings, templates, proposer, workers):
        assert isinstance(workers, Workers)
        seen.append(workers)
        pids.append(workers.builders[0].call("ping", 60))  # a real worker process
        records = [SimpleNamespace(is_ok=True)] * settings.trials
        return SimpleNamespace(records=records, best=SimpleNamespace(median_s=1e-3), baseline=None)

    tasks = [_task("big"), _task("small")]
    turns = list(
        tune_model(
            tasks, resolve_target("llvm"), _FakeDb({}), Settings(batch=2), trials=6,
            tune_task=fake_tune,
        )
    )  # fmt: skip
    assert len(turns) == 3 and len(set(pids)) == 1  # not started again for each round
    assert all(w is seen[0] for w in seen)
    import psutil

    assert not psutil.pid_exists(pids[0])  # stopped when the rounds end


def test_tune_model_starts_from_the_database_and_measures_nothing_again():
    calls = []

    def fake_tune(op, target, db, *, settings, templates, proposer, workers):
        calls.append(op.name)
        return SimpleNamespace(records=[], best=SimpleNamespace(median_s=1e-3), baseline=None)

    tasks = [_task("a"), _task("b")]
    db = _FakeDb({"key-a": 2e-3, "key-b": 1e-3})
    turns = list(
        tune_model(tasks, resolve_target("llvm"), db, Settings(), trials=8, tune_task=fake_tune)
    )
    # no first rounds: both start from their records; the largest gradient goes first, and a
    # round that finds nothing new to measure spends the task
    assert calls == ["a", "b"] and all(t.state.spent for t in turns)


def test_a_task_whose_templates_are_spent_stops_without_an_error():
    calls = []

    def fake_tune(op, target, db, *, settings, templates, proposer, workers):
        calls.append(op.name)
        if len(calls) > 1:
            raise NothingToTune(f"nothing to tune: no template or schedule for {op.name}")
        return SimpleNamespace(
            records=[SimpleNamespace(is_ok=True)],
            best=SimpleNamespace(median_s=1e-3),
            baseline=None,
        )

    turns = list(
        tune_model(
            [_task("a")],
            resolve_target("llvm"),
            _FakeDb({}),
            Settings(),
            trials=8,
            tune_task=fake_tune,
        )
    )
    assert calls == ["a", "a"]
    assert turns[-1].error is None and turns[-1].result is None
    assert turns[-1].state.spent and turns[-1].state.error is None
    assert turns[-1].state.latency_s == 1e-3


def test_on_a_cpu_the_unscheduled_build_is_measured_and_kept_when_it_is_fastest():
    seen = []

    def fake_tune(op, target, db, *, settings, templates, proposer, workers):
        seen.append(settings.baseline)
        baseline = SimpleNamespace(is_ok=True, median_s=2e-6)  # faster than every candidate
        return SimpleNamespace(
            records=[SimpleNamespace(is_ok=True)] * settings.trials,
            best=SimpleNamespace(median_s=9e-6),
            baseline=baseline,
        )

    turns = list(
        tune_model(
            [_task("tiny")], resolve_target("llvm"), _FakeDb({}), Settings(batch=4), trials=4,
            tune_task=fake_tune,
        )
    )  # fmt: skip
    assert seen == [True]
    assert turns[-1].state.latency_s == 2e-6
    gpu = []
    list(
        tune_model(
            [_task("tiny")], resolve_target("cuda"), _FakeDb({}), Settings(batch=4), trials=4,
            tune_task=lambda op, target, db, **kw: gpu.append(kw["settings"].baseline)
            or fake_tune(op, target, db, **kw),
        )
    )  # fmt: skip
    assert gpu == [False]  # an unscheduled GPU function does not build


def test_tune_model_takes_the_cost_model_option(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from schedlang.cli import app
    from schedlang.models import tune_model as tune_model_module

    seen = []

    def fake_tune_model(tasks, target, db, settings, **kwargs):
        seen.append(settings.cost_model)
        return iter(())

    monkeypatch.setattr(tune_model_module, "tune_model_steps", fake_tune_model)
    args = ["tune-model", "examples/models/mlp.py", "-D", "layers=1", "-D", "batch=4"]
    args += ["-D", "features=8", "-D", "hidden=8", "--db", str(tmp_path / "t.db")]
    CliRunner().invoke(app, [*args, "--cost-model", "lightgbm"])
    CliRunner().invoke(app, args)
    assert seen == ["lightgbm", "off"]


def _first_rounds(scheduler, bests):
    for best in bests:
        state, trials = scheduler.next()
        scheduler.record(state, trials, best)


def test_a_stalled_task_gets_no_round_while_another_is_moving():
    from schedlang.models.scheduler import STALL_ROUNDS

    heavy, light = _task("heavy", calls=10), _task("light")
    scheduler = GradientScheduler([heavy, light], trials=1000, round_trials=4)
    _first_rounds(scheduler, (1e-3, 1e-3))
    # heavy promises ten times the drop, but its rounds find nothing
    for _ in range(STALL_ROUNDS):
        state, trials = scheduler.next()
        assert state.task is heavy
        scheduler.record(state, trials, 1e-3)
    assert scheduler.states[0].stalled and not scheduler.states[1].stalled
    state, _ = scheduler.next()
    assert state.task is light


def test_a_task_that_found_its_first_verified_point_is_not_stalled():
    from schedlang.models.scheduler import STALL_GAIN

    state = TaskState(_task("a"), best_s=[math.inf, 2e-3, 2e-3, 2e-3])
    assert not state.stalled  # nothing verified 3 rounds ago
    state.best_s.append(2e-3 * (1 - STALL_GAIN / 2))
    assert state.stalled  # 2 ms three rounds ago, less than 0.5% faster now
    state.best_s.append(1e-3)
    assert not state.stalled


def test_without_early_stop_the_stalled_tasks_share_what_is_left():
    scheduler = GradientScheduler([_task("a"), _task("b")], trials=1000, round_trials=4)
    _first_rounds(scheduler, (1e-3, 1e-3))
    for _ in range(10):
        state, trials = scheduler.next()
        scheduler.record(state, trials, state.latency_s)
    assert all(s.stalled for s in scheduler.states)
    assert scheduler.next() is not None and scheduler.stop is None


def test_with_a_stopping_rule_every_task_stalled_stops_the_run_and_says_why():
    from schedlang.tuning.convergence import Convergence

    rule = Convergence(window=1000)  # the estimate's rule alone would not stop yet
    scheduler = GradientScheduler([_task("a"), _task("b")], 1000, round_trials=4, convergence=rule)
    _first_rounds(scheduler, (1e-3, 2e-3))
    while (turn := scheduler.next()) is not None:
        state, trials = turn
        scheduler.record(state, trials, state.latency_s)
    assert scheduler.stop is not None and scheduler.stop.kind == "stalled"
    assert scheduler.stop.reason == "stalled: no task gained 0.5% in its last 3 rounds"
    assert scheduler.measured == 8 + 2 * 3 * 4 and scheduler.left > 0


def test_the_model_estimate_converging_stops_the_run_before_the_budget():
    from schedlang.tuning.convergence import Convergence

    tasks = [_task("a", calls=2), _task("b")]
    scheduler = GradientScheduler(tasks, 1000, round_trials=8, convergence=Convergence(window=32))
    _first_rounds(scheduler, (4e-3, 2e-3))
    gains = iter([0.9] * 3 + [0.999] * 100)  # three good rounds, then a 0.1% a round
    while (turn := scheduler.next()) is not None:
        state, trials = turn
        scheduler.record(state, trials, state.latency_s * next(gains))
    stop = scheduler.stop
    assert stop is not None and stop.kind == "converged" and stop.gain < 0.01
    assert stop.trials == scheduler.measured < 1000
    assert stop.reason.startswith("converged: ") and "window 32" in stop.reason


def test_a_rerun_resumes_the_rule_from_the_database_curve():
    from schedlang.tuning.convergence import Convergence

    scheduler = GradientScheduler([_task("a")], 1000, known={"key-a": 1e-3},
                                  convergence=Convergence(window=16))  # fmt: skip
    scheduler.resume([(100, 1.001e-3), (108, 1.0005e-3), (116, 1e-3)])
    assert scheduler.stop is not None and scheduler.next() is None
    fresh = GradientScheduler([_task("a")], 1000, known={"key-a": 1e-3},
                              convergence=Convergence(window=16))  # fmt: skip
    fresh.resume([(100, 2e-3), (116, 1e-3)])  # halved in the window: goes on, counting from 116
    state, trials = fresh.next()
    fresh.record(state, trials, 1e-3)
    assert fresh.stop is None and fresh.convergence.trials[-1] == 116 + trials


# --- early stop in tune_model (issue 48) ---------------------------------------------------------


def _flat_records(keys: list[str], trials: int) -> list:
    """What an earlier run left: each task's baseline, then `trials` candidates, all as fast."""
    records = [_record(key, "baseline", n) for n, key in enumerate(keys)]
    records += [_record(keys[n % len(keys)], "builtin", len(keys) + n) for n in range(trials)]
    return records


def _record(key: str, proposer: str, index: int):
    return SimpleNamespace(op_key=key, proposer=proposer, is_ok=True, median_s=1e-3, id=index + 1)


def _flat_tune(calls: list):
    def fake_tune(op, target, db, *, settings, templates, proposer, workers):
        calls.append((op.name, settings.trials, settings.early_stop))
        records = [SimpleNamespace(is_ok=True)] * settings.trials
        return SimpleNamespace(records=records, best=SimpleNamespace(median_s=1e-3), baseline=None)

    return fake_tune


def test_tune_model_stops_once_the_estimate_converges_and_its_rounds_run_whole():
    calls: list = []
    tasks = [_task("a"), _task("b")]
    turns = list(
        tune_model(tasks, resolve_target("llvm"), _FakeDb({}), Settings(), trials=1000,
                   tune_task=_flat_tune(calls))
    )  # fmt: skip
    scheduler = turns[-1].scheduler
    assert scheduler.stop is not None and scheduler.measured < 1000
    assert scheduler.stop.reason.startswith(("converged: ", "stalled: "))
    assert all(early_stop is False for _, _, early_stop in calls)  # the op's rule never cuts one
    assert sum(trials for _, trials, _ in calls) == scheduler.measured
    # without early stop the budget is spent
    calls.clear()
    turns = list(
        tune_model(tasks, resolve_target("llvm"), _FakeDb({}), Settings(early_stop=False),
                   trials=200, tune_task=_flat_tune(calls))
    )  # fmt: skip
    assert turns[-1].scheduler.stop is None and turns[-1].scheduler.measured == 200


def test_a_converged_model_run_again_resumes_from_the_database_and_stops_at_once():
    from schedlang.models.tune_model import Scheduled, tune_model_steps

    calls: list = []
    tasks = [_task("a"), _task("b")]
    db = _FakeDb({"key-a": 1e-3, "key-b": 1e-3}, _flat_records(["key-a", "key-b"], 80))
    items = list(
        tune_model_steps(tasks, resolve_target("llvm"), db, Settings(), trials=100,
                         tune_task=lambda *a, **k: iter(()))
    )  # fmt: skip
    [scheduled] = items  # no round: the rule replayed the database's curve and stopped
    assert isinstance(scheduled, Scheduled)
    stop = scheduled.scheduler.stop
    assert stop is not None and stop.kind == "converged" and stop.trials == 80
    # a run that had not converged goes on, counting its trials on from the database's
    db = _FakeDb({"key-a": 1e-3, "key-b": 1e-3}, _flat_records(["key-a", "key-b"], 40))
    turns = list(
        tune_model(tasks, resolve_target("llvm"), db, Settings(), trials=1000,
                   tune_task=_flat_tune(calls))
    )  # fmt: skip
    scheduler = turns[-1].scheduler
    stop = scheduler.stop
    assert scheduler.offset == 40 and stop is not None and stop.kind == "converged"
    # the window began in the earlier run: 64 trials after its first point (trial 1), at 72
    assert stop.trials == 72 and scheduler.measured == 32
