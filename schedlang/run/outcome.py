"""What measuring a candidate came to, and the one comparison of computed outputs with expected.

`Outcome` is the one result type of a measurement, whoever ran the kernel: the local runner (a
sandbox worker's `measure` job), the RPC runner (schedlang.run.remote, on a leased device) or the
tuner itself (a candidate that did not check or build). The tuner turns it into a database Record.

`compare_outputs` is the one output comparison, for a kernel against its reference and for a whole
model against its default build; its tolerance is documented there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schedlang.store.records import Status


@dataclass(frozen=True)
class Outcome:
    """One candidate's measurement: its status, why (one line), and its timed runs."""

    status: Status
    reason: str = ""  # one line: only the first line of what is given is kept
    latencies_s: tuple[float, ...] = ()  # one per timed repeat; empty unless timed
    diagnostics: str | None = None  # a candidate that does not check: its rendered diagnostics
    extra: dict[str, Any] = field(default_factory=dict)  # kept in the record's `extra`

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "reason", self.reason.splitlines()[0] if self.reason else "")
        object.__setattr__(self, "latencies_s", tuple(float(t) for t in self.latencies_s))

    @property
    def is_ok(self) -> bool:
        return self.status is Status.OK


def compare_outputs(
    got: Sequence[np.ndarray], expected: Sequence[np.ndarray], names: Sequence[str] | None = None
) -> tuple[bool, str]:
    """(ok, one-line reason): shapes, then NaN or infinities, then values.

    The tolerance, per output: integers and booleans must match exactly; floats within
    `ops.default_tolerance(dtype)`, an (rtol, atol) pair (fp32: 1e-3, 1e-4), with the atol scaled
    by the largest expected magnitude when that is over 1. A reordered float sum (a tiled
    reduction, a model's fused layers) differs from another in the last bits of its largest
    terms, not of each result: near-zero results of large sums need that slack, and results of
    [-1, 1)-sized kernels keep the dtype's own atol.
    """
    names = list(names) if names is not None else [f"output {n}" for n in range(len(got))]
    if len(got) != len(expected):
        return False, f"{len(got)} outputs, expected {len(expected)}"
    for name, value, want in zip(names, got, expected, strict=True):
        value, want = np.asarray(value), np.asarray(want)
        if value.shape != want.shape:
            return False, f"{name} has shape {value.shape}, expected {want.shape}"
        floating = np.issubdtype(value.dtype, np.floating)
        if floating and not np.all(np.isfinite(value)) and np.all(np.isfinite(want)):
            return False, f"{name} has NaN or infinite values"
        # Imported here: this module is loaded by every worker at start, before it blocks the
        # torch import that TVM would otherwise pull in (ops imports TVM): 2.5x a worker's start.
        from schedlang.core.ops import default_tolerance

        rtol, atol = default_tolerance(str(value.dtype))
        if np.issubdtype(want.dtype, np.floating) and want.size:
            atol *= max(1.0, float(np.max(np.abs(want), initial=0.0, where=np.isfinite(want))))
        if not np.allclose(value, want, rtol=rtol, atol=atol, equal_nan=True):
            error = np.abs(value.astype(np.float64) - want.astype(np.float64))
            error = np.nan_to_num(error, nan=np.inf)
            worst = np.unravel_index(int(np.argmax(error)), error.shape)
            return False, (
                f"{name} differs from the reference: max error {error.max():.3g} at "
                f"{tuple(int(i) for i in worst)} (got {value[worst]!r}, want {want[worst]!r})"
            )
    return True, "matches the reference"
