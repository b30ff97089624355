"""Tuning curves: best-so-far GFLOP/s against the trial number, one line per proposer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from schedlang.db import Record
from schedlang.diagnostics import SchedlangError


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SchedlangError(
            "--plot needs matplotlib", "install it with `pip install 'schedlang[plot]'`"
        ) from None


def best_so_far(records: Sequence[Record]) -> list[float]:
    curve, best = [], 0.0
    for record in records:
        if record.is_ok and record.gflops:
            best = max(best, record.gflops)
        curve.append(best)
    return curve


def tuning_curve(
    records: Sequence[Record],
    path: str | Path,
    *,
    title: str = "",
    baselines: Mapping[str, float] | None = None,
    series: Mapping[str, Sequence[Record]] | None = None,
) -> Path:
    """Write a PNG; `series` overrides grouping by proposer; `baselines` are horizontal lines
    (e.g. {"numpy": 130.0, "MetaSchedule@64": 95.0})."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if series is None:
        grouped: dict[str, list[Record]] = {}
        for record in records:
            grouped.setdefault(record.proposer, []).append(record)
        series = grouped
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, group in series.items():
        curve = best_so_far(group)
        axes.plot(range(1, len(curve) + 1), curve, label=name, linewidth=2)
    for index, (name, value) in enumerate((baselines or {}).items()):
        axes.axhline(value, linestyle="--", color=f"C{index + 3}", label=name)
    axes.set_xlabel("trial")
    axes.set_ylabel("best GFLOP/s so far")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path)
    plt.close(figure)
    return path
