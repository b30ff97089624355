"""CPU norms with side blocks: RMSNorm as Relax legalizes it (a cast, the squares, their row sum,
`rsqrt` per row, the weight's own cast, the product, a cast back), where the weight's cast is not
a loop over the rows, so the `rows` rule does not take it. The elementwise blocks are inlined
(`compute_inline`), the row sum and the per-row blocks computed per row inside the last block's
parallel row loop, the row sum split into vector lanes of partial sums (`rfactor`), the row
vectorized. Only the row loop's extent may be symbolic (a prefill's token count): it is split
(a tail), never vectorized."""

from __future__ import annotations

from schedlang.core.target import Target
from schedlang.propose.analysis import Block, OpView, row_blocks
from schedlang.propose.template import MatchingRule, TemplateInfo, Writer, pick


class RowNorm(MatchingRule[Block]):
    target, rank = "cpu", 31
    templates = (
        TemplateInfo(
            "rows_norm", "cpu",
            "a row-wise norm with one row reduction and side blocks (RMSNorm: its weight's "
            "cast): elementwise blocks inlined, the reduction and per-row blocks computed per "
            "row in the last block's parallel row loop, the sum in RS lanes, the row vectorized",
            "V vector width (3), RS reduction lanes (2), RB rows per parallel task (4)",
            ("V", "RS", "RB"), 24,
        ),
    )  # fmt: skip

    def find(self, view: OpView) -> Block | None:
        """The row reduction, where the op is such a norm (and not `rows`')."""
        reductions = [b for b in view.blocks if b.reduce]
        last = view.blocks[-1]
        if len(reductions) != 1 or last.reduce or len(last.loops) != 2 or row_blocks(view, 1):
            return None
        red = reductions[0]
        rows = int(last.loops[0].extent)
        if [int(x.extent) for x in red.loops[:-1]] != [rows] or red.loops[-1].kind != "reduce":
            return None
        # Every block but the reduction is spatial; the last one writes the op's output.
        return None if view.is_intermediate(last) else red

    def applies(self, view: OpView, target: Target) -> bool:
        found = self.find(view)
        return found is not None and int(found.loops[0].extent) >= 2 * target.cores

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        red = self.found(view)
        last = view.blocks[-1]
        lanes = target.vector_lanes(last.dtype)
        w = Writer(
            f"row norm {red.name} .. {last.name}: elementwise blocks inlined, RB rows per "
            "parallel task, the row vectorized by V, the row sum in RS lanes",
            "rows_norm",
        )
        row, col = last.loops[0].var, last.loops[1].var
        cols, length = int(last.loops[1].extent), int(red.loops[-1].extent)
        vec = [v for v in (lanes, 2 * lanes, 4 * lanes) if cols % v == 0]
        # Fewer lanes than the row: the rfactor block keeps its loop over the lanes' steps.
        rs_values = [v for v in (lanes, 2 * lanes) if length % v == 0 and length > v]
        rows = int(last.loops[0].extent)
        rb_values = [b for b in pick(rows, [1, 4, 16, 2]) if rows // b >= 2 * target.cores]
        per_row = [b for b in view.blocks[:-1] if b is not red and len(b.loops) == 1]
        per_row = [b for b in per_row if int(b.loops[0].extent) == rows]
        inlined = [b for b in view.blocks[:-1] if b is not red and b not in per_row]
        s = w.section(red.name)
        s += [f"compute_inline {b.name}" for b in inlined]
        rs = w.factor("RS", rs_values) if rs_values else None
        if rs:
            s.append(f"split {red.loops[-1].var} by {rs}")
            s.append(f"rfactor {red.loops[-1].var}.i")
        s = w.section(last.name)
        s.append(f"split {row} by {w.factor('RB', rb_values or [1])}")
        if vec:
            s.append(f"split {col} by {w.factor('V', vec)}")
        s.append(f"parallel {row}.o")
        if vec:
            s.append(f"vectorize {col}.i")
        moved = [*(b.name for b in reversed(per_row)), red.name]
        moved += [f"{red.name}_rf"] if rs else []
        s += [f"compute_at {name} {row}.i" for name in moved]
        if rs:
            partials = w.section(f"{red.name}_rf")
            partials.append("reorder ax1, ax0")
            partials.append("vectorize ax0")
        return [w]
