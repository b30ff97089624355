"""The tuner: knob search, sandboxed measurement (crashes, hangs, wrong results), the database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from schedlang.core.ops import load_op
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse
from schedlang.propose.interface import Proposal
from schedlang.run.sandbox import slow_timing
from schedlang.store.db import Database
from schedlang.store.records import Status
from schedlang.tuning.search import Candidate, KnobSearch
from schedlang.tuning.tune import Measurer, Settings, tune
from tests.planted import (
    TEMPLATE,
    PlantedMeasurer,
    doubling_op,
    hangs,
    measure_each,
    nan,
    segfaults,
    slow,
    wrong,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


# --- knob spaces ---------------------------------------------------------------------------------


def test_knob_space_is_enumerated_exactly():
    schedule = parse("param A in [1, 2, 3]\nparam B in pow2(4, 64)\nparam C in range(2, 10, 4)\n")
    points = list(schedule.iter_knob_values())
    assert schedule.knob_space_size() == len(points) == 3 * 5 * 3
    assert {p["B"] for p in points} == {4, 8, 16, 32, 64}
    assert {p["C"] for p in points} == {2, 6, 10}
    assert len({tuple(sorted(p.items())) for p in points}) == len(points)


def test_a_huge_knob_space_is_never_enumerated_eagerly():
    text = "".join(f"param K{n} in range(1, 1000)\n" for n in range(4))  # 10^12 points
    schedule = parse(text)
    assert schedule.knob_space_size() == 1000**4  # range() includes its upper bound
    first = next(schedule.iter_knob_values())
    assert first == {f"K{n}": 1 for n in range(4)}
    import random

    search = KnobSearch(schedule, random.Random(0), lambda _: None)
    assert len(search.next_points(5)) == 5


def test_search_never_repeats_a_point_and_exhausts_the_space():
    import random

    search = KnobSearch(parse(TEMPLATE), random.Random(3), lambda _: None)
    seen = []
    while not search.exhausted():
        batch = search.next_points(4)
        assert batch, "the search stopped before the space was exhausted"
        for point in batch:
            search.record(point, float(point["TI"] * point["TJ"]))
        seen += [tuple(sorted(p.items())) for p in batch]
    assert len(seen) == len(set(seen)) == 3 * 3 * 2


def test_a_fresh_search_draws_the_templates_first_point_first():
    import random

    for seed in range(5):
        search = KnobSearch(parse(TEMPLATE), random.Random(seed), lambda _: None)
        first = {name: values[0] for name, values in search.space.items()}
        assert search.next_points(3)[0] == first  # each knob's first value: the recipe's default
        assert first not in search.next_points(3)  # and only once
    resumed = KnobSearch(parse(TEMPLATE), random.Random(0), lambda _: None)
    resumed.record({name: values[-1] for name, values in resumed.space.items()}, 1.0)
    drawn = resumed.draw(20)
    assert all(how != "the template's first point" for _, how in drawn)  # not on a resumed run


def test_search_is_reproducible_given_the_seed():
    import random

    def run(seed):
        log: list[str] = []
        search = KnobSearch(parse(TEMPLATE), random.Random(seed), log.append)
        for _ in range(3):
            for point in search.next_points(3):
                search.record(point, float(point["TJ"]))
        return log

    assert run(7) == run(7)
    assert run(7) != run(8)


# --- measurement in isolation --------------------------------------------------------------------


def test_crashing_hanging_and_wrong_kernels_are_recorded_and_measurement_goes_on(target, tmp_path):
    schedules = [
        "split i by 2",
        "split i by 4",
        "split i by 8",
        "split i by 16",
        "split i by 32",
        "split i by 64",
        "vectorize i",
    ]
    planted = {
        "split i by 4": segfaults,
        "split i by 8": hangs,
        "split i by 16": wrong,
        "split i by 32": nan,
    }
    settings = Settings(run_timeout_s=5, build_timeout_s=60, repeat=2, min_repeat_ms=1)
    measurer = PlantedMeasurer(doubling_op(), target, settings, tmp_path, planted)
    try:
        outcomes = measure_each(measurer, *schedules)
    finally:
        measurer.close()
    status = {text: outcome.status for text, outcome in outcomes.items()}
    assert status == {
        "split i by 2": Status.OK,
        "split i by 4": Status.CRASH,
        "split i by 8": Status.TIMEOUT,
        "split i by 16": Status.WRONG,
        "split i by 32": Status.WRONG,
        "split i by 64": Status.OK,
        "vectorize i": Status.OK,
    }
    assert "SIGSEGV" in outcomes["split i by 4"].reason
    assert "NaN" in outcomes["split i by 32"].reason
    assert all("\n" not in o.reason for o in outcomes.values())


def test_a_schedule_that_fails_the_check_is_recorded_with_its_diagnostics(target, tmp_path):
    measurer = Measurer(doubling_op(), target, Settings(repeat=1, min_repeat_ms=1), tmp_path)
    try:
        [(_, outcome)] = list(measurer.measure([Candidate(parse("split q by 2"), {}, None, "t")]))
    finally:
        measurer.close()
    assert outcome.status == Status.CHECK_ERROR
    assert "unknown axis `q`" in outcome.diagnostics


# --- the tuning loop and the database ------------------------------------------------------------


def _tune(op, target, db, trials, seed=0):
    settings = Settings(trials=trials, seed=seed, batch=4, repeat=2, min_repeat_ms=5)
    return tune(op, target, db, settings=settings, templates=[Proposal(TEMPLATE, "template")])


def test_tune_measures_verifies_and_stores_every_candidate(small_matmul, target, tmp_path):
    with Database(tmp_path / "t.db") as db:
        result = _tune(small_matmul, target, db, trials=6)
        assert len(result.records) == 6
        assert all(r.status == Status.OK for r in result.records)
        stored = db.records()
        assert len(stored) == 6
        assert result.best is not None and result.best.gflops == max(r.gflops for r in stored)
        assert all(r.template and r.knobs and r.latencies_s for r in stored)
        parse(result.best.schedule)  # the stored schedule is concrete DSL
        assert not parse(result.best.schedule).is_template


def test_rerun_resumes_from_the_database_and_measures_nothing_twice(small_matmul, target, tmp_path):
    with Database(tmp_path / "t.db") as db:
        first = _tune(small_matmul, target, db, trials=4)
        second = _tune(small_matmul, target, db, trials=4)
        schedules = [r.schedule for r in db.records()]
    assert len(schedules) == len(set(schedules)) == 8
    assert not {r.schedule for r in first.records} & {r.schedule for r in second.records}


def test_seeded_runs_propose_the_same_candidates(small_matmul, target, tmp_path):
    runs = []
    for name in ("a", "b"):
        with Database(tmp_path / f"{name}.db") as db:
            result = _tune(small_matmul, target, db, trials=4, seed=11)
            runs.append(([r.schedule for r in result.records], db.decisions(result.run_id)))
    assert runs[0][0] == runs[1][0]
    assert [d for d in runs[0][1] if "measured" not in d] == [
        d for d in runs[1][1] if "measured" not in d
    ]


# Slow (a tuner run killed, then resumed: a minute): tests/test_faults.py's
# test_kill_9_at_random_moments_then_resume_loses_nothing_and_measures_nothing_twice kills it
# at random moments and checks the same and more.
@pytest.mark.slow
def test_kill_9_loses_at_most_the_candidate_in_flight(tmp_path):
    db_path = tmp_path / "killed.db"
    script = textwrap.dedent(f"""
        from schedlang.store.db import Database
        from schedlang.core.ops import load_op
        from schedlang.propose.interface import Proposal
        from schedlang.core.target import resolve_target
        from schedlang.tuning.tune import Settings, tune
        op = load_op({str(EXAMPLES / "matmul.py")!r}, {{"M": "32", "N": "32", "K": "32"}})
        with Database({str(db_path)!r}) as db:
            tune(op, resolve_target("llvm"), db, templates=[Proposal({TEMPLATE!r}, "template")],
                 settings=Settings(trials=18, batch=2, repeat=2, min_repeat_ms=50))
    """)
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.time() + 120
    count = 0
    while time.time() < deadline and process.poll() is None:
        time.sleep(0.5)
        if db_path.exists():
            with Database(db_path) as db:
                count = db.count()
            if count >= 3:
                break
    os.killpg(process.pid, signal.SIGKILL)  # the tuner and its workers, mid-run
    process.wait()
    assert count >= 3, "the tuner stored nothing before it was killed"
    with Database(db_path) as db:
        before = {r.schedule: r.id for r in db.records()}
        assert len(before) >= count
        op = load_op(str(EXAMPLES / "matmul.py"), {"M": "32", "N": "32", "K": "32"})
        result = _tune(op, resolve_target("llvm"), db, trials=3)
        after = {r.schedule: r.id for r in db.records()}
    assert all(after[s] == i for s, i in before.items())  # every finished record is still there
    assert not {r.schedule for r in result.records} & set(before)  # nothing measured twice


# --- the baseline, slow kernels, and run ids -----------------------------------------------------


def test_slow_timing_costs_a_few_runs_of_the_kernel():
    assert slow_timing(5, first_run_s=1.2, slow_run_s=1.0) == (2, 0)
    assert slow_timing(5, first_run_s=4.0, slow_run_s=1.0) == (1, 0)
    assert slow_timing(2, first_run_s=0.2, slow_run_s=0.1) == (1, 0)
    assert slow_timing(5, first_run_s=0.11, slow_run_s=0.1) == (2, 0)


def test_a_slow_kernel_is_timed_with_fewer_repeats(target, tmp_path):
    settings = Settings(run_timeout_s=60, repeat=5, min_repeat_ms=1, slow_run_s=0.02)
    measurer = PlantedMeasurer(doubling_op(), target, settings, tmp_path, {"split i by 4": slow})
    try:
        outcomes = measure_each(measurer, "split i by 2", "split i by 4")
    finally:
        measurer.close()
    fast, slowed = outcomes["split i by 2"], outcomes["split i by 4"]
    assert fast.status == Status.OK and len(fast.latencies_s) == 5 and not fast.extra
    assert slowed.status == Status.OK
    reduced = slowed.extra["reduced_repeat"]
    assert reduced["from"] == 5 and reduced["to"] < 5 and reduced["first_run_s"] > 0.02
    assert len(slowed.latencies_s) == reduced["to"]


def test_the_baseline_is_measured_once_and_is_not_a_trial(small_matmul, target, tmp_path):
    settings = Settings(trials=2, batch=2, builders=1, repeat=2, min_repeat_ms=5, baseline=True)
    templates = [Proposal(TEMPLATE, "template")]
    with Database(tmp_path / "t.db") as db:
        first = tune(small_matmul, target, db, settings=settings, templates=templates)
        base = first.baseline
        assert base is not None and base.is_ok and base.id is not None
        assert (base.schedule, base.proposer, base.knobs) == ("", "baseline", {})
        assert base.extra["baseline"] is True and base.extra["run_id"] == first.run_id
        assert len(base.latencies_s) == 1  # one repeat: a reference, not a result
        assert len(first.records) == 2 and base.id not in [r.id for r in first.records]
        assert db.count() == 3
        second = tune(small_matmul, target, db, settings=settings, templates=templates)
        assert second.baseline == base  # from the database, not measured again
        assert db.count() == 5
        assert not any("baseline" in d for d in db.decisions(second.run_id) if "measured" in d)


def test_a_baseline_that_crashes_stops_nothing(target, tmp_path, monkeypatch):
    from schedlang.tuning import tune as tune_module

    def planted(*args, **kwargs):
        return PlantedMeasurer(*args, planted={"": segfaults}, **kwargs)

    monkeypatch.setattr(tune_module, "Measurer", planted)
    settings = Settings(trials=1, batch=1, builders=1, repeat=1, min_repeat_ms=1, baseline=True)
    with Database(tmp_path / "t.db") as db:
        result = tune(
            doubling_op(), target, db, settings=settings, templates=[Proposal("split i by 2", "t")]
        )
        assert result.baseline is not None and result.baseline.status is Status.CRASH
        assert [r.status for r in result.records] == [Status.OK]
        assert db.count() == 1  # a failed baseline is not saved: a later run may measure it
        assert any("not saved: crash" in d for d in db.decisions(result.run_id))


def test_records_that_fail_to_parse_keep_their_run_id(target, tmp_path):
    settings = Settings(trials=1, batch=1, builders=1, repeat=1, min_repeat_ms=1)
    proposals = [Proposal("split i by", "human"), Proposal("split i by 2", "human")]
    with Database(tmp_path / "t.db") as db:
        result = tune(doubling_op(), target, db, settings=settings, templates=proposals)
        [unparsed] = [r for r in db.records() if r.status is Status.CHECK_ERROR]
    assert unparsed.extra["run_id"] == result.run_id
    assert unparsed.id is not None and unparsed.id in [r.id for r in result.records]


# --- trials that earn their time: early stop and the screen (issue 48) ---------------------------

# 144 points of the 32 x 32 x 32 matmul: more than the stopping rule's window of 64 trials.
WIDE = """\
param TI in [2, 4, 8, 16, 1, 32]
param TJ in [4, 8, 16, 2, 1, 32]
param KU in [1, 2, 4, 8]

block C:
  tile i, j by TI x TJ
  split k by KU
  reorder i.o, j.o, k.o, k.i, i.i, j.i
"""


class FlatMeasurer:
    """Stands in for tune.Measurer (no workers, no builds): every candidate the checker accepts
    takes a millisecond, a flat curve; one it refuses is a check error, as the measurer's own
    check makes it. Counts the candidates it was given: the trials spent."""

    given = 0

    def __init__(self, op, target, settings, work_dir, *, workers=None):
        self.op, self.target = op, target
        self.flops = 2 * 32 * 32 * 32
        self.prelowered = None

    def measure(self, candidates, *, repeat=None):
        from schedlang.checker.check import check
        from schedlang.run.outcome import Outcome

        for candidate in candidates:
            FlatMeasurer.given += 1
            if self.prelowered is None or self.prelowered(candidate.text) is None:
                checked = check(candidate.schedule, self.op.func, self.target, template_ok=False)
                if checked.lowered is None:
                    yield candidate, Outcome(Status.CHECK_ERROR, "refused by the checker")
                    continue
            yield candidate, Outcome(Status.OK, latencies_s=(1e-3,))

    def close(self):
        pass


def _flat(op, target, db, trials, template=WIDE, **changes):
    settings = Settings(trials=trials, batch=8, seed=0, **changes)
    return tune(op, target, db, settings=settings, templates=[Proposal(template, "template")])


def test_a_flat_curve_stops_the_run_early_and_says_why(small_matmul, target, tmp_path, monkeypatch):
    from schedlang.tuning import tune as tune_module

    monkeypatch.setattr(tune_module, "Measurer", FlatMeasurer)
    with Database(tmp_path / "t.db") as db:
        result = _flat(small_matmul, target, db, trials=140)
        log = db.decisions(result.run_id)
    # the first verified trial is the curve's first point; 64 trials on, nothing gained
    stop = result.stop
    assert stop is not None and stop.kind == "converged" and stop.trials == 72
    assert len(result.records) == 72 < 140
    assert stop.reason == "converged: 0.0% over the last 64 trials (margin 1%, window 64)"
    assert f"stopped: {stop.reason}" in log
    # --no-early-stop: every trial spent
    with Database(tmp_path / "off.db") as db:
        result = _flat(small_matmul, target, db, trials=96, early_stop=False)
    assert result.stop is None and len(result.records) == 96


def test_a_stopped_run_run_again_resumes_from_the_databases_curve(
    small_matmul, target, tmp_path, monkeypatch
):
    from schedlang.tuning import tune as tune_module

    monkeypatch.setattr(tune_module, "Measurer", FlatMeasurer)
    with Database(tmp_path / "t.db") as db:
        first = _flat(small_matmul, target, db, trials=40)  # fewer than the window: no stop
        second = _flat(small_matmul, target, db, trials=100)
        third = _flat(small_matmul, target, db, trials=100)
    assert first.stop is None and len(first.records) == 40
    # the window counts the first run's 40 trials: 32 more reach 64 after its first point
    assert second.stop is not None and second.stop.trials == 72 and len(second.records) == 32
    # converged in the database: a third run measures nothing and says so
    assert third.stop is not None and third.records == [] and third.stop.trials == 72


def test_the_screen_drops_a_refused_point_before_it_costs_a_trial(target, tmp_path, monkeypatch):
    from schedlang.tuning import tune as tune_module
    from tests.test_search import UNROLLED, _unrolled_op  # T = 4 alone within the unroll budget

    monkeypatch.setattr(tune_module, "Measurer", FlatMeasurer)
    op = _unrolled_op()
    with Database(tmp_path / "t.db") as db:
        FlatMeasurer.given = 0
        screened = _flat(op, target, db, trials=4, template=UNROLLED)
        log = db.decisions(screened.run_id)
    assert FlatMeasurer.given == 1 and [r.knobs for r in screened.records] == [{"T": 4}]
    assert screened.records[0].is_ok
    assert sum(line.startswith("not built, the checker refuses it: ") for line in log) == 3
    with Database(tmp_path / "plain.db") as db:
        FlatMeasurer.given = 0
        plain = _flat(op, target, db, trials=4, template=UNROLLED, screen=False)
    # without the screen each refused point is a trial, spent on a check error
    assert FlatMeasurer.given == 4 and len(plain.records) == 4
    assert sorted(str(r.status) for r in plain.records).count("check_error") == 3


# --- bench/bench_tune.py's bookkeeping (the benchmark itself is run by hand) ---------------------


def _bench_tune():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "bench" / "bench_tune.py"
    spec = importlib.util.spec_from_file_location("bench_tune", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bench_tune_counts_trials_to_90_percent_and_marks_targets():
    bench = _bench_tune()
    arm = bench.Arm("schedlang", gflops=100.0, wall_s=30.0, curve=[10, 50, 50, 89, 95, 100])
    assert arm.trials_to() == 5 and arm.best_after(4) == 89 and arm.best_after(16) is None
    ms = bench.Arm("MetaSchedule", gflops=50.0, wall_s=100.0, curve=[5, 45, 50])
    row = bench.Row("conv2d", "default", 6, {"model": arm, "metaschedule": ms}, torch_gflops=120.0)
    targets = bench.render_targets([row])
    assert "conv2d @6 vs MetaSchedule: 2.00 (goal ≥ 1.5) met" in targets
    assert "conv2d @6 tuning time / MetaSchedule's: 0.30 (goal ≤ 0.5) met" in targets
    assert "conv2d @6 vs torch: 0.83 (goal ≥ 1.0) MISSED" in targets
    assert "conv2d @6 vs MetaSchedule (conv2d): 2.00 (goal ≥ 3.0) MISSED" in targets
    assert "| conv2d | default | 6 | 100.0 | 50.0 | - | 120.0 | 2.00x |" in bench.render([row])


def test_bench_tune_replaces_only_its_section_of_the_page(tmp_path):
    bench = _bench_tune()
    page = tmp_path / "benchmarks.md"
    page.write_text(
        f"# Benchmarks\n\n## Front end\n\nkept\n\n{bench.SECTION}\n\nold\n\n## GPU\n\nkept\n"
    )
    bench.write_section(page, "new table", str(tmp_path / "tuning.png"))
    text = page.read_text()
    assert "old" not in text and "new table" in text and "![best-so-far" in text
    assert text.count("kept") == 2 and text.index("## Front end") < text.index("## GPU")
