"""The tuning database a workflow reads and writes: given open, or opened from its path here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from schedlang.core.diagnostics import SchedlangError, render_all, warning
from schedlang.store.db import Database, default_db_path
from schedlang.workflows.events import Note, ignore

DatabaseArg = Database | str | Path | None  # open, or its path (None: the default database)
Notes = Callable[[Note], None]  # opening a database reports Notes only (any Events sink takes them)


def open_database(
    path: str | Path | None,
    *,
    read_only: bool = False,
    missing_ok: bool = False,
    events: Notes = ignore,
) -> Database:
    """The tuning database at `path`, else `default_db_path()`.

    read_only: for what only reads it; a missing file is an error, never created.
    missing_ok (with read_only): a missing file is a warning, and reads as an empty database.
    A database created here is a warning too (a Note).
    """
    where = Path(path) if path else default_db_path()
    try:
        db = Database(where, read_only=read_only)
    except SchedlangError as err:
        if not (read_only and missing_ok and not where.exists()):
            raise
        events(Note(render_all([warning(err.message, None, *err.notes)]), warning=True))
        return Database(":memory:")  # SQLite's in-memory database: empty, and never saved
    if getattr(db, "created", False):
        events(Note(f"warning: no tuning database at {db.path}: started a new, empty one", True))
    return db


@contextmanager
def database(
    db: DatabaseArg, *, read_only: bool = False, missing_ok: bool = False, events: Notes = ignore
) -> Iterator[Database]:
    """`db` itself when it is open (left open), else the database at its path, closed after."""
    if isinstance(db, Database):
        yield db
        return
    with open_database(db, read_only=read_only, missing_ok=missing_ok, events=events) as opened:
        yield opened
