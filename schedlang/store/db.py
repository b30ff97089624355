"""The persistent tuning database: every measured schedule, keyed by (op, target, schedule text).

One SQLite file in WAL mode (schedlang.store.connection). Each `add` is its own committed
transaction, so a tuner killed with `kill -9` loses nothing it was told was saved, and a schedule
already in the file is never measured twice. Two tuners may share one file: a writer waits up to
`timeout_s` for the other instead of failing, and claims keep them from measuring one candidate
twice.

    with Database(default_db_path()) as db:
        db.add(record)  # a schedlang.store.records.Record
        fastest = db.best(op_key(func), target.key, n=5)

Seeded tuning runs log each random decision in order (`start_run`, `log_decision`, `decisions`),
so a run can be replayed and compared with its log.

A record that no longer decodes raises `DamagedDatabaseError` (schedlang.store.schema), whose
notes say how to save what is left (`schedlang history --format json`, which reads damaged files
through `schedlang.store.salvage`); a damaged file, a damaged log, a file deleted or replaced while
open, and `Database(path, read_only=True)`: see schedlang.store.connection.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, Literal

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
from schedlang.store.salvage import salvage
from schedlang.store.schema import DamagedDatabaseError

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
    upgraded, and `add`, `start_run` and `log_decision` raise SchedlangError. The file itself
    (opening, locking, following it when deleted) is schedlang.store.connection's.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout_s: float = 30.0,
        read_only: bool = False,
    ):
        self._warned: set[int | None] = set()  # records whose damaged fields were reported
        path = Path(path) if path is not None else default_db_path()
        super().__init__(path, timeout_s=timeout_s, read_only=read_only)

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

    # Export.

    @staticmethod
    def export_json(records: Iterable[Record], fp: IO[str]) -> None:
        export_json(records, fp)

    @staticmethod
    def export_csv(records: Iterable[Record], fp: IO[str]) -> None:
        export_csv(records, fp)


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


def _where(
    op_key: str | None, target_key: str | None, status: Status | str | None
) -> tuple[str, tuple]:
    filters = {"op_key": op_key, "target_key": target_key, "status": status}
    given = {column: value for column, value in filters.items() if value is not None}
    if "status" in given:
        given["status"] = Status(given["status"]).value
    where = " AND ".join(f"{column} = ?" for column in given)
    return (f"WHERE {where}" if where else "WHERE 1"), tuple(given.values())
