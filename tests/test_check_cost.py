"""The check's shortcuts find what the long way finds (issue 32: the check's cost).

- The read-after-write rule's proof (schedlang.checker.coverage) skips only listings that would
  find nothing: for every read of a buffer other blocks wrote, in kernels the checker never saw
  (live fuzz schedules applied without its guards, so many are unsound), where the proof says the
  writes cover the read, listing the points finds no point unwritten.
- A loop's steps in a block's bindings (Nest._strides), folded in Python, are the ones TVM's
  analyzer gives.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tvm import s_tir

from fuzz.cases import case_op, live_case
from fuzz.live import apply_unchecked
from fuzz.nests import ByteChooser
from schedlang.checker import dataflow
from schedlang.checker.check import check
from schedlang.checker.coverage import covers
from schedlang.core.ops import load_op
from schedlang.core.target import resolve_target
from schedlang.lang import nest as nest_module
from schedlang.lang.nest import Nest
from schedlang.lang.syntax import parse

CPU = resolve_target("llvm")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SEEDS = 400  # live cases: about 10 s here


def _compared(func) -> list[tuple[bool, bool | None]]:
    """(proved, listed clean) for each read the rule compares in `func`'s kernel; listed clean is
    None where there are too many points to list at once."""
    lowered = dataflow.lower_kernel(func, CPU.to_tvm())
    if lowered is None:
        return []
    accesses, opaque, _ = dataflow._collect(lowered[0])
    accesses = [a for a in accesses if a.buffer not in opaque]
    found = []
    for read, writes, loops in dataflow._read_after_writes(accesses):
        listed = dataflow._unwritten_at(read, writes, {}, tuple(x.var for x in loops))
        clean = None if listed is dataflow._TOO_MANY else listed is None
        found.append((covers(read, writes, loops), clean))
    return found


def _live_funcs(seeds: int = SEEDS):
    for seed in range(seeds):
        case = live_case(ByteChooser(random.Random(seed).randbytes(4096)))
        try:
            yield apply_unchecked(case.text, case_op(case).func)
        except Exception:  # noqa: BLE001 - TVM (or a guard the lowering keeps) refuses it
            continue


def test_a_proved_read_lists_no_unwritten_point() -> None:
    compared = [pair for func in _live_funcs() for pair in _compared(func)]
    assert [pair for pair in compared if pair == (True, False)] == []
    # Neither side is empty: the proof skips listings, and the kernels hold unwritten reads.
    assert sum(proved for proved, _ in compared) >= 100
    assert sum(clean is False for _, clean in compared) >= 5


@pytest.mark.parametrize("name", ["matmul.sched", "matmul_packed.sched"])
def test_the_gemm_caches_are_proved_not_listed(name: str, monkeypatch) -> None:
    """The packed GEMM's caches (65,536 points a side): no listing, and still a clean check."""
    listed = []
    unwritten_at = dataflow._unwritten_at
    monkeypatch.setattr(
        dataflow, "_unwritten_at", lambda *args: listed.append(args) or unwritten_at(*args)
    )
    op = load_op(str(EXAMPLES / "matmul.py"))
    result = check(parse((EXAMPLES / name).read_text(encoding="utf-8"), name), op.func, CPU)
    assert result.ok and listed == []


def test_strides_folded_in_python_are_the_analyzers(monkeypatch) -> None:
    def not_plain(*_):
        raise nest_module._NotPlain

    funcs = list(_live_funcs(120))
    folded = [_all_strides(func) for func in funcs]
    monkeypatch.setattr(nest_module, "_folded", not_plain)
    assert folded == [_all_strides(func) for func in funcs]
    assert sum(len(strides) for strides in folded) >= 100


def _all_strides(func) -> dict:
    nest = Nest(s_tir.Schedule(func))
    return {block: nest._read_strides(block) for block in nest.block_names()}
