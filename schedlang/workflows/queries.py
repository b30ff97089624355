"""What the database and the built-in proposer answer, read for a command or a Python user:
the best schedules of an op, the records (from a damaged file, what can still be read), the
templates written for an op and the catalogue of them. Each returns plain data; nothing here
prints. The imports are inside the functions, so that a command that asks none stays quick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from schedlang.core.diagnostics import SchedlangError
from schedlang.workflows.database import Notes, open_database
from schedlang.workflows.events import ignore

if TYPE_CHECKING:
    from schedlang.core.ops import Op
    from schedlang.core.target import Target
    from schedlang.lang.nodes import Schedule
    from schedlang.propose.builtin import TemplateInfo
    from schedlang.propose.interface import Proposal
    from schedlang.store.db import Database
    from schedlang.store.records import Record


def best_schedules(db: Database, op: Op, target: Target, n: int = 1) -> list[Record]:
    """The `n` fastest verified records of `op` on `target`; none is a SchedlangError that says
    what the database holds for an op of that name instead."""
    from schedlang.store.lookup import best_records_of

    return best_records_of(db, op, target, n=n)


def best_schedule(db: Database, op: Op, target: Target) -> tuple[Record, Schedule]:
    """The fastest verified record of `op` on `target`, and its schedule parsed."""
    from schedlang.tuning.saving import record_schedule

    [best] = best_schedules(db, op, target)
    return best, record_schedule(best)


def parsed_schedule(record: Record) -> Schedule:
    """A record's schedule, parsed; diagnostics name the record (`<db #12>`)."""
    from schedlang.tuning.saving import record_schedule

    return record_schedule(record)


@dataclass(frozen=True)
class History:
    """The records asked for. From a damaged database: those that can still be read, with
    `damaged` (the error opening it) and `note` (how many were read, how many could not be)."""

    records: list[Record] = field(default_factory=list)
    damaged: SchedlangError | None = None
    note: str = ""


def history(
    db_path: str | Path | None,
    op: Op | None = None,
    target: Target | None = None,
    *,
    limit: int | None = None,
    events: Notes = ignore,
) -> History:
    """The database's records (of `op`, on `target`, at most `limit`), oldest first."""
    from schedlang.store.records import op_key
    from schedlang.store.schema import DamagedDatabaseError

    key = op_key(op.func) if op is not None else None
    target_key = target.key if target is not None else None
    try:
        with open_database(db_path, read_only=True, events=events) as db:
            return History(db.records(key, target_key, limit=limit))
    except DamagedDatabaseError as err:
        return _salvaged(err, db_path, key, target_key, limit)


def _salvaged(
    err: SchedlangError, db_path: str | Path | None, key, target_key, limit: int | None
) -> History:
    from schedlang.store.db import default_db_path, salvage_records

    records, lost, exact = salvage_records(Path(db_path) if db_path else default_db_path())
    records = [
        r
        for r in sorted(records, key=lambda r: (r.created_at, r.id))
        if key in (None, r.op_key) and target_key in (None, r.target_key)
    ][:limit]
    if exact or lost:
        unread = f"{'' if exact else 'at least '}{lost} could not be read"
    else:
        unread = "how many could not be read is not known"
    note = f"listing the {len(records)} records that can still be read; {unread}"
    return History(records, err, note)


def export_records(records: list[Record], form: str, fp: IO[str]) -> None:
    """Records written as `form`: "csv" (a row each) or "json" (a list)."""
    from schedlang.store.records import export_csv, export_json

    (export_csv if form == "csv" else export_json)(records, fp)


def database_path(path: str | Path | None = None) -> Path:
    """`path`, else the default database's ($SCHEDLANG_DB or the user cache's)."""
    from schedlang.store.db import default_db_path

    return Path(path) if path else default_db_path()


def templates_for(op: Op, target: Target) -> list[Proposal]:
    """The templates the built-in proposer writes for `op` on `target`, in the order it tries
    them."""
    from schedlang.propose.builtin import BuiltinProposer
    from schedlang.propose.interface import Context

    return list(BuiltinProposer().templates(Context(op, target)))


def template_catalog() -> list[TemplateInfo]:
    """The kinds of template the built-in proposer writes, per target, best first."""
    from schedlang.propose import builtin

    describe = getattr(builtin, "describe_templates", None)
    if describe is None:
        raise SchedlangError(
            "this version of the built-in proposer cannot list its templates "
            "(schedlang.propose.builtin.describe_templates is missing)"
        )
    return list(describe())
