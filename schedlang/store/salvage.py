"""Damaged tuning databases: find the damage before SQLite drops records, read back what is left.

SQLite replays a write-ahead log (`<db>-wal`) up to the first frame whose checksum fails and
silently drops every transaction after it; on the next clean close it checkpoints and deletes the
log, and those records are gone. `wal_damage` looks at the log before SQLite does, so that
`schedlang.store.db.Database` can refuse to open the file instead.

`salvage` reads every record that can still be read from a damaged database, without writing to
it: it works on a copy (whose log has its checksums recomputed, so the transactions after a
damaged frame are replayed too) and fetches the rows one by one, skipping those on damaged pages.
`schedlang history` uses it to export what is left of a damaged file.

WAL format: https://www.sqlite.org/fileformat2.html#the_write_ahead_log
"""

from __future__ import annotations

import shutil
import sqlite3
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

_WAL_HEADER = 32
_FRAME_HEADER = 24
_WAL_MAGIC = (0x377F0682, 0x377F0683)  # checksums of little-, big-endian words


@dataclass(frozen=True)
class _Frame:
    offset: int
    commit: bool  # the last frame of a transaction
    salts_match: bool


def wal_damage(wal_path: Path) -> str:
    """Why SQLite would drop committed transactions from this log, or "" if it would not.

    A failing frame followed only by stale frames (an older generation's salts) or by frames of
    an unfinished transaction is a normal end of the log: a writer killed mid-commit leaves one.
    A failing frame followed by a committed transaction of the same generation is damage.
    """
    data = _read(wal_path)
    if len(data) <= _WAL_HEADER:
        return ""
    magic, _, page_size, _, salt1, salt2, *checksum = struct.unpack(">8I", data[:_WAL_HEADER])
    if magic not in _WAL_MAGIC or _checksum(data[:24], (0, 0), magic) != tuple(checksum):
        return "the header is damaged, so SQLite would ignore every transaction in it"
    state = tuple(checksum)
    first_bad = None
    for number, frame in enumerate(_frames(data, page_size, (salt1, salt2))):
        if first_bad is None:
            header = data[frame.offset : frame.offset + _FRAME_HEADER]
            page = data[frame.offset + _FRAME_HEADER : frame.offset + _FRAME_HEADER + page_size]
            state = _checksum(header[:8] + page, state, magic)
            if not frame.salts_match or state != struct.unpack(">2I", header[16:24]):
                first_bad = number
        elif frame.salts_match and frame.commit:
            return (
                f"frame {first_bad} is damaged, so SQLite would drop the transactions written "
                "after it"
            )
    return ""


def salvage(path: Path, columns: tuple[str, ...]) -> tuple[list[dict], int, bool]:
    """(rows, lost, exact): every readable row of the `records` table as {column: text or
    number}; how many rows could not be read; whether that count is exact, rather than a lower
    bound (the rows after a damaged page may not be countable). Writes nothing next to `path`."""
    with tempfile.TemporaryDirectory(prefix="schedlang-salvage-") as folder:
        copy = Path(folder) / "copy.db"
        shutil.copyfile(path, copy)
        wal = Path(f"{path}-wal")
        if wal.is_file():
            (Path(folder) / "copy.db-wal").write_bytes(_repaired_wal(_read(wal)))
        conn = sqlite3.connect(copy, isolation_level=None)
        conn.text_factory = bytes  # a damaged text must not fail the whole query
        # Also lets SQLite read a truncated file (its header then claims more pages than exist).
        conn.execute("PRAGMA writable_schema=ON")
        try:
            return _read_rows(conn, columns)
        finally:
            conn.close()


def _read_rows(conn: sqlite3.Connection, columns: tuple[str, ...]) -> tuple[list[dict], int, bool]:
    # Row ids from every structure that holds them (the table, then its indexes), each read until
    # it hits a damaged page; then each row on its own, so one damaged page costs only its rows.
    ids: set[int] = set()
    exact = True
    for query in (
        "SELECT id FROM records",
        "SELECT id FROM records INDEXED BY records_by_op_target WHERE op_key IS NOT NULL",
        "SELECT id FROM records INDEXED BY sqlite_autoindex_records_1 WHERE op_key IS NOT NULL",
    ):
        try:
            ids.update(row_id for (row_id,) in conn.execute(query) if isinstance(row_id, int))
        except sqlite3.DatabaseError:
            exact = False
    select = f"SELECT {', '.join(columns)} FROM records WHERE id = ?"
    rows: dict[int, dict] = {}
    for row_id in sorted(ids):
        if (row := _read_row(conn, select, row_id, columns)) is not None:
            rows[row_id] = row
    # Ids are dense (rows are never deleted): every id up to the largest one found held a row. An
    # id far beyond the others is a damaged page's garbage: not counted, and not probed up to;
    # the count is then only a lower bound, as it is when a scan stopped at a damaged page.
    plausible = 2 * len(ids) + 1000
    top = max((row_id for row_id in ids if row_id <= plausible), default=0)
    for row_id in range(1, top + 1):
        if row_id in rows or row_id in ids:
            continue
        if (row := _read_row(conn, select, row_id, columns)) is not None:
            rows[row_id] = row
    lost = sum(1 for row_id in range(1, top + 1) if row_id not in rows)
    exact = exact and top == max(ids, default=0)
    return [rows[row_id] for row_id in sorted(rows)], lost, exact


def _read_row(
    conn: sqlite3.Connection, select: str, row_id: int, columns: tuple[str, ...]
) -> dict | None:
    try:
        found = conn.execute(select, (row_id,)).fetchone()
        if found is None:
            return None
        values = [v.decode("utf-8") if isinstance(v, bytes) else v for v in found]
    except (sqlite3.DatabaseError, UnicodeDecodeError):
        return None
    return dict(zip(columns, values, strict=True))


def _repaired_wal(data: bytes) -> bytes:
    """The log with every frame of its generation, up to its last commit, given the salts and
    checksums SQLite expects: a damaged page is then replayed as it is, instead of ending the log
    there. A log whose header is damaged is left out."""
    if len(data) <= _WAL_HEADER:
        return data
    magic, _, page_size, _, salt1, salt2, *checksum = struct.unpack(">8I", data[:_WAL_HEADER])
    if magic not in _WAL_MAGIC or _checksum(data[:24], (0, 0), magic) != tuple(checksum):
        return b""
    frames = list(_frames(data, page_size, (salt1, salt2)))
    last_commit = max((n for n, f in enumerate(frames) if f.salts_match and f.commit), default=-1)
    out = bytearray(data[:_WAL_HEADER])
    state = tuple(checksum)
    for frame in frames[: last_commit + 1]:
        header = bytearray(data[frame.offset : frame.offset + _FRAME_HEADER])
        page = data[frame.offset + _FRAME_HEADER : frame.offset + _FRAME_HEADER + page_size]
        header[8:16] = struct.pack(">2I", salt1, salt2)
        state = _checksum(bytes(header[:8]) + page, state, magic)
        header[16:24] = struct.pack(">2I", *state)
        out += header + page
    return bytes(out)


def _frames(data: bytes, page_size: int, salts: tuple[int, int]):
    frame_size = _FRAME_HEADER + page_size
    for offset in range(_WAL_HEADER, len(data) - frame_size + 1, frame_size):
        _, commit, salt1, salt2 = struct.unpack(">4I", data[offset : offset + 16])
        yield _Frame(offset, commit != 0, (salt1, salt2) == salts)


def _checksum(data: bytes, state: tuple[int, int], magic: int) -> tuple[int, int]:
    """SQLite's WAL checksum (walChecksumBytes): pairs of 32-bit words, added cumulatively."""
    words = struct.unpack(f"{'>' if magic & 1 else '<'}{len(data) // 4}I", data)
    s1, s2 = state
    for index in range(0, len(words), 2):
        s1 = (s1 + words[index] + s2) & 0xFFFFFFFF
        s2 = (s2 + words[index + 1] + s1) & 0xFFFFFFFF
    return s1, s2


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
