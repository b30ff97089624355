"""The whole-kernel rules: what no single statement shows, checked once every statement is.

An unroll that a later split made too large, a reduction replayed or read while it still runs,
and the dataflow of the finished kernel (schedlang.checker.dataflow): each is something TVM
applies without complaint but builds slowly or computes wrong. Each rule reads the checker's live
nest and provenance (what earlier statements made and moved) and reports through it; the GPU's
own rules are schedlang.checker.gpu_rules.
"""

from __future__ import annotations

import math
import re

from tvm import s_tir, tirx

from schedlang.checker import dataflow, gpu_rules, kernel_size
from schedlang.checker.state import CheckerState
from schedlang.core.diagnostics import Span
from schedlang.core.target import Target
from schedlang.lang import tir_values
from schedlang.lang.loop import Loop, LoopKind
from schedlang.lang.statements.base import compiler, format_bytes, made_buffer_fits
from schedlang.lang.statements.layout import PREPACK_ANNOTATION, at_root
from schedlang.lang.statements.loop_kinds import unrolled_size_fits


def check_kernel(c: CheckerState) -> None:
    """The whole-schedule rules, once every statement is checked."""
    unrolled_copies_fit(c)
    unrolled_statements_fit(c)
    prepacked_at_root(c)
    if c.target.is_gpu:
        gpu_rules.check_schedule(c)
    # The rules below lower the kernel with TVM's own passes: only a schedule with no error so
    # far (TVM 0.27 segfaults in its region analysis on some, e.g. a GPU kernel with unbound
    # blocks, as stepwise decoding checks them on its way).
    # A partial GPU schedule's unbound blocks are not an error, but the kernel is not finished.
    made_buffers_fit(c)
    if not any(d.is_error for d in c.diagnostics) and not c.unbound:
        allocations_fit(c)
    finished = not any(d.is_error for d in c.diagnostics) and not c.unbound
    if finished and not (no_replayed_reduction(c) or no_partial_reads(c)):
        sound_dataflow(c)
    if not c.target.is_gpu and not any(d.is_error for d in c.diagnostics):
        self_unrolled_copies_fit(c)  # a slow build is said once the kernel is right


def prepacked_at_root(c: CheckerState) -> None:
    """A `prepack`ed block still stands alone at the root: a later `compute_at` of it, or of
    another block into its loops, would leave TVM nothing to split off (checked as written too)."""
    for block in c.nest.block_names():
        if PREPACK_ANNOTATION in c.nest._block(block).annotations:
            at_root(c, block, last_moved(c, [block]))


def no_replayed_reduction(c: CheckerState) -> bool:
    """No reduction block under a loop that feeds none of its iterators, inside a loop that
    feeds its reduction: each iteration of that loop would add the same terms again. A
    `reverse_compute_at` of a reduction to a loop of a block inside its own nest leaves it so
    (TVM 0.27; found by the differential fuzzer). True if one is reported."""
    for block in c.nest.block_names():
        reducing = None
        for loop in c.nest.loops(block):
            if loop.kind in (LoopKind.REDUCE, LoopKind.MIXED):
                reducing = loop
            elif loop.kind == LoopKind.OUTER and reducing is not None and loop.extent != 1:
                c.error(
                    f"block {block} is a reduction under `{loop.name}`, a loop that feeds "
                    f"none of its iterators, inside `{reducing.name}`, which feeds its "
                    f"reduction: each iteration of `{loop.name}` adds the same terms again",
                    last_moved(c, [block]),
                    f"move block {block} to a loop outside `{reducing.name}`, or leave it "
                    "where it was",
                )
                return True
    return False


def no_partial_reads(c: CheckerState) -> bool:
    """No block reads a reduction's output inside a loop over which the reduction still runs:
    it would read partial sums. Checked on the finished kernel, since a later statement can
    move either block there (a split of the loop a row sum was computed at, then a consumer
    moved to its outer part; found by the differential fuzzer). Thread loops are left out:
    TVM completes a reduction across threads before they go on. True if one is reported."""
    for writer in c.nest.block_names():
        if not c.nest.is_reduction_block(writer):
            continue
        written = set(c.nest.writes(writer))
        for reader in c.nest.block_names():
            read = written & set(c.nest.reads(reader))
            if reader == writer or not read:
                continue
            partial = next(
                (
                    x
                    for x in c.nest.shared_loops(writer, reader)
                    if x.kind in (LoopKind.REDUCE, LoopKind.MIXED)
                    and not (x.thread or "").startswith(("threadIdx", "vthread"))
                ),
                None,
            )
            if partial is not None:
                buffer = ", ".join(sorted(read))
                c.error(
                    f"block {reader} reads `{buffer}` inside `{partial.name}`, over which "
                    f"block {writer} still reduces: it would read partial results",
                    last_moved(c, [reader, writer]),
                    f"compute block {reader} at a loop outside `{partial.name}`",
                )
                return True
    return False


# The findings of sound_dataflow reported in one sentence each: the message (a format of block,
# point, at, writers and shape), the checker's record of the statement to blame if any (else the
# last statement that moved the blocks), and the hint.
_FINDINGS = {
    "out of bounds": (
        "block {block} reaches {point}{at}, outside the buffer ({shape}): TVM sized the "
        "buffer or the block's loops without an `if` the schedule depends on (TVM 0.27)",
        None,
        "compute the blocks at loops outside the guarded, fused or strided ones, or pick "
        "split factors that divide the extents",
    ),
    "out of bounds as written": (
        "block {block} reaches {point}{at}, outside the buffer ({shape}): the function "
        "reaches outside it as written, before any statement of the schedule",
        None,
        "fix the function's indices or its buffers' shapes: TVM builds it, and the kernel "
        "would read or write memory outside the buffer",
    ),
    "wiped": (
        "block {block} starts {point} over again{at}, after block {writers[0]} has "
        "added to it: the init runs more than once for a point (under a loop that "
        "feeds none of its iterators, or a fused one that comes back to the point) and "
        "updates come between the runs",
        "decomposed_by",
        "decompose the reduction at a loop inside that loop, or leave it undecomposed",
    ),
    "replayed": (
        "block {block} adds the same terms to {point} twice{at}, with no init between: "
        "a loop above it comes back to the point and runs the whole reduction again",
        "decomposed_by",
        "keep each point's reduction in one iteration of the loops above it (compute the "
        "block at a loop that feeds its iterators one to one), or leave it undecomposed",
    ),
    "late init": (
        "block {block}'s reduction starts {point} (its init) after it has added terms "
        "to it: loops fused from spatial and reduction loops run in another order than "
        "the fused one",
        "reordered_by",
        "keep the parts of a loop fused from a reduction in their order, or fuse only "
        "spatial loops",
    ),
}


def sound_dataflow(c: CheckerState) -> None:
    """What every block reads was written before, in the same iteration of the loops it
    shares with the writers, and every index is inside its buffer
    (schedlang.checker.dataflow)."""
    from schedlang.checker import dataflow

    finding = dataflow.find_unsound(c.nest.sch.mod["main"], c.target.to_tvm())
    if finding is None:
        return
    reverse = {tvm_name: alias for alias, tvm_name in c.nest.block_aliases.items()}
    block = reverse.get(finding.block, finding.block)
    writers = [reverse.get(w, w) for w in finding.writers]
    point = f"`{finding.buffer}[{', '.join(map(str, finding.point))}]`"
    names = c.nest.loop_names_by_var()
    where = ", ".join(f"{names.get(var, var)} = {value}" for var, value in finding.where)
    at = f" at {where}" if where else ""
    span = last_moved(c, [block, *writers])
    kind = finding.kind
    if kind == "out of bounds" and _written_out_of_bounds(c):
        kind = "out of bounds as written"
    if kind in _FINDINGS:
        message, blamed, hint = _FINDINGS[kind]
        text = message.format(
            block=block,
            point=point,
            at=at,
            writers=writers,
            shape=" x ".join(map(str, finding.shape)),
        )
        c.error(text, (getattr(c, blamed) if blamed else None) or span, hint)
        return
    by = ", ".join(writers)
    if where:
        message = (
            f"block {block} reads {point}{at}, in an iteration of the loops it shares with "
            f"block {by} in which {by} does not write it"
        )
    else:
        message = f"block {block} reads {point}, a point that block {by} never writes"
    c.error(
        message,
        span,
        "TVM sizes what a moved block computes from the loops alone: without the `if` of a "
        "split that does not divide its extent, as the box around the points of a fused or "
        "strided loop, or under the `if` of the block it joins (TVM 0.27); the kernel would "
        "read a value that is not computed yet",
        "compute the block at a loop outside the guarded, fused or strided loops, or pick "
        "split factors that divide the extents",
    )


def _written_out_of_bounds(c: CheckerState) -> bool:
    """Whether the function as written, unscheduled, already reaches outside a buffer (TVM's own
    schedule tests have two such functions: `v0 * v0 + v1` over 6 x 4 into 14 rows, and three
    loads `B[i, j + 2]` of a 128-wide B)."""
    finding = dataflow.find_unsound(c.written, c.target.to_tvm())
    return finding is not None and finding.kind == "out of bounds"


def last_moved(c: CheckerState, blocks: list[str]) -> Span | None:
    """The last statement that created or moved one of `blocks`, else the first block's
    section."""
    spans = [
        span
        for b in blocks
        for span in (c.moved_by.get(b), c.created_by.get(b))
        if span is not None
    ]
    if spans:
        return max(spans, key=lambda span: (span.line, span.column))
    return next((c.block_spans[b] for b in blocks if b in c.block_spans), None)


def unrolled_copies_fit(c: CheckerState) -> None:
    """An unroll checked when written can grow later: a split of a loop inside it makes
    loops short enough for LLVM to unroll too (a 64-iteration unroll, then a split of the
    97-iteration loop inside by 2, 4 and 13: 154 s of LLVM; found by the differential
    fuzzer). Counted again once every statement is applied."""
    for block in c.nest.block_names():
        if block in c.unknown_blocks:
            continue
        unrolled = [x for x in c.nest.loops(block) if x.annotation == "unrolled"]
        if unrolled:
            span = c.unrolled_by.get(c.nest.sch.get_sref(unrolled[0].rv))
            unrolled_size_fits(c, unrolled[0], block, span or c.block_spans.get(block))


def self_unrolled_copies_fit(c: CheckerState) -> None:
    """The copies LLVM lays out where a split's guard folds: from the innermost loop outward,
    LLVM fully unrolls a loop whose body, once the copies the `if` rules out are gone, is small
    (the copies kept, times the trip count, at most llvm_full_unroll), and a loop of at most
    llvm_unroll_analyze iterations (which it simulates) whose kept copies are that few. The `if`
    is evaluated over the copies with the loops outside at their first iteration. The `unroll`ed
    loops around multiply the copies. Each copy weighs unroll_guard_weight, as under the same
    `if`. Found by the differential fuzzer (issue 33): `split s by 4, *, 8, 32` of an s of 1 is
    1024 copies of which one is kept, 32-44 s of LLVM (512 copies: 6 s); `unroll z` (16) and
    `unroll x.o` (4) around 17 x 4 copies where `tile x, y, k by 4x4x1` split a y of 1, of which
    17 are kept, 32 s. The unroll rules above count what no guard folds."""
    target = c.target
    for block in c.nest.block_names():
        if block in c.unknown_blocks or not c.nest.is_guarded(block):
            continue
        loops = c.nest.loops(block)
        predicate = c.nest.predicate(block)
        loop_vars = {x.name: c.nest.sch.get(x.rv).loop_var for x in loops}
        chain: list[Loop] = []  # the loops LLVM unrolls, innermost last
        unrolled: list[Loop] = []  # the `unroll`ed loops outside them
        copies, folded, ended = 1, False, False
        for x in reversed(loops):
            extent = x.extent
            if x.annotation == "vectorized" or extent == 1:
                continue
            if x.annotation == "unrolled" and extent is not None:
                (unrolled if ended else chain).insert(0, x)
                copies *= extent
                continue
            if ended or extent is None or x.annotation == "parallel" or x.thread is not None:
                ended = True
                continue
            if not isinstance(c.nest.sch.get(x.rv).body, (tirx.For, s_tir.SBlockRealize)):
                # Holds more than the nest (measured: 1024 kept-one copies under a loop that
                # also holds another block built in 0.1 s, under two such loops in 35 s).
                ended = True
                continue
            if copies * extent > target.llvm_full_unroll:
                analyzed = extent <= target.llvm_unroll_analyze
                kept = kept_copies(predicate, [x, *chain] if analyzed else chain, loop_vars)
                if kept is None or kept * (1 if analyzed else extent) > target.llvm_full_unroll:
                    ended = True
                    continue
                folded = True
            chain.insert(0, x)
            copies *= extent
        if not folded:
            continue
        weight = target.unroll_guard_weight
        split = next(
            (
                consumed
                for (b, _), consumed in c.nest.consumed.items()
                if b == block
                and consumed.how == "split"
                and consumed.span is not None
                and any(x.name in consumed.into for x in chain)
            ),
            None,
        )
        factors = [f"`{x.name}` {x.extent}" for x in unrolled + chain]
        if c.require(
            copies * weight <= target.unroll_max_copies,
            f"LLVM unrolls {copies} copies of block {block} (`"
            + "`, `".join(x.name for x in unrolled + chain)
            + f"`), each under a split's `if` weighing {weight}: {copies * weight}, more than "
            f"the {target.unroll_max_copies} it builds in seconds",
            split.span if split is not None else last_moved(c, [block]),
            "copies: " + " x ".join(factors),
            f"the split's `if` keeps {kept_copies(predicate, chain, loop_vars)} of the "
            f"{math.prod(x.extent or 1 for x in chain)} copies of `"
            + "`, `".join(x.name for x in chain)
            + "` and folds the rest away, so LLVM unrolls them by itself "
            f"(a loop of at most {target.llvm_unroll_analyze} iterations whose copies fold, or "
            f"whose kept copies are at most {target.llvm_full_unroll})",
            "split by factors that multiply closer to the loop's extent",
        ):
            continue
        return  # one such block is enough to say


def kept_copies(predicate: object, chain: list[Loop], loop_vars: dict[str, object]) -> int | None:
    """Of the copies of the loops of `chain`, those the block's `if` keeps with every other loop
    at its first iteration."""
    grid = {loop_vars[x.name]: x.extent or 1 for x in chain}  # a chain's extents are constants
    return tir_values.points_where(predicate, grid, set(loop_vars.values()) - grid.keys())


def unrolled_statements_fit(c: CheckerState) -> None:
    """The statements TVM's UnrollLoop lays out (schedlang.checker.kernel_size): each unrolled
    loop's extent times the statements of its body, the loops inside it that `unroll` or an
    auto_unroll_max_step pragma unrolls counted in. `unrolled_size_fits` counts one block's
    copies and what LLVM unrolls by itself; neither it nor the pragma's guard sees a pragma's
    unrolling under an `unroll`: `unroll a` (256) around a pragma that unrolls the 512
    iterations of `b` is 131072 statements, which LLVM built for minutes (issue 33). On a CPU a
    statement under an `if` that is the same in every copy weighs unroll_guard_weight: `unroll
    q` (1024) under the guard of `split p by 3` (p of 7) built for 36 s (the long run of issue
    33)."""
    weight = 1 if c.target.is_gpu else c.target.unroll_guard_weight  # measured for LLVM only
    func = c.nest.sch.mod["main"]
    for unrolled in kernel_size.unrolled_loops(func, follows_hint=c.target.is_gpu):
        weighed, strided = _weighed_statements(unrolled, c.target, weight)
        if weighed <= c.target.unroll_max_copies:
            continue
        by = unrolled.pragma if unrolled.pragma is not None else unrolled.loop
        span = c.unrolled_by.get(c.nest.sch.get_sref(by))
        if any(d.is_error and d.span == span for d in c.diagnostics):
            continue  # unrolled_size_fits has said so
        _too_many_statements(c, unrolled, weighed, weight, strided, span)


def _weighed_statements(
    unrolled: kernel_size.Unrolled, target: Target, weight: int
) -> tuple[int, tuple[int, int]]:
    """The statements an unrolling lays out, weighed: one under an `if` that is the same in every
    copy weighs `weight`, and on a CPU a vector of strided lanes weighs its lanes; with the
    strided vectors' count and their lanes in all, (0, 0) where they were not counted."""
    weighed = unrolled.statements + (weight - 1) * unrolled.same_guard
    # Strided vectors are counted only where they could tip the balance (it takes a while).
    widest = sum(copies * (lanes - 1) for _, (_, lanes), copies in unrolled.vectors)
    strided = (0, 0)
    if not target.is_gpu and weighed + widest > target.unroll_max_copies:
        strided = kernel_size.strided_statements(unrolled)
    return weighed + strided[1] - strided[0], strided


def _too_many_statements(
    c: CheckerState,
    unrolled: kernel_size.Unrolled,
    weighed: int,
    weight: int,
    strided: tuple[int, int],
    span: Span | None,
) -> None:
    """The error of an unrolling whose `weighed` statements (`_weighed_statements`) are more than
    the compiler builds in seconds."""
    gathers = strided[1] - strided[0]
    names = c.nest.loop_names_by_var()
    name = names.get(unrolled.loop.loop_var.name, unrolled.loop.loop_var.name)
    inner = [
        f"`{names.get(x.loop.loop_var.name, x.loop.loop_var.name)}` ({x.extent} iterations)"
        f" is unrolled inside it, by "
        + (
            "`unroll`"
            if x.pragma is None
            else f"the auto_unroll_max_step pragma on "
            f"`{names.get(x.pragma.loop_var.name, x.pragma.loop_var.name)}`"
        )
        for x in unrolled.inner
    ]
    guarded = unrolled.same_guard and weight > 1
    laid_out = (
        f"{unrolled.statements} {_strided(unrolled, strided, weighed)}"
        if gathers
        else f"{unrolled.statements} statements under an `if` that is the same in every "
        f"copy, each weighing {weight}: {weighed}"
        if guarded and unrolled.same_guard == unrolled.statements
        else f"{unrolled.statements} statements, {unrolled.same_guard} of them under an `if` "
        f"that is the same in every copy, each weighing {weight}: {weighed}"
        if guarded
        else f"{unrolled.statements} statements"
    )
    c.error(
        f"unrolling `{name}` lays out {laid_out}, more than the {c.target.unroll_max_copies} "
        f"{compiler(c)} builds in seconds",
        span or c.block_spans.get(next(iter(c.nest.block_names()), "")),
        f"statements: `{name}` {unrolled.extent} x {unrolled.statements // unrolled.extent} "
        "in its body",
        *inner,
        *(
            [
                "LLVM builds a statement under such an `if` (a non-dividing split's guard "
                f"of a loop outside `{name}`) {weight} times as slowly: split that loop by a "
                "factor that divides it"
            ]
            if guarded
            else []
        ),
        *(
            [
                "LLVM builds a vector of strided elements (a gather or scatter) about as "
                "slowly as a statement per lane: vectorize the loop whose elements are "
                "adjacent in memory (the buffer's last dimension), or fewer lanes"
            ]
            if gathers
            else []
        ),
        f"unroll fewer iterations: split `{name}` and unroll its inner part, or give the "
        "pragma a smaller auto_unroll_max_step",
    )


def _strided(unrolled: kernel_size.Unrolled, strided: tuple[int, int], weighed: int) -> str:
    """The statements an unrolling lays out, where some are vectors of strided elements."""
    count, lanes = strided[0], strided[1] // strided[0]
    of_them = "" if count == unrolled.statements else f", {count} of them"
    guard = (
        f", {unrolled.same_guard} under the same `if` in every copy" if unrolled.same_guard else ""
    )
    return (
        f"vector statements{of_them} of {lanes} strided lanes (a gather or scatter), each "
        f"weighing its lanes{guard}: {weighed}"
    )


def made_buffers_fit(c: CheckerState) -> None:
    """The buffers whose statements left their size to the end (rfactor's, pad's): each one's
    elements as TVM allocates it once every statement is applied, compacted to what the loops
    around its blocks touch (a `compute_at` of the rf block at a loop: one iteration's), within
    TVM's int32 indices and the bytes one statement may add. Where the kernel does not lower
    (an error so far, an unbound GPU block), or the buffer is not found in it, the size the
    statement made is checked. Padding from a storage_align is allocations_fit's to report."""
    if not c.made_buffers:
        return
    compacted: dict[str, kernel_size.Allocation] = {}
    if not any(d.is_error for d in c.diagnostics) and not c.unbound:
        lowered = dataflow.lower_kernel(c.nest.sch.mod["main"], c.target.to_tvm())
        if lowered is not None:
            # TVM names rfactor's buffer `dot.rf`; TVMScript and schedlang, `dot_rf`.
            found = kernel_size.allocations(lowered[0])
            compacted = {re.sub(r"\W", "_", a.name): a for a in found}
    for made in c.made_buffers.values():
        allocation = compacted.get(made.name)
        elements = made.elements if allocation is None else math.prod(allocation.shape)
        notes = made.notes
        if elements != made.elements and allocation is not None:
            notes = (f"as TVM allocates it after every statement: {allocation.describe()}", *notes)
        made_buffer_fits(c, made.name, elements, made.dtype, made.span, *notes)


def allocations_fit(c: CheckerState) -> None:
    """Every buffer the kernel allocates, as TVM lays it out once every statement is applied
    (schedlang.checker.kernel_size): its elements within TVM's int32 indices and its bytes
    within the target's memory. A statement's guard sees the buffer it makes or aligns; this
    sees what a later one does to it: rfactor carries a storage_align onto its new buffer,
    where it pads another dimension (issue 33)."""
    lowered = dataflow.lower_kernel(c.nest.sch.mod["main"], c.target.to_tvm())
    if lowered is None:
        return
    most, memory = c.target.int32_elements, c.target.memory_bytes
    for allocation in kernel_size.allocations(lowered[0]):
        shown = re.sub(r"\W", "_", allocation.name)  # as TVMScript prints it
        laid_out = f"`{shown}` as TVM lays it out ({allocation.describe()})"
        if allocation.elements > most:
            message = (
                f"{laid_out} needs {allocation.elements} elements "
                f"({format_bytes(allocation.bytes)}), more than the {most} that TVM's int32 "
                "indices reach"
            )
        elif memory is not None and allocation.bytes > memory:
            message = (
                f"{laid_out} takes {format_bytes(allocation.bytes)}, more than the "
                f"{format_bytes(memory)} of memory of the target"
            )
        else:
            continue
        c.error(message, *_shaped_by(c, allocation, shown))


def _shaped_by(
    c: CheckerState, allocation: kernel_size.Allocation, shown: str
) -> tuple[Span | None, *tuple[str, ...]]:
    """The last statement that made or aligned a buffer, and notes on its padding."""
    name = allocation.name
    writers = [b for b in c.nest.block_names() if name in c.nest.writes(b)]
    found = [c.aligned_by.get(name), c.buffer_made_by.get(name)]
    found += [c.created_by.get(b) for b in writers]
    spans = [span for span in found if span is not None]
    span = max(spans, key=_position) if spans else last_moved(c, writers)
    aligned = c.aligned_by.get(name)
    at = f" (the storage_align of line {aligned.line})" if aligned else ""
    notes = [
        f"dim {d} has a stride of {stride} elements where {plain} would do{at}"
        for d, stride, plain in kernel_size.padded_dims(allocation)
    ]
    if allocation.wrapped:
        notes.append(
            "TVM computes these strides in int32, where they wrap: it writes them as "
            + ", ".join(map(str, allocation.written))
        )
    later = [
        b
        for b in writers
        if aligned and _position(c.created_by.get(b, aligned)) > _position(aligned)
    ]
    if later:
        notes.append(
            f"block {later[0]}, made after it, keeps the alignment: TVM copies a block's "
            "annotations onto the block rfactor makes, whose buffer has other dimensions"
        )
    if notes:
        notes.append(f"align `{shown}` with a factor like 32 or 64, or leave it unaligned")
    return (span, *notes)


def _position(span: Span) -> tuple[int, int]:
    return (span.line, span.column)
