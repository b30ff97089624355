"""CPU row-wise ops: several blocks over the same rows, one a reduction, the last reading all
the others (softmax, layer norm). Every block computed per row inside the last block's parallel
row loop, rows vectorized, reductions split (`rfactor`) into vector lanes of partial sums; for
a float32 exp (softmax), first with the exp rewritten as a polynomial that vectorizes
(`fast_math exp`)."""

from __future__ import annotations

import math

from schedlang.core.target import Target
from schedlang.propose.analysis import OpView, row_blocks, row_extents
from schedlang.propose.template import Rule, TemplateInfo, Writer, pick

_KNOBS = "V vector width (3), RS reduction lanes (2), RB rows per parallel task (4), "
_KNOBS += "U auto-unroll steps (3)"


class Rows(Rule):
    target, rank = "cpu", 30
    templates = (
        TemplateInfo(
            "rows_fast_exp", "cpu",
            "the same as rows, for ops with a float32 exp (softmax): each exp rewritten first "
            "into a vectorizable polynomial (`fast_math exp`)",
            _KNOBS, ("V", "RS", "RB", "U"), 72,
        ),
        TemplateInfo(
            "rows", "cpu",
            "several blocks over the same rows, one a reduction, each (row, one inner axis), the "
            "last reading all the others (softmax, layer norm)",
            _KNOBS, ("V", "RS", "RB", "U"), 72,
        ),
    )  # fmt: skip

    def applies(self, view: OpView, target: Target) -> bool:
        # Without a reduction the blocks are a chain of spatial ones: the injective rule's.
        return any(b.reduce for b in view.blocks) and row_blocks(view, target.cores)

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        # With an exp (softmax), its polynomial first: libm's expf does not vectorize.
        fast = [_rows(view, target, fast_exp=True)] if view.exp_blocks else []
        return [*fast, _rows(view, target)]


def _rows(view: OpView, target: Target, fast_exp: bool = False) -> Writer:
    """Every block computed per row inside the last block's parallel row loop; `fast_exp`: each
    float32 exp rewritten first (`fast_math exp`), so that its block vectorizes. Several row
    loops (a layer norm's (1, 128)) are fused into one, `row`."""
    last = view.blocks[-1]
    lanes = target.vector_lanes(last.dtype)
    names = ", ".join(b.name for b in view.blocks)
    w = Writer(
        f"row-wise {names}: RB rows per parallel task, rows vectorized by V, reductions by RS "
        "partial sums, unrolled up to U steps" + (", exp as a polynomial" if fast_exp else ""),
        "rows_fast_exp" if fast_exp else "rows",
    )
    for name in view.exp_blocks if fast_exp else ():
        w.section(name).append("fast_math exp")
    depth = len(row_extents(last))  # the row loops, then at most one inner loop per block
    inner = [b for b in view.blocks if len(b.loops) > depth]
    cols = {int(b.loops[-1].extent) for b in inner}
    vec = [v for v in (lanes, 2 * lanes, 4 * lanes) if all(c % v == 0 for c in cols)]
    v = w.factor("V", vec or [1])
    reductions = [b for b in view.blocks if b.reduce]
    lengths = {int(b.loops[-1].extent) for b in reductions}
    # Fewer lanes than the row, so that the rfactor block keeps both of its loops.
    rs_values = [v for v in (lanes, 2 * lanes) if all(n % v == 0 and n > v for n in lengths)]
    rs = w.factor("RS", rs_values) if rs_values else None
    rows = math.prod(row_extents(last))
    # Row blocks: every core gets at least two tasks.
    rb_values = [b for b in pick(rows, [1, 4, 16, 2], most=4) if rows // b >= 2 * target.cores]
    rb = w.factor("RB", rb_values or [1])
    steps = w.factor("U", [1, 16, 64])
    if rs:
        for block in reductions:  # partial sums over RS lanes, so the reduction vectorizes
            s = w.section(block.name)
            s.append(f"split {block.loops[-1].var} by {rs}")
            s.append(f"rfactor {block.loops[-1].var}.i")
    row_loops, col = [loop.var for loop in last.loops[:-1]], last.loops[-1].var
    s = w.section(last.name)
    row = row_loops[0]
    if len(row_loops) > 1:
        s.append(f"fuse {', '.join(row_loops)} as row")
        row = "row"
    s.append(f"split {row} by {rb}")
    if vec:
        s.append(f"split {col} by {v}")
    s.append(f"parallel {row}.o")
    s.append(f"pragma {row}.o auto_unroll_max_step={steps}, unroll_explicit=1")
    if vec:
        s.append(f"vectorize {col}.i")
    moved: list[str] = []
    for block in reversed(view.blocks[:-1]):
        moved.append(block.name)
        if rs and block.reduce:
            moved.append(f"{block.name}_rf")
    for name in moved:
        s.append(f"compute_at {name} {row}.i")
    for block in reversed(view.blocks[:-1]):
        if not block.reduce and vec and len(block.loops) > depth:
            section = w.section(block.name)
            inner_var = block.loops[-1].var  # the block's own name for it, under compute_at too
            section.append(f"split {inner_var} by {v}")
            section.append(f"vectorize {inner_var}.i")
        elif block.reduce and rs:
            section = w.section(f"{block.name}_rf")
            section.append("reorder ax1, ax0")
            section.append("vectorize ax0")
    return w
