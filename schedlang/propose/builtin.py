"""The built-in proposer, which needs no model: templates written from the op's loop nest by the
recipes in schedlang.propose.rules, and their catalog (`describe_templates`).

It looks at the op's loop nest (schedlang.propose.analysis), recognises a few shapes of
computation (a matmul, a conv, row-wise blocks, reductions that vectorize), and writes for each
the recipe that makes that shape fast, then the recipe for any op. Templates come best first,
and so do each knob's values: the first point is the recipe's measured default. Knob values
divide the loop extents they split, so templates need no guards, and each template is checked
at its first knob values before it is proposed: one that fails is dropped, with the reason
logged and kept in `BuiltinProposer.dropped`.

A new op (no template point of it measured yet) starts warm: its first candidates are the best
records of ops like it on the same target, moved onto its own templates
(schedlang.propose.warmstart), each checked first; see `BuiltinProposer`.

    proposer = BuiltinProposer()
    for proposal in proposer.templates(Context(op, resolve_target("llvm"))):
        print(proposal.note)
        print(proposal.text)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import schedule_names
from schedlang.core.ops import Op
from schedlang.core.target import Target
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse
from schedlang.propose.analysis import OpView, analyse
from schedlang.propose.interface import Context, NothingToTune, Proposal
from schedlang.propose.rules import RULES
from schedlang.propose.template import Draft, TemplateInfo, Writer, widened
from schedlang.propose.warmstart import nest_of, rename_schedule, transfer
from schedlang.store.records import op_key
from schedlang.store.similar import similar_records

if TYPE_CHECKING:
    from schedlang.store.records import Record

log = logging.getLogger(__name__)


class BuiltinProposer:
    """Templates written from the op's loop nest by the rules (schedlang.propose.rules), best
    first, handed out a few at a time as the tuner spends its budget.

    `propose` hands out templates until the ones handed out still have at least two batches
    (`2 * count`) of knob points not yet in `history`; the tuner asks again after every round,
    so when a template runs out of points, the next one takes over instead of the run stopping.
    The order is the recipes' (best first), except that

    * templates whose family or note names a word of `Context.hint` go first;
    * the templates of the warm start's points go next (see below), with the recipe's first
      template beside them;
    * the template that holds the fastest record in `history` (from an earlier run, say) goes
      first among the rest;
    * a template whose points are all in `history` is skipped, and one whose first measured
      points all failed makes way for the next at once;
    * when every template is handed out and they run dry, they come back widened (more values
      per knob, `write_templates(wide=True)`), best first.

    The warm start: when `history` holds no point of a template yet and `Context.db` is given,
    the first proposals are up to `transfers` points moved from the best records of ops like
    this one (schedlang.store.similar: same kind, nearest extents), nearest first, each a
    concrete schedule with its template and knobs (`Proposal.template`, `knobs`) and
    `extra["transferred_from"]`, the record's id; a record of no template (a model's schedule)
    is moved too, renamed to the op's names (`transferred_schedules`), and proposed as the
    concrete schedule it is. Each is checked; one that fails, or that
    cannot be moved, is dropped with a decision saying why (also in the tuner's run log,
    `Context.log`).

    The proposer draws no random numbers: the same op, target, hint and history give the same
    proposals, so a tuning run is reproduced by its seed. Each decision is logged (logger
    `schedlang.propose.builtin`), kept in `decisions`, and stored in the proposal's `extra["why"]`.
    """

    name = "builtin"
    FAILURES_BEFORE_HANDOVER = 4  # measured points of a template, all failed
    TRANSFERS = 3  # the warm start's points, at most

    def __init__(self, transfers: int = TRANSFERS) -> None:
        self.transfers = transfers  # 0: no warm start
        self._warm: set[tuple[str, str]] = set()  # contexts whose warm start was looked for
        self._templates: dict[tuple[str, str], list[Proposal]] = {}
        self._returned: dict[tuple[str, str], list[Proposal]] = {}
        self._wide: dict[tuple[str, str], list[Proposal]] = {}
        self.dropped: list[Proposal] = []  # templates that failed their check; note says why
        self.decisions: list[str] = []

    def again(self) -> BuiltinProposer:
        """A proposer for another run on the same ops (a model's next round of one task): the
        templates written and checked are kept, checking them being the costly part; what was
        handed out is not, so that the run gets its templates."""
        other = BuiltinProposer(self.transfers)
        other._templates, other._wide, other.dropped = self._templates, self._wide, self.dropped
        return other

    def templates(self, context: Context) -> list[Proposal]:
        key = _context_key(context)
        if key not in self._templates:
            self._templates[key] = self._checked(context)
        return list(self._templates[key])

    def propose(self, context: Context, history: Sequence[Record], count: int) -> list[Proposal]:
        templates = self.templates(context)
        if not templates:
            raise self.no_template_error(context)
        transfers = self._warm_start(context, templates, history)
        first = {p.template for p in transfers}  # their templates are handed out with them
        returned = self._returned.setdefault(_context_key(context), [])
        done = {p.text for p in returned}
        stats = _template_stats(history)
        left = sum(_points_left(p, stats) for p in returned if not _failing(p, stats))
        fresh: list[Proposal] = []
        # The recipe's first template comes with the warm start's points, not after them: what
        # similar ops measured best may come from a round that never reached it.
        lead = templates[0].text if transfers else None
        for proposal, why in self._order(context, templates, stats, first):
            if proposal.text in done:
                continue
            wanted = proposal.text in first or proposal.text == lead
            if (fresh or returned) and left >= 2 * max(count, 1) and not wanted:
                continue
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
            return [*transfers, *fresh]
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
        return [*transfers, *fresh]

    def _widened(self, context: Context) -> list[Proposal]:
        """Each template again with more values per knob (the preferred ones left out, then other
        divisors of the loop it splits), for a run that measured every point; checked alike."""
        key = _context_key(context)
        if key not in self._wide:
            narrow = {_form(p): p for p in self.templates(context)}
            wide = []
            for proposal in self._checked(context, wide=True):
                base = narrow.get(_form(proposal))
                if base is None or base.extra["space"] >= proposal.extra["space"]:
                    continue  # nothing to widen
                extra = {**proposal.extra, "widens": base.text}
                wide.append(replace(proposal, note=f"{proposal.note}, widened", extra=extra))
            self._wide[key] = wide
        return list(self._wide[key])

    def _order(
        self,
        context: Context,
        templates: list[Proposal],
        stats: dict[str, _Stats],
        first: set[str | None],
    ) -> list[tuple[Proposal, str]]:
        words = set(re.findall(r"[a-z]{4,}", (context.hint or "").lower()))
        hinted = [
            p for p in templates
            if words & set(re.findall(r"[a-z]{4,}", f"{p.extra['family']} {p.note}".lower()))
        ]  # fmt: skip
        best = max(
            (p for p in templates if stats.get(p.text, _Stats()).best),
            key=lambda p: stats[p.text].best or 0.0,  # each has a best (the filter above)
            default=None,
        )
        order = [(p, f"the hint names it ({context.hint!r})") for p in hinted]
        order += [
            (p, "a point of it is transferred from a similar op")
            for p in templates if p.text in first and p not in hinted
        ]  # fmt: skip
        if best is not None and all(best is not p for p, _ in order):
            gflops = stats[best.text].best
            order.append((best, f"it holds the fastest record so far ({gflops:.2f} GFLOP/s)"))
        chosen = {p.text for p, _ in order}
        return order + [(p, "") for p in templates if p.text not in chosen]

    def _decide(self, text: str, context: Context | None = None) -> None:
        """Log and keep a decision; with a `context`, in the tuner's run log too."""
        log.info("builtin proposer: %s", text)
        self.decisions.append(text)
        if context is not None and context.log is not None:
            context.log(f"builtin proposer: {text}")

    def _warm_start(
        self, context: Context, templates: list[Proposal], history: Sequence[Record]
    ) -> list[Proposal]:
        """The warm start's points (see the class), once per context, for a new op only."""
        key = _context_key(context)
        new = not any(record.template for record in history)
        if key in self._warm or not new or context.db is None or self.transfers <= 0:
            return []
        self._warm.add(key)
        measured = {record.schedule for record in history}
        decide = lambda text: self._decide(text, context)  # noqa: E731
        points = transferred_points(context, templates, self.transfers, measured, decide)
        # What a model (or a person) wrote for ops like it, with no template: its schedules
        # compete with the template points, nearest first, then the faster.
        nest = templates[0].extra.get("nest")
        written = [
            replace(p, proposer=self.name)  # proposed by this proposer; the note says whose
            for p in transferred_schedules(context, nest, self.transfers, measured, decide)
        ]
        both = sorted([*points, *written], key=lambda p: (p.extra["distance"], -p.extra["gflops"]))
        return both[: self.transfers]

    def no_template_error(self, context: Context) -> NothingToTune:
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
        return NothingToTune(
            f"nothing to tune: the built-in proposer has no template for {op.name}", *notes
        )

    def _checked(self, context: Context, wide: bool = False) -> list[Proposal]:
        kept = []
        drafts = (
            write_templates(context.op, context.target, wide=True)
            if wide
            else write_templates(context.op, context.target)
        )
        nest = nest_of(context.op, op_kind(context.op, context.target)) if drafts else None
        for draft in drafts:
            proposal = Proposal(
                draft.text,
                self.name,
                draft.note,
                {"family": draft.family, "space": draft.space}
                | ({"serial": True} if draft.serial else {})
                | ({"nest": nest} if nest else {}),
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


def _form(proposal: Proposal) -> tuple[str, bool]:
    """Its family, and whether it is the family's one-thread form."""
    return proposal.extra["family"], bool(proposal.extra.get("serial"))


def _context_key(context: Context) -> tuple[str, str]:
    # The printed function, not a structural hash: templates name its blocks, loops and buffers.
    return context.op.func.script(), context.target.key


def transferred_points(
    context: Context,
    templates: Sequence[Proposal],
    count: int,
    measured: Collection[str] = (),
    decide: Callable[[str], None] = lambda text: None,
) -> list[Proposal]:
    """Up to `count` points moved onto `templates` (the op's, checked) from the best records of
    ops like `context.op` on its target in `context.db` (schedlang.store.similar), nearest first:
    concrete schedules in the op's own names and at its shape, each checked at its knobs. What
    is not moved, or fails its check, or is in `measured`, is dropped and said to `decide`. The
    built-in proposer's warm start, and the examples a model's prompt retrieves."""

    def move(record: Record) -> tuple[Proposal, tuple[str, ...]] | str:
        moved = transfer(record, templates)
        return moved if isinstance(moved, str) else (moved.proposal, moved.changes)

    if not templates:
        return []
    nest = templates[0].extra.get("nest")
    families = {p.extra["family"] for p in templates}
    return _transferred(context, nest, families, move, count, measured, decide)


def transferred_schedules(
    context: Context,
    nest: dict | None,
    count: int,
    measured: Collection[str] = (),
    decide: Callable[[str], None] = lambda text: None,
) -> list[Proposal]:
    """Up to `count` schedules of no template (a model's or a person's) moved onto `context.op`
    from the best such records of ops like it (`nest`, as `nest_of` gives it) on its target,
    nearest first: each renamed to the op's names (`rename_schedule`) and checked; what does not
    apply, or is in `measured`, is dropped and said to `decide`."""
    ours = schedule_names(context.op.func)

    def move(record: Record) -> tuple[Proposal, tuple[str, ...]] | str:
        try:
            renamed = rename_schedule(record.schedule, record.extra.get("names") or {}, ours)
            text = format_schedule(parse(renamed, "<retrieved>"))
        except SchedlangError as err:
            return " ".join(err.message.split())
        note = f"{record.proposer}'s schedule, transferred from #{record.id} ({record.op_name})"
        return Proposal(text, record.proposer, note, {"transferred_from": record.id}), ()

    return _transferred(context, nest, {None}, move, count, measured, decide)


def _transferred(
    context: Context,
    nest: dict | None,
    families: Collection[str | None],
    move: Callable[[Record], tuple[Proposal, tuple[str, ...]] | str],
    count: int,
    measured: Collection[str],
    decide: Callable[[str], None],
) -> list[Proposal]:
    """What `transferred_points` and `transferred_schedules` share: the best records of ops like
    the op (of `families`), each moved by `move` (the proposal and what changed, or why not),
    kept when it is new and checks clean, until `count`."""
    if context.db is None or count <= 0 or not nest:
        return []
    similar = similar_records(
        context.db, context.target.key, nest, exclude_op_key=op_key(context.op.func),
        families=families, n=2 * count,
    )  # fmt: skip
    points: list[Proposal] = []
    for found in similar:
        record = found.record
        source = f"#{record.id} ({record.op_name}, {record.extra.get('family') or record.proposer}"
        source += f", distance {found.distance:.2f}, {record.gflops or 0:.2f} GFLOP/s)"
        moved = move(record)
        if isinstance(moved, str):
            decide(f"did not transfer {source}: {moved}")
            continue
        point, changes = moved
        if point.text in measured or any(p.text == point.text for p in points):
            decide(f"did not transfer {source}: its point is proposed already")
            continue
        problem = first_point_problem(point.text, context.op, context.target)
        if problem is not None:
            decide(f"dropped the point transferred from {source}: {problem}")
            continue
        why = f"transferred from {source}" + (f": {'; '.join(changes)}" if changes else "")
        what = f"{point.extra['family']} {point.knobs}" if point.template else "the schedule"
        decide(f"proposed {what}: {why}")
        extra = {"why": why, "distance": found.distance, "gflops": record.gflops or 0.0}
        points.append(replace(point, extra={**point.extra, **extra}))
        if len(points) == count:
            break
    return points


def first_point_problem(text: str, op: Op, target: Target) -> str | None:
    """None when `text` parses, is canonical and checks clean at its first knob values; else
    the first diagnostic, on one line, with the block it is in."""
    from schedlang.checker.check import check

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


# --- the catalog ----------------------------------------------------------------------------------


def op_kind(op: Op, target: Target) -> str:
    """The kind the rules see in `op`: the first rule of the target that applies, by rank
    (matmul, conv, rows, …), or "other" when only the fallback recipe does."""
    view = analyse(op)
    if view is None or not view.blocks:
        return "other"
    rules = [r for r in RULES if r.target == ("gpu" if target.is_gpu else "cpu")]
    kind = next((r for r in rules if not r.fallback and r.applies(view, target)), None)
    return type(kind).__name__.lower() if kind else "other"


def describe_templates() -> list[TemplateInfo]:
    """The kinds of template the built-in proposer writes, best first per target."""
    return [info for rule in RULES for info in rule.templates]


def write_templates(op: Op, target: Target, wide: bool = False) -> list[Draft]:
    """Every template the rules give for `op` on `target`, best first (unchecked). `wide`: with
    more values per knob (`pick`), for a run that has measured every point of the others."""
    view = analyse(op)
    if view is None or not view.blocks:
        return []
    with widened(wide):
        writers = [w for w in _writers(view, target) if w is not None]
        drafts = [w.draft() for w in writers]
        if target.is_gpu or view.work >= target.serial_work:
            return drafts
        # Little work: each template first on one thread, where leaving out its `parallel`
        # statements changes it (the pool's wake-up may cost more than the work saves).
        both: list[Draft] = []
        for writer, draft in zip(writers, drafts, strict=True):
            serial = writer.draft(serial=True)
            if serial.text.split("\n", 1)[1] != draft.text.split("\n", 1)[1]:
                both.append(serial)
            both.append(draft)
        return both


def _writers(view: OpView, target: Target) -> list[Writer | None]:
    """The templates of the op's kind (the first rule of the target that applies, by rank), then
    those of the fallback rules, unless the kind's rule writes alone."""
    rules = [r for r in RULES if r.target == ("gpu" if target.is_gpu else "cpu")]
    kind = next((r for r in rules if not r.fallback and r.applies(view, target)), None)
    writers = kind.write(view, target) if kind else []
    if kind is None or not kind.alone:
        for rule in rules:
            if rule.fallback and rule.applies(view, target):
                writers += rule.write(view, target)
    return writers
