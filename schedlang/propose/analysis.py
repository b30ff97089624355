"""The loop-nest analysis the recipes share: each block's loops and the loop variables in each
index it reads and writes (`analyse`), and the shapes of computation the rules recognise: a
matmul's roles, a conv's, row-wise blocks, reductions that vectorize; and, for an op of spatial
blocks only, the strides its blocks read once TVM has inlined the intermediate ones (`inlined`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from schedlang.core.opinfo import BlockInfo, LoopInfo, block_realizes, describe
from schedlang.core.ops import Op


@dataclass(frozen=True)
class Access:
    """A block's access to a buffer: the loop variables in each index (`(h, ry)` for `h + ry`)."""

    buffer: str
    dims: tuple[frozenset[str], ...]

    def uses(self, var: str) -> bool:
        return any(var in dim for dim in self.dims)

    @property
    def is_window(self) -> bool:
        return any(len(dim) > 1 for dim in self.dims)


@dataclass(frozen=True)
class Block:
    info: BlockInfo
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    dtype: str  # of what it writes

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def loops(self) -> tuple[LoopInfo, ...]:
        return self.info.loops

    @property
    def spatial(self) -> list[LoopInfo]:
        return [loop for loop in self.loops if loop.kind == "spatial"]

    @property
    def reduce(self) -> list[LoopInfo]:
        return [loop for loop in self.loops if loop.kind == "reduce"]

    def extent(self, var: str) -> int:
        return next(int(loop.extent) for loop in self.loops if loop.var == var)


@dataclass(frozen=True)
class OpView:
    blocks: tuple[Block, ...]
    outputs: frozenset[str]  # buffers the op returns
    exp_blocks: tuple[str, ...] = ()  # blocks computing a float32 exp (`fast_math exp` applies)
    erf_blocks: tuple[str, ...] = ()  # blocks computing a float32 erf (`fast_math erf` applies)
    func: Any = field(default=None, compare=False, repr=False)  # the PrimFunc, for `inlined`
    # Its flops, or the elements its parameters hold where that is more (a copy has no flops).
    work: int = 0

    def producers(self, block: Block) -> list[Block]:
        return [b for b in self.blocks if set(b.info.writes) & set(block.info.reads)]

    def consumers(self, block: Block) -> list[Block]:
        return [b for b in self.blocks if set(b.info.reads) & set(block.info.writes)]

    def is_intermediate(self, block: Block) -> bool:
        return not set(block.info.writes) & self.outputs


def analyse(op: Op) -> OpView | None:
    """The op's blocks with their index expressions; None when an extent is not a constant."""
    info = describe(op)
    if any(isinstance(loop.extent, str) for b in info.blocks for loop in b.loops):
        return None
    accesses = _block_accesses(op.func)
    dtypes = {b.name: b.dtype for b in info.buffers}
    blocks = []
    for block in info.blocks:
        reads, writes = accesses.get(block.name, ((), ()))
        dtype = dtypes.get(block.writes[0], "float32") if block.writes else "float32"
        blocks.append(Block(block, reads, writes, dtype))
    outputs = frozenset(b.name for b in info.buffers if b.role == "output")
    params = [b for b in info.buffers if b.role != "intermediate"]
    work = max(
        info.flops or 0, sum(math.prod(d for d in b.shape if isinstance(d, int)) for b in params)
    )
    from schedlang.lang.fastexp import blocks_computing

    return OpView(
        tuple(blocks),
        outputs,
        tuple(blocks_computing(op.func, "exp")),
        tuple(blocks_computing(op.func, "erf")),
        op.func,
        work,
    )


def _block_accesses(func) -> dict[str, tuple[tuple[Access, ...], tuple[Access, ...]]]:
    import tvm

    def loop_vars(expr) -> frozenset[str]:
        return frozenset(v.name for v in tvm.tirx.analysis.undefined_vars(expr))

    def access(region, iters: dict[str, frozenset[str]]) -> Access:
        buffer = region.source if hasattr(region, "source") else region.buffer
        dims = tuple(
            frozenset().union(*(iters.get(v, {v}) for v in loop_vars(r.min))) for r in region.region
        )
        return Access(buffer.name, dims)

    found: dict[str, tuple[tuple[Access, ...], tuple[Access, ...]]] = {}
    for realize in block_realizes(func):
        block = realize.block
        # Block iterators stand for expressions of the loops around the block.
        iters = {
            iv.var.name: loop_vars(value)
            for iv, value in zip(block.iter_vars, realize.iter_values, strict=True)
        }
        found[block.name_hint] = (
            tuple(access(r, iters) for r in block.reads),
            tuple(access(r, iters) for r in block.writes),
        )
    return found


def epilogue(view: OpView, block: Block) -> Block | None:
    """The elementwise block that only reads `block`'s result, index for index (bias, ReLU, a
    cast): it can be folded into the write-back block of `block`'s `cache_write`."""
    consumers = view.consumers(block)
    if len(consumers) != 1 or len(block.writes) != 1:
        return None
    after = consumers[0]
    if after.reduce or len(after.writes) != 1 or view.producers(after) != [block]:
        return None
    reads = [a for a in after.reads if a.buffer == block.writes[0].buffer]
    return after if reads and all(a.dims == after.writes[0].dims for a in reads) else None


def epilogue_chain(view: OpView, block: Block) -> list[Block]:
    """The elementwise blocks after `block`, each the `epilogue` of the one before (bias, then a
    residual add, then ReLU): all of them fold into the write-back of `block`'s `cache_write`."""
    chain: list[Block] = []
    while (after := epilogue(view, chain[-1] if chain else block)) is not None:
        chain.append(after)
    return chain


def reduction_block(view: OpView) -> Block | None:
    """The op's one reduction block, when it has exactly one (a matmul's, a conv's)."""
    main = [b for b in view.blocks if b.reduce]
    return main[0] if len(main) == 1 else None


def matmul_of(view: OpView) -> tuple[Block, MatmulRoles] | None:
    """The op's matmul block and its roles, when the op is a matmul (plus its epilogue)."""
    block = reduction_block(view)
    roles = matmul_roles(block) if block else None
    return (block, roles) if block and roles else None


def conv_of(view: OpView) -> tuple[Block, ConvRoles] | None:
    """The op's conv block and its roles, when the op is a conv (plus padding and epilogue)."""
    block = reduction_block(view)
    roles = conv_roles(view, block) if block else None
    return (block, roles) if block and roles else None


@dataclass(frozen=True)
class MatmulRoles:
    a: str  # the input read without the column axis
    b: str  # the input read with it: packed on CPU
    i: str  # row axis: in A and C
    j: str  # column axis: innermost spatial, in B and C
    outer: tuple[str, ...]  # other spatial axes (batch), outermost
    k: str  # the innermost reduction axis: split and unrolled
    outer_reduce: tuple[str, ...]

    def tile_dims(self, access: Access) -> int:
        """How many dimensions a tile of the input `access` reads spans: those indexed by the
        row, column or reduction axes, not a batch axis (the loops of its cached copy)."""
        axes = {self.i, self.j, self.k, *self.outer_reduce}
        return sum(1 for dim in access.dims if dim & axes and not dim & set(self.outer))


# What `matmul_roles` recognises, in the words of `schedlang tune --list-templates`.
MATMUL_SHAPE = (
    "a reduction of two inputs indexed by single loops, e.g. C[i, j] += A[i, k] * B[k, j] "
    "(batch axes and an elementwise epilogue such as bias + ReLU included)"
)


def matmul_roles(block: Block) -> MatmulRoles | None:
    spatial, reduce = block.spatial, block.reduce
    if len(spatial) < 2 or not reduce or len(block.reads) != 2 or len(block.writes) != 1:
        return None
    if any(a.is_window for a in (*block.reads, *block.writes)):
        return None
    if len({a.buffer for a in block.reads}) != 2:
        return None
    j = spatial[-1].var
    out = block.writes[0]
    with_j = [a for a in block.reads if a.uses(j)]
    if len(with_j) != 1 or not out.dims or j not in out.dims[-1]:
        return None
    b = with_j[0]
    a = next(x for x in block.reads if x is not b)
    rows = [s.var for s in spatial if a.uses(s.var) and not b.uses(s.var)]
    k = reduce[-1].var
    if not rows or not (a.uses(k) and b.uses(k)):
        return None
    i = rows[-1]
    outer = tuple(s.var for s in spatial if s.var not in (i, j))
    outer_reduce = tuple(r.var for r in reduce[:-1])
    return MatmulRoles(a.buffer, b.buffer, i, j, outer, k, outer_reduce)


@dataclass(frozen=True)
class ConvRoles:
    data: str  # the buffer read through a window
    pad: str | None  # the spatial block producing it (padding), if any
    channel: str | None  # output-channel axis: in the weights, not the data
    row: str | None  # the window axis outside `col`
    col: str  # the innermost spatial axis: vectorized
    outer: tuple[str, ...]  # other spatial axes
    reduce: tuple[str, ...]


def conv_roles(view: OpView, block: Block) -> ConvRoles | None:
    spatial = block.spatial
    windows = [a for a in block.reads if a.is_window]
    if not block.reduce or len(spatial) < 2 or len(windows) != 1:
        return None
    data = windows[0]
    others = [a for a in block.reads if a is not data]
    window_vars = {v for dim in data.dims if len(dim) > 1 for v in dim}
    col = spatial[-1].var
    rows = [s.var for s in spatial[:-1] if s.var in window_vars]
    weighted = {s.var for s in spatial if any(a.uses(s.var) for a in others)}
    channels = [s.var for s in spatial if s.var in weighted and not data.uses(s.var)]
    row = rows[-1] if rows else None
    channel = channels[-1] if channels else None
    outer = tuple(s.var for s in spatial if s.var not in (row, col, channel))
    pads = [
        p
        for p in view.producers(block)
        if data.buffer in p.info.writes and not p.reduce and view.is_intermediate(p)
    ]
    pad = pads[0].name if len(pads) == 1 else None
    return ConvRoles(data.buffer, pad, channel, row, col, outer, tuple(r.var for r in block.reduce))


def row_blocks(view: OpView, cores: int) -> bool:
    """Several blocks over the same rows, enough of them to feed the cores, the last block
    consuming all the others. The rows are the last block's loops but its innermost (a layer
    norm's (1, 128) of 1 x 128 x 768, a softmax's (1, 12, 128)); every block's loops start with
    loops of the same extents, then at most one more (the row's inner axis, or its reduction)."""
    blocks = view.blocks
    last = blocks[-1]
    if len(blocks) < 2 or len(last.loops) < 2 or last.reduce:
        return False
    rows = row_extents(last)
    for block in blocks:
        head = block.loops[: len(rows)]
        if len(block.loops) > len(rows) + 1 or any(loop.kind != "spatial" for loop in head):
            return False
        if tuple(int(loop.extent) for loop in head) != rows:
            return False
    if math.prod(rows) < 2 * cores:
        return False
    needed, frontier = set(), [last]
    while frontier:
        block = frontier.pop()
        for producer in view.producers(block):
            if producer.name not in needed:
                needed.add(producer.name)
                frontier.append(producer)
    return needed == {b.name for b in blocks[:-1]}


def row_extents(block: Block) -> tuple[int, ...]:
    """The extents of a row-wise block's row loops: all its loops but the innermost."""
    return tuple(int(loop.extent) for loop in block.loops[:-1])


def vector_reduction(block: Block, lanes: int) -> bool:
    """A reduction whose innermost loop is a reduction axis of whole vectors, contiguous in
    what it reads: `rfactor` turns it into lanes of partial results (measured 6-12x faster
    than a scalar row sum)."""
    return (
        bool(block.reduce)
        and block.loops[-1].kind == "reduce"
        and (block.extent(block.loops[-1].var) % lanes == 0 and lanes > 1)
        and contiguous_axis(block) in (None, block.loops[-1].var)
    )


def contiguous_axis(block: Block) -> str | None:
    """The loop variable every read's last index is, when they agree: the axis along which the
    block reads memory contiguously."""
    last = {dim for a in block.reads if a.dims for dim in a.dims[-1:]}
    if len(last) == 1 and len(dim := next(iter(last))) == 1:
        return next(iter(dim))
    return None


def strided_reduction(block: Block, lanes: int) -> bool:
    """A reduction over an axis other than the contiguous one (a 3-D sum over axis 1, a column
    sum): the contiguous axis is the output's innermost spatial axis, so the reduction goes
    outside it and the output axis vectorizes (measured 6-7x the unscheduled build on a
    256x512x256 fp32 sum over axis 1, against 1x for the fused-spatial template)."""
    if not block.reduce or not block.spatial or lanes <= 1:
        return False
    inner = block.spatial[-1].var
    out = block.writes[0] if len(block.writes) == 1 else None
    return (
        contiguous_axis(block) == inner
        and out is not None
        and bool(out.dims)
        and inner in out.dims[-1]
        and block.extent(inner) % lanes == 0
    )


@dataclass(frozen=True)
class Inlined:
    """An all-spatial op with its intermediate blocks inlined, as far as TVM lets them be."""

    blocks: tuple[str, ...]  # the blocks inlined, producers first
    strides: dict[str, tuple[int | None, ...]]  # per block left, per read (see `read_strides`)


def inlined(view: OpView) -> Inlined:
    """Each intermediate spatial block inlined into its readers by TVM (`sch.compute_inline`),
    producers first, skipping those TVM refuses (a block that is not a single store, say); the
    strides of what the blocks left read, once the inlined expressions stand in their reads."""
    from tvm import s_tir

    sch = s_tir.Schedule(view.func)
    done: list[str] = []
    for block in view.blocks:
        if block.reduce or not view.is_intermediate(block) or _costly_broadcast(view, block, sch):
            continue
        try:
            sch.compute_inline(sch.get_sblock(block.name))
        except Exception:  # noqa: BLE001 - TVM refused: scheduled on its own instead
            continue
        done.append(block.name)
    return Inlined(tuple(done), read_strides(sch.mod["main"]))


# Calls that cost tens of cycles an element (libm's, or their polynomials).
_MATH_CALLS = ("pow", "exp", "log", "cos", "sin", "tan", "tanh", "erf", "sqrt")


def _costly_broadcast(view: OpView, block: Block, sch: Any) -> bool:
    """Whether `block` computes a math call (cos, pow, ...) that a reader reads broadcast (along
    a loop of its own of more than one iteration that the read's indices do not use): inlined,
    the call would run once per element of the reader, not once per element of the block (a
    rotary embedding's cosines per token and frequency, read by every head)."""
    import tvm
    import tvm_ffi

    names: set[str] = set()

    def visit(call: Any) -> Any:  # structural_map's callbacks take and return TVM objects
        if isinstance(call.op, tvm.ir.Op):
            names.add(call.op.name)
        return call

    tvm_ffi.structural_map(sch.get(sch.get_sblock(block.name)).body, [(tvm.ir.Call, visit)])
    if not names & {f"tirx.{name}" for name in _MATH_CALLS}:
        return False
    for reader in view.consumers(block):
        for access in reader.reads:
            if access.buffer not in block.info.writes:
                continue
            if any(loop.extent != 1 and not access.uses(loop.var) for loop in reader.spatial):
                return True
    return False


def read_strides(func) -> dict[str, tuple[int | None, ...]]:
    """Per block, per buffer it reads: how many elements the address moves when the block's
    innermost loop of more than one iteration goes from 0 to 1, the other loops at 0 (1 for a
    contiguous read, 0 for a broadcast one, the row length for a transposed one), or None
    where that is not a constant."""
    import tvm
    from tvm.s_tir.stmt import SBlockRealize

    found: dict[str, tuple[int | None, ...]] = {}

    def visit(stmt, loops: list) -> None:
        if isinstance(stmt, SBlockRealize):
            inner = next((v for v, n in reversed(loops) if n > 1), None)
            found[stmt.block.name_hint] = tuple(
                _step(stmt, region, loops, inner) for region in stmt.block.reads
            )
            visit(stmt.block.body, [])
        elif isinstance(stmt, tvm.tirx.SeqStmt):
            for child in stmt.seq:
                visit(child, loops)
        elif isinstance(stmt, tvm.tirx.For):
            extent = stmt.extent.value if isinstance(stmt.extent, tvm.tirx.IntImm) else 0
            visit(stmt.body, [*loops, (stmt.loop_var, extent)])
        elif isinstance(stmt, tvm.tirx.IfThenElse):
            visit(stmt.then_case, loops)
            visit(stmt.else_case, loops)
        elif getattr(stmt, "body", None) is not None:  # AttrStmt, While (a Bind has none)
            visit(stmt.body, loops)

    visit(func.body, [])
    return found


def _step(realize, region, loops: list, inner) -> int | None:
    """The element offset `region` reads at inner = 1 less that at inner = 0 (see
    `read_strides`)."""
    import tvm

    if inner is None:
        return 0
    buffer = region.source if hasattr(region, "source") else region.buffer
    shape = [int(x) for x in buffer.shape if isinstance(x, tvm.tirx.IntImm)]
    if len(shape) < len(buffer.shape):  # a symbolic dimension
        return None
    offsets = []
    for at in (0, 1):
        analyzer = tvm.sym.Analyzer()
        for var, _ in loops:
            analyzer.bind(var, tvm.tirx.IntImm(str(var.ty), int(var.same_as(inner)) * at))
        for iv, value in zip(realize.block.iter_vars, realize.iter_values, strict=True):
            analyzer.bind(iv.var, analyzer.simplify(value))
        offset = 0
        for r, extent in zip(region.region, shape, strict=True):
            index = analyzer.simplify(r.min)
            if not isinstance(index, tvm.tirx.IntImm):
                return None
            offset = offset * extent + index.value
        offsets.append(offset)
    return offsets[1] - offsets[0]
