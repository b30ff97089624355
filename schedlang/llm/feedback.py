"""Feedback: what a model proposing schedules is told about the candidates measured so far.

Each round's prompt shows the history in the terms that bound the op on the target. An op doing
fewer flops per byte of its arguments than the target's ridge point (peak FLOP/s over memory
bandwidth) is memory-bound: its rates are GB/s and its shares are of the memory bandwidth; any
other op's are GFLOP/s and shares of the fp32 peak. One entry per candidate:

    #12 ok: 3.41 ms, 63.0 GFLOP/s = 40% of peak, 42.5x the unscheduled build, 0.85x the best (#7)
    knobs (a point of a template): TI=8, TJ=16
    ```schedlang
    block C:
      tile i, j by 8 x 16
    ```

A failure gives its status, its reason and the checker's first two diagnostics (8 lines at most).
The id (`#12`) is the record's id in the database, so that a prompt can say "edit #12" (`entry`
renders one record for that). Comments of a schedule are never shown: a model's comments are its
own words, not facts, and would echo from round to round.

    text = render_history(db.records(key, target.key), op=op, target=target, baseline=None)

The text stays within `max_chars`, a proxy for the prompt's token budget. When it would not, it
gives up, in this order: the latest entries but the newest (oldest first), the diagnostics, the
fastest entries but the first, the newest entry; at last it is cut at a line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import flop_count, format_flops
from schedlang.core.ops import Op
from schedlang.core.target import Target
from schedlang.store.records import Record, Status

DEFAULT_MAX_CHARS = 6000  # about 1,500 tokens
DIAGNOSTICS_SHOWN = 2
DIAGNOSTIC_LINES = 8

# How the tally names each status: those that ran first (they were built and run), then the others.
_RAN = {
    Status.OK: "ok",
    Status.WRONG: "wrong",
    Status.TIMEOUT: "timed out",
    Status.CRASH: "crashed",
    Status.RUN_ERROR: "failed to run",
}
_NOT_RUN = {Status.BUILD_ERROR: "failed to build", Status.CHECK_ERROR: "rejected by the checker"}
_SOURCE_LINE = re.compile(r"\s*\d+ \| ")  # a diagnostic's echo of a schedule line


@dataclass(frozen=True)
class Roofline:
    """What bounds an op on a target, and the figures its candidates are judged by."""

    flops: int | None
    bytes: int | None  # of the op's arguments, each read or written once
    peak_gflops: float | None
    memory_gbps: float | None

    @property
    def intensity(self) -> float | None:
        """Flops per byte of the arguments."""
        return self.flops / self.bytes if self.flops is not None and self.bytes else None

    @property
    def ridge(self) -> float | None:
        if not self.peak_gflops or not self.memory_gbps:
            return None
        return self.peak_gflops / self.memory_gbps

    @property
    def memory_bound(self) -> bool:
        if self.flops == 0 and self.bytes:
            return True
        intensity, ridge = self.intensity, self.ridge
        return intensity is not None and ridge is not None and intensity < ridge

    def rate(self, median_s: float) -> str:
        """The rate at this latency and its share of the target's peak, e.g. "3.1 GFLOP/s, 18.2
        GB/s = 94% of memory bandwidth" (memory-bound) or "63.0 GFLOP/s = 40% of peak"; "" if
        the op's size is unknown."""
        compute = ""
        if self.flops:
            gflops = self.flops / median_s / 1e9
            compute = f"{_figure(gflops)} GFLOP/s"
        if self.memory_bound:
            gbps = (self.bytes or 0) / median_s / 1e9
            memory = f"{_figure(gbps)} GB/s" + _share(gbps, self.memory_gbps, "memory bandwidth")
            return f"{compute}, {memory}" if compute else memory
        if not compute:
            return ""
        return compute + _share(gflops, self.peak_gflops, "peak")

    def describe(self) -> str:
        """One line on what bounds the op and what the rates below mean."""
        if self.flops is None:
            return "The op's flops are unknown: only latencies are shown."
        size = f"The op does {format_flops(self.flops)}"
        size += f" on {_bytes(self.bytes)} of arguments" if self.bytes else ""
        size += f" ({_figure(self.intensity)} FLOP/byte)" if self.intensity is not None else ""
        if self.ridge is not None:
            size += f"; the target's ridge point is {_figure(self.ridge)} FLOP/byte"
        if self.memory_bound:
            return f"{size}: it is memory-bound, so shares are of the memory bandwidth."
        if self.ridge is not None:
            return f"{size}: it is compute-bound, so rates are GFLOP/s."
        return f"{size}."


def roofline(op: Op, target: Target) -> Roofline:
    try:
        flops: int | None = flop_count(op.func)
    except SchedlangError:  # symbolic extents
        flops = None
    return Roofline(flops, op_bytes(op), target.peak_gflops, target.memory_gbps)


def op_bytes(op: Op) -> int | None:
    """Bytes of the op's input and output buffers, from their shapes and dtypes; None when a shape
    is symbolic."""
    import tvm

    total = 0
    for buffer in (*op.inputs, *op.outputs):
        if not all(isinstance(extent, int) for extent in buffer.shape):
            return None
        dtype = tvm.DataType(buffer.dtype)
        total += math.prod(buffer.shape) * dtype.bits * dtype.lanes // 8
    return total


# --- the history ----------------------------------------------------------------------------------


def render_history(
    records: Sequence[Record],
    *,
    op: Op,
    target: Target,
    baseline: Record | None = None,
    best_n: int = 3,
    latest_n: int = 3,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> str:
    """The tally, what bounds the op, the unscheduled build, the `best_n` fastest candidates and
    the `latest_n` latest others (newest first), within `max_chars`; "" when there is nothing.

    `records` come oldest first (`Database.records`). The baseline is `baseline`, else the record
    whose extra says "baseline"; it is shown once, on its own line, and is not a candidate."""
    baseline = baseline or next((r for r in records if is_baseline(r)), None)
    candidates = [r for r in records if not is_baseline(r) and not _same(r, baseline)]
    if not candidates and baseline is None:
        return ""
    line = roofline(op, target)
    ok = sorted((r for r in candidates if r.is_ok and r.median_s), key=_speed_key)
    fastest = min([*ok[:1], *_ok([baseline])], key=_speed_key, default=None)
    best = ok[:best_n]
    latest = [r for r in reversed(candidates) if not any(r is b for b in best)][:latest_n]
    head = [tally(candidates), line.describe()]
    if baseline is not None:
        head.append(_baseline_line(baseline, line, fastest))

    def compose(best: list[Record], latest: list[Record], diagnostics: bool) -> str:
        parts = list(head)
        if best:
            parts.append("The fastest so far:")
            parts += [_entry(r, line, baseline, fastest, diagnostics) for r in best]
        if latest:
            parts.append("The latest others, newest first:")
            parts += [_entry(r, line, baseline, fastest, diagnostics) for r in latest]
        return "\n".join(parts)

    diagnostics = True
    while len(text := compose(best, latest, diagnostics)) > max_chars:
        if len(latest) > 1:
            latest = latest[:-1]
        elif diagnostics and any(_diagnostics(r) for r in latest):
            diagnostics = False
        elif len(best) > 1:
            best = best[:-1]
        elif latest:
            latest = []
        else:
            return _cut(text, max_chars)
    return text


def tally(records: Sequence[Record]) -> str:
    """How many candidates ended how, e.g. "So far 14 candidates were measured (built and run):
    9 ok, 3 wrong, 2 timed out; 1 failed to build; 5 rejected by the checker." A candidate the
    checker rejected was never measured."""
    counts = {status: sum(r.status is status for r in records) for status in Status}
    ran = sum(counts[status] for status in _RAN)
    measured = f"So far {ran} candidate{'s' * (ran != 1)} {'were' if ran != 1 else 'was'} measured"
    figures = [f"{counts[s]} {word}" for s, word in _RAN.items() if counts[s] or s is Status.OK]
    parts = [f"{measured} (built and run): " + ", ".join(figures) if ran else measured]
    parts += [f"{counts[s]} {word}" for s, word in _NOT_RUN.items() if counts[s]]
    return "; ".join(parts) + "."


def entry(
    record: Record,
    *,
    op: Op,
    target: Target,
    baseline: Record | None = None,
    best: Record | None = None,
    diagnostics: bool = True,
) -> str:
    """One record as the history shows it (its id, figures, knobs, schedule, and, for a failure,
    the checker's diagnostics): for a prompt asking a model to edit this schedule."""
    return _entry(record, roofline(op, target), baseline, best, diagnostics)


def _entry(
    record: Record,
    line: Roofline,
    baseline: Record | None,
    best: Record | None,
    diagnostics: bool,
) -> str:
    name = f"#{record.id} " if record.id is not None else ""
    if record.is_ok and record.median_s:
        figures = [_ms(record.median_s), line.rate(record.median_s)]
        if (
            _ok([baseline])
            and baseline is not None
            and baseline.median_s is not None
            and not _same(record, baseline)
        ):
            figures.append(f"{_times(baseline.median_s / record.median_s)} the unscheduled build")
        if best is not None and best.median_s and not _same(record, best):
            best_name = f" (#{best.id})" if best.id is not None else ""
            figures.append(f"{_times(best.median_s / record.median_s)} the best{best_name}")
        elif best is not None:
            figures.append("the best so far")
        head = f"{name}ok: " + ", ".join(f for f in figures if f)
    else:
        head = f"{name}{record.status}: {record.reason}".rstrip(": ")
    lines = [head]
    if record.knobs:
        label = "knobs (a point of a template)" if record.template else "knobs"
        lines.append(f"{label}: " + ", ".join(f"{k}={v}" for k, v in record.knobs.items()))
    schedule = without_comments(record.schedule)
    lines.append("```schedlang\n" + (schedule + "\n" if schedule else "") + "```")
    if diagnostics and (shown := _diagnostics(record)):
        lines.append(shown)
    return "\n".join(lines)


def without_comments(text: str) -> str:
    """The schedule without its `#` comments (whole lines and trailing ones) or blank lines."""
    lines = (line.split("#", 1)[0].rstrip() for line in text.splitlines())
    return "\n".join(line for line in lines if line.strip())


def _diagnostics(record: Record) -> str:
    """The checker's first diagnostics of a record, cut short, without schedule comments: its
    errors if it failed, its warnings if it ran."""
    text = record.extra.get("diagnostics" if not record.is_ok else "warnings")
    if not text:
        return ""
    blocks = [b.strip("\n") for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]
    blocks = [b for b in blocks if not re.fullmatch(r"\d+ (errors?|warnings?) generated\.", b)]
    lines = "\n\n".join(blocks[:DIAGNOSTICS_SHOWN]).splitlines()
    lines = [line.split("#", 1)[0].rstrip() if _SOURCE_LINE.match(line) else line for line in lines]
    more = len(lines) > DIAGNOSTIC_LINES or len(blocks) > DIAGNOSTICS_SHOWN
    return "\n".join(lines[:DIAGNOSTIC_LINES]) + ("\n…" if more else "")


def _baseline_line(baseline: Record, line: Roofline, best: Record | None) -> str:
    name = f" #{baseline.id}" if baseline.id is not None else ""
    head = f"The unscheduled build (the empty schedule{name})"
    if not baseline.is_ok or not baseline.median_s:
        return f"{head} did not run: {baseline.status}: {baseline.reason}".rstrip(": ")
    figures = [_ms(baseline.median_s), line.rate(baseline.median_s)]
    if best is not None and best.median_s and not _same(baseline, best):
        figures.append(f"{_times(best.median_s / baseline.median_s)} the best")
    return f"{head}: " + ", ".join(f for f in figures if f) + "."


def _cut(text: str, max_chars: int) -> str:
    """Whole lines of `text` within max_chars, an open fence closed, and "…"."""
    kept: list[str] = []
    size = len("\n```\n…")
    for line in text.splitlines():
        if size + len(line) + 1 > max_chars:
            break
        kept.append(line)
        size += len(line) + 1
    if sum(line.startswith("```") for line in kept) % 2:
        kept.append("```")
    return ("\n".join(kept) + "\n…")[:max_chars]


def is_baseline(record: Record) -> bool:
    """A record of the op's unscheduled build (tune's `Settings.baseline`), not a candidate."""
    return bool(record.extra.get("baseline"))


def _same(record: Record, other: Record | None) -> bool:
    if other is None:
        return False
    if record.id is not None and other.id is not None:
        return record.id == other.id
    return record is other or (record.schedule == other.schedule and record.op_key == other.op_key)


def _ok(records: Sequence[Record | None]) -> list[Record]:
    return [r for r in records if r is not None and r.is_ok and r.median_s]


def _speed_key(record: Record) -> tuple[float, int]:
    return record.median_s or math.inf, record.id or 0


def _ms(seconds: float) -> str:
    return f"{_figure(seconds * 1e3)} ms"


def _figure(value: float | None) -> str:
    """Three significant digits, without an exponent: 1450, 63.0, 3.41, 0.0123."""
    if value is None:
        return "?"
    for least, digits in ((100, 0), (10, 1), (1, 2)):
        if value >= least:
            return f"{value:.{digits}f}"
    return f"{value:.3g}"


def _times(ratio: float) -> str:
    return f"{_figure(ratio)}x"


def _share(value: float, peak: float | None, of: str) -> str:
    if not peak:
        return ""
    percent = 100 * value / peak
    return f" = {percent:.0f}% of {of}" if percent >= 10 else f" = {percent:.2g}% of {of}"


def _bytes(count: int) -> str:
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if count >= scale:
            return f"{_figure(count / scale)} {unit}"
    return f"{count} bytes"
