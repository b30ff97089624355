"""CPU GEMV: a matmul of one row or a few (a batch-1 dense: y[j] = sum_k x[k] * W[k, j] + b[j]),
where the register and cache tiles of the matmul recipes, made for many rows, have nothing to
tile. It reads each weight once, so it is bound by that stream: parallel over blocks of output
columns, and W read along its contiguous axis. With W[k, j], the JT columns of a block are
vectorized and accumulated in registers over the whole of k (unrolled by KU), the few rows
unrolled inside; with W[j, k], each column is a dot product along k, vectorized by `rfactor`
into V lanes of partial sums; with W stored as column panels, W[j // P, k, j % P] (a decoder's
projections, schedlang.models.decoder.weights), each panel's P columns are accumulated in
registers over all of k, every load a whole vector of W, contiguous from one k to the next, and
no horizontal sum at the end. An elementwise epilogue (bias) is folded into the write-back."""

from __future__ import annotations

import math

from schedlang.core.target import Target
from schedlang.propose.analysis import Block, MatmulRoles, OpView, matmul_of
from schedlang.propose.rules.conv import row_vector
from schedlang.propose.rules.generic import cpu_blocks, spatial_first
from schedlang.propose.rules.matmul import decompose_outermost, fold_epilogue, panel_width
from schedlang.propose.template import MatchingRule, TemplateInfo, Writer, pick

# Rows (the output's axes other than its columns, all together) up to this many make a GEMV.
MOST_ROWS = 4


class Gemv(MatchingRule[tuple[Block, MatmulRoles]]):
    target, rank = "cpu", 5
    templates = (
        TemplateInfo(
            "gemv_columns", "cpu",
            "a matmul of at most 4 rows (batch-1 dense, y = x W + b) reading W[k, j]: JT columns "
            "per parallel task vectorized and accumulated in registers over all of k, the rows "
            "unrolled; an elementwise epilogue folded",
            "JT vectorized column block (3), KU k unroll (3)", ("JT", "KU"), 9,
        ),
        TemplateInfo(
            "gemv_dot", "cpu",
            "a matmul of at most 4 rows reading W[j, k] (k contiguous): parallel over the "
            "columns, each a dot product along k in V lanes of partial sums (rfactor)",
            "V lanes (3)", ("V",), 3,
        ),
        TemplateInfo(
            "gemv_panels", "cpu",
            "a matmul of at most 4 rows reading W stored as column panels, W[j // P, k, j % P]: "
            "parallel over the panels, each panel's P columns vectorized and accumulated in "
            "registers over all of k (unrolled by KU), no horizontal sum; an elementwise "
            "epilogue folded",
            "KU k unroll (3)", ("KU",), 3,
        ),
    )  # fmt: skip

    def write(self, view: OpView, target: Target) -> list[Writer | None]:
        block, roles = self.found(view)
        layout = _layout(block, roles)
        if layout == "panels":
            return [_panels(view, block, roles, target)]
        if layout == "columns":
            return [_columns(view, block, roles, target)]
        return [_dot(view, block, roles, target)]

    def find(self, view: OpView) -> tuple[Block, MatmulRoles] | None:
        return _gemv_of(view)


def _gemv_of(view: OpView) -> tuple[Block, MatmulRoles] | None:
    """A matmul whose layout one of the templates fits."""
    found = matmul_of(view)
    return found if found is not None and _layout(*found) is not None else None


def _layout(block: Block, r: MatmulRoles) -> str | None:
    """Which template fits: "panels" when W is indexed [j, k, j] (column panels), "columns"
    when W's last index is j, "dot" when it is k; None for a matmul of more rows than a GEMV's,
    or a W indexed otherwise."""
    rows = math.prod(block.extent(v) for v in (*r.outer, r.i))
    weight = next(a for a in block.reads if a.buffer == r.b)
    if rows > MOST_ROWS or not weight.dims:
        return None
    if list(weight.dims) == [{r.j}, {r.k}, {r.j}]:
        return "panels"
    last = weight.dims[-1]
    return "columns" if last == {r.j} else "dot" if last == {r.k} else None


def _columns(view: OpView, block: Block, r: MatmulRoles, target: Target) -> Writer:
    """Each task's JT columns accumulated in registers (JT / lanes vectors per row) while k runs
    along W's rows: every load of W is a whole vector of consecutive columns."""
    lanes = target.vector_lanes(block.dtype)
    n, k = block.extent(r.j), block.extent(r.k)
    width = row_vector(n, lanes)
    w = Writer(
        f"{block.name} (gemv): JT columns of {r.j} per parallel task, vectorized and "
        f"accumulated in registers over {r.k} (unrolled by KU), the rows unrolled",
        "gemv_columns",
    )
    # Blocks of several vectors, so a task reads whole cache lines of each row of W: 40 columns
    # (5 vectors of 8) of ResNet-18's 1000 before 8, measured 3x faster.
    blocks = [4 * width, 5 * width, 2 * width, 3 * width, width]
    jt = w.factor("JT", pick(n, blocks, multiple_of=min(width, n), most=3))
    ku = w.factor("KU", pick(k, [8, 4, 1], most=3))
    splits = [f"split {r.j} by {jt}", f"split {r.k} by {ku}"]
    return _in_registers(w, view, block, r, target, splits, "the columns in registers")


def _in_registers(
    w: Writer,
    view: OpView,
    block: Block,
    r: MatmulRoles,
    target: Target,
    splits: list[str],
    note: str,
) -> Writer:
    """After `splits` of j (j.o, j.i) and k (k.o, k.i): parallel over j.o, j.i's columns
    accumulated in registers over k (k.i unrolled, the rows unrolled, j.i vectorized), the
    epilogue folded into the write-back."""
    s = w.section(block.name)
    s += splits
    inner = [f"{r.k}.o", f"{r.k}.i", r.i, f"{r.j}.i"]
    s.append(f"reorder {', '.join([*r.outer, f'{r.j}.o', *r.outer_reduce, *inner])}")
    tasks = [*r.outer, f"{r.j}.o"]
    if len(tasks) > 1:
        s.append(f"fuse {', '.join(tasks)} as tasks")
    par = "tasks" if len(tasks) > 1 else tasks[0]
    s.append(f"parallel {par}")
    s.append(f"cache_write {block.name} local at {r.j}.o  # {note}")
    folded = fold_epilogue(s, view, block)
    s.append(f"unroll {r.k}.i")
    if block.extent(r.i) > 1:
        s.append(f"unroll {r.i}")
    s.append(f"vectorize {r.j}.i")
    s.append(decompose_outermost(r))
    cpu_blocks(w, view, target, done={block.name, *folded})
    return w


def _dot(view: OpView, block: Block, r: MatmulRoles, target: Target) -> Writer:
    """Each output a dot product of x and a row of W along k: V lanes of partial sums (the
    `rfactor` block, vectorized along W's contiguous k), then their sum; parallel over the
    columns."""
    lanes = target.vector_lanes(block.dtype)
    w = Writer(
        f"{block.name} (gemv): parallel over {r.j}, each a dot product along {r.k} in V lanes "
        "of partial sums (rfactor)",
        "gemv_dot",
    )
    v = w.factor("V", pick(block.extent(r.k), [lanes, 2 * lanes, 4 * lanes]))
    spatial = [loop.var for loop in block.spatial]
    s = w.section(block.name)
    spatial_first(s, block)
    s.append(f"split {r.k} by {v}")
    s.append(f"rfactor {r.k}.i")
    partials = w.section(f"{block.name}_rf")
    for section in (s, partials):
        section.append(f"fuse {', '.join(spatial)} as f")
        section.append("parallel f")
    partials.append(f"vectorize {r.k}.i")
    cpu_blocks(w, view, target, done={block.name})
    return w


def _panels(view: OpView, block: Block, r: MatmulRoles, target: Target) -> Writer | None:
    """Each panel of P columns accumulated in registers (P / lanes vectors per row) while k runs
    along the panel's rows, which are contiguous: one stream per task, every load a vector."""
    panel = panel_width(view, r)
    if panel is None:
        return None
    w = Writer(
        f"{block.name} (gemv): W stored as {panel}-column panels, parallel over the panels, "
        f"each panel's columns accumulated in registers over {r.k} (unrolled by KU)",
        "gemv_panels",
    )
    ku = w.factor("KU", pick(block.extent(r.k), [8, 4, 2], most=3))
    splits = [f"split {r.j} by *, {panel}", f"split {r.k} by *, {ku}"]
    return _in_registers(w, view, block, r, target, splits, "the panel's columns in registers")
