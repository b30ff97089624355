"""Proposers: where the tuner's schedule templates come from.

A proposer reads an op and a target and writes schedlang text: templates with `param` knobs, which
the tuner searches, or concrete schedules. The built-in proposer needs no model. It looks at the
op's loop nest (`schedlang.core.ops.describe` plus each block's index expressions), recognises a few
shapes of computation, and writes for each the recipe that makes that shape fast:

    matmul-like   a reduction of two inputs indexed by single loops (C[i, j] += A[i, k] * B[k, j]):
                  cache tiles, a register tile accumulated in `local`, B packed per column panel,
                  vectorized over the columns, parallel over the tiles (CPU); a shared-memory
                  tiled kernel with a register tile per thread and cooperative fetching (GPU).
    conv-like     a reduction reading a window (pad[h + ry, w + rx]): the padding computed per
                  parallel task or inlined, an output-channel x row x column register tile (CPU);
                  one thread per output (GPU).
    row-wise      several blocks over the same rows (softmax, layer norm): every block computed per
                  row inside one parallel row loop, reductions split (rfactor) to vectorize (CPU);
                  one thread block per row with a cross-thread reduction (GPU).
    anything else per block: fused spatial loops split into parallel chunks and vector lanes, a
                  reduction split into vector lanes by rfactor (CPU); thread blocks of threads,
                  a long reduction across threads (GPU).

An elementwise epilogue of a matmul or conv (bias, ReLU) is folded into the write-back block of its
`cache_write`. Templates come best first, and so do each knob's values: the first point is the
recipe's measured default. Knob values divide the loop extents they split, so templates need no
guards, and each template is checked at its first knob values before it is proposed: one that
fails is dropped, with the reason logged and kept in `BuiltinProposer.dropped`.

    proposer = BuiltinProposer()
    for proposal in proposer.templates(Context(op, resolve_target("llvm"))):
        print(proposal.note)
        print(proposal.text)
"""

from __future__ import annotations

import contextvars
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import BlockInfo, LoopInfo, describe
from schedlang.core.ops import Op
from schedlang.core.target import Target

if TYPE_CHECKING:
    from schedlang.store.records import Record

log = logging.getLogger(__name__)


# --- the interface --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    op: Op
    target: Target
    hint: str | None = None


@dataclass(frozen=True)
class Proposal:
    text: str  # schedlang text: a template (with `param` knobs) or a concrete schedule
    proposer: str  # "builtin", "model:<id>", …
    note: str = ""  # one line: what the template is
    extra: dict = field(default_factory=dict)


class Proposer(Protocol):
    name: str

    def propose(self, context: Context, history: Sequence[Record], count: int) -> list[Proposal]:
        """At most `count` proposals not returned before; [] when there is nothing more."""
        ...


class BuiltinProposer:
    """Templates written from the op's loop nest by the rules of this module, best first, handed
    out a few at a time as the tuner spends its budget.

    `propose` hands out templates until the ones handed out still have at least two batches
    (`2 * count`) of knob points not yet in `history`; the tuner asks again after every round,
    so when a template runs out of points, the next one takes over instead of the run stopping.
    The order is the recipes' (best first), except that

    * templates whose family or note names a word of `Context.hint` go first;
    * the template that holds the fastest record in `history` (from an earlier run, say) goes
      first among the rest;
    * a template whose points are all in `history` is skipped, and one whose first measured
      points all failed makes way for the next at once;
    * when every template is handed out and they run dry, they come back widened (more values
      per knob, `write_templates(wide=True)`), best first.

    The proposer draws no random numbers: the same op, target, hint and history give the same
    proposals, so a tuning run is reproduced by its seed. Each decision is logged (logger
    `schedlang.propose.builtin`), kept in `decisions`, and stored in the proposal's `extra["why"]`.
    """

    name = "builtin"
    FAILURES_BEFORE_HANDOVER = 4  # measured points of a template, all failed

    def __init__(self) -> None:
        self._templates: dict[tuple[str, str], list[Proposal]] = {}
        self._returned: dict[tuple[str, str], list[Proposal]] = {}
        self._wide: dict[tuple[str, str], list[Proposal]] = {}
        self.dropped: list[Proposal] = []  # templates that failed their check; note says why
        self.decisions: list[str] = []

    def templates(self, context: Context) -> list[Proposal]:
        key = _context_key(context)
        if key not in self._templates:
            self._templates[key] = self._checked(context)
        return list(self._templates[key])

    def propose(self, context: Context, history: Sequence[Record], count: int) -> list[Proposal]:
        templates = self.templates(context)
        if not templates:
            raise self.no_template_error(context)
        returned = self._returned.setdefault(_context_key(context), [])
        done = {p.text for p in returned}
        stats = _template_stats(history)
        left = sum(_points_left(p, stats) for p in returned if not _failing(p, stats))
        fresh: list[Proposal] = []
        for proposal, why in self._order(context, templates, stats):
            if proposal.text in done:
                continue
            if (fresh or returned) and left >= 2 * max(count, 1):
                break
            remaining = _points_left(proposal, stats)
            returned.append(proposal)
            if remaining == 0:
                self._decide(f"skipped {proposal.extra['family']}: all its points are measured")
                continue
            why = why or (
                "the first template"
                if not fresh and not returned[:-1]
                else f"the templates handed out have {left} points left, fewer than "
                f"{2 * max(count, 1)}"
            )
            self._decide(f"proposed {proposal.extra['family']} ({remaining} points): {why}")
            fresh.append(replace(proposal, extra={**proposal.extra, "why": why}))
            left += remaining
        if left >= 2 * max(count, 1) or any(p.text not in done for p in templates):
            return fresh
        # Every template is handed out and they are running dry: widen them, best first.
        for proposal in self._widened(context):
            if left >= 2 * max(count, 1):
                break
            if proposal.text in done:
                continue
            remaining = _points_left(proposal, stats)
            returned.append(proposal)
            if remaining == 0:
                continue
            why = f"every template is handed out and {left} points are left: widened"
            self._decide(f"proposed {proposal.extra['family']} ({remaining} new points): {why}")
            fresh.append(replace(proposal, extra={**proposal.extra, "why": why}))
            left += remaining
        return fresh

    def _widened(self, context: Context) -> list[Proposal]:
        """Each template again with more values per knob (the preferred ones left out, then other
        divisors of the loop it splits), for a run that measured every point; checked alike."""
        key = _context_key(context)
        if key not in self._wide:
            narrow = {p.extra["family"]: p for p in self.templates(context)}
            wide = []
            for proposal in self._checked(context, wide=True):
                base = narrow.get(proposal.extra["family"])
                if base is None or base.extra["space"] >= proposal.extra["space"]:
                    continue  # nothing to widen
                extra = {**proposal.extra, "widens": base.text}
                wide.append(replace(proposal, note=f"{proposal.note}, widened", extra=extra))
            self._wide[key] = wide
        return list(self._wide[key])

    def _order(
        self, context: Context, templates: list[Proposal], stats: dict[str, _Stats]
    ) -> list[tuple[Proposal, str]]:
        words = set(re.findall(r"[a-z]{4,}", (context.hint or "").lower()))
        hinted = [
            p for p in templates
            if words & set(re.findall(r"[a-z]{4,}", f"{p.extra['family']} {p.note}".lower()))
        ]  # fmt: skip
        best = max(
            (p for p in templates if stats.get(p.text, _Stats()).best),
            key=lambda p: stats[p.text].best,
            default=None,
        )
        order = [(p, f"the hint names it ({context.hint!r})") for p in hinted]
        if best is not None and best not in hinted:
            gflops = stats[best.text].best
            order.append((best, f"it holds the fastest record so far ({gflops:.2f} GFLOP/s)"))
        chosen = {p.text for p, _ in order}
        return order + [(p, "") for p in templates if p.text not in chosen]

    def _decide(self, text: str) -> None:
        log.info("builtin proposer: %s", text)
        self.decisions.append(text)

    def no_template_error(self, context: Context) -> SchedlangError:
        """Why there is nothing to tune, naming each block a template failed on, and what to do."""
        op = context.op
        notes = [f"template `{p.extra['family']}`: {p.extra['dropped']}" for p in self.dropped]
        if not notes:
            view = analyse(op)
            notes.append(
                "its loop extents are not all constants" if view is None
                else "it has no block to schedule"
            )  # fmt: skip
        path = op.path or "OP.py"
        notes.append(
            f"write a template for it (`schedlang show {path}` lists its blocks and loops) and "
            f"tune that: `schedlang tune {path} --template FILE.sched`"
        )
        return SchedlangError(
            f"nothing to tune: the built-in proposer has no template for {op.name}", *notes
        )

    def _checked(self, context: Context, wide: bool = False) -> list[Proposal]:
        kept = []
        drafts = (
            write_templates(context.op, context.target, wide=True)
            if wide
            else write_templates(context.op, context.target)
        )
        for draft in drafts:
            proposal = Proposal(
                draft.text,
                self.name,
                draft.note,
                {"family": draft.family, "space": draft.space},
            )
            problem = first_point_problem(proposal.text, context.op, context.target)
            if problem is None:
                kept.append(proposal)
                continue
            log.warning(
                "dropped builtin template %s for %s: %s", draft.family, context.op.name, problem
            )
            self.dropped.append(
                Proposal(
                    proposal.text,
                    self.name,
                    f"dropped ({draft.note}): {problem}",
                    {**proposal.extra, "dropped": problem},
                )
            )
        return kept


@dataclass(frozen=True)
class _Stats:
    measured: int = 0  # points of the template in the history
    failed: int = 0
    best: float | None = None  # GFLOP/s


def _template_stats(history: Sequence[Record]) -> dict[str, _Stats]:
    stats: dict[str, _Stats] = {}
    for record in history:
        if not record.template:
            continue
        old = stats.get(record.template, _Stats())
        gflops = record.gflops if record.is_ok else None
        stats[record.template] = _Stats(
            old.measured + 1,
            old.failed + (not record.is_ok),
            max(filter(None, (old.best, gflops)), default=None),
        )
    return stats


def _points_left(proposal: Proposal, stats: dict[str, _Stats]) -> int:
    """Its points not in the history (a widened template's include its narrow one's)."""
    texts = (proposal.text, proposal.extra.get("widens"))
    measured = sum(stats[t].measured for t in texts if t in stats)
    return max(proposal.extra["space"] - measured, 0)


def _failing(proposal: Proposal, stats: dict[str, _Stats]) -> bool:
    """Its first measured points all failed: it hands over as if it had run out of points."""
    seen = stats.get(proposal.text, _Stats())
    return seen.best is None and seen.failed >= BuiltinProposer.FAILURES_BEFORE_HANDOVER


def _context_key(context: Context) -> tuple[str, str]:
    # The printed function, not a structural hash: templates name its blocks, loops and buffers.
    return context.op.func.script(), context.target.key


def first_point_problem(text: str, op: Op, target: Target) -> str | None:
    """None when `text` parses, is canonical and checks clean at its first knob values; else
    the first diagnostic, on one line, with the block it is in."""
    from schedlang.checker.check import check
    from schedlang.lang.printer import format_schedule
    from schedlang.lang.syntax import parse

    try:
        schedule = parse(text, "<builtin>")
    except SchedlangError as err:
        return " ".join(err.render().split())
    if format_schedule(schedule) != text:
        return "not canonically formatted"
    result = check(schedule, op.func, target)
    errors = [d for d in result.diagnostics if d.is_error]
    if errors:
        where = ""
        if errors[0].span:
            line = errors[0].span.line
            above = text.splitlines()[: line - 1]
            block = next((x[6:-1] for x in reversed(above) if x.startswith("block ")), None)
            where = f"block `{block}`, line {line}: " if block else f"line {line}: "
        return where + errors[0].message
    return None


# --- what the proposer knows ----------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateInfo:
    """One kind of template the built-in proposer writes (what `schedlang tune --list-templates`
    prints). `space` is the most knob points it has: at an op's own shape, knob values that do
    not divide a loop's extent are left out, so it may have fewer (and a widened one, more).
    With `per_block`, the knobs (and the space) repeat for each block the template schedules
    on its own."""

    name: str  # the family, as in a proposal's extra["family"]
    target: str  # "cpu" or "gpu"
    matches: str  # which op shapes
    knobs: str  # each knob: what it sets, and how many values it takes at most
    knob_names: tuple[str, ...]
    space: int
    per_block: bool = False


_MATMUL = "a reduction of two inputs indexed by single loops, e.g. C[i, j] += A[i, k] * B[k, j] "
_MATMUL += "(batch axes and an elementwise epilogue such as bias + ReLU included)"
_CONV = "a reduction reading a window of its input, e.g. pad[h + ry, w + rx] (conv2d, depthwise "
_CONV += "conv2d), with its padding block and an elementwise epilogue"

TEMPLATES = (
    TemplateInfo(
        "matmul_panels", "cpu",
        "a plain 2-D matmul C[i, j] += A[i, k] * B[k, j] (or B[j, k]) with N a multiple of two "
        "vectors (an elementwise epilogue included); B stored as panels by transform_layout",
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
        "matmul_packed", "cpu", _MATMUL + "; B packed per TJ-column panel",
        "RI, RJ register tile (2 values each), TI, TJ cache tile (3 each), KU k unroll (3), "
        "U auto-unroll steps (2)",
        ("RI", "RJ", "TI", "TJ", "KU", "U"), 216,
    ),
    TemplateInfo(
        "matmul_tiled", "cpu", _MATMUL + "; B read in place",
        "RI, RJ register tile (2 each), TI, TJ cache tile (3 each), KU k unroll (3), "
        "U auto-unroll steps (2)",
        ("RI", "RJ", "TI", "TJ", "KU", "U"), 216,
    ),
    *(
        TemplateInfo(
            f"conv_{acc}{pad}", "cpu",
            _CONV + (
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
        "rows_fast_exp", "cpu",
        "the same as rows, for ops with a float32 exp (softmax): each exp rewritten first into "
        "a vectorizable polynomial (`fast_math exp`)",
        "V vector width (3), RS reduction lanes (2), RB rows per parallel task (4), "
        "U auto-unroll steps (3)",
        ("V", "RS", "RB", "U"), 72,
    ),
    TemplateInfo(
        "rows", "cpu",
        "several blocks over the same rows, each (row, one inner axis), the last reading all "
        "the others (softmax, layer norm)",
        "V vector width (3), RS reduction lanes (2), RB rows per parallel task (4), "
        "U auto-unroll steps (3)",
        ("V", "RS", "RB", "U"), 72,
    ),
    TemplateInfo(
        "reduce_outer_stream", "cpu",
        "a reduction over an axis that is not the contiguous one (a 3-D sum over axis 1, a "
        "column sum): reduction loops outside the vectorized output row",
        "V vector width (4), U reduction unroll (4)", ("V", "U"), 16, per_block=True,
    ),
    TemplateInfo(
        "reduce_outer_registers", "cpu",
        "the same reductions: V output lanes accumulated in registers over the whole reduction",
        "V vector width (4), U reduction unroll (4)", ("V", "U"), 16, per_block=True,
    ),
    TemplateInfo(
        "generic_rfactor", "cpu",
        "a reduction along the contiguous axis (a row sum): partial sums over V lanes by rfactor",
        "V lanes (3) per reduction block; CH parallel chunks (4) per elementwise block",
        ("V", "CH", "U"), 4, per_block=True,
    ),
    TemplateInfo(
        "generic", "cpu",
        "any op: per block, spatial loops fused and parallel; elementwise blocks vectorized",
        "U reduction unroll (3) per reduction block; CH parallel chunks (4) per elementwise "
        "block",
        ("U", "CH"), 4, per_block=True,
    ),
    TemplateInfo(
        "gpu_matmul", "gpu", _MATMUL + "; shared-memory tiles, a register tile per thread",
        "TY, TX threads (2 each), TM, TN outputs per thread (3 each), BK k slice (3)",
        ("TY", "TX", "TM", "TN", "BK"), 108,
    ),
    TemplateInfo(
        "gpu_generic_inline", "gpu",
        "any op with elementwise intermediates: those inlined, one thread per output",
        "T threads per block (4) per block; TR threads per long reduction (4)",
        ("T", "TR"), 4, per_block=True,
    ),
    TemplateInfo(
        "gpu_generic", "gpu",
        "any op: one thread per output; a long reduction across TR threads of a block",
        "T threads per block (4) per block; TR threads per long reduction (4)",
        ("T", "TR"), 4, per_block=True,
    ),
)  # fmt: skip


def describe_templates() -> list[TemplateInfo]:
    """The kinds of template the built-in proposer writes, best first per target."""
    return list(TEMPLATES)


# --- what the loop nest looks like ----------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    """A block's access to a buffer: the loop variables in each index (`(h, ry)` for `h + ry`)."""

    buffer: str
    dims: tuple[frozenset[str], ...]

    def uses(self, var: str) -> bool:
        return any(var in dim for dim in self.dims)

    @property
    def is_window(self) -> bool:
        return any(len(dim) > 1 for dim in self.dims)


@dataclass(frozen=True)
class Block:
    info: BlockInfo
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    dtype: str  # of what it writes

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def loops(self) -> tuple[LoopInfo, ...]:
        return self.info.loops

    @property
    def spatial(self) -> list[LoopInfo]:
        return [loop for loop in self.loops if loop.kind == "spatial"]

    @property
    def reduce(self) -> list[LoopInfo]:
        return [loop for loop in self.loops if loop.kind == "reduce"]

    def extent(self, var: str) -> int:
        return next(int(loop.extent) for loop in self.loops if loop.var == var)


@dataclass(frozen=True)
class OpView:
    blocks: tuple[Block, ...]
    outputs: frozenset[str]  # buffers the op returns
    exp_blocks: tuple[str, ...] = ()  # blocks computing a float32 exp (`fast_math exp` applies)

    def producers(self, block: Block) -> list[Block]:
        return [b for b in self.blocks if set(b.info.writes) & set(block.info.reads)]

    def consumers(self, block: Block) -> list[Block]:
        return [b for b in self.blocks if set(b.info.reads) & set(block.info.writes)]

    def is_intermediate(self, block: Block) -> bool:
        return not set(block.info.writes) & self.outputs


def analyse(op: Op) -> OpView | None:
    """The op's blocks with their index expressions; None when an extent is not a constant."""
    info = describe(op)
    if any(isinstance(loop.extent, str) for b in info.blocks for loop in b.loops):
        return None
    accesses = _block_accesses(op.func)
    dtypes = {b.name: b.dtype for b in info.buffers}
    blocks = []
    for block in info.blocks:
        reads, writes = accesses.get(block.name, ((), ()))
        dtype = dtypes.get(block.writes[0], "float32") if block.writes else "float32"
        blocks.append(Block(block, reads, writes, dtype))
    outputs = frozenset(b.name for b in info.buffers if b.role == "output")
    from schedlang.lang.fastexp import blocks_computing_exp

    return OpView(tuple(blocks), outputs, tuple(blocks_computing_exp(op.func)))


def _block_accesses(func) -> dict[str, tuple[tuple[Access, ...], tuple[Access, ...]]]:
    import tvm
    from tvm.s_tir.stmt import SBlockRealize
    from tvm.tirx import SeqStmt

    found: dict[str, tuple[tuple[Access, ...], tuple[Access, ...]]] = {}

    def loop_vars(expr) -> frozenset[str]:
        return frozenset(v.name for v in tvm.tirx.analysis.undefined_vars(expr))

    def visit(stmt) -> None:
        if isinstance(stmt, SBlockRealize):
            block = stmt.block
            # Block iterators stand for expressions of the loops around the block.
            iters = {
                iv.var.name: loop_vars(value)
                for iv, value in zip(block.iter_vars, stmt.iter_values, strict=True)
            }

            def access(region) -> Access:
                buffer = region.source if hasattr(region, "source") else region.buffer
                dims = tuple(
                    frozenset().union(*(iters.get(v, {v}) for v in loop_vars(r.min)))
                    for r in region.region
                )
                return Access(buffer.name, dims)

            found[block.name_hint] = (
                tuple(access(r) for r in block.reads),
                tuple(access(r) for r in block.writes),
            )
            visit(block.body)
        elif isinstance(stmt, SeqStmt):
            for child in stmt.seq:
                visit(child)
        elif getattr(stmt, "body", None) is not None:
            visit(stmt.body)

    visit(func.body)
    return found


def epilogue(view: OpView, block: Block) -> Block | None:
    """The elementwise block that only reads `block`'s result, index for index (bias, ReLU, a
    cast): it can be folded into the write-back block of `block`'s `cache_write`."""
    consumers = view.consumers(block)
    if len(consumers) != 1 or len(block.writes) != 1:
        return None
    after = consumers[0]
    if after.reduce or len(after.writes) != 1 or view.producers(after) != [block]:
        return None
    reads = [a for a in after.reads if a.buffer == block.writes[0].buffer]
    return after if reads and all(a.dims == after.writes[0].dims for a in reads) else None


# --- knob candidates ------------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def pick(
    extent: int,
    preferred: Sequence[int],
    *,
    multiple_of: int = 1,
    most: int = 4,
    widens: bool = True,
) -> list[int]:
    """Values of `preferred` that divide `extent` and are multiples of `multiple_of`, at most
    `most` of them, in the order given. When none is, the largest divisor of `extent` (a multiple
    of `multiple_of`) up to the largest preferred value, else `extent` itself: a template never
    needs a guard. In a widened template (`write_templates(wide=True)`), up to two values more,
    unless `widens` is False (a register tile: more would spill)."""
    values = [v for v in preferred if v <= extent and extent % v == 0 and v % multiple_of == 0]
    if values and widens and _WIDE.get():
        # Widened: the preferred values left out, then other divisors up to twice the largest.
        others = [
            d
            for d in reversed(divisors(extent))
            if d % multiple_of == 0 and d <= 2 * max(preferred) and d not in values
        ]
        return [*values, *others][: most + 2]
    if values:
        return values[:most]
    fitting = [d for d in divisors(extent) if d % multiple_of == 0 and d <= max(preferred)]
    if fitting:
        return [fitting[-1]]
    return [extent]


class _Writer:
    """Collects knobs and sections, and prints a template the way `schedlang fmt` does."""

    def __init__(self, note: str, family: str):
        self.note = note
        self.family = family
        self.params: dict[str, list[int]] = {}
        self.sections: list[tuple[str, list[str]]] = []

    def factor(self, name: str, values: Sequence[int]) -> str:
        """A knob over `values`, or the literal when there is one value. Sections asking for the
        same knob over the same values share it."""
        values = list(dict.fromkeys(values))
        if len(values) == 1:
            return str(values[0])
        unique, n = name, 2
        while unique in self.params and self.params[unique] != values:
            unique, n = f"{name}{n}", n + 1
        self.params[unique] = values
        return unique

    def section(self, block: str) -> list[str]:
        lines: list[str] = []
        self.sections.append((block, lines))
        return lines

    def draft(self) -> Draft:
        from schedlang.lang.printer import format_schedule
        from schedlang.lang.syntax import parse

        out = [f"# {self.note} (builtin proposer)"]
        out += [f"param {k} in [{', '.join(map(str, v))}]" for k, v in self.params.items()]
        for block, lines in self.sections:
            if lines:
                out += ["", f"block {block}:", *(f"  {line}" for line in lines)]
        text = format_schedule(parse("\n".join(out) + "\n", "<builtin>"))
        return Draft(text, self.note, self.family, math.prod(len(v) for v in self.params.values()))


@dataclass(frozen=True)
class Draft:
    text: str
    note: str
    family: str
    space: int  # knob points


def _tile(*factors: str) -> str:
    return " x ".join(factors)


def _knob_suffix(block: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", block).upper()


# --- which recipes apply --------------------------------------------------------------------------


_WIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("wide", default=False)


def write_templates(op: Op, target: Target, wide: bool = False) -> list[Draft]:
    """Every template the rules give for `op` on `target`, best first (unchecked). `wide`: with
    more values per knob (`pick`), for a run that has measured every point of the others."""
    view = analyse(op)
    if view is None or not view.blocks:
        return []
    token = _WIDE.set(wide)
    try:
        writers = _gpu_recipes(view, target) if target.is_gpu else _cpu_recipes(view, target)
        return [w.draft() for w in writers if w is not None]
    finally:
        _WIDE.reset(token)


@dataclass(frozen=True)
class MatmulRoles:
    a: str  # the input read without the column axis
    b: str  # the input read with it: packed on CPU
    i: str  # row axis: in A and C
    j: str  # column axis: innermost spatial, in B and C
    outer: tuple[str, ...]  # other spatial axes (batch), outermost
    k: str  # the innermost reduction axis: split and unrolled
    outer_reduce: tuple[str, ...]


def matmul_roles(block: Block) -> MatmulRoles | None:
    spatial, reduce = block.spatial, block.reduce
    if len(spatial) < 2 or not reduce or len(block.reads) != 2 or len(block.writes) != 1:
        return None
    if any(a.is_window for a in (*block.reads, *block.writes)):
        return None
    if len({a.buffer for a in block.reads}) != 2:
        return None
    j = spatial[-1].var
    out = block.writes[0]
    with_j = [a for a in block.reads if a.uses(j)]
    if len(with_j) != 1 or not out.dims or j not in out.dims[-1]:
        return None
    b = with_j[0]
    a = next(x for x in block.reads if x is not b)
    rows = [s.var for s in spatial if a.uses(s.var) and not b.uses(s.var)]
    k = reduce[-1].var
    if not rows or not (a.uses(k) and b.uses(k)):
        return None
    i = rows[-1]
    outer = tuple(s.var for s in spatial if s.var not in (i, j))
    outer_reduce = tuple(r.var for r in reduce[:-1])
    return MatmulRoles(a.buffer, b.buffer, i, j, outer, k, outer_reduce)


@dataclass(frozen=True)
class ConvRoles:
    data: str  # the buffer read through a window
    pad: str | None  # the spatial block producing it (padding), if any
    channel: str | None  # output-channel axis: in the weights, not the data
    row: str | None  # the window axis outside `col`
    col: str  # the innermost spatial axis: vectorized
    outer: tuple[str, ...]  # other spatial axes
    reduce: tuple[str, ...]


def conv_roles(view: OpView, block: Block) -> ConvRoles | None:
    spatial = block.spatial
    windows = [a for a in block.reads if a.is_window]
    if not block.reduce or len(spatial) < 2 or len(windows) != 1:
        return None
    data = windows[0]
    others = [a for a in block.reads if a is not data]
    window_vars = {v for dim in data.dims if len(dim) > 1 for v in dim}
    col = spatial[-1].var
    rows = [s.var for s in spatial[:-1] if s.var in window_vars]
    weighted = {s.var for s in spatial if any(a.uses(s.var) for a in others)}
    channels = [s.var for s in spatial if s.var in weighted and not data.uses(s.var)]
    row = rows[-1] if rows else None
    channel = channels[-1] if channels else None
    outer = tuple(s.var for s in spatial if s.var not in (row, col, channel))
    pads = [
        p
        for p in view.producers(block)
        if data.buffer in p.info.writes and not p.reduce and view.is_intermediate(p)
    ]
    pad = pads[0].name if len(pads) == 1 else None
    return ConvRoles(data.buffer, pad, channel, row, col, outer, tuple(r.var for r in block.reduce))


def row_blocks(view: OpView, cores: int) -> bool:
    """Several blocks over the same rows, each of them (row, one inner axis), enough rows to feed
    the cores, and the last block consuming all the others."""
    blocks = view.blocks
    if len(blocks) < 2 or any(len(b.loops) != 2 or b.loops[0].kind != "spatial" for b in blocks):
        return False
    rows = {b.loops[0].extent for b in blocks}
    if len(rows) != 1 or int(blocks[0].loops[0].extent) < 2 * cores:
        return False
    last = blocks[-1]
    needed, frontier = set(), [last]
    while frontier:
        block = frontier.pop()
        for producer in view.producers(block):
            if producer.name not in needed:
                needed.add(producer.name)
                frontier.append(producer)
    return needed == {b.name for b in blocks[:-1]} and not last.reduce


# --- CPU ------------------------------------------------------------------------------------------


def _cpu_recipes(view: OpView, target: Target) -> list[_Writer | None]:
    main = [b for b in view.blocks if b.reduce]
    if len(main) == 1 and (roles := matmul_roles(main[0])):
        block = main[0]
        return [
            _cpu_matmul_panels(view, block, roles, target),
            _cpu_matmul_panels_padded(view, block, roles, target),
            _cpu_matmul(view, block, roles, target, packed=True),
            _cpu_matmul(view, block, roles, target, packed=False),
        ]
    if len(main) == 1 and (conv := conv_roles(view, main[0])):
        block = main[0]
        # Padding per parallel task or inlined; an accumulator in registers or not (a short
        # window, a depthwise 3x3, measured faster without: the other order comes second).
        window = math.prod(block.extent(v) for v in conv.reduce)
        recipes = []
        for accumulate in (window > 32, window <= 32):
            recipes.append(_cpu_conv(view, block, conv, target, False, accumulate))
            if conv.pad:
                recipes.append(_cpu_conv(view, block, conv, target, True, accumulate))
        return [*recipes, _cpu_generic(view, target)]
    if row_blocks(view, target.cores):
        # With an exp (softmax), its polynomial first: libm's expf does not vectorize.
        fast = [_cpu_rows(view, target, fast_exp=True)] if view.exp_blocks else []
        return [*fast, _cpu_rows(view, target), _cpu_generic(view, target)]
    lanes = {b.name: target.vector_lanes(b.dtype) for b in view.blocks}
    recipes = []
    if any(_strided_reduction(b, lanes[b.name]) for b in view.blocks):
        recipes += [
            _cpu_generic(view, target, strided="stream"),
            _cpu_generic(view, target, strided="registers"),
        ]
    if any(_vector_reduction(b, lanes[b.name]) for b in view.blocks):
        recipes.append(_cpu_generic(view, target, rfactor=True))
    return [*recipes, _cpu_generic(view, target)]


def _vector_reduction(block: Block, lanes: int) -> bool:
    """A reduction whose innermost loop is a reduction axis of whole vectors, contiguous in
    what it reads: `rfactor` turns it into lanes of partial results (measured 6-12x faster
    than a scalar row sum)."""
    return (
        bool(block.reduce)
        and block.loops[-1].kind == "reduce"
        and (block.extent(block.loops[-1].var) % lanes == 0 and lanes > 1)
        and _contiguous_axis(block) in (None, block.loops[-1].var)
    )


def _contiguous_axis(block: Block) -> str | None:
    """The loop variable every read's last index is, when they agree: the axis along which the
    block reads memory contiguously."""
    last = {dim for a in block.reads if a.dims for dim in a.dims[-1:]}
    if len(last) == 1 and len(dim := next(iter(last))) == 1:
        return next(iter(dim))
    return None


def _strided_reduction(block: Block, lanes: int) -> bool:
    """A reduction over an axis other than the contiguous one (a 3-D sum over axis 1, a column
    sum): the contiguous axis is the output's innermost spatial axis, so the reduction goes
    outside it and the output axis vectorizes (measured 6-7x the unscheduled build on a
    256x512x256 fp32 sum over axis 1, against 1x for the fused-spatial template)."""
    if not block.reduce or not block.spatial or lanes <= 1:
        return False
    inner = block.spatial[-1].var
    out = block.writes[0] if len(block.writes) == 1 else None
    return (
        _contiguous_axis(block) == inner
        and out is not None
        and bool(out.dims)
        and inner in out.dims[-1]
        and block.extent(inner) % lanes == 0
    )


def _cpu_matmul(
    view: OpView, block: Block, r: MatmulRoles, target: Target, packed: bool
) -> _Writer:
    lanes = target.vector_lanes(block.dtype)
    m, n, k = block.extent(r.i), block.extent(r.j), block.extent(r.k)
    what = "packed B, " if packed else ""
    w = _Writer(
        f"{_matmul_label(block)}: {what}RI x RJ register tile in TI x TJ tiles, k unrolled by KU",
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
    s.append(f"tile {r.i}, {r.j} by {_tile(ti, tj)}")
    s.append(f"tile {r.i}.i, {r.j}.i by {_tile(ri, rj)}  # the register tile")
    s.append(f"split {r.k} by {ku}")
    tiles = [f"{r.i}.o", f"{r.j}.o", f"{r.i}.i.o", f"{r.j}.i.o"]
    inner = [f"{r.k}.o", f"{r.k}.i", f"{r.i}.i.i", f"{r.j}.i.i"]
    s.append(f"reorder {', '.join([*r.outer, *tiles, *r.outer_reduce, *inner])}")
    if packed:
        s.append(f"cache_read {r.b} global at {r.j}.o  # {r.b}'s TJ-column panel, contiguous")
    s.append(f"cache_write {block.name} local at {r.j}.i.o  # accumulate in registers")
    if folded := epilogue(view, block):
        s.append(f"reverse_compute_inline {folded.name}  # computed as the tile is written back")
    s.append(f"unroll {r.k}.i")
    s.append(f"unroll {r.i}.i.i")
    s.append(f"vectorize {r.j}.i.i")
    s.append(f"fuse {', '.join([*r.outer, f'{r.i}.o', f'{r.j}.o'])} as tiles")
    s.append("parallel tiles")
    s.append(f"pragma tiles auto_unroll_max_step={steps}, unroll_explicit=1")
    s.append(f"decompose_reduction at {(r.outer_reduce or (f'{r.k}.o',))[0]}")
    if packed:
        # The copy loops: one per dimension of the panel longer than 1.
        b_access = next(a for a in block.reads if a.buffer == r.b)
        long_dims = sum(
            1
            for dim in b_access.dims
            if dim & {r.j, r.k, *r.outer_reduce} and not dim & set(r.outer)
        )
        copy, axis = w.section(f"{r.b}_global"), f"ax{long_dims - 1}"
        if max(tj_values) > lanes and all(t % lanes == 0 for t in tj_values):
            copy.append(f"split {axis} by {lanes}")  # a panel row is several vectors
            axis += ".i"
        copy.append(f"vectorize {axis}")
    if min(ri_values) > 1 and min(rj_values) > 1:
        w.section(f"{block.name}_local").append("vectorize ax1")
    _cpu_other_blocks(w, view, target, done={block.name, getattr(folded, "name", "")})
    return w


def _cpu_matmul_panels(
    view: OpView, block: Block, r: MatmulRoles, target: Target
) -> _Writer | None:
    """B stored once as NR-column panels (`transform_layout` of its packed copy to [N/NR, K,
    NR]), so the vectorized loop reads B contiguously for every k, under an MR x NR register tile
    (examples/matmul_packed.sched). A plain 2-D matmul only: no batch axes, one reduction axis, B
    indexed by k and j alone, N a multiple of NR."""
    lanes = target.vector_lanes(block.dtype)
    nr = 2 * lanes  # two vectors per panel row: 2 x MR accumulators
    m, n, k = block.extent(r.i), block.extent(r.j), block.extent(r.k)
    b_access = next(a for a in block.reads if a.buffer == r.b)
    dims = [set(d) for d in b_access.dims]
    if (
        r.outer
        or r.outer_reduce
        or lanes <= 1
        or n % nr
        or dims not in ([{r.k}, {r.j}], [{r.j}, {r.k}])
    ):
        return None
    w = _Writer(
        f"{_matmul_label(block)}: B stored as {nr}-column panels (transform_layout), an MR x {nr} "
        "register tile in MC-row blocks, k unrolled by KU",
        "matmul_panels",
    )
    # MR x NR/lanes accumulators and the B vectors fit the registers: MR 4 is 8 + 2 of AVX2's
    # 16; with AVX-512's 32, MR 8 is 16 + 2.
    rows = [8, 4] if target.vector_registers >= 32 else [4, 2]
    mr_values = pick(m, rows, most=2, widens=False)
    mr = w.factor("MR", mr_values)
    # MC counts register tiles (`split i by *, MC, MR`): 128 to 512 rows per parallel task at MR 8,
    # taken from the tile counts that divide M / MR, so no point is guarded (M = 128 had MC 64).
    mc = w.factor("MC", pick(m // max(mr_values), [16, 32, 64, 8], most=3))
    ku = w.factor("KU", pick(k, [4, 8, 2, 1], most=4))
    steps = w.factor("U", [16, 64])
    order = "(k, j)" if dims[0] == {r.k} else "(j, k)"  # B's own index order
    mapped = f"{order} -> (j // {nr}, k, j % {nr})"
    s = w.section(block.name)
    s.append(f"split {r.i} by *, {mc}, {mr}")
    s.append(f"split {r.j} by *, {nr}")
    s.append(f"split {r.k} by *, {ku}")
    s.append(f"reorder {r.i}.0, {r.j}.o, {r.i}.1, {r.k}.o, {r.k}.i, {r.i}.2, {r.j}.i")
    s.append(f"parallel {r.i}.0")
    s.append(f"cache_read {r.b} global")
    s.append(f"transform_layout {r.b}_global {mapped}")
    s.append(f"cache_write {block.name} local at {r.i}.1  # the MR x {nr} tile in registers")
    if folded := epilogue(view, block):
        s.append(f"reverse_compute_inline {folded.name}  # computed as the tile is written back")
    s.append(f"vectorize {r.j}.i")
    s.append(f"unroll {r.i}.2")
    s.append(f"unroll {r.k}.i")
    s.append(f"pragma {r.i}.0 auto_unroll_max_step={steps}, unroll_explicit=1")
    s.append(f"decompose_reduction at {r.k}.o")
    w.section(f"{r.b}_global").append("parallel ax0")
    _cpu_other_blocks(w, view, target, done={block.name, getattr(folded, "name", "")})
    return w


def _cpu_matmul_panels_padded(
    view: OpView, block: Block, r: MatmulRoles, target: Target
) -> _Writer | None:
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
    b_access = next(a for a in block.reads if a.buffer == r.b)
    dims = [set(d) for d in b_access.dims]
    if (
        r.outer
        or r.outer_reduce
        or lanes <= 1
        or (m % mr == 0 and n % nr == 0)  # the plain panels template fits
        or dims not in ([{r.k}, {r.j}], [{r.j}, {r.k}])
        or epilogue(view, block) is not None  # pad_einsum wants the matmul block alone
        or len(view.blocks) != 1
    ):
        return None
    kp = 4 if k % 4 and k > 4 else 1
    padded = {r.i: mr, r.j: nr, r.k: kp}
    m_pad, k_pad = -(-m // mr) * mr, -(-k // kp) * kp
    w = _Writer(
        f"{_matmul_label(block)}: zero-padded to whole {mr} x {nr} tiles (pad by), B stored as "
        f"{nr}-column panels (transform_layout), MC tiles of rows per parallel task, k unrolled "
        "by KU",
        "matmul_panels_padded",
    )
    # Row blocks of MC tiles of `mr` rows: the largest three up to 32 tiles that still give every
    # core at least two parallel tasks (1000 rows: 25, 10 and 5 tiles of 4; 25, 5, 1 of 8).
    tiles = m_pad // mr
    blocks = [d for d in divisors(tiles) if d <= 32 and tiles // d >= 2 * target.cores]
    mc = w.factor("MC", blocks[-3:][::-1] or [1])
    # The register tile: `mr` rows, or half as many (MC then counts tiles of `mr` rows still).
    rows = w.factor("MR", [mr, mr // 2]) if mr > 4 else str(mr)
    ku = w.factor("KU", pick(k_pad, [4, 8, 2, 1], most=4))
    steps = w.factor("U", [16, 64, 256])
    order = "(k, j)" if dims[0] == {r.k} else "(j, k)"  # B's own index order
    s = w.section(block.name)
    s.append(f"pad by {', '.join(str(padded.get(x.var, 1)) for x in block.loops)}")
    s.append(f"split {r.i} by *, {mc}, {rows}")
    s.append(f"split {r.j} by *, {nr}")
    s.append(f"split {r.k} by *, {ku}")
    s.append(f"reorder {r.i}.0, {r.j}.o, {r.i}.1, {r.k}.o, {r.k}.i, {r.i}.2, {r.j}.i")
    s.append(f"parallel {r.i}.0")
    s.append(f"transform_layout {r.b}_pad {order} -> (j // {nr}, k, j % {nr})")
    s.append(f"cache_write {block.name} local at {r.i}.1  # the {rows} x {nr} tile in registers")
    s.append(f"vectorize {r.j}.i")
    s.append(f"unroll {r.i}.2")
    s.append(f"unroll {r.k}.i")
    s.append(f"pragma {r.i}.0 auto_unroll_max_step={steps}, unroll_explicit=1")
    s.append(f"decompose_reduction at {r.k}.o")
    return w


def _matmul_label(block: Block) -> str:
    return f"{block.name} (matmul)"


def _cpu_conv(
    view: OpView, block: Block, r: ConvRoles, target: Target, inline_pad: bool, accumulate: bool
) -> _Writer:
    """`accumulate`: the output tile in a `local` accumulator. A short reduction per output (a
    depthwise 3x3: 9 multiply-adds) does not pay for it and its write-back: measured 2x slower
    on the 128-channel 56x56 depthwise conv; a long one (3x3 over 64 channels) does."""
    lanes = target.vector_lanes(block.dtype)
    # Measured on the 56x56 64->64 3x3 conv (znver3): WT must be whole vectors (7, 14 or 28
    # lanes ran 3-10x slower than 8); KT x HT x WT/lanes near 8 accumulators is best (4 x 2 x 1).
    col = block.extent(r.col)
    width = _row_vector(col, lanes)
    wt_values = pick(col, [width, 2 * width, 4 * width], multiple_of=min(width, col))
    kt_values = pick(block.extent(r.channel), [4, 8, 2, 16], most=4) if r.channel else []
    ht_values = pick(block.extent(r.row), [2, 4, 1, 8, 7, 14], most=6) if r.row else []
    tile = [name for name, values in (("KT", kt_values), ("HT", ht_values)) if values]
    pad = "padding inlined" if inline_pad else "padding computed per parallel task"
    w = _Writer(
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
    folded = epilogue(view, block) if accumulate else None
    if accumulate:
        s.append(f"cache_write {block.name} local at {r.col}.o  # accumulate in registers")
    if folded:
        s.append(f"reverse_compute_inline {folded.name}  # computed as the tile is written back")
    if r.pad and inline_pad:
        s.append(f"compute_inline {r.pad}")
    elif r.pad:
        s.append(f"compute_at {r.pad} {par}  # the padded input this task reads")
    s.append(f"vectorize {r.col}.i")
    if kt:
        s.append(f"unroll {r.channel}.i")
    if ht:
        s.append(f"unroll {r.row}.i")
    for axis in r.reduce[-2:] if not accumulate else r.reduce[-1:]:  # the window, not channels
        if block.extent(axis) <= 16:
            s.append(f"unroll {axis}")
    if accumulate:
        s.append(f"decompose_reduction at {r.reduce[0]}")
    done = {block.name, r.pad or "", getattr(folded, "name", "")}
    _cpu_other_blocks(w, view, target, done=done)
    return w


def _row_vector(extent: int, lanes: int) -> int:
    """The widest vector that divides a row of `extent`: a whole register, else half or a quarter
    of one (at least 4 lanes). On AVX-512 (rocketlake) a 56-wide row of the 56x56 conv takes 7
    vectors of 8, where no 16-lane tile divides it and the row became one 56-lane block: 84
    GFLOP/s against 10.5, measured side by side."""
    for width in (lanes, lanes // 2, lanes // 4):
        if width >= 4 and extent % width == 0:
            return width
    return lanes


def _cpu_rows(view: OpView, target: Target, fast_exp: bool = False) -> _Writer:
    """Every block computed per row inside the last block's parallel row loop; `fast_exp`: each
    float32 exp rewritten first (`fast_math exp`), so that its block vectorizes."""
    last = view.blocks[-1]
    lanes = target.vector_lanes(last.dtype)
    names = ", ".join(b.name for b in view.blocks)
    w = _Writer(
        f"row-wise {names}: RB rows per parallel task, rows vectorized by V, reductions by RS "
        "partial sums, unrolled up to U steps" + (", exp as a polynomial" if fast_exp else ""),
        "rows_fast_exp" if fast_exp else "rows",
    )
    for name in view.exp_blocks if fast_exp else ():
        w.section(name).append("fast_math exp")
    cols = {int(b.loops[1].extent) for b in view.blocks}
    vec = [v for v in (lanes, 2 * lanes, 4 * lanes) if all(c % v == 0 for c in cols)]
    v = w.factor("V", vec or [1])
    reductions = [b for b in view.blocks if b.reduce]
    lengths = {int(b.loops[1].extent) for b in reductions}
    # Fewer lanes than the row, so that the rfactor block keeps both of its loops.
    rs_values = [v for v in (lanes, 2 * lanes) if all(n % v == 0 and n > v for n in lengths)]
    rs = w.factor("RS", rs_values) if rs_values else None
    rows = int(last.loops[0].extent)
    # Row blocks: every core gets at least two tasks.
    rb_values = [b for b in pick(rows, [1, 4, 16, 2], most=4) if rows // b >= 2 * target.cores]
    rb = w.factor("RB", rb_values or [1])
    steps = w.factor("U", [1, 16, 64])
    if rs:
        for block in reductions:  # partial sums over RS lanes, so the reduction vectorizes
            s = w.section(block.name)
            s.append(f"split {block.loops[1].var} by {rs}")
            s.append(f"rfactor {block.loops[1].var}.i")
    row, col = last.loops[0].var, last.loops[1].var
    s = w.section(last.name)
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
        if not block.reduce and vec:
            section = w.section(block.name)
            section.append(f"split ax0 by {v}")
            section.append("vectorize ax0.i")
        elif block.reduce and rs:
            section = w.section(f"{block.name}_rf")
            section.append("reorder ax1, ax0")
            section.append("vectorize ax0")
    return w


def _cpu_generic(
    view: OpView, target: Target, rfactor: bool = False, strided: str | None = None
) -> _Writer:
    names = ", ".join(b.name for b in view.blocks)
    if strided == "registers":
        how = (
            ", a reduction over an outer axis accumulated in registers: V output lanes "
            "vectorized inside the reduction loop"
        )
    elif strided == "stream":
        how = (
            ", a reduction over an outer axis streamed: the reduction loop outside the whole "
            "output row, vectorized by V"
        )
    else:
        how = ", reductions vectorized by rfactor" if rfactor else ""
    family = f"reduce_outer_{strided}" if strided else "generic_rfactor" if rfactor else "generic"
    w = _Writer(f"{names}: parallel over the fused spatial loops{how}", family)
    _cpu_other_blocks(w, view, target, done=set(), knobs=True, rfactor=rfactor, strided=strided)
    if not strided and any("vectorize" in line for _, lines in w.sections for line in lines):
        w.note = w.note.replace("spatial loops", "spatial loops, vectorized inside", 1)
    return w


def _cpu_other_blocks(
    w: _Writer,
    view: OpView,
    target: Target,
    done: set[str],
    knobs: bool = False,
    rfactor: bool = False,
    strided: str | None = None,
) -> None:
    for block in view.blocks:
        if block.name not in done:
            _cpu_block(w, block, target, knobs, len(view.blocks) == 1, rfactor, strided)


def _cpu_block(
    w: _Writer,
    block: Block,
    target: Target,
    knobs: bool,
    single: bool,
    rfactor: bool = False,
    strided: str | None = None,
) -> None:
    """A block on its own: spatial loops fused, split into parallel chunks, then vector lanes."""
    lanes = target.vector_lanes(block.dtype)
    suffix = "" if single else f"_{_knob_suffix(block.name)}"
    spatial = [loop.var for loop in block.spatial]
    s = w.section(block.name)
    if not spatial:
        return
    reduce = [loop.var for loop in block.reduce]
    if strided and _strided_reduction(block, lanes):
        _cpu_strided(w, s, block, target, suffix, strided == "registers")
        return
    if reduce and [loop.var for loop in block.loops] != spatial + reduce:
        s.append(f"reorder {', '.join(spatial + reduce)}")
    if rfactor and _vector_reduction(block, lanes):
        # Partial results over V lanes: the rf block (whose loops keep these names) vectorizes
        # them; the block itself then adds the V partials of each output.
        last = reduce[-1]
        v = w.factor(f"V{suffix}", pick(block.extent(last), [lanes, 2 * lanes, 4 * lanes]))
        s.append(f"split {last} by {v}")
        s.append(f"rfactor {last}.i")
        partials = w.section(f"{block.name}_rf")
        for section in (s, partials):
            if len(spatial) > 1:
                section.append(f"fuse {', '.join(spatial)} as f")
            section.append(f"parallel {'f' if len(spatial) > 1 else spatial[0]}")
        partials.append(f"vectorize {last}.i")
        return
    fused = spatial[0]
    if len(spatial) > 1:
        fused = "f"
        s.append(f"fuse {', '.join(spatial)} as f")
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


def _cpu_strided(
    w: _Writer, s: list[str], block: Block, target: Target, suffix: str, registers: bool
) -> None:
    """The reduction loops outside the contiguous output axis `j`, which is split into V lanes
    and vectorized; the outer output axes are parallel. With `registers`, each V-lane slice of
    the output is accumulated in `local` over the whole reduction (j.o outside the reduction
    loops); else the reduction loops sit outside all of j and stream whole rows."""
    lanes = target.vector_lanes(block.dtype)
    spatial = [loop.var for loop in block.spatial]
    reduce = [loop.var for loop in block.reduce]
    outer, j = spatial[:-1], spatial[-1]
    extent = block.extent(j)
    v_values = pick(extent, [4 * lanes, 2 * lanes, 8 * lanes, lanes], multiple_of=lanes)
    v = w.factor(f"V{suffix}", v_values)
    last = reduce[-1]
    u = w.factor(f"U{suffix}", pick(block.extent(last), [1, 4, 2, 8], most=4))
    s.append(f"split {j} by {v}")
    s.append(f"split {last} by {u}")
    split_reduce = [*reduce[:-1], f"{last}.o", f"{last}.i"]
    if registers or not outer:
        s.append(f"reorder {', '.join([*outer, f'{j}.o', *split_reduce, f'{j}.i'])}")
        tasks = [*outer, f"{j}.o"]
    else:
        s.append(f"reorder {', '.join([*outer, *split_reduce, f'{j}.o', f'{j}.i'])}")
        tasks = outer
    if len(tasks) > 1:
        s.append(f"fuse {', '.join(tasks)} as tasks")
    par = "tasks" if len(tasks) > 1 else tasks[0]
    s.append(f"parallel {par}")
    if registers:
        s.append(f"cache_write {block.name} local at {par}  # V partial sums in registers")
    s.append(f"vectorize {j}.i")
    s.append(f"unroll {last}.i")
    u_values = pick(block.extent(last), [1, 4, 2, 8], most=4)
    if not registers and outer and extent // min(v_values) * max(u_values) <= 512:
        s.append(f"unroll {j}.o")  # not when it makes more copies than build in a moment
    s.append(f"decompose_reduction at {reduce[0] if len(reduce) > 1 else f'{last}.o'}")


# --- GPU ------------------------------------------------------------------------------------------


def _gpu_recipes(view: OpView, target: Target) -> list[_Writer | None]:
    main = [b for b in view.blocks if b.reduce]
    recipes: list[_Writer | None] = []
    if len(main) == 1 and (roles := matmul_roles(main[0])):
        recipes.append(_gpu_matmul(view, main[0], roles, target))
    inlinable = [b for b in view.blocks if not b.reduce and view.is_intermediate(b)]
    if inlinable:
        recipes.append(_gpu_generic(view, target, inline=inlinable))
    recipes.append(_gpu_generic(view, target, inline=[]))
    return recipes


def _gpu_matmul(view: OpView, block: Block, r: MatmulRoles, target: Target) -> _Writer:
    m, n, k = block.extent(r.i), block.extent(r.j), block.extent(r.k)
    w = _Writer(
        f"{_matmul_label(block)}: TY x TX threads with TM x TN each, A and B tiles in shared "
        "memory per BK slice of k",
        "gpu_matmul",
    )
    # First values: 16 x 16 threads with 4 x 4 outputs each, a 64 x 64 tile, 8 KiB of shared
    # memory per BK = 16 slice (unmeasured here: this machine has no GPU).
    ty_values = pick(m, [16, 8], most=2)
    tx_values = pick(n, [16, 8], most=2)
    tm_values = pick(m // max(ty_values), [4, 2, 8], most=3)
    tn_values = pick(n // max(tx_values), [4, 2, 8], most=3)
    # Copies split evenly over the threads when TM * BK and TN * BK are multiples of TX and TY.
    least = max(max(tx_values) // min(tm_values), max(ty_values) // min(tn_values), 1)
    bk_values = pick(k, [v for v in (16, 8, 32) if v >= least] or [least], most=3)
    ty, tx = w.factor("TY", ty_values), w.factor("TX", tx_values)
    tm, tn = w.factor("TM", tm_values), w.factor("TN", tn_values)
    bk = w.factor("BK", bk_values)

    s = w.section(block.name)
    s.append(f"split {r.i} by *, {ty}, {tm}")
    s.append(f"split {r.j} by *, {tx}, {tn}")
    s.append(f"split {r.k} by {bk}")
    tiles = [f"{r.i}.0", f"{r.j}.0", f"{r.i}.1", f"{r.j}.1"]
    inner = [f"{r.k}.o", f"{r.k}.i", f"{r.i}.2", f"{r.j}.2"]
    s.append(f"reorder {', '.join([*r.outer, *tiles, *r.outer_reduce, *inner])}")
    if len(r.outer) > 1:
        s.append(f"fuse {', '.join(r.outer)} as batch")
        s.append("bind batch blockIdx.z")
    elif r.outer:
        s.append(f"bind {r.outer[0]} blockIdx.z")
    s.append(f"bind {r.i}.0 blockIdx.y")
    s.append(f"bind {r.j}.0 blockIdx.x")
    s.append(f"bind {r.i}.1 threadIdx.y")
    s.append(f"bind {r.j}.1 threadIdx.x")
    # Bound first, so the shared copies cover the whole thread block's tiles, not one thread's.
    s.append(f"cache_read {r.a} shared at {r.k}.o")
    s.append(f"cache_read {r.b} shared at {r.k}.o")
    s.append(f"cache_write {block.name} local at {r.j}.1  # each thread's TM x TN tile")
    if folded := epilogue(view, block):
        s.append(f"reverse_compute_inline {folded.name}  # computed as the tile is written back")
    s.append(f"unroll {r.k}.i")
    s.append(f"unroll {r.i}.2")
    s.append(f"unroll {r.j}.2")
    s.append(f"decompose_reduction at {(r.outer_reduce or (f'{r.k}.o',))[0]}")
    for buffer in (r.a, r.b):
        access = next(a for a in block.reads if a.buffer == buffer)
        long_dims = sum(
            1
            for dim in access.dims
            if dim & {r.i, r.j, r.k, *r.outer_reduce} and not dim & set(r.outer)
        )
        copy = w.section(f"{buffer}_shared")  # cooperative fetch: every thread copies a part
        axes = [f"ax{d}" for d in range(long_dims)]
        if len(axes) > 1:
            copy.append(f"fuse {', '.join(axes)} as f")
        fused = "f" if len(axes) > 1 else axes[0]
        copy.append(f"split {fused} by *, {ty}, {tx}")
        copy.append(f"bind {fused}.1 threadIdx.y")
        copy.append(f"bind {fused}.2 threadIdx.x")
    _gpu_other_blocks(w, view, target, done={block.name, getattr(folded, "name", "")}, inline=[])
    return w


def _gpu_generic(view: OpView, target: Target, inline: list[Block]) -> _Writer:
    names = ", ".join(b.name for b in view.blocks if b not in inline)
    how = f"{', '.join(b.name for b in inline)} inlined; " if inline else ""
    rows = "; row reductions across TR threads" if any(map(_long_reduction, view.blocks)) else ""
    w = _Writer(
        f"{names}: {how}one thread per output in thread blocks of T{rows}",
        "gpu_generic_inline" if inline else "gpu_generic",
    )
    _gpu_other_blocks(w, view, target, done=set(), inline=inline)
    return w


def _gpu_other_blocks(
    w: _Writer, view: OpView, target: Target, done: set[str], inline: list[Block]
) -> None:
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
            _gpu_block(w, block, threads, first)


def _gpu_block(w: _Writer, block: Block, threads: list[int], first: list[str]) -> None:
    spatial = [loop.var for loop in block.spatial]
    reduce = [loop.var for loop in block.reduce]
    s = w.section(block.name)
    s.extend(first)
    if reduce and [loop.var for loop in block.loops] != spatial + reduce:
        s.append(f"reorder {', '.join(spatial + reduce)}")
    fused = spatial[0] if spatial else None
    if len(spatial) > 1:
        fused = "f"
        s.append(f"fuse {', '.join(spatial)} as f")
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
