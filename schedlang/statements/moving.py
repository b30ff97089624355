"""Moving and inlining blocks: `compute_at`, `reverse_compute_at`, `compute_inline`,
`reverse_compute_inline`."""

from __future__ import annotations

from typing import Any

from schedlang import ast
from schedlang.loop import Loop
from schedlang.statements.base import Statement, at_loop, keep, loop, take_keep


def keeps_guard(c: Any, moved: str, stmt: ast.ComputeAt | ast.ReverseComputeAt) -> None:
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


def buffers_under(c: Any, loop: Loop, excluded: str) -> tuple[set[str], set[str]]:
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


def _format_move(stmt: ast.ComputeAt | ast.ReverseComputeAt) -> str:
    return f"{stmt.keyword} {stmt.block.text} {stmt.axis.text}{keep(stmt.keep_unit_loops)}"


def _build_move(kind):
    def build(b, meta, children):
        keep_unit_loops = take_keep(children)
        return kind(b._name(children[0]), children[1], keep_unit_loops, span=b._at(meta))

    return build


def _moved(stmt: ast.ComputeAt | ast.ReverseComputeAt) -> str:
    return stmt.block.text


def _covers_domain(c: Any, stmt: ast.ComputeAt | ast.ReverseComputeAt, block: str) -> None:
    c.covers_domain(stmt)


# --- compute_at ----------------------------------------------------------------------------------


def guard_compute_at(c: Any, stmt: ast.ComputeAt, block: str) -> None:
    moved = c.existing_block(stmt.block)
    c.require(moved != block, f"cannot compute block {block} at its own loop", stmt.span)
    keeps_guard(c, moved, stmt)
    target = at_loop(c, stmt.axis, block)
    reads, _ = buffers_under(c, target, moved)
    c.require(
        bool(reads & set(c.nest.writes(moved))),
        f"compute_at moves a producer into a loop of its consumer, but no block under "
        f"`{target.name}` reads what block {moved} writes",
        stmt.span,
        f"to move a consumer after its producer, use `reverse_compute_at {moved} {target.name}`",
    )


COMPUTE_AT = Statement(
    keyword="compute_at",
    node=ast.ComputeAt,
    family="moving",
    roles={"block": "block", "axis": "axis"},
    name_role="block",
    example="e.g. `compute_at A_shared k.o` or `compute_at A_shared k.o keep_unit_loops`",
    description="compute block BLOCK inside loop AXIS of the current block, only what that "
    "iteration needs; keep_unit_loops keeps its new loops of extent 1.",
    build=_build_move(ast.ComputeAt),
    format=_format_move,
    guard=guard_compute_at,
    lower=lambda nest, block, s: nest.sch.compute_at(
        nest.block(s.block.text), loop(nest, block, s.axis), preserve_unit_loops=s.keep_unit_loops
    ),
    summary=(
        "`compute_at B a [keep_unit_loops]`",
        "`sch.compute_at(block, loop, preserve_unit_loops=…)`",
        "loops `ax0` …",
    ),
    instruction="ComputeAt",
    moves_block=_moved,
    soundness=_covers_domain,
)


# --- reverse_compute_at --------------------------------------------------------------------------


def guard_reverse_compute_at(c: Any, stmt: ast.ReverseComputeAt, block: str) -> None:
    # TVM checks only that the block's producers are under the loop, so it moves a block
    # with no producer block (one reading only inputs) anywhere, even after its consumers.
    moved = c.existing_block(stmt.block)
    c.require(moved != block, f"cannot compute block {block} at its own loop", stmt.span)
    keeps_guard(c, moved, stmt)
    target = at_loop(c, stmt.axis, block)
    _, writes = buffers_under(c, target, moved)
    c.require(
        bool(writes & set(c.nest.reads(moved))),
        f"reverse_compute_at moves a consumer into a loop of its producer, but block "
        f"{moved} reads nothing the blocks under `{target.name}` write",
        stmt.span,
        f"to move a producer before its consumer, use `compute_at {moved} {target.name}`",
    )


REVERSE_COMPUTE_AT = Statement(
    keyword="reverse_compute_at",
    node=ast.ReverseComputeAt,
    family="moving",
    roles={"block": "block", "axis": "axis"},
    name_role="block",
    example="e.g. `reverse_compute_at C_local j.o` or "
    "`reverse_compute_at C_local j.o keep_unit_loops`",
    description="compute consumer block BLOCK inside loop AXIS of the current block; "
    "keep_unit_loops as for compute_at.",
    build=_build_move(ast.ReverseComputeAt),
    format=_format_move,
    guard=guard_reverse_compute_at,
    lower=lambda nest, block, s: nest.sch.reverse_compute_at(
        nest.block(s.block.text), loop(nest, block, s.axis), preserve_unit_loops=s.keep_unit_loops
    ),
    summary=(
        "`reverse_compute_at B a [keep_unit_loops]`",
        "`sch.reverse_compute_at(block, loop, preserve_unit_loops=…)`",
        "loops `ax0` …",
    ),
    instruction="ReverseComputeAt",
    moves_block=_moved,
    soundness=_covers_domain,
)


# --- compute_inline, reverse_compute_inline ------------------------------------------------------


def guard_compute_inline(c: Any, stmt: ast.ComputeInline, block: str) -> None:
    c.existing_block(stmt.block)


COMPUTE_INLINE = Statement(
    keyword="compute_inline",
    node=ast.ComputeInline,
    family="moving",
    roles={"block": "block"},
    name_role="block",
    example="e.g. `compute_inline B`",
    description="inline elementwise block BLOCK into its consumers.",
    build=lambda b, meta, children: ast.ComputeInline(b._name(children[0]), span=b._at(meta)),
    format=lambda s: f"compute_inline {s.block.text}",
    guard=guard_compute_inline,
    lower=lambda nest, block, s: nest.sch.compute_inline(nest.block(s.block.text)),
    summary=("`compute_inline B`", "`sch.compute_inline(block)`", "—"),
    instruction="ComputeInline",
)


def guard_reverse_compute_inline(c: Any, stmt: ast.ReverseComputeInline, block: str) -> None:
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


REVERSE_COMPUTE_INLINE = Statement(
    keyword="reverse_compute_inline",
    node=ast.ReverseComputeInline,
    family="moving",
    roles={"block": "block"},
    name_role="block",
    example="e.g. `reverse_compute_inline D`",
    description="inline elementwise block BLOCK into its producer.",
    build=lambda b, meta, children: ast.ReverseComputeInline(
        b._name(children[0]), span=b._at(meta)
    ),
    format=lambda s: f"reverse_compute_inline {s.block.text}",
    guard=guard_reverse_compute_inline,
    lower=lambda nest, block, s: nest.sch.reverse_compute_inline(nest.block(s.block.text)),
    summary=("`reverse_compute_inline B`", "`sch.reverse_compute_inline(block)`", "—"),
    instruction="ReverseComputeInline",
)

STATEMENTS = (COMPUTE_AT, REVERSE_COMPUTE_AT, COMPUTE_INLINE, REVERSE_COMPUTE_INLINE)
