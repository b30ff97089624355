"""The persistent tuning database: every measured schedule, keyed by (op, target, schedule text).

One SQLite file in WAL mode. Each `add` is its own committed transaction, so a tuner killed with
`kill -9` loses nothing it was told was saved, and a schedule already in the file is never measured
twice. Two tuners may share one file: a writer waits up to `timeout_s` for the other instead of
failing. WAL needs shared memory between the processes, so keep the file on a local disk, not NFS.

    with Database(default_db_path()) as db:
        db.add(record)  # a schedlang.store.records.Record
        fastest = db.best(op_key(func), target.key, n=5)

Seeded tuning runs log each random decision in order (`start_run`, `log_decision`, `decisions`),
so a run can be replayed and compared with its log.

Damage is reported, never papered over: a file SQLite finds malformed, a row that no longer
decodes, or a write-ahead log with a damaged frame (SQLite would silently drop the transactions
after it) raises `DamagedDatabaseError` (schedlang.store.schema), whose notes say how to save what
is left (`schedlang history --format json`, which reads damaged files through
`schedlang.store.salvage`). A file deleted while open is put back before the next write (SQLite
would go on writing to the deleted file, and the records would vanish on close); a file replaced
by another one stops the writer, which saves its copy beside it.

`Database(path, read_only=True)` reads a file it may not write to (shipped with a project, on a
read-only mount): it never creates the file, migrates its schema or writes to it, and a missing
file is an error naming the path rather than a new, empty database.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal

from schedlang.core.diagnostics import SchedlangError
from schedlang.store.records import (
    Record,
    Status,
    dumps,
    export_csv,
    export_json,
    record_columns,
    record_from_row,
    row_of,
)
from schedlang.store.report_tables import ReportTables
from schedlang.store.salvage import salvage, wal_damage
from schedlang.store.schema import DamagedDatabaseError, explain, missing_database, open_schema

log = logging.getLogger(__name__)

_MAX_FIELD_WARNINGS = 20  # per Database: one line per damaged record, up to this many


def default_db_path() -> Path:
    """`$SCHEDLANG_DB`, else `$XDG_CACHE_HOME/schedlang/schedlang.db` (`~/.cache` by default)."""
    if os.environ.get("SCHEDLANG_DB"):
        return Path(os.environ["SCHEDLANG_DB"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "schedlang" / "schedlang.db"


class Database(ReportTables):
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
                raise missing_database(self.path)
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
            return open_schema(
                conn,
                self.path,
                read_only=self.read_only,
                timeout_s=self.timeout_s,
                columns=record_columns(),
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
        return explain(err, self.path, read_only=self.read_only, timeout_s=self.timeout_s)

    # Records.

    def add(self, record: Record) -> int:
        """Save `record` and return its id; if its schedule is already saved, the existing id."""
        data = row_of(record)
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

    def select(self, tail: str, params: tuple = ()) -> list[Record]:
        """The records of `SELECT * FROM records {tail}`, for a query no method here makes."""
        return self._select(tail, params)

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
                records.append(record_from_row(data, problems))
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
                (op_key, target_key, seed, proposer, dumps(settings), time.time()),
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
            count = _copy_out(conn, saved, self.path, what)
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


def salvage_records(path: str | os.PathLike[str]) -> tuple[list[Record], int, bool]:
    """(records, lost, exact): every record of a damaged database file that can still be read,
    how many could not, and whether that count is exact rather than a lower bound. The file is
    not written to (see schedlang.store.salvage)."""
    columns = record_columns()
    rows, lost, exact = salvage(Path(path), columns)
    records = []
    for row in rows:
        problems: list[str] = []
        try:
            record = record_from_row(row, problems)
        except (ValueError, TypeError, KeyError, RecursionError):
            problems.append("does not decode")
        # In a file SQLite cannot read whole, a damaged field means a damaged row: a record
        # salvaged from it is exactly what was saved, or it is counted as lost.
        if problems:
            lost += 1
        else:
            records.append(record)
    return records, lost, exact


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


def _copy_out(conn: sqlite3.Connection, saved: Path, path: Path, what: str) -> int:
    """Back the database open on `conn` up to `saved` and close `conn`; its count of records.
    `path` and `what` ("deleted", ...) word the error when the copy cannot be read."""
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
            f"the tuning database {path} was {what} while this process was using "
            f"it, and this process can no longer read its copy ({err})",
            "move or delete a tuning database only with its -wal and -shm files, and not "
            "while a tuner is using it",
        ) from None
    finally:
        conn.close()
    return count


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


def _where(
    op_key: str | None, target_key: str | None, status: Status | str | None
) -> tuple[str, tuple]:
    filters = {"op_key": op_key, "target_key": target_key, "status": status}
    given = {column: value for column, value in filters.items() if value is not None}
    if "status" in given:
        given["status"] = Status(given["status"]).value
    where = " AND ".join(f"{column} = ?" for column in given)
    return (f"WHERE {where}" if where else "WHERE 1"), tuple(given.values())
