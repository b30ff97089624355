"""The cache model the templates size their tiles by: what a tile's inner loops keep re-reading
(its working set) should stay in a cache level, here L1, while they run.

Half of a level is the budget: the other half holds what streams through (the outputs written
back, the next panel on its way in, the stack), and an L1 is at most 4- to 16-way associative, so
a working set of the whole size would evict itself. A target that does not say its cache sizes
(a TVM target for another machine without a preset) gets the sizes every Arm and x86 core of the
last decade has at least: 32 KiB of L1 data cache, 256 KiB of L2.
"""

from __future__ import annotations

import tvm

from schedlang.core.target import Target

DEFAULT_L1_BYTES = 32 << 10
DEFAULT_L2_BYTES = 256 << 10


def l1_budget(target: Target) -> int:
    """Bytes a tile's working set may take of the target's L1 data cache."""
    return (target.l1_bytes or DEFAULT_L1_BYTES) // 2


def l2_budget(target: Target) -> int:
    """Bytes a cache tile's working set may take of the target's L2 (per core, or the cluster's
    where the preset says it is shared)."""
    return (target.l2_bytes or DEFAULT_L2_BYTES) // 2


def fitting(values: list[int], working_set, budget: int) -> list[int]:
    """The values whose `working_set(value)` (bytes) is within `budget`, in their order; when
    none is, the one of the smallest working set (a template always has a point)."""
    fit = [v for v in values if working_set(v) <= budget]
    return fit or [min(values, key=working_set)]


def fitting_first(values: list[int], working_set, budget: int) -> list[int]:
    """All of `values`, those whose `working_set(value)` is within `budget` first (in their
    order), then the rest (in theirs); when none is, by working set, smallest first. For a knob
    that is also a register tile: the cache says where to start, and the tuner may still try
    the rest."""
    fit = [v for v in values if working_set(v) <= budget]
    if not fit:
        return sorted(values, key=working_set)
    return [*fit, *(v for v in values if v not in fit)]


def most_within(unit_bytes: int, budget: int) -> int:
    """How many units of `unit_bytes` fit in `budget` (at least one)."""
    return max(1, budget // max(1, unit_bytes))


def element_bytes(dtype: str) -> int:
    return max(1, tvm.DataType(dtype).bits // 8)
