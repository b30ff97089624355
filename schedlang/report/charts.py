"""The report's charts as SVG written here, inline in the page: a tuning curve; for a model, bars
of each function's time in the tuned model (its untuned time written beside), its estimated
latency against trials, the trials each function got, and bars of its end-to-end latencies.

Written by hand rather than by matplotlib or Plotly (docs/report.md says why): the page needs
no script and no extra package, the text stays text (searchable, sharp at any zoom), a chart is a
few kilobytes, and the same numbers give the same bytes, so tests compare charts with golden
files. Every mark carries its number (`data-value`), for scripts and for the browser test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

from schedlang.core.units import format_seconds

# Colour-blind-safe (Okabe and Ito): series, then baselines.
COLORS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#000000")
WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 56, 170, 16, 40  # margins: the legend sits at the right


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top`."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [step * i for i in range(math.ceil(top / step - 1e-9) + 1)]


def _number(value: float) -> str:
    return f"{value:.4g}"


def _svg(body: list[str], label: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(label)}" '
        'font-family="sans-serif" font-size="11">\n' + "\n".join(body) + "\n</svg>"
    )


def _legend(entries: Sequence[tuple[str, str, bool]], x: float, y: float) -> list[str]:
    """(label, colour, dashed) entries, one a line."""
    out = []
    for index, (label, color, dashed) in enumerate(entries):
        top = y + index * 16
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        out.append(
            f'<line x1="{x}" y1="{top}" x2="{x + 18}" y2="{top}" stroke="{color}" '
            f'stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{x + 24}" y="{top + 4}">{escape(label)}</text>')
    return out


def curve_svg(
    series: Mapping[str, Sequence[float | None]], baselines: dict[str, float], label: str
) -> str:
    """Best-so-far GFLOP/s against the trial, one step line per series (its trials' GFLOP/s, None
    for a trial that failed), each trial a dot; each baseline a dashed line across."""
    trials = max((len(values) for values in series.values()), default=0)
    measured = [v for values in series.values() for v in values if v]
    top = max([*measured, *baselines.values(), 0.0]) * 1.08
    ticks = nice_ticks(top)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(trial: float) -> float:
        return LEFT + plot_w * (trial - 0.5) / max(trials, 1)

    def y_of(value: float) -> float:
        return TOP + plot_h * (1 - value / ticks[-1])

    body = _axes(ticks, y_of, plot_w, "best GFLOP/s so far")
    step = max(1, math.ceil(trials / 10))
    for trial in range(1, trials + 1, step):
        x = x_of(trial)
        body.append(
            f'<text x="{x:.1f}" y="{TOP + plot_h + 14}" text-anchor="middle">{trial}</text>'
        )
    body.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle">trial</text>')
    legend = []
    for index, (name, values) in enumerate(series.items()):
        color = COLORS[index % len(COLORS)]
        best, points = 0.0, []
        for trial, value in enumerate(values, 1):
            best = max(best, value or 0.0)
            if best:
                points.append((x_of(trial), y_of(best)))
        if points:  # steps: the best so far holds until a better trial
            path = [f"M{points[0][0]:.1f},{points[0][1]:.1f}"]
            path += [f"H{x:.1f}V{y:.1f}" for x, y in points[1:]]
            path.append(f"H{x_of(len(values) + 0.5):.1f}")
            body.append(
                f'<path class="curve" d="{"".join(path)}" fill="none" stroke="{color}" '
                f'stroke-width="2" data-series="{escape(name)}"/>'
            )
        for trial, value in enumerate(values, 1):
            if value:
                body.append(
                    f'<circle class="trial" cx="{x_of(trial):.1f}" cy="{y_of(value):.1f}" r="3" '
                    f'fill="{color}" data-trial="{trial}" data-value="{_number(value)}">'
                    f"<title>trial {trial}: {_number(value)} GFLOP/s</title></circle>"
                )
        legend.append((name, color, False))
    for index, (name, value) in enumerate(baselines.items()):
        color = COLORS[(len(series) + index) % len(COLORS)]
        y = y_of(value)
        body.append(
            f'<line class="baseline" x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" '
            f'stroke="{color}" stroke-width="1.5" stroke-dasharray="5 3" '
            f'data-name="{escape(name)}" data-value="{_number(value)}"/>'
        )
        legend.append((f"{name} ({_number(value)})", color, True))
    body += _legend(legend, LEFT + plot_w + 14, TOP + 8)
    return _svg(body, label)


def _axes(ticks: list[float], y_of, plot_w: float, y_label: str) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    body = [
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>'
    ]
    for tick in ticks:
        y = y_of(tick)
        body.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        body.append(f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{tick:g}</text>')
    body.append(
        f'<text transform="translate(14 {TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    return body


NAME_CHARS = 30  # a function's name as a bar's label: longer ones are shortened in the middle


def short_name(name: str, limit: int = NAME_CHARS) -> str:
    """`name` within `limit` characters: its start and its end kept, `…` between (the start
    says what the function is, the end tells fused variants apart)."""
    if len(name) <= limit:
        return name
    tail = limit // 3
    return name[: limit - tail - 1] + "…" + name[-tail:]


def speedup(ratio: float) -> str:
    """`2.5x`, `82.4x`, `1,070x`: a speed-up, never in exponent notation."""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"


def _name_label(name: str, x: float, y: float) -> str:
    """A bar's label: the name shortened to fit, the full name on hover."""
    return (
        f'<text class="name" x="{x}" y="{y}" text-anchor="end">'
        f"<title>{escape(name)}</title>{escape(short_name(name))}</text>"
    )


def function_bars_svg(rows: Sequence[tuple[str, float | None, float | None]], label: str) -> str:
    """Each function's time in the tuned model, as its share of the tuned total (the bars' scale:
    the largest share spans the plot), with the untuned time written beside it as a figure, not
    drawn: scaled to the untuned model every tuned bar would be a sliver. `rows`: (function,
    seconds untuned, seconds tuned), drawn in the order given; None where not measured."""
    total_after = sum(after or 0 for _, _, after in rows) or 1.0
    largest = max(((after or 0) / total_after for _, _, after in rows), default=0) or 1.0
    bar, gap, name_w = 14, 8, 196
    plot_w = WIDTH - name_w - 250
    body = []
    for index, (name, before, after) in enumerate(rows):
        y = TOP + index * (bar + gap)
        body.append(_name_label(name, name_w - 6, y + 11))
        untuned = "untuned " + format_seconds(before, "not measured")
        if before and after:
            untuned += f", {speedup(before / after)}"
        if after is None:
            body.append(
                f'<text x="{name_w + 4}" y="{y + 11}" fill="#777">not tuned ({untuned})</text>'
            )
            continue
        share = after / total_after
        width = max(plot_w * share / largest, 1)
        before_attr = "" if before is None else f' data-before="{_number(before)}"'
        body.append(
            f'<rect class="bar after" x="{name_w}" y="{y}" width="{width:.1f}" height="{bar}" '
            f'fill="{COLORS[0]}" data-value="{_number(after)}" data-share="{share:.4f}"'
            f"{before_attr}>"
            f"<title>{escape(name)}: {format_seconds(after)} tuned, {share:.1%} of the tuned "
            f"model; {untuned}</title></rect>"
        )
        body.append(
            f'<text x="{name_w + width + 4:.1f}" y="{y + 11}">{share:.1%} '
            f"({format_seconds(after)})"
            f'<tspan fill="#777"> {untuned}</tspan></text>'
        )
    height = TOP + len(rows) * (bar + gap) + 8
    return _svg(body, label, height=height)


def latency_curve_svg(points: Sequence[tuple[int, float]], label: str) -> str:
    """The model's estimated latency (its functions' best times, calls included) against the
    trials spent on it: a step line, a dot per point."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    trials = [t for t, _ in points]
    first, last = (min(trials), max(trials)) if trials else (0, 1)
    span = max(last - first, 1)
    top = max((v for _, v in points), default=1e-3) * 1.08
    unit, scale = next(
        ((u, f) for u, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)) if top >= f), ("ns", 1e-9)
    )
    ticks = nice_ticks(top / scale)

    def x_of(trial: float) -> float:
        return LEFT + plot_w * (trial - first) / span

    def y_of(value: float) -> float:
        return TOP + plot_h * (1 - value / ticks[-1])

    body = _axes(ticks, y_of, plot_w, f"estimated latency ({unit})")
    labels = [t for t in nice_ticks(last, 5) if first <= t <= last]
    for trial in labels if len(labels) >= 2 else sorted({first, last}):
        body.append(
            f'<text x="{x_of(trial):.1f}" y="{TOP + plot_h + 14}" '
            f'text-anchor="middle">{trial:g}</text>'
        )
    body.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle">trials</text>'
    )
    if points:
        xy = [(x_of(t), y_of(v / scale)) for t, v in points]
        path = [f"M{xy[0][0]:.1f},{xy[0][1]:.1f}"] + [f"H{x:.1f}V{y:.1f}" for x, y in xy[1:]]
        body.append(
            f'<path class="curve" d="{"".join(path)}" fill="none" stroke="{COLORS[0]}" '
            'stroke-width="2"/>'
        )
        for (trial, value), (x, y) in zip(points, xy, strict=True):
            body.append(
                f'<circle class="estimate" cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{COLORS[0]}" '
                f'data-trial="{trial}" data-value="{_number(value)}">'
                f"<title>after {trial} trials: {format_seconds(value)}</title></circle>"
            )
        gain = points[0][1] / points[-1][1]
        x = LEFT + plot_w + 14
        body += _legend([("estimated latency", COLORS[0], False)], x, TOP + 8)
        for index, line in enumerate(
            (
                f"{format_seconds(points[0][1])} after {first} trial{'s' if first != 1 else ''}",
                f"{format_seconds(points[-1][1])} after {last}",
                f"{gain:.3g}x in {last - first} trials",
            )
        ):
            body.append(f'<text x="{x}" y="{TOP + 30 + 14 * index}">{escape(line)}</text>')
    return _svg(body, label)


def _bar_places(
    values: Sequence[float], bar: int, gap: int, plot_w: float
) -> list[tuple[int, float]]:
    """Each horizontal bar's top and width: one under another, the longest `plot_w` wide."""
    most = max(values, default=1) or 1
    return [
        (TOP + index * (bar + gap), max(plot_w * v / most, 1)) for index, v in enumerate(values)
    ]


def trial_bars_svg(rows: Sequence[tuple[str, int]], label: str) -> str:
    """The trials each function got, one bar each, its count beside it."""
    bar, gap, name_w = 12, 6, 196
    places = _bar_places([count for _, count in rows], bar, gap, WIDTH - name_w - 60)
    body = []
    for (name, count), (y, width) in zip(rows, places, strict=True):
        body.append(_name_label(name, name_w - 6, y + 10))
        body.append(
            f'<rect class="bar trials" x="{name_w}" y="{y}" width="{width:.1f}" height="{bar}" '
            f'fill="{COLORS[2]}" data-value="{count}"><title>{escape(name)}: {count} '
            f"trial{'s' if count != 1 else ''}</title></rect>"
        )
        body.append(f'<text x="{name_w + width + 4:.1f}" y="{y + 10}">{count}</text>')
    return _svg(body, label, height=TOP + len(rows) * (bar + gap) + 8)


def latency_bars_svg(rows: Sequence[tuple[str, float]], label: str) -> str:
    """End-to-end latencies, one bar each, the first (the tuned build) highlighted."""
    bar, gap, name_w = 16, 6, 170
    height = TOP + len(rows) * (bar + gap) + 20
    places = _bar_places([seconds for _, seconds in rows], bar, gap, WIDTH - name_w - 110)
    body = []
    for index, ((name, seconds), (y, width)) in enumerate(zip(rows, places, strict=True)):
        color = COLORS[0] if index == 0 else "#999"
        ratio = f", {seconds / rows[0][1]:.2f}x" if index and rows[0][1] else ""
        body.append(f'<text x="{name_w - 6}" y="{y + 12}" text-anchor="end">{escape(name)}</text>')
        body.append(
            f'<rect class="bar latency" x="{name_w}" y="{y}" width="{width:.1f}" height="{bar}" '
            f'fill="{color}" data-value="{_number(seconds)}"><title>{escape(name)}: '
            f"{format_seconds(seconds)}</title></rect>"
        )
        body.append(
            f'<text x="{name_w + width + 4:.1f}" y="{y + 12}">{format_seconds(seconds)}'
            f"{ratio}</text>"
        )
    return _svg(body, label, height=height)
