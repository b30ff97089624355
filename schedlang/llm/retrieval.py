"""The examples a model's prompt retrieves from the database: the best verified schedules of ops
like the one asked about on its target, moved to its names and shape and checked against it.

Two kinds of record carry over (schedlang.store.similar finds both by the op's nest):

* a built-in template's point: its knob values moved onto the op's template of the same family
  (schedlang.propose.builtin.transferred_points, the built-in proposer's warm start);
* a schedule of no template, as a model (or a person) wrote it: its names replaced by the op's
  (schedlang.propose.builtin.transferred_schedules), its factors kept.

Nearest first; among as near, the faster. What does not apply to the op is dropped and logged.
When none of them is of the op's first template (its recipe's measured best), that template's
first point is shown beside them (in the last place): a database whose first tuned op was won
by another family would otherwise show only that family to every op after it, and the model
copies what it sees.

    for point in retrieve_examples(Context(op, target, db=db), 2):
        print(point.extra["example"], point.text, sep="\n")
"""

from __future__ import annotations

import logging
from dataclasses import replace

from schedlang.checker.pipeline import bind_knobs
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse
from schedlang.propose.builtin import BuiltinProposer, transferred_points, transferred_schedules
from schedlang.propose.interface import Context, Proposal

log = logging.getLogger(__name__)


def retrieve_examples(context: Context, count: int = 2) -> list[Proposal]:
    """Up to `count` schedules for `context.op` from the best records of ops like it in
    `context.db` (the module's docstring), each with `extra["example"]`, the line that
    introduces it in the prompt."""
    if context.db is None or count <= 0:
        return []
    templates = BuiltinProposer().templates(replace(context, hint=None))
    if not templates:
        return []

    def decide(text: str) -> None:
        log.info("retrieval: %s", text)

    nest = templates[0].extra.get("nest")
    found = transferred_points(context, templates, count, decide=decide)
    found += transferred_schedules(context, nest, count, decide=decide)
    found.sort(key=lambda p: (p.extra["distance"], -p.extra["gflops"]))
    found = [replace(p, extra={**p.extra, "example": _similar(p)}) for p in found[:count]]
    lead = templates[0]
    if found and count >= 2 and all(p.template != lead.text for p in found):
        found = [*found[: count - 1], _first_point(lead)]
        decide(f"showed {lead.extra['family']}'s first point beside what was found")
    return found


def _similar(point: Proposal) -> str:
    """The line before a retrieved schedule: "a similar op (matmul, 12.34 GFLOP/s)"."""
    what = point.extra.get("family") or point.proposer
    return (
        f"the fastest schedule measured on this target for a similar op ({what}, "
        f"{point.extra['gflops']:.2f} GFLOP/s), moved to this op's names and shape"
    )


def _first_point(template: Proposal) -> Proposal:
    """The template at each knob's first value (the recipe's measured default)."""
    schedule = parse(template.text, "<builtin>")
    point = {param.name.text: next(iter(param.choices)) for param in schedule.params}
    example = f"the built-in {template.extra['family']} recipe's first choice for this op"
    return replace(
        template, text=format_schedule(bind_knobs(schedule, point)), template=template.text,
        knobs=point, extra={**template.extra, "example": example},
    )  # fmt: skip
