"""The stopping rule (schedlang.tuning.convergence): on given curves it stops, or it does not, and
says why; its state is rebuilt from the database's records, so a stopped run resumes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from schedlang.tuning.convergence import MARGIN, WINDOW_TRIALS, Convergence, model_curve


def _rule(curve, **kwargs) -> Convergence:
    rule = Convergence(**kwargs)
    rule.replay(curve)
    return rule


def test_a_flat_curve_stops_once_a_whole_window_is_seen():
    curve = [(t, 12.6e-3 - 1e-6 * (t - 136) / 8) for t in range(136, 137 + 64, 8)]
    assert _rule(curve[:-1]).stop() is None  # 56 trials: shorter than the window
    stop = _rule(curve).stop()
    assert stop is not None and stop.trials == 200 and stop.gain < MARGIN
    assert stop.reason == "converged: 0.1% over the last 64 trials (margin 1%, window 64)"


def test_a_curve_still_falling_by_the_margin_does_not_stop():
    # 2% per 64 trials, MobileNetV2's pace after its first round (issue 48): goes on
    curve = [(t, 5.37e-3 * (1 - 0.02 * (t - 256) / 64)) for t in range(256, 500, 8)]
    assert _rule(curve).stop() is None


def test_the_resnet18_record_stops_by_trial_200_within_2_percent_of_its_end():
    # issue 48: 12.6 ms at trial 136, within 2% of the 1,000-trial end (12.3 ms) at 184
    points = {136: 12.6e-3, 184: 12.55e-3, 1000: 12.3e-3}
    rule = Convergence()
    stopped = None
    for trials in range(136, 1001, 8):
        known = max(t for t in points if t <= trials)
        rule.observe(trials, points[known])
        if (stopped := rule.stop()) is not None:
            break
    assert stopped is not None and stopped.trials <= 200
    assert 12.3e-3 / stopped.latency_s >= 0.98


def test_a_step_inside_the_window_keeps_it_going_until_the_window_passes_it():
    curve = [(0, 10.0), (8, 10.0), (16, 9.0), (64, 9.0)]
    assert _rule(curve, window=56).stop() is None  # 10 -> 9 within the last 56 trials
    assert _rule([*curve, (72, 9.0)], window=56).stop() is not None


def test_incomplete_points_are_skipped_and_trials_never_go_back():
    rule = Convergence(window=8)
    rule.observe(0, None)
    rule.observe(4, float("inf"))
    assert rule.trials == [] and rule.stop() is None
    rule.observe(8, 1.0)
    with pytest.raises(ValueError):
        rule.observe(7, 1.0)
    with pytest.raises(ValueError):
        Convergence(margin=1.5)


def test_the_defaults_are_the_documented_ones():
    assert (MARGIN, WINDOW_TRIALS) == (0.01, 64)


def _record(id, key, median_s, proposer="builtin", ok=True):
    return SimpleNamespace(id=id, op_key=key, median_s=median_s, proposer=proposer, is_ok=ok)


def test_the_curve_is_rebuilt_from_records_once_every_task_has_a_latency():
    records = [
        _record(1, "a", None, proposer="baseline", ok=False),  # no trial, no latency
        _record(2, "a", 4.0),
        _record(3, "a", None, ok=False),  # a trial that failed
        _record(4, "b", None, proposer="baseline"),  # a baseline counts as b's latency
        _record(5, "b", 2.0, proposer="baseline"),
        _record(6, "b", 3.0),
        _record(7, "a", 1.0),
        _record(8, "other", 0.1),  # not the model's
    ]
    # calls: a twice, b once; trials are the non-baseline records: 2, 3, 6, 7
    assert model_curve(reversed(records), {"a": 2, "b": 1}) == [(3, 10.0), (4, 4.0)]


def test_a_rule_rebuilt_from_the_database_stops_where_the_run_left():
    records = [_record(i, "a", 1.0 - 0.0001 * i) for i in range(1, 80)]
    curve = model_curve(records, {"a": 1})
    stop = _rule(curve).stop()
    assert stop is not None and stop.trials == 79
