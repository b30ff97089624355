"""Where a model's trials go: MetaSchedule's gradient-based task scheduler, in rounds.

    scheduler = GradientScheduler(tasks, trials=200, known=bests_in_db)
    while (turn := scheduler.next()) is not None:
        state, trials = turn
        ...  # tune state.task for `trials` candidates
        scheduler.record(state, measured, best_s)

Every task is measured first, one round each, heaviest first (a task the database already holds
a record of starts from it: nothing is measured again); that first round takes at most a batch a
task and about FIRST_ROUND_TRIALS in all (fewer a task on a model of many tasks). Then each round
goes to the task whose next trials promise the largest drop in the model's latency, its calls
times

    gradient = ALPHA * (best[-1 - WINDOW] - best[-1]) / WINDOW + (1 - ALPHA) * best[-1] / rounds

where `best` is the task's best latency after each of its rounds: the recent slope, and an
optimistic guess that the next rounds cut as much as the earlier ones did on average.
MetaSchedule's `GradientBased` (src/s_tir/meta_schedule/task_scheduler/gradient_based.cc in TVM)
uses ALPHA = 0.2 and a window of 3; so does this. A task whose round measured nothing new (its
templates are spent) or raised gets no more rounds; one with nothing verified is not chosen again.

Unlike MetaSchedule's, the choice is per second of tuning, not per trial: each gradient is
divided by what a trial of that task has cost so far (the rounds' wall time over their trials,
`record(..., seconds=)`; tasks not yet timed count as the median of those timed). In a 1,000-trial
ResNet-18 run (2026-12-05) the 7x7 stride-2 stem, the largest task once Winograd had made the 3x3
convolutions small, took 172 trials and about 1,570 of the 2,159 seconds (9 s a trial, LLVM
building unrolled 7-wide windows; the others' 0.35 s), its best found in its second round.

Trials that earn their time (issue 48). A task whose last STALL_ROUNDS rounds cut its best by
less than STALL_GAIN is stalled: it gets no round while a task that is not stalled is alive (in
that ResNet-18 run the largest convolution got 258 trials and kept the best of its first round).
With a stopping rule (`convergence`, schedlang.tuning.convergence), the model's estimate is
observed after every round once each task has a latency, and `next` returns None once it has
converged, or once every task is stalled; `stop` says which, as data. Without one (today's
`--no-early-stop`) the budget is spent as before, stalled tasks ranked among themselves once no
other is left. `resume` replays the curve a database holds (`convergence.database_curve`), so a
rerun goes on where the stopped run left.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from schedlang.models.graph import Task
from schedlang.tuning.convergence import Convergence, Stop

ALPHA = 0.2
WINDOW = 3
ROUND_TRIALS = 8  # at most, per round: the tuner's batch
# The first round, all tasks together, is held to about this many trials (at least FIRST_ROUND_MIN
# a task): a model of many tasks gets fewer a task, so the stopping rule (counted after it, over
# a window of 64 trials) can stop a default run within 200 trials; the heavy tasks get full
# rounds of ROUND_TRIALS right after, by their gradients. Issue 48: MobileNetV2's 32 tasks at 8
# a task made a first round of 256 trials, and the run could stop no earlier than trial 320.
FIRST_ROUND_TRIALS = 128
FIRST_ROUND_MIN = 2
# A task is stalled once its last 3 rounds (24 trials) cut its best by less than 0.5%: about the
# spread of a kernel timed 3 x 40 ms, below which a "gain" is as likely the timer's.
STALL_ROUNDS = 3
STALL_GAIN = 0.005


@dataclass
class TaskState:
    """One task as the scheduler sees it."""

    task: Task
    best_s: list[float] = field(default_factory=list)  # best latency after each round (inf: none)
    trials: int = 0  # measured in this run
    rounds: int = 0
    spent: bool = False  # a round found nothing new to measure
    error: str | None = None  # what stopped its tuning
    seconds: float = 0.0  # the wall time of its timed rounds
    timed_trials: int = 0  # the trials of those rounds

    @property
    def latency_s(self) -> float | None:
        """Its best latency so far; None when nothing verified."""
        return self.best_s[-1] if self.best_s and math.isfinite(self.best_s[-1]) else None

    @property
    def time_s(self) -> float | None:
        """Its share of one run of the model: its best latency times its calls (at least one)."""
        latency = self.latency_s
        return None if latency is None else latency * max(self.task.calls, 1)

    @property
    def alive(self) -> bool:
        return not self.spent and self.error is None

    @property
    def stalled(self) -> bool:
        """Its last STALL_ROUNDS rounds cut its best by less than STALL_GAIN."""
        if len(self.best_s) <= STALL_ROUNDS or not math.isfinite(self.best_s[-1]):
            return False
        before = self.best_s[-1 - STALL_ROUNDS]
        if not math.isfinite(before):  # nothing verified then, something now: it found that
            return False
        return before - self.best_s[-1] < STALL_GAIN * before

    @property
    def trial_s(self) -> float | None:
        """What one of its trials has cost, in seconds of tuning; None before any was timed."""
        return self.seconds / self.timed_trials if self.timed_trials else None

    def gradient(self) -> float:
        """The drop in the model's latency its next round promises (seconds, times its calls)."""
        best = self.best_s[-1]
        if not math.isfinite(best):
            return -math.inf
        n = len(self.best_s)
        backward = (self.best_s[-1 - WINDOW] - best) / WINDOW if n > WINDOW else 0.0
        forward = best / n
        return (ALPHA * backward + (1 - ALPHA) * forward) * max(self.task.calls, 1)


class GradientScheduler:
    """`trials` measured candidates in all, shared in rounds among `tasks` (heaviest first);
    `known` holds the database's best latency of a task by its key; with `convergence` the
    run stops early once the model's estimate has converged or every task is stalled."""

    def __init__(
        self,
        tasks: Sequence[Task],
        trials: int,
        known: Mapping[str, float] | None = None,
        round_trials: int = ROUND_TRIALS,
        convergence: Convergence | None = None,
        first_round_trials: int = FIRST_ROUND_TRIALS,
    ):
        self.states = [TaskState(task) for task in tasks]
        for state in self.states:
            if known and state.task.key in known:
                state.best_s.append(known[state.task.key])
        self.left = trials
        self.measured = 0  # trials measured in all
        # The first rounds share the budget so that every task gets one, where it can, and
        # together take about `first_round_trials` (at least FIRST_ROUND_MIN a task).
        count = max(len(self.states), 1)
        shared = max(FIRST_ROUND_MIN, first_round_trials // count)
        self.first_round = max(1, min(round_trials, trials // count, shared))
        self.round_trials = max(1, round_trials)
        self.convergence = convergence
        self.offset = 0  # trials of earlier runs (`resume`): where this run's count starts
        self.stop: Stop | None = None  # why it stopped early, once it has

    def resume(self, curve: Sequence[tuple[int, float]]) -> None:
        """Replay the (trials, estimate) curve of earlier runs (convergence.database_curve) into
        the stopping rule; this run's trials count on from its end."""
        if self.convergence is not None and curve:
            self.convergence.replay(curve)
            self.offset = curve[-1][0]
            self.stop = self.convergence.stop()

    def next(self) -> tuple[TaskState, int] | None:
        """The task to tune next and its trials; None when the budget or the tasks are spent,
        or the run has stopped early (`stop`)."""
        if self.left <= 0 or self.stop is not None:
            return None
        alive = [state for state in self.states if state.alive]
        unmeasured = [state for state in alive if not state.best_s]
        if unmeasured:
            return unmeasured[0], min(self.first_round, self.left)
        ranked = [state for state in alive if state.gradient() > -math.inf]
        if not ranked:
            return None
        if not (moving := [state for state in ranked if not state.stalled]):
            if self.convergence is not None:
                self.stop = Stop(
                    0.0, STALL_ROUNDS, STALL_GAIN, self.offset + self.measured,
                    self.estimate_s()[0], kind="stalled",
                )  # fmt: skip
                return None
            moving = ranked  # no early stop: the stalled ones share what is left
        ranked = moving
        costs = sorted(c for state in self.states if (c := state.trial_s) is not None)
        usual = costs[len(costs) // 2] if costs else 1.0

        def per_second(state: TaskState) -> float:
            return state.gradient() / max(state.trial_s or usual, 1e-9)

        return max(ranked, key=per_second), min(self.round_trials, self.left)

    def record(
        self, state: TaskState, measured: int, best_s: float | None, seconds: float | None = None
    ) -> None:
        """A round of `state` measured `measured` new candidates in `seconds` of wall time (when
        timed); its best is now `best_s`."""
        state.rounds += 1
        if seconds is not None and measured:
            state.seconds += seconds
            state.timed_trials += measured
        state.trials += measured
        self.left -= measured
        self.measured += measured
        if measured == 0:
            state.spent = True
        state.best_s.append(best_s if best_s is not None else math.inf)
        if self.convergence is not None:
            # A task that failed, or whose templates were spent before a verified one, never
            # completes the estimate: the rule waits only for those still being tuned.
            estimate, _ = self.estimate_s()
            if all(s.time_s is not None for s in self.states if s.alive):
                self.convergence.observe(self.offset + self.measured, estimate)
                self.stop = self.convergence.stop()

    def fail(self, state: TaskState, reason: str) -> None:
        state.error = reason

    def estimate_s(self) -> tuple[float, int]:
        """The model's latency as the sum of its tasks' best latencies times their calls, and how
        many tasks have no verified latency yet (not counted in the sum)."""
        times = [state.time_s for state in self.states if state.time_s is not None]
        return sum(times), len(self.states) - len(times)
