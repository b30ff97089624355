"""The tuning database: round trips, never measuring twice, best per target, durability, errors."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from schedlang.core.diagnostics import SchedlangError
from schedlang.store.db import Database, default_db_path
from schedlang.store.records import Record, Status, op_key

CPU = '{"kind":"llvm","mcpu":"skylake"}'
GPU = '{"arch":"sm_90","kind":"cuda"}'


def make_record(schedule: str = "tile i, j by 32x32", **changes) -> Record:
    record = Record(
        op_key="00ff00ff00ff00ff",
        op_name="matmul",
        target_key=CPU,
        target={"kind": "llvm", "mcpu": "skylake", "cores": 8},
        schedule=schedule,
        knobs={"TI": 32, "TJ": 32},
        template="tile i, j by {TI}x{TJ}",
        status=Status.OK,
        reason="",
        latencies_s=(0.0021, 0.002, 0.0022),
        median_s=0.0021,
        gflops=123.25,
        proposer="model:qwen",
        seed=7,
        created_at=1_700_000_000.125,
        schedlang_version="0.1.0",
        tvm_version="0.27.0",
        extra={"raw": "tile i, j by 32x32\n", "run_id": 3, "nested": {"ok": [1, 2]}},
    )
    return replace(record, **changes)


@pytest.fixture
def db(tmp_path: Path):
    with Database(tmp_path / "tune.db") as database:
        yield database


def run_python(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args])


# Round trips and uniqueness.


def test_add_get_has_round_trip_every_field(db: Database) -> None:
    record = make_record()
    record_id = db.add(record)
    assert db.get(record.op_key, CPU, record.schedule) == replace(record, id=record_id)
    assert db.has(record.op_key, CPU, record.schedule)
    assert not db.has(record.op_key, GPU, record.schedule)
    assert db.get(record.op_key, CPU, "vectorize j") is None


def test_failed_record_round_trips_with_nones(db: Database) -> None:
    record = make_record(
        status="build_error",
        reason="LLVM rejected the kernel",
        latencies_s=(),
        median_s=None,
        gflops=None,
        template=None,
        seed=None,
    )
    record_id = db.add(record)
    got = db.get(record.op_key, CPU, record.schedule)
    assert got == replace(record, id=record_id)
    assert got.status is Status.BUILD_ERROR and not got.is_ok


def test_unknown_status_is_rejected() -> None:
    with pytest.raises(ValueError):
        make_record(status="fine")


def test_same_schedule_twice_keeps_the_first_row(db: Database) -> None:
    first = db.add(make_record(median_s=0.5))
    again = db.add(make_record(median_s=0.1, proposer="human"))
    assert again == first
    assert db.count() == 1
    assert db.records()[0].median_s == 0.5
    # The same schedule on another target is another measurement.
    assert db.add(make_record(target_key=GPU)) != first


# Queries.


def test_best_is_fastest_ok_on_exactly_this_target(db: Database) -> None:
    db.add(make_record("a", median_s=0.3))
    db.add(make_record("b", median_s=0.1))
    db.add(make_record("c", median_s=0.2))
    db.add(make_record("fast but wrong", median_s=0.01, status=Status.WRONG))
    db.add(make_record("fast on the GPU", median_s=0.001, target_key=GPU))
    db.add(make_record("other op", median_s=0.001, op_key="1234"))
    assert [r.schedule for r in db.best("00ff00ff00ff00ff", CPU, n=5)] == ["b", "c", "a"]
    assert [r.schedule for r in db.best("00ff00ff00ff00ff", CPU)] == ["b"]
    assert [r.schedule for r in db.best("00ff00ff00ff00ff", GPU)] == ["fast on the GPU"]
    assert db.best("00ff00ff00ff00ff", '{"kind":"llvm"}') == []


def test_records_filters_limit_and_order(db: Database) -> None:
    db.add(make_record("old slow", median_s=0.3, created_at=1.0))
    db.add(make_record("new fast", median_s=0.1, created_at=3.0))
    db.add(make_record("crashed", status="crash", median_s=None, created_at=2.0))
    db.add(make_record("gpu", target_key=GPU, created_at=4.0))
    assert [r.schedule for r in db.records()] == ["old slow", "crashed", "new fast", "gpu"]
    assert [r.schedule for r in db.records(target_key=CPU, order="speed")] == [
        "new fast",
        "old slow",
        "crashed",
    ]
    assert [r.schedule for r in db.records(status="crash")] == ["crashed"]
    assert [r.schedule for r in db.records(status=Status.OK, target_key=CPU, limit=1)] == [
        "old slow"
    ]
    assert db.records(op_key="nope") == []
    assert db.count(target_key=CPU) == 3
    assert db.count(status=Status.OK) == 3
    with pytest.raises(ValueError):
        db.records(order="random")


def test_export_json_and_csv(db: Database) -> None:
    db.add(make_record("a"))
    db.add(make_record("b", status="timeout", median_s=None, gflops=None, latencies_s=()))
    records = db.records()

    text = io.StringIO()
    db.export_json(records, text)
    assert [Record.from_json(item) for item in json.loads(text.getvalue())] == records

    text = io.StringIO()
    db.export_csv(records, text)
    rows = list(csv.DictReader(io.StringIO(text.getvalue())))
    assert [row["schedule"] for row in rows] == ["a", "b"]
    assert rows[0]["latencies_s"] == "0.0021;0.002;0.0022"
    assert json.loads(rows[0]["knobs"]) == {"TI": 32, "TJ": 32}
    assert rows[1]["latencies_s"] == "" and rows[1]["median_s"] == ""
    assert rows[1]["status"] == "timeout"


def test_decisions_keep_their_order(db: Database) -> None:
    run = db.start_run("00ff00ff00ff00ff", CPU, seed=42, proposer="builtin", settings={"n": 8})
    other = db.start_run("00ff00ff00ff00ff", CPU, seed=43, proposer="builtin", settings={})
    for i in range(20):
        db.log_decision(run, f"pick TI={2 ** (i % 6)}")
        db.log_decision(other, f"other {i}")
    assert db.decisions(run) == [f"pick TI={2 ** (i % 6)}" for i in range(20)]
    assert db.decisions(other)[:2] == ["other 0", "other 1"]
    assert db.decisions(9999) == []


# The file: where it lives, recreation, bad files.


def test_default_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SCHEDLANG_DB", str(tmp_path / "mine.db"))
    assert default_db_path() == tmp_path / "mine.db"
    monkeypatch.delenv("SCHEDLANG_DB")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_db_path() == tmp_path / "cache" / "schedlang" / "schedlang.db"
    with Database() as database:
        assert database.created and default_db_path().is_file()


def test_deleted_file_is_recreated(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "folder" / "tune.db"
    with Database(path) as database:
        assert database.created
        database.add(make_record())
    with Database(path) as database:
        assert not database.created and database.count() == 1
    for leftover in tmp_path.glob("deep/folder/tune.db*"):
        leftover.unlink()
    with Database(path) as database:
        assert database.created and database.count() == 0


@pytest.mark.parametrize("garbage", [b"\x00\xffgarbage" * 1000, b"not a database\n"])
def test_garbage_file_is_not_a_schedlang_database(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "tune.db"
    path.write_bytes(garbage)
    with pytest.raises(SchedlangError, match="is not a schedlang database") as err:
        Database(path)
    assert "--db another path" in err.value.render()
    assert path.read_bytes() == garbage


def test_another_programs_database_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE photos (name TEXT)")
    conn.close()
    with pytest.raises(SchedlangError, match="another program's SQLite database"):
        Database(path)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"
    Database(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SchedlangError, match=r"newer schedlang.*schema 99"):
        Database(path)


def test_uncreatable_location(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SchedlangError, match="cannot create the folder"):
        Database(tmp_path / "a_file" / "tune.db")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_read_only_file(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"
    Database(path).close()
    for leftover in tmp_path.glob("tune.db-*"):
        leftover.unlink()
    path.chmod(0o444)
    with pytest.raises(SchedlangError, match="cannot write"):
        Database(path).add(make_record())


# Reading without writing.


def files_beside(path: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in path.parent.iterdir()}


def test_read_only_never_writes_to_the_file_or_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"
    with Database(path) as database:
        database.add(make_record("a", median_s=0.2))
        database.add(make_record("b", median_s=0.1))
    before = files_beside(path)
    assert list(before) == ["tune.db"]
    with Database(path, read_only=True) as database:
        assert not database.created and database.count() == 2
        assert [r.schedule for r in database.best("00ff00ff00ff00ff", CPU, n=2)] == ["b", "a"]
        with pytest.raises(SchedlangError, match=f"{path} is open read-only"):
            database.add(make_record("c"))
        with pytest.raises(SchedlangError, match="open read-only"):
            database.start_run("00ff00ff00ff00ff", CPU, seed=1, proposer="builtin", settings={})
        assert files_beside(path) == before
    assert files_beside(path) == before


def test_read_only_sqlite_connection_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"
    with Database(path) as database:
        database.add(make_record())
        with Database(path, read_only=True) as reader:  # a writer has it open: mode=ro
            assert reader._immutable_stamp is None
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                reader._conn.execute("DELETE FROM records")
            assert reader.count() == 1


def test_read_only_sees_what_a_running_writer_adds(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"
    with Database(path) as database:
        database.add(make_record("a"))
    with Database(path, read_only=True) as reader:
        assert reader.count() == 1
        # A tuner starts after the reader opened the quiet file, adds, and checkpoints on close.
        with Database(path) as database:
            database.add(make_record("b"))
            assert reader.count() == 2
        assert [r.schedule for r in reader.records()] == ["a", "b"]


def test_read_only_missing_file_is_an_error_not_a_new_database(tmp_path: Path) -> None:
    (tmp_path / "tune.db").write_bytes(b"")
    missing = tmp_path / "tuen.db"
    with pytest.raises(SchedlangError, match=f"no tuning database at {missing}") as err:
        Database(tmp_path / "tuen.db", read_only=True)
    assert f"did you mean `{tmp_path / 'tune.db'}`?" in err.value.render()
    with pytest.raises(SchedlangError, match="no tuning database at"):
        Database(tmp_path / "no" / "folder.db", read_only=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tune.db"]
    with pytest.raises(SchedlangError, match="holds no tuning records"):
        Database(tmp_path / "tune.db", read_only=True)
    assert (tmp_path / "tune.db").read_bytes() == b""


def test_read_only_older_schema_is_read_if_it_can_be(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"
    with Database(path) as database:
        database.add(make_record())
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 0")
    conn.commit()
    with Database(path, read_only=True) as database:  # same columns: readable as it is
        assert database.count() == 1
    conn.execute("ALTER TABLE records DROP COLUMN extra")
    conn.commit()
    conn.close()
    before = files_beside(path)
    with pytest.raises(SchedlangError, match="older database schema") as err:
        Database(path, read_only=True)
    assert "open it once for writing" in err.value.render()
    assert files_beside(path) == before


def test_read_only_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"
    Database(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SchedlangError, match="newer schedlang"):
        Database(path, read_only=True)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "shipped"
    folder.mkdir()
    path = folder / "tune.db"
    with Database(path) as database:
        database.add(make_record())
    folder.chmod(0o555)
    try:
        with pytest.raises(SchedlangError, match="cannot write"):
            Database(path).add(make_record("b"))
        with Database(path, read_only=True) as database:
            assert database.count() == 1
        assert [p.name for p in folder.iterdir()] == ["tune.db"]
    finally:
        folder.chmod(0o755)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_read_only_folder_with_records_in_the_log(tmp_path: Path) -> None:
    folder = tmp_path / "shipped"
    folder.mkdir()
    path = folder / "tune.db"
    child = writer(path, 3, "kill")  # leaves its records in tune.db-wal
    assert child.wait(timeout=30) == -9
    Path(f"{path}-shm").unlink()
    folder.chmod(0o555)
    try:
        with pytest.raises(SchedlangError, match=r"records in its log .* folder is read-only"):
            Database(path, read_only=True)
    finally:
        folder.chmod(0o755)


def test_read_commands_do_not_create_a_database(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from schedlang.cli import app

    path = tmp_path / "tune.db"
    with Database(path) as database:
        database.add(make_record())
    before = files_beside(path)
    result = CliRunner().invoke(app, ["history", "--db", str(tmp_path / "tuen.db")])
    assert result.exit_code == 1
    assert f"error: no tuning database at {tmp_path / 'tuen.db'}" in result.output
    assert f"did you mean `{path}`?" in result.output
    result = CliRunner().invoke(app, ["history", "--db", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert [item["schedule"] for item in json.loads(result.stdout)] == [make_record().schedule]
    assert files_beside(path) == before


def test_lock_held_too_long(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"
    Database(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with (
            Database(path, timeout_s=0.1) as database,
            pytest.raises(SchedlangError, match=r"stayed locked for 0\.1 s"),
        ):
            database.add(make_record())
    finally:
        holder.execute("ROLLBACK")
        holder.close()


# Processes.

WRITER = """
    import os, signal, sys
    from dataclasses import replace
    sys.path.insert(0, {tests!r})
    from test_db import make_record
    from schedlang.store.db import Database
    db = Database(sys.argv[1])
    for i in range(int(sys.argv[2])):
        db.add(make_record(f"{{sys.argv[3]}} {{i}}", median_s=0.001 * (i + 1)))
    if sys.argv[3] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    db.close()
"""


def writer(path: Path, count: int, name: str) -> subprocess.Popen:
    code = WRITER.format(tests=str(Path(__file__).parent))
    return run_python(code, str(path), str(count), name)


def test_added_records_survive_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"
    child = writer(path, 50, "kill")
    assert child.wait(timeout=30) == -9
    with Database(path) as database:
        assert database.count() == 50


def test_two_processes_write_one_file(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"  # both start on a missing file, so both race to create it
    children = [writer(path, 200, "first"), writer(path, 200, "second")]
    assert [child.wait(timeout=60) for child in children] == [0, 0]
    with Database(path) as database:
        assert database.count() == 400
        assert database._conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


# Op keys.


def matmul(n: int, names: str = "ABC", symbol: str | None = None):
    from tvm import te

    a = te.placeholder((n, n), name=names[0])
    b = te.placeholder((n, n), name=names[1])
    k = te.reduce_axis((0, n), "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name=names[2])
    func = te.create_prim_func([a, b, c])
    return func.with_attr("global_symbol", symbol) if symbol else func


def test_op_key_is_structural() -> None:
    key = op_key(matmul(64))
    assert len(key) == 16 and int(key, 16) >= 0
    assert op_key(matmul(64)) == key
    assert op_key(matmul(64, names="XYZ", symbol="my_matmul")) == key
    assert op_key(matmul(128)) != key


def test_op_key_is_pinned() -> None:
    # Saved records are found by this key: if a TVM upgrade changes the hash, old records no
    # longer match their ops, and this test says so.
    assert op_key(matmul(64)) == "786b7b54573a9b1b"


# Issue 17: a record whose fields were damaged (text where a number belongs: SQLite stores what
# it is given) is read without them, with a warning, instead of breaking `history`.


def _damage(path: Path, record_id: int, **values: object) -> None:
    conn = sqlite3.connect(path)
    for column, value in values.items():
        conn.execute(f"UPDATE records SET {column} = ? WHERE id = ?", (value, record_id))
    conn.commit()
    conn.close()


def test_regression_damaged_record_fields_are_left_out_with_a_warning(tmp_path: Path, caplog):
    path = tmp_path / "tune.db"
    with Database(path) as db:
        fast_id = db.add(make_record("fast", median_s=0.001))
        slow_id = db.add(make_record("slow", median_s=0.5))
        db.add(make_record("intact", median_s=0.01))
    _damage(path, fast_id, median_s="fast", gflops=b"\x00\xff", seed="seven")
    _damage(path, slow_id, knobs='{"TI": "x"}', latencies_s="[0.1,", extra="[]", template=b"3")
    with Database(path, read_only=True) as db, caplog.at_level("WARNING", "schedlang.store.db"):
        fast, slow, intact = db.records()
        assert [r.schedule for r in db.best("00ff00ff00ff00ff", CPU, n=5)] == ["intact", "slow"]
        db.records()  # each damaged record is reported once
    assert (fast.median_s, fast.gflops, fast.seed) == (None, None, None)
    assert (slow.knobs, slow.latencies_s, slow.extra, slow.template) == ({}, (), {}, None)
    assert slow.median_s == 0.5 and intact == replace(make_record("intact", median_s=0.01), id=3)
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: the tuning database {path}: record #1 has damaged fields, left out: "
        "median_s is 'fast' (text), not a number; gflops is b'\\x00\\xff' (binary data), not a "
        "number; seed is 'seven' (text), not an integer",
        f"warning: the tuning database {path}: record #2 has damaged fields, left out: "
        "template is b'3' (binary data), not text; "
        'knobs is \'{"TI": "x"}\' (text), not a JSON object of integers; '
        "latencies_s is '[0.1,' (text), not a JSON list of numbers; "
        "extra is '[]' (text), not a JSON object",
    ]


def test_regression_history_lists_a_record_whose_median_is_text(tmp_path: Path, caplog) -> None:
    from typer.testing import CliRunner

    from schedlang.cli import app

    path = tmp_path / "tune.db"
    with Database(path) as db:
        db.add(make_record("a"))
    _damage(path, 1, median_s="fast")
    for output_format in ("table", "csv", "json"):
        caplog.clear()
        result = CliRunner().invoke(app, ["history", "--db", str(path), "--format", output_format])
        assert result.exit_code == 0, result.output
        assert "record #1 has damaged fields, left out: median_s is 'fast'" in caplog.text
    assert json.loads(result.stdout)[0]["median_s"] is None


def test_a_record_without_its_identity_is_still_a_damaged_database(tmp_path: Path) -> None:
    path = tmp_path / "tune.db"
    with Database(path) as db:
        db.add(make_record("a"))
    _damage(path, 1, schedule=b"split i by 4")
    with Database(path, read_only=True) as db, pytest.raises(SchedlangError) as info:
        db.records()
    assert "record #1 does not decode (schedule is b'split i by 4' (binary data), not text)" in (
        info.value.message
    )


def test_claims_split_candidates_between_tuners(tmp_path: Path) -> None:
    """Two tuners on one file: what one measures now, the other skips; a finished record, a
    released claim, a stale one and one whose process on this host has exited free it again."""
    import socket

    from schedlang.store.db import claim_owner

    key = ("op", "llvm", "split i by 4")
    me, other = claim_owner(1), f"{socket.gethostname()}:{os.getppid()}:2"
    elsewhere = "another-host:1:3"
    with Database(tmp_path / "t.db") as db:
        assert db.claim(*key, me, stale_after_s=60)
        assert db.claim(*key, me, stale_after_s=60)  # its own claim
        assert not db.claim(*key, other, stale_after_s=60)
        assert not db.claim(*key, elsewhere, stale_after_s=60)
        assert db.claim(*key, other, stale_after_s=0)  # stale: its owner died long ago
        db.release(other, key[2])
        assert db.claim(*key, elsewhere, stale_after_s=60)
        assert not db.claim(*key, me, stale_after_s=60)
        db.release(elsewhere)
        assert db.claim(*key, me, stale_after_s=60)
        db.add(make_record(key[2], op_key="op", target_key="llvm"))
        assert not db.claim(*key, other, stale_after_s=60)  # measured already
        dead = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        )
        gone = f"{socket.gethostname()}:{dead.stdout.strip()}:4"
        assert db.claim("op", "llvm", "fuse i, j", gone, stale_after_s=60)
        assert db.claim("op", "llvm", "fuse i, j", me, stale_after_s=60)  # its tuner exited
