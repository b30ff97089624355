"""Fault injection: workers killed from outside, kernels writing out of bounds, a database locked,
deleted or damaged, the tuner killed with SIGKILL at random moments, three tuners on one file, huge
inputs, and the trust boundary (a model's text is only parsed; nothing listens on a port).

tests/test_tune.py already covers kernels that segfault, hang, compute wrong values or NaN, one
kill -9 and a huge knob space in the search; tests/test_db.py the database's own failure modes;
these tests add what they do not. The figures in docs/reliability.md count the faults injected
here.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from tvm.script import tirx as T
from typer.testing import CliRunner

from schedlang.checker.check import check
from schedlang.cli import app
from schedlang.core.diagnostics import SchedlangError, render_all
from schedlang.lang.syntax import parse, parse_with_diagnostics
from schedlang.llm.backend import Completion, extract_answer
from schedlang.llm.openai_backend import OpenAIBackend
from schedlang.llm.proposer import ModelProposer
from schedlang.propose.interface import Proposal
from schedlang.run import sandbox
from schedlang.run.outcome import Outcome
from schedlang.store.db import Database
from schedlang.store.records import Record, Status
from schedlang.store.schema import DamagedDatabaseError
from schedlang.tuning.tune import tune
from tests.planted import TEMPLATE, PlantedMeasurer, doubling_op, fast_settings, measure_each

ROOT = Path(__file__).resolve().parent.parent
MATMUL = ROOT / "examples" / "matmul.py"

# --- workers killed from outside, kernels writing out of bounds ----------------------------------


@T.prim_func
def _slow_to_build(A: T.Buffer((64,), "float32"), KillBuilder: T.Buffer((64,), "float32")):
    # ~600 unrolled statements: long enough a build to be killed half-way through.
    for r in T.unroll(10):
        for i in T.unroll(64):
            KillBuilder[i] = KillBuilder[i] * T.float32(0.5) + A[(i + r) % 64]


@T.prim_func
def _slow_to_run(A: T.Buffer((64,), "float32"), KillRunner: T.Buffer((64,), "float32")):
    for _i, _j, k in T.grid(2147483647, 2147483647, 64):
        KillRunner[k] = KillRunner[k] + A[k]


@T.prim_func
def _writes_past_the_output(A: T.Buffer((64,), "float32"), C: T.Buffer((64,), "float32")):
    for i in range(66):  # two floats past C's end: no segfault, the heap just changes
        C[i] = A[i % 64] * T.float32(2)


@T.prim_func
def _writes_before_an_input(A: T.Buffer((64,), "float32"), C: T.Buffer((64,), "float32")):
    for i in range(64):
        C[i] = A[i] * T.float32(2)
    A[-3] = T.float32(0)


class _OutsideKiller:
    """Wraps Worker.call: while a job on a marked kernel runs, SIGKILLs its worker from another
    thread, as `kill -9 <pid>` would, once the worker has spent 0.1 s of CPU time on it."""

    def __init__(self) -> None:
        self.killed: list[tuple[str, int]] = []
        self.libraries_to_kill: set[str] = set()
        self.original = sandbox.Worker.call

    def call(self, worker, job, timeout_s, **kwargs):
        victim = False
        if job == "build":
            victim = "KillBuilder" in kwargs["func_json"]
            if "KillRunner" in kwargs["func_json"]:
                self.libraries_to_kill.add(kwargs["out_path"])
        elif job == "measure":
            victim = kwargs["measurement"].lib_path in self.libraries_to_kill
        if victim:
            if worker.process is None or not worker.process.is_alive():
                worker.start()
            threading.Thread(target=self.kill_when_busy, args=(worker.process.pid, job)).start()
        return self.original(worker, job, timeout_s, **kwargs)

    def kill_when_busy(self, pid: int, job: str) -> None:
        process = psutil.Process(pid)
        idle = sum(process.cpu_times()[:2])
        deadline = time.monotonic() + 60
        while sum(process.cpu_times()[:2]) < idle + 0.1 and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)
        self.killed.append((job, pid))


@pytest.fixture(scope="module")
def planted_measurer(target, tmp_path_factory):
    settings = fast_settings(run_timeout_s=30, build_timeout_s=60)
    measurer = PlantedMeasurer(doubling_op(), target, settings, tmp_path_factory.mktemp("m"))
    yield measurer
    measurer.close()


def _measure(measurer, planted: dict[str, object], schedules: list[str]) -> dict[str, Outcome]:
    measurer.planted = planted
    return measure_each(measurer, *schedules)


def test_a_builder_and_a_runner_killed_from_outside_cost_only_their_candidate(
    planted_measurer, monkeypatch
):
    killer = _OutsideKiller()
    monkeypatch.setattr(
        sandbox.Worker, "call", lambda *args, **kwargs: killer.call(*args, **kwargs)
    )
    outcomes = _measure(
        planted_measurer,
        {"split i by 4": _slow_to_build, "split i by 16": _slow_to_run},
        ["split i by 2", "split i by 4", "split i by 8", "split i by 16", "split i by 32"],
    )
    status = {text: outcome.status for text, outcome in outcomes.items()}
    assert status == {
        "split i by 2": Status.OK,
        "split i by 4": Status.CRASH,  # its builder was killed mid-build
        "split i by 8": Status.OK,  # built by a fresh builder
        "split i by 16": Status.CRASH,  # its runner was killed mid-run
        "split i by 32": Status.OK,  # run by a fresh runner
    }
    assert [job for job, _ in killer.killed] == ["build", "measure"]
    assert outcomes["split i by 4"].reason == "build: build crashed the worker (killed by SIGKILL)"
    assert outcomes["split i by 16"].reason == "run: measure crashed the worker (killed by SIGKILL)"
    assert not any(psutil.pid_exists(pid) for _, pid in killer.killed)


def test_a_kernel_writing_out_of_bounds_is_wrong_never_ok(planted_measurer):
    outcomes = _measure(
        planted_measurer,
        {"split i by 4": _writes_past_the_output, "split i by 8": _writes_before_an_input},
        ["split i by 2", "split i by 4", "split i by 8"],
    )
    assert outcomes["split i by 2"].status == Status.OK
    assert outcomes["split i by 4"] == Outcome(
        Status.WRONG, "wrote out of bounds: 8 bytes after output 1"
    )
    assert outcomes["split i by 8"].status == Status.WRONG
    assert outcomes["split i by 8"].reason == "wrote out of bounds: 12 bytes before input 0"


def test_guard_bytes_catch_writes_at_either_end_and_nothing_else():
    import numpy as np

    values = np.arange(12, dtype="float32").reshape(3, 4)
    guarded = sandbox.GuardedArray(values)
    assert guarded.array.ctypes.data % 64 == 0 and (guarded.array == values).all()
    guarded.array[...] = -1  # writes inside the array are the kernel's business
    assert guarded.overrun() == ""
    start = sandbox.GUARD_BYTES
    guarded.buffer[start + values.nbytes + 99] ^= 0xFF
    assert guarded.overrun() == "100 bytes after"
    guarded.buffer[start + values.nbytes + 99] ^= 0xFF
    guarded.buffer[start - 1] ^= 0xFF
    assert guarded.overrun() == "1 byte before"


# --- the database: locked, deleted while in use, deleted or damaged between runs -----------------

LOCK_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(60)
"""


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_a_database_locked_by_another_process_stops_the_tuner_and_loses_nothing(
    small_matmul, target, tmp_path
):
    path = tmp_path / "t.db"
    holders: list[subprocess.Popen] = []

    def lock_after_two(progress) -> None:
        if progress.done == 2 and not holders:
            holders.append(
                subprocess.Popen(
                    [sys.executable, "-c", LOCK_HOLDER, str(path)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            assert holders[0].stdout.readline().strip() == "locked"

    try:
        with Database(path, timeout_s=1.0) as db, pytest.raises(SchedlangError) as err:
            tune(
                small_matmul,
                target,
                db,
                settings=fast_settings(batch=4),
                templates=[Proposal(TEMPLATE, "template")],
                on_progress=lock_after_two,
            )
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    message = err.value.render()
    assert f"the tuning database {path} stayed locked for 1 s" in message
    # The third candidate was measured when the lock was found: the user is told, not left guessing.
    assert "not saved: the candidate just measured (" in message and "block C:" in message
    with Database(path) as db:
        assert db.count() == 2  # everything committed before the lock is there
    assert _integrity(path) == "ok"


def test_a_database_deleted_while_the_tuner_runs_is_put_back_with_every_record(
    small_matmul, target, tmp_path, caplog
):
    path = tmp_path / "t.db"

    def delete(progress) -> None:
        if progress.done == 2:
            path.unlink()  # `rm t.db`: SQLite would go on writing to the deleted file
        elif progress.done == 4:
            for file in tmp_path.glob("t.db*"):  # `rm t.db*`
                file.unlink()
        elif progress.done == 6:
            path.unlink()  # after the last record: put back when the tuner closes the database

    with Database(path) as db:
        result = tune(
            small_matmul,
            target,
            db,
            settings=fast_settings(),
            templates=[Proposal(TEMPLATE, "template")],
            on_progress=delete,
        )
    assert len(result.records) == 6
    with Database(path) as db:
        assert sorted(r.schedule for r in db.records()) == sorted(
            r.schedule for r in result.records
        )
        assert sum(d.startswith("measured #") for d in db.decisions(result.run_id)) == 6
    assert _integrity(path) == "ok"
    put_back = [r.getMessage() for r in caplog.records if "was deleted while in use" in r.message]
    assert len(put_back) == 3 and "(2 records)" in put_back[0] and "(6 records)" in put_back[2]


def test_a_database_replaced_while_in_use_is_not_merged_and_its_copy_is_kept(tmp_path):
    path = tmp_path / "t.db"
    with Database(path) as db:
        db.add(_record("tile i, j by 8x8"))
        for file in tmp_path.glob("t.db*"):  # moved away, -wal and -shm with it
            file.rename(tmp_path / file.name.replace("t.db", "moved.db"))
        Database(path).close()  # and a new file started at the same path
        with pytest.raises(SchedlangError, match="was replaced by another file") as err:
            db.add(_record("tile i, j by 4x4"))
    [saved] = tmp_path.glob("t.db.saved-*")
    assert str(saved) in err.value.render()
    with Database(saved) as copy:
        assert [r.schedule for r in copy.records()] == ["tile i, j by 8x8"]


def test_a_database_deleted_between_runs_is_missing_to_read_and_new_to_write(tmp_path):
    path = tmp_path / "t.db"
    with Database(path) as db:
        db.add(_record("tile i, j by 8x8"))
    for file in tmp_path.glob("t.db*"):
        file.unlink()
    result = CliRunner().invoke(app, ["history", "--db", str(path), "--format", "json"])
    assert result.exit_code == 1 and f"no tuning database at {path}" in result.output
    assert not path.exists()  # reading never creates one
    with Database(path) as db:  # a tuner starts a new, empty one
        assert db.records() == []


def _record(schedule: str, number: int = 0) -> Record:
    return Record(
        op_key="00ff00ff00ff00ff",
        op_name="matmul",
        target_key='{"kind":"llvm"}',
        target={"kind": "llvm"},
        schedule=schedule,
        knobs={"TI": number},
        template=None,
        status=Status.OK,
        reason="",
        latencies_s=(0.001,),
        median_s=0.001,
        gflops=1.0 + number,
        proposer="test",
        seed=0,
        created_at=1_700_000_000.0 + number,
        schedlang_version="0",
        tvm_version="0",
        extra={"note": "x" * 200},
    )


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size * 6 // 10)


def _overwrite_a_page(path: Path) -> None:
    """A page of records (knobs are in no index: this page holds rows of the records table)."""
    data = bytearray(path.read_bytes())
    middle = data.index(b'{"TI":100}') // 4096 * 4096
    data[middle : middle + 4096] = random.Random(7).randbytes(4096)
    path.write_bytes(bytes(data))


def _overwrite_a_row(path: Path) -> None:
    data = bytearray(path.read_bytes())
    where = data.index(b'{"TI":100}')
    data[where : where + 4] = b"\xff\xfe\xff\xfe"  # one record's text no longer decodes
    path.write_bytes(bytes(data))


def _overwrite_the_schema(path: Path) -> None:
    data = bytearray(path.read_bytes())
    where = data.index(b"CREATE TABLE records")
    data[where + 7 : where + 9] = b"\xff\xfe"  # SQLite then quotes text that is not UTF-8
    path.write_bytes(bytes(data))


def _damage_the_log(path: Path) -> None:
    wal = Path(f"{path}-wal")
    data = bytearray(wal.read_bytes())
    page_size = struct.unpack(">I", data[8:12])[0]
    frames = (len(data) - 32) // (24 + page_size)
    middle = 32 + frames // 2 * (24 + page_size) + 24 + 100  # page data of the middle frame
    data[middle : middle + 16] = b"\xde\xad\xbe\xef" * 4
    wal.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, lowest, highest",
    [
        (_truncate, 10, 150),  # 40% of the file cut off
        (_overwrite_a_page, 1, 40),  # 4 KiB of random bytes in the middle
        (_overwrite_a_row, 1, 1),  # one record's text no longer decodes: found when read
        (_overwrite_the_schema, 200, 200),  # was a UnicodeDecodeError traceback
        (_damage_the_log, 0, 0),  # a damaged frame in the log a killed tuner left behind
    ],
    ids=["truncated", "page_overwritten", "row_overwritten", "schema_overwritten", "log_damaged"],
)
def test_a_damaged_database_is_refused_by_name_and_what_is_left_can_be_exported(
    tmp_path, damage, lowest, highest
):
    path = tmp_path / "t.db"
    db = Database(path)
    for number in range(200):
        db.add(_record(f"tile i, j by {number}x8", number))
    originals = {r.id: r for r in db.records()}
    if damage is _damage_the_log:  # what a tuner killed with -9 leaves: the file and its log
        for end in ("", "-wal"):
            shutil.copyfile(f"{path}{end}", tmp_path / f"crashed.db{end}")
        path = tmp_path / "crashed.db"
    db.close()
    damage(path)
    files = {p.name: p.read_bytes() for p in tmp_path.glob(f"{path.name}*")}

    with pytest.raises(DamagedDatabaseError) as err, Database(path) as damaged:
        damaged.records()
    message = err.value.render()
    assert f"the tuning database {path} is damaged: " in message
    assert f"`schedlang history --db {path} --format json > records.json`" in message
    assert f"`mv {path} {path}.damaged`" in message
    if damage is not _overwrite_a_row:  # found on opening: any command says so, and stops
        result = CliRunner().invoke(app, ["best", str(MATMUL), "--db", str(path)])
        assert result.exit_code == 1 and result.stderr.strip() == message.strip()

    # history exports every record that can still be read, and counts the others.
    result = CliRunner().invoke(app, ["history", "--db", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    saved = [Record.from_json(item) for item in json.loads(result.stdout)]
    assert all(record == originals[record.id] for record in saved)  # garbage is never a record
    lost = len(originals) - len(saved)
    assert lowest <= lost <= highest
    counted = re.search(r"can still be read; (at least )?(\d+) could not be read", result.stderr)
    if counted is None:  # nothing could be read, not even how many records there were
        assert "how many could not be read is not known" in result.stderr and not saved
    else:
        assert int(counted[2]) == lost if not counted[1] else int(counted[2]) <= lost
    assert {p.name: p.read_bytes() for p in tmp_path.glob(f"{path.name}*")} == files


def test_sqlite_alone_would_drop_the_records_after_a_damaged_log_frame(tmp_path):
    # Why Database looks at the log first: the hazard it guards against, shown on a copy.
    path = tmp_path / "t.db"
    db = Database(path)
    for number in range(200):
        db.add(_record(f"tile i, j by {number}x8", number))
    for end in ("", "-wal"):
        shutil.copyfile(f"{path}{end}", tmp_path / f"copy.db{end}")
    db.close()
    _damage_the_log(tmp_path / "copy.db")
    with pytest.raises(DamagedDatabaseError, match=r"frame .* is damaged"):
        Database(tmp_path / "copy.db")
    conn = sqlite3.connect(tmp_path / "copy.db")
    assert conn.execute("SELECT count(*) FROM records").fetchone()[0] < 150
    conn.close()


# --- kill -9 of the tuner at random moments, then resume; two tuners on one file -----------------

TUNER = """
import json, multiprocessing, os, signal, sys, threading
sys.modules["torch"] = None  # tvm_ffi would import it (2 s); the tuner does not use it
from schedlang.run import sandbox
from schedlang.store.db import Database
from schedlang.core.ops import load_op
from schedlang.propose.interface import Proposal
from schedlang.core.target import resolve_target
from schedlang.tuning.tune import Settings, tune

path, seed, trials, kill, at, op_file, template = sys.argv[1:8]
seed, trials, at = int(seed), int(trials), int(at)


def die(where):
    workers = [child.pid for child in multiprocessing.active_children()]
    print(json.dumps({"killed": where, "workers": workers}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if kill in ("build", "measure"):  # die while the at-th job of that kind is in flight
    call, jobs = sandbox.Worker.call, []

    def call_then_die(self, job, timeout_s, **kwargs):
        if job == kill:
            jobs.append(job)
            if len(jobs) == at:
                threading.Timer(0.05, die, (f"during {job} {at}",)).start()
        return call(self, job, timeout_s, **kwargs)

    sandbox.Worker.call = call_then_die
elif kill == "commit":  # die inside the at-th INSERT, some SQLite VM steps in, or right after it
    add, records = Database.add, []

    def add_then_die(self, record):
        records.append(record)
        if len(records) == at:
            self._conn.set_progress_handler(lambda: die(f"inside commit {at}"), 7 * at)
            add(self, record)
            die(f"after commit {at}")
        return add(self, record)

    Database.add = add_then_die

op = load_op(op_file, {"M": "32", "N": "32", "K": "32"})
settings = Settings(trials=trials, seed=seed, batch=2, builders=1, repeat=1, min_repeat_ms=100)
with Database(path) as db:
    result = tune(op, resolve_target("llvm"), db, settings=settings,
                  templates=[Proposal(template, "template")])
print(json.dumps({"run_id": result.run_id, "measured": [r.schedule for r in result.records]}))
"""


def _tuner(path: Path, seed: int, trials: int, kill: str = "none", at: int = 0) -> psutil.Popen:
    args = [sys.executable, "-c", TUNER, str(path), str(seed), str(trials), kill, str(at)]
    args += [str(MATMUL), TEMPLATE]
    return psutil.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT)


def _snapshot(path: Path) -> dict[int, Record]:
    with Database(path) as db:
        return {r.id: r for r in db.records()}


def _measured_ids(path: Path) -> list[int]:
    """Every "measured #N" in every run's decision log: a candidate measured twice shows twice."""
    with Database(path) as db:
        runs = [row[0] for row in db._conn.execute("SELECT id FROM runs")]
        return [
            int(text.split()[1].lstrip("#").rstrip(":"))
            for run in runs
            for text in db.decisions(run)
            if text.startswith("measured #")
        ]


def test_kill_9_at_random_moments_then_resume_loses_nothing_and_measures_nothing_twice(
    small_matmul, target, tmp_path
):
    path = tmp_path / "t.db"
    rng = random.Random(2024)
    kills = [(where, rng.randint(1, 3)) for where in rng.sample(["build", "measure", "commit"], 3)]
    snapshots: list[dict[int, Record]] = []
    for where, at in kills:
        tuner = _tuner(path, seed=0, trials=12, kill=where, at=at)
        out, _ = tuner.communicate(timeout=120)
        assert tuner.returncode == -signal.SIGKILL, out
        report = json.loads(out.splitlines()[-1])
        assert report["killed"].split()[-1] == str(at) and where in report["killed"]
        # Its workers notice the tuner is gone and exit: nothing is left running.
        workers = [psutil.Process(pid) for pid in report["workers"] if psutil.pid_exists(pid)]
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive
        snapshots.append(_snapshot(path))
        assert _integrity(path) == "ok"
    with Database(path) as db:  # resumed here: this process has imported TVM already
        settings = fast_settings(trials=4, batch=2)
        resumed = tune(
            small_matmul, target, db, settings=settings, templates=[Proposal(TEMPLATE, "template")]
        )
    final = _snapshot(path)
    for before in snapshots:  # every record committed before a kill is still there, unchanged
        assert all(final[record_id] == record for record_id, record in before.items())
    assert len(final) == len(snapshots[-1]) + 4
    assert not {r.schedule for r in resumed.records} & {r.schedule for r in snapshots[-1].values()}
    measured = _measured_ids(path)
    assert len(measured) == len(set(measured))  # no candidate measured twice
    assert set(measured) <= set(final)


HUGE_TEMPLATE = """\
# 1000^4 = 10^12 knob settings
param A in range(1, 1000)
param B in range(1, 1000)
param C in range(1, 1000)
param D in range(1, 1000)

block C:
  split k by 4
  pragma i auto_unroll_max_step=A
  pragma j auto_unroll_max_step=B
  pragma k.o auto_unroll_max_step=C
  pragma k.i auto_unroll_max_step=D
"""


def _listening(process: psutil.Process) -> list[str]:
    """The process's TCP sockets in LISTEN state and its bound, unconnected UDP sockets."""
    try:
        sockets = process.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []
    return [
        f"{process.pid} {s.laddr}"
        for s in sockets
        if s.status == psutil.CONN_LISTEN or (s.status == psutil.CONN_NONE and not s.raddr)
    ]


def test_three_tuners_at_once_on_one_database_one_over_10_12_knob_settings(tmp_path):
    """Two tuners with the same seed and a `schedlang tune` with another seed and a 10^12-point
    template share one new file: it stays intact, holds every record each one reported, once;
    the huge space is sampled, never enumerated; no process listens on a network port."""
    path = tmp_path / "shared.db"  # all three race to create it, too
    template = tmp_path / "huge.sched"
    template.write_text(HUGE_TEMPLATE)
    command = [sys.executable, "-m", "schedlang", "tune", str(MATMUL), "--trials", "2"]
    command += ["-D", "M=32", "-D", "N=32", "-D", "K=32", "--seed", "2"]
    command += ["--template", str(template), "--db", str(path)]
    started = time.monotonic()
    cli = psutil.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    progress: list[tuple[float, str]] = []  # (seconds since start, line) of its progress lines
    reader = threading.Thread(
        target=lambda: progress.extend((time.monotonic() - started, line) for line in cli.stderr)
    )
    reader.start()
    tuners = [_tuner(path, seed=1, trials=4) for _ in range(2)]
    listening, seen = set(), set()
    while any(process.poll() is None for process in [cli, *tuners]):
        for process in [cli, *tuners]:
            try:
                family = [process, *process.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for member in family:
                seen.add(member.pid)
                listening.update(_listening(member))
        time.sleep(0.05)
        assert time.monotonic() - started < 300
    reader.join()
    out = cli.stdout.read()
    assert cli.returncode == 0, "".join(line for _, line in progress)
    assert "2 measured" in out
    first = next(seconds for seconds, line in progress if line.startswith("[1/2] "))
    reports = []
    for tuner in tuners:
        tuner_out, _ = tuner.communicate(timeout=30)
        assert tuner.returncode == 0, tuner_out
        reports.append(json.loads(tuner_out.splitlines()[-1]))

    assert _integrity(path) == "ok"
    final = _snapshot(path)
    schedules = [r.schedule for r in final.values()]
    assert len(schedules) == len(set(schedules))  # one row per schedule
    for report in reports:  # every record each tuner reported is there
        assert len(report["measured"]) == 4 and set(report["measured"]) <= set(schedules)
    # The same seed proposes the same candidates in the same order: claims split them.
    assert not set(reports[0]["measured"]) & set(reports[1]["measured"])
    measured = _measured_ids(path)
    assert len(measured) == len(set(measured))  # no candidate measured twice
    huge = [r for r in final.values() if set(r.knobs) == {"A", "B", "C", "D"}]
    assert len(huge) == 2 and all(r.status is Status.OK for r in huge)
    with Database(path) as db:
        assert db._conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
    assert first < 120, f"the first of 10^12 candidates was measured after {first:.0f} s"
    assert len(seen) >= 9  # three tuners, each with its builders and runner, were looked at
    assert not listening


# --- huge inputs ---------------------------------------------------------------------------------


def test_a_20000_line_schedule_is_checked_in_linear_time(small_matmul, target):
    # Was quadratic (every statement counted every diagnostic so far, and rendering split the
    # source once per diagnostic): 76 s for this file, ~30 min for 100,000 lines.
    lines = [f"  unroll q{n}\n" if n % 2 else f"  # note {n}\n" for n in range(20_000)]
    text = "block C:\n" + "".join(lines)
    started = time.perf_counter()
    result = check(parse(text, "long.sched"), small_matmul.func, target)
    rendered = render_all(result.diagnostics, text)
    seconds = time.perf_counter() - started
    assert len(result.diagnostics) == 10_000
    assert all(d.message.startswith("unknown axis `q") for d in result.diagnostics)
    assert rendered.endswith("10000 errors generated.")
    assert seconds < 30, f"{seconds:.1f} s"


# --- the trust boundary --------------------------------------------------------------------------

MARKER = "schedlang_was_made_to_run_this"


def _hostile_answers(tmp_path: Path) -> list[str]:
    touched = tmp_path / MARKER
    return [
        f"```schedlang\nimport os\nos.system('touch {touched}')\n```",
        f"```schedlang\n__import__('os').system('touch {touched}')  # {MARKER}\n```",
        f"```schedlang\nblock C:\n  split i by $(touch {touched})\n```",
        f"```schedlang\n@T.prim_func\ndef {MARKER}(A: T.Buffer((4,), 'float32')):\n  pass\n```",
        f"```schedlang\nblock C:\n  pragma i auto_unroll_max_step=__import__('{MARKER}')\n```",
        f"```schedlang\nblock C:\n  pragma i {MARKER}=1\n```",
        f"```python\nopen('{touched}', 'w').write('{MARKER}')\n```",
        f"exec(open('{touched}').read())  # {MARKER}",
    ]


class _Hostile:
    """A model that answers with code; asked to repair an answer, it answers the same again."""

    name = "hostile"

    def __init__(self, answers: list[str]):
        self.answers = answers

    def complete(self, messages, count, grammar=None, seed=None):
        if any(m["role"] == "assistant" for m in messages):  # the repair round
            texts = [next(m["content"] for m in reversed(messages) if m["role"] == "assistant")]
        else:
            texts, self.answers = self.answers[:count], self.answers[count:]
        return [Completion(text=t, answer=extract_answer(t), reasoning="") for t in texts]


def test_a_models_answer_is_only_parsed_never_run(small_matmul, target, tmp_path):
    answers = _hostile_answers(tmp_path)
    proposer = ModelProposer(_Hostile(answers), candidates_per_round=len(answers), constrain=False)
    events: list[tuple[str, str]] = []
    watching = [True]

    def audit(event: str, args: tuple) -> None:
        if not watching[0]:
            return
        if (
            (event in ("compile", "exec") and MARKER in repr(args))
            or event.startswith(("os.system", "os.exec", "os.posix_spawn", "subprocess."))
            or event in ("pickle.find_class", "marshal.loads", "ctypes.dlopen")
        ):
            events.append((event, repr(args)[:80]))

    sys.addaudithook(audit)  # cannot be removed: switched off below instead
    try:
        with Database(tmp_path / "t.db") as db:
            with pytest.raises(SchedlangError, match="nothing to tune"):
                tune(small_matmul, target, db, settings=fast_settings(batch=8), proposer=proposer)
            stored = db.records()
    finally:
        watching[0] = False
    assert events == []
    assert not (tmp_path / MARKER).exists()
    # Each fenced answer (any fence: a model may mislabel it) was kept as text, with what was
    # wrong with it; the bare line is not schedlang at all.
    assert sorted(r.schedule for r in stored) == sorted(extract_answer(a) for a in answers[:7])
    assert all(r.status is Status.CHECK_ERROR and "error: " in r.reason for r in stored)
    assert len(proposer.unanswered) == 1


def test_the_package_never_evals_unpickles_or_runs_a_shell():
    # Op and model files are code by design (schedlang.core.loader compiles and runs them);
    # nothing else is. llm/backends.py imports its optional packages by name, from a fixed list,
    # to say which are missing.
    allowed = {("loader.py", "compile"), ("loader.py", "exec"), ("local.py", "__import__")}
    found = []
    for file in sorted((ROOT / "schedlang").rglob("*.py")):
        tree = ast.parse(file.read_text(), str(file))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
                risky = (
                    name in ("eval", "exec", "compile", "__import__", "os.system", "os.popen")
                    or (name.startswith("subprocess.") and keywords.get("shell") == "True")
                    or keywords.get("allow_pickle") == "True"
                    or name in ("yaml.load", "marshal.loads")
                    # torch.load unpickles anything unless told to read tensors only
                    or (name == "torch.load" and keywords.get("weights_only") != "True")
                    or keywords.get("trust_remote_code") == "True"
                )
                if risky and (file.name, name) not in allowed:
                    found.append(f"{file.name}:{node.lineno}: {name}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(
                    m.split(".")[0] in ("pickle", "cloudpickle", "dill", "shelve") for m in modules
                ):
                    found.append(f"{file.name}:{node.lineno}: import {modules}")
    assert found == []


@pytest.mark.parametrize(
    "text, message, note",
    [
        (
            "pragma i auto_unroll_max_stp=16",
            "expected a pragma key",
            "did you mean `auto_unroll_max_step`?",
        ),
        ("pragma i import_os=1", "expected a pragma key", "auto_unroll_max_step, unroll_explicit"),
        (  # `annotate` is a statement now, with its own whitelist of keys
            "annotate i import_os=1",
            "expected an annotation key",
            "pragma_auto_unroll_max_step",
        ),
    ],
)
def test_pragma_keys_outside_the_whitelist_do_not_parse(text, message, note):
    _, diagnostics = parse_with_diagnostics(f"block C:\n  {text}\n", "t.sched")
    [error] = diagnostics
    assert message in error.message and any(note in n for n in (error.message, *error.notes))


def test_pragma_keys_outside_the_whitelist_are_rejected_by_the_checker_too(small_matmul, target):
    # A schedule built as an AST by a program, not by the parser: the checker is the gate too.
    schedule = parse("block C:\n  pragma i auto_unroll_max_step=16\n", "t.sched")
    pragma = schedule.statements[-1]
    [item] = pragma.items
    forged_item = replace(item, key=replace(item.key, text="unroll_explict"))
    forged = replace(
        schedule,
        items=tuple(replace(s, items=(forged_item,)) if s is pragma else s for s in schedule.items),
    )
    result = check(forged, small_matmul.func, target)
    assert result.lowered is None
    [error] = [d for d in result.diagnostics if d.is_error]
    assert error.message == "unknown pragma key `unroll_explict`"
    assert "did you mean `unroll_explicit`?" in error.notes


def test_nothing_is_called_or_served_unless_asked_and_then_on_loopback_by_default():
    import inspect

    import typer

    endpoint = inspect.signature(OpenAIBackend).parameters["endpoint"]
    assert endpoint.default is inspect.Parameter.empty  # no built-in model server to call
    with pytest.raises(SchedlangError, match="not an http"):
        OpenAIBackend("file:///etc/passwd")
    commands = typer.main.get_command(app).commands
    defaults = {
        (name, param.name): param.default for name, c in commands.items() for param in c.params
    }
    assert defaults[("tune", "endpoint")] is None
    assert defaults[("rpc-server", "host")] == "127.0.0.1"  # the one command that listens
