"""Tensor intrinsics: `tensorize LOOP with INTRIN`.

INTRIN names one of TVM's registered tensor intrinsics (`tvm.s_tir.tensor_intrin`: CUDA
`mma_*`/`wmma_*` with `ldmatrix`, x86 `dot_*` int8 dot products, Arm `dot_*`/`sdot`). The loops
from LOOP inward are replaced by the intrinsic's implementation. Before TVM compares the two, the
checker compares what a person can read: the loops under LOOP against the intrinsic's loop nest
(count and extents), the dtypes and memory scopes of what the block reads and writes against the
intrinsic's buffers, the target the intrinsic is for, and, for each buffer the intrinsic reads or
writes as one contiguous block, that the block's region of it is laid out so (TVM does not check
this last: see "operand layouts" below).

Importing TVM's intrinsics defines ~250 TVMScript functions; each `@T.prim_func` walks the Python
stack with `inspect.stack()`, which reads source files, ~35 s in all here. The import runs once,
the first time a schedule uses `tensorize`, with a frame walk that reads no files instead.
"""

from __future__ import annotations

import inspect
import itertools
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from schedlang.core.diagnostics import did_you_mean, one_of
from schedlang.lang import nodes
from schedlang.lang.loop import Consumed
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import Axis, Intrinsic
from schedlang.lang.statements.base import checked_loop, loop
from schedlang.lang.statements.decompiling import TraceReader, Untranslatable
from schedlang.lang.statements.facets import Syntax

if TYPE_CHECKING:
    from types import FrameType

    from schedlang.core.target import Target
    from schedlang.lang.loop import Loop
    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker


@dataclass(frozen=True)
class Tensorize(nodes.Stmt, keyword="tensorize"):
    """`tensorize k.i with mma_f16f16f16`: compute the loops from AXIS inward with INTRIN."""

    axis: nodes.Name
    intrin: nodes.Name


# --- TVM's intrinsics ----------------------------------------------------------------------------

# The module that registers an intrinsic says what hardware it needs.
_FAMILY_MODULES = {
    "cuda": "CUDA tensor cores",
    "x86": "x86 CPUs",
    "arm_cpu": "Arm CPUs",
    "rocm": "AMD GPUs",
    "hexagon": "Hexagon DSPs",
    "riscv_cpu": "RISC-V CPUs",
    "metal": "Apple GPUs",
}


def _frames_without_source(context: int = 1) -> list[inspect.FrameInfo]:
    frame: FrameType | None = sys._getframe(1)
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append(
            inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None)
        )
        frame = frame.f_back
    return frames


@cache
def intrinsics() -> dict[str, str]:
    """Every registered tensor intrinsic → the family module that registered it."""
    stack = inspect.stack
    inspect.stack = _frames_without_source  # see the module's docstring
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.stack = stack
    found: dict[str, str] = {}
    for family in _FAMILY_MODULES:
        module = sys.modules.get(f"tvm.s_tir.tensor_intrin.{family}")
        for attr, value in (vars(module) if module else {}).items():
            if attr.endswith("_INTRIN") and isinstance(value, str):
                found.setdefault(value, family)
    return found


def intrinsic(name: str) -> Any | None:
    from tvm.s_tir import TensorIntrin

    intrinsics()
    return TensorIntrin.get(name, allow_missing=True)


@dataclass(frozen=True)
class Shape:
    """What an intrinsic's description computes: its loop extents, outer first, and the
    (dtype, scope) of the buffers its block reads and writes."""

    extents: tuple[int, ...]
    reads: tuple[tuple[str, str], ...]
    writes: tuple[tuple[str, str], ...]
    readable: bool = True


def describe(desc: Any) -> Shape:
    from tvm import s_tir, tirx

    extents: list[int] = []
    blocks: list[Any] = []
    node = desc.body
    while node is not None:  # a description is one nest: root block, loops, one block
        if isinstance(node, s_tir.SBlockRealize):
            node = node.block
        elif isinstance(node, s_tir.SBlock):
            blocks.append(node)
            node = node.body
        elif isinstance(node, tirx.For):
            extents.append(int(node.extent) if isinstance(node.extent, tirx.IntImm) else -1)
            node = node.body
        elif isinstance(node, tirx.SeqStmt) and len(node.seq) == 1:
            node = node.seq[0]
        else:
            node = None
    if not blocks:  # not a description schedlang can read: TVM's own comparison decides
        return Shape(tuple(extents), (), (), readable=False)
    inner = blocks[-1]
    return Shape(
        tuple(extents),
        tuple(_access(r.source) for r in inner.reads),
        tuple(_access(r.source) for r in inner.writes),
    )


def _access(buffer: Any) -> tuple[str, str]:
    return str(buffer.dtype), buffer.scope()


def _accesses(regions: Any) -> tuple[tuple[str, str], ...]:
    return tuple(_access(r.source) for r in regions)


def _sm(arch: str | None) -> int | None:
    match = re.fullmatch(r"sm_(\d+)a?", arch or "")
    return int(match[1]) if match else None


def binds_lanes_itself(nest: Nest, block: str) -> bool:
    """Whether the block's body binds threadIdx.x itself, as the body of a warp-level intrinsic
    (ldmatrix, mma) put there by tensorize does: its stores are spread over a warp's lanes."""
    todo = [nest.sch.get(nest.block(block)).body]
    while todo:
        node = todo.pop()
        if node is None:
            continue
        binding = getattr(node, "thread_binding", None)  # a For bound to a thread axis
        if binding is not None and binding.thread_tag == "threadIdx.x":
            return True
        todo += list(getattr(node, "seq", None) or ())
        todo += [getattr(node, name, None) for name in ("body", "then_case", "else_case")]
        if hasattr(node, "block") and hasattr(node, "iter_values"):  # a block realize
            todo.append(node.block)
    return False


def written_by_intrinsics(nest: Nest, buffer: str) -> bool:
    """Whether every block that writes `buffer` is a warp-level intrinsic (see above): TVM's
    warp-memory lowering then takes the intrinsic's layout (e.g. 8 halves per lane)."""
    writers = [b for b in nest.block_names() if buffer in nest.writes(b)]
    return bool(writers) and all(binds_lanes_itself(nest, b) for b in writers)


# fmt: off
TENSORIZE = Syntax("tensorize", Tensorize, "tensorize",
    (Axis(consumed=True), Intrinsic("intrin", word="with")),
    example="e.g. `tensorize k.i with mma_f16f16f16` or `tensorize ax0.i with "
    "mma_ldmatrix_f16_a_dyn`",
    description="compute the loops from AXIS inward with a TVM tensor intrinsic (CUDA mma_*, "
    "wmma_*, ldmatrix; x86/Arm int8 dot_*), whose loop nest they must match.",
    summary=("`tensorize a with INTRIN`", '`sch.tensorize(loop, "INTRIN")`', "—"))
# fmt: on

STATEMENTS = (TENSORIZE,)


# --- the guard -----------------------------------------------------------------------------------


@facets.guard(TENSORIZE)
def guard_tensorize(c: Checker, stmt: Tensorize, block: str) -> None:
    at = c.axis(stmt.axis, block)
    name = stmt.intrin.text
    known = intrinsics()
    intrin = _lookup(name)
    if intrin is None:
        suitable = [n for n, family in known.items() if _fits_target(c.target, family)]
        c.error(
            f"unknown tensor intrinsic `{name}`",
            stmt.intrin.span,
            did_you_mean(name, list(known)),
            one_of(sorted(suitable), f"intrinsics for {c.target.kind}")
            if len(suitable) <= 40
            else f"{len(suitable)} intrinsics suit {c.target.kind}, e.g. "
            + ", ".join(sorted(suitable)[:8]),
        )
        return
    family = known.get(name)
    if family is not None and not _fits_target(c.target, family):
        c.error(
            f"`{name}` is an intrinsic for {_FAMILY_MODULES[family]}, not for {c.target.kind}",
            stmt.intrin.span,
        )
        return
    if family == "cuda":
        sm, needed = _sm(c.target.arch), 70 if name.startswith("wmma") else 80
        c.require(
            sm is None or sm >= needed,
            f"`{name}` needs sm_{needed} or newer; the target is {c.target.arch}",
            stmt.intrin.span,
        )
    shape = describe(intrin.desc)
    if not shape.readable:
        return
    loops = c.nest.loops(block)
    under = loops[loops.index(at) :]
    extents = tuple(x.extent if x.extent is not None else -1 for x in under)
    if extents != shape.extents:
        c.error(
            f"`{name}` computes a {_dims(shape.extents)} loop nest; the loops from "
            f"`{at.name}` inward are {_dims(extents)} "
            f"({', '.join(x.name for x in under)})",
            stmt.axis.span,
            "split the block's loops so that the innermost ones match the intrinsic, and "
            "tensorize the outermost of them",
        )
        return
    realize = c.nest._block(block)
    reads, writes = _accesses(realize.reads), _accesses(realize.writes)
    alike = True
    for what, wanted, found in (("reads", shape.reads, reads), ("writes", shape.writes, writes)):
        if Counter(wanted) != Counter(found):
            alike = False
            c.error(
                f"`{name}` {what} {_buffers(wanted)}; block {block} {what} {_buffers(found)}",
                stmt.intrin.span,
                "the dtypes and memory scopes must be the intrinsic's: cache the buffers in "
                "its scopes (`cache_read A warp`), or pick the intrinsic of these dtypes",
            )
    if alike:
        _check_operand_layouts(c, stmt, intrin, block, under)


def _lookup(name: str) -> Any | None:
    try:
        return intrinsic(name)
    except (RuntimeError, ValueError):
        return None


def _fits_target(target: Target, family: str) -> bool:
    if family in ("cuda", "rocm", "metal"):
        return target.is_gpu and target.kind == {"cuda": "cuda", "rocm": "rocm"}.get(family, family)
    if target.is_gpu:
        return False
    triple = str(target.tvm_config.get("mtriple", ""))
    is_arm = triple.startswith(("aarch64", "arm"))
    if family == "arm_cpu":
        return is_arm
    if family == "x86":
        return not is_arm
    return False


def _dims(extents: tuple[int, ...]) -> str:
    return " x ".join("?" if e < 0 else str(e) for e in extents) or "scalar"


def _buffers(accesses: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{dtype} in {scope}" for dtype, scope in accesses) or "nothing"


# --- operand layouts ----------------------------------------------------------------------------

# A buffer an intrinsic's implementation declares without strides (`T.Buffer((4, 4), "int8",
# offset_factor=1)`, where ldmatrix's declares `strides=("s0", "s1")`) is read as one contiguous
# block from its first element (`B[0, T.Ramp(0, 1, 16)]`): TVM's structural comparison accepts
# any block region of that shape, strided or not, and the kernel then reads the wrong elements
# (issue 47: sdot on an unpacked B, int32 max error 191 on the board). The check below compares,
# point by point, where the description and the block put each element of such a buffer.

Indices = tuple[Any, ...]  # a buffer access's index expressions
_MOST_POINTS = 1 << 14  # past this many points of one operand, TVM's own comparison decides


@dataclass(frozen=True)
class _Side:
    """A description's or a block's view of the tensorized loops: their variables and extents
    (outer first), the loops outside at their first value, the block's iterator bindings, and the
    buffer accesses of its body, in walk order."""

    loop_vars: tuple[Any, ...]
    extents: tuple[int, ...]
    fixed: tuple[tuple[Any, int], ...]
    bindings: tuple[tuple[Any, Any], ...]
    accesses: tuple[tuple[Any, tuple[Any, ...]], ...]


def _check_operand_layouts(
    c: Checker, stmt: Tensorize, intrin: Any, block: str, under: list[Loop]
) -> None:
    theirs, ours = _description_side(intrin.desc), _block_side(c.nest, block, under)
    if theirs is None or len(theirs.accesses) != len(ours.accesses):
        return  # not the same body: TVM's comparison reports it
    if len(intrin.desc.params) != len(intrin.impl.params):
        return
    # The implementation's buffers are the description's, parameter for parameter.
    compact = {
        wanted.name
        for wanted, given in zip(intrin.desc.params, intrin.impl.params, strict=True)
        if not len(wanted.strides) and not len(given.strides)
    }
    checked: set[tuple[str, str]] = set()  # (the intrinsic's buffer, the block's)
    for (wanted, wanted_at), (found, found_at) in zip(theirs.accesses, ours.accesses, strict=True):
        if wanted.name not in compact or (wanted.name, found.name) in checked:
            continue  # a buffer with strides is addressed through them, whatever the layout
        checked.add((wanted.name, found.name))
        problem = _misfit(theirs, wanted, wanted_at, ours, found, found_at)
        if problem is not None:
            c.error(
                f"{problem}: `{stmt.intrin.text}` reads it as one contiguous block, in order",
                stmt.intrin.span,
                _pack_note(wanted, found, found.name in c.param_buffers),
            )


def _misfit(
    theirs: _Side, wanted: Any, wanted_at: Indices, ours: _Side, found: Any, found_at: Indices
) -> str | None:
    """Why the block's region of `found` is not laid out as the description's `wanted`, or None
    (also where that is not plain integer arithmetic to tell)."""
    wanted_strides, found_strides = _strides(wanted), _strides(found)
    if wanted_strides is None or found_strides is None:
        return None
    varying = sorted(_loops_used(theirs, wanted_at) | _loops_used(ours, found_at))
    if math.prod(theirs.extents[i] for i in varying) > _MOST_POINTS:
        return None
    offsets: dict[int, int] = {}  # the description's offset → the block's, from the first point
    base: tuple[int, int] | None = None
    alike = True
    for values in itertools.product(*(range(theirs.extents[i]) for i in varying)):
        point = [0] * len(theirs.extents)
        for i, value in zip(varying, values, strict=True):
            point[i] = value
        want = _offset(theirs, wanted_strides, wanted_at, point)
        got = _offset(ours, found_strides, found_at, point)
        if want is None or got is None:
            return None
        base = base or (want, got)
        offsets[want - base[0]] = got - base[1]
        alike = alike and want - base[0] == got - base[1]
    return None if alike else _why(found.name, wanted, wanted_strides, offsets)


def _why(name: str, wanted: Any, strides: list[int], offsets: dict[int, int]) -> str:
    """What is wrong with a region whose element at the intrinsic's offset o is at `offsets[o]`:
    strided (the block's offsets are the intrinsic's with other strides), or in another order."""
    region = "x".join(str(int(n)) for n in wanted.shape)
    steps = [offsets.get(stride) for stride in strides]  # the block's step along each dimension

    def strided(offset: int) -> int | None:
        total = 0
        for stride, step in zip(strides, steps, strict=True):
            if step is None:
                return None
            total, offset = total + offset // stride * step, offset % stride
        return total

    if steps != strides and all(strided(offset) == got for offset, got in offsets.items()):
        if steps[-1] != 1:
            return f"{name}'s {region} region is strided (its elements {steps[-1]} apart)"
        rows = ", ".join(str(step) for step in steps[:-1])
        return f"{name}'s {region} region is strided (row stride{'s' * (len(steps) > 2)} {rows})"
    first = next((offset for offset, got in sorted(offsets.items()) if got != offset), None)
    if first is None:  # the intrinsic reads one element where the block reads several
        return f"{name}'s {region} region is not laid out as the intrinsic's {region} buffer"
    return (
        f"{name}'s {region} region holds its elements in another order (the intrinsic's "
        f"element {first} is its element {offsets[first]})"
    )


def _pack_note(wanted: Any, found: Any, is_parameter: bool) -> str:
    tile = [int(n) for n in wanted.shape]
    region = "x".join(map(str, tile))
    if is_parameter:
        name = found.name
        how = f"pack it first: `cache_read {name} global`, then `transform_layout {name}_global`"
    else:
        how = f"give it the intrinsic's layout: `transform_layout {found.name}`"
    if len(tile) == 2 and len(found.shape) == 2:
        a, b = tile
        example = f"(x, y) -> (x // {a}, y // {b}, x % {a}, y % {b})"
        return f"{how} with each {region} tile innermost, e.g. `{example}`"
    return f"{how} so that each {region} region is its innermost dimensions, in order"


def _strides(buffer: Any) -> list[int] | None:
    """The buffer's strides in elements, outer first, if constant."""
    from tvm import tirx

    if len(buffer.strides):
        given = list(buffer.strides)
        if all(isinstance(s, tirx.IntImm) for s in given):
            return [int(s) for s in given]
        return None
    if not all(isinstance(n, tirx.IntImm) for n in buffer.shape):
        return None
    strides, step = [], 1
    for extent in reversed(list(buffer.shape)):
        strides.append(step)
        step *= int(extent)
    return strides[::-1]


def _loops_used(side: _Side, indices: Indices) -> set[int]:
    """The positions of the tensorized loops that the indices depend on, through the bindings."""
    from tvm import tirx

    used = {v.__chandle__() for index in indices for v in tirx.analysis.undefined_vars(index)}
    through = {
        v.__chandle__()
        for var, value in side.bindings
        if var.__chandle__() in used
        for v in tirx.analysis.undefined_vars(value)
    }
    return {i for i, var in enumerate(side.loop_vars) if var.__chandle__() in through | used}


def _offset(side: _Side, strides: list[int], indices: Indices, point: list[int]) -> int | None:
    """Where the access `indices` lands, in elements, with the tensorized loops at `point`."""
    from schedlang.lang.nest import folded_value

    loops = [*side.fixed, *zip(side.loop_vars, point, strict=True)]
    iters = []
    for var, value in side.bindings:
        found = folded_value(value, loops)
        if found is None:
            return None
        iters.append((var, found))
    total = 0
    for index, stride in zip(indices, strides, strict=True):
        found = folded_value(index, [*iters, *loops])
        if found is None:
            return None
        total += found * stride
    return total


def _description_side(desc: Any) -> _Side | None:
    from tvm import s_tir, tirx

    loop_vars: list[Any] = []
    extents: list[int] = []
    realize = None
    node = desc.body
    while node is not None:
        if isinstance(node, s_tir.SBlockRealize):
            realize, node = node, node.block.body
        elif isinstance(node, tirx.For) and isinstance(node.extent, tirx.IntImm):
            loop_vars.append(node.loop_var)
            extents.append(int(node.extent))
            node = node.body
        elif isinstance(node, tirx.SeqStmt) and len(node.seq) == 1:
            node = node.seq[0]
        else:
            break
    if realize is None:
        return None
    block = realize.block
    return _Side(
        tuple(loop_vars),
        tuple(extents),
        (),
        tuple(zip([iv.var for iv in block.iter_vars], realize.iter_values, strict=True)),
        tuple(_buffer_accesses(block.body)),
    )


def _block_side(nest: Nest, block: str, under: list[Loop]) -> _Side:
    from tvm import tirx

    realize = nest.realize(block)
    loops = [nest.sch.get(x.rv) for x in nest.loops(block)]
    inner = loops[len(loops) - len(under) :]
    outer = loops[: len(loops) - len(under)]
    return _Side(
        tuple(node.loop_var for node in inner),
        tuple(x.extent if x.extent is not None else -1 for x in under),
        tuple(
            (node.loop_var, int(node.min) if isinstance(node.min, tirx.IntImm) else 0)
            for node in outer
        ),
        tuple(zip([iv.var for iv in realize.block.iter_vars], realize.iter_values, strict=True)),
        tuple(_buffer_accesses(realize.block.body)),
    )


def _buffer_accesses(stmt: Any) -> list[tuple[Any, tuple[Any, ...]]]:
    """The buffers a body stores to and loads from, each with its indices, in a fixed walk order:
    a description and a block TVM finds alike pair up position by position."""
    from tvm import tirx
    from tvm.ir.expr import TensorLoad

    found: list[tuple[Any, tuple[Any, ...]]] = []

    def walk(node: Any) -> None:
        if isinstance(node, tirx.BufferStore):
            found.append((node.buffer, tuple(node.indices)))
        elif isinstance(node, TensorLoad):  # TVM 0.27's buffer load: its buffer is `source`
            found.append((node.source, tuple(node.indices)))
        for name in ("value", "a", "b", "condition", "true_value", "false_value", "body"):
            child = getattr(node, name, None)
            if isinstance(child, (tirx.Expr, tirx.Stmt)):
                walk(child)
        for name in ("args", "seq"):
            for child in getattr(node, name, None) or ():
                if isinstance(child, (tirx.Expr, tirx.Stmt)):
                    walk(child)

    walk(stmt)
    return found


# --- lowering ------------------------------------------------------------------------------------


@facets.lower(TENSORIZE)
def lower_tensorize(nest: Nest, block: str, stmt: Tensorize) -> None:
    intrinsics()
    loops = nest.loops(block)
    at = checked_loop(nest, block, stmt.axis.text)
    inside = [x.name for x in loops[loops.index(at) :]]
    tvm_name = nest.sch.get(nest.block(block)).name_hint
    nest.sch.tensorize(loop(nest, block, stmt.axis), stmt.intrin.text)
    nest.changed()
    for name in inside:
        nest.consumed[(block, name)] = Consumed(
            f"tensorized with {stmt.intrin.text}", stmt.span.line, (f"{tvm_name}_o",)
        )
    # The block is now TVM's `<block>_o`, which holds the intrinsic; schedlang keeps its name.
    for alias, name in list(nest.block_aliases.items()):
        if name == tvm_name:
            nest.block_aliases[alias] = f"{tvm_name}_o"
    if block == tvm_name:
        nest.block_aliases[block] = f"{tvm_name}_o"


@facets.decompile(TENSORIZE, "Tensorize")
def decompile_tensorize(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    if not reader.is_loop(inputs[0]):
        raise Untranslatable("schedlang tensorizes the loops from one inward, not a block")
    block, axis = reader.axis(inputs[0])
    reader.emit(block, Tensorize(nodes.Name(axis), nodes.Name(str(attrs[0]))))
