"""Which points each block of a scheduled kernel reads and writes, iteration by iteration.

The checker's rules look at one statement at a time. This is its last look at the whole kernel, the
way TVM will build it: the scheduled function goes through TVM's lowering up to buffer compaction
(so a cache is as small as the kernel will allocate it), and the index expressions of every load and
store are evaluated with numpy over the loops. What must hold:

- every index lies inside its buffer's shape;
- a block reads only points that the blocks writing that buffer wrote earlier in the same iteration
  of the loops they share. TVM sizes what `compute_at`, `reverse_compute_at` and the `at` forms of
  the caches compute from the loops alone: without the `if` of a split that does not divide, and as
  the box around what a fused or strided loop covers (TVM 0.27). The block then reads points that
  another iteration computes, or that nothing computes in this one (a compacted cache is allocated
  anew in each iteration). Compared over every iteration at once where that is at most
  `EXACT_POINTS` points, else at a sample of iterations; not listed at all where TVM's analyses
  prove that one write covers what the block reads (schedlang.checker.coverage);
- a reduction (read before compaction, where a term is told by the points it reads of its inputs):
  its init runs at each point's first update and never after an update of it, and no update adds
  the same term to a point twice with no init between.

Only loads and stores whose indices are integer arithmetic of loop variables are evaluated; a
buffer an intrinsic touches through a pointer (tensorize) is left out, as is an iteration whose
points would take more than `MAX_POINTS` to list, and a reduction under thread loops.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import Call, TensorLoad

from schedlang.checker.coverage import covers, once_per_point, provably_inside
from schedlang.checker.events import (
    in_sample,
    init_after_update,
    late_point,
    numbered,
    step_again,
)
from schedlang.lang.tir_values import Env, Expr, Value, Var
from schedlang.lang.tir_values import Unsupported as _Unsupported
from schedlang.lang.tir_values import free_vars as _free_vars
from schedlang.lang.tir_values import op_name as _op_name
from schedlang.lang.tir_values import value as _value

__all__ = ["Finding", "find_unsound", "lower_kernel"]

MAX_POINTS = 1 << 20  # points listed per access and iteration
EXACT_POINTS = 1 << 16  # points listed per access over every iteration at once
REPLAY_POINTS = 1 << 18  # an update's steps listed at once to find one added twice
SAMPLED_POINTS = 64  # points whose every step is followed where they are more (_sampled_events)
SAMPLED_EVENTS = 1 << 24  # an update's steps walked through at most, a few at a time
SAMPLED_STEPS = 1024  # values of the outer loops walked one by one, at most
MAX_ACCESSES = 4096  # loads and stores looked at in one kernel

# Thread loops that run side by side inside one iteration (TVM synchronizes them): the points of
# all their iterations count together. blockIdx loops are iterations like any other loop.
_TOGETHER = ("threadIdx.", "vthread")


@dataclass(frozen=True)
class _Loop:
    var: tirx.Var
    min: tirx.PrimExpr
    extent: tirx.PrimExpr
    together: bool  # a threadIdx or vthread loop: enumerated inside the iteration


# Binders outer to inner: _Loop, or (var, value) for a block iterator or a let.
_Binder = _Loop | tuple[Var, Expr]
_Scope = tuple[_Binder, ...]
_Conditions = tuple[Expr, ...]  # what an access runs under
_Fixed = dict[Var, Value]  # loop variable → its value (a number, or an array of them)


@dataclass(frozen=True)
class _Access:
    block: str
    buffer: tirx.Buffer
    indices: tuple[Expr, ...]
    scope: _Scope
    conditions: _Conditions
    is_write: bool
    order: int  # program order

    @property
    def loops(self) -> list[_Loop]:
        return [b for b in self.scope if isinstance(b, _Loop)]


@dataclass(frozen=True)
class Finding:
    """An index past its buffer, a read of a point not written in the same iteration, or a
    reduction run wrong."""

    kind: str  # "out of bounds", "unwritten", "late init", "wiped" or "replayed"
    block: str  # the block that reads (or accesses out of bounds)
    buffer: str
    point: tuple[int, ...]
    where: tuple[tuple[str, int], ...]  # the shared loops' variable names and values
    writers: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()


def find_unsound(func: tirx.PrimFunc, target: tvm.target.Target) -> Finding | None:
    """The first unsound access of the scheduled `func`, or None."""
    lowered = lower_kernel(func, target)
    if lowered is None:
        return None
    compacted, whole = lowered
    accesses, opaque, lifetimes = _collect(compacted)
    if len(accesses) > MAX_ACCESSES:
        return None
    accesses = [a for a in accesses if a.buffer not in opaque]
    finding = _first_out_of_bounds(accesses) or _first_unwritten(accesses)
    if finding is not None:
        return finding
    # A reduction's terms are told apart by the points they read, which a compacted cache
    # renumbers in each iteration: these rules read the kernel before compaction.
    accesses, opaque, lifetimes = _collect(whole)
    accesses = [a for a in accesses if a.buffer not in opaque]
    return _first_late_init(accesses, lifetimes) or _first_wiped_reduction(accesses, lifetimes)


def lower_kernel(
    func: tirx.PrimFunc, target: tvm.target.Target
) -> tuple[tirx.PrimFunc, tirx.PrimFunc] | None:
    """`func` as TVM lowers it up to buffer compaction, blocks still named, and the same without
    the compaction; None if TVM cannot (the build reports that). The last one is kept: two
    kernel rules ask for the same function."""
    last, name = _last_lowered[0], str(target)
    if last is not None and last[0].same_as(func) and last[1] == name:
        kept: tuple[tirx.PrimFunc, tirx.PrimFunc] | None = last[2]
        return kept
    lowered = _lowered(func, target)
    _last_lowered[0] = (func, name, lowered)  # one assignment: safe across threads
    return lowered


_last_lowered: list[Any] = [None]  # (function, target, what lower_kernel gave)


def _lowered(
    func: tirx.PrimFunc, target: tvm.target.Target
) -> tuple[tirx.PrimFunc, tirx.PrimFunc] | None:
    opaque = tvm.transform.Sequential(
        [
            s_tir.transform.CanonicalizeLoop(),
            s_tir.transform.LowerCrossThreadReduction(),
            s_tir.transform.LowerInitBlock(),
            s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque(),
        ]
    )
    compact = tvm.transform.Sequential(
        [s_tir.transform.CompactBufferAllocation(), s_tir.transform.LowerMatchBuffer()]
    )
    try:
        with target:
            mod = opaque(tvm.IRModule({"main": func.with_attr("target", target)}))
            compacted, whole = compact(mod), s_tir.transform.LowerMatchBuffer()(mod)
    except Exception:  # noqa: BLE001 - whatever TVM raises, the build will say it better
        return None
    return compacted["main"], whole["main"]


# --- collecting accesses --- ----------------------------------------------------------------------


def _collect(
    func: tirx.PrimFunc,
) -> tuple[list[_Access], set[Var], dict[tirx.Buffer, tuple[Var, ...]]]:
    """The loads and stores in program order; the buffers an intrinsic reaches through a pointer;
    for each buffer allocated inside loops, those loops' variables (a compacted buffer is
    allocated anew in each of their iterations)."""
    walk = _Walk()
    walk.stmt(func.body, "root", (), ())
    return walk.accesses, walk.opaque, walk.lifetimes


class _Walk:
    """`_collect`'s walk over statements and expressions, each visited with its block's name, the
    binders around it (`_Access.scope`) and the conditions it runs under."""

    def __init__(self) -> None:
        self.accesses: list[_Access] = []
        self.opaque: set[Var] = set()
        self.lifetimes: dict[tirx.Buffer, tuple[Var, ...]] = {}

    def access(
        self,
        block: str,
        buffer: tirx.Buffer,
        indices: Sequence[Expr],
        scope: _Scope,
        conditions: _Conditions,
        write: bool,
    ) -> None:
        order = len(self.accesses)
        self.accesses.append(
            _Access(block, buffer, tuple(indices), scope, conditions, write, order)
        )

    def expr(self, e: Expr, block: str, scope: _Scope, conditions: _Conditions) -> None:
        if isinstance(e, TensorLoad):
            self.access(block, e.source, e.indices, scope, conditions, False)
            for index in e.indices:
                self.expr(index, block, scope, conditions)
        elif isinstance(e, Call):
            if _op_name(e) == "if_then_else":
                cond, then, other = e.args
                self.expr(cond, block, scope, conditions)
                self.expr(then, block, scope, (*conditions, cond))
                self.expr(other, block, scope, (*conditions, tirx.Not(cond)))
                return
            for arg in e.args:
                if isinstance(arg, tirx.Var):
                    self.opaque.add(arg)
                self.expr(arg, block, scope, conditions)
        elif isinstance(e, tirx.Select):
            self.expr(e.condition, block, scope, conditions)
            self.expr(e.true_value, block, scope, (*conditions, e.condition))
            self.expr(e.false_value, block, scope, (*conditions, tirx.Not(e.condition)))
        elif isinstance(e, tirx.Let):
            self.expr(e.value, block, scope, conditions)
            self.expr(e.body, block, (*scope, (e.var, e.value)), conditions)
        else:
            for field in ("a", "b", "value", "condition"):
                child = getattr(e, field, None)
                if isinstance(child, tvm.ir.Expr):
                    self.expr(child, block, scope, conditions)

    def stmt(self, s: Any, block: str, scope: _Scope, conditions: _Conditions) -> None:
        if isinstance(s, tirx.SeqStmt):
            for child in s.seq:
                self.stmt(child, block, scope, conditions)
                if isinstance(child, tirx.Bind):  # in scope for the statements after it
                    scope = (*scope, (child.var, child.value))
        elif isinstance(s, tirx.For):
            tag = s.thread_binding.thread_tag if s.thread_binding is not None else ""
            loop = _Loop(s.loop_var, s.min, s.extent, tag.startswith(_TOGETHER))
            self.stmt(s.body, block, (*scope, loop), conditions)
        elif isinstance(s, s_tir.SBlockRealize):
            self.realize(s, scope, conditions)
        elif isinstance(s, tirx.IfThenElse):
            self.expr(s.condition, block, scope, conditions)
            self.stmt(s.then_case, block, scope, (*conditions, s.condition))
            if s.else_case is not None:
                self.stmt(s.else_case, block, scope, (*conditions, tirx.Not(s.condition)))
        elif isinstance(s, tirx.BufferStore):
            self.expr(s.value, block, scope, conditions)
            for index in s.indices:
                self.expr(index, block, scope, conditions)
            self.access(block, s.buffer, s.indices, scope, conditions, True)
        elif isinstance(s, tirx.Evaluate | tirx.Bind):
            # TVM 0.27's Bind (LetStmt is its alias) has no body: the SeqStmt around it binds
            # its variable for what follows.
            self.expr(s.value, block, scope, conditions)
        elif isinstance(s, tirx.AssertStmt):
            self.expr(s.condition, block, scope, conditions)
        else:  # AttrStmt, DeclBuffer, AllocBuffer, …: what they hold
            body = getattr(s, "body", None)
            if isinstance(body, tirx.Stmt):
                self.stmt(body, block, scope, conditions)

    def realize(self, s: s_tir.SBlockRealize, scope: _Scope, conditions: _Conditions) -> None:
        inner = s.block
        bound = tuple(zip((iv.var for iv in inner.iter_vars), s.iter_values, strict=True))
        more = () if _is_one(s.predicate) else (s.predicate,)
        for buffer in inner.alloc_buffers:
            self.lifetimes[buffer] = tuple(b.var for b in scope if isinstance(b, _Loop))
        scope, conditions = (*scope, *bound), (*conditions, *more)
        if inner.init is not None:
            self.stmt(inner.init, inner.name_hint, scope, conditions)
        self.stmt(inner.body, inner.name_hint, scope, conditions)


def _points(
    access: _Access, fixed: _Fixed, also: tuple[Expr, ...] = (), limit: int = MAX_POINTS
) -> np.ndarray | None:
    """The indices `access` touches (one row per point, in the order the loops run them) with the
    loops in `fixed` at their values and every other loop it depends on over its range, then a
    column per expression in `also`; None if unsupported or too many."""
    needed = _needed(access, (*access.indices, *access.conditions, *also))
    env: Env = {}
    axes = [
        b for b in access.scope if isinstance(b, _Loop) and b.var in needed and b.var not in fixed
    ]
    size = 1
    try:
        for binder in access.scope:
            if isinstance(binder, _Loop):
                if binder.var in fixed:
                    env[binder.var] = fixed[binder.var]
                    continue
                start, extent = _value(binder.min, env), _value(binder.extent, env)
                if np.ndim(start) or np.ndim(extent):
                    raise _Unsupported("a loop range that depends on an inner loop")
                if extent <= 0:
                    return np.zeros((0, len(access.indices)), dtype=np.int64)
                if binder.var in needed:
                    size *= int(extent)
                    if size > limit:
                        return None
                    shape = [1] * len(axes)
                    shape[axes.index(binder)] = int(extent)
                    env[binder.var] = np.arange(start, start + extent, dtype=np.int64).reshape(
                        shape
                    )
            elif binder[0] in needed:
                env[binder[0]] = _value(binder[1], env)
        shape = [1] * len(axes)
        for loop in axes:
            shape[axes.index(loop)] = int(env[loop.var].size)
        mask = np.ones(shape, dtype=bool)
        for condition in access.conditions:
            mask = np.logical_and(mask, _value(condition, env))
        rows = [
            np.broadcast_to(np.asarray(_value(i, env), dtype=np.int64), shape)
            for i in (*access.indices, *also)
        ]
    except (_Unsupported, OverflowError, TypeError, ValueError):
        return None
    if not rows:
        return np.zeros((int(mask.any()), 0), dtype=np.int64)
    # (points, columns) as the transpose of a stack of columns: no copy here, and contiguous
    # columns for numbered.
    return np.stack([row[mask] for row in rows]).T


# --- the rules --- --------------------------------------------------------------------------------


def _shared(accesses: list[_Access]) -> list[_Loop]:
    """The loops that enclose every access, outermost first, without the thread loops whose
    iterations run together."""
    common = accesses[0].loops
    for access in accesses[1:]:
        loops = access.loops
        n = 0
        while n < min(len(common), len(loops)) and common[n].var.same_as(loops[n].var):
            n += 1
        common = common[:n]
    return [loop for loop in common if not loop.together]


def _iterations(loops: list[_Loop]) -> Iterator[_Fixed]:
    """A sample of the iterations of `loops`: all first, all last, each loop alone at its second,
    middle and last value, the outer ones at their last and the inner ones at their first (and the
    reverse), and a few drawn at random (the same ones on every run)."""
    count = len(loops)
    picks: list[tuple[str | float, ...]] = [("first",) * count, ("last",) * count, ("mid",) * count]
    for n in range(count):
        for position in ("second", "mid", "last"):
            picks.append(tuple(position if m == n else "first" for m in range(count)))
        # The outer loops at their last values, the inner ones at their first, and the reverse:
        # where a guard on the outer loops bites while the inner ones still reach points.
        picks.append(tuple("last" if m <= n else "first" for m in range(count)))
        picks.append(tuple("first" if m <= n else "last" for m in range(count)))
    draw = random.Random(0)
    picks += [tuple(draw.random() for _ in loops) for _ in range(4)]
    seen = set()
    for pick in picks:
        fixed: _Fixed = {}
        try:
            for loop, how in zip(loops, pick, strict=True):
                start, extent = _value(loop.min, fixed), _value(loop.extent, fixed)
                if np.ndim(start) or np.ndim(extent) or extent <= 0:
                    break
                offset = {"first": 0, "second": min(1, extent - 1), "mid": extent // 2}
                offset["last"] = extent - 1
                step = offset[how] if isinstance(how, str) else int(how * extent)
                fixed[loop.var] = int(start + step)
            else:
                key = tuple(fixed.values())
                if key not in seen:
                    seen.add(key)
                    yield fixed
        except _Unsupported:
            continue


def _read_after_writes(
    accesses: list[_Access],
) -> Iterator[tuple[_Access, list[_Access], list[_Loop]]]:
    """Each read of a buffer other blocks wrote before it, those writes, and the loops they all
    share: what the read-after-write rule compares."""
    by_buffer: dict[tirx.Buffer, list[_Access]] = {}
    for access in accesses:
        by_buffer.setdefault(access.buffer, []).append(access)
    for group in by_buffer.values():
        for read in (a for a in group if not a.is_write):
            if any(a.is_write and a.block == read.block for a in group):
                continue  # a block that updates what it reads (a reduction)
            writes = [a for a in group if a.is_write and a.order < read.order]
            if writes:  # else an input (or a buffer written later: a later rule's business)
                yield read, writes, _shared([read, *writes])


def _first_unwritten(accesses: list[_Access]) -> Finding | None:
    for read, writes, loops in _read_after_writes(accesses):
        if covers(read, writes, loops):
            continue  # proved: listing the points would find none unwritten
        # Every iteration at once, each point tagged with the shared loops' values; a sample
        # of iterations when that is too many points.
        finding = _unwritten_at(read, writes, {}, tuple(x.var for x in loops))
        if finding is _TOO_MANY:
            for fixed in _iterations(loops):
                finding = _unwritten_at(read, writes, fixed, ())
                if finding is not None and finding is not _TOO_MANY:
                    return finding
        elif finding is not None:
            return finding
    return None


_TOO_MANY = Finding("too many points", "", "", (), ())


def _unwritten_at(
    read: _Access, writes: list[_Access], fixed: _Fixed, columns: tuple[Expr, ...]
) -> Finding | None:
    """A point `read` reads and no earlier write wrote in the same iteration (the loops in
    `fixed` at their values, the loops in `columns` over their ranges, told apart), None, or
    _TOO_MANY."""
    limit = EXACT_POINTS if columns else MAX_POINTS
    wanted = _points(read, fixed, also=columns, limit=limit)
    if wanted is None:
        return _TOO_MANY
    if not len(wanted):
        return None
    listed = [_points(w, fixed, also=columns, limit=limit) for w in writes]
    written = [w for w in listed if w is not None]
    if len(written) < len(listed):
        return _TOO_MANY
    done = (
        np.concatenate([w.T for w in written], axis=1).T  # columns stay contiguous
        if written
        else np.zeros((0, wanted.shape[1]), dtype=np.int64)
    )
    numbers = numbered(wanted, done)
    missing: np.ndarray | list[int]
    if numbers is not None:
        wanted_numbers, done_numbers = numbers
        missing = np.flatnonzero(~np.isin(wanted_numbers, done_numbers))
    else:  # too wide a box to number its points: compare them as tuples
        written_points = {tuple(row) for row in done.tolist()}
        missing = [n for n, row in enumerate(wanted.tolist()) if tuple(row) not in written_points]
    if not len(missing):
        return None
    row = [int(v) for v in wanted[missing[0]]]
    rank = len(read.indices)
    where = _where(fixed.items()) + _where(zip(columns, row[rank:], strict=True))
    return _found("unwritten", read, row[:rank], where, tuple(sorted({w.block for w in writes})))


def _found(
    kind: str,
    access: _Access,
    point: Iterable[int],
    where: tuple[tuple[str, int], ...] = (),
    writers: tuple[str, ...] = (),
    shape: tuple[int, ...] = (),
) -> Finding:
    """A Finding of `kind` at `point` (integers, numpy's too) of `access`'s buffer in its block."""
    point = tuple(int(v) for v in point)
    return Finding(kind, access.block, access.buffer.name, point, where, writers, shape)


def _where(pairs: Iterable[tuple[Var, Value]]) -> tuple[tuple[str, int], ...]:
    """(name, value) for each (variable, value): where a finding's point is reached."""
    return tuple((var.name, value) for var, value in pairs)


def _first_late_init(
    accesses: list[_Access], lifetimes: dict[tirx.Buffer, tuple[Var, ...]]
) -> Finding | None:
    """A reduction whose init does not run at the first update of a point: loops fused from
    spatial and reduction loops, split and put in another order, visit a point's first reduction
    step after others, and the init then wipes what they added."""
    for init in accesses:
        if not init.is_write or not init.conditions:
            continue
        updates = [
            a
            for a in _later_writes(init, accesses)
            if a.block == init.block and len(a.conditions) + 1 == len(init.conditions)
        ]
        if not updates:
            continue
        update = updates[0]
        start = init.conditions[-1]
        # Every loop of the block is shared by its init and its update; the init runs first.
        loops = [x for x in update.loops if not x.together]
        again = _replayed(init, update, accesses, lifetimes.get(init.buffer, ()), loops)
        if again is not None:
            return again
        # Only a loop that feeds both the output point and the init's test (one fused from
        # spatial and reduction loops) can make a point's first update come before its init.
        if not _free_vars(start) & set().union(*(_free_vars(i) for i in update.indices)):
            continue
        start = tirx.Cast("int64", start)
        points = _points(update, {}, also=(start,))
        if points is None:  # too many: slices of the points, each whole (found by fuzzing)
            for fixed in _point_slices(update, start):
                points = _points(update, fixed, also=(start,))
                late = None if points is None else late_point(points)
                if late is not None:
                    return _found("late init", init, late, _where(fixed.items()))
            continue
        late = late_point(points)
        if late is not None:
            return _found("late init", init, late)
    return None


def _point_slices(update: _Access, start: Value) -> Iterator[_Fixed]:
    """A sample of the iterations of the loops that alone, and one to one, give a dimension of
    the update's point and feed neither the init's test nor another dimension: each one's
    iteration holds every update of its points, so a late init in it is one in the kernel."""
    start_loops = _loop_vars(update, (start,))
    dims = [_loop_vars(update, (index,)) for index in update.indices]
    separate: set[Var] = set()
    for d, loops in enumerate(dims):
        others = set().union(*dims[:d], *dims[d + 1 :])
        if loops and not loops & (start_loops | others) and _one_to_one(update, d):
            separate |= loops
    sliced = [x for x in update.loops if x.var in separate]
    return _iterations(sliced) if sliced else iter(())


def _loop_vars(access: _Access, exprs: Iterable[Expr]) -> set[Var]:
    """The loops whose variables `exprs` depend on, through the block iterators and lets."""
    needed = _needed(access, exprs)
    return {x.var for x in access.loops if x.var in needed}


def _needed(access: _Access, exprs: Iterable[Expr]) -> set[Var]:
    """The variables `exprs` depend on in the access's scope: their own, and those of the block
    iterators and lets they use (inner binders first)."""
    needed = set().union(*(_free_vars(e) for e in exprs))
    for binder in reversed(access.scope):
        if isinstance(binder, tuple) and binder[0] in needed:
            needed |= _free_vars(binder[1])
    return needed


def _one_to_one(access: _Access, dim: int) -> bool:
    """Whether dimension `dim` of the access's index takes a different value at every iteration
    of the loops it depends on (conditions aside)."""
    alone = _Access(access.block, access.buffer, (access.indices[dim],), access.scope, (), False, 0)
    values = _points(alone, {})
    return values is not None and len(np.unique(values[:, 0])) == len(values)


def _later_writes(init: _Access, accesses: list[_Access]) -> list[_Access]:
    """The writes of `init`'s buffer after it, in program order: a reduction's updates."""
    return [
        a for a in accesses if a.is_write and a.buffer.same_as(init.buffer) and a.order > init.order
    ]


def _first_wiped_reduction(
    accesses: list[_Access], lifetimes: dict[tirx.Buffer, tuple[Var, ...]]
) -> Finding | None:
    """An init block (decompose_reduction's) that runs again after the update block added to a
    point: the init sits under a loop that feeds none of its indices and the updates of a point
    are spread over that loop's iterations (or guarded to one of them), so a later iteration's init
    wipes them."""
    reads = {(a.block, a.buffer) for a in accesses if not a.is_write}
    for init in accesses:
        if not init.is_write or (init.block, init.buffer) in reads:
            continue
        later = _later_writes(init, accesses)
        update = next(
            (a for a in later if a.block != init.block and (a.block, a.buffer) in reads), None
        )
        if update is None:
            continue
        # A point of a buffer allocated inside loops is a point in one of their iterations.
        lifetime = lifetimes.get(init.buffer, ())
        shared = _shared([init, update])
        columns = tuple(x.var for x in shared)
        rank = len(init.indices)
        alive = [n for n, x in enumerate(shared) if any(x.var.same_as(v) for v in lifetime)]
        late = None
        if not once_per_point(init, lifetime):
            first = _points(init, {}, also=columns)
            then = _points(update, {}, also=columns)
            if first is not None and len(first) and then is not None and len(then):
                late = init_after_update(first, then, rank, alive)
        if late is not None:
            point, at = late
            where = _where(zip(columns, at, strict=True))
            return _found("wiped", init, point, where, (update.block,))
        again = _replayed(init, update, accesses, lifetime, shared)
        if again is not None:
            return again
    return None


def _replayed(
    init: _Access,
    update: _Access,
    accesses: list[_Access],
    lifetime: tuple[Var, ...],
    shared: list[_Loop],
) -> Finding | None:
    """An update that adds the same term to a point twice with no init between (`shared`: the
    loops of both, outermost first)."""
    steps = _steps(update, accesses)
    # Only where every loop of the update feeds its point or what it adds: a sum of A[i] over k
    # adds the same term on purpose.
    stored = set().union(*(_free_vars(e) for e in update.indices))
    added = set().union(*(_free_vars(e) for e in steps))
    loose = [x for x in update.loops if x.var not in stored | added and not _is_one(x.extent)]
    if not steps or loose or any(x.together for x in update.loops):
        return None  # (under thread loops, a local buffer is one per thread: not followed here)
    columns = tuple(x.var for x in shared)
    rank = len(init.indices)
    then = _points(update, {}, also=columns + steps, limit=REPLAY_POINTS)
    first = _points(init, {}, also=columns, limit=REPLAY_POINTS) if then is not None else None
    if then is None or first is None:  # too many to list at once: some points' every event
        if _each_step_once(update, accesses):
            return None
        sampled = _sampled_events(init, update, shared, columns + steps, rank)
        if sampled is None:
            return None
        first, then = sampled
    if not len(then) or not len(first):
        return None
    alive = [n for n, x in enumerate(shared) if any(x.var.same_as(v) for v in lifetime)]
    again = step_again(first, then, rank, alive, len(shared))
    if again is None:
        return None
    point, at = again  # update's buffer is init's
    return _found("replayed", update, point, _where(zip(columns, at, strict=True)), (init.block,))


def _sampled_events(
    init: _Access, update: _Access, shared: list[_Loop], also: tuple[Expr, ...], rank: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The init's and the update's events (as `_points` lists them, in the order they run) of
    up to `SAMPLED_POINTS` points: those the update reaches first. The outer shared loops are
    walked value by value, each step's events listed apart and all but the sampled points' left
    out, so a point's events are all there however many the update has in all (up to
    `SAMPLED_EVENTS`); None where that cannot be done."""
    total = _events(update)
    if total is None:
        return None
    outer: list[_Loop] = []
    ranges: list[range] = []
    per_step = total
    for loop in shared:  # walk as few outer loops as keep each step's events listable
        if per_step <= REPLAY_POINTS:
            break
        try:
            start, extent = int(_value(loop.min, {})), int(_value(loop.extent, {}))
        except (_Unsupported, TypeError, ValueError):
            return None  # (a range that depends on another loop)
        outer.append(loop)
        ranges.append(range(start, start + extent))
        per_step //= max(extent, 1)
    steps = total // max(per_step, 1)  # the walk's steps (each lists its events apart)
    if per_step > REPLAY_POINTS or total > SAMPLED_EVENTS or steps > SAMPLED_STEPS:
        return None
    sample: np.ndarray | None = None
    firsts, thens = [], []
    for values in itertools.product(*ranges):
        fixed = {loop.var: value for loop, value in zip(outer, values, strict=True)}
        then = _points(update, fixed, also=also, limit=REPLAY_POINTS)
        first = _points(init, fixed, also=also[: len(shared)], limit=REPLAY_POINTS)
        if then is None or first is None:
            return None
        if sample is None and len(then):
            sample = np.unique(then[: 64 * SAMPLED_POINTS, :rank], axis=0)[:SAMPLED_POINTS]
        if sample is not None:
            firsts.append(first[in_sample(first[:, :rank], sample)])
            thens.append(then[in_sample(then[:, :rank], sample)])
    if not thens:
        return None
    return np.concatenate(firsts), np.concatenate(thens)


def _each_step_once(update: _Access, accesses: list[_Access]) -> bool:
    """Whether TVM's iterator-map analysis proves that the update's loops give each (point, step)
    once: then nothing is added twice, and its events need not be listed (a tiled matmul's). It
    is enough that the point and one of its reads (`A[i, k]`) are one-to-one with the loops."""
    for read in _reads(update, accesses):
        distinct: list[Any] = []
        for e in (*update.indices, *read.indices):
            if not any(tvm_ffi.structural_equal(e, d) for d in distinct):
                distinct.append(e)
        if once_per_point(dataclasses.replace(update, indices=tuple(distinct))):
            return True
    return False


def _events(access: _Access) -> int | None:
    """How many times `access` runs (its loops' extents multiplied; None if not constant)."""
    count = 1
    for loop in access.loops:
        try:
            count *= int(_value(loop.extent, {}))
        except (_Unsupported, TypeError, ValueError):
            return None
    return count


def _steps(update: _Access, accesses: list[_Access]) -> tuple[Expr, ...]:
    """What an update adds, told by the points it reads of its other buffers (before compaction:
    a point of a cache is the point it copies)."""
    return tuple(index for a in _reads(update, accesses) for index in a.indices)


def _reads(update: _Access, accesses: list[_Access]) -> list[_Access]:
    """The update block's reads of buffers other than the one it updates."""
    return [
        a for a in accesses
        if a.block == update.block and not a.is_write and not a.buffer.same_as(update.buffer)
    ]  # fmt: skip


def _is_one(e: Expr) -> bool:
    """Whether `e` is the constant 1 (a unit extent, a predicate that always holds)."""
    return isinstance(e, tirx.IntImm) and int(e.value) == 1


def _first_out_of_bounds(accesses: list[_Access]) -> Finding | None:
    for access in accesses:
        shape = [x for x in access.buffer.shape]
        if not all(isinstance(x, tirx.IntImm) for x in shape) or len(shape) != len(access.indices):
            continue
        shape = [int(x) for x in shape]
        if provably_inside(access, shape):
            continue
        loops = [x for x in access.loops if not x.together]
        inner = _innermost_within(access, loops)
        for fixed in _iterations(loops[: len(loops) - inner]):
            points = _points(access, fixed)
            if points is None or not len(points):
                continue
            outside = (points < 0) | (points >= np.asarray(shape, dtype=np.int64))
            bad = np.flatnonzero(outside.any(axis=1))
            if len(bad):
                where = _where(fixed.items())
                return _found("out of bounds", access, points[bad[0]], where, shape=tuple(shape))
    return None


def _innermost_within(access: _Access, loops: list[_Loop]) -> int:
    """How many of the innermost `loops` to list whole: as many as fit in MAX_POINTS."""
    size, count = 1, 0
    for loop in reversed(loops):
        if not isinstance(loop.extent, tirx.IntImm):
            break
        size *= max(int(loop.extent), 1)
        if size > MAX_POINTS // 16:
            break
        count += 1
    return count
