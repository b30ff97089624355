"""CPU reductions that vectorize: over an axis other than the contiguous one (a 3-D sum over axis
1, a column sum), the reduction loops go outside the output row, which is vectorized; along the
contiguous axis (a row sum), `rfactor` makes partial sums over vector lanes; along contiguous
axes too short or odd for whole vectors (a global average pool's 7 x 7), the reduction loops go
outside the innermost output axis, which is vectorized (gathering) and accumulated in registers.
Every other block is scheduled as in the generic template, which comes after these."""

from __future__ import annotations

import functools

from schedlang.core.target import Target
from schedlang.propose.analysis import (
    Block,
    OpView,
    reduction_block,
    strided_reduction,
    vector_reduction,
)
from schedlang.propose.rules.conv import split_vector_blocks
from schedlang.propose.rules.generic import (
    cpu_blocks,
    knob_suffix,
    per_block_template,
    say_vectorized,
    spatial_first,
    write_block,
)
from schedlang.propose.rules.matmul import fold_epilogue
from schedlang.propose.template import Rule, TemplateInfo, Writer, pick

_OUTER = (
    "a reduction over an axis that is not the contiguous one (a 3-D sum over axis 1, a column "
    "sum): reduction loops outside the vectorized output row"
)


class Reduction(Rule):
    target, rank = "cpu", 40
    templates = (
        TemplateInfo(
            "reduce_outer_stream", "cpu", _OUTER,
            "V vector width (4), U reduction unroll (4)", ("V", "U"), 16, per_block=True,
        ),
        TemplateInfo(
            "reduce_outer_registers", "cpu",
            "the same reductions: V output lanes accumulated in registers over the whole "
            "reduction",
            "V vector width (4), U reduction unroll (4)", ("V", "U"), 16, per_block=True,
        ),
        TemplateInfo(
            "generic_rfactor", "cpu",
            "a reduction along the contiguous axis (a row sum): partial sums over V lanes by "
            "rfactor",
            "V lanes (3) per reduction block; CH parallel chunks (4) per elementwise block",
            ("V", "CH", "U"), 4, per_block=True,
        ),
        TemplateInfo(
            "reduce_gather", "cpu",
            "a reduction along contiguous axes that whole vectors do not divide (a mean over "
            "H x W = 7 x 7): the reduction loops outside V lanes of the innermost output axis, "
            "gathered and accumulated in registers; an elementwise epilogue folded",
            "V vector width (3)", ("V",), 3,
        ),
    )  # fmt: skip

    def applies(self, view: OpView, target: Target) -> bool:
        return (
            _any_strided(view, target)
            or _any_vector(view, target)
            or _gathered(view, target) is not None
        )

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        writers: list[Writer | None] = []
        if _any_strided(view, target):
            stream = functools.partial(_outer_axis_block, registers=False)
            registers = functools.partial(_outer_axis_block, registers=True)
            writers += [
                per_block_template(
                    view, target, "reduce_outer_stream",
                    ", a reduction over an outer axis streamed: the reduction loop outside the "
                    "whole output row, vectorized by V",
                    stream,
                ),
                per_block_template(
                    view, target, "reduce_outer_registers",
                    ", a reduction over an outer axis accumulated in registers: V output lanes "
                    "vectorized inside the reduction loop",
                    registers,
                ),
            ]  # fmt: skip
        if _any_vector(view, target):
            w = per_block_template(
                view,
                target,
                "generic_rfactor",
                ", reductions vectorized by rfactor",
                _rfactor_block,
            )
            say_vectorized(w)
            writers.append(w)
        if (axis := _gathered(view, target)) is not None:
            writers.append(_gather(view, target, axis))
        return writers


def _any_strided(view: OpView, target: Target) -> bool:
    return any(strided_reduction(b, target.vector_lanes(b.dtype)) for b in view.blocks)


def _any_vector(view: OpView, target: Target) -> bool:
    return any(vector_reduction(b, target.vector_lanes(b.dtype)) for b in view.blocks)


def _rfactor_block(w: Writer, block: Block, target: Target, knobs: bool, single: bool) -> None:
    """Partial results over V lanes: the rf block (whose loops keep these names) vectorizes them;
    the block itself then adds the V partials of each output. Another block: `write_block`."""
    lanes = target.vector_lanes(block.dtype)
    if not (block.spatial and vector_reduction(block, lanes)):
        write_block(w, block, target, knobs, single)
        return
    spatial = [loop.var for loop in block.spatial]
    s = w.section(block.name)
    spatial_first(s, block)
    last = block.reduce[-1].var
    options = [lanes, 2 * lanes, 4 * lanes]
    v = w.factor(f"V{knob_suffix(block, single)}", pick(block.extent(last), options))
    s.append(f"split {last} by {v}")
    s.append(f"rfactor {last}.i")
    partials = w.section(f"{block.name}_rf")
    for section in (s, partials):
        if len(spatial) > 1:
            section.append(f"fuse {', '.join(spatial)} as f")
        section.append(f"parallel {'f' if len(spatial) > 1 else spatial[0]}")
    partials.append(f"vectorize {last}.i")


def _outer_axis_block(
    w: Writer, block: Block, target: Target, knobs: bool, single: bool, registers: bool
) -> None:
    """The reduction loops outside the contiguous output axis `j`, which is split into V lanes
    and vectorized; the outer output axes are parallel. With `registers`, each V-lane slice of
    the output is accumulated in `local` over the whole reduction (j.o outside the reduction
    loops); else the reduction loops sit outside all of j and stream whole rows. Another block:
    `write_block`."""
    lanes = target.vector_lanes(block.dtype)
    if not strided_reduction(block, lanes):
        write_block(w, block, target, knobs, single)
        return
    s = w.section(block.name)
    suffix = knob_suffix(block, single)
    spatial = [loop.var for loop in block.spatial]
    reduce = [loop.var for loop in block.reduce]
    outer, j = spatial[:-1], spatial[-1]
    extent = block.extent(j)
    v_values = pick(extent, [4 * lanes, 2 * lanes, 8 * lanes, lanes], multiple_of=lanes)
    v = w.factor(f"V{suffix}", v_values)
    last = reduce[-1]
    u = w.factor(f"U{suffix}", pick(block.extent(last), [1, 4, 2, 8], most=4))
    s.append(f"split {j} by {v}")
    s.append(f"split {last} by {u}")
    split_reduce = [*reduce[:-1], f"{last}.o", f"{last}.i"]
    if registers or not outer:
        s.append(f"reorder {', '.join([*outer, f'{j}.o', *split_reduce, f'{j}.i'])}")
        tasks = [*outer, f"{j}.o"]
    else:
        s.append(f"reorder {', '.join([*outer, *split_reduce, f'{j}.o', f'{j}.i'])}")
        tasks = outer
    if len(tasks) > 1:
        s.append(f"fuse {', '.join(tasks)} as tasks")
    par = "tasks" if len(tasks) > 1 else tasks[0]
    s.append(f"parallel {par}")
    if registers:
        s.append(f"cache_write {block.name} local at {par}  # V partial sums in registers")
    s.append(f"vectorize {j}.i")
    s.append(f"unroll {last}.i")
    u_values = pick(block.extent(last), [1, 4, 2, 8], most=4)
    if not registers and outer and extent // min(v_values) * max(u_values) <= 512:
        s.append(f"unroll {j}.o")  # not when it makes more copies than build in a moment
    s.append(f"decompose_reduction at {reduce[0] if len(reduce) > 1 else f'{last}.o'}")


def _gathered(view: OpView, target: Target) -> str | None:
    """The output axis `reduce_gather` vectorizes: the innermost one of more than one element,
    of the op's one reduction, when its reduction loops are innermost and neither other
    template vectorizes it."""
    block = reduction_block(view)
    if block is None or len(block.writes) != 1 or block.loops[-1].kind != "reduce":
        return None
    lanes = target.vector_lanes(block.dtype)
    if lanes <= 1 or vector_reduction(block, lanes) or strided_reduction(block, lanes):
        return None
    axes = [loop.var for loop in block.spatial if int(loop.extent) > 1]
    return axes[-1] if axes and block.extent(axes[-1]) >= 4 else None


def _gather(view: OpView, target: Target, axis: str) -> Writer:
    """V lanes of the output axis `axis` accumulated in registers while the reduction loops run
    outside them, each lane reading its own stretch of the input: 512 channels' means of 7 x 7
    measured 2x faster than the unscheduled build, which sums each 49 in one dependent chain."""
    block = reduction_block(view)
    assert block is not None, "written only where it applies"
    w = Writer(
        f"{block.name}: the reduction outside V lanes of {axis}, gathered and accumulated in "
        "registers",
        "reduce_gather",
    )
    s = split_vector_blocks(w, block, axis, "V", target)
    outer = [f"{axis}.o" if loop.var == axis else loop.var for loop in block.spatial]
    reduce = [loop.var for loop in block.reduce]
    s.append(f"reorder {', '.join([*outer, *reduce, f'{axis}.i'])}")
    if len(outer) > 1:
        s.append(f"fuse {', '.join(outer)} as tasks")
    par = "tasks" if len(outer) > 1 else outer[0]
    s.append(f"parallel {par}")
    s.append(f"cache_write {block.name} local at {par}  # V lanes in registers")
    folded = fold_epilogue(s, view, block, "they are")
    s.append(f"vectorize {axis}.i")
    s.append(f"decompose_reduction at {reduce[0]}")
    cpu_blocks(w, view, target, done={block.name, *folded})
    return w
