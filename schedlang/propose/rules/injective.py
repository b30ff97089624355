"""CPU injective ops: every block spatial (reshape, transpose, broadcast, elementwise chains, as
Relax fusion leaves them: fused_reshape2_transpose_broadcast_to_reshape3, fused_reshape6_add2).
The intermediate blocks are inlined into the blocks that read them, so that no intermediate
buffer is written and read back; the blocks left are scheduled as in the generic template, or,
where one reads its input transposed (its innermost loop steps through the input with a
stride), as a tiled copy: tiles of the last two axes, parallel over the tiles, each tile row
vectorized. The generic template comes after these."""

from __future__ import annotations

import math

from schedlang.core.target import Target
from schedlang.propose.analysis import Block, Inlined, OpView, inlined
from schedlang.propose.rules.generic import fuse_spatial, knob_suffix, write_block
from schedlang.propose.template import Rule, TemplateInfo, Writer, pick

_TILES = [16, 8, 32]  # tile sides, best first
# Fewer outputs than this: one thread. A copy is bound by memory, and waking the thread pool
# costs more than it saves: 6 us against 0.03 us for a 512-element reshape chain, 25.8 us
# against 11.8 us at 131072 elements (2 cores, a loaded machine).
SERIAL_BELOW = 1 << 18
# A GELU is compute, not a copy: 131072 outputs ran in 24.1 us on two threads against 41.5 us on
# one (a transformer layer's feed-forward, 2-core Zen 4, with `fast_math erf`; 463 us without).
SERIAL_ERF_BELOW = 1 << 14


class Injective(Rule):
    target, rank = "cpu", 60
    templates = (
        TemplateInfo(
            "injective_tiled", "cpu",
            "an op of spatial blocks only, one of which reads its input transposed (a strided "
            "innermost read): intermediates inlined, that block copied in tiles of its last two "
            "axes, each tile row vectorized, parallel over the tiles from 2^18 outputs",
            "TR tile rows (3), TC tile columns (3) per transposed block; CH parallel chunks (4) "
            "per other block of 2^18 outputs or more",
            ("TR", "TC", "CH"), 9, per_block=True,
        ),
        TemplateInfo(
            "injective", "cpu",
            "an op of spatial blocks only, with intermediate blocks (reshape, transpose, "
            "broadcast chains): those inlined, the blocks left fused and vectorized, parallel "
            "from 2^18 outputs",
            "CH parallel chunks (4) per block left of 2^18 outputs or more (none below)",
            ("CH",), 4, per_block=True,
        ),
    )  # fmt: skip

    def applies(self, view: OpView, target: Target) -> bool:
        return (
            view.func is not None
            and bool(view.blocks)
            and not any(block.reduce for block in view.blocks)
        )

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        found = inlined(view)
        left = [b for b in view.blocks if b.name not in found.blocks]
        tiled = [b for b in left if transposed(b, found)]
        writers: list[Writer | None] = []
        if tiled:
            writers.append(_template(view, target, found, tiled))
        if found.blocks:
            writers.append(_template(view, target, found, []))
        return writers


def transposed(block: Block, found: Inlined) -> bool:
    """Whether the block, once the others are inlined into it, reads an input along its
    innermost loop with a stride (a transpose: the input's row length), so that tiling its last
    two axes keeps what it reads in cache."""
    spatial = block.spatial
    if len(spatial) < 2 or any(block.extent(loop.var) < 2 for loop in spatial[-2:]):
        return False
    return any(
        stride is not None and abs(stride) > 1 for stride in found.strides.get(block.name, ())
    )


def small(block: Block, erf: bool = False) -> bool:
    """Too few outputs to share among threads (`SERIAL_BELOW`; for a block computing GELU's erf,
    a polynomial of some 30 operations an output, `SERIAL_ERF_BELOW`)."""
    outputs = math.prod(block.extent(loop.var) for loop in block.spatial)
    return outputs < (SERIAL_ERF_BELOW if erf else SERIAL_BELOW)


def _template(view: OpView, target: Target, found: Inlined, tiled: list[Block]) -> Writer:
    """The intermediates in `found` inlined (their statements open the first block left's
    section); each block in `tiled` copied in tiles, the others as in the generic template."""
    left = [b for b in view.blocks if b.name not in found.blocks]
    erf = {b.name for b in left if _computes_erf(view, b, found)}
    names = ", ".join(b.name for b in left)
    how = f"{', '.join(found.blocks)} inlined; " if found.blocks else ""
    if tiled:
        where = "on one thread" if all(small(b) for b in tiled) else "parallel over the tiles"
        note = f"{names}: {how}tiles of TR x TC of the last two axes, {where}"
        w = Writer(note + ", each tile row vectorized", "injective_tiled")
    else:
        serial = all(small(b, b.name in erf) for b in left)
        where = "on one thread" if serial else "parallel"
        note = f"{names}: {how}{where} over the fused spatial loops, vectorized inside"
        w = Writer(note, "injective")
    single = len(left) == 1
    for index, block in enumerate(left):
        start = len(w.sections)
        if block in tiled:
            _tile_block(w, block, single)
        elif small(block, block.name in erf):
            _serial_block(w, block, target)
        else:
            write_block(w, block, target, True, single)
        lines = w.sections[start][1]
        if block.name in erf:
            lines.insert(0, "fast_math erf  # GELU's erf as a polynomial: the loop vectorizes")
        if index == 0:
            lines[0:0] = [f"compute_inline {name}" for name in found.blocks]
    return w


def _computes_erf(view: OpView, block: Block, found: Inlined) -> bool:
    """Whether `block`, once the blocks in `found` are inlined into it, computes a float32 erf
    (GELU's): libm's `erff` per lane keeps its loop from vectorizing, `fast_math erf` does not.
    Measured on the GELU of a transformer layer's feed-forward (128 x 1024)."""
    seen: set[str] = set()
    todo = [block]
    while todo:
        current = todo.pop()
        if current.name in view.erf_blocks:
            return True
        for producer in view.producers(current):
            if producer.name in found.blocks and producer.name not in seen:
                seen.add(producer.name)
                todo.append(producer)
    return False


def _tile_block(w: Writer, block: Block, single: bool) -> None:
    """Tiles of TR x TC of the last two spatial axes, the tile's columns (its contiguous output
    row) vectorized; unless the block is `small`, the loops over tiles (and the outer axes)
    fused and parallel."""
    s = w.section(block.name)
    spatial = [loop.var for loop in block.spatial]
    outer, (row, col) = spatial[:-2], spatial[-2:]
    suffix = knob_suffix(block, single)
    tr = w.factor(f"TR{suffix}", _tile_sides(block.extent(row)))
    tc = w.factor(f"TC{suffix}", _tile_sides(block.extent(col)))
    s.append(f"split {row} by {tr}")
    s.append(f"split {col} by {tc}")
    s.append(f"reorder {', '.join([*outer, f'{row}.o', f'{col}.o', f'{row}.i', f'{col}.i'])}")
    if not small(block):
        s.append(f"parallel {fuse_spatial(s, [*outer, f'{row}.o', f'{col}.o'])}")
    s.append(f"vectorize {col}.i")


def _tile_sides(extent: int) -> list[int]:
    """Tile sides that divide `extent`; widened, none under 4 (a 1-wide tile row does not
    vectorize)."""
    sides = pick(extent, _TILES, most=3)
    return [side for side in sides if side >= 4] or sides[:1]


def _serial_block(w: Writer, block: Block, target: Target) -> None:
    """On one thread: the spatial loops fused and vectorized in vector lanes."""
    s = w.section(block.name)
    fused = fuse_spatial(s, [loop.var for loop in block.spatial])
    extent = math.prod(block.extent(loop.var) for loop in block.spatial)
    lanes = pick(extent, [target.vector_lanes(block.dtype)])[0]
    if fused is None or lanes == 1:
        return
    if lanes == extent:
        s.append(f"vectorize {fused}")
        return
    s.append(f"split {fused} by {lanes}")
    s.append(f"vectorize {fused}.i")
