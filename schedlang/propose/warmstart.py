"""The built-in proposer's warm start: a new op's first candidates are the best records of ops
like it on the same target (schedlang.store.similar), each re-instantiated at the op's shape as
a point of the op's own template of the same family.

A record is not copied: its loops, names and extents are another op's. What carries over is its
template family and its knob values: each knob of the op's template takes the record's value
when the template offers it at the op's shape, else the offered value nearest to it (on a log
scale: 32 is as far from 16 as 8 is); a knob the record lacks takes the template's first value.

    nest = nest_of(op, target)        # kept in each record as extra["nest"]
    moved = transfer(record, templates)
    if isinstance(moved, str):
        print("not transferred:", moved)

A schedule with no template (one a model or a person wrote) carries over as text: its block,
loop and buffer names become the op's (`rename_schedule`, the names of `schedule_names`, which
every record keeps in extra["names"]), matched in order, kind by kind; its factors stay, and the
checker says whether they fit the op's shape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pygments.token import Name

from schedlang.checker.pipeline import bind_knobs
from schedlang.core.diagnostics import SchedlangError
from schedlang.core.ops import Op
from schedlang.lang.lexer import SchedlangLexer
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse
from schedlang.propose.analysis import analyse
from schedlang.propose.interface import Proposal
from schedlang.store.records import Record


def nest_of(op: Op, kind: str) -> dict | None:
    """The op's nest as schedlang.store.similar describes it: `kind` (the proposer's op_kind) and
    the loops of its heaviest block; None when its extents are not all constants."""
    view = analyse(op)
    if view is None or not view.blocks:
        return None
    heaviest = max(view.blocks, key=lambda b: math.prod(int(loop.extent) for loop in b.loops))
    return {
        "kind": kind,
        "loops": "".join("R" if loop.kind == "reduce" else "S" for loop in heaviest.loops),
        "extents": [int(loop.extent) for loop in heaviest.loops],
    }


@dataclass(frozen=True)
class Transferred:
    proposal: Proposal  # the point, concrete, with its template and knobs
    changes: tuple[str, ...]  # one line per knob that did not keep the record's value


def transfer(record: Record, templates: Sequence[Proposal]) -> Transferred | str:
    """`record`'s point moved onto the template of its family among `templates` (the new op's,
    checked), the same one-thread form first; or why it cannot be (a line). The point is not
    checked: the caller does that."""
    family, serial = record.extra.get("family"), bool(record.extra.get("serial"))
    same = [t for t in templates if t.extra.get("family") == family]
    same.sort(key=lambda t: bool(t.extra.get("serial")) != serial)
    if not same:
        return f"the op has no `{family}` template"
    template = same[0]
    space = {p.name.text: list(p.choices) for p in parse(template.text, "<builtin>").params}
    if not space:
        return f"its `{family}` template has no knobs"
    if not set(space) & set(record.knobs):
        theirs, ours = ", ".join(record.knobs) or "none", ", ".join(space)
        return f"its knobs ({theirs}) are not those of the op's `{family}` template ({ours})"
    point, changes = {}, []
    for name, values in space.items():
        if name not in record.knobs:
            point[name] = values[0]
            changes.append(f"{name} = {values[0]}, the template's first (the record has none)")
            continue
        point[name] = nearest(record.knobs[name], values)
        if point[name] != record.knobs[name]:
            offered = ", ".join(map(str, values))
            changes.append(f"{name} {record.knobs[name]} -> {point[name]} (offered: {offered})")
    schedule = bind_knobs(parse(template.text, "<builtin>"), point)
    extra = {**template.extra, "transferred_from": record.id}
    note = f"{template.note}, transferred from #{record.id} ({record.op_name})"
    proposal = replace(
        template, text=format_schedule(schedule), note=note, extra=extra,
        template=template.text, knobs=point,
    )  # fmt: skip
    return Transferred(proposal, tuple(changes))


def nearest(value: int, values: Sequence[int]) -> int:
    """The value of `values` nearest to `value`, on a log scale where both are positive; the
    earlier (the template's preferred) of two as near."""

    def far(other: int) -> float:
        if value > 0 and other > 0:
            return abs(math.log2(other) - math.log2(value))
        return abs(other - value)

    return min(values, key=far)


NAME_KINDS = ("blocks", "loops", "buffers")


def rename_schedule(
    text: str, theirs: Mapping[str, Sequence[str]], ours: Mapping[str, Sequence[str]]
) -> str:
    """`text`, a schedule of an op named `theirs` (`schedule_names`: blocks, loops, buffers),
    in the names `ours` of an op of the same structure: the i-th name of each kind becomes the
    i-th. Raises SchedlangError when the two do not correspond (other counts of a kind, or one
    name that would need two). Names are replaced where the schedule names them: whole, as the
    base of an axis (`i` in `i.o`), in a fused axis (`i.o_j.o`) and in a cache's block
    (`C` in `C_local`); never a suffix (`o` of `i.o`), a keyword or a thread."""
    table: dict[str, str] = {}
    for kind in NAME_KINDS:
        old, new = list(theirs.get(kind, ())), list(ours.get(kind, ()))
        if len(old) != len(new):
            raise SchedlangError(f"the ops have different {kind}: {len(old)} and {len(new)}")
        for before, after in zip(old, new, strict=True):
            if not (isinstance(before, str) and isinstance(after, str)):
                raise SchedlangError(f"a name of its {kind} is not a string: {before!r}")
            if table.setdefault(before, after) != after:
                twice = f"`{table[before]}` and `{after}`"
                raise SchedlangError(f"`{before}` would need two names, {twice}")
    changed = {old: new for old, new in table.items() if old != new}
    if not changed:
        return text
    alternatives = "|".join(re.escape(n) for n in sorted(changed, key=lambda n: (-len(n), n)))
    pattern = re.compile(rf"(?<![A-Za-z0-9.])(?:{alternatives})(?![A-Za-z0-9])")
    pieces = []
    for _, token, value in SchedlangLexer().get_tokens_unprocessed(text):
        if token in (Name, Name.Class):
            value = pattern.sub(lambda m: changed[m.group(0)], value)
        pieces.append(value)
    return "".join(pieces)
