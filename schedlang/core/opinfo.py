"""An op's loop nest, as `schedlang show` prints it and a model is prompted with it: its blocks,
their loops outer to inner (by loop variable name, which is how the schedule language names axes)
and its buffers (`describe`, `render_show`), its flops (`flop_count`), and the names a schedule of
it may use (`schedule_names`).

The function is read as TVM 0.27 holds it: blocks are `T.sblock`s, a buffer argument is a Var of
BufferType, and a block's read and write regions are `TensorRegion`s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import tvm
import tvm_ffi
from tvm.s_tir.analysis import estimate_tir_flops
from tvm.s_tir.stmt import SBlockRealize
from tvm.tirx import BufferStore, For, IfThenElse, PrimFunc, SeqStmt

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.loader import ParamValue


@dataclass(frozen=True)
class BufferInfo:
    name: str
    shape: tuple[int | str, ...]
    dtype: str
    role: str  # "input" | "output" | "intermediate"

    @property
    def type_text(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class LoopInfo:
    var: str
    extent: int | str  # str only for a symbolic extent
    kind: str  # "spatial" | "reduce"


@dataclass(frozen=True)
class BlockInfo:
    name: str
    loops: tuple[LoopInfo, ...]  # outer to inner, up to the enclosing block
    reads: tuple[str, ...]
    writes: tuple[str, ...]

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(loop.var for loop in self.loops)


@dataclass(frozen=True)
class OpInfo:
    name: str
    path: str | None
    params: dict[str, ParamValue] = field(hash=False)
    buffers: tuple[BufferInfo, ...]
    blocks: tuple[BlockInfo, ...]
    flops: int | None

    def block(self, name: str) -> BlockInfo:
        for block in self.blocks:
            if block.name == name:
                return block
        raise KeyError(name)


class Described(Protocol):
    """What `describe` reads of an op (schedlang.core.ops.Op)."""

    @property
    def name(self) -> str: ...
    @property
    def func(self) -> PrimFunc: ...
    @property
    def path(self) -> str | None: ...
    @property
    def params(self) -> dict[str, ParamValue]: ...


def describe(op_or_func: Described | PrimFunc) -> OpInfo:
    """Blocks (every `T.sblock` but the root, in program order) with their loops, and buffers."""
    if isinstance(op_or_func, PrimFunc | tvm.IRModule):  # as schedlang.core.ops.from_primfunc
        func = root_allocations(as_primfunc(op_or_func))
        name, path, params = function_name(func), None, dict[str, ParamValue]()
    else:
        op = op_or_func
        name, func, path, params = op.name, op.func, op.path, op.params
    blocks: list[BlockInfo] = []
    _collect_blocks(func.body, [], blocks, set(), is_root=True)
    try:
        flops: int | None = flop_count(func)
    except SchedlangError:
        flops = None
    buffers = arg_buffers(func) + [_buffer_info(b, "intermediate") for b in _alloc_buffers(func)]
    return OpInfo(name, path, params, tuple(buffers), tuple(blocks), flops)


def schedule_names(func: PrimFunc) -> dict[str, list[str]]:
    """The names a schedule of `func` may use: its blocks, each block's loop variables (outer to
    inner, block by block) and its buffers, in program order."""
    info = describe(func)
    return {
        "blocks": [block.name for block in info.blocks],
        "loops": [loop.var for block in info.blocks for loop in block.loops],
        "buffers": [buffer.name for buffer in info.buffers],
    }


def flop_count(func: PrimFunc) -> int:
    """Floating point operations, by TVM's estimator (s_tir.analysis.estimate_tir_flops).

    It counts float arithmetic per block times the loop trip counts: a matmul's multiply-add is 2,
    a max reduction 1. Calls (exp, rsqrt), integer index arithmetic and padding selects count
    nothing, so softmax is 4 flops per element, not 5.
    """
    try:
        return int(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception as e:  # symbolic extents, or IR the estimator does not know
        raise SchedlangError(f"cannot count flops: {str(e).strip().splitlines()[0]}") from None


def render_show(info: OpInfo) -> str:
    """The text `schedlang show` prints."""
    where = [info.path] if info.path else []
    where += [f"{k}={v}" for k, v in info.params.items()]
    lines = [f"op {info.name}" + (f" ({', '.join(where)})" if where else ""), "buffers:"]
    name_width = max((len(b.name) for b in info.buffers), default=0)
    type_width = max((len(b.type_text) for b in info.buffers), default=0)
    for b in info.buffers:
        lines.append(f"  {b.name:<{name_width}}  {b.type_text:<{type_width}}  {b.role}")
    for block in info.blocks:
        access = [f"reads {', '.join(block.reads)}"] if block.reads else []
        access += [f"writes {', '.join(block.writes)}"] if block.writes else []
        lines.append(f"block {block.name}  ({'; '.join(access)})")
        var_width = max((len(loop.var) for loop in block.loops), default=0)
        extent_width = max((len(str(loop.extent)) for loop in block.loops), default=0)
        for loop in block.loops:
            lines.append(f"  {loop.var:<{var_width}}  {loop.extent!s:>{extent_width}}  {loop.kind}")
    lines.append(f"flops: {format_flops(info.flops) if info.flops is not None else 'unknown'}")
    return "\n".join(lines)


def format_flops(flops: float) -> str:
    for scale, unit in ((1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "KFLOP")):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:g} FLOP"


def _collect_blocks(
    stmt: Any, loops: list[For], out: list[BlockInfo], stored: set[str], is_root: bool = False
) -> None:
    """Walk statements, tracking the loops since the enclosing block; `stored` gets the names of
    buffers written outside any block (TIR without blocks)."""
    if isinstance(stmt, For):
        _collect_blocks(stmt.body, [*loops, stmt], out, stored)
    elif isinstance(stmt, SBlockRealize):
        block = stmt.block
        if not (is_root and block.name_hint == "root"):
            out.append(_block_info(stmt, loops))
        _collect_blocks(block.body, [], out, stored)
    elif isinstance(stmt, SeqStmt):
        for child in stmt.seq:
            _collect_blocks(child, loops, out, stored)
    elif isinstance(stmt, IfThenElse):
        _collect_blocks(stmt.then_case, loops, out, stored)
        _collect_blocks(stmt.else_case, loops, out, stored)
    elif isinstance(stmt, BufferStore):
        stored.add(stmt.buffer.name)
    elif getattr(stmt, "body", None) is not None:
        _collect_blocks(stmt.body, loops, out, stored)


def _block_info(realize: SBlockRealize, loops: list[For]) -> BlockInfo:
    block = realize.block
    reduce_vars = [
        var
        for iv, value in zip(block.iter_vars, realize.iter_values, strict=True)
        if iv.iter_type != 0  # anything but a data-parallel (spatial) iterator
        for var in tvm.tirx.analysis.undefined_vars(value)
    ]
    return BlockInfo(
        block.name_hint,
        tuple(
            LoopInfo(
                loop.loop_var.name,
                _int_or_text(loop.extent),
                "reduce" if any(loop.loop_var.same_as(v) for v in reduce_vars) else "spatial",
            )
            for loop in loops
        ),
        _unique(_region_buffer(r).name for r in block.reads),
        _unique(_region_buffer(r).name for r in block.writes),
    )


def _region_buffer(region: Any) -> Any:
    # 0.27 spells a block's read/write region `TensorRegion(source=buffer, region=...)`.
    return region.source if hasattr(region, "source") else region.buffer


def _written_buffers(func: PrimFunc) -> set[str]:
    blocks: list[BlockInfo] = []
    stored: set[str] = set()
    _collect_blocks(func.body, [], blocks, stored, is_root=True)
    return stored | {name for block in blocks for name in block.writes}


def read_buffers(func: PrimFunc) -> set[str]:
    """The buffers some block of `func` reads, at any depth."""
    blocks: list[BlockInfo] = []
    _collect_blocks(func.body, [], blocks, set(), is_root=True)
    return {name for block in blocks for name in block.reads}


def arg_buffers(func: PrimFunc) -> list[BufferInfo]:
    written = _written_buffers(func)
    # 0.27 has no buffer_map: a buffer argument is a Var of BufferType that acts as the buffer.
    buffers = [p for p in func.params if isinstance(p.ty, tvm.tirx.BufferType)]
    return [_buffer_info(b, "output" if b.name in written else "input") for b in buffers]


def _alloc_buffers(func: PrimFunc) -> list[Any]:
    return [buffer for realize in block_realizes(func) for buffer in realize.block.alloc_buffers]


def block_realizes(func: PrimFunc) -> Iterator[SBlockRealize]:
    """Every block of `func` where it is realized, outer before inner, in the order of the body."""

    def visit(stmt: Any) -> Iterator[SBlockRealize]:
        if isinstance(stmt, SBlockRealize):
            yield stmt
            yield from visit(stmt.block.body)
        elif isinstance(stmt, SeqStmt):
            for child in stmt.seq:
                yield from visit(child)
        elif isinstance(stmt, IfThenElse):
            yield from visit(stmt.then_case)
            if stmt.else_case is not None:
                yield from visit(stmt.else_case)
        elif getattr(stmt, "body", None) is not None:  # For, AttrStmt, While (a Bind has none)
            yield from visit(stmt.body)

    return visit(func.body)


def _buffer_info(buffer: Any, role: str) -> BufferInfo:
    return BufferInfo(
        buffer.name, tuple(_int_or_text(d) for d in buffer.shape), str(buffer.dtype), role
    )


def _int_or_text(expr: Any) -> int | str:
    return int(expr) if isinstance(expr, tvm.tirx.IntImm | int) else str(expr)


def _unique(names: Iterator[str] | Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


def non_positive_extent(func: PrimFunc) -> tuple[str, int] | None:
    """("buffer `A` float32[-4, 1024]", -4), or the same for a loop; None when all are positive."""
    buffers = arg_buffers(func) + [_buffer_info(b, "intermediate") for b in _alloc_buffers(func)]
    for buffer in buffers:
        for dim in buffer.shape:
            if isinstance(dim, int) and dim <= 0:
                return f"buffer `{buffer.name}` {buffer.type_text}", dim
    blocks: list[BlockInfo] = []
    _collect_blocks(func.body, [], blocks, set(), is_root=True)
    for block in blocks:
        for loop in block.loops:
            if isinstance(loop.extent, int) and loop.extent <= 0:
                return f"loop `{loop.var}` of block `{block.name}` with extent {loop.extent}", (
                    loop.extent
                )
    return None


def as_primfunc(value: Any) -> PrimFunc:
    """`value` if it is a PrimFunc, the one PrimFunc of an IRModule holding only it; else a
    SchedlangError."""
    func = single_primfunc(value)
    if func is None:
        raise SchedlangError(f"expected a PrimFunc, got {type(value).__name__}")
    return func


def function_name(func: PrimFunc) -> str:
    """The symbol a PrimFunc is called by, else "main"."""
    symbol = func.attrs.get("global_symbol") if func.attrs else None
    return str(symbol or "main")


def single_primfunc(value: Any) -> PrimFunc | None:
    if isinstance(value, PrimFunc):
        return value
    if isinstance(value, tvm.IRModule):
        funcs = [f for f in value.functions.values() if isinstance(f, PrimFunc)]
        if len(funcs) == 1 and len(value.functions) == 1:
            return funcs[0]
    return None


def root_allocations(func: PrimFunc) -> PrimFunc:
    """`func` with its function-level `T.alloc_buffer` statements moved into the root block's
    allocations, where `te.create_prim_func` puts them. TVMScript in 0.27 writes them as
    `AllocBuffer` statements, which the schedule primitives do not see as intermediates:
    `cache_write` then drops the buffer, and `reverse_compute_inline` of an epilogue fails
    ("`acc_local` is an output block")."""
    realize = func.body
    if not isinstance(realize, SBlockRealize):
        return func
    block = realize.block
    stmts = list(block.body.seq) if isinstance(block.body, SeqStmt) else [block.body]
    moved = [s for s in stmts if isinstance(s, tvm.tirx.AllocBuffer) and not s.annotations]
    rest = [s for s in stmts if not any(s.same_as(m) for m in moved)]
    if not moved or not rest:
        return func
    root = tvm.s_tir.SBlock(
        block.iter_vars, block.reads, block.writes, block.name_hint,
        rest[0] if len(rest) == 1 else SeqStmt(rest), block.init,
        [*block.alloc_buffers, *(s.buffer for s in moved)], block.match_buffers,
        block.annotations,
    )  # fmt: skip
    return func.with_body(SBlockRealize(list(realize.iter_values), realize.predicate, root))


def index_limits(func: PrimFunc) -> dict[str, int]:
    """For each buffer argument whose values index another buffer (a gather's indices: `take`,
    `index_tensor`), the extent its values must stay below: the smallest extent of a dimension
    they index, directly or through buffers copied from them. Random indices outside it read
    past the buffer (TVM's `take(mode="fast")` does not clamp), and two builds then differ."""
    limits: dict[Any, int] = {}  # keyed by the buffer variable: two buffers may share a name
    copies: list[tuple[Any, list[Any]]] = []  # (buffer stored to, buffers its value loads)

    def loaded(expr: Any) -> list[Any]:
        sources: list[Any] = []

        def record(load: Any) -> Any:
            sources.append(load.source)
            return load  # unchanged: the map only looks

        tvm_ffi.structural_map(expr, [(tvm.ir.TensorLoad, record)])
        return sources

    def visit_load(load: Any) -> Any:
        for index, extent in zip(load.indices, load.source.shape, strict=False):
            if isinstance(extent, tvm.tirx.IntImm):
                for source in loaded(index):
                    limits[source] = min(limits.get(source, int(extent)), int(extent))
        return load

    def visit_store(store: Any) -> Any:
        copies.append((store.buffer, loaded(store.value)))
        return store

    tvm_ffi.structural_map(
        func.body, [(tvm.ir.TensorLoad, visit_load), (tvm.tirx.BufferStore, visit_store)]
    )
    changed = True
    while changed:  # a limit passes from a copy to what it copies (a broadcast of the indices)
        changed = False
        for target, sources in copies:
            for source in sources if target in limits else ():
                if limits.get(source, limits[target] + 1) > limits[target]:
                    limits[source], changed = limits[target], True
    return {param.name: limits[param] for param in func.params if param in limits}
