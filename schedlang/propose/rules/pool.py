"""CPU pooling: a reduction of one input read through a window, with no weight (max_pool2d,
avg_pool2d: pool[n, c, h, w] = max over the window of pad[n, c, 2h + rh, 2w + rw]). Parallel over
the outer output axes fused, the innermost output axis vectorized in whole registers (or half or
quarter ones that divide it), the window unrolled inside; the padding inlined or computed per
parallel task; the output row accumulated in registers or not. An elementwise epilogue (the
average's divide) is folded into the write-back of the accumulator. The conv rule, which ranks
after this one, keeps the window reductions that read a weight."""

from __future__ import annotations

from dataclasses import dataclass

from schedlang.core.target import Target
from schedlang.propose.analysis import Block, OpView, reduction_block
from schedlang.propose.rules.conv import split_vector_blocks
from schedlang.propose.rules.generic import cpu_blocks
from schedlang.propose.rules.matmul import fold_epilogue
from schedlang.propose.template import MatchingRule, TemplateInfo, Writer

_SHAPE = (
    "a reduction of one input read through a window, no weight (max_pool2d, avg_pool2d), with "
    "its padding block and an elementwise epilogue"
)
# A window loop longer than this is left rolled (a global pool's 7 x 7 is unrolled).
_UNROLL_MOST = 16


@dataclass(frozen=True)
class PoolRoles:
    data: str  # the buffer read through the window
    pad: str | None  # the intermediate spatial block producing it, if any
    col: str  # the innermost output axis: vectorized
    outer: tuple[str, ...]  # the other output axes: fused and parallel
    reduce: tuple[str, ...]  # the window


def pool_of(view: OpView) -> tuple[Block, PoolRoles] | None:
    """The op's pooling block and its roles: its one reduction reads one buffer, through a
    window that every reduction loop is in; the other blocks are spatial (padding, epilogue)."""
    block = reduction_block(view)
    if block is None or not block.spatial or len(block.reads) != 1 or len(block.writes) != 1:
        return None
    data = block.reads[0]
    window = {v for dim in data.dims if len(dim) > 1 for v in dim}
    if not data.is_window or not {r.var for r in block.reduce} <= window:
        return None
    pads = [
        p for p in view.producers(block)
        if data.buffer in p.info.writes and not p.reduce and view.is_intermediate(p)
    ]  # fmt: skip
    spatial = [loop.var for loop in block.spatial]
    return block, PoolRoles(
        data.buffer,
        pads[0].name if len(pads) == 1 else None,
        spatial[-1],
        tuple(spatial[:-1]),
        tuple(r.var for r in block.reduce),
    )


class Pool(MatchingRule[tuple[Block, PoolRoles]]):
    target, rank = "cpu", 15
    templates = (
        TemplateInfo(
            "pool_rows", "cpu",
            _SHAPE + "; parallel over the outer axes, the window's last axis unrolled inside "
            "the output row and its other axes outside it, the row left for LLVM to vectorize "
            "(a stride-2 window reads interleaved elements); padding inlined",
            "none", (), 1,
        ),
        TemplateInfo(
            "pool_vector", "cpu",
            _SHAPE + "; WT output columns vectorized by `vectorize` and accumulated in "
            "registers, the window outside them; padding computed per parallel task",
            "WT vectorized column block (3)", ("WT",), 3,
        ),
    )  # fmt: skip

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        block, roles = self.found(view)
        return [_rows(view, block, roles, target), _vector(view, block, roles, target)]

    def find(self, view: OpView) -> tuple[Block, PoolRoles] | None:
        return pool_of(view)


def _parallel(s: list[str], r: PoolRoles, order: list[str]) -> str:
    """The reorder, then the outer axes fused (the column blocks when there are none) and made
    parallel; the parallel loop's name."""
    tasks = list(r.outer) or [order[0]]
    s.append(f"reorder {', '.join([*r.outer, *order])}")
    if len(tasks) > 1:
        s.append(f"fuse {', '.join(tasks)} as tasks")
    par = "tasks" if len(tasks) > 1 else tasks[0]
    s.append(f"parallel {par}")
    return par


def _rows(view: OpView, block: Block, r: PoolRoles, target: Target) -> Writer:
    """The output row innermost but for the window's last axis, unrolled inside it: LLVM's loop
    vectorizer turns the row's stride-2 reads into wide loads and shuffles, where `vectorize`
    makes TVM load lane by lane (2.3x slower on ResNet-18's max_pool2d, one thread). The inlined
    padding's test on the window's other axes does not change along the row."""
    w = Writer(
        f"{block.name} (pool): padding inlined, parallel over the outer axes, the window's last "
        f"axis unrolled inside the row {r.col}, which LLVM vectorizes",
        "pool_rows",
    )
    s = w.section(block.name)
    *outer_window, last = r.reduce
    _parallel(s, r, [*outer_window, r.col, last])
    if r.pad:
        s.append(f"compute_inline {r.pad}")
    if block.extent(last) <= _UNROLL_MOST:
        s.append(f"unroll {last}")
    s.append(f"decompose_reduction at {r.reduce[0]}")
    cpu_blocks(w, view, target, done={block.name, r.pad or ""})
    return w


def _vector(view: OpView, block: Block, r: PoolRoles, target: Target) -> Writer:
    """WT columns vectorized and accumulated in registers over the whole window (unrolled); the
    padded rows each parallel task reads computed in it (an inlined pad's test in a vectorized
    loop makes TVM scalarize it). An elementwise epilogue is folded into the write-back."""
    pad = "padding computed per parallel task, " if r.pad else ""
    w = Writer(
        f"{block.name} (pool): {pad}parallel over the outer axes, WT columns of {r.col} "
        "vectorized and accumulated in registers, the window unrolled",
        "pool_vector",
    )
    s = split_vector_blocks(w, block, r.col, "WT", target)
    par = _parallel(s, r, [f"{r.col}.o", *r.reduce, f"{r.col}.i"])
    s.append(f"cache_write {block.name} local at {r.col}.o  # the columns in registers")
    folded = fold_epilogue(s, view, block, "they are")
    if r.pad:
        s.append(f"compute_at {r.pad} {par}  # the padded rows this task reads")
    s.append(f"vectorize {r.col}.i")
    for axis in r.reduce:
        if block.extent(axis) <= _UNROLL_MOST:
            s.append(f"unroll {axis}")
    s.append(f"decompose_reduction at {r.reduce[0]}")
    cpu_blocks(w, view, target, done={block.name, r.pad or "", *folded})
    return w
