"""Remote measurement through a real TVM RPC tracker and two real RPC servers on 127.0.0.1.

The servers are `schedlang rpc-server` processes (TVM's RPC server loop), killed as a board dies:
mid-candidate, the server and its session together.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tvm
from typer.testing import CliRunner

from schedlang.cli import app
from schedlang.core.diagnostics import SchedlangError
from schedlang.core.target import resolve_target
from schedlang.run.remote import (
    RemoteSettings,
    TrackerAddress,
    TrackerClient,
    cross_compiler,
    parse_tracker,
    registered_devices,
    remote_settings,
)
from schedlang.store.records import Status
from tests.planted import (
    PlantedMeasurer,
    candidates,
    doubling_op,
    fast_settings,
    hangs,
    measure_each,
    segfaults,
    slow,
    wrong,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
KEY = "schedlang-test"


# --- a tracker and two devices -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`schedlang rpc-server` in a process group of its own, with its session processes."""

    def __init__(self, tracker: TrackerAddress, log: Path):
        port = _free_port()
        self.log = log
        with open(log, "wb") as stderr:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "schedlang",
                    "rpc-server",
                    "--rpc-key",
                    KEY,
                    "--rpc-tracker",
                    str(tracker),
                    "--port",
                    str(port),
                    "--port-end",
                    str(port + 50),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        self.port: int | None = None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def started(self) -> bool:
        """Whether it listens (then `port` is set); an error if it exited."""
        assert self.alive, f"rpc-server exited: {self.log.read_text()[-2000:]}"
        if self.port is None:
            match = re.search(r"serving 127\.0\.0\.1:(\d+)", self.log.read_text())
            self.port = int(match.group(1)) if match else None
        return self.port is not None

    def session_dir(self) -> Path | None:
        """The current session's folder (the server works in it), or None."""
        try:
            return Path(psutil.Process(self.process.pid).cwd())
        except (psutil.Error, OSError):
            return None

    def kill(self) -> None:
        if self.alive:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


class Cluster:
    """A tracker and RPC servers under KEY, all on 127.0.0.1.

    The tracker is TVM's, run in a thread of this process as `tvm.rpc.tracker.Tracker` runs it
    in a process of its own (which would import TVM first: seconds before a server can start)."""

    def __init__(self, logs: Path):
        from tvm.rpc.tracker import PopenTrackerServerState

        port = _free_port()
        self.tracker = PopenTrackerServerState("127.0.0.1", port, port + 50, silent=True)
        self.address = TrackerAddress("127.0.0.1", self.tracker.port)
        self.logs = logs
        self.servers: list[Server] = []

    def devices(self) -> list[str]:
        with TrackerClient(self.address) as tracker:
            return registered_devices(tracker.summary(), KEY)

    def ensure(self, count: int) -> None:
        """Start servers (at once: each imports TVM) until `count` are registered."""
        alive = [server for server in self.servers if server.alive]
        for _ in range(count - len(alive)):
            log = self.logs / f"server{len(self.servers)}.log"
            self.servers.append(Server(self.address, log))
        deadline = time.monotonic() + 60
        while len(self.devices()) < count or not all(s.started() for s in self.servers if s.alive):
            assert time.monotonic() < deadline, "the RPC servers did not register"
            time.sleep(0.1)

    def server_at(self, device: str) -> Server:
        return next(s for s in self.servers if s.alive and device == f"127.0.0.1:{s.port}")

    def serving(self, file_pattern: str) -> Server | None:
        """The server whose current session holds a file matching `file_pattern`, or None."""
        for server in self.servers:
            folder = server.session_dir() if server.alive else None
            if folder is not None and any(folder.glob(file_pattern)):
                return server
        return None

    def close(self) -> None:
        from tvm.rpc import base

        for server in self.servers:
            server.kill()
        with socket.create_connection(("127.0.0.1", self.address.port), timeout=10) as sock:
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            base.recvall(sock, 4)
            base.sendjson(sock, [base.TrackerCode.STOP, self.tracker.stop_key])
            assert base.recvjson(sock) == base.TrackerCode.SUCCESS
        self.tracker.thread.join(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = Cluster(tmp_path_factory.mktemp("rpc-servers"))
    try:
        started.ensure(2)
        yield started
    finally:
        started.close()


# --- a measurer with planted kernels, on the devices ---------------------------------------------

PLANTED = {
    "split i by 4": segfaults,
    "split i by 8": hangs,
    "split i by 16": wrong,
    "split i by 32": slow,
}
SETTINGS = fast_settings(run_timeout_s=3)


@pytest.fixture(scope="module")
def remote_measurer(cluster, tmp_path_factory):
    remote = RemoteSettings(cluster.address, KEY, devices=2, register_grace_s=1.0)
    settings = dataclasses.replace(SETTINGS, remote=remote)
    work_dir = tmp_path_factory.mktemp("remote")
    measurer = PlantedMeasurer(doubling_op(), resolve_target("llvm"), settings, work_dir, PLANTED)
    try:
        yield measurer
    finally:
        measurer.close()


# --- measuring remotely --------------------------------------------------------------------------


def test_remote_statuses_match_a_local_run(cluster, remote_measurer, tmp_path):
    schedules = ["split i by 2", "split i by 16", "split q by 2", "vectorize i", "split i by 4"]
    remote = measure_each(remote_measurer, *schedules)
    local_measurer = PlantedMeasurer(
        doubling_op(), resolve_target("llvm"), SETTINGS, tmp_path, PLANTED
    )
    try:  # the crash comes last: the local runner is not restarted after it
        local = measure_each(local_measurer, *schedules)
    finally:
        local_measurer.close()
    assert {s: o.status for s, o in remote.items()} == {s: o.status for s, o in local.items()}
    assert [remote[s].status for s in schedules] == [
        Status.OK,
        Status.WRONG,
        Status.CHECK_ERROR,
        Status.OK,
        Status.CRASH,
    ]
    assert remote["split i by 2"].latencies_s and remote["split i by 2"].extra["rpc_key"] == KEY
    crash = remote["split i by 4"]
    assert "took down two devices" in crash.reason and "\n" not in crash.reason
    assert set(crash.extra["lost_devices"] + [crash.extra["device"]]) == set(cluster.devices())
    assert len(cluster.devices()) == 2  # both servers outlived the crashes


def test_a_hung_kernel_times_out_and_its_device_serves_on(cluster, remote_measurer):
    outcomes = list(remote_measurer.measure(candidates("split i by 8", "split i by 2")))
    [(_, hung), (_, fine)] = outcomes
    assert hung.status == Status.TIMEOUT and "after 3 s" in hung.reason
    assert "lost_devices" not in hung.extra
    assert fine.status == Status.OK


def test_when_measuring_stops_the_outcomes_that_finished_come_first(remote_measurer):
    """Measurement stops (here a planted error: the first candidate's device is gone for good)
    while later candidates have finished on other devices: those are still reported."""
    later_finished = threading.Event()
    run = remote_measurer.runner.run

    def run_or_stop(job):
        if job.lib_path.endswith("_0.so"):
            later_finished.wait(60)
            raise SchedlangError("no device left (planted)")
        outcome = run(job)
        later_finished.set()
        return outcome

    remote_measurer.runner.run = run_or_stop
    yielded = []
    try:
        with pytest.raises(SchedlangError, match="planted"):
            for candidate, outcome in remote_measurer.measure(
                candidates("split i by 2", "vectorize i", "split q by 2")
            ):
                yielded.append((candidate.text.strip(), outcome.status))
    finally:
        del remote_measurer.runner.run
    assert yielded == [("vectorize i", Status.OK), ("split q by 2", Status.CHECK_ERROR)]


# --- the command line ----------------------------------------------------------------------------


def test_rpc_status_lists_the_devices_per_key(cluster):
    cluster.ensure(2)
    result = CliRunner().invoke(app, ["rpc-status", "--rpc-tracker", str(cluster.address)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"RPC tracker at {cluster.address}"
    [row] = [line.split() for line in lines if line.startswith(KEY + " ")]
    assert row[:2] == [KEY, "2"]
    assert sum(line.endswith(f"  {KEY}") for line in lines) == 2  # one line per device


def test_tune_through_the_tracker_records_the_device(cluster, tmp_path):
    cluster.ensure(2)
    db, template = tmp_path / "t.db", tmp_path / "split.sched"
    template.write_text(
        "param TJ in [4, 8]\nblock C:\n  tile i, j by 4 x TJ\n"
        "  reorder i.o, j.o, k, i.i, j.i\n  vectorize j.i\n"
    )
    result = CliRunner().invoke(
        app,
        [
            *("tune", str(EXAMPLES / "matmul.py"), "-D", "M=32", "-D", "N=32", "-D", "K=32"),
            *("--template", str(template), "--trials", "2", "--db", str(db)),
            *("--rpc-tracker", str(cluster.address), "--rpc-key", KEY, "--rpc-devices", "1"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "2 measured" in result.output
    history = CliRunner().invoke(app, ["history", "--db", str(db), "--format", "json"])
    records = json.loads(history.stdout)
    assert len(records) == 2 and {r["status"] for r in records} == {"ok"}
    assert {r["extra"]["rpc_key"] for r in records} == {KEY}
    assert {r["extra"]["device"] for r in records} <= set(cluster.devices())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("localhost", "has no port"),
        ("localhost:port", "is not a number"),
        ("localhost:99999", "out of range"),
        (":9190", "cannot read --rpc-tracker"),
        ("http://localhost:9190", "is a URL"),
    ],
)
def test_a_bad_tracker_address_is_one_clear_error(value, message):
    result = CliRunner().invoke(
        app, ["tune", str(EXAMPLES / "matmul.py"), "--rpc-tracker", value, "--rpc-key", KEY]
    )
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and message in result.output.splitlines()[0]
    assert "Traceback" not in result.output


def test_an_unreachable_tracker_is_one_clear_error(tmp_path):
    closed = f"127.0.0.1:{_free_port()}"
    for args in (
        ["rpc-status", "--rpc-tracker", closed],
        [
            *("tune", str(EXAMPLES / "matmul.py"), "-D", "M=32", "-D", "N=32", "-D", "K=32"),
            *("--db", str(tmp_path / "t.db"), "--rpc-tracker", closed, "--rpc-key", KEY),
        ],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, result.output
        assert f"error: cannot reach an RPC tracker at {closed}" in result.output
        assert "Traceback" not in result.output


def test_rpc_options_need_each_other(cluster, tmp_path):
    op = [str(EXAMPLES / "matmul.py"), "-D", "M=32", "-D", "N=32", "-D", "K=32"]
    result = CliRunner().invoke(app, ["tune", *op, "--rpc-key", KEY])
    assert result.exit_code == 1 and "--rpc-key needs --rpc-tracker" in result.output
    result = CliRunner().invoke(app, ["tune", *op, "--rpc-tracker", str(cluster.address)])
    assert result.exit_code == 1 and "--rpc-tracker needs --rpc-key" in result.output
    result = CliRunner().invoke(
        app,
        [
            "tune",
            *op,
            "--db",
            str(tmp_path / "t.db"),
            "--rpc-tracker",
            str(cluster.address),
            "--rpc-key",
            "rasp4",
        ],
    )
    assert result.exit_code == 1 and "no device is registered under key `rasp4`" in result.output
    assert f"keys registered there: {KEY}" in result.output


# --- addresses and cross compilers ---------------------------------------------------------------


def test_tracker_addresses_parse():
    assert parse_tracker(" 10.0.0.2:9190 ") == TrackerAddress("10.0.0.2", 9190)
    assert parse_tracker("[::1]:9190") == TrackerAddress("::1", 9190)
    assert str(parse_tracker("[::1]:9190")) == "[::1]:9190"
    assert parse_tracker("board-7.lab:9000") == TrackerAddress("board-7.lab", 9000)
    assert remote_settings(None, None) is None
    with pytest.raises(SchedlangError, match="--rpc-devices must be at least 1"):
        remote_settings("h:1", "k", devices=0)


def test_a_foreign_triple_needs_a_cross_compiler(monkeypatch):
    aarch64 = resolve_target('{"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}')
    host = resolve_target("llvm")
    same = resolve_target('{"kind": "llvm", "mtriple": "x86_64-pc-linux-gnu"}')
    assert cross_compiler(host, None) is None and cross_compiler(same, None) is None
    monkeypatch.setattr("schedlang.run.cross.shutil.which", lambda name: None)
    with pytest.raises(SchedlangError) as raised:
        cross_compiler(aarch64, None)
    assert "aarch64-linux-gnu is not this machine's" in raised.value.message
    assert any("--rpc-cc aarch64-linux-gnu-g++" in note for note in raised.value.notes)
    with pytest.raises(SchedlangError, match="`arm-cc` \\(--rpc-cc\\) is not on PATH"):
        cross_compiler(aarch64, "arm-cc")
    monkeypatch.setattr("schedlang.run.cross.shutil.which", lambda name: f"/usr/bin/{name}")
    assert cross_compiler(aarch64, None) == "aarch64-linux-gnu-g++"


def test_the_build_worker_links_with_the_cross_compiler_it_is_given(tmp_path):
    from schedlang.run.sandbox import build_job

    func_json = tvm.ir.save_json(doubling_op().func)
    path = build_job(func_json, json.dumps({"kind": "llvm"}), str(tmp_path / "a.so"), cc="g++")
    module = tvm.runtime.load_module(path)
    a, c = tvm.runtime.tensor(np.ones(64, "float32")), tvm.runtime.tensor(np.zeros(64, "float32"))
    module["main"](a, c)
    assert c.numpy().tolist() == [2.0] * 64


@pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None, reason="no aarch64 cross compiler here"
)
def test_a_library_for_an_arm_board_is_linked_for_aarch64(tmp_path):
    from schedlang.run.sandbox import build_job

    target = resolve_target("raspberry-pi/4b-aarch64")
    cc = cross_compiler(target, None)
    assert cc == "aarch64-linux-gnu-g++"
    func_json = tvm.ir.save_json(doubling_op().func)
    path = build_job(func_json, json.dumps(target.tvm_config), str(tmp_path / "a.so"), cc=cc)
    header = Path(path).read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64


# --- devices that die (last: they leave the tracker without devices) -------------------------


def test_a_device_killed_mid_run_costs_only_its_candidate(cluster, remote_measurer):
    cluster.ensure(2)
    schedules = ["split i by 2", "split i by 32", "vectorize i", "split i by 64", "split i by 1"]
    killed: list[str] = []

    def kill_the_slow_candidates_device() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            server = cluster.serving("candidate*_1.so")  # the slow one, uploaded
            if server is not None:
                killed.append(f"127.0.0.1:{server.port}")
                server.kill()
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=kill_the_slow_candidates_device)
    watcher.start()
    outcomes = measure_each(remote_measurer, *schedules)
    watcher.join()
    assert killed, "the slow candidate was never seen on a device"
    assert {o.status for o in outcomes.values()} == {Status.OK}  # nothing lost
    slow = outcomes["split i by 32"]
    assert slow.extra["lost_devices"] == killed and slow.extra["device"] != killed[0]
    assert all("lost_devices" not in o.extra for s, o in outcomes.items() if o is not slow)
    assert cluster.devices() == [slow.extra["device"]]


def test_no_device_left_stops_tuning_with_a_clear_error(cluster, remote_measurer):
    [survivor] = cluster.devices()  # the other was killed above

    def kill_the_last_device_while_the_slow_one_runs() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and cluster.serving("candidate*_1.so") is None:
            time.sleep(0.01)
        cluster.server_at(survivor).kill()

    watcher = threading.Thread(target=kill_the_last_device_while_the_slow_one_runs)
    watcher.start()
    yielded = []
    try:
        with pytest.raises(SchedlangError) as raised:
            for candidate, outcome in remote_measurer.measure(
                candidates("split i by 2", "split i by 32")  # built, then run, in this order
            ):
                yielded.append((candidate.text.strip(), outcome.status))
    finally:
        watcher.join()
    assert raised.value.message.startswith(f"no device left under key `{KEY}`")
    assert "every finished candidate is saved" in raised.value.message
    assert yielded == [("split i by 2", Status.OK)]
    assert cluster.devices() == []
