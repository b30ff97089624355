"""Where a built model's time goes: each PrimFunc the Relax VM calls, timed call by call.

TVM 0.27's Relax VM has no profiler (`relax.VirtualMachine` takes no `profile=`), so the time is
read through its instrument hook (`vm.set_instrument`), which the VM calls before and after every
call instruction: the clock starts when the hook returns before a call and stops when it is entered
after it. On a GPU the device is synchronised on both sides, so a kernel's time is its own. The
hook costs a few microseconds a call; the VM's builtins (allocation, shape checks) are timed the
same way and reported apart, as `builtins_s`.

`main` runs once to warm up, then `repeat` times; each figure is the median over those runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.core.target import Target, as_target
from schedlang.models.graph import Applied


@dataclass(frozen=True)
class FunctionTime:
    """One PrimFunc in a run of `main`: how often it is called, for how long, what it got."""

    function: str
    calls: int  # per run of main
    total_s: float  # all its calls in one run (median over runs)
    share: float  # of the functions' total
    scheduled: str  # Applied.summary(): a record, dlight, unscheduled

    @property
    def per_call_s(self) -> float:
        return self.total_s / self.calls

    def as_json(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "calls": self.calls,
            "per_call_s": self.per_call_s,
            "total_s": self.total_s,
            "share": self.share,
            "scheduled": self.scheduled,
        }


@dataclass(frozen=True)
class Profile:
    """The PrimFuncs by total time, most first; their total and the VM builtins', per run."""

    rows: tuple[FunctionTime, ...]
    total_s: float
    builtins_s: float
    repeat: int

    def as_json(self) -> dict[str, Any]:
        return {
            "repeat": self.repeat,
            "total_s": self.total_s,
            "builtins_s": self.builtins_s,
            "functions": [row.as_json() for row in self.rows],
        }


def profile_model(
    executable: Any,
    applied: Sequence[Applied],
    inputs: Sequence[Any],
    target: Target | str,
    repeat: int = 5,
) -> Profile:
    """Time each PrimFunc of `executable` (a built model) over `repeat` runs of `main`; a
    SchedlangError when the VM cannot be instrumented or run on `target`."""
    import tvm
    from tvm import relax

    from schedlang.run.measure import device_for

    target = as_target(target)
    device = device_for(target)
    try:
        vm = relax.VirtualMachine(executable, device)
        tensors = [tvm.runtime.tensor(a, device) for a in inputs]
        clock = _Clock(device if target.is_gpu else None)
        vm.set_instrument(clock.hook)
        vm["main"](*tensors)  # warm-up
        runs = []
        for _ in range(repeat):
            clock.times.clear()
            vm["main"](*tensors)
            runs.append(dict(clock.times))
    except SchedlangError:
        raise
    except Exception as exc:  # the instrument hook or the VM: one line, the build still stands
        raise SchedlangError(f"the profiler failed on {target.kind}: {error_line(exc)}") from None
    return _summarise(runs, applied, repeat)


class _Clock:
    """The VM's instrument hook: seconds and calls per called symbol, for one run."""

    def __init__(self, device: Any | None) -> None:
        self.device = device  # synchronised around each call on a GPU
        self.times: dict[str, tuple[int, float]] = {}
        self.started: list[float] = []

    def hook(self, func: Any, symbol: str, before: bool, ret: Any, *args: Any) -> int:
        if self.device is not None:
            self.device.sync()
        now = time.perf_counter()
        if before:
            self.started.append(time.perf_counter())
            return 0
        calls, seconds = self.times.get(symbol, (0, 0.0))
        self.times[symbol] = (calls + 1, seconds + now - self.started.pop())
        return 0  # VMInstrumentReturnKind.NoOp: the VM goes on as usual


def _summarise(
    runs: list[dict[str, tuple[int, float]]], applied: Sequence[Applied], repeat: int
) -> Profile:
    how = {item.function: item.summary() for item in applied}
    # A function whose schedule `prepack`s a weight is called as NAME_prepacked; its packing,
    # NAME_weight_prepack, ran when the model was built (a row for it would mean it did not).
    for item in applied:
        how[f"{item.function}_prepacked"] = f"{item.summary()}, weight packed at build time"
        how[f"{item.function}_weight_prepack"] = "the weight packing of a prepacked schedule"
    symbols = {symbol for run in runs for symbol in run}
    functions = sorted(symbols & how.keys())
    builtins = symbols - how.keys()

    def median_of(symbol: str) -> float:
        return statistics.median(run.get(symbol, (0, 0.0))[1] for run in runs)

    totals = {name: median_of(name) for name in functions}
    total = sum(totals.values())
    rows = [
        FunctionTime(name, runs[0][name][0], totals[name], totals[name] / (total or 1), how[name])
        for name in functions
    ]
    rows.sort(key=lambda row: row.total_s, reverse=True)
    builtins_s = statistics.median(sum(run.get(s, (0, 0.0))[1] for s in builtins) for run in runs)
    return Profile(tuple(rows), total, builtins_s, repeat)
