"""The best records of ops like another one on the same target, nearest first: what the tuning of
a new op may start from (the built-in proposer's warm start, schedlang.propose.warmstart).

An op is described by its nest, which the built-in proposer keeps in each record it writes
(`Record.extra["nest"]`): the kind of loop nest its rules see (matmul, conv, rows, …), and the
loops of its heaviest block (the one of most iterations) in nest order, each spatial (S) or
reduce (R), with their extents:

    {"kind": "conv", "loops": "SSSSRRR", "extents": [1, 64, 56, 56, 64, 3, 3]}

Two ops are alike when their kinds and their loop letters are the same. Their distance is the
Euclidean distance between their log2 extents, loop by loop: 1.0 is one loop twice as long (or
half as long), 2.0 one loop four times as long, or four loops twice as long. ResNet-18's 3x3
convolutions 64 -> 64 at 56 x 56 and 128 -> 128 at 28 x 28 are 2.0 apart; a 1x1 one is 2.2 from
the 3x3 one of its channels and size (both its window loops are 3 times shorter).

    for similar in similar_records(db, target.key, nest, exclude_op_key=key):
        print(similar.distance, similar.record.op_name, similar.record.extra["family"])

Records written before nests were kept have no nest: they are never found here. The model's
proposer keeps the nest in its records too (schedlang.llm.proposer), so what a model wrote is
found as well: records of no template `family`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schedlang.store.records import Record, Status

if TYPE_CHECKING:
    from schedlang.store.db import Database


@dataclass(frozen=True)
class Similar:
    record: Record  # the fastest of its op's records (of a family asked for)
    distance: float  # between its op's nest and the nest asked about


def nest_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    """The distance between two nests (the module's docstring), or None when they are not alike:
    different kinds, different loops, or a nest that is not one."""
    if not (_valid(a) and _valid(b)) or (a["kind"], a["loops"]) != (b["kind"], b["loops"]):
        return None
    return math.dist([math.log2(e) for e in a["extents"]], [math.log2(e) for e in b["extents"]])


def similar_records(
    db: Database,
    target_key: str,
    nest: Mapping[str, Any],
    *,
    exclude_op_key: str,
    families: Collection[str | None] | None = None,
    n: int = 4,
) -> list[Similar]:
    """For up to `n` ops alike `nest` on exactly this target, other than `exclude_op_key`, the
    fastest verified record of each (of one of `families`, when given: None among them stands
    for the records of no template family, which a model or a person wrote), nearest first;
    among ops as near, the faster first (GFLOP/s)."""
    if not _valid(nest):
        return []
    equal = {"nest.kind": nest["kind"], "nest.loops": nest["loops"]}
    found: dict[str, Similar] = {}
    for record in _best_per_family(db, target_key, equal, exclude_op_key):
        family = record.extra.get("family")
        if record.op_key in found or (families is not None and family not in families):
            continue  # records come fastest first: the op's fastest is kept
        distance = nest_distance(nest, record.extra.get("nest", {}))
        if distance is not None:
            found[record.op_key] = Similar(record, distance)
    ranked = sorted(
        found.values(), key=lambda s: (s.distance, -(s.record.gflops or 0.0), s.record.op_key)
    )
    return ranked[:n]


def _best_per_family(
    db: Database, target_key: str, equal: Mapping[str, str], exclude_op_key: str
) -> list[Record]:
    """The fastest verified record of each op and family on exactly this target, among the
    records whose `extra` holds the values of `equal` (paths like "nest.kind"), fastest first;
    ops other than `exclude_op_key` only. A record whose `extra` is not JSON is left out."""
    extract = "CASE WHEN json_valid(extra) THEN json_extract(extra, ?) END"
    where = "target_key = ? AND status = ? AND typeof(median_s) IN ('real', 'integer')"
    where += " AND op_key != ?"
    params: tuple = (target_key, Status.OK.value, exclude_op_key)
    for path, value in equal.items():
        where, params = f"{where} AND {extract} = ?", (*params, f"$.{path}", value)
    # SQLite takes the bare column `id` from the row where min() found its value.
    return db.select(
        f"WHERE id IN (SELECT id FROM (SELECT id, min(median_s) FROM records WHERE {where} "
        f"GROUP BY op_key, {extract})) ORDER BY median_s, id",
        (*params, "$.family"),
    )


def _valid(nest: Any) -> bool:
    """A nest as the module's docstring has it: a stored one may come from anywhere."""
    if not isinstance(nest, Mapping):
        return False
    kind, loops, extents = nest.get("kind"), nest.get("loops"), nest.get("extents")
    return (
        isinstance(kind, str)
        and isinstance(loops, str)
        and isinstance(extents, list)
        and len(extents) == len(loops)
        and all(isinstance(e, int) and not isinstance(e, bool) and e > 0 for e in extents)
    )
