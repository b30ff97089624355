"""Planted faults for the measurement tests (test_tune, test_rpc, test_faults): a 64-element
doubling op, kernels that crash, hang, compute wrong values or NaN or take long for it, and a
Measurer that builds and runs such a kernel in place of a candidate's schedule.

Also the knob template and the quick settings the tuning tests share.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import tvm
from tvm import te
from tvm.script import tirx as T

from schedlang.core.ops import Op, from_primfunc
from schedlang.core.target import Target
from schedlang.lang.syntax import parse
from schedlang.run.outcome import Outcome
from schedlang.tuning.measurer import Lowered, Measurer
from schedlang.tuning.search import Candidate
from schedlang.tuning.settings import Settings

TEMPLATE = """\
param TI in [2, 4, 8]
param TJ in [4, 8, 16]
param KU in [1, 2]

block C:
  tile i, j by TI x TJ
  split k by KU
  reorder i.o, j.o, k.o, k.i, i.i, j.i
  vectorize j.i
"""


def fast_settings(**changes) -> Settings:
    """Few, small batches, one builder, one quick timing run: `changes` override any of them."""
    values = dict(trials=6, batch=3, builders=1, repeat=1, min_repeat_ms=1)
    return Settings(**{**values, **changes})


# --- the op and the kernels planted in its place -------------------------------------------------


def doubling_op() -> Op:
    """C = A * 2 over 64 floats: what every planted kernel below pretends to compute."""
    a = te.placeholder((64,), name="A")
    c = te.compute((64,), lambda i: a[i] * 2.0, name="C")
    return from_primfunc(te.create_prim_func([a, c]), name="double")


@T.prim_func
def segfaults(A: T.Buffer((64,), "float32"), C: T.Buffer((64,), "float32")):
    for i in range(64):
        C[i * 20000000] = A[i]  # gigabytes past the buffer


@T.prim_func
def hangs(A: T.Buffer((64,), "float32"), C: T.Buffer((64,), "float32")):
    for _i, _j, k in T.grid(2147483647, 2147483647, 64):
        C[k] = C[k] + A[k]


@T.prim_func
def wrong(A: T.Buffer((64,), "float32"), C: T.Buffer((64,), "float32")):
    for i in range(64):
        C[i] = A[i] * T.float32(3)


@T.prim_func
def nan(A: T.Buffer((64,), "float32"), C: T.Buffer((64,), "float32")):
    for i in range(64):
        C[i] = T.float32("nan")


@T.prim_func
def slow(A: T.Buffer((64,), "float32"), C: T.Buffer((64,), "float32")):
    for i in range(64):  # right, after a tenth of a second or more of max(x, x)
        C[i] = A[i]
        for _k in range(1 << 22):
            C[i] = T.max(C[i], A[i])
        C[i] = C[i] * T.float32(2)


class PlantedMeasurer(Measurer):
    """Fault injection: a candidate whose schedule text is a key of `planted` lowers to that
    kernel instead of its schedule; the others are checked and lowered as usual.

    `planted` may be replaced between measurements."""

    def __init__(
        self,
        op: Op,
        target: Target,
        settings: Settings,
        work_dir: Path,
        planted: Mapping[str, tvm.tirx.PrimFunc] | None = None,
        *,
        workers=None,
    ):
        super().__init__(op, target, settings, work_dir, workers=workers)
        self.planted = dict(planted or {})

    def _lower(self, candidate: Candidate) -> Outcome | Lowered:
        kernel = self.planted.get(candidate.text.strip())
        if kernel is None:
            return super()._lower(candidate)
        return Lowered(tvm.ir.save_json(kernel))


def candidates(*schedules: str) -> list[Candidate]:
    """Concrete schedules as candidates, in order."""
    return [Candidate(parse(s), {}, None, "test") for s in schedules]


def measure_each(measurer: Measurer, *schedules: str) -> dict[str, Outcome]:
    """Each schedule's outcome, by its text."""
    return {c.text.strip(): outcome for c, outcome in measurer.measure(candidates(*schedules))}
