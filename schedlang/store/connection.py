"""The SQLite file under a tuning database (schedlang.store.db.Database): opened in WAL mode,
read-only where asked, one thread at a time, and followed when it is deleted or replaced.

WAL needs shared memory between the processes, so keep the file on a local disk, not NFS. Damage is
reported, never papered over: a file SQLite finds malformed, or a write-ahead log with a damaged
frame (SQLite would silently drop the transactions after it) raises `DamagedDatabaseError`
(schedlang.store.schema). A file deleted while open is put back before the next write (SQLite would
go on writing to the deleted file, and the records would vanish on close); a file replaced by
another one stops the writer, which saves its copy beside it.

A read-only file (shipped with a project, on a read-only mount) is never created, migrated or
written to, and a missing one is an error naming the path rather than a new, empty database.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from schedlang.core.diagnostics import SchedlangError
from schedlang.store.records import record_columns
from schedlang.store.salvage import wal_damage
from schedlang.store.schema import DamagedDatabaseError, explain, missing_database, open_schema

log = logging.getLogger(__name__)


class DatabaseFile:
    """One connection to a tuning database file; created, with its parent folders, when missing
    (unless `read_only`). `created` says whether it was."""

    def __init__(self, path: Path, *, timeout_s: float, read_only: bool):
        self.path = path
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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
