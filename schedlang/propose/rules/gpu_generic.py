"""GPU, any op: one thread per output in thread blocks of T threads; a long reduction (a row sum)
gets a thread block per output, its TR threads each reducing a slice, then across threads.
First with the elementwise intermediates inlined, where the op has any. Every op gets these
templates last, and the GPU matmul schedules the blocks it leaves the same way."""

from __future__ import annotations

import math

from schedlang.core.target import Target
from schedlang.propose.analysis import Block, OpView
from schedlang.propose.rules.generic import fuse_spatial, spatial_first
from schedlang.propose.template import FallbackRule, TemplateInfo, Writer, pick

_KNOBS = "T threads per block (4) per block; TR threads per long reduction (4)"


class GpuGeneric(FallbackRule):
    target, rank = "gpu", 90
    templates = (
        TemplateInfo(
            "gpu_generic_inline", "gpu",
            "any op with elementwise intermediates: those inlined, one thread per output",
            _KNOBS, ("T", "TR"), 4, per_block=True,
        ),
        TemplateInfo(
            "gpu_generic", "gpu",
            "any op: one thread per output; a long reduction across TR threads of a block",
            _KNOBS, ("T", "TR"), 4, per_block=True,
        ),
    )  # fmt: skip

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        inlinable = [b for b in view.blocks if not b.reduce and view.is_intermediate(b)]
        inlined = [_generic(view, target, inline=inlinable)] if inlinable else []
        return [*inlined, _generic(view, target, inline=[])]


def _generic(view: OpView, target: Target, inline: list[Block]) -> Writer:
    names = ", ".join(b.name for b in view.blocks if b not in inline)
    how = f"{', '.join(b.name for b in inline)} inlined; " if inline else ""
    rows = "; row reductions across TR threads" if any(map(_long_reduction, view.blocks)) else ""
    w = Writer(
        f"{names}: {how}one thread per output in thread blocks of T{rows}",
        "gpu_generic_inline" if inline else "gpu_generic",
    )
    gpu_blocks(w, view, target, done=set(), inline=inline)
    return w


def gpu_blocks(
    w: Writer, view: OpView, target: Target, done: set[str], inline: list[Block]
) -> None:
    """The blocks not in `done`, each on its own; those in `inline` inlined into their first
    reader."""
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
            _block(w, block, threads, first)


def _block(w: Writer, block: Block, threads: list[int], first: list[str]) -> None:
    spatial = [loop.var for loop in block.spatial]
    reduce = [loop.var for loop in block.reduce]
    s = w.section(block.name)
    s.extend(first)
    spatial_first(s, block)
    fused = fuse_spatial(s, spatial)
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
