"""What a schedlang database file is, and opening one: its tables, its marks, its damage.

A file is ours when its `PRAGMA application_id` is "SCHL"; `PRAGMA user_version` is its schema
version (2 added the claims table; 3 the ops, models and model_timings tables that
`schedlang report` reads). `open_schema` checks a newly connected file before anything is
written to it: that it is SQLite, ours, intact (`quick_check`) and no newer than this schedlang;
then, unless it is read only, it switches the file to WAL and creates or upgrades the tables.
`explain` turns SQLite's errors into messages that name the file and what to do.
"""

from __future__ import annotations

import difflib
import sqlite3
import time
from collections.abc import Collection
from pathlib import Path

from schedlang.core.diagnostics import SchedlangError

SCHEMA_VERSION = 3  # 2: claims; 3: ops, models, model_timings
# "SCHL" in PRAGMA application_id tells our files from other programs' SQLite databases.
APPLICATION_ID = 0x5343484C
TABLES = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY,
    op_key TEXT NOT NULL,
    op_name TEXT NOT NULL,
    target_key TEXT NOT NULL,
    target TEXT NOT NULL,
    schedule TEXT NOT NULL,
    knobs TEXT NOT NULL,
    template TEXT,
    status TEXT NOT NULL,
    reason TEXT NOT NULL,
    latencies_s TEXT NOT NULL,
    median_s REAL,
    gflops REAL,
    proposer TEXT NOT NULL,
    seed INTEGER,
    created_at REAL NOT NULL,
    schedlang_version TEXT NOT NULL,
    tvm_version TEXT NOT NULL,
    extra TEXT NOT NULL,
    UNIQUE (op_key, target_key, schedule)
);
CREATE INDEX IF NOT EXISTS records_by_op_target ON records (op_key, target_key, status, median_s);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    op_key TEXT NOT NULL,
    target_key TEXT NOT NULL,
    seed INTEGER,
    proposer TEXT NOT NULL,
    settings TEXT NOT NULL,
    started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
    run_id INTEGER NOT NULL REFERENCES runs (id),
    seq INTEGER NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS claims (
    op_key TEXT NOT NULL,
    target_key TEXT NOT NULL,
    schedule TEXT NOT NULL,
    owner TEXT NOT NULL,
    claimed_at REAL NOT NULL,
    PRIMARY KEY (op_key, target_key, schedule)
);
CREATE TABLE IF NOT EXISTS ops (
    op_key TEXT PRIMARY KEY,
    op_name TEXT NOT NULL,
    script TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS models (
    id INTEGER PRIMARY KEY,
    model_key TEXT NOT NULL,
    name TEXT NOT NULL,
    target_key TEXT NOT NULL,
    tasks TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS model_timings (
    id INTEGER PRIMARY KEY,
    model_key TEXT NOT NULL,
    target_key TEXT NOT NULL,
    label TEXT NOT NULL,
    median_s REAL,
    skipped TEXT,
    created_at REAL NOT NULL
);
"""
ANOTHER_PATH = "move the file away, or pass --db another path (or set SCHEDLANG_DB)"


class DamagedDatabaseError(SchedlangError):
    """The file is a database SQLite cannot wholly read: truncated, overwritten, bad log."""

    def __init__(self, path: Path, problem: str):
        super().__init__(
            f"the tuning database {path} is damaged: {problem}",
            f"save the records that can still be read: `schedlang history --db {path} "
            "--format json > records.json`",
            f"then move the file aside (`mv {path} {path}.damaged`, and its -wal file if there is "
            "one); the next run starts a new database",
        )


def open_schema(
    conn: sqlite3.Connection,
    path: Path,
    *,
    read_only: bool,
    timeout_s: float,
    columns: Collection[str],
) -> bool:
    """Check the file is ours and current, switch to WAL, make the schema; True if new. Read
    only, an older schema is read as it is if its records table has every one of `columns`."""
    # Reading the header first: a file that is not SQLite fails here, and another
    # program's database is left as it was (journal_mode=WAL would change it).
    # One statement, one snapshot: another tuner may be creating the schema right now.
    app_id, version, tables = conn.execute(
        "SELECT * FROM pragma_application_id, pragma_user_version, "
        "(SELECT count(*) FROM sqlite_master)"
    ).fetchone()
    created = app_id == 0 and tables == 0
    if created and read_only:
        raise SchedlangError(
            f"{path} holds no tuning records: it is an empty database",
            "`schedlang tune --db PATH` starts a tuning database",
        )
    if app_id != APPLICATION_ID and not created:
        raise SchedlangError(
            f"{path} is not a schedlang database: it is another program's SQLite database",
            ANOTHER_PATH,
        )
    if not created:
        # Cheap (~50 ms for 10,000 records): structural damage is found here, before a
        # tuner adds to a broken file. A damaged row is found when it is read.
        problems = [text for (text,) in conn.execute("PRAGMA quick_check(5)")]
        if problems != ["ok"]:
            raise DamagedDatabaseError(path, "; ".join(problems))
    if version > SCHEMA_VERSION:
        raise SchedlangError(
            f"{path} was written by a newer schedlang (database schema {version}, "
            f"this schedlang reads schema {SCHEMA_VERSION})",
            "upgrade schedlang, or pass --db another path",
        )
    if read_only:
        _check_readable(conn, path, version, columns)
        return False
    _switch_to_wal(conn, timeout_s)
    conn.execute("PRAGMA synchronous=NORMAL")  # under WAL: durable across kill -9
    conn.execute("PRAGMA foreign_keys=ON")
    if version < SCHEMA_VERSION:
        # Two tuners may create the same new file at once; IF NOT EXISTS makes it harmless.
        conn.executescript(
            f"BEGIN IMMEDIATE; {TABLES} PRAGMA application_id={APPLICATION_ID}; "
            f"PRAGMA user_version={SCHEMA_VERSION}; COMMIT;"
        )
    return created


def _check_readable(
    conn: sqlite3.Connection, path: Path, version: int, columns: Collection[str]
) -> None:
    """An older schema is read as it is, if it has every column a record needs."""
    present = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
    missing = [name for name in columns if name not in present]
    if version < SCHEMA_VERSION and missing:
        raise SchedlangError(
            f"{path} has an older database schema (version {version}, this schedlang "
            f"reads version {SCHEMA_VERSION}) and cannot be read without upgrading it",
            "open it once for writing to upgrade it (any `schedlang tune --db PATH` does), "
            "or upgrade a copy of it",
        )


def _switch_to_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    # Leaving rollback mode needs an exclusive lock, and SQLite answers "locked" at once, without
    # waiting, when another process is doing the same: the busy timeout does not cover this step.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def explain(
    err: sqlite3.DatabaseError, path: Path, *, read_only: bool, timeout_s: float
) -> SchedlangError:
    """SQLite's error on the file at `path` as a SchedlangError that says what to do."""
    text = str(err)
    if "malformed" in text or "Could not decode" in text:
        return DamagedDatabaseError(path, text)
    if "not a database" in text:
        return SchedlangError(f"{path} is not a schedlang database: {text}", ANOTHER_PATH)
    if "locked" in text or "busy" in text:
        return SchedlangError(
            f"the tuning database {path} stayed locked for {timeout_s:g} s",
            "another schedlang process is writing to it; wait for it, or use --db another path",
        )
    if read_only and "readonly" in text:
        return SchedlangError(f"the tuning database {path} is open read-only: {text}")
    if read_only and "unable to open" in text:
        return SchedlangError(f"cannot read the tuning database {path}: {text}")
    if "readonly" in text or "unable to open" in text:
        return SchedlangError(
            f"cannot write to the tuning database {path}: {text}",
            "make it writable, or use --db another path (or set SCHEDLANG_DB)",
        )
    return SchedlangError(f"tuning database {path}: {text}")


def missing_database(path: Path) -> SchedlangError:
    """No file at `path` to read: a near name in its folder, if there is one."""
    notes = []
    if path.parent.is_dir():
        nearby = sorted(p.name for p in path.parent.glob("*.db") if p.is_file())
        for name in difflib.get_close_matches(path.name, nearby, n=1):
            notes.append(f"did you mean `{path.parent / name}`?")
    notes.append("check --db (or SCHEDLANG_DB); `schedlang tune` starts a new database")
    return SchedlangError(f"no tuning database at {path}", *notes)
