"""Reductions: `rfactor`, `decompose_reduction`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schedlang.lang import nodes
from schedlang.lang.loop import Loop, LoopKind
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import Alias, Axis, Block, Int, named_block
from schedlang.lang.statements.base import loop, made_buffer_fits_later, new_block_free, tvm_name
from schedlang.lang.statements.decoding import StepView
from schedlang.lang.statements.decompiling import TraceReader, owner_and_loop
from schedlang.lang.statements.facets import Syntax

if TYPE_CHECKING:
    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker


@dataclass(frozen=True)
class Rfactor(nodes.Stmt, keyword="rfactor"):
    """`rfactor k.i [factor_axis 1] [as C_rf]`: the factored axis goes at position `factor_axis`
    of the new buffer's shape (first when not given)."""

    axis: nodes.Name
    alias: nodes.Name | None = None
    factor_axis: nodes.IntFactor | None = None

    @property
    def factor_position(self) -> int:
        return self.factor_axis.value if self.factor_axis is not None else 0


@dataclass(frozen=True)
class DecomposeReduction(nodes.Stmt, keyword="decompose_reduction"):
    block: nodes.Name | None
    axis: nodes.Name


# fmt: off
RFACTOR = Syntax("rfactor", Rfactor, "reductions",
    (Axis(), Int("factor_axis", word="factor_axis", optional=True), Alias()),
    example="e.g. `rfactor k.i`, `rfactor k.i as C_rf` or `rfactor k.i factor_axis 1 as C_rf`",
    description="turn reduction loop AXIS into a spatial axis of partial results (new block "
    "C_rf); factor_axis N puts that axis at position N of C_rf's shape (default 0, first).",
    summary=("`rfactor a [factor_axis f] [as n]`",
        "`sch.rfactor(loop, factor_axis=f)` (f = 0 by default)", "`C_rf` / `n`"),
    creates_blocks=lambda s, block: (s.alias.text if s.alias else f"{block}_rf",))

DECOMPOSE_REDUCTION = Syntax("decompose_reduction", DecomposeReduction, "reductions",
    (Block(optional=True), Axis(word="at")),
    example="e.g. `decompose_reduction at k.o` or `decompose_reduction C at k.o`",
    description="move the reduction's initialization before loop AXIS (do it last).",
    summary=("`decompose_reduction [B] at a`", "`sch.decompose_reduction(block, loop)`",
        "`C_init`"),
    name_after="a block name or `at`",
    creates_blocks=lambda s, block: (f"{named_block(s, block)}_init",))
# fmt: on

STATEMENTS = (RFACTOR, DECOMPOSE_REDUCTION)


# --- rfactor -------------------------------------------------------------------------------------


@facets.guard(RFACTOR)
def guard_rfactor(c: Checker, stmt: Rfactor, block: str) -> None:
    factored = c.axis(stmt.axis, block)
    # A unit loop that binds no iterator (left by a fuse or split written by hand) is one TVM
    # factors too: the rf block gets an iterator of extent 1 (TVM's rfactor tests).
    unit = factored.kind is LoopKind.OUTER and factored.extent == 1
    c.require(
        factored.kind is LoopKind.REDUCE or unit,
        f"rfactor needs a reduction axis; `{factored.name}` is {factored.kind.value}",
        stmt.axis.span,
    )
    buffer = c.nest.write_buffer(block)
    if stmt.factor_axis is not None and buffer is not None:
        # TVM takes [-ndim - 1, ndim] of the written buffer; the grammar has no negatives.
        ndim = len(buffer.shape)
        c.require(
            stmt.factor_axis.value <= ndim,
            f"factor_axis {stmt.factor_axis.value} is out of range: `{buffer.name}` has "
            f"{ndim} dimensions, so the factored axis goes at 0 to {ndim}",
            stmt.factor_axis.span,
            f"0 puts the factored axis first in the shape of `{buffer.name}_rf`, {ndim} last",
        )
    guarded = c.nest.guarded_spatial_loops(block)
    c.require(
        not guarded,
        f"rfactor of block {block} would write past `{getattr(buffer, 'name', '?')}`: TVM "
        f"drops the `if` on {', '.join(f'`{x.name}`' for x in guarded)} from the final "
        "reduction block (a TVM bug)",
        stmt.span,
        "the `if` comes from a split whose factor does not divide the extent: split by a "
        "divisor, or rfactor before splitting",
    )
    if not guarded and factored.extent is not None:
        live = live_iterations(c, block, factored)
        c.require(
            live is None or live == factored.extent,
            f"rfactor of `{factored.name}` would sum {factored.extent} partial results of which "
            f"only {live} are ever written: the `if` of a split skips the rest",
            stmt.span,
            f"TVM's final block adds up every partial result in `{getattr(buffer, 'name', '?')}"
            "_rf`, unwritten ones too (TVM 0.27)",
            "split by factors no larger than the extent, or rfactor a loop all of whose "
            "iterations run",
        )
    # Sized once every statement is applied: a later `compute_at` of the rf block shrinks its
    # buffer to one iteration's partial sums. A symbolic shape (a decoder's token count) has no
    # size to check: the tuner checks the schedule again on the function specialized at its
    # lengths, the largest included.
    static = buffer is not None and all(hasattr(d, "value") for d in buffer.shape)
    if buffer is not None and static and factored.extent is not None:
        made_buffer_fits_later(
            c,
            f"{buffer.name}_rf",
            math.prod(int(d) for d in buffer.shape) * factored.extent,
            buffer.dtype,
            stmt.span,
            f"`{buffer.name}_rf` holds one `{buffer.name}` per iteration of `{factored.name}` "
            f"({factored.extent}): split `{factored.name}` and rfactor the inner part",
        )
    new_block_free(c, stmt, RFACTOR.creates_blocks(stmt, block), f"{tvm_name(c.nest, block)}_rf")


def live_iterations(c: Checker, block: str, factored: Loop) -> int | None:
    """How many values of `factored` the block's `if` lets through for some iteration of the
    other loops, when the block is guarded and the `if` tests it (None otherwise). A value
    counts as live when the `if` holds with every other loop at its first iteration: exact for
    the `if` of a split (its parts only add up), and never too many otherwise."""
    import tvm
    import tvm.sym
    from tvm import tirx

    if not c.nest.is_guarded(block):
        return None
    sch = c.nest.sch
    get_realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")
    predicate = get_realize(sch, c.nest.block(block)).predicate
    nodes = {x.name: sch.get(x.rv) for x in c.nest.loops(block)}
    tested = {var.name for var in tirx.analysis.undefined_vars(predicate)}
    factored_var = nodes[factored.name].loop_var
    if factored_var.name not in tested:
        return None
    first = [(n.loop_var, n.min) for n in nodes.values() if n.loop_var.name in tested]
    factored_node = nodes[factored.name]
    extent = factored.extent or 0
    # The `if` of split parts grows with each part: past 4096 values, the last one decides.
    values = range(extent) if extent <= 4096 else (extent - 1,)
    live = 0
    for value in values:
        analyzer = tvm.sym.Analyzer()
        for var, start in first:
            if var.name != factored_var.name:
                analyzer.bind(var, start)
        analyzer.bind(factored_var, tirx.IntImm(str(factored_node.extent.ty), value))
        holds = analyzer.simplify(predicate)
        live += isinstance(holds, tirx.IntImm) and int(holds) == 1
    return live if extent <= 4096 else (extent if live else 0)


@facets.lower(RFACTOR)
def lower_rfactor(nest: Nest, block: str, stmt: Rfactor) -> None:
    made = nest.sch.rfactor(loop(nest, block, stmt.axis), factor_axis=stmt.factor_position)
    nest.name_block(made, stmt.alias.text if stmt.alias else None)


@facets.decompile(RFACTOR, "RFactor")
def decompile_rfactor(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    block, axis = reader.axis(inputs[0])
    position = int(attrs[0])
    if position < 0:  # TVM counts from the end as numpy does; schedlang from the front
        buffer = reader.nest.write_buffer(block)
        position += (len(buffer.shape) if buffer is not None else 0) + 1
    factor_axis = nodes.IntFactor(position) if position else None
    reader.emit(block, Rfactor(nodes.Name(axis), factor_axis=factor_axis))


def _reduce_loops(view: StepView, block: str) -> list[Loop]:
    return [loop for loop in view.free(block) if loop.kind is LoopKind.REDUCE]


@facets.steps(RFACTOR)
def _rfactor_steps(view: StepView, block: str, _: None) -> list[str]:
    return [f"rfactor {loop.name}" for loop in _reduce_loops(view, block)]


@facets.provenance(RFACTOR)
def _keep_alignment(c: Checker, stmt: Rfactor, block: str) -> None:
    """TVM gives the rfactor block the block's annotations, its storage_align among them: the
    alignment now pads a dimension of the new buffer too, whose dimensions are others (issue
    33). Remembered so that the allocation rule names the storage_align."""
    # Unnamed, the new block is TVM's `<block>_rf` (of the TVM name of a block named by `as`).
    new = stmt.alias.text if stmt.alias else f"{tvm_name(c.nest, block)}_rf"
    if not c.nest.has_block(new):
        return
    buffer, made = c.nest.write_buffer(block), c.nest.write_buffer(new)
    if buffer is not None and made is not None and buffer.name in c.aligned_by:
        c.aligned_by[made.name] = c.aligned_by[buffer.name]


# --- decompose_reduction -------------------------------------------------------------------------


@facets.guard(DECOMPOSE_REDUCTION)
def guard_decompose_reduction(c: Checker, stmt: DecomposeReduction, block: str) -> None:
    owner = c.existing_block(stmt.block) if stmt.block else block
    c.require(
        c.nest.is_reduction_block(owner),
        f"block {owner} is not a reduction",
        stmt.block.span if stmt.block else stmt.span,
    )
    at = c.axis(stmt.axis, owner)
    loops = c.nest.loops(owner)
    repeated = next(
        (x for x in loops[loops.index(at) :] if x.kind is LoopKind.OUTER and (x.extent or 2) > 1),
        None,
    )
    # Found by the differential fuzzer (layernorm's mean computed at a fused loop of normalize,
    # then decomposed at it): TVM hoists the init above the loop and the update repeats.
    c.require(
        repeated is None,
        f"decompose_reduction at `{at.name}` would initialize block {owner} once, outside "
        f"`{getattr(repeated, 'name', '')}`, which repeats the whole reduction: each iteration "
        "would add to the last one's result",
        stmt.axis.span,
        f"`{getattr(repeated, 'name', '')}` binds none of block {owner}'s iterators (the block "
        "was computed at it): decompose at a loop inside it",
    )


@facets.lower(DECOMPOSE_REDUCTION)
def lower_decompose_reduction(nest: Nest, block: str, stmt: DecomposeReduction) -> None:
    owner = named_block(stmt, block)
    owner_rv = nest.block(owner)
    nest.sch.decompose_reduction(owner_rv, loop(nest, owner, stmt.axis))
    # TVM renames the block `<name>_update`; the schedule keeps calling it by its name.
    nest.name_block(owner_rv, owner)


@facets.provenance(DECOMPOSE_REDUCTION)
def _remember_decomposed(c: Checker, stmt: DecomposeReduction, block: str) -> None:
    c.decomposed[named_block(stmt, block)] = stmt.span.line


@facets.decompile(DECOMPOSE_REDUCTION, "DecomposeReduction")
def decompile_decompose_reduction(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    owner, axis = owner_and_loop(reader, inputs)
    reader.emit(owner, DecomposeReduction(None, nodes.Name(axis)))


@facets.steps(DECOMPOSE_REDUCTION)
def _decompose_steps(view: StepView, block: str, _: None) -> list[str]:
    """Last on a GPU: after it the update block's loops can no longer be bound."""
    if not _reduce_loops(view, block) or (view.gpu and view.pending):
        return []
    return [f"decompose_reduction at {loop.name}" for loop in view.loops(block)]
