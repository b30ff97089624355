"""Trials that earn their time (issue 48): past the first round the knob search draws the
neighbours of the fastest points, one knob at a time; a point the checker refuses is dropped
before it is proposed (no trial); the cost model leaves out points it predicts far slower than
the best."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from schedlang.core.ops import load_op
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse
from schedlang.propose.interface import Proposal
from schedlang.tuning.search import KnobSearch, Screen, next_batch, screened
from tests.planted import TEMPLATE  # TI in [2, 4, 8], TJ in [4, 8, 16], KU in [1, 2]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# 64 x T x T copies once k, i.i and j.i are unrolled: T = 4 fits the 2048 LLVM builds in seconds,
# T = 8 and more do not (the checker's unroll budget, decided before any build).
UNROLLED = """\
param T in [16, 4, 32, 8]

block C:
  tile i, j by T x T
  reorder i.o, j.o, k, i.i, j.i
  unroll k
  unroll i.i
  unroll j.i
"""


def _search(text: str = TEMPLATE, seed: int = 0, log=None) -> KnobSearch:
    return KnobSearch(parse(text), random.Random(seed), log.append if log is not None else print)


def _moved(a: dict[str, int], b: dict[str, int]) -> list[str]:
    return [name for name in a if a[name] != b[name]]


def test_neighbours_move_one_knob_to_its_next_smaller_or_larger_value():
    search = _search(UNROLLED)
    # listed best first (16, 4, 32, 8): the neighbours are by value, not by place in the list
    assert [p["T"] for p, _ in search.neighbours({"T": 8})] == [4, 16]
    assert [p["T"] for p, _ in search.neighbours({"T": 32})] == [16]
    search = _search()
    near = search.neighbours({"TI": 4, "TJ": 4, "KU": 2})
    assert sorted(tuple(sorted(p.items())) for p, _ in near) == sorted(
        tuple(sorted(p.items()))
        for p in (
            {"TI": 2, "TJ": 4, "KU": 2},
            {"TI": 8, "TJ": 4, "KU": 2},
            {"TI": 4, "TJ": 8, "KU": 2},
            {"TI": 4, "TJ": 4, "KU": 1},
        )
    )
    assert all(len(_moved(p, {"TI": 4, "TJ": 4, "KU": 2})) == 1 for p, _ in near)
    for _ in range(20):
        assert (
            len(_moved(search.mutate({"TI": 4, "TJ": 4, "KU": 2}), {"TI": 4, "TJ": 4, "KU": 2}))
            == 1
        )


def test_past_the_first_round_the_search_draws_the_best_points_neighbours():
    search = _search()
    best, other = {"TI": 4, "TJ": 8, "KU": 1}, {"TI": 2, "TJ": 16, "KU": 2}
    search.record(best, 100.0)
    search.record(other, 10.0)
    drawn = search.draw(8)
    near = [point for point, how in drawn if how.startswith("neighbour of ")]
    assert len(near) == 6 and len(drawn) == 8  # a quarter of the slots left to random points
    best_near = [p for p, _ in search.neighbours(best)]
    assert near[: len(best_near)] and all(p in best_near for p in near[:4])  # the fastest's first
    assert all(len(_moved(p, best)) == 1 or len(_moved(p, other)) == 1 for p in near)
    assert {how for _, how in drawn} - {h for _, h in drawn if h.startswith("neighbour")} == {
        "random"
    }


def _unrolled_op():
    return load_op(str(EXAMPLES / "matmul.py"), {"M": "32", "N": "32", "K": "64"})


def test_a_point_the_checker_refuses_is_dropped_before_it_is_proposed():
    log: list[str] = []
    search = _search(UNROLLED, log=log)
    screen = Screen(_unrolled_op(), resolve_target("llvm"))
    kept = screened(search, 4, screen)
    assert [point for point, _, _ in kept] == [{"T": 4}]  # the only one within the budget
    assert screen.refused == 3 and search.dropped == 3 and len(search.seen) == 3
    refused = [line for line in log if line.startswith("not built, the checker refuses it: ")]
    assert len(refused) == 3 and all("copies of the loop body" in line for line in refused)
    assert screen.peek_lowered(_text(kept[0][2])) is not None  # lowered once, for the measurer


def _text(schedule) -> str:
    from schedlang.lang.printer import format_schedule

    return format_schedule(schedule)


def test_a_batch_with_a_screen_spends_no_trial_on_a_refused_point():
    search = _search(UNROLLED)
    screen = Screen(_unrolled_op(), resolve_target("llvm"))
    proposal = Proposal(UNROLLED, "test")
    batch = next_batch([(search, proposal)], [], 4, random.Random(0), print, screen=screen)
    assert [c.knobs for c in batch] == [{"T": 4}]
    assert screen.take_lowered(batch[0].text) is not None and not screen.lowered
    # without the screen the refused points are proposed (and would each cost a trial)
    plain = next_batch([(_search(UNROLLED), proposal)], [], 4, random.Random(0), print)
    assert sorted(c.knobs["T"] for c in plain) == [4, 8, 16, 32]


def test_the_measurer_gets_the_screens_lowered_function_once():
    from schedlang.tuning.search import prelowered

    screen = Screen(_unrolled_op(), resolve_target("llvm"))
    batch = next_batch(
        [(_search(UNROLLED), Proposal(UNROLLED, "test"))], [], 1, random.Random(0), print,
        screen=screen,
    )  # fmt: skip
    take = prelowered(screen, None)
    assert take(batch[0].text) is not None and take(batch[0].text) is None
    assert prelowered(None, None) is None


@pytest.mark.parametrize("seed", range(4))
def test_on_a_smooth_landscape_the_neighbours_climb_to_the_best_point(tmp_path, monkeypatch, seed):
    """60 points, one best (65 GFLOP/s at TI 4, TJ 16, KU 1): in 20 trials the search climbs to
    it from its first point on every seed; drawn at random it reached it on 2 of 6 seeds."""
    from schedlang.store.db import Database
    from schedlang.tuning import tune as tune_module
    from tests.test_costmodel import LandscapeMeasurer, run

    monkeypatch.setattr(tune_module, "Measurer", LandscapeMeasurer)
    with Database(tmp_path / "t.db") as db:
        result = run(db, trials=20, cost_model="off", seed=seed)
    assert max(r.gflops for r in result.records) == pytest.approx(65.0)
