"""What a kernel takes to run and to build, counted on its TIR without building it.

Two things TVM decides late, where no statement's guard sees them (issue 33):

- **The buffers as TVM allocates them**, read after buffer compaction, where `storage_align`
  becomes strides. A block's alignment (its `buffer_dim_align` annotation) names the written
  buffer by position and a dimension by number, and `rfactor` copies it onto the rfactor block,
  whose buffer has the reduction's dimension in front: there it pads another dimension. TVM
  computes a strided buffer's size (extent of dimension 0 x its stride) and its flat indices in
  int32; past 2^31 - 1 both wrap, and the kernel writes far outside a buffer of the wrapped size
  (512 x 1073741825 elements wrapped to 512: a SIGSEGV). The strides themselves wrap once one
  passes 2^31 - 1 (a padded dimension under one of extent 2 or more): they are read unwrapped.
- **The statements TVM's UnrollLoop pass lays out** (tirx.transform.UnrollLoop, TVM 0.27): a
  loop of kind `unrolled` is copied in TIR, and so is a serial loop under
  `pragma_auto_unroll_max_step` whose extent times the statements it holds stays within the step
  limit, when no loop that stays a loop is inside it. The statements multiply: 256 copies of a
  loop holding a 512-iteration loop the pragma unrolled are 131072 statements, and LLVM took
  minutes on them. This mirrors the pass's counting (its `step_count_`, `unroll_depth_` and
  `normal_loop_depth_`) on the scheduled function, with what runs before it there already:
  vectorized loops are vector statements (VectorizeLoop), thread loops are attributes and unit
  loops are gone (LowerOpaqueBlock), and a reduction's init is a statement of its own
  (LowerInitBlock). LLVM ignores the unroll hint of a loop that `pragma unroll_explicit=0` left
  a loop (CodeGenLLVM warns and emits the loop); NVCC honours it (`#pragma unroll`). Beside the
  pass's count, the statements under an `if` (a block's `T.where`) that tests none of the
  unrolled loop's variable: the same condition in every copy, which LLVM builds several times as
  slowly (1024 int32 stores under a split's guard of an outer loop: 36 s, 5 s without).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from tvm import s_tir, tirx

from schedlang.lang import tir_values

__all__ = [
    "Allocation",
    "Unrolled",
    "allocations",
    "padded_dims",
    "strided_statements",
    "unrolled_loops",
]

# The pass's own default (UnrollLoopConfig.auto_max_depth): how many nested loops it unrolls.
_AUTO_MAX_DEPTH = 8

# A vectorized loop: its variable and lanes.
_Vector = tuple[tirx.Var, int]
# Vector statements an unrolling lays out: the block realize, the vectorized loop it runs
# under, and the statements' copies.
_VectorStatements = tuple[s_tir.SBlockRealize, _Vector, int]


@dataclass(frozen=True)
class Allocation:
    """A buffer the kernel allocates, as TVM lays it out."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # row-major unless storage_align padded a dimension
    dtype_bytes: int
    written: tuple[int, ...] = ()  # the strides as TVM writes them, where int32 wrapped them

    @property
    def wrapped(self) -> bool:
        return bool(self.written) and self.written != self.strides

    @property
    def padded(self) -> bool:
        return self.strides != row_major(self.shape)

    @property
    def elements(self) -> int:
        """The elements TVM allocates (dimension 0's extent x its stride) or reaches with its
        largest index, whichever is more."""
        if not self.shape:
            return 1
        return max(self.shape[0] * self.strides[0], self.last_index + 1)

    @property
    def last_index(self) -> int:
        pairs = zip(self.shape, self.strides, strict=True)
        return sum((extent - 1) * stride for extent, stride in pairs)

    @property
    def bytes(self) -> int:
        return self.elements * self.dtype_bytes

    def describe(self) -> str:
        shape = " x ".join(map(str, self.shape))
        return f"{shape}, strides {', '.join(map(str, self.strides))}" if self.padded else shape


def allocations(func: tirx.PrimFunc) -> list[Allocation]:
    """Every buffer `func` allocates, of constant shape, in program order."""
    found: list[Allocation] = []

    def visit(stmt: tirx.Stmt) -> None:
        if isinstance(stmt, tirx.SeqStmt):
            for child in stmt.seq:
                visit(child)
        elif isinstance(stmt, s_tir.SBlockRealize):
            for buffer in stmt.block.alloc_buffers:
                allocation = _allocation(buffer)
                if allocation is not None:
                    found.append(allocation)
            if stmt.block.init is not None:
                visit(stmt.block.init)
            visit(stmt.block.body)
        elif isinstance(stmt, tirx.IfThenElse):
            visit(stmt.then_case)
            if stmt.else_case is not None:
                visit(stmt.else_case)
        elif isinstance(getattr(stmt, "body", None), tirx.Stmt):
            visit(stmt.body)

    visit(func.body)
    return found


def _allocation(buffer: tirx.Buffer) -> Allocation | None:
    shape, strides = _constants(buffer.shape), _constants(buffer.strides)
    if shape is None or strides is None:
        return None
    dtype = buffer.dtype
    size = max(1, dtype.bits * dtype.lanes // 8)
    if not strides:
        return Allocation(buffer.name, shape, row_major(shape), size)
    return Allocation(buffer.name, shape, unwrapped(shape, strides), size, strides)


def _constants(exprs: Iterable[tirx.PrimExpr]) -> tuple[int, ...] | None:
    """The values of `exprs`, or None where one is not a constant."""
    values: list[int] = []
    for expr in exprs:
        value = getattr(expr, "value", None)
        if value is None:
            return None
        values.append(value)
    return tuple(values)


def unwrapped(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """The strides TVM computes for `shape`, before its int32 arithmetic wraps them.

    Compaction computes each stride from the next (its extent x stride, plus the alignment's
    padding) in the shape's int32, and a stride past 2^31 - 1 comes out wrapped: 18 x 13 x 2 x 97
    with dim 2 aligned to 2^30 + 1 has strides -2147483622, -2147483646, 1073741825, 1. A padded
    stride is never below the next dimension's extent x stride and the padding is below the
    factor (an int32), so each is that product plus the written stride's excess modulo 2^32."""
    true: list[int] = []
    for d in reversed(range(len(shape))):
        plain = shape[d + 1] * true[0] if true else 1
        true.insert(0, plain + (strides[d] - plain) % 2**32)
    return tuple(true)


def padded_dims(allocation: Allocation) -> list[tuple[int, int, int]]:
    """(dim, its stride, the stride it would have unpadded) of each dimension storage_align
    padded: the dimensions whose stride is more than the extent x stride of the next."""
    shape, strides = allocation.shape, allocation.strides
    plain = [shape[d + 1] * strides[d + 1] for d in range(len(shape) - 1)] + [1]
    return [(d, s, p) for d, (s, p) in enumerate(zip(strides, plain, strict=True)) if s != p]


def row_major(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of an unpadded buffer of `shape`."""
    return tuple(math.prod(shape[d + 1 :]) for d in range(len(shape)))


@dataclass
class Unrolled:
    """A loop TVM copies: its extent, the statements the copies add up to, what unrolls it (the
    loop whose auto_unroll_max_step pragma did, or None for an `unroll`), and the unrolled loops
    directly inside it."""

    loop: tirx.For
    statements: int
    pragma: tirx.For | None
    inner: list[Unrolled] = field(default_factory=list)
    # Of the statements, those under an `if` that is the same in every copy: one that tests
    # none of this loop's variable (a non-dividing split's guard of a loop outside it).
    same_guard: int = 0
    # Of the statements, the vector ones; `strided_statements` tells which are strided.
    vectors: tuple[_VectorStatements, ...] = ()

    @property
    def extent(self) -> int:
        return int(self.loop.extent.value)


def unrolled_loops(func: tirx.PrimFunc, follows_hint: bool) -> list[Unrolled]:
    """The outermost loops of the scheduled `func` that TVM (or, where `follows_hint`, the
    device compiler: NVCC) copies, each with the unrolled loops inside it."""
    unroller = _Unroller(follows_hint)
    unroller.stmt(func.body)
    return unroller.unrolled


class _Unroller:
    """UnrollLoop's counting (see the module docstring), recording instead of copying."""

    def __init__(self, follows_hint: bool):
        self.follows_hint = follows_hint
        self.max_step, self.explicit, self.pragma = 0, True, None
        self.steps = self.unroll_depth = self.normal_depth = 0
        self.unrolled: list[Unrolled] = []  # those outside every other, as far as seen
        # Beside the pass's count: the steps under an `if`, by the variables its conditions
        # test, and the variables of the conditions around the statement visited.
        self.guarded: collections.Counter[frozenset[tirx.Var]] = collections.Counter()
        self.guard: frozenset[tirx.Var] | None = None
        # Beside it too: the vectorized loop around (its variable and lanes), each block realize
        # met under one with that loop, and the vector statements of each so far. Whether a
        # vector's lanes are strided is asked only of an unrolling that could be too long.
        self.vector: _Vector | None = None
        self.groups: list[tuple[s_tir.SBlockRealize, _Vector]] = []
        self.group: int | None = None  # the index of the realize visited, under a vector
        self.vectors: collections.Counter[int] = collections.Counter()

    def seq(self, stmts: Iterable[tirx.Stmt]) -> None:
        for stmt in stmts:
            steps, unroll_depth, normal_depth = self.steps, self.unroll_depth, self.normal_depth
            guarded, self.guarded = self.guarded, collections.Counter()
            vectors, self.vectors = self.vectors, collections.Counter()
            self.steps = self.unroll_depth = self.normal_depth = 0
            self.stmt(stmt)
            self.steps += steps
            self.guarded.update(guarded)
            self.vectors.update(vectors)
            self.normal_depth = max(normal_depth, self.normal_depth)
            self.unroll_depth = max(unroll_depth, self.unroll_depth)

    def guarded_by(self, condition: tirx.PrimExpr, body: tirx.Stmt) -> None:
        saved = self.guard
        tested = frozenset(tirx.analysis.undefined_vars(condition))
        self.guard = tested | (saved or frozenset())
        self.stmt(body)
        self.guard = saved

    def stmt(self, stmt: tirx.Stmt) -> None:
        if isinstance(stmt, tirx.SeqStmt):
            self.seq(stmt.seq)
        elif isinstance(stmt, tirx.For):
            self.loop(stmt)
        elif isinstance(stmt, s_tir.SBlockRealize):
            block = stmt.block
            body = block.body if block.init is None else tirx.SeqStmt([block.init, block.body])
            saved = self.group
            if self.vector is not None:
                self.group = len(self.groups)
                self.groups.append((stmt, self.vector))
            if isinstance(stmt.predicate, tirx.IntImm) and stmt.predicate.value:
                self.stmt(body)
            else:
                self.guarded_by(stmt.predicate, body)  # a `T.where`, an `if` once lowered
            self.group = saved
        elif isinstance(stmt, tirx.BufferStore | tirx.Evaluate):
            self.steps += 1
            if self.guard is not None:
                self.guarded[self.guard] += 1
            if self.group is not None:
                self.vectors[self.group] += 1
        elif isinstance(stmt, tirx.IfThenElse):
            self.guarded_by(stmt.condition, stmt.then_case)
            if stmt.else_case is not None:
                self.guarded_by(stmt.condition, stmt.else_case)
        elif isinstance(getattr(stmt, "body", None), tirx.Stmt):
            self.stmt(stmt.body)

    def loop(self, loop: tirx.For) -> None:
        saved = self.max_step, self.explicit, self.pragma
        notes = loop.annotations
        if "pragma_auto_unroll_max_step" in notes:
            self.max_step, self.pragma = int(notes["pragma_auto_unroll_max_step"]), loop
        if "pragma_unroll_explicit" in notes:
            self.explicit = bool(int(notes["pragma_unroll_explicit"]))
        extent = getattr(loop.extent, "value", -1)
        if loop.kind == tirx.ForKind.VECTORIZED and extent > 1:
            vector, self.vector = self.vector, (loop.loop_var, extent)
            self.stmt(loop.body)  # vector statements
            self.vector = vector
        elif loop.kind == tirx.ForKind.THREAD_BINDING or extent <= 1:
            self.stmt(loop.body)  # an attribute, or no loop at all
        else:
            self.count(loop, extent)
        self.max_step, self.explicit, self.pragma = saved

    def count(self, loop: tirx.For, extent: int) -> None:
        outer = len(self.unrolled)
        self.stmt(loop.body)
        unrolled = loop.kind == tirx.ForKind.UNROLLED and extent >= 0
        unrolled = unrolled or (
            loop.kind == tirx.ForKind.SERIAL
            and extent >= 0
            and self.normal_depth == 0
            and self.unroll_depth <= _AUTO_MAX_DEPTH
            and extent * self.steps <= self.max_step
        )
        if not unrolled:
            self.normal_depth += 1
            return
        self.steps *= extent
        self.guarded = collections.Counter({k: n * extent for k, n in self.guarded.items()})
        self.vectors = collections.Counter({k: n * extent for k, n in self.vectors.items()})
        self.unroll_depth += 1
        if self.explicit or self.follows_hint:
            by = None if loop.kind == tirx.ForKind.UNROLLED else self.pragma
            inner, self.unrolled[outer:] = self.unrolled[outer:], []
            same = sum(n for k, n in self.guarded.items() if loop.loop_var not in k)
            vectors = tuple((*self.groups[k], n) for k, n in self.vectors.items())
            self.unrolled.append(Unrolled(loop, self.steps, by, inner, same, vectors))


def strided_statements(unrolled: Unrolled) -> tuple[int, int]:
    """Of the statements an unrolling lays out, the vectors whose lanes are strided elements of
    a buffer (a gather or scatter): how many, and their lanes in all."""
    strided = lanes = 0
    for realize, vector, copies in unrolled.vectors:
        width = _strided_lanes(realize, vector)
        if width > 1:
            strided, lanes = strided + copies, lanes + copies * width
    return strided, lanes


def _strided_lanes(realize: s_tir.SBlockRealize, vector: _Vector) -> int:
    """The lanes of the vector statements of the block `realize` runs under the vectorized
    loop `vector`, where one of its accesses is strided in it (neighbouring lanes more than one
    element apart: a gather or scatter); 1 where none is. The accesses are the block's read
    and written regions, evaluated at the loop's first lanes and its last with every other loop
    at 0; one that cannot be evaluated counts as adjacent."""
    var, lanes = vector
    block = realize.block
    lane = np.array([0, 1, lanes - 2, lanes - 1])
    env: tir_values.Env = {var: lane}
    for iter_var, bound in zip(block.iter_vars, realize.iter_values, strict=True):
        env.update({v: 0 for v in tir_values.free_vars(bound) if v not in env})
        try:
            env[iter_var.var] = tir_values.value(bound, env)
        except tir_values.Unsupported:
            return 1
    for region in [*block.reads, *block.writes]:
        buffer = region.source
        try:
            strides = (
                [int(tir_values.value(x, {})) for x in buffer.strides]
                if len(buffer.strides)
                else row_major([int(tir_values.value(x, {})) for x in buffer.shape])
            )
            flat = sum(
                np.asarray(tir_values.value(r.min, env)) * stride
                for r, stride in zip(region.region, strides, strict=True)
            )
        except (tir_values.Unsupported, TypeError, ValueError):
            continue
        steps = np.broadcast_to(flat, lane.shape)
        if abs(int(steps[1] - steps[0])) > 1 or abs(int(steps[3] - steps[2])) > 1:
            return lanes
    return 1
