"""Proposers: where the tuner's schedule templates come from.

A proposer reads an op and a target and writes schedlang text: templates with `param` knobs, which
the tuner searches, or concrete schedules. The built-in proposer needs no model. It looks at the
op's loop nest (`schedlang.ops.describe` plus each block's index expressions), recognises a few
shapes of computation, and writes for each the recipe that makes that shape fast:

    matmul-like   a reduction of two inputs indexed by single loops (C[i, j] += A[i, k] * B[k, j]):
                  cache tiles, a register tile accumulated in `local`, B packed per column panel,
                  vectorized over the columns, parallel over the tiles (CPU); a shared-memory
                  tiled kernel with a register tile per thread and cooperative fetching (GPU).
    conv-like     a reduction reading a window (pad[h + ry, w + rx]): the padding computed per
                  parallel task or inlined, an output-channel x row x column register tile (CPU);
                  one thread per output (GPU).
    row-wise      several blocks over the same rows (softmax, layer norm): every block computed per
                  row inside one parallel row loop, reductions split (rfactor) to vectorize (CPU);
                  one thread block per row with a cross-thread reduction (GPU).
    anything else per block: fused spatial loops split into parallel chunks and vector lanes, a
                  reduction split into vector lanes by rfactor (CPU); thread blocks of threads,
                  a long reduction across threads (GPU).

An elementwise epilogue of a matmul or conv (bias, ReLU) is folded into the write-back block of its
`cache_write`. Templates come best first, and so do each knob's values: the first point is the
recipe's measured default. Knob values divide the loop extents they split, so templates need no
guards, and each template is checked at its first knob values before it is proposed: one that
fails is dropped, with the reason logged and kept in `BuiltinProposer.dropped`.

    proposer = BuiltinProposer()
    for proposal in proposer.templates(Context(op, resolve_target("llvm"))):
        print(proposal.note)
        print(proposal.text)
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from schedlang.ops import BlockInfo, LoopInfo, Op, describe
from schedlang.target import Target

if TYPE_CHECKING:
    from schedlang.db import Record

log = logging.getLogger(__name__)


# --- the interface --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    op: Op
    target: Target
    hint: str | None = None


@dataclass(frozen=True)
class Proposal:
    text: str  # schedlang text: a template (with `param` knobs) or a concrete schedule
    proposer: str  # "builtin", "model:<id>", …
    note: str = ""  # one line: what the template is
    extra: dict = field(default_factory=dict)


class Proposer(Protocol):
    name: str

    def propose(self, context: Context, history: Sequence[Record], count: int) -> list[Proposal]:
        """At most `count` proposals not returned before; [] when there is nothing more."""
        ...


class BuiltinProposer:
    """Templates written from the op's loop nest by the rules of this module, best first.

    The templates depend only on the op and the target: `history` and `Context.hint` are not
    used. `propose` hands out each template once per (op, target) and then returns [].
    """

    name = "builtin"

    def __init__(self) -> None:
        self._templates: dict[tuple[str, str], list[Proposal]] = {}
        self._returned: dict[tuple[str, str], set[str]] = {}
        self.dropped: list[Proposal] = []  # templates that failed their check; note says why

    def templates(self, context: Context) -> list[Proposal]:
        key = _context_key(context)
        if key not in self._templates:
            self._templates[key] = self._checked(context)
        return list(self._templates[key])

    def propose(self, context: Context, history: Sequence[Record], count: int) -> list[Proposal]:
        returned = self._returned.setdefault(_context_key(context), set())
        fresh = [p for p in self.templates(context) if p.text not in returned][: max(count, 0)]
        returned.update(p.text for p in fresh)
        return fresh

    def _checked(self, context: Context) -> list[Proposal]:
        kept = []
        for draft in write_templates(context.op, context.target):
            proposal = Proposal(
                draft.text,
                self.name,
                draft.note,
                {"family": draft.family, "space": draft.space},
            )
            problem = first_point_problem(proposal.text, context.op, context.target)
            if problem is None:
                kept.append(proposal)
                continue
            log.warning(
                "dropped builtin template %s for %s: %s", draft.family, context.op.name, problem
            )
            self.dropped.append(
                Proposal(
                    proposal.text,
                    self.name,
                    f"dropped ({draft.note}): {problem}",
                    {**proposal.extra, "dropped": problem},
                )
            )
        return kept


def _context_key(context: Context) -> tuple[str, str]:
    # The printed function, not a structural hash: templates name its blocks, loops and buffers.
    return context.op.func.script(), context.target.key


def first_point_problem(text: str, op: Op, target: Target) -> str | None:
    """None when `text` parses, is canonical and checks clean at its first knob values; else
    the first diagnostic, on one line."""
    from schedlang.check import check
    from schedlang.diagnostics import SchedlangError
    from schedlang.printer import format_schedule
    from schedlang.syntax import parse

    try:
        schedule = parse(text, "<builtin>")
    except SchedlangError as err:
        return " ".join(err.render().split())
    if format_schedule(schedule) != text:
        return "not canonically formatted"
    result = check(schedule, op.func, target)
    errors = [d for d in result.diagnostics if d.is_error]
    if errors:
        where = f"line {errors[0].span.line}: " if errors[0].span else ""
        return where + errors[0].message
    return None


# --- what the loop nest looks like ----------------------------------------------------------------


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
    return OpView(tuple(blocks), outputs)


def _block_accesses(func) -> dict[str, tuple[tuple[Access, ...], tuple[Access, ...]]]:
    import tvm
    from tvm.s_tir.stmt import SBlockRealize
    from tvm.tirx import SeqStmt

    found: dict[str, tuple[tuple[Access, ...], tuple[Access, ...]]] = {}

    def loop_vars(expr) -> frozenset[str]:
        return frozenset(v.name for v in tvm.tirx.analysis.undefined_vars(expr))

    def visit(stmt) -> None:
        if isinstance(stmt, SBlockRealize):
            block = stmt.block
            # Block iterators stand for expressions of the loops around the block.
            iters = {
                iv.var.name: loop_vars(value)
                for iv, value in zip(block.iter_vars, stmt.iter_values, strict=True)
            }

            def access(region) -> Access:
                buffer = region.source if hasattr(region, "source") else region.buffer
                dims = tuple(
                    frozenset().union(*(iters.get(v, {v}) for v in loop_vars(r.min)))
                    for r in region.region
                )
                return Access(buffer.name, dims)

            found[block.name_hint] = (
                tuple(access(r) for r in block.reads),
                tuple(access(r) for r in block.writes),
            )
            visit(block.body)
        elif isinstance(stmt, SeqStmt):
            for child in stmt.seq:
                visit(child)
        elif getattr(stmt, "body", None) is not None:
            visit(stmt.body)

    visit(func.body)
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


# --- knob candidates ------------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def pick(
    extent: int, preferred: Sequence[int], *, multiple_of: int = 1, most: int = 4
) -> list[int]:
    """Values of `preferred` that divide `extent` and are multiples of `multiple_of`, at most
    `most` of them, in the order given. When none is, the largest divisor of `extent` (a multiple
    of `multiple_of`) up to the largest preferred value, else `extent` itself: a template never
    needs a guard."""
    values = [v for v in preferred if v <= extent and extent % v == 0 and v % multiple_of == 0]
    if values:
        return values[:most]
    fitting = [d for d in divisors(extent) if d % multiple_of == 0 and d <= max(preferred)]
    if fitting:
        return [fitting[-1]]
    return [extent]


class _Writer:
    """Collects knobs and sections, and prints a template the way `schedlang fmt` does."""

    def __init__(self, note: str, family: str):
        self.note = note
        self.family = family
        self.params: dict[str, list[int]] = {}
        self.sections: list[tuple[str, list[str]]] = []

    def factor(self, name: str, values: Sequence[int]) -> str:
        """A knob over `values`, or the literal when there is one value. Sections asking for the
        same knob over the same values share it."""
        values = list(dict.fromkeys(values))
        if len(values) == 1:
            return str(values[0])
        unique, n = name, 2
        while unique in self.params and self.params[unique] != values:
            unique, n = f"{name}{n}", n + 1
        self.params[unique] = values
        return unique

    def section(self, block: str) -> list[str]:
        lines: list[str] = []
        self.sections.append((block, lines))
        return lines

    def draft(self) -> Draft:
        from schedlang.printer import format_schedule
        from schedlang.syntax import parse

        out = [f"# {self.note} (builtin proposer)"]
        out += [f"param {k} in [{', '.join(map(str, v))}]" for k, v in self.params.items()]
        for block, lines in self.sections:
            if lines:
                out += ["", f"block {block}:", *(f"  {line}" for line in lines)]
        text = format_schedule(parse("\n".join(out) + "\n", "<builtin>"))
        return Draft(text, self.note, self.family, math.prod(len(v) for v in self.params.values()))


@dataclass(frozen=True)
class Draft:
    text: str
    note: str
    family: str
    space: int  # knob points


def _tile(*factors: str) -> str:
    return " x ".join(factors)


def _knob_suffix(block: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", block).upper()


# --- which recipes apply --------------------------------------------------------------------------


def write_templates(op: Op, target: Target) -> list[Draft]:
    """Every template the rules give for `op` on `target`, best first (unchecked)."""
    view = analyse(op)
    if view is None or not view.blocks:
        return []
    writers = _gpu_recipes(view, target) if target.is_gpu else _cpu_recipes(view, target)
    return [w.draft() for w in writers if w is not None]


@dataclass(frozen=True)
class MatmulRoles:
    a: str  # the input read without the column axis
    b: str  # the input read with it: packed on CPU
    i: str  # row axis: in A and C
    j: str  # column axis: innermost spatial, in B and C
    outer: tuple[str, ...]  # other spatial axes (batch), outermost
    k: str  # the innermost reduction axis: split and unrolled
    outer_reduce: tuple[str, ...]


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
    """Several blocks over the same rows, each of them (row, one inner axis), enough rows to feed
    the cores, and the last block consuming all the others."""
    blocks = view.blocks
    if len(blocks) < 2 or any(len(b.loops) != 2 or b.loops[0].kind != "spatial" for b in blocks):
        return False
    rows = {b.loops[0].extent for b in blocks}
    if len(rows) != 1 or int(blocks[0].loops[0].extent) < 2 * cores:
        return False
    last = blocks[-1]
    needed, frontier = set(), [last]
    while frontier:
        block = frontier.pop()
        for producer in view.producers(block):
            if producer.name not in needed:
                needed.add(producer.name)
                frontier.append(producer)
    return needed == {b.name for b in blocks[:-1]} and not last.reduce


# --- CPU ------------------------------------------------------------------------------------------


def _cpu_recipes(view: OpView, target: Target) -> list[_Writer | None]:
    main = [b for b in view.blocks if b.reduce]
    if len(main) == 1 and (roles := matmul_roles(main[0])):
        block = main[0]
        return [
            _cpu_matmul(view, block, roles, target, packed=True),
            _cpu_matmul(view, block, roles, target, packed=False),
        ]
    if len(main) == 1 and (conv := conv_roles(view, main[0])):
        block = main[0]
        recipes = [_cpu_conv(view, block, conv, target, inline_pad=False)]
        if conv.pad:
            recipes.append(_cpu_conv(view, block, conv, target, inline_pad=True))
        return recipes
    if row_blocks(view, target.cores):
        return [_cpu_rows(view, target), _cpu_generic(view, target)]
    lanes = {b.name: target.vector_lanes(b.dtype) for b in view.blocks}
    if any(_vector_reduction(b, lanes[b.name]) for b in view.blocks):
        return [_cpu_generic(view, target, rfactor=True), _cpu_generic(view, target)]
    return [_cpu_generic(view, target)]


def _vector_reduction(block: Block, lanes: int) -> bool:
    """A reduction whose innermost loop is a reduction axis of whole vectors: `rfactor` turns
    it into lanes of partial results (measured 6-12x faster than a scalar row sum)."""
    return (
        bool(block.reduce)
        and block.loops[-1].kind == "reduce"
        and (block.extent(block.loops[-1].var) % lanes == 0 and lanes > 1)
    )


def _cpu_matmul(
    view: OpView, block: Block, r: MatmulRoles, target: Target, packed: bool
) -> _Writer:
    lanes = target.vector_lanes(block.dtype)
    m, n, k = block.extent(r.i), block.extent(r.j), block.extent(r.k)
    what = "packed B, " if packed else ""
    w = _Writer(
        f"{_matmul_label(block)}: {what}RI x RJ register tile in TI x TJ tiles, k unrolled by KU",
        "matmul_packed" if packed else "matmul_tiled",
    )
    # A 4x16 fp32 tile is 8 AVX2 accumulators; 8 x 2 vectors is the most that stays in registers.
    # Measured at 1024^3 fp32 on a 2-core znver3 (AVX2): 4 x 16 is best, 8 x 8 and 2 x 32 close;
    # 8 x 16 (16 accumulators) spills. Every list is best first: the first point is the default.
    ri_values = pick(m, [4, 8, 2], most=2)
    rj_values = pick(n, [2 * lanes, lanes], multiple_of=lanes if n % lanes == 0 else 1)
    tj_values = pick(n, [64, 32, 16, 128], multiple_of=max(rj_values), most=3)
    ri = w.factor("RI", ri_values)
    rj = w.factor("RJ", rj_values)
    ti = w.factor("TI", pick(m, [256, 128, 64, 32], multiple_of=max(ri_values), most=3))
    tj = w.factor("TJ", tj_values)
    ku = w.factor("KU", pick(k, [8, 4, 1], most=3))
    steps = w.factor("U", [16, 64])

    s = w.section(block.name)
    s.append(f"tile {r.i}, {r.j} by {_tile(ti, tj)}")
    s.append(f"tile {r.i}.i, {r.j}.i by {_tile(ri, rj)}  # the register tile")
    s.append(f"split {r.k} by {ku}")
    tiles = [f"{r.i}.o", f"{r.j}.o", f"{r.i}.i.o", f"{r.j}.i.o"]
    inner = [f"{r.k}.o", f"{r.k}.i", f"{r.i}.i.i", f"{r.j}.i.i"]
    s.append(f"reorder {', '.join([*r.outer, *tiles, *r.outer_reduce, *inner])}")
    if packed:
        s.append(f"cache_read {r.b} global at {r.j}.o  # {r.b}'s TJ-column panel, contiguous")
    s.append(f"cache_write {block.name} local at {r.j}.i.o  # accumulate in registers")
    if folded := epilogue(view, block):
        s.append(f"reverse_compute_inline {folded.name}  # computed as the tile is written back")
    s.append(f"unroll {r.k}.i")
    s.append(f"unroll {r.i}.i.i")
    s.append(f"vectorize {r.j}.i.i")
    s.append(f"fuse {', '.join([*r.outer, f'{r.i}.o', f'{r.j}.o'])} as tiles")
    s.append("parallel tiles")
    s.append(f"pragma tiles auto_unroll_max_step={steps}, unroll_explicit=1")
    s.append(f"decompose_reduction at {(r.outer_reduce or (f'{r.k}.o',))[0]}")
    if packed:
        # The copy loops: one per dimension of the panel longer than 1.
        b_access = next(a for a in block.reads if a.buffer == r.b)
        long_dims = sum(
            1
            for dim in b_access.dims
            if dim & {r.j, r.k, *r.outer_reduce} and not dim & set(r.outer)
        )
        copy, axis = w.section(f"{r.b}_global"), f"ax{long_dims - 1}"
        if max(tj_values) > lanes and all(t % lanes == 0 for t in tj_values):
            copy.append(f"split {axis} by {lanes}")  # a panel row is several vectors
            axis += ".i"
        copy.append(f"vectorize {axis}")
    if min(ri_values) > 1 and min(rj_values) > 1:
        w.section(f"{block.name}_local").append("vectorize ax1")
    _cpu_other_blocks(w, view, target, done={block.name, getattr(folded, "name", "")})
    return w


def _matmul_label(block: Block) -> str:
    return f"{block.name} (matmul)"


def _cpu_conv(
    view: OpView, block: Block, r: ConvRoles, target: Target, inline_pad: bool
) -> _Writer:
    lanes = target.vector_lanes(block.dtype)
    # A short reduction per output (a depthwise 3x3: 9 multiply-adds) does not pay for a local
    # accumulator and its write-back: measured 2x slower on the 128-channel 56x56 depthwise conv.
    window = math.prod(block.extent(v) for v in r.reduce)
    accumulate = window > 32
    # Measured on the 56x56 64->64 3x3 conv (znver3): WT must be whole vectors (7, 14 or 28
    # lanes ran 3-10x slower than 8); KT x HT x WT/lanes near 8 accumulators is best (4 x 2 x 1).
    col = block.extent(r.col)
    wt_values = pick(col, [lanes, 2 * lanes], multiple_of=min(lanes, col))
    kt_values = pick(block.extent(r.channel), [4, 8, 2], most=3) if r.channel else []
    ht_values = pick(block.extent(r.row), [2, 4, 1], most=3) if r.row else []
    tile = [name for name, values in (("KT", kt_values), ("HT", ht_values)) if values]
    pad = "padding inlined" if inline_pad else "padding computed per parallel task"
    w = _Writer(
        f"{block.name} (conv): {pad}, {' x '.join([*tile, 'WT'])} output tile vectorized over "
        f"{r.col}" + (", accumulated in registers" if accumulate else ""),
        "conv_inline_pad" if inline_pad else "conv",
    )
    wt = w.factor("WT", wt_values)
    kt = w.factor("KT", kt_values) if r.channel else None
    ht = w.factor("HT", ht_values) if r.row else None

    s = w.section(block.name)
    if kt:
        s.append(f"split {r.channel} by {kt}")
    if ht:
        s.append(f"split {r.row} by {ht}")
    s.append(f"split {r.col} by {wt}")
    outer = list(r.outer)
    # Parallel over the outer axes and the row blocks, unless the outer axes alone (a depthwise
    # conv's channels) give every core several tasks: then each task pads whole channels.
    outer_extent = math.prod(block.extent(v) for v in r.outer)
    if r.row and (accumulate or outer_extent < 4 * target.cores):
        outer.append(f"{r.row}.o")
        rows_inside = []
    else:
        rows_inside = [f"{r.row}.o"] if r.row else []
    tiles = [*rows_inside, *([f"{r.channel}.o"] if r.channel else []), f"{r.col}.o"]
    inner = [f"{axis}.i" for axis in (r.channel, r.row, r.col) if axis]
    s.append(f"reorder {', '.join([*outer, *tiles, *r.reduce, *inner])}")
    if len(outer) > 1:
        s.append(f"fuse {', '.join(outer)} as tasks")
        par = "tasks"
    else:
        par = outer[0] if outer else tiles[0]
    s.append(f"parallel {par}")
    folded = epilogue(view, block) if accumulate else None
    if accumulate:
        s.append(f"cache_write {block.name} local at {r.col}.o  # accumulate in registers")
    if folded:
        s.append(f"reverse_compute_inline {folded.name}  # computed as the tile is written back")
    if r.pad and inline_pad:
        s.append(f"compute_inline {r.pad}")
    elif r.pad:
        s.append(f"compute_at {r.pad} {par}  # the padded input this task reads")
    s.append(f"vectorize {r.col}.i")
    if kt:
        s.append(f"unroll {r.channel}.i")
    if ht:
        s.append(f"unroll {r.row}.i")
    for axis in r.reduce if not accumulate else r.reduce[-1:]:
        if block.extent(axis) <= 16:
            s.append(f"unroll {axis}")
    if accumulate:
        s.append(f"decompose_reduction at {r.reduce[0]}")
    done = {block.name, r.pad or "", getattr(folded, "name", "")}
    _cpu_other_blocks(w, view, target, done=done)
    return w


def _cpu_rows(view: OpView, target: Target) -> _Writer:
    """Every block computed per row inside the last block's parallel row loop."""
    last = view.blocks[-1]
    lanes = target.vector_lanes(last.dtype)
    names = ", ".join(b.name for b in view.blocks)
    w = _Writer(f"row-wise {names}: one parallel row loop, rows vectorized by V", "rows")
    cols = {int(b.loops[1].extent) for b in view.blocks}
    vec = [v for v in (lanes, 2 * lanes, 4 * lanes) if all(c % v == 0 for c in cols)]
    v = w.factor("V", vec or [1])
    reductions = [b for b in view.blocks if b.reduce]
    lengths = {int(b.loops[1].extent) for b in reductions}
    rs_values = [v for v in (lanes, 2 * lanes) if all(n % v == 0 for n in lengths)]
    rs = w.factor("RS", rs_values) if rs_values else None
    if rs:
        for block in reductions:  # partial sums over RS lanes, so the reduction vectorizes
            s = w.section(block.name)
            s.append(f"split {block.loops[1].var} by {rs}")
            s.append(f"rfactor {block.loops[1].var}.i")
    row, col = last.loops[0].var, last.loops[1].var
    s = w.section(last.name)
    if vec:
        s.append(f"split {col} by {v}")
    s.append(f"parallel {row}")
    if vec:
        s.append(f"vectorize {col}.i")
    moved: list[str] = []
    for block in reversed(view.blocks[:-1]):
        moved.append(block.name)
        if rs and block.reduce:
            moved.append(f"{block.name}_rf")
    for name in moved:
        s.append(f"compute_at {name} {row}")
    for block in reversed(view.blocks[:-1]):
        if not block.reduce and vec:
            section = w.section(block.name)
            section.append(f"split ax0 by {v}")
            section.append("vectorize ax0.i")
        elif block.reduce and rs:
            section = w.section(f"{block.name}_rf")
            section.append("reorder ax1, ax0")
            section.append("vectorize ax0")
    return w


def _cpu_generic(view: OpView, target: Target, rfactor: bool = False) -> _Writer:
    names = ", ".join(b.name for b in view.blocks)
    how = ", reductions vectorized by rfactor" if rfactor else ""
    w = _Writer(
        f"{names}: parallel over the fused spatial loops, vectorized inside{how}",
        "generic_rfactor" if rfactor else "generic",
    )
    _cpu_other_blocks(w, view, target, done=set(), knobs=True, rfactor=rfactor)
    return w


def _cpu_other_blocks(
    w: _Writer,
    view: OpView,
    target: Target,
    done: set[str],
    knobs: bool = False,
    rfactor: bool = False,
) -> None:
    for block in view.blocks:
        if block.name not in done:
            _cpu_block(w, block, target, knobs, len(view.blocks) == 1, rfactor)


def _cpu_block(
    w: _Writer, block: Block, target: Target, knobs: bool, single: bool, rfactor: bool = False
) -> None:
    """A block on its own: spatial loops fused, split into parallel chunks, then vector lanes."""
    lanes = target.vector_lanes(block.dtype)
    suffix = "" if single else f"_{_knob_suffix(block.name)}"
    spatial = [loop.var for loop in block.spatial]
    s = w.section(block.name)
    if not spatial:
        return
    reduce = [loop.var for loop in block.reduce]
    if reduce and [loop.var for loop in block.loops] != spatial + reduce:
        s.append(f"reorder {', '.join(spatial + reduce)}")
    if rfactor and _vector_reduction(block, lanes):
        # Partial results over V lanes: the rf block (whose loops keep these names) vectorizes
        # them; the block itself then adds the V partials of each output.
        last = reduce[-1]
        v = w.factor(f"V{suffix}", pick(block.extent(last), [lanes, 2 * lanes, 4 * lanes]))
        s.append(f"split {last} by {v}")
        s.append(f"rfactor {last}.i")
        partials = w.section(f"{block.name}_rf")
        for section in (s, partials):
            if len(spatial) > 1:
                section.append(f"fuse {', '.join(spatial)} as f")
            section.append(f"parallel {'f' if len(spatial) > 1 else spatial[0]}")
        partials.append(f"vectorize {last}.i")
        return
    fused = spatial[0]
    if len(spatial) > 1:
        fused = "f"
        s.append(f"fuse {', '.join(spatial)} as f")
    extent = math.prod(block.extent(v) for v in spatial)
    if reduce:
        s.append(f"parallel {fused}")
        last = block.extent(reduce[-1])
        if knobs and last >= 8:
            u = w.factor(f"U{suffix}", pick(last, [4, 8, 16], most=3))
            s.append(f"split {reduce[-1]} by {u}")
            s.append(f"unroll {reduce[-1]}.i")
        return
    vector = pick(extent, [lanes, lanes // 2, lanes // 4])[0]
    if vector == 1 or vector == extent:
        s.append(f"parallel {fused}" if vector == 1 else f"vectorize {fused}")
        return
    chunks = pick(extent // vector, [1, 4, 16, 64], most=4) if knobs else [4]
    chunks = [c for c in chunks if extent // vector // c >= 1]
    ch = w.factor(f"CH{suffix}", chunks) if knobs else str(pick(extent // vector, [4])[0])
    s.append(f"split {fused} by *, {ch}, {vector}")
    s.append(f"parallel {fused}.0")
    s.append(f"vectorize {fused}.2")


# --- GPU ------------------------------------------------------------------------------------------


def _gpu_recipes(view: OpView, target: Target) -> list[_Writer | None]:
    main = [b for b in view.blocks if b.reduce]
    recipes: list[_Writer | None] = []
    if len(main) == 1 and (roles := matmul_roles(main[0])):
        recipes.append(_gpu_matmul(view, main[0], roles, target))
    inlinable = [b for b in view.blocks if not b.reduce and view.is_intermediate(b)]
    if inlinable:
        recipes.append(_gpu_generic(view, target, inline=inlinable))
    recipes.append(_gpu_generic(view, target, inline=[]))
    return recipes


def _gpu_matmul(view: OpView, block: Block, r: MatmulRoles, target: Target) -> _Writer:
    m, n, k = block.extent(r.i), block.extent(r.j), block.extent(r.k)
    w = _Writer(
        f"{_matmul_label(block)}: TY x TX threads with TM x TN each, A and B tiles in shared "
        "memory per BK slice of k",
        "gpu_matmul",
    )
    # First values: 16 x 16 threads with 4 x 4 outputs each, a 64 x 64 tile, 8 KiB of shared
    # memory per BK = 16 slice (unmeasured here: this machine has no GPU).
    ty_values = pick(m, [16, 8], most=2)
    tx_values = pick(n, [16, 8], most=2)
    tm_values = pick(m // max(ty_values), [4, 2, 8], most=3)
    tn_values = pick(n // max(tx_values), [4, 2, 8], most=3)
    # Copies split evenly over the threads when TM * BK and TN * BK are multiples of TX and TY.
    least = max(max(tx_values) // min(tm_values), max(ty_values) // min(tn_values), 1)
    bk_values = pick(k, [v for v in (16, 8, 32) if v >= least] or [least], most=3)
    ty, tx = w.factor("TY", ty_values), w.factor("TX", tx_values)
    tm, tn = w.factor("TM", tm_values), w.factor("TN", tn_values)
    bk = w.factor("BK", bk_values)

    s = w.section(block.name)
    s.append(f"split {r.i} by *, {ty}, {tm}")
    s.append(f"split {r.j} by *, {tx}, {tn}")
    s.append(f"split {r.k} by {bk}")
    tiles = [f"{r.i}.0", f"{r.j}.0", f"{r.i}.1", f"{r.j}.1"]
    inner = [f"{r.k}.o", f"{r.k}.i", f"{r.i}.2", f"{r.j}.2"]
    s.append(f"reorder {', '.join([*r.outer, *tiles, *r.outer_reduce, *inner])}")
    if len(r.outer) > 1:
        s.append(f"fuse {', '.join(r.outer)} as batch")
        s.append("bind batch blockIdx.z")
    elif r.outer:
        s.append(f"bind {r.outer[0]} blockIdx.z")
    s.append(f"bind {r.i}.0 blockIdx.y")
    s.append(f"bind {r.j}.0 blockIdx.x")
    s.append(f"bind {r.i}.1 threadIdx.y")
    s.append(f"bind {r.j}.1 threadIdx.x")
    # Bound first, so the shared copies cover the whole thread block's tiles, not one thread's.
    s.append(f"cache_read {r.a} shared at {r.k}.o")
    s.append(f"cache_read {r.b} shared at {r.k}.o")
    s.append(f"cache_write {block.name} local at {r.j}.1  # each thread's TM x TN tile")
    if folded := epilogue(view, block):
        s.append(f"reverse_compute_inline {folded.name}  # computed as the tile is written back")
    s.append(f"unroll {r.k}.i")
    s.append(f"unroll {r.i}.2")
    s.append(f"unroll {r.j}.2")
    s.append(f"decompose_reduction at {(r.outer_reduce or (f'{r.k}.o',))[0]}")
    for buffer in (r.a, r.b):
        access = next(a for a in block.reads if a.buffer == buffer)
        long_dims = sum(
            1
            for dim in access.dims
            if dim & {r.i, r.j, r.k, *r.outer_reduce} and not dim & set(r.outer)
        )
        copy = w.section(f"{buffer}_shared")  # cooperative fetch: every thread copies a part
        axes = [f"ax{d}" for d in range(long_dims)]
        if len(axes) > 1:
            copy.append(f"fuse {', '.join(axes)} as f")
        fused = "f" if len(axes) > 1 else axes[0]
        copy.append(f"split {fused} by *, {ty}, {tx}")
        copy.append(f"bind {fused}.1 threadIdx.y")
        copy.append(f"bind {fused}.2 threadIdx.x")
    _gpu_other_blocks(w, view, target, done={block.name, getattr(folded, "name", "")}, inline=[])
    return w


def _gpu_generic(view: OpView, target: Target, inline: list[Block]) -> _Writer:
    names = ", ".join(b.name for b in view.blocks if b not in inline)
    how = f"{', '.join(b.name for b in inline)} inlined; " if inline else ""
    rows = "; row reductions across TR threads" if any(map(_long_reduction, view.blocks)) else ""
    w = _Writer(
        f"{names}: {how}one thread per output in thread blocks of T{rows}",
        "gpu_generic_inline" if inline else "gpu_generic",
    )
    _gpu_other_blocks(w, view, target, done=set(), inline=inline)
    return w


def _gpu_other_blocks(
    w: _Writer, view: OpView, target: Target, done: set[str], inline: list[Block]
) -> None:
    limit = target.max_threads_per_block or 1024
    threads = [t for t in (64, 128, 256, 512) if t <= limit]
    inlined = {b.name for b in inline}
    # Each `compute_inline` stands in the section of the first block that reads the result.
    statements: dict[str, list[str]] = {}
    for block in inline:
        readers = [b.name for b in view.consumers(block) if b.name not in inlined]
        statements.setdefault(readers[0] if readers else "", []).append(
            f"compute_inline {block.name}"
        )
    for block in view.blocks:
        if block.name not in done and block.name not in inlined:
            first = statements.pop(block.name, []) + statements.pop("", [])
            _gpu_block(w, block, threads, first)


def _gpu_block(w: _Writer, block: Block, threads: list[int], first: list[str]) -> None:
    spatial = [loop.var for loop in block.spatial]
    reduce = [loop.var for loop in block.reduce]
    s = w.section(block.name)
    s.extend(first)
    if reduce and [loop.var for loop in block.loops] != spatial + reduce:
        s.append(f"reorder {', '.join(spatial + reduce)}")
    fused = spatial[0] if spatial else None
    if len(spatial) > 1:
        fused = "f"
        s.append(f"fuse {', '.join(spatial)} as f")
    extent = math.prod(block.extent(v) for v in spatial)
    if _long_reduction(block):
        # One thread block per output, its threads each reduce a slice, then across threads.
        last = reduce[-1]
        t = w.factor("TR", pick(block.extent(last), [32, 64, 128, 256], most=4))
        if fused:
            s.append(f"bind {fused} blockIdx.x")
        s.append(f"split {last} by {t}")
        s.append(f"bind {last}.i threadIdx.x")
        return
    if fused is None:
        return
    t = w.factor("T", pick(extent, threads, most=4))
    s.append(f"split {fused} by {t}")
    s.append(f"bind {fused}.o blockIdx.x")
    s.append(f"bind {fused}.i threadIdx.x")
    if reduce and block.extent(reduce[-1]) <= 16:
        s.append(f"unroll {reduce[-1]}")


def _long_reduction(block: Block) -> bool:
    """Few outputs, each a long reduction (a row sum): worth a thread block per output."""
    if not block.reduce:
        return False
    outputs = math.prod(block.extent(loop.var) for loop in block.spatial)
    return block.extent(block.reduce[-1].var) >= 32 and outputs <= 64 * 1024
