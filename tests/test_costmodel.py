"""The tuner's cost model: features of lowered TIR, the switch, the fallback, ranking, seeds.

Runs of the tuner here use a measurer that builds nothing: each candidate's "latency" is a fixed
function of its knobs, so a run is reproducible and takes no build time. What is real is
everything the cost model does: lowering each pool point, TVM's feature extractor, LightGBM.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import ClassVar

import pytest

import schedlang.tuning.tune as tune_module
from schedlang.checker.pipeline import bind_knobs
from schedlang.core.diagnostics import SchedlangError
from schedlang.core.ops import load_op
from schedlang.core.target import resolve_target
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse
from schedlang.propose.interface import Proposal
from schedlang.run.outcome import Outcome
from schedlang.store.db import Database
from schedlang.store.records import Record, Status
from schedlang.tuning import costmodel
from schedlang.tuning.costmodel import CostModel, Featurizer, resolve
from schedlang.tuning.tune import Settings, tune

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

TEMPLATE = """\
param TI in [1, 2, 4, 8, 16]
param TJ in [2, 4, 8, 16]
param KU in [1, 2, 4]

block C:
  tile i, j by TI x TJ
  split k by KU
  reorder i.o, j.o, k.o, k.i, i.i, j.i
  vectorize j.i
"""


def small_matmul():
    return load_op(str(EXAMPLES / "matmul.py"), {"M": "32", "N": "32", "K": "16"})


def landscape(knobs: dict[str, int]) -> float:
    """A made-up GFLOP/s: wide vector tiles are fast, a deep k split slow; best at TJ=16, TI=4."""
    return 1.0 + knobs["TJ"] * (4 - abs(knobs["TI"] - 4) / 4) / knobs["KU"]


class LandscapeMeasurer:
    """Stands in for tune.Measurer: no workers, no builds; latency from `landscape`."""

    reused: ClassVar[list[str]] = []  # candidates whose lowered function the cost model handed over

    def __init__(self, op, target, settings, work_dir, *, workers=None):
        self.flops = 2 * 32 * 32 * 16
        self.prelowered = None
        LandscapeMeasurer.reused = []

    def measure(self, candidates, *, repeat=None):
        for candidate in candidates:
            if self.prelowered is not None and self.prelowered(candidate.text) is not None:
                self.reused.append(candidate.text)
            seconds = self.flops / (landscape(candidate.knobs) * 1e9)
            yield candidate, Outcome(Status.OK, latencies_s=(seconds,))

    def close(self):
        pass


@pytest.fixture
def no_builds(monkeypatch):
    monkeypatch.setattr(tune_module, "Measurer", LandscapeMeasurer)


def run(db: Database, templates=(TEMPLATE,), **changes) -> tune_module.TuneResult:
    values = dict(
        trials=16, batch=4, seed=0, cost_model_min_records=4, cost_model_pool=3, builders=1
    )
    settings = Settings(**{**values, **changes})
    proposals = [Proposal(text, "test", f"tiles {n}") for n, text in enumerate(templates)]
    return tune(small_matmul(), resolve_target("llvm"), db, settings=settings, templates=proposals)


def decisions(db: Database, result) -> list[str]:
    """The run's log without its timings (milliseconds differ from run to run)."""
    return [re.sub(r"[\d.]+ m?s\b", "_ s", line) for line in db.decisions(result.run_id)]


# --- the switch ----------------------------------------------------------------------------------


def test_an_unknown_cost_model_is_a_diagnostic():
    with pytest.raises(SchedlangError) as caught:
        resolve("xgboost")
    assert "unknown cost model `xgboost`" in caught.value.message
    assert "auto, off, lightgbm" in caught.value.render()


def test_auto_without_lightgbm_falls_back_with_a_one_line_note(monkeypatch, tmp_path, no_builds):
    monkeypatch.setattr(costmodel, "lightgbm_available", lambda: False)
    assert resolve("off") == (False, None)
    used, note = resolve("auto")
    assert not used and "LightGBM is not installed" in note and "\n" not in note
    with Database(tmp_path / "t.db") as db:
        result = run(db, trials=8, cost_model="auto")
        assert result.notes == [note]
        assert result.cost_model == {}
        log = db.decisions(result.run_id)
    assert log[0] == note
    assert not any(line.startswith("cost model") for line in log)


def test_lightgbm_asked_for_but_missing_is_an_error(monkeypatch):
    monkeypatch.setattr(costmodel, "lightgbm_available", lambda: False)
    with pytest.raises(SchedlangError) as caught:
        resolve("lightgbm")
    assert "pip install 'schedlang[tune]'" in caught.value.render()


# --- the fallback and the ranking ----------------------------------------------------------------


def test_with_too_few_records_the_search_decides_as_without_a_model(tmp_path, no_builds):
    """Below min_records the model stays out: the very points a run without it measures."""
    with Database(tmp_path / "a.db") as a, Database(tmp_path / "b.db") as b:
        with_model = run(a, trials=8, cost_model="lightgbm", cost_model_min_records=100)
        without = run(b, trials=8, cost_model="off")
        log = decisions(a, with_model)
        assert [r.knobs for r in with_model.records] == [r.knobs for r in without.records]
        assert [line for line in log if not line.startswith("cost model")] == decisions(b, without)
    assert "cost model: 4 verified records, needs 100; the search picks alone" in log
    assert with_model.cost_model["fits"] == 0


def test_the_model_ranks_a_pool_once_it_has_records(tmp_path, no_builds):
    with Database(tmp_path / "t.db") as db:
        result = run(db, cost_model="lightgbm")
        log = db.decisions(result.run_id)
    picks = [line for line in log if "; model " in line]
    explored = [line for line in log if "; explore" in line]
    # 3 batches after the first 4 records, each 3 model picks and 1 exploration from 12 points
    assert len(picks) == 9 and len(explored) == 3, log
    assert all("/12, predicted " in line and "GFLOP/s" in line for line in picks)
    assert any(line.startswith("cost model: trained on ") for line in log)
    assert log[-1].startswith("cost model: 3 fits in ") and "schedules lowered" in log[-1]
    figures = result.cost_model
    assert figures["fits"] == 3 and figures["examples"] == 16
    assert figures["schedules_featurized"] >= 24  # three pools of 12, less points drawn again
    assert 0 < figures["feature_ms_per_schedule"] < 2000
    assert len({r.schedule for r in result.records}) == 16  # never a point twice
    # The screen (on by default) lowered every point it let through: none is lowered again.
    assert len(LandscapeMeasurer.reused) == 16


def test_without_the_screen_the_picks_reach_the_measurer_lowered(tmp_path, no_builds):
    with Database(tmp_path / "t.db") as db:
        run(db, cost_model="lightgbm", screen=False)
    # The picks are lowered once, not twice; a point also drawn in an earlier pool (its vector
    # cached, its function dropped with that pool) is lowered again by the measurer.
    assert 10 <= len(LandscapeMeasurer.reused) <= 12


def test_the_picks_of_two_templates_in_one_batch_reach_the_measurer_lowered(tmp_path, no_builds):
    unrolled = TEMPLATE.replace("vectorize j.i", "unroll j.i")
    with Database(tmp_path / "t.db") as db:
        result = run(db, templates=(TEMPLATE, unrolled), trials=12, cost_model="lightgbm")
        log = db.decisions(result.run_id)
    chosen = [line for line in log if "; model " in line or "; explore" in line]
    assert len(chosen) == 8
    assert len({r.template for r in result.records[4:]}) == 2  # each template had picks
    assert len(LandscapeMeasurer.reused) >= 6  # both templates' picks, not only the last's


def test_a_seeded_run_is_reproduced_and_another_seed_differs(tmp_path, no_builds):
    logs = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        with Database(tmp_path / f"{name}.db") as db:
            result = run(db, cost_model="lightgbm", seed=seed)
            logs.append(decisions(db, result))
    assert any("; model " in line for line in logs[0])
    assert logs[0] == logs[1]
    assert logs[0] != logs[2]


def test_earlier_records_of_the_op_train_the_model_from_the_first_batch(tmp_path, no_builds):
    with Database(tmp_path / "t.db") as db:
        run(db, trials=8, cost_model="off")
        second = run(db, trials=4, cost_model="lightgbm")
        log = db.decisions(second.run_id)
    assert any("(8 from earlier runs)" in line for line in log), log
    assert sum("; model " in line or "; explore" in line for line in log) == 4
    assert not any("the search picks alone" in line for line in log)


# --- features and the model itself --------------------------------------------------------------


def points(count: int, seed: int) -> list[dict[str, int]]:
    schedule = parse(TEMPLATE)
    everything = list(schedule.iter_knob_values())
    return random.Random(seed).sample(everything, count)


def test_features_come_from_the_lowered_tir_and_are_cached():
    op, target = small_matmul(), resolve_target("llvm")
    featurizer = Featurizer(op, target)
    template = parse(TEMPLATE)
    a = bind_knobs(template, {"TI": 2, "TJ": 8, "KU": 1})
    b = bind_knobs(template, {"TI": 4, "TJ": 16, "KU": 4})
    va = featurizer.features(a, format_schedule(a), keep_lowered=True)
    vb = featurizer.features(b, format_schedule(b))
    assert va.shape == vb.shape == (2 * costmodel.STORE_FEATURES + 1,)
    assert (va != vb).any()  # different tiles, different loop structure
    assert featurizer.features(a, format_schedule(a)) is va and featurizer.count == 2
    assert featurizer.take_lowered(format_schedule(a)) is not None  # once: the measurer's
    assert featurizer.take_lowered(format_schedule(a)) is None
    wrong = parse("block C:\n  vectorize k\n")  # a reduction loop: fails its check
    assert featurizer.features(wrong, "wrong") is None


def test_the_model_ranks_unseen_points_like_the_measurements():
    op, target = small_matmul(), resolve_target("llvm")
    model = CostModel(op, target, seed=0, log=lambda _: None, min_records=8)
    template = parse(TEMPLATE)
    for knobs in points(30, seed=1):
        text = format_schedule(bind_knobs(template, knobs))
        model.observe(_record(text, landscape(knobs)))
    assert model.ready() and model.fit()
    held_out = [k for k in points(50, seed=2) if k not in points(30, seed=1)][:20]
    schedules = [bind_knobs(template, k) for k in held_out]
    vectors = [model.featurizer.features(s, format_schedule(s)) for s in schedules]
    predicted = model.predict(vectors)
    truth = [landscape(k) for k in held_out]
    assert _spearman(list(predicted), truth) > 0.6
    picks = model.pick([(s, format_schedule(s)) for s in schedules], 4, random.Random(0))
    assert len(picks) == 4 and [p.how for p in picks].count("explore") == 1
    best_picked = max(truth[p.index] for p in picks if p.how != "explore")
    assert best_picked >= sorted(truth)[-3]  # among the three fastest of the twenty
    wrong = parse("block C:\n  vectorize k\n")  # fails its check: no features, still a point
    assert model.pick([(wrong, "wrong")], 1, random.Random(0)) == [
        costmodel.Pick(0, "unranked", None)
    ]


def test_failed_records_teach_nothing():
    model = CostModel(small_matmul(), resolve_target("llvm"), seed=0, log=print, min_records=1)
    model.observe(_record("block C:\n  parallel i\n", None, Status.BUILD_ERROR))
    assert not model.ready() and model.pick([], 1, random.Random(0)) is None


def _record(schedule: str, gflops: float | None, status: Status = Status.OK) -> Record:
    return Record(
        op_key="k",
        op_name="matmul",
        target_key="t",
        target={},
        schedule=schedule,
        knobs={},
        template=None,
        status=status,
        reason="",
        latencies_s=(1.0,) if gflops else (),
        median_s=1.0 if gflops else None,
        gflops=gflops,
        proposer="test",
        seed=0,
        created_at=0.0,
        schedlang_version="",
        tvm_version="",
        extra={},
    )


def _spearman(a: list[float], b: list[float]) -> float:
    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        for rank, index in enumerate(order):
            result[index] = float(rank)
        return result

    ra, rb = ranks(a), ranks(b)
    mean = (len(a) - 1) / 2
    cov = sum((x - mean) * (y - mean) for x, y in zip(ra, rb, strict=True))
    var = sum((x - mean) ** 2 for x in ra)
    return cov / var


def test_no_point_predicted_far_slower_than_the_best_is_picked():
    op, target = small_matmul(), resolve_target("llvm")
    template = parse(TEMPLATE)
    schedules = [bind_knobs(template, k) for k in points(60, seed=3)]
    pool = [(s, format_schedule(s)) for s in schedules]
    picked = {}
    for far in (None, 4.0):
        model = CostModel(op, target, seed=0, log=lambda _: None, min_records=8, far_worse=far)
        for knobs in points(30, seed=1):  # landscape: 1.5 to 65 GFLOP/s
            model.observe(_record(format_schedule(bind_knobs(template, knobs)), landscape(knobs)))
        picks = model.pick(pool, 40, random.Random(0))
        picked[far] = picks
        if far is None:
            assert model.pruned == [] and len(picks) == 40
            continue
        floor = model.best_gflops() / far
        assert model.pruned and all(predicted < floor for _, predicted in model.pruned)
        pruned = {index for index, _ in model.pruned}
        assert not pruned & {p.index for p in picks}  # the explore share too
        assert len(picks) == min(40, len(pool) - len(pruned))
    assert len(picked[4.0]) < len(picked[None])
