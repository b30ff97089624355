"""CPU conv: a reduction reading a window of its input (pad[h + ry, w + rx]; conv2d, depthwise
conv2d). An output-channel x row x column tile vectorized over the columns, parallel over the
outer axes and row blocks; the padding computed per parallel task or inlined; the tile
accumulated in registers (first for long windows) or not (first for short ones: depthwise).
An elementwise epilogue is folded into the write-back block of the `cache_write`.

A depthwise conv with an epilogue (MobileNetV2's 3x3 depthwise conv, batch norm's bias and
ReLU6's `clip`, issue 47) gets `depthwise_fused` first. It reduces over its window only (9
multiply-adds an output for a 3x3), so memory, not arithmetic, bounds it: the input read once
and the output written once. `conv_direct` leaves the epilogue as separate passes (the bias add
and the clip each read and write the whole output again); `depthwise_fused` accumulates the
output tile in registers and folds the epilogue into its write-back. The models' layout is NCHW
(PyTorch's, kept by the frontend): a channel's rows are contiguous and its channels H x W apart,
so the tile is vectorized along the row, not over channels (which would gather each lane from
another plane); parallel over channels and row blocks fused, each task padding the rows it
reads."""

from __future__ import annotations

import math

from schedlang.core.target import Target
from schedlang.lang.statements.layout import layout_free_params
from schedlang.propose.analysis import (
    Block,
    ConvRoles,
    OpView,
    conv_of,
    epilogue_chain,
)
from schedlang.propose.rules.generic import cpu_blocks
from schedlang.propose.rules.matmul import fold_epilogue
from schedlang.propose.template import MatchingRule, TemplateInfo, Writer, pick
from schedlang.propose.working_set import element_bytes, fitting_first, l1_budget

_SHAPE = (
    "a reduction reading a window of its input, e.g. pad[h + ry, w + rx] (conv2d, depthwise "
    "conv2d), with its padding block and an elementwise epilogue"
)


class Conv(MatchingRule[tuple[Block, ConvRoles]]):
    target, rank = "cpu", 20
    templates = (
        TemplateInfo(
            "conv_prepacked", "cpu",
            "a conv2d whose weight is a constant of a model (its function's layout_free_buffers) "
            "and whose output channels are a multiple of a vector: the weight stored once, at "
            "build time, as [O/vector, I, KH, KW, vector] (`prepack`), the output tile "
            "vectorized over the output channels (NCHWc-style), accumulated in registers",
            "HT row block (3), WT column block (3)",
            ("HT", "WT"), 9,
        ),
        *(
            TemplateInfo(
                f"conv_{acc}{pad}", "cpu",
                _SHAPE + (
                    "; the output tile accumulated in registers (first for long windows)"
                    if acc == "acc" else "; no accumulator (first for short windows: depthwise)"
                ) + ("; padding inlined" if pad else "; padding computed per parallel task"),
                "KT output-channel block (4), HT row block (6), WT vectorized column block (3), "
                "U auto-unroll steps (3)",
                ("KT", "HT", "WT", "U"), 216,
            )
            for acc in ("acc", "direct")
            for pad in ("", "_inline_pad")
        ),
        TemplateInfo(
            "depthwise_fused", "cpu",
            "a depthwise conv (a window reduction whose output channel reads its own input "
            "channel only), NCHW, with its padding and elementwise epilogue (bias, ReLU6's "
            "clip): an HT x WT tile of a channel vectorized along the row and accumulated in "
            "registers over the unrolled window, the epilogue folded into the write-back, "
            "parallel over channels and row blocks (first for a depthwise conv)",
            "HT row block (3), WT vectorized column block (3)",
            ("HT", "WT"), 9,
        ),
    )  # fmt: skip

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        block, roles = self.found(view)
        # Padding per parallel task or inlined; an accumulator in registers or not (a short
        # window, a depthwise 3x3, measured faster without: the other order comes second).
        window = math.prod(block.extent(v) for v in roles.reduce)
        # A model's conv with a constant weight: the prepacked recipe first. On every 3x3 conv
        # of ResNet-18 it measured 1.0-2.0x the others' best (docs/templates.md).
        writers: list[Writer | None] = [_conv_prepacked(view, block, roles, target)]
        # A depthwise conv with an epilogue to fold (a model's: bias, ReLU6): depthwise_fused
        # first. Without one, conv_direct stays first (2x conv_acc's speed measured on a plain
        # 128-channel 56x56 depthwise conv), and the fused tile has nothing to save.
        if _depthwise_window(block, roles) and epilogue_chain(view, block):
            writers.insert(0, _depthwise(view, block, roles, target))
        for accumulate in (window > 32, window <= 32):
            writers.append(_conv(view, block, roles, target, False, accumulate))
            if roles.pad:
                writers.append(_conv(view, block, roles, target, True, accumulate))
        return writers

    def find(self, view: OpView) -> tuple[Block, ConvRoles] | None:
        return conv_of(view)


def _conv(
    view: OpView, block: Block, r: ConvRoles, target: Target, inline_pad: bool, accumulate: bool
) -> Writer:
    """`accumulate`: the output tile in a `local` accumulator. A short reduction per output (a
    depthwise 3x3: 9 multiply-adds) does not pay for it and its write-back: measured 2x slower
    on the 128-channel 56x56 depthwise conv; a long one (3x3 over 64 channels) does."""
    lanes = target.vector_lanes(block.dtype)
    # Measured on the 56x56 64->64 3x3 conv (znver3): WT must be whole vectors (7, 14 or 28
    # lanes ran 3-10x slower than 8); KT x HT x WT/lanes near 8 accumulators is best (4 x 2 x 1).
    col = block.extent(r.col)
    wt_values = vector_blocks(col, lanes)
    kt_values = pick(block.extent(r.channel), [4, 8, 2, 16], most=4) if r.channel else []
    ht_values = pick(block.extent(r.row), [2, 4, 1, 8, 7, 14], most=6) if r.row else []
    innermost = r.reduce[-2:] if not accumulate else r.reduce[-1:]
    window = [a for a in innermost if block.extent(a) <= 16]  # the loops unrolled below
    # Each unrolled copy is one statement, two without an accumulator (the init comes along).
    per_tile = math.prod(block.extent(a) for a in window) * (1 if accumulate else 2)
    kt_values, ht_values = _within_unroll_budget(kt_values, ht_values, per_tile, target)
    kt_values = _weights_in_l1(kt_values, block, r, target)
    tile = [name for name, values in (("KT", kt_values), ("HT", ht_values)) if values]
    pad = "padding inlined" if inline_pad else "padding computed per parallel task"
    w = Writer(
        f"{block.name} (conv): {pad}, {' x '.join([*tile, 'WT'])} output tile vectorized over "
        f"{r.col}, "
        + ("accumulated in registers" if accumulate else "no accumulator")
        + ", unrolled up to U steps",
        "conv" + ("_acc" if accumulate else "_direct") + ("_inline_pad" if inline_pad else ""),
    )
    wt = w.factor("WT", wt_values)
    kt = w.factor("KT", kt_values) if r.channel else None
    ht = w.factor("HT", ht_values) if r.row else None
    steps = w.factor("U", [16, 64, 256])

    s = w.section(block.name)
    if kt:
        s.append(f"split {r.channel} by {kt}")
    if ht:
        s.append(f"split {r.row} by {ht}")
    s.append(f"split {r.col} by {wt}")
    outer = list(r.outer)
    # Parallel over the outer axes and the row blocks, unless the outer axes alone (a depthwise
    # conv's channels) give every core several tasks: then each task pads whole channels.
    outer_extent = math.prod(block.extent(v) for v in r.outer)
    if r.row and (accumulate or outer_extent < 4 * target.cores):
        outer.append(f"{r.row}.o")
        rows_inside = []
    else:
        rows_inside = [f"{r.row}.o"] if r.row else []
    tiles = [*rows_inside, *([f"{r.channel}.o"] if r.channel else []), f"{r.col}.o"]
    inner = [f"{axis}.i" for axis in (r.channel, r.row, r.col) if axis]
    s.append(f"reorder {', '.join([*outer, *tiles, *r.reduce, *inner])}")
    if len(outer) > 1:
        s.append(f"fuse {', '.join(outer)} as tasks")
        par = "tasks"
    else:
        par = outer[0] if outer else tiles[0]
    s.append(f"parallel {par}")
    s.append(f"pragma {par} auto_unroll_max_step={steps}, unroll_explicit=1")
    folded: tuple[str, ...] = ()
    if accumulate:
        s.append(f"cache_write {block.name} local at {r.col}.o  # accumulate in registers")
        folded = fold_epilogue(s, view, block)
    if r.pad and inline_pad:
        s.append(f"compute_inline {r.pad}")
    elif r.pad:
        s.append(f"compute_at {r.pad} {par}  # the padded input this task reads")
    s.append(f"vectorize {r.col}.i")
    if kt:
        s.append(f"unroll {r.channel}.i")
    if ht:
        s.append(f"unroll {r.row}.i")
    for axis in window:  # the window, not channels
        s.append(f"unroll {axis}")
    if accumulate:
        s.append(f"decompose_reduction at {r.reduce[0]}")
    done = {block.name, r.pad or "", *folded}
    cpu_blocks(w, view, target, done=done)
    return w


def _weights_in_l1(kt_values: list[int], block: Block, r: ConvRoles, target: Target) -> list[int]:
    """The weights of KT output channels over the whole window (all input channels, KH x KW) are
    re-read for each of the row's column blocks: KT values whose block fits half of L1 first
    (docs/templates.md, "Tiles sized by the cache"). KT is a register tile too: the others stay,
    after them."""
    weight_block = math.prod(block.extent(v) for v in r.reduce) * element_bytes(block.dtype)
    return fitting_first(kt_values, lambda kt: kt * weight_block, l1_budget(target))


def _within_unroll_budget(
    kt_values: list[int], ht_values: list[int], per_tile: int, target: Target
) -> tuple[list[int], list[int]]:
    """KT and HT such that the largest output tile, unrolled around the window, stays within
    the statements the checker lets TVM lay out (unroll_max_copies): the list with the larger
    largest value loses it until the tile fits. 16 x 8 tiles around a 3 x 3 window without an
    accumulator are 2304 statements, and LLVM built them in 40 s."""
    kt, ht = list(kt_values), list(ht_values)
    while max(kt, default=1) * max(ht, default=1) * per_tile > target.unroll_max_copies:
        longer = kt if max(kt, default=1) >= max(ht, default=1) else ht
        if len(longer) <= 1:
            break
        longer.remove(max(longer))
    return kt, ht


def row_vector(extent: int, lanes: int) -> int:
    """The widest vector that divides a row of `extent`: a whole register, else half or a quarter
    of one (at least 4 lanes). On AVX-512 (rocketlake) a 56-wide row of the 56x56 conv takes 7
    vectors of 8, where no 16-lane tile divides it and the row became one 56-lane block: 84
    GFLOP/s against 10.5, measured side by side."""
    for width in (lanes, lanes // 2, lanes // 4):
        if width >= 4 and extent % width == 0:
            return width
    return lanes


def vector_blocks(extent: int, lanes: int) -> list[int]:
    """Knob values for a block of a row of `extent` that is vectorized: one, two or four of its
    widest vectors (`row_vector`), those that divide the row (a short row: itself)."""
    width = row_vector(extent, lanes)
    return pick(extent, [width, 2 * width, 4 * width], multiple_of=min(width, extent))


def split_vector_blocks(w: Writer, block: Block, axis: str, knob: str, target: Target) -> list[str]:
    """The section of `block` opened with `axis` split by the knob `knob`: blocks of one, two or
    four vectors (`vector_blocks`), its inner part the one vectorized."""
    lanes = target.vector_lanes(block.dtype)
    factor = w.factor(knob, vector_blocks(block.extent(axis), lanes))
    s = w.section(block.name)
    s.append(f"split {axis} by {factor}")
    return s


def _conv_prepacked(view: OpView, block: Block, r: ConvRoles, target: Target) -> Writer | None:
    """The weight, a constant of the model, stored once as output-channel blocks of one vector
    ([O/L, I, KH, KW, L]: `prepack`), and the output tile vectorized over those L channels: each
    multiply-add is one input value broadcast times L weights read contiguously (NCHWc-style,
    as TVM's x86 conv2d_NCHWc schedules it), accumulated in registers laid out channel-last."""
    lanes = target.vector_lanes(block.dtype)
    weight = _weight(view, block, r)
    if weight is None or r.channel is None or lanes <= 1 or block.extent(r.channel) % lanes:
        return None
    out = block.writes[0]
    if [set(d) for d in out.dims].count({r.channel}) != 1 or not r.row:
        return None
    w = Writer(
        f"{block.name} (conv): the weight stored once as {lanes}-channel blocks (prepack), an "
        f"HT x WT output tile vectorized over {lanes} output channels, accumulated in registers, "
        "parallel over row and channel blocks",
        "conv_prepacked",
    )
    # HT x WT accumulators of one vector each. Measured on ResNet-18's 3x3 convs (2-core Zen 4,
    # AVX-512): 8 to 14 accumulators are best (2 x 4 at 56x56 and 28x28: 212-217 GFLOP/s; 2 x 7 at
    # 14x14: 226; 1 x 7 at 7x7: 194); past 16 they spill (2 x 14: 81-166). WT divides the row,
    # whole (7, 14) when no power of two does; HT stays within the registers with WT's least.
    most = max(1, target.vector_registers // 2)
    wt_values = pick(block.extent(r.col), [4, 8, 7, 14], most=3, widens=False)
    wt_values = [v for v in wt_values if v <= most] or [1]
    ht_values = pick(block.extent(r.row), [2, 1, 4], most=3, widens=False)
    ht_values = [v for v in ht_values if v * min(wt_values) <= most] or [1]
    ht, wt = w.factor("HT", ht_values), w.factor("WT", wt_values)
    s = w.section(block.name)
    s.append(f"split {r.channel} by {lanes}")
    s.append(f"split {r.row} by {ht}")
    s.append(f"split {r.col} by {wt}")
    # Parallel over row blocks and channel blocks: the 7x7 and 14x14 convs have 7 row blocks, too
    # few for even shares (1.30 -> 1.19 ms at 7x7x512 with the channels in); so the padding is
    # its own block, made once rather than per task (1.19 -> 1.09 ms at 56x56, measured too).
    tasks = [*r.outer, f"{r.row}.o", f"{r.channel}.o"]
    inner = [f"{r.row}.i", f"{r.col}.i", f"{r.channel}.i"]
    s.append(f"reorder {', '.join([*tasks, f'{r.col}.o', *r.reduce, *inner])}")
    s.append(f"fuse {', '.join(tasks)} as tasks")
    s.append("parallel tasks")
    s.append("pragma tasks auto_unroll_max_step=16, unroll_explicit=1")
    s.append(f"cache_read {weight.buffer} global")
    s.append(f"transform_layout {weight.buffer}_global {_channel_blocks(weight, r, lanes)}")
    s.append(f"prepack {weight.buffer}_global  # made once, when the model is built")
    s.append(f"cache_write {block.name} local at {r.col}.o  # accumulate in registers")
    s.append(f"transform_layout {out.buffer}_local {_channel_last(out, r)}")
    folded = fold_epilogue(s, view, block)
    s.append(f"vectorize {r.channel}.i")
    s.append(f"unroll {r.col}.i")
    s.append(f"unroll {r.row}.i")
    s.append(f"unroll {r.reduce[-1]}")
    s.append(f"decompose_reduction at {r.reduce[0]}")
    if r.pad:
        _padding_rows(w, next(b for b in view.blocks if b.name == r.pad), lanes)
    cpu_blocks(w, view, target, done={block.name, r.pad or "", *folded})
    return w


def _padding_rows(w: Writer, pad: Block, lanes: int) -> None:
    """The padding on its own: parallel over its rows, each row vectorized when it is at most four
    vectors (the 230-wide row of a 7x7 stem is left to LLVM). The generic way (all loops fused,
    split into vectors) recomputes the row and column of each lane from the fused index: 0.55 ms
    more on the 56x56x64 conv of ResNet-18 (1.12 -> 1.66 ms), measured."""
    loops = [loop.var for loop in pad.spatial]
    s = w.section(pad.name)
    if len(loops) > 2:
        s.append(f"fuse {', '.join(loops[:-1])} as rows")
    s.append(f"parallel {'rows' if len(loops) > 2 else loops[0]}")
    if pad.extent(loops[-1]) <= 4 * lanes:
        s.append(f"vectorize {loops[-1]}")


def _weight(view: OpView, block: Block, r: ConvRoles):
    """The conv's weight when it is a constant of the model, indexed by one loop per dimension
    (the output channel one of them); else None."""
    free = layout_free_params(view.func) if view.func is not None else []
    for access in block.reads:
        if access.buffer == r.data or access.buffer not in free or not r.channel:
            continue
        if all(len(d) == 1 for d in access.dims) and access.uses(r.channel):
            return access
    return None


def _channel_blocks(weight, r: ConvRoles, lanes: int) -> str:
    """The weight's map to [O/L, the other dimensions, L]: `(a0, a1, a2, a3) -> (a0 // 16, a1,
    a2, a3, a0 % 16)` for OIHW."""
    names = [f"a{n}" for n in range(len(weight.dims))]
    at = next(n for n, d in enumerate(weight.dims) if r.channel in d)
    rest = [name for n, name in enumerate(names) if n != at]
    outputs = [f"{names[at]} // {lanes}", *rest, f"{names[at]} % {lanes}"]
    return f"({', '.join(names)}) -> ({', '.join(outputs)})"


def _channel_last(out, r: ConvRoles) -> str:
    """The accumulator's map with the output channel last, so the vectorized channels are
    contiguous in it: `(a0, a1, a2, a3) -> (a0, a2, a3, a1)` for NCHW."""
    names = [f"a{n}" for n in range(len(out.dims))]
    at = next(n for n, d in enumerate(out.dims) if r.channel in d)
    moved = [name for n, name in enumerate(names) if n != at] + [names[at]]
    return f"({', '.join(names)}) -> ({', '.join(moved)})"


def _depthwise_window(block: Block, r: ConvRoles) -> tuple[str, str] | None:
    """The window's two axes of a depthwise conv: no output-channel axis in the weight alone,
    a row, and every other reduction of extent 1 (a grouped conv's channels per group: 1)."""
    window = r.reduce[-2:]
    rest = [a for a in r.reduce if a not in window]
    if r.channel or not r.row or len(window) != 2:
        return None
    if math.prod(block.extent(a) for a in rest) != 1:
        return None
    return window[0], window[1]


def _depthwise(view: OpView, block: Block, r: ConvRoles, target: Target) -> Writer | None:
    assert r.row
    lanes = target.vector_lanes(block.dtype)
    w = Writer(
        f"{block.name} (depthwise conv): HT x WT tile vectorized along {r.col}, accumulated in "
        "registers over the unrolled window, the epilogue folded into the write-back",
        "depthwise_fused",
    )
    # HT x WT / lanes accumulators: 2 x 2 vectors first, at most 4 x 4 (16 of 32 registers, 8
    # of AVX2's 16 with 8-lane vectors at WT 2 vectors).
    wt = w.factor("WT", vector_blocks(block.extent(r.col), lanes))
    ht = w.factor("HT", pick(block.extent(r.row), [2, 4, 1, 7], most=3, widens=False))
    window = r.reduce[-2:]
    s = w.section(block.name)
    s.append(f"split {r.row} by {ht}")
    s.append(f"split {r.col} by {wt}")
    rest = [a for a in r.reduce if a not in window]
    s.append(
        f"reorder {', '.join([*r.outer, f'{r.row}.o', f'{r.col}.o', *rest, *window])}, "
        f"{r.row}.i, {r.col}.i"
    )
    s.append(f"fuse {', '.join([*r.outer, f'{r.row}.o'])} as tasks")
    s.append("parallel tasks")
    s.append(f"cache_write {block.name} local at {r.col}.o  # accumulate in registers")
    folded = fold_epilogue(s, view, block, "each output is")
    if r.pad:
        s.append(f"compute_at {r.pad} tasks  # the padded rows this task reads")
    s.append(f"vectorize {r.col}.i")
    s.append(f"unroll {r.row}.i")
    for axis in window:
        s.append(f"unroll {axis}")
    s.append(f"decompose_reduction at {r.reduce[0]}")
    cpu_blocks(w, view, target, done={block.name, r.pad or "", *folded})
    return w
