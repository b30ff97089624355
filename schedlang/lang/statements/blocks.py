"""Blocks and padding: `blockize`, `add_unit_loop`, `reindex`, `reindex_cache_read`,
`reindex_cache_write`, `pad`, `decompose_padding`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schedlang.core.diagnostics import did_you_mean, one_of
from schedlang.lang import nodes
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import Alias, Axis, Block, Buffer, Ints, Scope, named_block
from schedlang.lang.statements.base import (
    accesses,
    loop,
    made_buffer_fits_later,
    new_block_free,
    scope_ok,
    tvm_name,
)
from schedlang.lang.statements.decompiling import (
    Decompile,
    TraceReader,
    Untranslatable,
    cache_scope_untranslatable,
    owner_and_loop,
)
from schedlang.lang.statements.facets import Syntax, copy_block
from schedlang.lang.statements.index_maps import IndexMap, map_ok, read_index_map, to_tvm

if TYPE_CHECKING:
    from tvm import tirx

    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker


@dataclass(frozen=True)
class Blockize(nodes.Stmt, keyword="blockize"):
    """`blockize j.i [as C_tile]`: the loops from j.i inward become one block, `C_o` by default,
    around the current block, which stays nameable inside it."""

    axis: nodes.Name
    alias: nodes.Name | None = None


@dataclass(frozen=True)
class AddUnitLoop(nodes.Stmt, keyword="add_unit_loop"):
    """`add_unit_loop i [as u]` puts a loop of extent 1 around loop i; `add_unit_loop block`
    puts one right around the current block (inside all its loops)."""

    axis: nodes.Name | None  # None: around the block itself
    alias: nodes.Name | None = None

    @property
    def new_name(self) -> str:
        return self.alias.text if self.alias else "u"


@dataclass(frozen=True)
class Reindex(nodes.Stmt, keyword="reindex"):
    """`reindex A [as A_r]`: the block reads (or writes) A through a copy indexed by the block's
    own iteration variables, made (or written back) by a new block `A_reindex`."""

    buffer: nodes.Name
    alias: nodes.Name | None = None


@dataclass(frozen=True)
class Pad(nodes.Stmt, keyword="pad"):
    """`pad by 16, 16, 8`: each iteration variable of the block, in order, runs up to a multiple
    of its number, over padded copies of its buffers (TVM's pad_einsum)."""

    multiples: tuple[nodes.IntFactor, ...]


@dataclass(frozen=True)
class DecomposePadding(nodes.Stmt, keyword="decompose_padding"):
    """`decompose_padding [A_pad] at i`: the padding block fills its buffer with the pad value
    in a new block `A_pad_pad_const` before loop i, then copies only the in-bounds part."""

    block: nodes.Name | None
    axis: nodes.Name


@dataclass(frozen=True)
class ReindexCacheRead(nodes.Stmt, keyword="reindex_cache_read"):
    """`reindex_cache_read A shared (i, j, k) -> (i, k) [as A_sh]`: the block reads A through a
    copy in SCOPE whose element (i, k) is what the block reads at iteration (i, j, k)."""

    buffer: nodes.Name
    scope: nodes.Name
    indices: tuple[nodes.Name, ...]  # the block's iteration variables, in order
    outputs: tuple[Any, ...]  # index_maps.IndexExpr: the copy's indices
    alias: nodes.Name | None = None


@dataclass(frozen=True)
class ReindexCacheWrite(nodes.Stmt, keyword="reindex_cache_write"):
    """`reindex_cache_write C local (i, j, k) -> (j, i) [as C_l]`: the block writes a copy in
    SCOPE, indexed by the map, written back to C by a new block."""

    buffer: nodes.Name
    scope: nodes.Name
    indices: tuple[nodes.Name, ...]
    outputs: tuple[Any, ...]
    alias: nodes.Name | None = None


# fmt: off
BLOCKIZE = Syntax("blockize", Blockize, "blocks", (Axis(), Alias()),
    example="e.g. `blockize j.i` or `blockize j.i as C_tile`",
    description="make the loops from AXIS inward one outer block (C_o) around the block, "
    "e.g. the tile a tensor intrinsic computes; the inner block keeps its name.",
    summary=("`blockize a [as n]`", "`sch.blockize(loop)`", "`C_o` / `n`"),
    creates_blocks=lambda s, block: (s.alias.text if s.alias else f"{block}_o",))

ADD_UNIT_LOOP = Syntax("add_unit_loop", AddUnitLoop, "blocks",
    (Axis(optional=True, written_absent="block"), Alias()),
    example="e.g. `add_unit_loop i`, `add_unit_loop i as u0` or `add_unit_loop block`",
    description="add a loop of extent 1 (named u, or NAME with `as`) around loop AXIS, or "
    "with `block` right around the block, e.g. for a tensor intrinsic that expects one.",
    summary=("`add_unit_loop a\\|block [as n]`", "`sch.add_unit_loop(loop or block)`",
        "loop `u` / `n`"),
    creates_axes=lambda s: (s.new_name,))

REINDEX = Syntax("reindex", Reindex, "blocks", (Buffer(), Alias()),
    example="e.g. `reindex A` or `reindex C as C_r`",
    description="read (or write) buffer BUFFER through a copy indexed by the block's own "
    "iteration variables, made by a new block BUFFER_reindex.",
    summary=("`reindex A [as n]`", '`sch.reindex(block, ("read" or "write", index))`',
        "`A_reindex` / `n`"),
    creates_blocks=lambda s, block: (s.alias.text if s.alias else f"{s.buffer.text}_reindex",))

PAD = Syntax("pad", Pad, "blocks", (Ints("multiples", word="by"),),
    example="e.g. `pad by 16, 16, 8`",
    description="run each iteration variable of the block up to a multiple of its number, "
    "over zero-padded copies of its buffers (blocks A_pad, …, C_pad), so tiles divide evenly.",
    summary=("`pad by m0, m1, …`", "`sch.pad_einsum(block, [m0, m1, …])`", "`A_pad` … `C_pad`"))

DECOMPOSE_PADDING = Syntax("decompose_padding", DecomposePadding, "blocks",
    (Block(optional=True), Axis(word="at")),
    example="e.g. `decompose_padding at i0` or `decompose_padding A_pad at i0`",
    description="split padding block BLOCK into a fill with the pad value before loop AXIS "
    "(new block BLOCK_pad_const) and a copy of only the in-bounds part.",
    summary=("`decompose_padding [B] at a`", "`sch.decompose_padding(block, loop)`",
        "`B_pad_const`"),
    name_after="a block name or `at`",
    creates_blocks=lambda s, block: (f"{named_block(s, block)}_pad_const",))

# fmt: on


def _reindex_cache(node: type[nodes.Stmt], buffer: str, example: str, description: str) -> Syntax:
    """The two reindexing caches differ in their AST class, the buffer the examples name, and
    their prose; their primitive is their keyword."""
    keyword = node.keyword
    index = "write_index" if node is ReindexCacheWrite else "read_index"
    summary = (
        f"`{keyword} {buffer} s (i, …) -> (…) [as n]`",
        f"`sch.{keyword}(block, {index}, s, IndexMap)`",
        f"`{buffer}_s` / `n`",
    )
    arguments = (Buffer(), Scope(), IndexMap(), Alias())
    return Syntax(
        keyword, node, "blocks", arguments, example=example, description=description,
        summary=summary, creates_blocks=copy_block("buffer"),
    )  # fmt: skip


REINDEX_CACHE_READ = _reindex_cache(
    ReindexCacheRead,
    "A",
    "e.g. `reindex_cache_read A global (i, j, k) -> (i, k)` or "
    "`reindex_cache_read B shared (i, j, k) -> (j, k) as B_t`",
    "read buffer BUFFER through a copy in SCOPE laid out by the map from the block's "
    "iteration variables to the copy's indices (new block BUFFER_SCOPE).",
)
REINDEX_CACHE_WRITE = _reindex_cache(
    ReindexCacheWrite,
    "C",
    "e.g. `reindex_cache_write C local (i, j, k) -> (j, i)` or "
    "`reindex_cache_write C global (i, j, k) -> (i, j) as C_acc`",
    "compute into a copy of written buffer BUFFER in SCOPE laid out by the map from the "
    "block's iteration variables, written back by a new block BUFFER_SCOPE.",
)


STATEMENTS = (
    BLOCKIZE,
    ADD_UNIT_LOOP,
    REINDEX,
    PAD,
    DECOMPOSE_PADDING,
    REINDEX_CACHE_READ,
    REINDEX_CACHE_WRITE,
)


# --- blockize ------------------------------------------------------------------------------------


@facets.guard(BLOCKIZE)
def guard_blockize(c: Checker, stmt: Blockize, block: str) -> None:
    c.axis(stmt.axis, block)
    new_block_free(c, stmt, BLOCKIZE.creates_blocks(stmt, block), f"{tvm_name(c.nest, block)}_o")


@facets.lower(BLOCKIZE)
def lower_blockize(nest: Nest, block: str, stmt: Blockize) -> None:
    outer = nest.sch.blockize(loop(nest, block, stmt.axis))
    nest.name_block(outer, BLOCKIZE.creates_blocks(stmt, block)[0])


@facets.decompile(BLOCKIZE, "Blockize")
def decompile_blockize(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    if not reader.is_loop(inputs[0]):
        raise Untranslatable("schedlang blockizes the loops from one inward, not a list of blocks")
    if not bool(attrs[0]):
        raise Untranslatable("schedlang's blockize keeps unit iterators (preserve_unit_iters=True)")
    block, axis = reader.axis(inputs[0])
    reader.emit(block, Blockize(nodes.Name(axis)))


# --- add_unit_loop -------------------------------------------------------------------------------


@facets.guard(ADD_UNIT_LOOP)
def guard_add_unit_loop(c: Checker, stmt: AddUnitLoop, block: str) -> None:
    if stmt.axis is not None:
        c.axis(stmt.axis, block)
    if stmt.alias is None and c.nest.find(block, "u") is not None:
        c.error(
            f"block {block} already has a loop named `u`",
            stmt.span,
            "name the new loop with `as NAME`",
        )
        return
    c.new_names_free([stmt.new_name], block, stmt.alias.span if stmt.alias else stmt.span)


@facets.lower(ADD_UNIT_LOOP)
def lower_add_unit_loop(nest: Nest, block: str, stmt: AddUnitLoop) -> None:
    around = loop(nest, block, stmt.axis) if stmt.axis is not None else nest.block(block)
    made = nest.sch.add_unit_loop(around)
    # Not `copies`: TVM calls every unit loop `u`, and the next one is not this one.
    nest.set_name(made, stmt.new_name, copies=False)


@facets.decompile(ADD_UNIT_LOOP, "AddUnitLoop")
def decompile_add_unit_loop(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    if reader.is_loop(inputs[0]):
        block, axis = reader.axis(inputs[0])
        around: nodes.Name | None = nodes.Name(axis)
    else:
        block, around = reader.block_name(inputs[0]), None
    # TVM calls every unit loop `u`; schedlang names each one apart.
    taken = {loop.name for loop in reader.nest.loops(block)}
    name = next(n for n in ("u", *(f"u{i}" for i in range(1, 1000))) if n not in taken)
    reader.emit(block, AddUnitLoop(around, nodes.Name(name) if name != "u" else None))


# --- reindex -------------------------------------------------------------------------------------


def _reindexed(nest: Nest, block: str, buffer: str) -> tuple[str, int]:
    """("write" or "read", the buffer's index among the block's writes or reads)."""
    writes = nest.writes(block)
    if buffer in writes:
        return "write", writes.index(buffer)
    return "read", nest.reads(block).index(buffer)


@facets.guard(REINDEX)
def guard_reindex(c: Checker, stmt: Reindex, block: str) -> None:
    if not accesses(
        c,
        block,
        stmt.buffer,
        f"block {block} neither reads nor writes `{stmt.buffer.text}`",
        f"buffers of block {block}",
    ):
        return
    new_block_free(
        c, stmt, REINDEX.creates_blocks(stmt, block), _reindex_tvm_name(stmt, block, c.nest)
    )


@facets.lower(REINDEX)
def lower_reindex(nest: Nest, block: str, stmt: Reindex) -> None:
    made = nest.sch.reindex(nest.block(block), _reindexed(nest, block, stmt.buffer.text))
    nest.name_block(made, REINDEX.creates_blocks(stmt, block)[0])


def _reindex_tvm_name(stmt: Reindex, block: str, nest: Nest) -> str:
    # TVM names the new buffer `A_reindex` and a read's copy block after that buffer again.
    kind, _ = _reindexed(nest, block, stmt.buffer.text)
    return f"{stmt.buffer.text}_reindex" + ("_reindex" if kind == "read" else "")


@facets.decompile(REINDEX, "ReIndex")
def decompile_reindex(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    block = reader.block_name(inputs[0])
    index, written = int(attrs[0]), int(attrs[1]) == 1
    buffers = reader.nest.writes(block) if written else reader.nest.reads(block)
    buffer = buffers[index]
    if buffers.index(buffer) != index or (not written and buffer in reader.nest.writes(block)):
        raise Untranslatable(
            f"block {block} uses `{buffer}` in several regions; schedlang reindexes its "
            "written region, or else its first read one"
        )
    reader.emit(block, Reindex(nodes.Name(buffer)))


# --- pad -----------------------------------------------------------------------------------------


@facets.guard(PAD)
def guard_pad(c: Checker, stmt: Pad, block: str) -> None:
    iter_vars = c.nest.realize(block).block.iter_vars
    names = ", ".join(iv.var.name.removeprefix("v_") for iv in iter_vars)
    if not c.require(
        len(stmt.multiples) == len(iter_vars),
        f"block {block} has {len(iter_vars)} iteration variables ({names}), so `pad` takes "
        f"{len(iter_vars)} numbers, not {len(stmt.multiples)}",
        stmt.span,
        "1 leaves a variable as it is",
    ):
        return
    ok = True
    for multiple in stmt.multiples:
        ok &= c.require(
            multiple.value > 0, f"a multiple must be positive, got {multiple.value}", multiple.span
        )
    if not ok:
        return
    extents = [_int_or_none(iv.dom.extent) for iv in iter_vars]
    padded = [
        e if e is None else -(-e // m.value) * m.value
        for e, m in zip(extents, stmt.multiples, strict=True)
    ]
    if not c.require(
        any(e is not None and p != e for e, p in zip(extents, padded, strict=True)),
        f"`pad` changes nothing: block {block}'s extents ({', '.join(map(str, extents))}) "
        "already are multiples of these numbers",
        stmt.span,
    ):
        return
    # Sized once every statement is applied: a `compute_at` of a padding block shrinks its copy.
    for name, points, dtype in _padded_buffers(c.nest.realize(block).block, padded):
        made_buffer_fits_later(
            c,
            f"{name}_pad",
            points,
            dtype,
            stmt.span,
            "a padded buffer holds what the padded iteration space touches of it",
        )
    tvm_names = set(_existing(c))
    for buffer in dict.fromkeys([*c.nest.reads(block), *c.nest.writes(block)]):
        c.require(
            f"{buffer}_pad" not in tvm_names,
            f"TVM would name a padding block `{buffer}_pad`, like an existing block",
            stmt.span,
        )


@facets.lower(PAD)
def _lower_pad(nest: Nest, block: str, stmt: Pad) -> None:
    nest.sch.pad_einsum(nest.block(block), [multiple.value for multiple in stmt.multiples])


def _padded_buffers(block: Any, padded: list[int | None]) -> list[tuple[str, int, str]]:
    """(name, elements, dtype) of each buffer `pad` copies: the product of the padded extents of
    the iteration variables its indices use (C[i, j] of a matmul spans i and j, not k)."""
    from tvm import tirx

    extent = {iv.var.name: e for iv, e in zip(block.iter_vars, padded, strict=True)}
    sizes: dict[str, tuple[int, str]] = {}
    for region in [*block.reads, *block.writes]:
        used = set()
        for r in region.region:
            used |= {v.name for v in tirx.analysis.undefined_vars(r.min)}
        extents = [extent[name] for name in used if name in extent]
        if not extents or None in extents:
            continue
        points = math.prod(e for e in extents if e is not None)
        buffer = region.source
        if points > sizes.get(buffer.name, (0, ""))[0]:
            sizes[buffer.name] = (points, str(buffer.dtype))
    return [(name, points, dtype) for name, (points, dtype) in sizes.items()]


def _existing(c: Checker) -> list[str]:
    nest = c.nest
    return [nest.block_aliases.get(b, b) for b in nest.block_names()]


def _int_or_none(expr: Any) -> int | None:
    try:
        return int(expr)
    except TypeError:
        return None


@facets.decompile(PAD, "PadEinsum")
def decompile_pad(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    block = reader.block_name(inputs[0])
    reader.emit(block, Pad(tuple(nodes.IntFactor(int(m)) for m in attrs[0])))


# --- decompose_padding ---------------------------------------------------------------------------


@facets.guard(DECOMPOSE_PADDING)
def guard_decompose_padding(c: Checker, stmt: DecomposePadding, block: str) -> None:
    owner = c.existing_block(stmt.block) if stmt.block else block
    c.require(
        not c.nest.is_reduction_block(owner),
        f"block {owner} is a reduction, not a padding block",
        stmt.block.span if stmt.block else stmt.span,
        "decompose_padding splits a block like `A_pad[i] = if i < n then A[i] else 0`; for a "
        "reduction's initialization use decompose_reduction",
    )
    c.axis(stmt.axis, owner)
    owner = tvm_name(c.nest, named_block(stmt, block))
    new_block_free(c, stmt, DECOMPOSE_PADDING.creates_blocks(stmt, block), f"{owner}_pad_const")


@facets.lower(DECOMPOSE_PADDING)
def lower_decompose_padding(nest: Nest, block: str, stmt: DecomposePadding) -> None:
    owner = named_block(stmt, block)
    made = nest.sch.decompose_padding(nest.block(owner), loop(nest, owner, stmt.axis))
    nest.name_block(made, DECOMPOSE_PADDING.creates_blocks(stmt, block)[0])


@facets.decompile(DECOMPOSE_PADDING, "DecomposePadding")
def decompile_decompose_padding(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    owner, axis = owner_and_loop(reader, inputs)
    reader.emit(owner, DecomposePadding(None, nodes.Name(axis)))


# --- reindex_cache_read, reindex_cache_write -----------------------------------------------------


@facets.guard(REINDEX_CACHE_READ)
@facets.guard(REINDEX_CACHE_WRITE)
def guard_reindex_cache(c: Checker, stmt: ReindexCacheRead | ReindexCacheWrite, block: str) -> None:
    reading = isinstance(stmt, ReindexCacheRead)
    if not accesses(
        c,
        block,
        stmt.buffer,
        f"block {block} does not {'read' if reading else 'write'} `{stmt.buffer.text}`",
        f"block {block} {'reads' if reading else 'writes'}",
        reads=reading,
        writes=not reading,
    ):
        return
    scope_ok(c, stmt.scope)
    iter_vars = c.nest.realize(block).block.iter_vars
    names = ", ".join(iv.var.name.removeprefix("v_") for iv in iter_vars)
    ok = map_ok(
        c,
        stmt,
        len(iter_vars),
        f"the map takes {len(stmt.indices)} indices, but block {block} has {len(iter_vars)} "
        f"iteration variables ({names}): one index each, in order",
        lambda var, seen: (
            f"`{var.name}` is not one of the map's indices",
            did_you_mean(var.name, sorted(seen)),
            one_of([n.text for n in stmt.indices], "indices"),
        ),
    )
    if ok:
        made_as = f"{stmt.buffer.text}_{stmt.scope.text}"
        new_block_free(
            c, stmt, BY_NODE_REINDEX_CACHE[type(stmt)].creates_blocks(stmt, block), made_as
        )


def _tvm_index_map(stmt: ReindexCacheRead | ReindexCacheWrite) -> tirx.IndexMap:
    from tvm import tirx

    variables = {n.text: tirx.Var(n.text, "int32") for n in stmt.indices}
    outputs = [to_tvm(e, variables) for e in stmt.outputs]
    return tirx.IndexMap(list(variables.values()), outputs, None)


@facets.lower(REINDEX_CACHE_READ)
@facets.lower(REINDEX_CACHE_WRITE)
def lower_reindex_cache(nest: Nest, block: str, stmt: ReindexCacheRead | ReindexCacheWrite) -> None:
    reading = isinstance(stmt, ReindexCacheRead)
    buffers = nest.reads(block) if reading else nest.writes(block)
    primitive = nest.sch.reindex_cache_read if reading else nest.sch.reindex_cache_write
    made = primitive(
        nest.block(block), buffers.index(stmt.buffer.text), stmt.scope.text, _tvm_index_map(stmt)
    )
    spec = BY_NODE_REINDEX_CACHE[type(stmt)]
    nest.name_block(made, spec.creates_blocks(stmt, block)[0])


def _decompile_reindex_cache(write: bool) -> Decompile:
    def decompile(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
        block = reader.block_name(inputs[0])
        index, scope = int(attrs[0]), str(attrs[1])
        buffers = reader.nest.writes(block) if write else reader.nest.reads(block)
        buffer = buffers[index]
        if buffers.index(buffer) != index:
            raise Untranslatable(f"block {block} uses `{buffer}` in several regions; schedlang "
                                 "caches the first")  # fmt: skip
        indices, outputs = read_index_map(inputs[1])
        kind = ReindexCacheWrite if write else ReindexCacheRead
        reader.emit(block, kind(nodes.Name(buffer), nodes.Name(scope), indices, outputs))

    return decompile


BY_NODE_REINDEX_CACHE = {
    ReindexCacheRead: REINDEX_CACHE_READ,
    ReindexCacheWrite: REINDEX_CACHE_WRITE,
}

facets.decompile(REINDEX_CACHE_READ, "ReindexCacheRead")(_decompile_reindex_cache(write=False))
facets.untranslatable(REINDEX_CACHE_READ)(cache_scope_untranslatable)
facets.decompile(REINDEX_CACHE_WRITE, "ReindexCacheWrite")(_decompile_reindex_cache(write=True))
facets.untranslatable(REINDEX_CACHE_WRITE)(cache_scope_untranslatable)
