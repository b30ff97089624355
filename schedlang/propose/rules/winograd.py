"""CPU Winograd convolution: the function schedlang.models.winograd writes for a model's 3x3
convolution (blocks winograd_pad, winograd_input, winograd_gemm, winograd_output, then the
elementwise epilogue FuseOps put after it).

- the padding, channel-last: parallel over rows, vectorized over channels;
- the input transform, rows then columns: parallel over tiles, the rows' step computed per tile
  and channel block beside the columns' (`compute_at`), each 6x6 plane unrolled so that each
  copy keeps its own sum, vectorized over input channels;
- the 36 matmuls: a PT tiles x CT output channels register tile accumulated over the input
  channels, parallel over the planes and tile blocks, vectorized over output channels;
- the inverse transform, rows then columns: parallel over channel blocks and tile rows, the rows'
  step per tile, the 4x4 outputs of a tile unrolled, vectorized over output channels, the
  epilogue (bias, residual, ReLU) folded in.
"""

from __future__ import annotations

from schedlang.core.target import Target
from schedlang.propose.analysis import Block, OpView
from schedlang.propose.rules.generic import cpu_blocks
from schedlang.propose.rules.matmul import fold_epilogue
from schedlang.propose.template import MatchingRule, TemplateInfo, Writer, pick
from schedlang.propose.working_set import element_bytes, fitting, l1_budget

# The Winograd function's blocks, in order, and its output tile: schedlang.models.winograd (a
# higher layer) names its blocks with these, and the recipe finds them by them.
BLOCKS = (
    "winograd_pad",
    "winograd_input_rows",
    "winograd_input",
    "winograd_gemm",
    "winograd_output_rows",
    "winograd_output",
)
TILE = 4  # F(4x4, 3x3): 4x4 outputs from 6x6 inputs


# Accumulators of one vector each in the matmuls' register tile: 7 to 16 measured best on
# ResNet-18's layers on AVX-512 (56x56x64: 7 x 1 and 14 x 1 vector within 5%; 28x28x128: 7 x 2);
# 28 and more spilled (14 x 4: 2.8x slower), so the first point aims at 14 of AVX-512's 32
# registers: half of them less the two the inputs take, which is 14 on NEON's 32 too, and 6 of
# AVX2's 16 (not measured there).
def _accumulators(target: Target) -> int:
    return max(1, target.vector_registers // 2 - 2)


class Winograd(MatchingRule[dict[str, Block]]):
    target, rank, alone = "cpu", 4, True
    templates = (
        TemplateInfo(
            "winograd", "cpu",
            "the Winograd F(4x4, 3x3) function a model's 3x3 convolution becomes "
            "(schedlang.models.winograd): each transform parallel and vectorized over channels "
            "with its 6x6 or 4x4 plane unrolled, the 36 matmuls as PT x CT register tiles, the "
            "epilogue folded into the inverse transform",
            "PT tiles per register tile (3), CT output channels per register tile (3)",
            ("PT", "CT"), 9,
        ),
    )  # fmt: skip

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        return [_winograd(view, self.found(view), target)]

    def find(self, view: OpView) -> dict[str, Block] | None:
        return _blocks(view)


def _blocks(view: OpView) -> dict[str, Block] | None:
    """The Winograd function's four blocks by name, when the op has all of them with the loops
    schedlang.models.winograd gives them."""
    named = {b.name: b for b in view.blocks if b.name in BLOCKS}
    if len(named) != len(BLOCKS):
        return None
    for name, block in named.items():
        if (len(block.spatial), len(block.reduce)) != (4, int(name == "winograd_gemm")):
            return None
    return named


def _winograd(view: OpView, blocks: dict[str, Block], target: Target) -> Writer | None:
    pad, rows_in, data, gemm, rows_out, out = (blocks[name] for name in BLOCKS)
    lanes = target.vector_lanes(gemm.dtype)
    eps, nu, p, co = (loop.var for loop in gemm.spatial)
    ci = gemm.reduce[0].var
    if gemm.extent(co) % lanes or data.extent(data.spatial[3].var) % lanes:
        return None
    w = Writer(
        "Winograd F(4x4, 3x3) conv: transforms vectorized over channels with their planes "
        "unrolled, the 36 matmuls in PT x CT register tiles accumulated over input channels, "
        "the epilogue folded into the inverse transform",
        "winograd",
    )
    pt_values = pick(gemm.extent(p), [14, 7, 8, 4, 16], most=3, widens=False)
    ct_values = pick(gemm.extent(co), [lanes, 2 * lanes, 4 * lanes], multiple_of=lanes)
    # A task (a plane, PT tiles) re-reads its PT x CI block of V once per CT-channel block,
    # streaming U's CT columns past it once: the block stays in L1 (docs/templates.md, "Tiles
    # sized by the cache"). CT sizes registers only.
    block_bytes = gemm.extent(ci) * element_bytes(gemm.dtype)
    pt_values = fitting(pt_values, lambda pt: pt * block_bytes, l1_budget(target))
    accumulators = _accumulators(target)
    ct_values.sort(key=lambda ct: abs(pt_values[0] * ct // lanes - accumulators))
    pt, ct = w.factor("PT", pt_values), w.factor("CT", ct_values)

    n, h, col, c = (loop.var for loop in pad.spatial)
    s = w.section(pad.name)
    s.append(f"fuse {n}, {h}, {col} as rows")
    s.append("parallel rows")
    s.append(f"split {c} by {lanes}")
    s.append(f"vectorize {c}.i")

    e, v, tile, c = (loop.var for loop in data.spatial)
    s = w.section(data.name)
    s.append(f"split {c} by {lanes}")
    s.append(f"reorder {tile}, {c}.o, {e}, {v}, {c}.i")
    s.append(f"parallel {tile}")
    s.append(f"compute_at {rows_in.name} {c}.o  # the rows' step of this tile's channels")
    s.append(f"unroll {e}")
    s.append(f"unroll {v}")
    s.append(f"vectorize {c}.i")
    _unrolled_rows(w, rows_in)

    s = w.section(gemm.name)
    s.append(f"fuse {eps}, {nu} as planes")
    s.append(f"split {p} by {pt}")
    s.append(f"split {co} by {ct}")
    s.append(f"split {co}.i by {lanes}")
    s.append(f"reorder planes, {p}.o, {co}.o, {ci}, {p}.i, {co}.i.o, {co}.i.i")
    s.append(f"fuse planes, {p}.o as tasks")
    s.append("parallel tasks")
    s.append(f"cache_write {gemm.name} local at {co}.o  # accumulate in registers")
    s.append(f"vectorize {co}.i.i")
    s.append(f"unroll {co}.i.o")
    s.append(f"unroll {p}.i")
    s.append(f"decompose_reduction at {ci}")

    n, c, h, col = (loop.var for loop in out.spatial)
    s = w.section(out.name)
    s.append(f"split {c} by {lanes}")
    s.append(f"split {h} by {TILE}")
    s.append(f"split {col} by {TILE}")
    s.append(f"reorder {n}, {c}.o, {h}.o, {col}.o, {h}.i, {col}.i, {c}.i")
    s.append(f"fuse {n}, {c}.o, {h}.o as tasks")
    s.append("parallel tasks")
    s.append(f"compute_at {rows_out.name} {col}.o  # the rows' step of this tile")
    folded = fold_epilogue(s, view, out, "each output is")
    s.append(f"unroll {h}.i")
    s.append(f"unroll {col}.i")
    s.append(f"vectorize {c}.i")
    _unrolled_rows(w, rows_out)
    cpu_blocks(w, view, target, done={*BLOCKS, *folded})
    return w


def _unrolled_rows(w: Writer, block: Block) -> None:
    """A transform's rows step, moved under its consumer's tile: its two plane loops unrolled,
    its channels vectorized (the tile's own loop is gone: one tile an iteration)."""
    first, second, _, channels = (loop.var for loop in block.spatial)
    s = w.section(block.name)
    s.append(f"unroll {first}")
    s.append(f"unroll {second}")
    s.append(f"vectorize {channels}")
