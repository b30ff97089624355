"""A proof that spares the read-after-write rule (schedlang.checker.dataflow) listing points: that
one block writing a buffer writes, in every iteration of the loops it shares with a reader, every
point the reader may read there.

Listing the points of each read and write of a cache over every iteration was most of the
checker's time (the packed GEMM's caches: 65,536 points a side). Most caches are copies whose
write is a box, and whose reader reads inside it: TVM's interval analysis bounds what the reader
reads, with the shared loops' variables left as symbols, and proves it inside the box. A box
counts only where it is whole: the write reaches each of its points once (TVM's iterator-map
analysis) and as many points as the box holds, with no `if` around it. Where any of it fails,
the rule lists the points as before: the proof only ever skips a listing that would find nothing.
"""

from __future__ import annotations

import math
from typing import Any

import tvm
from tvm import tirx

from schedlang.lang.tir_values import Expr, Var, free_vars

__all__ = ["covers", "once_per_point", "provably_inside"]

Box = list[tuple[Any, Any]]  # (lowest, highest) of each index


def covers(read: Any, writes: list[Any], shared: list[Any]) -> bool:
    """Whether one of `writes` provably writes every point `read` can read, in each iteration of
    the `shared` loops (dataflow's _Access and _Loop)."""
    if not all(_constant(loop) for access in (read, *writes) for loop in access.loops):
        return False
    try:
        return _covered(read, writes, shared)
    except Exception:  # noqa: BLE001 - what TVM cannot reason about (mixed types): list it
        return False


def _covered(read: Any, writes: list[Any], shared: list[Any]) -> bool:
    symbols = {loop.var for loop in shared}
    analyzer = tvm.sym.Analyzer()
    for loop in shared:
        analyzer.bind(loop.var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))
    wanted = _box(read, symbols, analyzer)
    if wanted is None:
        return False
    for write in writes:
        if write.conditions or len(write.indices) != len(read.indices):
            continue
        written = _whole_box(write, symbols, analyzer)
        if written is not None and all(
            analyzer.can_prove(low <= want_low) and analyzer.can_prove(want_high <= high)
            for (low, high), (want_low, want_high) in zip(written, wanted, strict=True)
        ):
            return True
    return False


def _constant(loop: Any) -> bool:
    return isinstance(loop.min, tirx.IntImm) and isinstance(loop.extent, tirx.IntImm)


def _resolved(access: Any) -> list[Expr]:
    """The access's indices in its loops' variables: its block's iterators and lets replaced by
    what they are bound to."""
    analyzer = tvm.sym.Analyzer()
    for binder in access.scope:
        if isinstance(binder, tuple):
            analyzer.bind(binder[0], binder[1])
    return [analyzer.simplify(index) for index in access.indices]


def _box(
    access: Any, symbols: set[Var], analyzer: Any, indices: list[Expr] | None = None
) -> Box | None:
    """Bounds of each index over the access's loops other than the shared ones (`symbols`), in
    the shared loops' variables; None where a bound is not such an expression."""
    ranges = {
        loop.var: tvm.sym.IntervalSet(loop.min, loop.min + loop.extent - 1)
        for loop in access.loops
        if loop.var not in symbols
    }
    box: Box = []
    for index in _resolved(access) if indices is None else indices:
        bounds = analyzer.int_set(index, ranges)
        low, high = bounds.min_value, bounds.max_value
        if not (free_vars(low) | free_vars(high)) <= symbols:  # unbounded, or a block variable
            return None
        box.append((low, high))
    return box


def _whole_box(write: Any, symbols: set[Var], analyzer: Any) -> Box | None:
    """The box `write` writes whole in each iteration of the shared loops, or None: each point
    once (a bijection of the loops its indices use) and as many points as the box holds."""
    indices = _resolved(write)
    box = _box(write, symbols, analyzer, indices)
    if box is None:
        return None
    used = set[Var]().union(*(free_vars(index) for index in indices)) - symbols
    loops = {
        loop.var: tvm.ir.Range.from_min_extent(loop.min, loop.extent)
        for loop in write.loops
        if loop.var in used
    }
    if used - loops.keys():
        return None
    sizes = [analyzer.simplify(high - low + 1) for low, high in box]
    if not all(isinstance(size, tirx.IntImm) for size in sizes):
        return None
    count = math.prod(int(r.extent) for r in loops.values())
    if count != math.prod(int(size) for size in sizes):
        return None
    return box if _one_to_one(indices, loops) else None


def _one_to_one(indices: list[Expr], loops: dict[Var, Any]) -> bool:
    from tvm.sym.iter_affine_map import IterMapLevel, detect_iter_map

    try:
        found = detect_iter_map(
            indices, loops, tirx.const(True, "bool"), check_level=IterMapLevel.Bijective
        )
    except Exception:  # noqa: BLE001 - not provable: the points are listed
        return False
    return len(found.indices) == len(indices)


# --- the proofs of the other rules --------------------------------------------------------------


def once_per_point(access: Any, lifetime: tuple[Expr, ...] = ()) -> bool:
    """Whether TVM's iterator-map analysis proves that `access` reaches each of its points once
    (in each iteration of the `lifetime` loops): its indices (after those loops' variables) a
    bijection of the loops they depend on, under its conditions."""
    loops: dict[Var, Any] = {}
    for binder in access.scope:
        if not isinstance(binder, tuple):
            if isinstance(binder.min, tirx.IntImm) and isinstance(binder.extent, tirx.IntImm):
                loops[binder.var] = tvm.ir.Range.from_min_extent(binder.min, binder.extent)
        elif any(binder[0] in free_vars(e) for e in (*access.indices, *access.conditions)):
            return False  # a let or a block iterator left in an index: not worth resolving
    candidates = [list(access.indices)] + ([[*lifetime, *access.indices]] if lifetime else [])
    return any(_bijective(indices, access.conditions, loops) for indices in candidates)


def _bijective(indices: list[Expr], conditions: tuple[Expr, ...], loops: dict[Var, Any]) -> bool:
    from tvm.sym.iter_affine_map import IterMapLevel, detect_iter_map

    needed: set[Var] = set()
    for e in (*indices, *conditions):
        needed |= free_vars(e)
    if any(v not in loops for v in needed):
        return False
    used = {var: extent for var, extent in loops.items() if var in needed}
    predicate = tirx.const(True, "bool")
    for condition in conditions:
        predicate = tirx.And(predicate, condition)
    try:
        analyzer = tvm.sym.Analyzer()
        for var, extent in used.items():
            analyzer.bind(var, extent)
        simple = [analyzer.simplify(i) for i in indices]
        found = detect_iter_map(simple, used, predicate, check_level=IterMapLevel.Bijective)
    except Exception:  # noqa: BLE001 - not provable: list the points
        return False
    return len(found.indices) == len(simple)


def provably_inside(access: Any, shape: list[int]) -> bool:
    """Whether interval bounds over the loops' ranges alone (no `if`) keep every index inside
    `shape`: most accesses, which then need no listing."""
    analyzer = tvm.sym.Analyzer()
    try:
        for binder in access.scope:
            if not isinstance(binder, tuple):
                analyzer.bind(binder.var, tvm.ir.Range.from_min_extent(binder.min, binder.extent))
            else:
                analyzer.bind(binder[0], binder[1])
        for index, extent in zip(access.indices, shape, strict=True):
            bound = analyzer.const_int_bound(analyzer.simplify(index))
            if bound.min_value < 0 or bound.max_value >= extent:
                return False
    except Exception:  # noqa: BLE001 - an expression TVM cannot bound: list its points
        return False
    return True
