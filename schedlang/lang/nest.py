"""The loop nests of a schedule in progress, named the way the schedule language names them.

The checker and the lowering share one view of a live `s_tir.Schedule`: which blocks exist, which
loops enclose each block, their schedlang names (`i`, `i.o`, `k.0`, `ij`), extents and kinds.
Names are attached to loops through their stable srefs, so a loop keeps its name when reorder or
compute_at moves it; a loop the schedule never named (one TVM created for a cache block, say) is
named after its loop variable, as `schedlang show` prints it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tvm
import tvm.sym
from tvm import s_tir, tirx

from schedlang.lang.loop import Consumed, Loop, LoopKind

__all__ = ["Consumed", "Loop", "LoopKind", "Nest", "UncheckedSchedule"]

_get_realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")
# Schedule.get, get_sref and get_loops without their Python argument checks, which cost 200 µs a
# call: reading the loops of a deep nest once per statement made checking quadratic in practice.
_get = tvm.get_global_func("s_tir.schedule.ScheduleGet")
_get_sref = tvm.get_global_func("s_tir.schedule.ScheduleGetSRef")
_get_loops = tvm.get_global_func("s_tir.schedule.ScheduleGetLoops")
_get_sblock = tvm.get_global_func("s_tir.schedule.ScheduleGetSBlock")
_get_child_blocks = tvm.get_global_func("s_tir.schedule.ScheduleGetChildBlocks")


class UncheckedSchedule(s_tir.Schedule):  # type: ignore[misc]  # TVM's classes are untyped (Any)
    """`s_tir.Schedule` without the Python-side argument checks of its primitives.

    Each primitive of `s_tir.Schedule` is wrapped in a type checker (`inspect.signature.bind` and
    a walk of the type hints) that costs about 200 µs a call, more than most primitives take: it
    was half of checking a schedule. The checker and the lowering pass only arguments they made
    themselves (loop and block references of this schedule, checked integers, scope names the
    grammar admits), so the primitives here are the wrapped functions themselves. What they
    record in the trace, and what TVM reports on rejecting one, is unchanged.
    """


for _name, _method in vars(s_tir.Schedule).items():
    if callable(getattr(_method, "__wrapped__", None)):  # functools.wraps of type_checked
        setattr(UncheckedSchedule, _name, _method.__wrapped__)


class Nest:
    """A live schedule with schedlang names for its blocks and loops."""

    def __init__(self, sch: s_tir.Schedule):
        self.sch = sch
        self._loop_names: dict[object, str] = {}
        self._var_names: dict[str, str] = {}  # TVM loop var name → schedlang name
        self.block_aliases: dict[str, str] = {}  # schedlang name → TVM block name
        self.consumed: dict[tuple[str, str], Consumed] = {}
        # Loops per block, valid until the schedule changes; also keeps look-ups out of the trace.
        self._loops: dict[str, list[Loop]] = {}
        # Each loop's step in each affine binding per block (Nest._strides), likewise.
        self._strides_of: dict[str, list[list[int]]] = {}
        # The blocks' TVM names, in program order, likewise.
        self._block_names: list[str] | None = None
        # Blocks nested inside another block (blockize, TVMScript with an outer block), likewise.
        self._nested_names: list[str] | None = None
        # (block, former name) → name: loops compute_at made, once called ax0, ax1, ….
        self.former_names: dict[tuple[str, str], str] = {}

    def changed(self) -> None:
        self._loops.clear()
        self._strides_of.clear()
        self._block_names = None
        self._nested_names = None

    # --- blocks ----------------------------------------------------------------------------------

    def block_names(self) -> list[str]:
        """Every block except the root, in program order, by its schedlang name."""
        if self._block_names is None:
            children = _get_child_blocks(self.sch, self.root())
            self._block_names = [_get(self.sch, rv).name_hint for rv in children]
        reverse = {tvm_name: alias for alias, tvm_name in self.block_aliases.items()}
        return [reverse.get(n, n) for n in self._block_names]

    def has_block(self, name: str) -> bool:
        return name in self.block_names() or name in self.nested_block_names()

    def nested_block_names(self) -> list[str]:
        """The blocks inside another block (the inner block of a blockize, say), by schedlang
        name: a section may schedule them; whole-kernel rules look at the outer ones."""
        if self._nested_names is None:
            nested: list[str] = []
            outer = list(_get_child_blocks(self.sch, self.root()))
            while outer:
                inner = list(_get_child_blocks(self.sch, outer.pop(0)))
                nested += [_get(self.sch, rv).name_hint for rv in inner]
                outer += inner
            self._nested_names = nested
        reverse = {tvm_name: alias for alias, tvm_name in self.block_aliases.items()}
        return [reverse.get(n, n) for n in self._nested_names]

    def root(self) -> s_tir.SBlockRV:
        """The function's outermost block: `root` as te and TVMScript write it, or, in a function
        whose body is a single block of another name, that block (it has no blocks inside)."""
        body = self.sch.mod["main"].body
        name = body.block.name_hint if isinstance(body, s_tir.SBlockRealize) else "root"
        return _get_sblock(self.sch, name, None)

    def block(self, name: str) -> s_tir.SBlockRV:
        return _get_sblock(self.sch, self.block_aliases.get(name, name), None)

    def name_block(self, rv: s_tir.SBlockRV, alias: str | None) -> str:
        self.changed()
        tvm_name: str = _get(self.sch, rv).name_hint
        if alias:
            self.block_aliases[alias] = tvm_name
            return alias
        return tvm_name

    def realize(self, name: str) -> tirx.SBlockRealize:
        return _get_realize(self.sch, self.block(name))

    def predicate(self, name: str) -> tirx.PrimExpr:
        """The block's `if` (its realize's predicate; 1 where it runs unguarded)."""
        return _get_realize(self.sch, self.block(name)).predicate

    def is_guarded(self, name: str) -> bool:
        """Whether the block runs under an `if` (a non-divisible split's predicate)."""
        predicate = _get_realize(self.sch, self.block(name)).predicate
        return not (isinstance(predicate, tirx.IntImm) and int(predicate) == 1)

    def guards_own_iterators(self, name: str) -> bool:
        """Whether the block's `if` tests loops bound straight to its own iterators, as after
        rfactor of a non-divisible split. compute_at regenerates such loops over the iterators'
        whole domains and drops the `if`: the moved block computes out of bounds."""
        realize = _get_realize(self.sch, self.block(name))
        if not self.is_guarded(name):
            return False
        direct = {value for value in realize.iter_values if isinstance(value, tirx.Var)}
        return bool(_vars_in(realize.predicate) & direct)

    def strided_across(self, name: str, at: Loop) -> tuple[Loop, Loop] | None:
        """Two loops feeding one iterator of the block, `outer` at or outside `at` and `inner`
        inside it, where `outer` steps by less than `inner` (a split's inner part reordered
        outside its outer part, as a `tile` of a split's parts can do). Under `at` the block
        then covers a strided set, which TVM takes for the box around it. None if there are
        none (or a binding is not affine: a fused loop's)."""
        loops = self.loops(name)
        cut = [x.name for x in loops].index(at.name) + 1
        for strides in self._strides(name):
            for i in range(cut):
                for j in range(cut, len(loops)):
                    if 0 < strides[i] < strides[j]:
                        return loops[i], loops[j]
        return None

    def overlapping_at(self, name: str, at: Loop) -> tuple[Loop, Loop] | None:
        """Two loops of a guarded block whose steps overlap (a split of a guarded loop's inner
        part, say: `split i by 4, 32, *` on 11 rows makes a third loop of 1, split again by
        16), one of them at or outside `at`. Only the `if` keeps them from computing one point
        twice; TVM sizes what a block moved to `at` reads without it, and the moved block
        copies garbage over finished points (found by the differential fuzzer, TVM 0.27)."""
        if not self.is_guarded(name):
            return None
        loops = self.loops(name)
        cut = [x.name for x in loops].index(at.name) + 1
        for strides in self._strides(name):
            steps = sorted(
                (stride, k)
                for k, stride in enumerate(strides)
                if stride > 0 and (loops[k].extent or 1) > 1
            )
            for n, (stride, k) in enumerate(steps):  # smallest step first: the first overlap
                smaller = steps[:n]
                span = sum(step * ((loops[m].extent or 1) - 1) for step, m in smaller)
                if stride <= span and (k < cut or any(m < cut for _, m in smaller)):
                    _, other = max(smaller, key=lambda sm: sm[0] * (loops[sm[1]].extent or 1))
                    return loops[k], loops[other]
        return None

    def _strides(self, name: str) -> list[list[int]]:
        """Per iterator of the block whose binding is affine in its loops, each loop's step (in
        the order of `loops(name)`)."""
        if name not in self._strides_of:
            self._strides_of[name] = self._read_strides(name)
        return self._strides_of[name]

    def _read_strides(self, name: str) -> list[list[int]]:
        nodes = [_get(self.sch, x.rv).loop_var for x in self.loops(name)]
        found = []
        for value in _get_realize(self.sch, self.block(name)).iter_values:
            at0 = _value_at(value, nodes, {})
            strides: list[int] = []
            for var in nodes:
                at1, at2 = (_value_at(value, nodes, {var: n}) for n in (1, 2))
                if at0 is None or at1 is None or at2 is None or at2 - at0 != 2 * (at1 - at0):
                    break  # not a constant stride: the index is left out
                strides.append(at1 - at0)
            else:
                found.append(strides)
        return found

    def guarded_loops(self, name: str) -> list[Loop]:
        """The loops that the block's `if` tests."""
        if not self.is_guarded(name):
            return []
        tested = _vars_in(_get_realize(self.sch, self.block(name)).predicate)
        return [x for x in self.loops(name) if _get(self.sch, x.rv).loop_var in tested]

    def guarded_spatial_loops(self, name: str) -> list[Loop]:
        """The loops that the block's `if` tests and that feed its spatial iterators. rfactor keeps
        the `if` in the rfactor block but drops it from the final reduction block, which then
        writes past its output (TVM 0.27)."""
        guarded = self.guarded_loops(name)
        if not guarded:
            return []
        realize = _get_realize(self.sch, self.block(name))
        spatial = set().union(
            *(
                _vars_in(value)
                for iv, value in zip(realize.block.iter_vars, realize.iter_values, strict=True)
                if iv.iter_type != tirx.IterVar.CommReduce
            )
        )
        return [x for x in guarded if _get(self.sch, x.rv).loop_var in spatial]

    def spatial_points(self, name: str) -> int | None:
        """How many points the block's spatial iterators span (its output region), if known."""
        return self._points(name, reduce=False)

    def reduce_points(self, name: str) -> int | None:
        """How many points the block's reduction iterators span, if known (1: no reduction)."""
        return self._points(name, reduce=True)

    def _points(self, name: str, reduce: bool) -> int | None:
        extents = [
            iv.dom.extent
            for iv in self._block(name).iter_vars
            if (iv.iter_type == tirx.IterVar.CommReduce) == reduce
        ]
        if not all(isinstance(e, tirx.IntImm) for e in extents):
            return None
        return math.prod(int(e) for e in extents)

    def reduce_iterations(self, name: str) -> int | None:
        """How many iterations of the loops that feed the block's reduction iterators run."""
        return self._iterations(name, (LoopKind.REDUCE, LoopKind.MIXED), below=None)

    def spatial_iterations(self, name: str, below: Loop | None = None) -> int | None:
        """How many iterations of the loops that feed the block's spatial iterators run (under
        `below` only, when given): an upper bound on the points the block computes there."""
        return self._iterations(name, (LoopKind.SPATIAL, LoopKind.MIXED), below)

    def _iterations(self, name: str, kinds: tuple[LoopKind, ...], below: Loop | None) -> int | None:
        """The product of the extents of the block's loops of `kinds` (under `below`); a
        non-constant extent counts at its largest value; None if that is unbounded."""
        loops = self.loops(name)
        if below is not None:
            loops = loops[[x.name for x in loops].index(below.name) + 1 :]
        extents = [
            x.extent if x.extent is not None else self._largest_extent(name, x)
            for x in loops
            if x.kind in kinds
        ]
        if any(e is None for e in extents):
            return None
        return math.prod(e or 1 for e in extents)

    def _largest_extent(self, block: str, loop: Loop) -> int | None:
        """The largest value a loop's non-constant extent takes (TVM gives the loops of a copy
        block such extents when the region it copies depends on an outer loop), if bounded."""
        analyzer = tvm.sym.Analyzer()
        for outer in self.loops(block):
            if outer.name == loop.name:
                break
            node = _get(self.sch, outer.rv)
            if outer.extent is not None:
                analyzer.bind(node.loop_var, tvm.ir.Range.from_min_extent(node.min, node.extent))
        bound = analyzer.const_int_bound(_get(self.sch, loop.rv).extent).max_value
        return bound if 0 <= bound < 2**62 else None

    def shared_loops(self, first: str, second: str) -> list[Loop]:
        """The loops that enclose both blocks, outer to inner, as `first` sees them."""
        theirs = [_get_sref(self.sch, x.rv) for x in self.loops(second)]
        shared = []
        for loop, sref in zip(self.loops(first), theirs):  # noqa: B905
            if not _get_sref(self.sch, loop.rv).same_as(sref):
                break
            shared.append(loop)
        return shared

    def loop_names_by_var(self) -> dict[str, str]:
        """TVM loop variable name → the loop's schedlang name, for the loops named so far."""
        return dict(self._var_names)

    def is_reduction_block(self, name: str) -> bool:
        return any(iv.iter_type == tirx.IterVar.CommReduce for iv in self._block(name).iter_vars)

    def _block(self, name: str) -> tirx.SBlock:
        return self.sch.get(self.block(name))

    def reads(self, name: str) -> list[str]:
        return [region.source.name for region in self._block(name).reads]

    def writes(self, name: str) -> list[str]:
        return [region.source.name for region in self._block(name).writes]

    def write_dtype(self, name: str) -> str:
        writes = self._block(name).writes
        return str(writes[0].source.dtype) if writes else "float32"

    def write_buffer(self, name: str) -> tirx.Buffer | None:
        writes = self._block(name).writes
        return writes[0].source if writes else None

    def reduction_blocks(self) -> list[str]:
        return [b for b in self.block_names() if self.is_reduction_block(b)]

    # --- loops -----------------------------------------------------------------------------------

    def loops(self, block: str) -> list[Loop]:
        """The loops enclosing `block`, outer to inner."""
        if block not in self._loops:
            self._loops[block] = self._read_loops(block)
        return list(self._loops[block])

    def _read_loops(self, block: str) -> list[Loop]:
        rv = self.block(block)
        realize = _get_realize(self.sch, rv)
        # Loop variables by identity (their handles: `==` on variables builds an expression):
        # two loops may share a name (`ax0` of a compute_at inside another `ax0`), and a block
        # fed by one is not fed by the other.
        spatial_vars: set[int] = set()
        reduce_vars: set[int] = set()
        for iter_var, value in zip(realize.block.iter_vars, realize.iter_values, strict=True):
            used = {var.__chandle__() for var in _vars_in(value)}
            if iter_var.iter_type == tirx.IterVar.CommReduce:
                reduce_vars |= used
            else:
                spatial_vars |= used
        loops = []
        taken: set[str] = set()
        for loop_rv in _get_loops(self.sch, rv):
            node = _get(self.sch, loop_rv)
            name = self._name_of(loop_rv, node, taken)
            taken.add(name)
            var = node.loop_var.__chandle__()
            kind = (
                LoopKind.MIXED
                if var in spatial_vars and var in reduce_vars
                else LoopKind.REDUCE
                if var in reduce_vars
                else LoopKind.SPATIAL
                if var in spatial_vars
                else LoopKind.OUTER
            )
            extent = int(node.extent) if isinstance(node.extent, tirx.IntImm) else None
            thread = node.thread_binding.thread_tag if node.thread_binding is not None else None
            loops.append(Loop(name, loop_rv, extent, kind, thread, _FOR_KINDS.get(int(node.kind))))
        return loops

    def _name_of(self, loop_rv: s_tir.LoopRV, node: tirx.For, taken: set[str]) -> str:
        sref = _get_sref(self.sch, loop_rv)
        if sref in self._loop_names:
            return self._loop_names[sref]
        # A loop TVM copied from a named one (rfactor, cache blocks) has the same variable name.
        base: str = self._var_names.get(node.loop_var.name, node.loop_var.name)
        name, suffix = base, 1
        while name in taken:
            name, suffix = f"{base}_{suffix}", suffix + 1
        self._loop_names[sref] = name
        return name

    def set_name(self, loop_rv: s_tir.LoopRV, name: str, copies: bool = True) -> None:
        """Name a loop; with `copies`, also the loops TVM copies from it later (same variable)."""
        self.changed()
        self._loop_names[_get_sref(self.sch, loop_rv)] = name
        if copies:
            self._var_names[_get(self.sch, loop_rv).loop_var.name] = name

    def find(self, block: str, name: str) -> Loop | None:
        found = next((loop for loop in self.loops(block) if loop.name == name), None)
        renamed = self.former_names.get((block, name))
        if found is None and renamed is not None:  # a schedule written before the rename
            return self.find(block, renamed)
        return found

    def blocks_with_axis(self, name: str) -> list[str]:
        return [b for b in self.block_names() if self.find(b, name) is not None]


_FOR_KINDS = {1: "parallel", 2: "vectorized", 3: "unrolled"}


def _value_at(
    expr: tirx.PrimExpr, loop_vars: list[tirx.Var], values: dict[tirx.Var, int]
) -> int | None:
    """`expr` with every loop variable set (to 0 unless `values` has it), if a constant."""
    try:  # plain integer arithmetic, as a binding mostly is: a tenth of the analyzer's time
        return _folded(expr, [(var, values.get(var, 0)) for var in loop_vars])
    except _NotPlain:
        pass
    analyzer = tvm.sym.Analyzer()
    for var in loop_vars:
        analyzer.bind(var, tirx.IntImm(str(var.ty), values.get(var, 0)))
    result = analyzer.simplify(expr)
    return int(result) if isinstance(result, tirx.IntImm) else None


class _NotPlain(Exception):
    """An expression `_folded` leaves to TVM's analyzer."""


_FOLD: dict[type, Callable[[int, int], int]] = {
    tirx.Add: lambda a, b: a + b,
    tirx.Sub: lambda a, b: a - b,
    tirx.Mul: lambda a, b: a * b,
    tirx.FloorDiv: lambda a, b: a // b,  # Python's // and % round down, as TVM's floor forms
    tirx.FloorMod: lambda a, b: a % b,
    tirx.Min: min,
    tirx.Max: max,
}


def _folded(expr: tirx.PrimExpr, values: list[tuple[tirx.Var, int]]) -> int:
    """`expr`'s value with each variable of `values` ((variable, value) pairs) at its value;
    _NotPlain for anything but integer constants, those variables and _FOLD's operations (a
    division by zero and a value past int32 included)."""
    kind = type(expr)
    if kind is tirx.IntImm:
        return int(expr.value)
    if kind is tirx.Var:  # by identity: `==` on variables builds an expression
        for var, value in values:
            if var.same_as(expr):
                return int(value)
        raise _NotPlain
    operation = _FOLD.get(kind)
    if operation is None:
        raise _NotPlain
    a, b = _folded(expr.a, values), _folded(expr.b, values)
    if b == 0 and kind in (tirx.FloorDiv, tirx.FloorMod):
        raise _NotPlain
    result = operation(a, b)
    if not -(2**31) <= result < 2**31:  # where int32 would wrap, as the analyzer's answer may
        raise _NotPlain
    return result


def _vars_in(expr: tirx.PrimExpr) -> set[tirx.Var]:
    return set(tirx.analysis.undefined_vars(expr))


def folded_value(expr: tirx.PrimExpr, values: list[tuple[tirx.Var, int]]) -> int | None:
    """`expr`'s value with each variable of `values` at its value, where plain integer arithmetic
    gives one (see `_folded`); None otherwise."""
    try:
        return _folded(expr, values)
    except _NotPlain:
        return None
