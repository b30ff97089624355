"""Tuning curves: best-so-far GFLOP/s against the trial number, one line per proposer, with the
baselines a reader compares them to (the unscheduled build, numpy, MetaSchedule when known)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.store.records import Record

if TYPE_CHECKING:
    from schedlang.core.ops import Op
    from schedlang.core.target import Target
    from schedlang.store.db import Database


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # `pip install 'schedlang[plot]'` only works for an install from an index; this works for
        # a checkout, a wheel and an index alike, and names the Python schedlang runs in.
        raise SchedlangError(
            "--plot needs matplotlib, which is not installed",
            f"install it into this Python: `{sys.executable} -m pip install matplotlib`",
        ) from None


def best_so_far(records: Sequence[Record]) -> list[float]:
    """The best GFLOP/s after each trial; NaN until the first verified one (nothing to draw)."""
    curve, best = [], math.nan
    for record in records:
        if record.is_ok and record.gflops:
            best = record.gflops if math.isnan(best) else max(best, record.gflops)
        curve.append(best)
    return curve


def numpy_gflops(op: Op, repeat: int = 3) -> float | None:
    """The op's numpy reference, timed here (median of `repeat` runs after one to warm up);
    None when the op has no reference."""
    from schedlang.core.opinfo import flop_count
    from schedlang.core.ops import random_inputs, reference_outputs

    if op.reference is None:
        return None
    args = random_inputs(op)
    reference_outputs(op, [a.copy() for a in args])
    times = []
    for _ in range(repeat):
        copies = [a.copy() for a in args]
        start = time.perf_counter()
        reference_outputs(op, copies)
        times.append(time.perf_counter() - start)
    median = sorted(times)[len(times) // 2]
    return flop_count(op.func) / median / 1e9 if median > 0 else None


def baselines(
    op: Op,
    target: Target,
    db: Database,
    tuner_baseline: Record | None = None,
    *,
    local: bool = True,
    note: Callable[[str], None] = lambda text: None,
) -> dict[str, float]:
    """The horizontal lines of a tuning curve, in GFLOP/s: the unscheduled build (the tuner's
    measurement when it made one, else `unscheduled_gflops`), numpy (`numpy_gflops`) and
    MetaSchedule's best record in the database. `local`: the kernels run on this machine (not on
    remote devices), so timing here compares like with like. A baseline that cannot be measured
    is left out, with a `note` saying why: the curve is the result, and must not be lost to it."""

    def measured(name: str, measure: Callable[[], float | None]) -> float | None:
        try:
            return measure()
        except SchedlangError as err:
            note(f"note: the plot has no {name} baseline: {err.message}")
        except Exception as exc:  # a TVM build or run error of the unscheduled op
            note(f"note: the plot has no {name} baseline: {error_line(exc, with_type=True)}")
        return None

    lines: dict[str, float] = {}
    if tuner_baseline is not None and tuner_baseline.is_ok and tuner_baseline.gflops:
        lines["unscheduled"] = tuner_baseline.gflops
    elif local and (
        unscheduled := measured("unscheduled", lambda: unscheduled_gflops(op, target, db))
    ):
        lines["unscheduled"] = unscheduled
    if local and (numpy := measured("numpy", lambda: numpy_gflops(op))):
        lines["numpy" if not target.is_gpu else "numpy (this CPU)"] = numpy
    if metaschedule := metaschedule_gflops(db, op, target):
        lines["MetaSchedule"] = metaschedule
    return lines


def unscheduled_gflops(op: Op, target: Target, db: Database) -> float | None:
    """The op's unscheduled build: the database's record of the empty schedule when the tuner
    measured one (`--proposer model`), else built and timed here (3 repeats)."""
    from schedlang.run.build import compile_func
    from schedlang.run.measure import set_runtime_threads, time_kernel
    from schedlang.store.records import op_key

    record = db.get(op_key(op.func), target.key, "")
    if record is not None and record.is_ok and record.gflops:
        return record.gflops
    set_runtime_threads(target.cores if not target.is_gpu else None)
    timing = time_kernel(op, compile_func(op.func, target), target, repeat=3, min_repeat_ms=20)
    return timing.gflops or None


def metaschedule_gflops(db: Database, op: Op, target: Target) -> float | None:
    """The best verified MetaSchedule record of the op in the database (from `eval-model
    --metaschedule` or `schedlang import`), if any."""
    from schedlang.store.records import Status, op_key

    found = [
        r.gflops
        for r in db.records(op_key(op.func), target.key, status=Status.OK)
        if r.proposer == "metaschedule" and r.gflops
    ]
    return max(found) if found else None


def tuning_curve(
    records: Sequence[Record],
    path: str | Path,
    *,
    title: str = "",
    baselines: Mapping[str, float] | None = None,
    series: Mapping[str, Sequence[Record]] | None = None,
) -> Path:
    """Write the curve of `draw_curve` as a PNG."""
    figure = draw_curve(records, title=title, baselines=baselines, series=series)
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        figure.savefig(path)
    except OSError as err:
        raise SchedlangError(f"cannot write {path}: {err.strerror or err}") from None
    finally:
        plt.close(figure)
    return path


def draw_curve(
    records: Sequence[Record],
    *,
    title: str = "",
    baselines: Mapping[str, float] | None = None,
    series: Mapping[str, Sequence[Record]] | None = None,
):
    """A matplotlib Figure: best-so-far GFLOP/s per trial, one step line per proposer (or per
    `series` entry), each trial marked; `baselines` are dashed horizontal lines labelled with
    their value (e.g. {"numpy": 130.0, "MetaSchedule": 95.0}). Steps, since the best so far only
    changes at a trial and holds until the next better one; trials are counted in whole numbers."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if series is None:
        grouped: dict[str, list[Record]] = {}
        for record in records:
            grouped.setdefault(record.proposer, []).append(record)
        series = grouped
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    longest = max((len(group) for group in series.values()), default=0)
    for name, group in series.items():
        curve = best_so_far(group)
        trials = range(1, len(curve) + 1)
        [line] = axes.step(trials, curve, where="post", label=name, linewidth=2)
        axes.plot(trials, curve, "o", markersize=3, color=line.get_color())  # each trial
    for index, (name, value) in enumerate((baselines or {}).items()):
        axes.axhline(
            value, linestyle="--", color=f"C{index + 3}", label=f"{name} ({value:.3g} GFLOP/s)"
        )
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlim(0.5, max(longest, 1) + 0.5)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("trial")
    axes.set_ylabel("best GFLOP/s so far")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    figure.tight_layout()
    return figure
