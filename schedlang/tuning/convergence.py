"""When tuning has converged: a stopping rule on the curve of latency against trials.

    rule = Convergence()                       # margin 1%, window 64 trials
    rule.observe(trials=136, latency_s=12.6e-3)  # after each round: trials so far, the estimate
    if (stop := rule.stop()) is not None:
        print(stop.reason)  # converged: 0.4% over the last 64 trials (margin 1%, window 64)

The curve is the model's estimated latency (its tasks' best latencies times their calls) or one
op's best latency, after each round. The rule stops once the latency `window` trials ago (the
last point at or before then) is less than `margin` slower than the latency now. Points are
observed only once the estimate is complete (every task measured), so the model's first round
never counts as a gain.

The defaults are read off the recorded curves of issue 48 (2-core AMD EPYC Zen 4, 2026-12-05;
no finer curve is stored in the repository): ResNet-18 (18 tasks) was at 12.6 ms when its first
round ended (trial 136), within 2% of its 1,000-trial end (12.3 ms) at trial 184, and gained
2.4% over the last 864 trials, 0.3% per 100; MobileNetV2 was at 5.37 ms after 256 of 500 trials
and 5.14 ms at the end, 1.8% per 100 trials after its first round. A window of 64 trials (eight
rounds of the tuner's batch of 8) lets ResNet-18 stop at trial 200 (136 + 64), 98% of its
1,000-trial end; a margin of 1% over it is a rate of 1.6% per 100 trials, above ResNet-18's tail
(it stops) and below MobileNetV2's after its first round (it goes on). For one op the recorded
64-trial runs (docs/benchmarks.md, without the cost model) agree: six of seven ops gained under
1% from trial 16 to 64 (the rule stops them), matmul_odd 4.3% (it goes on). Measured on whole
default runs (2-core Intel Xeon, 2026-12-07, docs/models.md): ResNet-18 stopped at trial 190 at
the latency of 1,000 trials, BERT (one layer) at 274 at it too, MobileNetV2 at 248 at 97% of it
(its search gains 1.8% per 100 trials for hundreds of trials: no window meets both).

A stopped run resumes where it left: the rule's state is the curve, and `model_curve` rebuilds it
from the database's records (every trial of the model's tasks, in the order they were saved), so
a rerun replays it into a new rule before its first round and stops at once if it had converged.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MARGIN = 0.01
WINDOW_TRIALS = 64


@dataclass(frozen=True)
class Stop:
    """Why a run stopped early, as data: the gain over the window, the margin and the window."""

    gain: float  # relative: (latency `window` trials ago - latency now) / latency now
    window: int  # trials (rounds, for "stalled")
    margin: float
    trials: int  # when it stopped
    latency_s: float
    kind: str = "converged"  # or "stalled": every task's last rounds gained less than margin

    @property
    def reason(self) -> str:
        if self.kind == "stalled":
            return (
                f"stalled: no task gained {100 * self.margin:g}% in its last {self.window} rounds"
            )
        return (
            f"converged: {100 * self.gain:.1f}% over the last {self.window} trials "
            f"(margin {100 * self.margin:g}%, window {self.window})"
        )


@dataclass
class Convergence:
    """Stop when the latency has not improved by `margin` (relative) over `window` trials."""

    margin: float = MARGIN
    window: int = WINDOW_TRIALS
    trials: list[int] = field(default_factory=list)  # the curve: trials so far ...
    latencies_s: list[float] = field(default_factory=list)  # ... and the latency then

    def __post_init__(self):
        if not 0 <= self.margin < 1 or self.window < 1:
            raise ValueError(f"margin must be in [0, 1) and window >= 1: {self}")

    def observe(self, trials: int, latency_s: float | None) -> None:
        """The latency after `trials` trials in all; None or inf (not complete yet) is skipped.
        A point at the same trial count as the last replaces it."""
        if latency_s is None or not math.isfinite(latency_s) or latency_s <= 0:
            return
        if self.trials and trials < self.trials[-1]:
            raise ValueError(f"trials go back: {trials} after {self.trials[-1]}")
        if self.trials and trials == self.trials[-1]:
            self.latencies_s[-1] = min(self.latencies_s[-1], latency_s)
            return
        self.trials.append(trials)
        self.latencies_s.append(latency_s)

    def replay(self, curve: Iterable[tuple[int, float]]) -> None:
        """Observe a curve rebuilt from the database (see `model_curve`), oldest first."""
        for trials, latency_s in curve:
            self.observe(trials, latency_s)

    def stop(self) -> Stop | None:
        """A Stop once the last `window` trials gained less than `margin`; else None (also while
        the curve is shorter than the window)."""
        if not self.trials:
            return None
        now = self.trials[-1]
        then = now - self.window
        if then < self.trials[0]:
            return None
        # The latency `window` trials ago: the last point at or before then.
        earlier = self.latencies_s[bisect.bisect_right(self.trials, then) - 1]
        latency = self.latencies_s[-1]
        gain = (earlier - latency) / latency
        if gain >= self.margin:
            return None
        return Stop(max(gain, 0.0), self.window, self.margin, now, latency)


def database_curve(db, calls: Mapping[str, int], target_key: str) -> list[tuple[int, float]]:
    """`model_curve` of every record the database holds of the tasks of `calls` on the target:
    what a rerun replays into its rule (`Convergence.replay`) to resume where the last run left."""
    return model_curve([record for key in calls for record in db.records(key, target_key)], calls)


def model_curve(
    records: Iterable, calls: Mapping[str, int], *, baseline: str = "baseline"
) -> list[tuple[int, float]]:
    """(trials, estimated latency) after each trial of a model's records, oldest first, from the
    first trial at which every task of `calls` (task key -> its calls) has a verified latency.

    `records` are Records (op_key, proposer, is_ok, median_s, id) of the model's tasks on one
    target, in any order (sorted here by id: the order the database saved them). A trial is a
    record other than a task's unscheduled build (proposer `baseline`): that one is no trial, but
    it counts as the task's latency until a candidate beats it, as in `tune_model`. For one op,
    `calls` is {its key: 1} and the curve is its best latency."""
    best: dict[str, float] = {}
    curve: list[tuple[int, float]] = []
    trials = 0
    for record in sorted(records, key=lambda r: r.id or 0):
        if record.op_key not in calls:
            continue
        if record.proposer != baseline:
            trials += 1
        if record.is_ok and record.median_s:
            best[record.op_key] = min(best.get(record.op_key, math.inf), float(record.median_s))
        if record.proposer != baseline and len(best) == len(calls):
            curve.append((trials, sum(best[key] * max(n, 1) for key, n in calls.items())))
    return curve
