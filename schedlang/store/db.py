"""The persistent tuning database: every measured schedule, keyed by (op, target, schedule text).

One SQLite file in WAL mode. Each `add` is its own committed transaction, so a tuner killed with
`kill -9` loses nothing it was told was saved, and a schedule already in the file is never measured
twice. Two tuners may share one file: a writer waits up to `timeout_s` for the other instead of
failing. WAL needs shared memory between the processes, so keep the file on a local disk, not NFS.

    with Database(default_db_path()) as db:
        db.add(record)
        fastest = db.best(op_key(func), target.key, n=5)

Seeded tuning runs log each random decision in order (`start_run`, `log_decision`, `decisions`),
so a run can be replayed and compared with its log.

Damage is reported, never papered over: a file SQLite finds malformed, a row that no longer
decodes, or a write-ahead log with a damaged frame (SQLite would silently drop the transactions
after it) raises `DamagedDatabaseError`, whose notes say how to save what is left
(`schedlang history --format json`, which reads damaged files through `schedlang.store.salvage`). A
file
deleted while open is put back before the next write (SQLite would go on writing to the deleted
file, and the records would vanish on close); a file replaced by another one stops the writer,
which saves its copy beside it.

`Database(path, read_only=True)` reads a file it may not write to (shipped with a project, on a
read-only mount): it never creates the file, migrates its schema or writes to it, and a missing
file is an error naming the path rather than a new, empty database.
"""

from __future__ import annotations

import csv
import difflib
import json
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, Literal

from schedlang.core.diagnostics import SchedlangError
from schedlang.store.salvage import salvage, wal_damage

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # 2: claims
# "SCHL" in PRAGMA application_id tells our files from other programs' SQLite databases.
_APPLICATION_ID = 0x5343484C
_JSON_FIELDS = ("target", "knobs", "latencies_s", "extra")
_SCHEMA = """
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
"""
_ANOTHER_PATH = "move the file away, or pass --db another path (or set SCHEDLANG_DB)"
# Fields a record can be read without, and what it gets instead when one of them is damaged (text
# where a number belongs: SQLite stores whatever it is given). The others (op_key, target_key,
# schedule, status) say what the record is: without them it cannot be read at all.
_NUMBER_FIELDS = {"median_s": None, "gflops": None, "created_at": 0.0}
_TEXT_FIELDS = {"op_name": "?", "reason": "", "proposer": "?", "schedlang_version": "?"}
_TEXT_FIELDS |= {"tvm_version": "?", "template": None}
_MAX_FIELD_WARNINGS = 20  # per Database: one line per damaged record, up to this many


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


class Status(StrEnum):
    OK = "ok"
    WRONG = "wrong"  # ran, but the result differs from the reference
    CRASH = "crash"
    TIMEOUT = "timeout"
    BUILD_ERROR = "build_error"
    CHECK_ERROR = "check_error"  # the schedule has diagnostics
    RUN_ERROR = "run_error"


@dataclass(frozen=True)
class Record:
    """One measured (or rejected) schedule of one op on one target."""

    op_key: str
    op_name: str
    target_key: str  # canonical JSON of the TVM target dict, `Target.key`
    target: dict
    schedule: str  # the concrete DSL text, canonically printed
    knobs: dict[str, int]
    template: str | None  # the template DSL the schedule was instantiated from
    status: Status
    reason: str  # one line; "" when ok
    latencies_s: tuple[float, ...]
    median_s: float | None
    gflops: float | None
    proposer: str  # "builtin", "human", "template", "model:<name>"
    seed: int | None
    created_at: float
    schedlang_version: str
    tvm_version: str
    extra: dict = field(default_factory=dict)  # JSON: raw model text, diagnostics, run id, ...
    id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "latencies_s", tuple(float(t) for t in self.latencies_s))

    @property
    def is_ok(self) -> bool:
        return self.status is Status.OK

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["latencies_s"] = list(self.latencies_s)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def default_db_path() -> Path:
    """`$SCHEDLANG_DB`, else `$XDG_CACHE_HOME/schedlang/schedlang.db` (`~/.cache` by default)."""
    if os.environ.get("SCHEDLANG_DB"):
        return Path(os.environ["SCHEDLANG_DB"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "schedlang" / "schedlang.store.db"


def op_key(func: Any) -> str:
    """A structural hash of a PrimFunc, as 16 hex digits.

    Equal computations give equal keys however they were built; buffer and variable names do not
    count (structural equality ignores them), nor does the symbol name the function is called by.
    """
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(func.without_attr('global_symbol')) & (2**64 - 1):016x}"


def current_versions() -> tuple[str, str]:
    """(schedlang version, TVM version), for `Record.schedlang_version` and `tvm_version`."""
    import tvm

    from schedlang import __version__

    return __version__, tvm.__version__


class Database:
    """A tuning database file; created, with its parent folders, when missing.

    With `read_only=True` the file must exist, and is only read: no schema is created or
    upgraded, and `add`, `start_run` and `log_decision` raise SchedlangError.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout_s: float = 30.0,
        read_only: bool = False,
    ):
        self.path = Path(path) if path is not None else default_db_path()
        self.timeout_s = timeout_s
        self.read_only = read_only
        self._lock = threading.Lock()
        if read_only:
            if not self.path.is_file():
                raise _missing_database(self.path)
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise SchedlangError(
                    f"cannot create the folder of the tuning database {self.path}: {err.strerror}",
                    "use --db another path (or set SCHEDLANG_DB)",
                ) from None
        self._conn: sqlite3.Connection | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) of the file open
        # `_stamp` of a file read with immutable=1, which assumes nobody writes to it.
        self._immutable_stamp: tuple[int, int, bool] | None = None
        self._warned: set[int | None] = set()  # records whose damaged fields were reported
        self.created = self._connect()

    def _connect(self) -> bool:
        """Open the file at self.path; True if it was created."""
        problem = wal_damage(Path(f"{self.path}-wal"))
        if problem:
            time.sleep(0.05)  # a writer in another process may have been half-way: look again
            if problem := wal_damage(Path(f"{self.path}-wal")):
                raise DamagedDatabaseError(self.path, f"in its log {self.path}-wal, {problem}")
        if self.read_only:
            self._connect_read_only(immutable=not Path(f"{self.path}-wal").exists())
            return False
        with self._sql():
            self._conn = sqlite3.connect(
                self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
            )
        try:
            created = self._open()
        except BaseException:
            self.close()
            raise
        self._file = _identity(self.path)
        return created

    def _connect_read_only(self, immutable: bool) -> None:
        """Open self.path with SQLite's mode=ro, or immutable=1 when that cannot or need not be.

        mode=ro on a WAL database makes -wal and -shm files beside it (and leaves them), and
        cannot open it at all in a read-only folder where they do not exist yet. Without a -wal
        file no connection has the file open, so immutable=1 reads it making nothing beside it;
        a writer starting meanwhile is caught by `_read`, which then reads again with mode=ro.
        With a -wal file, another process may be writing through it: share its log with mode=ro.
        """
        stamp = _stamp(self.path)
        uri = f"{self.path.resolve().as_uri()}?mode=ro{'&immutable=1' if immutable else ''}"
        self.close()
        with self._sql():
            self._conn = sqlite3.connect(
                uri, uri=True, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
            )
        try:
            self._open()
        except SchedlangError as err:
            self.close()
            wal = Path(f"{self.path}-wal")
            if immutable or "unable to open" not in err.message:
                raise
            # The folder is read-only, so SQLite cannot make the -shm file it shares with writers.
            if wal.is_file() and wal.stat().st_size > 0:
                raise SchedlangError(
                    f"cannot read the tuning database {self.path}: records in its log {wal} can "
                    "only be read where SQLite may create files beside it, and its folder is "
                    "read-only",
                    f"copy {self.path} and {wal} to a writable folder and read the copy",
                ) from None
            self._connect_read_only(immutable=True)
            return
        except BaseException:
            self.close()
            raise
        self._file = _identity(self.path)
        self._immutable_stamp = stamp if immutable else None

    def _open(self) -> bool:
        """Check the file is ours and current, switch to WAL, make the schema; True if new."""
        with self._sql() as conn:
            # Reading the header first: a file that is not SQLite fails here, and another
            # program's database is left as it was (journal_mode=WAL would change it).
            # One statement, one snapshot: another tuner may be creating the schema right now.
            app_id, version, tables = conn.execute(
                "SELECT * FROM pragma_application_id, pragma_user_version, "
                "(SELECT count(*) FROM sqlite_master)"
            ).fetchone()
            created = app_id == 0 and tables == 0
            if created and self.read_only:
                raise SchedlangError(
                    f"{self.path} holds no tuning records: it is an empty database",
                    "`schedlang tune --db PATH` starts a tuning database",
                )
            if app_id != _APPLICATION_ID and not created:
                raise SchedlangError(
                    f"{self.path} is not a schedlang database: it is another program's SQLite "
                    "database",
                    _ANOTHER_PATH,
                )
            if not created:
                # Cheap (~50 ms for 10,000 records): structural damage is found here, before a
                # tuner adds to a broken file. A damaged row is found when it is read.
                problems = [text for (text,) in conn.execute("PRAGMA quick_check(5)")]
                if problems != ["ok"]:
                    raise DamagedDatabaseError(self.path, "; ".join(problems))
            if version > SCHEMA_VERSION:
                raise SchedlangError(
                    f"{self.path} was written by a newer schedlang (database schema {version}, "
                    f"this schedlang reads schema {SCHEMA_VERSION})",
                    "upgrade schedlang, or pass --db another path",
                )
            if self.read_only:
                self._check_readable(conn, version)
                return False
            _switch_to_wal(conn, self.timeout_s)
            conn.execute("PRAGMA synchronous=NORMAL")  # under WAL: durable across kill -9
            conn.execute("PRAGMA foreign_keys=ON")
            if version < SCHEMA_VERSION:
                # Two tuners may create the same new file at once; IF NOT EXISTS makes it harmless.
                conn.executescript(
                    f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA application_id={_APPLICATION_ID}; "
                    f"PRAGMA user_version={SCHEMA_VERSION}; COMMIT;"
                )
        return created

    def _check_readable(self, conn: sqlite3.Connection, version: int) -> None:
        """An older schema is read as it is, if it has every column a record needs."""
        columns = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
        missing = [f.name for f in fields(Record) if f.name not in columns]
        if version < SCHEMA_VERSION and missing:
            raise SchedlangError(
                f"{self.path} has an older database schema (version {version}, this schedlang "
                f"reads version {SCHEMA_VERSION}) and cannot be read without upgrading it",
                "open it once for writing to upgrade it (any `schedlang tune --db PATH` does), "
                "or upgrade a copy of it",
            )

    @contextmanager
    def _sql(self) -> Iterator[sqlite3.Connection]:
        """One thread at a time on the connection; sqlite3 errors become SchedlangErrors."""
        with self._lock:
            try:
                yield self._conn  # type: ignore[misc]
            except sqlite3.ProgrammingError:
                raise
            except sqlite3.DatabaseError as err:
                raise self._explain(err) from None
            except UnicodeDecodeError:  # SQLite's message quoting a damaged schema, say
                raise DamagedDatabaseError(self.path, "it holds text that is not UTF-8") from None

    def _explain(self, err: sqlite3.DatabaseError) -> SchedlangError:
        text = str(err)
        if "malformed" in text or "Could not decode" in text:
            return DamagedDatabaseError(self.path, text)
        if "not a database" in text:
            return SchedlangError(f"{self.path} is not a schedlang database: {text}", _ANOTHER_PATH)
        if "locked" in text or "busy" in text:
            return SchedlangError(
                f"the tuning database {self.path} stayed locked for {self.timeout_s:g} s",
                "another schedlang process is writing to it; wait for it, or use --db another path",
            )
        if self.read_only and "readonly" in text:
            return SchedlangError(f"the tuning database {self.path} is open read-only: {text}")
        if self.read_only and "unable to open" in text:
            return SchedlangError(f"cannot read the tuning database {self.path}: {text}")
        if "readonly" in text or "unable to open" in text:
            return SchedlangError(
                f"cannot write to the tuning database {self.path}: {text}",
                "make it writable, or use --db another path (or set SCHEDLANG_DB)",
            )
        return SchedlangError(f"tuning database {self.path}: {text}")

    # Records.

    def add(self, record: Record) -> int:
        """Save `record` and return its id; if its schedule is already saved, the existing id."""
        data = record.to_json()
        del data["id"]
        for name in _JSON_FIELDS:
            data[name] = _dumps(data[name])
        columns = ", ".join(data)
        sql = (
            f"INSERT INTO records ({columns}) VALUES ({', '.join('?' * len(data))}) "
            "ON CONFLICT (op_key, target_key, schedule) DO NOTHING"
        )
        self._follow_file()
        with self._sql() as conn:
            cursor = conn.execute(sql, tuple(data.values()))
            if cursor.rowcount == 1:
                return int(cursor.lastrowid)  # type: ignore[arg-type]
        existing = self.get(record.op_key, record.target_key, record.schedule)
        assert existing is not None and existing.id is not None  # rows are never deleted
        return existing.id

    # Claims: two tuners on one database measure different candidates.

    def claim(
        self, op_key: str, target_key: str, schedule: str, owner: str, stale_after_s: float
    ) -> bool:
        """Whether `owner` may measure `schedule` now: True, and the schedule is claimed, when it
        has no record and no other owner claimed it less than `stale_after_s` ago (a claim older
        than that belongs to a tuner that died). `release` ends the claim."""
        self._follow_file()
        key = (op_key, target_key, schedule)
        where = "WHERE op_key = ? AND target_key = ? AND schedule = ?"
        now = time.time()
        with self._sql() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                measured = conn.execute(f"SELECT 1 FROM records {where}", key).fetchone()
                held = conn.execute(f"SELECT owner, claimed_at FROM claims {where}", key).fetchone()
                free = not measured and (
                    held is None
                    or held[0] == owner
                    or now - held[1] >= stale_after_s
                    or not _owner_alive(held[0])
                )
                if free:
                    conn.execute(
                        "INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)", (*key, owner, now)
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return free

    def release(self, owner: str, schedule: str | None = None) -> None:
        """End `owner`'s claim on `schedule`, or all its claims."""
        self._follow_file()
        with self._sql() as conn:
            if schedule is None:
                conn.execute("DELETE FROM claims WHERE owner = ?", (owner,))
            else:
                conn.execute(
                    "DELETE FROM claims WHERE owner = ? AND schedule = ?", (owner, schedule)
                )

    def get(self, op_key: str, target_key: str, schedule: str) -> Record | None:
        found = self._select(
            "WHERE op_key = ? AND target_key = ? AND schedule = ?", (op_key, target_key, schedule)
        )
        return found[0] if found else None

    def has(self, op_key: str, target_key: str, schedule: str) -> bool:
        return self.get(op_key, target_key, schedule) is not None

    def records(
        self,
        op_key: str | None = None,
        target_key: str | None = None,
        status: Status | str | None = None,
        limit: int | None = None,
        order: Literal["time", "speed"] = "time",
    ) -> list[Record]:
        """Records matching every filter given; "time" oldest first, "speed" fastest first."""
        orders = {"time": "created_at, id", "speed": "median_s IS NULL, median_s, id"}
        if order not in orders:
            raise ValueError(f"order must be 'time' or 'speed', not {order!r}")
        where, params = _where(op_key, target_key, status)
        limit_sql = " LIMIT ?" if limit is not None else ""
        params += (limit,) if limit is not None else ()
        return self._select(f"{where} ORDER BY {orders[order]}{limit_sql}", params)

    def best(self, op_key: str, target_key: str, n: int = 1) -> list[Record]:
        """The `n` fastest correct records of this op on exactly this target."""
        where, params = _where(op_key, target_key, Status.OK)
        # typeof: a damaged median_s (text, a blob) sorts after every number but is not NULL.
        return self._select(
            f"{where} AND typeof(median_s) IN ('real', 'integer') ORDER BY median_s, id LIMIT ?",
            (*params, n),
        )

    def count(
        self,
        op_key: str | None = None,
        target_key: str | None = None,
        status: Status | str | None = None,
    ) -> int:
        where, params = _where(op_key, target_key, status)
        _, rows = self._read(f"SELECT count(*) FROM records {where}", params)
        return rows[0][0]

    def versions_of(self, op_name: str) -> list[tuple[str, str, int]]:
        """(op_key, target_key, verified records) for every op named `op_name`: the shapes (or
        definitions) of an op that were tuned, and on which targets; says why `best` found none."""
        _, rows = self._read(
            "SELECT op_key, target_key, count(*) FROM records WHERE op_name = ? AND status = ? "
            "GROUP BY op_key, target_key ORDER BY op_key, target_key",
            (op_name, Status.OK.value),
        )
        return [(key, target_key, int(count)) for key, target_key, count in rows]

    def _read(self, sql: str, params: tuple) -> tuple[list[str], list[tuple]]:
        """(column names, rows) of one query."""
        try:
            with self._sql() as conn:
                cursor = conn.execute(sql, params)
                try:
                    names = [column[0] for column in cursor.description]
                    rows = cursor.fetchall()
                finally:  # a row that fails to decode would keep the statement, and the file, open
                    cursor.close()
        except SchedlangError:
            if not self._written_while_immutable():
                raise
            return self._read(sql, params)
        if self._written_while_immutable():
            return self._read(sql, params)
        return names, rows

    def _written_while_immutable(self) -> bool:
        """True, and switched to mode=ro, if a writer opened a file read with immutable=1."""
        if self._immutable_stamp is None or _stamp(self.path) == self._immutable_stamp:
            return False
        self._connect_read_only(immutable=False)
        return True

    def _select(self, tail: str, params: tuple) -> list[Record]:
        names, rows = self._read(f"SELECT * FROM records {tail}", params)
        records = []
        for row in rows:
            data = dict(zip(names, row, strict=True))
            problems: list[str] = []
            try:
                records.append(_record_from_row(data, problems))
            except (ValueError, TypeError, KeyError, RecursionError) as err:
                raise DamagedDatabaseError(
                    self.path, f"record #{data.get('id')} does not decode ({err})"
                ) from None
            if problems and data.get("id") not in self._warned:
                self._warned.add(data.get("id"))
                _warn_damaged_fields(self.path, data.get("id"), problems, len(self._warned))
        return records

    # Seeded tuning runs and their logged decisions.

    def start_run(
        self, op_key: str, target_key: str, seed: int | None, proposer: str, settings: dict
    ) -> int:
        self._follow_file()
        with self._sql() as conn:
            cursor = conn.execute(
                "INSERT INTO runs (op_key, target_key, seed, proposer, settings, started_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (op_key, target_key, seed, proposer, _dumps(settings), time.time()),
            )
            return int(cursor.lastrowid)  # type: ignore[arg-type]

    def log_decision(self, run_id: int, text: str) -> None:
        """Append one decision to the run's log (committed at once, like `add`)."""
        self._follow_file()
        with self._sql() as conn:
            conn.execute(
                "INSERT INTO decisions (run_id, seq, text) "
                "SELECT ?, coalesce(max(seq) + 1, 0), ? FROM decisions WHERE run_id = ?",
                (run_id, text, run_id),
            )

    def decisions(self, run_id: int) -> list[str]:
        _, rows = self._read("SELECT text FROM decisions WHERE run_id = ? ORDER BY seq", (run_id,))
        return [text for (text,) in rows]

    def runs(self, op_key: str | None = None, target_key: str | None = None) -> list[dict]:
        """The runs started with `start_run`, oldest first: id, op_key, target_key, seed,
        proposer, settings (decoded) and started_at."""
        where, params = _where(op_key, target_key, None)
        names, rows = self._read(f"SELECT * FROM runs {where} ORDER BY id", params)
        runs = [dict(zip(names, row, strict=True)) for row in rows]
        for run in runs:
            run["settings"] = json.loads(run["settings"])
        return runs

    # Export, and closing.

    @staticmethod
    def export_json(records: Iterable[Record], fp: IO[str]) -> None:
        export_json(records, fp)

    @staticmethod
    def export_csv(records: Iterable[Record], fp: IO[str]) -> None:
        export_csv(records, fp)

    def close(self) -> None:
        if self._conn is not None and not self.read_only:
            try:
                self._follow_file()  # the last record may have gone to a deleted file
            except SchedlangError as err:
                log.warning("%s", err.render())
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _follow_file(self) -> None:
        """Make sure the file at self.path is still the one open; called before each write.

        SQLite goes on writing to a database file that was deleted (or moved away) while open,
        and what it writes vanishes when the connection closes. If the file is gone, a copy of
        the open database (every record this connection sees) is put back at the same path, and
        writing goes on there. If another file has taken its place, the copy is saved beside it
        and a SchedlangError says where: two databases are not merged behind the user's back.
        """
        now = _identity(self.path)
        if self._conn is None or self._file is None or now == self._file:
            return
        what = "deleted" if now is None else "replaced by another file"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        saved = self.path.with_name(f"{self.path.name}.saved-{stamp}-{os.getpid()}")
        with self._lock:
            conn, self._conn, self._file = self._conn, None, None
            try:
                count = conn.execute("SELECT count(*) FROM records").fetchone()[0]
                copy = sqlite3.connect(saved)
                try:
                    conn.backup(copy)
                finally:
                    copy.close()
            except sqlite3.DatabaseError as err:
                # Another connection opened the -wal file this one was using (it was left at
                # its name): SQLite cannot keep two files apart that share one log.
                saved.unlink(missing_ok=True)
                raise SchedlangError(
                    f"the tuning database {self.path} was {what} while this process was using "
                    f"it, and this process can no longer read its copy ({err})",
                    "move or delete a tuning database only with its -wal and -shm files, and not "
                    "while a tuner is using it",
                ) from None
            finally:
                conn.close()
        if now is None:
            # The deleted file's -wal and -shm stay behind (SQLite keeps them for a file it finds
            # unlinked): left there, the log would be replayed into the copy. Everything in them
            # is in the copy; a process that still has them open keeps them until it closes.
            for end in ("-wal", "-shm"):
                Path(f"{self.path}{end}").unlink(missing_ok=True)
            try:
                os.link(saved, self.path)  # fails if a file appeared there meanwhile
            except FileExistsError:
                pass
            else:
                saved.unlink()
                self._connect()
                log.warning(
                    "the tuning database %s was deleted while in use: put back a copy of it "
                    "(%d records) and went on",
                    self.path,
                    count,
                )
                return
        raise SchedlangError(
            f"the tuning database {self.path} was {what} while this process was using it",
            f"this process's copy of it, {count} records, is saved in {saved}",
            f"`schedlang history --db {saved}` lists them; move it back to {self.path} to go on "
            "with it",
        )

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def export_json(records: Iterable[Record], fp: IO[str]) -> None:
    json.dump([record.to_json() for record in records], fp, indent=2)
    fp.write("\n")


def export_csv(records: Iterable[Record], fp: IO[str]) -> None:
    """One row per record; latencies `;`-joined, dicts as JSON, None as an empty cell."""
    writer = csv.writer(fp)
    writer.writerow([f.name for f in fields(Record)])
    for record in records:
        row = []
        for name, value in record.to_json().items():
            if name == "latencies_s":
                value = ";".join(repr(t) for t in value)
            elif isinstance(value, dict):
                value = _dumps(value)
            row.append("" if value is None else value)
        writer.writerow(row)


def salvage_records(path: str | os.PathLike[str]) -> tuple[list[Record], int, bool]:
    """(records, lost, exact): every record of a damaged database file that can still be read,
    how many could not, and whether that count is exact rather than a lower bound. The file is
    not written to (see schedlang.store.salvage)."""
    columns = tuple(f.name for f in fields(Record))
    rows, lost, exact = salvage(Path(path), columns)
    records = []
    for row in rows:
        problems: list[str] = []
        try:
            record = _record_from_row(row, problems)
        except (ValueError, TypeError, KeyError, RecursionError):
            problems.append("does not decode")
        # In a file SQLite cannot read whole, a damaged field means a damaged row: a record
        # salvaged from it is exactly what was saved, or it is counted as lost.
        if problems:
            lost += 1
        else:
            records.append(record)
    return records, lost, exact


def _record_from_row(data: dict[str, Any], problems: list[str] | None = None) -> Record:
    """A row as a Record. A damaged field it can do without is replaced (`_NUMBER_FIELDS`,
    `_TEXT_FIELDS`, {} or () for the JSON ones) and described in `problems`; one it cannot do
    without raises ValueError or TypeError."""
    problems = [] if problems is None else problems
    for name in ("op_key", "target_key", "schedule", "status"):
        if not isinstance(data.get(name), str):
            raise ValueError(f"{name} is {_shown(data.get(name))}, not text")
    for name, default in _NUMBER_FIELDS.items():
        value = data.get(name)
        if not (value is None and default is None) and not _is_number(value):
            problems.append(f"{name} is {_shown(value)}, not a number")
            data[name] = default
    for name, default in _TEXT_FIELDS.items():
        value = data.get(name)
        if not (value is None and default is None) and not isinstance(value, str):
            problems.append(f"{name} is {_shown(value)}, not text")
            data[name] = default
    if data.get("seed") is not None and not _is_int(data["seed"]):
        problems.append(f"seed is {_shown(data['seed'])}, not an integer")
        data["seed"] = None
    for name in _JSON_FIELDS:
        value, data[name] = data.get(name), {} if name != "latencies_s" else ()
        try:
            decoded = json.loads(value) if isinstance(value, str) else None
        except (ValueError, RecursionError):
            decoded = None
        if _json_field_ok(name, decoded):
            data[name] = decoded
        else:
            problems.append(f"{name} is {_shown(value)}, not {_JSON_KINDS[name]}")
    return Record.from_json(data)


_JSON_KINDS = {
    "target": "a JSON object",
    "knobs": "a JSON object of integers",
    "latencies_s": "a JSON list of numbers",
    "extra": "a JSON object",
}


def _json_field_ok(name: str, value: Any) -> bool:
    if name == "latencies_s":
        return isinstance(value, list) and all(_is_number(t) for t in value)
    if name == "knobs":
        return isinstance(value, dict) and all(_is_int(v) for v in value.values())
    return isinstance(value, dict)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    kind = {str: "text", bytes: "binary data", type(None): "missing"}.get(type(value), "")
    return f"{text} ({kind})" if kind and value is not None else kind or text


def _warn_damaged_fields(path: Path, record_id: Any, problems: list[str], count: int) -> None:
    if count > _MAX_FIELD_WARNINGS:
        return
    fields_text = "; ".join(problems)
    log.warning(
        "warning: the tuning database %s: record #%s has damaged fields, left out: %s%s",
        path,
        record_id,
        fields_text,
        "\n(further records with damaged fields are not listed)" * (count == _MAX_FIELD_WARNINGS),
    )


def claim_owner(run_id: int) -> str:
    """Who holds a claim: this host, this process and its tuning run."""
    return f"{socket.gethostname()}:{os.getpid()}:{run_id}"


def _owner_alive(owner: str) -> bool:
    """False when the claim's process ran on this host and has exited (a tuner stopped by Ctrl-C
    or killed: its rerun resumes at once); True otherwise, also for other hosts."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return True
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _missing_database(path: Path) -> SchedlangError:
    notes = []
    if path.parent.is_dir():
        nearby = sorted(p.name for p in path.parent.glob("*.db") if p.is_file())
        for name in difflib.get_close_matches(path.name, nearby, n=1):
            notes.append(f"did you mean `{path.parent / name}`?")
    notes.append("check --db (or SCHEDLANG_DB); `schedlang tune` starts a new database")
    return SchedlangError(f"no tuning database at {path}", *notes)


def _stamp(path: Path) -> tuple[int, int, bool] | None:
    """(mtime, size, whether a -wal file is beside it): changes when a writer opens the file."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size, Path(f"{path}-wal").exists()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


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


def _where(
    op_key: str | None, target_key: str | None, status: Status | str | None
) -> tuple[str, tuple]:
    filters = {"op_key": op_key, "target_key": target_key, "status": status}
    given = {column: value for column, value in filters.items() if value is not None}
    if "status" in given:
        given["status"] = Status(given["status"]).value
    where = " AND ".join(f"{column} = ?" for column in given)
    return (f"WHERE {where}" if where else "WHERE 1"), tuple(given.values())


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
