"""Quantities as a person reads them: seconds in s, ms, us or ns, three significant digits."""

from __future__ import annotations


def format_seconds(seconds: float | None, missing: str = "-") -> str:
    """`1.23 ms`, `456 ns`; `missing` (a dash) when nothing was measured."""
    if seconds is None:
        return missing
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"
