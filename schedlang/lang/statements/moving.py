"""Moving and inlining blocks: `compute_at`, `reverse_compute_at`, `compute_inline`,
`reverse_compute_inline`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from schedlang.lang import nodes
from schedlang.lang.loop import Loop
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import Axis, Block, Int, KeepUnitLoops
from schedlang.lang.statements.base import at_loop, loop, outside_reduction
from schedlang.lang.statements.decoding import StepView
from schedlang.lang.statements.decompiling import Decompile, TraceReader
from schedlang.lang.statements.facets import Syntax

if TYPE_CHECKING:
    from tvm import s_tir

    from schedlang.lang import tir_values
    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker


def keeps_guard(c: Checker, moved: str, stmt: ComputeAt | ReverseComputeAt) -> None:
    """TVM moves a block by regenerating its loops over its iterators' domains, dropping the
    `if` of a non-divisible split when the iterators are the split's parts (after rfactor): the
    moved block then reads and writes out of bounds. Found by fuzzing (tests/test_fuzz.py)."""
    c.require(
        not c.nest.guards_own_iterators(moved),
        f"`{stmt.keyword}` would drop the `if` that block {moved} runs under, and compute it "
        "out of bounds",
        stmt.block.span,
        f"block {moved} was made by rfactor of a split whose factor does not divide the "
        "extent: split by a divisor, or leave the block where it is",
    )


def buffers_under(c: Checker, loop: Loop, excluded: str) -> tuple[set[str], set[str]]:
    """The buffers read and written by the blocks under `loop`, except block `excluded`."""
    sch, excluded_rv = c.nest.sch, c.nest.block(excluded)
    blocks = [
        sch.get(rv)
        for rv in sch.get_child_blocks(loop.rv)
        if not sch.get_sref(rv).same_as(sch.get_sref(excluded_rv))
    ]
    reads = {region.source.name for b in blocks for region in b.reads}
    writes = {region.source.name for b in blocks for region in b.writes}
    return reads, writes


def index_fits(c: Checker, stmt: ComputeAt | ReverseComputeAt, moved: str, target: Loop) -> None:
    """`index N` places the block among what the loop's body holds now: 0 to that many, and
    after every statement of the body that holds a producer of the block, before every one that
    holds a consumer (TVM's own window; its error for an index outside it is only "Valid index")."""
    if stmt.index is None:
        return
    body = c.nest.sch.get(target.rv).body
    children = len(body.seq) if hasattr(body, "seq") else 1
    value = stmt.index.value
    if not c.require(
        value <= children,
        f"index {value} is out of range: the body of `{target.name}` holds "
        f"{children} statement{'s' * (children != 1)}, so the block goes at 0 to {children}",
        stmt.index.span,
        "0 puts it first; leave `index` out to put it last",
    ):
        return
    first, last = index_window(c.nest, moved, target)
    c.require(
        first > last or first <= value <= last,  # no place at all: the other rules say why
        f"index {value} is out of range: block {moved} goes after its producers and before its "
        f"consumers in the body of `{target.name}`, at {first} to {last}",
        stmt.index.span,
        "leave `index` out to put it where TVM would",
    )


def index_window(nest: Nest, moved: str, target: Loop) -> tuple[int, int]:
    """The positions in the body of `target` where block `moved` may go: after the last statement
    that holds a block writing what it reads, up to the first that holds one reading what it
    writes."""
    sch = nest.sch
    body = sch.get(target.rv).body
    target_sref, moved_sref = sch.get_sref(target.rv), sch.get_sref(nest.block(moved))
    reads, writes = set(nest.reads(moved)), set(nest.writes(moved))
    first, last = 0, len(body.seq) if hasattr(body, "seq") else 1
    for rv in sch.get_child_blocks(target.rv):
        sref = sch.get_sref(rv)
        if sref.same_as(moved_sref):
            continue
        while not sref.parent.same_as(target_sref):
            sref = sref.parent
        position, block = max(sref.seq_index, 0), sch.get(rv)
        if reads & {region.source.name for region in block.writes}:
            first = max(first, position + 1)
        if writes & {region.source.name for region in block.reads}:
            last = min(last, position)
    return first, last


@dataclass(frozen=True)
class MoveStmt(nodes.Stmt):
    """`compute_at B k.o [keep_unit_loops] [index N]` (and `reverse_compute_at`): with the option,
    B keeps the loops of extent 1 it gets under k.o (TVM's preserve_unit_loops)."""

    block: nodes.Name
    axis: nodes.Name
    keep_unit_loops: bool = False
    # `index N`: the block goes at position N among the loop's children (TVM's `index`); last
    # when not given.
    index: nodes.IntFactor | None = None


class ComputeAt(MoveStmt, keyword="compute_at"): ...


class ReverseComputeAt(MoveStmt, keyword="reverse_compute_at"): ...


@dataclass(frozen=True)
class InlineStmt(nodes.Stmt):
    """`compute_inline B` (and `reverse_compute_inline`): block B disappears into another."""

    block: nodes.Name


class ComputeInline(InlineStmt, keyword="compute_inline"): ...


class ReverseComputeInline(InlineStmt, keyword="reverse_compute_inline"): ...


# fmt: off
COMPUTE_AT = Syntax("compute_at", ComputeAt, "moving",
    (Block(moved=True), Axis(), KeepUnitLoops(), Int("index", word="index", optional=True)),
    example="e.g. `compute_at A_shared k.o`, `compute_at A_shared k.o keep_unit_loops` or "
    "`compute_at B i index 0`",
    description="compute block BLOCK inside loop AXIS of the current block, only what that "
    "iteration needs; keep_unit_loops keeps its new loops of extent 1; index N puts it at "
    "position N of the loop's body (default last). Its new loops are named after its "
    "iteration variables.",
    summary=("`compute_at B a [keep_unit_loops] [index n]`",
        "`sch.compute_at(block, loop, preserve_unit_loops=…, index=n)`",
        "B's loops, named after its iteration variables"))

REVERSE_COMPUTE_AT = Syntax("reverse_compute_at", ReverseComputeAt, "moving",
    (Block(moved=True), Axis(), KeepUnitLoops(), Int("index", word="index", optional=True)),
    example="e.g. `reverse_compute_at C_local j.o`, "
    "`reverse_compute_at C_local j.o keep_unit_loops` or `reverse_compute_at C x index 0`",
    description="compute consumer block BLOCK inside loop AXIS of the current block; "
    "keep_unit_loops as for compute_at.",
    summary=("`reverse_compute_at B a [keep_unit_loops] [index n]`",
        "`sch.reverse_compute_at(block, loop, preserve_unit_loops=…, index=n)`",
        "B's loops, named after its iteration variables"))

COMPUTE_INLINE = Syntax("compute_inline", ComputeInline, "moving", (Block(),),
    example="e.g. `compute_inline B`",
    description="inline elementwise block BLOCK into its consumers.",
    summary=("`compute_inline B`", "`sch.compute_inline(block)`", "—"))

REVERSE_COMPUTE_INLINE = Syntax("reverse_compute_inline", ReverseComputeInline, "moving",
    (Block(),),
    example="e.g. `reverse_compute_inline D`",
    description="inline elementwise block BLOCK into its producer.",
    summary=("`reverse_compute_inline B`", "`sch.reverse_compute_inline(block)`", "—"))
# fmt: on

STATEMENTS = (COMPUTE_AT, REVERSE_COMPUTE_AT, COMPUTE_INLINE, REVERSE_COMPUTE_INLINE)


@facets.lower(COMPUTE_AT)
@facets.lower(REVERSE_COMPUTE_AT)
def lower_move(nest: Nest, block: str, stmt: ComputeAt | ReverseComputeAt) -> None:
    move = nest.sch.compute_at if isinstance(stmt, ComputeAt) else nest.sch.reverse_compute_at
    target = loop(nest, block, stmt.axis)
    index = stmt.index.value if stmt.index is not None else -1
    move(nest.block(stmt.block.text), target, preserve_unit_loops=stmt.keep_unit_loops, index=index)
    nest.changed()
    name_new_loops(nest, stmt.block.text, target)


def name_new_loops(nest: Nest, moved: str, target: s_tir.LoopRV) -> None:
    """TVM names the loops it makes for a moved block ax0, ax1, …; each covers one iteration
    variable of the block, whose name it takes (`v_y` gives `y`). A cache block's variables
    (v0, v1, …) say nothing, so its loops keep their names. The old names still resolve."""
    from tvm import tirx  # lowering has imported TVM already; the registry does not need it

    sch, loops = nest.sch, nest.loops(moved)
    target_sref = sch.get_sref(target)
    at = next(n for n, x in enumerate(loops) if sch.get_sref(x.rv).same_as(target_sref))
    realize = nest.realize(moved)
    taken = {x.name for x in loops}
    for new in loops[at + 1 :]:
        var = sch.get(new.rv).loop_var
        iter_var = next(
            (
                iv.var.name
                for iv, value in zip(realize.block.iter_vars, realize.iter_values, strict=True)
                if any(v.same_as(var) for v in tirx.analysis.undefined_vars(value))
            ),
            None,
        )
        if iter_var is None or not iter_var.startswith("v_") or iter_var[2:] in taken:
            continue
        nest.set_name(new.rv, iter_var[2:], copies=False)
        nest.former_names[(moved, new.name)] = iter_var[2:]
        taken.add(iter_var[2:])


def _moved(stmt: ComputeAt | ReverseComputeAt) -> str:
    return stmt.block.text


# --- soundness: what TVM moves without complaint but computes wrong ------------------------------


@facets.soundness(COMPUTE_AT)
@facets.soundness(REVERSE_COMPUTE_AT)
def covers_domain(c: Checker, stmt: ComputeAt | ReverseComputeAt, block: str) -> None:
    """A moved block must still compute every point it writes that someone reads. TVM
    regenerates a consumer's loops over what its producer writes under the loop: a padding
    block moved into the loop of the copy of its input computes only the interior, and the
    border is never written (TVM 0.27). A producer keeps what its consumers under the loop
    read: that is all of it unless the producer writes an output of the function."""
    moved = stmt.block.text
    if isinstance(stmt, ReverseComputeAt):
        if not outside_reduction(c, stmt, moved, block, stmt.axis):
            return
        if not reads_whole_elements(c, stmt, moved, block):
            return
    # A moved reduction must still run over its whole reduction: TVM regenerates its reduction
    # loops from the region the producer writes under the loop, and with a stride it can come
    # out short (a 3x3 depthwise window at stride 3 reduced over 1 row: partial sums; found by
    # the differential fuzzer, TVM 0.27).
    points_covered(c, stmt, "reduction")
    if isinstance(stmt, ComputeAt) and not writes_output(c, moved):
        return
    points_covered(c, stmt, "spatial")


# The points a moved block needs and those it gets (None: not known).
_Count = Callable[["Nest", str], tuple[int | None, int | None]]

# What a moved block must still cover, by kind of point: how to count the points it needs and
# those it gets, what it does with them, what they are called, what follows, and the fix.
_COVERED: dict[str, tuple[_Count, tuple[str, str, str], str]] = {
    "spatial": (
        lambda nest, b: (nest.spatial_points(b), nest.spatial_iterations(b)),
        ("computing", "points", "the rest would never be written"),
        "the loop it is moved to runs only over part of what block {moved} writes "
        "(a padding border, say): leave block {moved} where it is",
    ),
    "reduction": (
        lambda nest, b: (nest.reduce_points(b), nest.reduce_iterations(b)),
        ("reducing over", "reduction points", "its results would be partial sums"),
        "TVM gives block {moved} reduction loops over only what the blocks under the loop "
        "provide: leave block {moved} where it is",
    ),
}


def points_covered(c: Checker, stmt: ComputeAt | ReverseComputeAt, kind: str) -> None:
    """After the move, block `stmt.block` runs over every point of `kind` ("spatial" or
    "reduction") it needs, when both counts are known."""
    moved = stmt.block.text
    count, (doing, points, consequence), fix = _COVERED[kind]
    needed, done = count(c.nest, moved)
    if needed is None or done is None:
        return
    c.require(
        done >= needed,
        f"`{stmt.keyword}` leaves block {moved} {doing} {done} of its {needed} {points}: "
        f"{consequence}",
        stmt.block.span,
        fix.format(moved=moved),
    )


def reads_whole_elements(c: Checker, stmt: ReverseComputeAt, moved: str, producer: str) -> bool:
    """TVM gives a moved consumer loops over what it reads of the blocks under the loop; where
    the consumer reads a window or a strided slice of that (a convolution moved into the loops
    of its padding block) the loops come out over too small a region, and some of its
    instances never run: wrong values (TVM 0.27, found by the differential fuzzer). Exact where
    the moved block's instances can be counted (`instances_run`); where they cannot, allowed
    only for a consumer reading one element per point, each index one of its iterators or a
    constant (plus a constant)."""
    from tvm import tirx  # the checker has imported TVM already; the registry does not need it

    loop = c.nest.find(producer, stmt.axis.text)
    if loop is None:
        return True
    counted = instances_run(c, moved)
    if counted is not None:
        return c.require(
            counted.reached == counted.domain,
            f"`{stmt.keyword}` leaves block {moved} running {counted.reached} of the "
            f"{counted.domain} instances of its iteration domain: TVM gives it loops over too "
            f"small a region of what block {producer} writes under `{loop.name}`, and the rest "
            "would never run",
            stmt.block.span,
            f"the rest read nothing block {producer} writes there (a padding border), or TVM "
            "under-covers a window or stride of it (TVM 0.27: wrong values, found by the "
            "differential fuzzer)",
            f"compute block {producer} at a loop of block {moved} instead "
            f"(`compute_at {producer} …` in block {moved}'s section), or leave block {moved} "
            "where it is",
        )
    _, written = buffers_under(c, loop, moved)
    for region in c.nest.sch.get(c.nest.block(moved)).reads:
        if region.source.name not in written:
            continue
        for index in region.region:
            start = index.min
            plain = isinstance(start, tirx.Var | tirx.IntImm) or (
                isinstance(start, tirx.Add | tirx.Sub)
                and isinstance(start.a, tirx.Var)
                and isinstance(start.b, tirx.IntImm)
            )
            if plain and isinstance(index.extent, tirx.IntImm) and int(index.extent) == 1:
                continue
            return c.require(
                False,
                f"`{stmt.keyword}` of block {moved}, which reads "
                f"`{region.source.name}[… {start} …]`, a window or stride of what block "
                f"{producer} writes under `{loop.name}`: TVM would give it loops over too "
                f"small a region of what block {producer} writes",
                stmt.block.span,
                f"compute block {producer} at a loop of block {moved} instead "
                f"(`compute_at {producer} …` in block {moved}'s section)",
                "a TVM bug (0.27): wrong values, found by the differential fuzzer",
            )
    return True


def instances_run(c: Checker, block: str) -> tir_values.Instances | None:
    """The instances of `block`'s iteration domain its loops run, counted with numpy over every
    iteration; None where a loop's range is not a constant or they are too many to count."""
    from tvm import tirx

    from schedlang.lang import tir_values

    loops = {}
    for x in c.nest.loops(block):
        loop = c.nest.sch.get(x.rv)
        if not isinstance(loop.min, tirx.IntImm) or not isinstance(loop.extent, tirx.IntImm):
            return None
        loops[loop.loop_var] = (int(loop.min), int(loop.extent))
    return tir_values.instances(c.nest.realize(block), loops)


def writes_output(c: Checker, block: str) -> bool:
    return any(buffer in c.param_buffers for buffer in c.nest.writes(block))


# --- compute_at ----------------------------------------------------------------------------------


@facets.guard(COMPUTE_AT)
@facets.guard(REVERSE_COMPUTE_AT)
def guard_move(c: Checker, stmt: ComputeAt | ReverseComputeAt, block: str) -> None:
    """compute_at moves a producer into a loop of its consumer, reverse_compute_at a consumer into
    a loop of its producer. TVM checks only that the producers of a reverse_compute_at's block are
    under the loop, so it moves a block with no producer block (one reading only inputs) anywhere,
    even after its consumers: each direction is checked here."""
    moved = c.existing_block(stmt.block)
    c.require(moved != block, f"cannot compute block {block} at its own loop", stmt.span)
    keeps_guard(c, moved, stmt)
    target = at_loop(c, stmt.axis, block)
    index_fits(c, stmt, moved, target)
    reads, writes = buffers_under(c, target, moved)
    if isinstance(stmt, ComputeAt):
        c.require(
            bool(reads & set(c.nest.writes(moved))),
            f"compute_at moves a producer into a loop of its consumer, but no block under "
            f"`{target.name}` reads what block {moved} writes",
            stmt.span,
            f"to move a consumer after its producer, use `reverse_compute_at {moved} "
            f"{target.name}`",
        )
        return
    c.require(
        bool(writes & set(c.nest.reads(moved))),
        f"reverse_compute_at moves a consumer into a loop of its producer, but block "
        f"{moved} reads nothing the blocks under `{target.name}` write",
        stmt.span,
        f"to move a producer before its consumer, use `compute_at {moved} {target.name}`",
    )


def _decompile_move(
    kind: type[ComputeAt] | type[ReverseComputeAt],
) -> Decompile:
    def decompile(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
        moved = reader.block_name(inputs[0])
        if reader.reference.get_sref(inputs[1]).stmt is None:  # a sampled "root" or "inline"
            if reader.location(moved) == -2:
                reader.emit(reader.other_section(moved), ComputeInline(nodes.Name(moved)))
            return
        block, axis = reader.axis(inputs[1], exclude=moved)
        keep = bool(attrs[0])  # preserve_unit_loops
        position = int(attrs[1])  # -1: where TVM puts it, -2: the first place it may go
        if position == -2:
            target = next(x for x in reader.nest.loops(block) if x.name == axis)
            position = index_window(reader.nest, moved, target)[0]
        index = None if position == -1 else nodes.IntFactor(position)
        stmt = kind(nodes.Name(moved), nodes.Name(axis), keep, index)
        reader.emit(block, stmt)
        # MetaSchedule asks to keep unit loops on every move; say so only where one was kept
        # (where none is made, both give the same nest).
        if keep and not _unit_loops_below(reader.nest, moved, axis):
            reader.restate(replace(stmt, keep_unit_loops=False))

    return decompile


def _unit_loops_below(nest: Nest, block: str, axis: str) -> bool:
    """Whether block `block` has a loop of extent 1 inside its loop `axis`."""
    loops = nest.loops(block)
    names = [loop.name for loop in loops]
    inside = loops[names.index(axis) + 1 :] if axis in names else []
    return any(loop.extent == 1 for loop in inside)


def _move_steps(keyword: str) -> Callable[[StepView, str, str], list[str]]:
    """`keyword OTHER a` for every loop `a` of the block."""

    def steps(view: StepView, block: str, other: str) -> list[str]:
        return [f"{keyword} {other} {loop.name}" for loop in view.loops(block)]

    return steps


# --- compute_inline, reverse_compute_inline ------------------------------------------------------


@facets.guard(COMPUTE_INLINE)
def guard_compute_inline(c: Checker, stmt: ComputeInline, block: str) -> None:
    c.existing_block(stmt.block)


def _decompile_inline(
    kind: type[ComputeInline] | type[ReverseComputeInline],
) -> Decompile:
    def decompile(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
        inlined = reader.block_name(inputs[0])
        reader.emit(reader.other_section(inlined), kind(nodes.Name(inlined)))

    return decompile


@facets.guard(REVERSE_COMPUTE_INLINE)
def guard_reverse_compute_inline(c: Checker, stmt: ReverseComputeInline, block: str) -> None:
    # TVM's own message for this case ("reads 1 region(s)") does not say what is wrong.
    inlined = c.existing_block(stmt.block)
    inputs = list(dict.fromkeys(c.nest.reads(inlined)))
    produced = {buffer for b in c.nest.block_names() for buffer in c.nest.writes(b)}
    c.require(
        any(buffer in produced for buffer in inputs),
        f"block {inlined} has no producer block to be inlined into: it reads only "
        + ", ".join(f"`{buffer}`" for buffer in inputs),
        stmt.block.span,
        "reverse_compute_inline moves a consumer into the block that produces its input",
    )
    # TVM inlines it into a producer whose buffer another block also reads, and drops that
    # buffer: "Buffer exp is used before its definition" (softmax 1 x 1 after rfactor; found
    # by the differential fuzzer, TVM 0.27).
    for buffer in inputs:
        others = [
            b
            for b in c.nest.block_names()
            if b != inlined and buffer in c.nest.reads(b) and buffer not in c.nest.writes(b)
        ]
        if buffer in produced and others:
            c.error(
                f"block {inlined} cannot be inlined into the block that writes `{buffer}`: "
                f"block {others[0]} reads `{buffer}` too, and TVM would drop it",
                stmt.block.span,
                "TVM builds a kernel that reads the buffer before it exists (a TVM bug, 0.27)",
            )
            return


def _inline_steps(keyword: str) -> Callable[[StepView, str, str], list[str]]:
    """Inlining each other block into this one (the check keeps those that can be)."""

    def steps(view: StepView, block: str, other: str) -> list[str]:
        return [f"{keyword} {other}"]

    return steps


@facets.lower(COMPUTE_INLINE)
@facets.lower(REVERSE_COMPUTE_INLINE)
def _lower_inline(nest: Nest, block: str, stmt: ComputeInline | ReverseComputeInline) -> None:
    inline = getattr(nest.sch, stmt.keyword)  # sch.compute_inline, sch.reverse_compute_inline
    inline(nest.block(stmt.block.text))


facets.decompile(COMPUTE_AT, "ComputeAt")(_decompile_move(ComputeAt))
facets.decompile(REVERSE_COMPUTE_AT, "ReverseComputeAt")(_decompile_move(ReverseComputeAt))
facets.decompile(COMPUTE_INLINE, "ComputeInline")(_decompile_inline(ComputeInline))
facets.decompile(REVERSE_COMPUTE_INLINE, "ReverseComputeInline")(
    _decompile_inline(ReverseComputeInline)
)
facets.steps(COMPUTE_AT, over="other block")(_move_steps("compute_at"))
facets.steps(REVERSE_COMPUTE_AT, over="other block")(_move_steps("reverse_compute_at"))
facets.steps(COMPUTE_INLINE, over="other block")(_inline_steps("compute_inline"))
facets.steps(REVERSE_COMPUTE_INLINE, over="other block")(_inline_steps("reverse_compute_inline"))
