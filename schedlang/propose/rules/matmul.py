"""CPU matmul: a reduction of two inputs indexed by single loops (C[i, j] += A[i, k] * B[k, j]).

A register tile accumulated in `local`, vectorized over the columns, under cache tiles that are
parallel. Best first: B stored once as column panels (`transform_layout`) for a plain 2-D matmul,
zero-padded to whole tiles first (`pad by`) when its shape does not divide; then B packed per
column panel by `cache_read`; then B read in place. Where B is a constant weight of a model (its
function's `layout_free_buffers`), the panels (padded or not) and packed templates `prepack` it:
the panels are made once, when the model is built, not at every call. An elementwise epilogue
(bias, ReLU) is folded into the write-back block of the `cache_write`. A matmul gets these
templates only.
"""

from __future__ import annotations

from schedlang.core.opinfo import arg_buffers
from schedlang.core.target import Target
from schedlang.lang.statements.layout import layout_free_params
from schedlang.propose.analysis import (
    MATMUL_SHAPE,
    Block,
    MatmulRoles,
    OpView,
    epilogue,
    epilogue_chain,
    matmul_of,
)
from schedlang.propose.rules.generic import cpu_blocks
from schedlang.propose.template import MatchingRule, TemplateInfo, Writer, divisors, pick
from schedlang.propose.working_set import element_bytes, fitting, l2_budget, most_within


class Matmul(MatchingRule[tuple[Block, MatmulRoles]]):
    target, rank, alone = "cpu", 10, True
    templates: tuple[TemplateInfo, ...] = (
        TemplateInfo(
            "matmul_panels", "cpu",
            "a plain 2-D matmul C[i, j] += A[i, k] * B[k, j] (or B[j, k]) with N a multiple of "
            "two vectors (an elementwise epilogue included); B stored as panels by "
            "transform_layout",
            "MR register rows (2: 8 and 4 with 32 vector registers, else 4 and 2), MC row block "
            "(3), KU k unroll (4), U auto-unroll steps (2)",
            ("MR", "MC", "KU", "U"), 48,
        ),
        TemplateInfo(
            "matmul_panels_padded", "cpu",
            "the same matmul at a shape that does not divide (1000 x 999 x 997; no epilogue): "
            "zero-padded to whole 4 x 2-vector tiles (8 with 32 vector registers) by `pad by`, "
            "then B stored as panels",
            "MC row block (3), MR register rows (2, with 32 vector registers), KU k unroll (4), "
            "U auto-unroll steps (3)",
            ("MC", "MR", "KU", "U"), 72,
        ),
        TemplateInfo(
            "matmul_packed", "cpu", MATMUL_SHAPE + "; B packed per TJ-column panel",
            "RI, RJ register tile (2 values each), TI, TJ cache tile (3 each), KU k unroll (3), "
            "U auto-unroll steps (2)",
            ("RI", "RJ", "TI", "TJ", "KU", "U"), 216,
        ),
        TemplateInfo(
            "matmul_tiled", "cpu", MATMUL_SHAPE + "; B read in place",
            "RI, RJ register tile (2 each), TI, TJ cache tile (3 each), KU k unroll (3), "
            "U auto-unroll steps (2)",
            ("RI", "RJ", "TI", "TJ", "KU", "U"), 216,
        ),
    )  # fmt: skip

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        block, roles = self.found(view)
        return [
            _panels(view, block, roles, target),
            _panels_padded(view, block, roles, target),
            _tiled(view, block, roles, target, packed=True),
            _tiled(view, block, roles, target, packed=False),
        ]

    def find(self, view: OpView) -> tuple[Block, MatmulRoles] | None:
        return matmul_of(view)


def matmul_label(block: Block) -> str:
    return f"{block.name} (matmul)"


def split_k_inside(
    r: MatmulRoles, factor: object, tiles: list[str], registers: list[str]
) -> list[str]:
    """k split by `factor` between the tiles and the register tile, and the tiled matmul's order:
    batch axes, the tile loops, outer reductions, k's parts, the register tile's loops."""
    order = [*r.outer, *tiles, *r.outer_reduce, f"{r.k}.o", f"{r.k}.i", *registers]
    return [f"split {r.k} by {factor}", f"reorder {', '.join(order)}"]


def fold_epilogue(
    s: list[str], view: OpView, block: Block, what: str = "the tile is"
) -> tuple[str, ...]:
    """The elementwise epilogue blocks, if the op has them (bias, a residual add, ReLU), folded
    one after the other into the write-back of `what` (after its `cache_write`); their names."""
    chain = epilogue_chain(view, block)
    for after in chain:
        s.append(f"reverse_compute_inline {after.name}  # computed as {what} written back")
    return tuple(after.name for after in chain)


def decompose_outermost(r: MatmulRoles) -> str:
    """The reduction's init split off at its outermost reduction loop."""
    return f"decompose_reduction at {(r.outer_reduce or (f'{r.k}.o',))[0]}"


def _tiled(
    view: OpView, block: Block, r: MatmulRoles, target: Target, packed: bool
) -> Writer | None:
    if packed and _panel_order(block, r) == "panels":
        return None  # B is stored as panels already: matmul_panels reads them
    lanes = target.vector_lanes(block.dtype)
    m, n, k = block.extent(r.i), block.extent(r.j), block.extent(r.k)
    what = "packed B, " if packed else ""
    w = Writer(
        f"{matmul_label(block)}: {what}RI x RJ register tile in TI x TJ tiles, k unrolled by KU",
        "matmul_packed" if packed else "matmul_tiled",
    )
    # A 4x16 fp32 tile is 8 AVX2 accumulators; 8 x 2 vectors is the most that stays in registers.
    # Measured at 1024^3 fp32 on a 2-core znver3 (AVX2): 4 x 16 is best, 8 x 8 and 2 x 32 close;
    # 8 x 16 (16 accumulators) spills. Every list is best first: the first point is the default.
    ri_values = pick(m, [4, 8, 2], most=2, widens=False)
    rj_values = pick(
        n, [2 * lanes, lanes], multiple_of=lanes if n % lanes == 0 else 1, widens=False
    )
    tj_values = pick(n, [64, 32, 16, 128], multiple_of=max(rj_values), most=3)
    # B's TJ-column panel, all of k, is re-read by each of the tile's TI / RI register rows:
    # it stays in L2 (docs/templates.md, "Tiles sized by the cache").
    panel_bytes = k * element_bytes(block.dtype)
    tj_values = fitting(tj_values, lambda tj: tj * panel_bytes, l2_budget(target))
    ri = w.factor("RI", ri_values)
    rj = w.factor("RJ", rj_values)
    ti = w.factor("TI", pick(m, [256, 128, 64, 32], multiple_of=max(ri_values), most=3))
    tj = w.factor("TJ", tj_values)
    # `unroll k.i` and `unroll i.i.i` copy the RJ-lane body KU x RI times: a widened KU stays
    # within the checker's limit at the largest register tile (16 lanes: KU 16 x RI 8 x RJ 32 is
    # 4096 copies).
    tile_copies = max(ri_values) * max(rj_values)
    ku_values = pick(k, [8, 4, 1], most=3)
    ku_values = [v for v in ku_values if v * tile_copies <= target.unroll_max_copies] or [1]
    ku = w.factor("KU", ku_values)
    steps = w.factor("U", [16, 64])

    s = w.section(block.name)
    s.append(f"tile {r.i}, {r.j} by {ti} x {tj}")
    s.append(f"tile {r.i}.i, {r.j}.i by {ri} x {rj}  # the register tile")
    tiles = [f"{r.i}.o", f"{r.j}.o", f"{r.i}.i.o", f"{r.j}.i.o"]
    s += split_k_inside(r, ku, tiles, [f"{r.i}.i.i", f"{r.j}.i.i"])
    # A constant weight is stored once as panels as wide as the widest RJ, made when the model is
    # built (`prepack`); any other B is copied per TJ-column panel, at every call.
    order = _panel_order(block, r) if packed and constant_weight(view, r) else None
    prepacked = order is not None and n % (2 * lanes) == 0 and max(rj_values) <= 2 * lanes
    if prepacked:
        s.append(f"cache_read {r.b} global")
        s.append(f"transform_layout {r.b}_global {order} -> (j // {2 * lanes}, k, j % {2 * lanes})")
        s.append(f"prepack {r.b}_global  # the panels made once, when the model is built")
    elif packed:
        s.append(f"cache_read {r.b} global at {r.j}.o  # {r.b}'s TJ-column panel, contiguous")
    s.append(f"cache_write {block.name} local at {r.j}.i.o  # accumulate in registers")
    folded = fold_epilogue(s, view, block)
    s.append(f"unroll {r.k}.i")
    s.append(f"unroll {r.i}.i.i")
    s.append(f"vectorize {r.j}.i.i")
    s.append(f"fuse {', '.join([*r.outer, f'{r.i}.o', f'{r.j}.o'])} as tiles")
    s.append("parallel tiles")
    s.append(f"pragma tiles auto_unroll_max_step={steps}, unroll_explicit=1")
    s.append(decompose_outermost(r))
    if prepacked:
        w.section(f"{r.b}_global").append("parallel ax0")
    elif packed:
        _copy_loops(w, block, r, lanes, tj_values)
    if min(ri_values) > 1 and min(rj_values) > 1:
        w.section(f"{block.name}_local").append("vectorize ax1")
    cpu_blocks(w, view, target, done={block.name, *folded})
    return w


def _copy_loops(w: Writer, block: Block, r: MatmulRoles, lanes: int, tj_values: list[int]) -> None:
    """The copy of B's TJ-column panel vectorized: one loop per dimension of the panel longer
    than 1."""
    b_access = next(a for a in block.reads if a.buffer == r.b)
    copy, axis = w.section(f"{r.b}_global"), f"ax{r.tile_dims(b_access) - 1}"
    if max(tj_values) > lanes and all(t % lanes == 0 for t in tj_values):
        copy.append(f"split {axis} by {lanes}")  # a panel row is several vectors
        axis += ".i"
    copy.append(f"vectorize {axis}")


def constant_weight(view: OpView, r: MatmulRoles) -> bool:
    """Whether B is a constant at every call of the function (a model's bound weight)."""
    return view.func is not None and r.b in layout_free_params(view.func)


def _panel_order(block: Block, r: MatmulRoles) -> str | None:
    """B's own index order, "(k, j)" or "(j, k)", when the matmul is a plain 2-D one (no batch
    axes, one reduction axis) and B is indexed by k and j alone: what the panel recipes need;
    "panels" when B is stored as panels already, B[j // P, k, j % P] (`panel_width`)."""
    b_access = next(a for a in block.reads if a.buffer == r.b)
    dims = [set(d) for d in b_access.dims]
    if not r.outer and not r.outer_reduce and dims == [{r.j}, {r.k}, {r.j}]:
        return "panels"
    if r.outer or r.outer_reduce or dims not in ([{r.k}, {r.j}], [{r.j}, {r.k}]):
        return None
    return "(k, j)" if dims[0] == {r.k} else "(j, k)"


def panel_width(view: OpView, r: MatmulRoles) -> int | None:
    """P of a B stored as column panels [N / P, K, P] (a decoder's projections,
    schedlang.models.decoder.weights): its last dimension, from the function's buffers."""
    if view.func is None:
        return None
    for buffer in arg_buffers(view.func):
        if buffer.name == r.b and len(buffer.shape) == 3:
            return int(buffer.shape[2])
    return None


def _panel_loops(
    s: list[str], r: MatmulRoles, mc: str, mr: str, nr: int, ku: str, by_panels: bool = False
) -> None:
    """The loops of the panel kernel: MC x MR rows, NR columns, k by KU. Parallel over the row
    blocks, or (`by_panels`) over B's column panels inside each row block: a prefill's GEMM at
    128 tokens is one row block of 16 x 8 rows, so parallel row blocks left one core idle."""
    s.append(f"split {r.i} by *, {mc}, {mr}")
    s.append(f"split {r.j} by *, {nr}")
    s.append(f"split {r.k} by *, {ku}")
    s.append(f"reorder {r.i}.0, {r.j}.o, {r.i}.1, {r.k}.o, {r.k}.i, {r.i}.2, {r.j}.i")
    s.append(f"parallel {r.j}.o" if by_panels else f"parallel {r.i}.0")


def _panel_tile(s: list[str], r: MatmulRoles, steps: str, by_panels: bool = False) -> None:
    """The register tile of the panel kernel: a row of NR lanes vectorized, rows and k unrolled.
    With M symbolic (a prefill's token count) the row splits leave a guard on every row of the
    tile, inside the k loop, and a tile buffer as long as min(M, MR): the accumulators went to
    memory (80 zmm stores per k step) and the kernel ran at 0.4x its static build. The partition
    hint makes TVM split the row blocks into those that are whole, unguarded, and the tail. Where
    the row blocks' tiles are the loop inside the parallel one (`by_panels`) the hint is on them:
    each row block's whole tiles unguarded, the tail block's too, and only the last tile guarded
    (120 rows of 2048 x 1536: 2.3x the hint on the row blocks, whose tail block of 120 rows ran
    all guarded; the same at 1,024 rows, measured)."""
    parallel = f"{r.j}.o" if by_panels else f"{r.i}.0"
    s.append(f"vectorize {r.j}.i")
    s.append(f"unroll {r.i}.2")
    s.append(f"unroll {r.k}.i")
    s.append(f"pragma {parallel} auto_unroll_max_step={steps}, unroll_explicit=1")
    if by_panels:
        s.append(f"annotate {r.i}.1 pragma_loop_partition_hint=1  # whole tiles unguarded")
    else:
        s.append(f"annotate {r.i}.0 pragma_loop_partition_hint=1  # whole row blocks unguarded")
    s.append(f"decompose_reduction at {r.k}.o")


def _panels(view: OpView, block: Block, r: MatmulRoles, target: Target) -> Writer | None:
    """B stored once as NR-column panels (`transform_layout` of its packed copy to [N/NR, K,
    NR]), so the vectorized loop reads B contiguously for every k, under an MR x NR register tile
    (examples/matmul_packed.sched). A plain 2-D matmul only: no batch axes, one reduction axis, B
    indexed by k and j alone, N a multiple of NR."""
    lanes = target.vector_lanes(block.dtype)
    m, n, k = block.extent(r.i), block.extent(r.j), block.extent(r.k)
    order = _panel_order(block, r)  # B's own index order
    # Two vectors per panel row (2 x MR accumulators), or the panels B is stored as already.
    nr = (panel_width(view, r) or 0) if order == "panels" else 2 * lanes
    if order is None or lanes <= 1 or not nr or n % nr or nr % lanes:
        return None
    w = Writer(
        f"{matmul_label(block)}: B stored as {nr}-column panels (transform_layout), an MR x {nr} "
        "register tile in MC-row blocks, k unrolled by KU",
        "matmul_panels",
    )
    # MR x NR/lanes accumulators and the B vectors fit the registers: MR 4 is 8 + 2 of AVX2's
    # 16; with AVX-512's 32, MR 8 is 16 + 2.
    rows = [8, 4] if target.vector_registers >= 32 else [4, 2]
    mr_values = pick(m, rows, most=2, widens=False)
    mr = w.factor("MR", mr_values)
    # Parallel over B's column panels inside each row block where there are panels enough for
    # every core twice: a prefill's 128 tokens are one row block (MC 16 x MR 8), so parallel row
    # blocks ran on one core. Then A's row block is re-read for each panel and B's panel once per
    # row block: a block of at least 4 x NR rows keeps B's traffic per flop at a quarter of A's
    # or less (2 / rows bytes against 2 / NR), whether or not A's rows fit L2: at 8960 -> 1536,
    # 128 rows ran 1.5 to 2x the 16 that half of L2 holds (measured, docs/llm-tuning.md).
    # Otherwise parallel row blocks, 128 to 512 rows each at MR 8, A's MC x MR rows over all of k
    # within half of L2 (docs/templates.md, "Tiles sized by the cache"). MC counts register tiles
    # (`split i by *, MC, MR`) and divides M / MR, so no point is guarded at M.
    by_panels = n // nr >= 2 * target.cores
    if by_panels:
        least = max(1, 4 * nr // max(mr_values))
        mc_preferred = [v for v in dict.fromkeys([least, least // 2, 2 * least, least // 4]) if v]
    else:
        a_rows = max(mr_values) * k * element_bytes(block.dtype)
        mc_most = most_within(a_rows, l2_budget(target))
        mc_preferred = [v for v in [16, 32, 64, 8, 4, 2, 1] if v <= mc_most]
    mc = w.factor("MC", pick(m // max(mr_values), mc_preferred, most=3))
    ku = w.factor("KU", pick(k, [4, 8, 2, 1], most=4))
    steps = w.factor("U", [16, 64])
    s = w.section(block.name)
    _panel_loops(s, r, mc, mr, nr, ku, by_panels)
    if order != "panels":
        s.append(f"cache_read {r.b} global")
        s.append(f"transform_layout {r.b}_global {order} -> (j // {nr}, k, j % {nr})")
    if order != "panels" and constant_weight(view, r):
        s.append(f"prepack {r.b}_global  # the panels made once, when the model is built")
    s.append(f"cache_write {block.name} local at {r.i}.1  # the MR x {nr} tile in registers")
    folded = fold_epilogue(s, view, block)
    _panel_tile(s, r, steps, by_panels)
    if order != "panels":
        w.section(f"{r.b}_global").append("parallel ax0")
    cpu_blocks(w, view, target, done={block.name, *folded})
    return w


def _panels_padded(view: OpView, block: Block, r: MatmulRoles, target: Target) -> Writer | None:
    """The panels recipe for a shape that does not divide (1000 x 999 x 997): `pad by` runs the
    block over zero-padded copies (rows to a multiple of 4, columns of NR, k of 4 when it has no
    such factor), so no guard lands in the register tile or the vectorized loop, and the padded B
    is stored as NR-column panels (bench/packed_gemm_odd.sched). A guard per lane makes LLVM build
    the vectorized loop lane by lane: 0.06-0.11x numpy, measured."""
    lanes = target.vector_lanes(block.dtype)
    # MR x 2 accumulators and the B vectors fit the registers: MR 4 in AVX2's 16; with 32
    # (AVX-512) MR 8 too, 1.12x MR 4 at 1000 x 999 x 997 on rocketlake, measured side by side.
    nr, mr = 2 * lanes, (8 if target.vector_registers >= 32 else 4)
    m, n, k = block.extent(r.i), block.extent(r.j), block.extent(r.k)
    order = _panel_order(block, r)  # B's own index order
    if (
        order in (None, "panels")
        or lanes <= 1
        or (m % mr == 0 and n % nr == 0)  # the plain panels template fits
        or epilogue(view, block) is not None  # pad_einsum wants the matmul block alone
        or len(view.blocks) != 1
    ):
        return None
    kp = 4 if k % 4 and k > 4 else 1
    padded = {r.i: mr, r.j: nr, r.k: kp}
    m_pad, k_pad = -(-m // mr) * mr, -(-k // kp) * kp
    w = Writer(
        f"{matmul_label(block)}: zero-padded to whole {mr} x {nr} tiles (pad by), B stored as "
        f"{nr}-column panels (transform_layout), MC tiles of rows per parallel task, k unrolled "
        "by KU",
        "matmul_panels_padded",
    )
    # Row blocks of MC tiles of `mr` rows: the largest three up to 32 tiles that still give every
    # core at least two parallel tasks (1000 rows: 25, 10 and 5 tiles of 4; 25, 5, 1 of 8).
    tiles = m_pad // mr
    # As in matmul_panels, A's MC x MR padded rows over all of k stay within half of L2.
    mc_most = min(32, most_within(mr * k_pad * element_bytes(block.dtype), l2_budget(target)))
    blocks = [d for d in divisors(tiles) if d <= mc_most and tiles // d >= 2 * target.cores]
    mc = w.factor("MC", blocks[-3:][::-1] or [1])
    # The register tile: `mr` rows, or half as many (MC then counts tiles of `mr` rows still).
    rows = w.factor("MR", [mr, mr // 2]) if mr > 4 else str(mr)
    ku = w.factor("KU", pick(k_pad, [4, 8, 2, 1], most=4))
    steps = w.factor("U", [16, 64, 256])
    s = w.section(block.name)
    s.append(f"pad by {', '.join(str(padded.get(x.var, 1)) for x in block.loops)}")
    _panel_loops(s, r, mc, rows, nr, ku)
    s.append(f"transform_layout {r.b}_pad {order} -> (j // {nr}, k, j % {nr})")
    if constant_weight(view, r):
        s.append(f"prepack {r.b}_pad  # the padded panels made once, when the model is built")
    s.append(f"cache_write {block.name} local at {r.i}.1  # the {rows} x {nr} tile in registers")
    _panel_tile(s, r, steps)
    return w
