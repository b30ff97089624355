"""The settings of a tuning run: its budget, its timeouts, how it times, where it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from schedlang.run.runner import RunnerSettings

if TYPE_CHECKING:
    from schedlang.run.remote import RemoteSettings


@dataclass(frozen=True)
class Settings:
    trials: int = 32
    seed: int = 0
    batch: int = 8  # candidates built in parallel, then run one by one
    builders: int = 2
    build_timeout_s: float = 120.0
    run_timeout_s: float = 60.0
    repeat: int = 5
    min_repeat_ms: int = 100
    slow_run_s: float | None = 1.0  # a kernel slower than this is timed with fewer repeats
    baseline: bool = False  # first measure the unscheduled build, unless the database has it
    max_rounds_without_new: int = 3
    remote: RemoteSettings | None = None  # measure on devices leased from an RPC tracker
    # The cost model (schedlang.tuning.costmodel): "auto" (LightGBM if installed), "lightgbm",
    # "off". Off unless asked for: in the recorded 64-trial run (docs/benchmarks.md) it found
    # conv2d's best later than the plain search and did not help the other ops.
    cost_model: str = "off"
    cost_model_pool: int = 4  # points lowered and ranked per slot of a batch
    cost_model_explore: float = 0.25  # of a batch, the share drawn at random from the pool's rest
    cost_model_min_records: int = 8  # verified records before the model ranks anything
    # Trials that earn their time (issue 48). `screen`: the checker asked before a point is
    # proposed, so a point it refuses costs no trial (schedlang.tuning.search.Screen).
    # `early_stop`: the run also stops once its best (a model's estimate) has converged
    # (schedlang.tuning.convergence: under 1% over the last 64 trials); `--no-early-stop` turns
    # it off, and `trials` stays the ceiling either way.
    screen: bool = True
    early_stop: bool = True

    def runner(self) -> RunnerSettings:
        """What picks and configures the runner (schedlang.run.runner.make_runner)."""
        return RunnerSettings(self.run_timeout_s, self.slow_run_s, self.remote)
