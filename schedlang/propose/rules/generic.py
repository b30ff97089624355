"""CPU, any op: each block on its own, its spatial loops fused and split into parallel chunks,
then vector lanes; a reduction's last loop unrolled. Every op gets this template last, and the
other CPU recipes schedule the blocks they leave (a conv's padding, say) the same way."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from schedlang.core.target import Target
from schedlang.propose.analysis import Block, OpView
from schedlang.propose.template import FallbackRule, TemplateInfo, Writer, pick

# Writes one block's section: (writer, block, target, with knobs, the op's only block).
BlockWriter = Callable[[Writer, Block, Target, bool, bool], None]


class Generic(FallbackRule):
    target, rank = "cpu", 90
    templates = (
        TemplateInfo(
            "generic", "cpu",
            "any op: per block, spatial loops fused and parallel; elementwise blocks vectorized",
            "U reduction unroll (3) per reduction block; CH parallel chunks (4) per elementwise "
            "block",
            ("U", "CH"), 4, per_block=True,
        ),
    )  # fmt: skip

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        w = per_block_template(view, target, "generic")
        say_vectorized(w)
        return [w]


def per_block_template(
    view: OpView, target: Target, family: str, how: str = "", write: BlockWriter | None = None
) -> Writer:
    """Every block on its own (by `write`, else `write_block`), with knobs."""
    names = ", ".join(b.name for b in view.blocks)
    w = Writer(f"{names}: parallel over the fused spatial loops{how}", family)
    cpu_blocks(w, view, target, done=set(), knobs=True, write=write)
    return w


def say_vectorized(w: Writer) -> None:
    """The note says so when a block is vectorized inside its parallel loop."""
    if any("vectorize" in line for _, lines in w.sections for line in lines):
        w.note = w.note.replace("spatial loops", "spatial loops, vectorized inside", 1)


def cpu_blocks(
    w: Writer,
    view: OpView,
    target: Target,
    done: set[str],
    knobs: bool = False,
    write: BlockWriter | None = None,
) -> None:
    """The blocks not in `done`, each on its own, by `write` (`write_block` unless given)."""
    for block in view.blocks:
        if block.name not in done:
            (write or write_block)(w, block, target, knobs, len(view.blocks) == 1)


def knob_suffix(block: Block, single: bool) -> str:
    """What a block's knobs end with: nothing for the op's only block, else its name."""
    return "" if single else "_" + re.sub(r"[^A-Za-z0-9]", "_", block.name).upper()


def spatial_first(s: list[str], block: Block) -> None:
    """The reduction loops inside the spatial ones, where they are not already."""
    spatial = [loop.var for loop in block.spatial]
    reduce = [loop.var for loop in block.reduce]
    if reduce and [loop.var for loop in block.loops] != spatial + reduce:
        s.append(f"reorder {', '.join(spatial + reduce)}")


def fuse_spatial(s: list[str], spatial: list[str]) -> str | None:
    """The loop over all the spatial ones: them fused as `f` where there are several."""
    if len(spatial) > 1:
        s.append(f"fuse {', '.join(spatial)} as f")
        return "f"
    return spatial[0] if spatial else None


def write_block(w: Writer, block: Block, target: Target, knobs: bool, single: bool) -> None:
    """A block on its own: spatial loops fused, split into parallel chunks, then vector lanes."""
    s = w.section(block.name)
    if not block.spatial:
        return
    spatial_first(s, block)
    lanes = target.vector_lanes(block.dtype)
    suffix = knob_suffix(block, single)
    spatial = [loop.var for loop in block.spatial]
    reduce = [loop.var for loop in block.reduce]
    fused = fuse_spatial(s, spatial)
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
