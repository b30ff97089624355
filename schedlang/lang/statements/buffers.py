"""Buffers and caches: `cache_read`, `cache_write`, `storage_align`, `set_scope`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from schedlang.core.diagnostics import one_of
from schedlang.lang import nodes
from schedlang.lang.statements import facets, moving
from schedlang.lang.statements.args import (
    Alias,
    Axis,
    Block,
    Blocks,
    Buffer,
    Int,
    KeepUnitLoops,
    Scope,
)
from schedlang.lang.statements.base import (
    accesses,
    at_loop,
    loop,
    made_buffer_fits,
    new_block_free,
    outside_reduction,
    scope_ok,
)
from schedlang.lang.statements.decoding import StepView
from schedlang.lang.statements.decompiling import (
    Decompile,
    TraceReader,
    Untranslatable,
    cache_scope_untranslatable,
)
from schedlang.lang.statements.facets import Syntax, copy_block

if TYPE_CHECKING:
    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker


def _not_first_buffer(attrs: list[Any], schedlang_does: str, this_does: str) -> tuple[str] | None:
    """An instruction whose first attribute is the index of the written buffer it changes, where
    schedlang's statement changes the block's first one."""
    if int(attrs[0]) != 0:
        return (f"{schedlang_does} a block's first written buffer; this {this_does} buffer "
                f"#{int(attrs[0])}",)  # fmt: skip
    return None


def _record_made_buffer(c: Checker, writer: str, stmt: nodes.Stmt) -> None:
    buffer = c.nest.write_buffer(writer)
    if buffer is not None:
        c.buffer_made_by[buffer.name] = stmt.span


@dataclass(frozen=True)
class SetScope(nodes.Stmt, keyword="set_scope"):
    """`set_scope B local`: the buffer block B writes lives in SCOPE."""

    block: nodes.Name
    scope: nodes.Name


def _require_at(stmt: CacheRead | CacheWrite) -> None:
    # `keep_unit_loops` belongs to `at`: the copy block is moved only when `at` is given.
    if stmt.keep_unit_loops and stmt.at is None:
        raise ValueError(f"{stmt.keyword}: keep_unit_loops needs `at`")


@dataclass(frozen=True)
class CacheRead(nodes.Stmt, keyword="cache_read"):
    """`cache_read A shared [for B, …] [at k.o [keep_unit_loops]] [as A_sh]`: the current block
    reads A through a copy."""

    buffer: nodes.Name
    scope: nodes.Name
    at: nodes.Name | None = None
    alias: nodes.Name | None = None
    keep_unit_loops: bool = False
    # `for B, D`: only these blocks read the copy (TVM's consumer_blocks); all readers if empty.
    consumers: tuple[nodes.Name, ...] = ()

    def __post_init__(self) -> None:
        _require_at(self)


@dataclass(frozen=True)
class CacheWrite(nodes.Stmt, keyword="cache_write"):
    """`cache_write C local [at j.o [keep_unit_loops]] [as C_acc]`: block C accumulates in a copy
    written back."""

    block: nodes.Name
    scope: nodes.Name
    at: nodes.Name | None = None
    alias: nodes.Name | None = None
    keep_unit_loops: bool = False

    def __post_init__(self) -> None:
        _require_at(self)


@dataclass(frozen=True)
class StorageAlign(nodes.Stmt, keyword="storage_align"):
    """`storage_align A_shared dim 0 factor 32 offset 1`: pad a buffer's rows against bank
    conflicts."""

    block: nodes.Name
    dim: nodes.IntFactor
    factor: nodes.IntFactor
    offset: nodes.IntFactor


# fmt: off
CACHE_READ = Syntax("cache_read", CacheRead, "buffers",
    (Buffer(), Scope(), Blocks("consumers", word="for"),
     Axis("at", word="at", optional=True), KeepUnitLoops(), Alias()),
    example="e.g. `cache_read A shared`, `cache_read A shared at k.o as A_shared`, "
    "`cache_read A global at k.o keep_unit_loops` or `cache_read B local for C`",
    description="copy the tile of buffer BUFFER that the block reads into a buffer in SCOPE, "
    "placed at AXIS; `for B, D` makes only those blocks read the copy.",
    summary=("`cache_read A s [for B, …] [at a [keep_unit_loops]] [as n]`",
        "`sch.cache_read(block, read_index, s, consumer_blocks=[…])` [+ "
        "`sch.compute_at(copy, loop, preserve_unit_loops=…)`]", "`A_s` / `n`"),
    creates_blocks=copy_block("buffer"))

CACHE_WRITE = Syntax("cache_write", CacheWrite, "buffers",
    (Block(), Scope(), Axis("at", word="at", optional=True), KeepUnitLoops(), Alias()),
    example="e.g. `cache_write C local`, `cache_write C local at j.o as C_local` or "
    "`cache_write C global at j.o keep_unit_loops`",
    description="compute the block into a SCOPE buffer, written back to the output at AXIS.",
    summary=("`cache_write C s [at a [keep_unit_loops]] [as n]`",
        "`sch.cache_write(block, 0, s)` [+ `sch.reverse_compute_at(wb, loop, "
        "preserve_unit_loops=…)`]", "`C_s` / `n`"),
    creates_blocks=copy_block("block"))

STORAGE_ALIGN = Syntax("storage_align", StorageAlign, "buffers",
    (Block(), Int("dim", word="dim"), Int("factor", word="factor"), Int("offset", word="offset")),
    example="e.g. `storage_align A_shared dim 0 factor 32 offset 1`",
    description="pad a dimension of block BLOCK's buffer, against shared memory bank conflicts.",
    summary=("`storage_align B dim d factor f offset o`", "`sch.storage_align(block, 0, d, f, o)`",
        "—"))

SET_SCOPE = Syntax("set_scope", SetScope, "buffers", (Block(), Scope()),
    example="e.g. `set_scope B local` or `set_scope A_shared shared.dyn`",
    description="keep the intermediate buffer that block BLOCK writes in SCOPE.",
    summary=("`set_scope B s`", "`sch.set_scope(block, 0, s)`", "—"))
# fmt: on

STATEMENTS = (CACHE_READ, CACHE_WRITE, STORAGE_ALIGN, SET_SCOPE)


# --- cache_read ----------------------------------------------------------------------------------


@facets.guard(CACHE_READ)
def guard_cache_read(c: Checker, stmt: CacheRead, block: str) -> None:
    accesses(
        c,
        block,
        stmt.buffer,
        f"block {block} does not read `{stmt.buffer.text}`",
        f"block {block} reads",
        writes=False,
    )
    scope_ok(c, stmt.scope)
    seen: set[str] = set()
    for consumer in stmt.consumers:
        reader = c.existing_block(consumer)
        if not c.require(
            consumer.text not in seen, f"block {consumer.text} is listed twice", consumer.span
        ):
            continue
        seen.add(consumer.text)
        readers = [b for b in c.nest.block_names() if stmt.buffer.text in c.nest.reads(b)]
        c.require(
            stmt.buffer.text in c.nest.reads(reader),
            f"block {reader} does not read `{stmt.buffer.text}`: it cannot read the copy",
            consumer.span,
            one_of(readers, f"blocks reading `{stmt.buffer.text}`"),
        )
    if stmt.at is not None:
        at_loop(c, stmt.at, block)
    new_block_free(
        c, stmt, CACHE_READ.creates_blocks(stmt, block), f"{stmt.buffer.text}_{stmt.scope.text}"
    )


@facets.lower(CACHE_READ)
def lower_cache_read(nest: Nest, block: str, stmt: CacheRead) -> None:
    sch = nest.sch
    index = nest.reads(block).index(stmt.buffer.text)
    # Through get_sblock, which the trace records: a consumer must be defined when it replays.
    consumers = [sch.get_sblock(nest.block_aliases.get(c.text, c.text)) for c in stmt.consumers]
    copy = sch.cache_read(
        nest.block(block), index, stmt.scope.text, consumer_blocks=consumers or None
    )
    nest.name_block(copy, CACHE_READ.creates_blocks(stmt, block)[0])
    if stmt.at is not None:
        at = loop(nest, block, stmt.at)
        sch.compute_at(copy, at, preserve_unit_loops=stmt.keep_unit_loops)


@facets.record(CACHE_READ)
def _record_cache_read(c: Checker, stmt: CacheRead, block: str) -> None:
    # The copy block writes the cache.
    copy = CACHE_READ.creates_blocks(stmt, block)[0]
    c.read_caches.add(copy)
    _record_made_buffer(c, copy, stmt)


@facets.decompile(CACHE_READ, "CacheRead")
def decompile_cache_read(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    block = reader.block_name(inputs[0])
    index, scope = int(attrs[0]), str(attrs[1])
    buffer = reader.nest.reads(block)[index]
    if reader.nest.reads(block).index(buffer) != index:
        raise Untranslatable(
            f"block {block} reads `{buffer}` in several regions; schedlang caches the first"
        )
    readers = list(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else []
    consumers = tuple(nodes.Name(reader.block_name(rv)) for rv in readers)
    reader.emit(block, CacheRead(nodes.Name(buffer), nodes.Name(scope), consumers=consumers))


@facets.steps(CACHE_READ)
def _cache_read_steps(view: StepView, block: str, _: None) -> list[str]:
    scopes = ("shared", "local") if view.gpu else ("global",)
    places = [""] + [f" at {loop.name}" for loop in view.loops(block)]
    return [
        f"cache_read {buffer} {scope}{at}"
        for buffer in view.reads(block)
        for scope in scopes
        for at in places
    ]


def _absorbs_move(
    move_kind: type[moving.ComputeAt] | type[moving.ReverseComputeAt], cached: str
) -> Callable[[CacheRead | CacheWrite, nodes.Stmt], CacheRead | CacheWrite | None]:
    """`cache_read A s` then `compute_at A_s x` is `cache_read A s at x` (likewise for
    cache_write and reverse_compute_at); `cached` names the field the cache block is named by."""

    def absorbs(cache: CacheRead | CacheWrite, move: nodes.Stmt) -> CacheRead | CacheWrite | None:
        copy = nodes.cache_block_name(getattr(cache, cached), cache.scope)
        if cache.at is None and isinstance(move, move_kind) and move.block.text == copy:
            return replace(cache, at=move.axis, keep_unit_loops=move.keep_unit_loops)
        return None

    return absorbs


# --- cache_write ---------------------------------------------------------------------------------


@facets.guard(CACHE_WRITE)
def guard_cache_write(c: Checker, stmt: CacheWrite, block: str) -> None:
    written = c.existing_block(stmt.block)
    c.require(bool(c.nest.writes(written)), f"block {written} writes no buffer", stmt.block.span)
    scope_ok(c, stmt.scope)
    if stmt.at is not None:
        at_loop(c, stmt.at, block)
    new_block_free(
        c, stmt, CACHE_WRITE.creates_blocks(stmt, block), _cache_write_tvm_name(stmt, block, c.nest)
    )


@facets.lower(CACHE_WRITE)
def lower_cache_write(nest: Nest, block: str, stmt: CacheWrite) -> None:
    sch = nest.sch
    # Resolve `at` before cache_write: the write-back block goes where the loop is now.
    at_loop_rv = loop(nest, block, stmt.at) if stmt.at is not None else None
    write_back = sch.cache_write(nest.block(stmt.block.text), 0, stmt.scope.text)
    nest.name_block(write_back, CACHE_WRITE.creates_blocks(stmt, block)[0])
    if at_loop_rv is not None:
        sch.reverse_compute_at(write_back, at_loop_rv, preserve_unit_loops=stmt.keep_unit_loops)


def _cache_write_tvm_name(stmt: CacheWrite, block: str, nest: Nest) -> str | None:
    buffer = nest.write_buffer(stmt.block.text)
    return f"{buffer.name}_{stmt.scope.text}" if buffer is not None else None


@facets.soundness(CACHE_WRITE)
def _cache_write_soundness(c: Checker, stmt: CacheWrite, block: str) -> None:
    cache_fits_buffer(c, stmt, block)
    if stmt.at is not None:
        copies_only_computed(c, stmt, block, stmt.at)


def cache_fits_buffer(c: Checker, stmt: CacheWrite, block: str) -> None:
    """TVM sizes the cache of `cache_write` from the block's loops, ignoring the `if` of a
    split (after a fuse, a split that does not divide and a fuse again, it came out 32 x 3
    for an 11 x 3 output), and copies all of it back: out of bounds (TVM 0.27)."""
    from tvm import tirx  # the checker has imported TVM already; the registry does not need it

    copy = next(iter(CACHE_WRITE.creates_blocks(stmt, block)), None)
    if copy is None or not c.nest.has_block(copy):
        return
    buffer = c.nest.write_buffer(copy)  # the write-back writes the block's buffer
    made = c.nest.write_buffer(stmt.block.text)  # the block computes into the cache
    if buffer is None or made is None:
        return
    shape = [int(d) for d in buffer.shape if isinstance(d, tirx.IntImm)]
    made_shape = [int(d) for d in made.shape if isinstance(d, tirx.IntImm)]
    if len(shape) != len(buffer.shape) or len(made_shape) != len(shape):
        return
    c.require(
        all(m <= b for m, b in zip(made_shape, shape, strict=True)),
        f"TVM would make the cache `{made.name}` {' x '.join(map(str, made_shape))}, "
        f"larger than the {' x '.join(map(str, shape))} of `{buffer.name}`, and copy all "
        "of it back: out of bounds",
        stmt.span,
        "TVM sizes the cache from the block's loops and ignores the `if` of a split that "
        "does not divide (a TVM bug, 0.27): split by divisors before cache_write",
    )


def copies_only_computed(c: Checker, stmt: CacheWrite, block: str, at: nodes.Name) -> None:
    """`cache_write … at L` copies back, in each iteration of L, the box around what the
    block wrote there. When the tile loops under L are strided (an inner tile loop reordered
    outside its outer one), the box holds points computed in other iterations, which TVM's
    per-iteration cache no longer has: the copy writes garbage over them (TVM 0.27)."""
    written = stmt.block.text
    if not outside_reduction(c, stmt, f"{written}'s write-back", written, at):
        return
    loop = c.nest.find(block, at.text)
    copy = next(iter(CACHE_WRITE.creates_blocks(stmt, block)), None)
    if loop is None or copy is None or not c.nest.has_block(copy):
        return
    computed = c.nest.spatial_iterations(written, below=loop)
    copied = c.nest.spatial_iterations(copy, below=loop)
    if computed is None or copied is None:
        return
    c.require(
        copied <= computed,
        f"`cache_write … at {loop.name}` would copy back {copied} elements per iteration of "
        f"`{loop.name}` while block {written} computes only {computed} there: the rest "
        "would be garbage",
        at.span,
        "the tile loops under the `at` loop are strided: keep each split's outer loop "
        "outside its inner one, or write the cache back at an outer loop",
    )


def _decompile_in_scope(kind: type[CacheWrite] | type[SetScope]) -> Decompile:
    """`cache_write` and `set_scope` read back: the block (the first input) and the scope (the
    second attribute)."""

    def decompile(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
        block = reader.block_name(inputs[0])
        reader.emit(block, kind(nodes.Name(block), nodes.Name(str(attrs[1]))))

    return decompile


@facets.untranslatable(CACHE_WRITE)
def _cache_write_untranslatable(attrs: list[Any]) -> tuple[str, ...] | None:
    if cache_scope_untranslatable(attrs):
        return cache_scope_untranslatable(attrs)
    return _not_first_buffer(attrs, "schedlang's cache_write caches", "caches")


@facets.steps(CACHE_WRITE)
def _cache_write_steps(view: StepView, block: str, _: None) -> list[str]:
    scopes = ("local",) if view.gpu else ("local", "global")
    places = [""] + [f" at {loop.name}" for loop in view.loops(block)]
    return [f"cache_write {block} {scope}{at}" for scope in scopes for at in places]


@facets.divergence(CACHE_WRITE)
def _cache_write_divergence(inputs: list[Any], attrs: list[Any]) -> str | None:
    if len(inputs) > 1 and list(inputs[1]):
        return ("it redirects only some readers (consumer_blocks); schedlang's "
                "`cache_write` redirects all of them")  # fmt: skip
    return None


# --- storage_align -------------------------------------------------------------------------------


@facets.guard(STORAGE_ALIGN)
def guard_storage_align(c: Checker, stmt: StorageAlign, block: str) -> None:
    aligned = c.existing_block(stmt.block)
    buffer = c.nest.write_buffer(aligned)
    ndim = len(buffer.shape) if buffer is not None else 0
    c.require(
        0 <= stmt.dim.value < ndim,
        f"dim {stmt.dim.value} is out of range: buffer `{getattr(buffer, 'name', '?')}` "
        f"has {ndim} dimensions",
        stmt.dim.span,
    )
    if not c.require(
        stmt.factor.value > 0, f"factor must be positive, got {stmt.factor.value}", stmt.factor.span
    ):
        return
    if not c.require(
        stmt.offset.value >= 0, f"offset must be at least 0, got {stmt.offset.value}",
        stmt.offset.span,
    ):  # fmt: skip
        return
    if stmt.offset.value >= stmt.factor.value:  # TVM pads to the offset modulo the factor
        c.warn(
            f"offset {stmt.offset.value} is past the factor {stmt.factor.value}: TVM pads the "
            f"stride as with offset {stmt.offset.value % stmt.factor.value}",
            stmt.offset.span,
            f"write `offset {stmt.offset.value % stmt.factor.value}`",
        )
    if buffer is None or not 0 <= stmt.dim.value < ndim:
        return
    shape = [int(d) for d in buffer.shape]
    dim, factor, offset = stmt.dim.value, stmt.factor.value, stmt.offset.value
    stride = math.prod(shape[dim + 1 :])
    padded = stride + (offset - stride) % factor
    made_buffer_fits(
        c,
        buffer.name,
        math.prod(shape[: dim + 1]) * padded,
        buffer.dtype,
        stmt.factor.span,
        f"aligning dim {dim} to {factor} pads its stride from {stride} to {padded} "
        "elements: use a factor like 32 or 64",
    )


@facets.lower(STORAGE_ALIGN)
def _lower_storage_align(nest: Nest, block: str, stmt: StorageAlign) -> None:
    aligned = nest.block(stmt.block.text)
    nest.sch.storage_align(aligned, 0, stmt.dim.value, stmt.factor.value, stmt.offset.value)


@facets.provenance(STORAGE_ALIGN)
def _record_aligned(c: Checker, stmt: StorageAlign, block: str) -> None:
    buffer = c.nest.write_buffer(stmt.block.text)
    if buffer is not None:
        c.aligned_by[buffer.name] = stmt.span


@facets.decompile(STORAGE_ALIGN, "StorageAlign")
def decompile_storage_align(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    block = reader.block_name(inputs[0])
    dim, factor, offset = (nodes.IntFactor(int(a)) for a in attrs[1:4])
    reader.emit(block, StorageAlign(nodes.Name(block), dim, factor, offset))


@facets.untranslatable(STORAGE_ALIGN)
def _storage_align_untranslatable(attrs: list[Any]) -> tuple[str, ...] | None:
    return _not_first_buffer(attrs, "schedlang aligns", "aligns")


# --- set_scope -----------------------------------------------------------------------------------


@facets.guard(SET_SCOPE)
def guard_set_scope(c: Checker, stmt: SetScope, block: str) -> None:
    written = c.existing_block(stmt.block)
    buffer = c.nest.write_buffer(written)
    if buffer is None:
        c.error(f"block {written} writes no buffer", stmt.block.span)
        return
    # A parameter's memory is the caller's: TVM cannot move it.
    c.require(
        buffer.name not in c.param_buffers,
        f"block {written} writes `{buffer.name}`, a parameter of the function: only an "
        "intermediate buffer's scope can change",
        stmt.block.span,
        f"to compute `{buffer.name}` in {stmt.scope.text} memory, use "
        f"`cache_write {written} {stmt.scope.text}`",
    )
    scope_ok(c, stmt.scope)


@facets.record(CACHE_WRITE)
@facets.record(SET_SCOPE)
def _record_made_by_block(c: Checker, stmt: CacheWrite | SetScope, block: str) -> None:
    _record_made_buffer(c, stmt.block.text, stmt)


@facets.lower(SET_SCOPE)
def _lower_set_scope(nest: Nest, block: str, stmt: SetScope) -> None:
    nest.sch.set_scope(nest.block(stmt.block.text), 0, stmt.scope.text)


@facets.untranslatable(SET_SCOPE)
def _set_scope_untranslatable(attrs: list[Any]) -> tuple[str, ...] | None:
    if str(attrs[1]) not in nodes.SCOPES:
        return (f"schedlang's set_scope takes {', '.join(nodes.SCOPES)}, not `{attrs[1]}`",)
    return _not_first_buffer(attrs, "schedlang's set_scope sets", "sets")


facets.untranslatable(CACHE_READ)(cache_scope_untranslatable)
facets.absorbs(CACHE_READ)(_absorbs_move(moving.ComputeAt, "buffer"))
facets.absorbs(CACHE_WRITE)(_absorbs_move(moving.ReverseComputeAt, "block"))
facets.decompile(CACHE_WRITE, "CacheWrite")(_decompile_in_scope(CacheWrite))
facets.decompile(SET_SCOPE, "SetScope")(_decompile_in_scope(SetScope))
