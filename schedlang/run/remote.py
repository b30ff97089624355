"""Measure candidates on remote devices leased from a TVM RPC tracker.

    schedlang tune OP.py --target JSON --rpc-tracker HOST:PORT --rpc-key KEY [--rpc-devices N]

Candidates are built on this machine (linked by a cross compiler when the target's triple is not
this machine's), then each is measured on a device the tracker leases for that one candidate: the
library is uploaded, run once on the reference inputs, its outputs pulled back and verified here,
and only then timed by the device's own time evaluator. The lease is a TVM RPC session that the
server ends after `--run-timeout` seconds, so a hung kernel costs its candidate, not the board.

The RPC client never runs in the tuner's process: each of N device slots is a sandbox `Worker`
(job `rpc_run`), so N candidates run on N devices at once, and a device that stops answering is a
`WorkerTimeout` the runner handles. When a call fails, the worker asks the device whether it is
still there, which sorts failures into:
  - the candidate's own result: a wrong output (wrong), an error the kernel raised (run_error), a
    session that ran out of time (timeout);
  - a lost device: the connection is gone. The candidate is retried on another device. A device
    lost before the kernel started costs the candidate nothing; a candidate that loses a second
    device while its kernel runs took them down itself: crash.
A lost device leaves the tracker and comes back if its server registers again. When no device is
left under the key, tuning stops with a `SchedlangError`; every record finished before it is
already in the database.

`serve` (the `schedlang rpc-server` command) is TVM's RPC server loop with one change: a session
whose process dies (a kernel crashed it) ends that session only. A stock `python -m
tvm.exec.rpc_server` stops serving after the first one, which tuning produces on purpose.
"""

from __future__ import annotations

import errno
import os
import queue
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.run.cross import linker_for
from schedlang.run.outcome import Outcome
from schedlang.run.sandbox import JobError, MeasureJob, Worker, WorkerCrash, WorkerTimeout
from schedlang.store.records import Status

if TYPE_CHECKING:
    from schedlang.core.target import Target

DEFAULT_TRACKER_PORT = 9190
CONNECT_TIMEOUT_S = 10.0  # reaching the tracker or a device; answering a question
REGISTER_GRACE_S = 10.0  # how long a device that dropped out may take to register again
MAX_LOSSES_BEFORE_KERNEL = 3  # devices lost before a candidate's kernel ran: then stop tuning
TRACKER_WAIT_S = 60.0  # `serve`: how long a device waits for its tracker to come up
_FORMAT_HINT = "write it as HOST:PORT, e.g. --rpc-tracker 127.0.0.1:9190"


# --- the tracker ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrackerAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_tracker(text: str) -> TrackerAddress:
    """`HOST:PORT` (or `[IPv6]:PORT`) → an address; a SchedlangError naming what is wrong."""
    spec = text.strip()
    if not spec:
        raise SchedlangError("--rpc-tracker is empty", _FORMAT_HINT)
    if "://" in spec:
        raise SchedlangError(
            f"--rpc-tracker `{text}` is a URL; the tracker speaks TVM's RPC protocol, not HTTP",
            f"give only HOST:PORT, e.g. --rpc-tracker {spec.split('://', 1)[1].rstrip('/')}",
        )
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\w*)|([A-Za-z0-9_.-]+):(\w*)", spec)
    if match is None:
        if re.fullmatch(r"[A-Za-z0-9_.-]+", spec):
            raise SchedlangError(
                f"--rpc-tracker `{text}` has no port",
                f"a tracker listens on port {DEFAULT_TRACKER_PORT} unless told otherwise: "
                f"--rpc-tracker {spec}:{DEFAULT_TRACKER_PORT}",
            )
        raise SchedlangError(f"cannot read --rpc-tracker `{text}`", _FORMAT_HINT)
    host, port = match.group(1) or match.group(3), match.group(2) or match.group(4)
    if not port.isdigit():
        raise SchedlangError(
            f"--rpc-tracker `{text}`: the port `{port}` is not a number", _FORMAT_HINT
        )
    if not 0 < int(port) < 65536:
        raise SchedlangError(
            f"--rpc-tracker `{text}`: port {int(port)} is out of range", "a TCP port is 1 to 65535"
        )
    return TrackerAddress(host, int(port))


class TrackerError(SchedlangError):
    """The tracker cannot be reached, is not a tracker, or stopped answering."""


class TrackerClient:
    """A connection to a TVM RPC tracker in which every question is bounded by a timeout
    (TVM's own client retries a refused connection for a minute and can wait forever)."""

    def __init__(self, address: TrackerAddress, timeout_s: float = CONNECT_TIMEOUT_S):
        from tvm.rpc import base

        self.address, self.timeout_s = address, timeout_s
        hint = f"is a tracker running there? `python -m tvm.exec.rpc_tracker --port {address.port}`"
        try:
            self.sock = socket.create_connection((address.host, address.port), timeout=timeout_s)
        except socket.gaierror:
            raise TrackerError(f"cannot resolve the RPC tracker's host `{address.host}`") from None
        except TimeoutError:
            raise TrackerError(
                f"no answer from an RPC tracker at {address} within {timeout_s:g} s", hint
            ) from None
        except OSError as err:
            raise TrackerError(
                f"cannot reach an RPC tracker at {address}: {err.strerror or err}", hint
            ) from None
        try:
            self.sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            magic = struct.unpack("<i", base.recvall(self.sock, 4))[0]
        except (OSError, RuntimeError):
            magic = None
        if magic != base.RPC_TRACKER_MAGIC:
            self.close()
            raise TrackerError(f"{address} does not answer like a TVM RPC tracker", hint)

    def __enter__(self) -> TrackerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def _send(self, message: list) -> None:
        from tvm.rpc import base

        self.sock.settimeout(self.timeout_s)
        try:
            base.sendjson(self.sock, message)
        except OSError as err:
            raise self._stopped(err) from None

    def _receive(self) -> Any:
        from tvm.rpc import base

        self.sock.settimeout(self.timeout_s)
        try:
            return base.recvjson(self.sock)
        except (OSError, RuntimeError, ValueError) as err:  # RuntimeError: the peer closed
            raise self._stopped(err) from None

    def _stopped(self, err: Exception) -> TrackerError:
        return TrackerError(f"the RPC tracker at {self.address} stopped answering ({err})")

    def summary(self) -> dict:
        """{"queue_info": {key: {"free", "pending"}}, "server_info": [{"key", "addr"}]}"""
        from tvm.rpc.base import TrackerCode

        self._send([TrackerCode.SUMMARY])
        reply = self._receive()
        if not (isinstance(reply, list) and reply and reply[0] == TrackerCode.SUCCESS):
            raise TrackerError(f"the RPC tracker at {self.address} answered {reply!r}")
        return reply[1]

    def request(
        self, key: str, priority: int, wait_s: float, give_up: Callable[[], bool]
    ) -> tuple[str, int, str] | None:
        """Lease a free device: (host, port, match key). Waits up to `wait_s` seconds
        (TimeoutError), asking `give_up` every second; None when it said to. Either way the
        tracker still holds the request: close this connection."""
        from tvm.rpc.base import TrackerCode

        self._send([TrackerCode.REQUEST, key, "", priority])
        deadline = time.monotonic() + wait_s
        while not select.select([self.sock], [], [], 1.0)[0]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no free device within {wait_s:g} s")
            if give_up():
                return None
        reply = self._receive()
        if not (isinstance(reply, list) and reply and reply[0] == TrackerCode.SUCCESS):
            raise TrackerError(f"the RPC tracker at {self.address} answered {reply!r}")
        host, port, match_key = reply[1]
        return str(host), int(port), str(match_key)


def registered_devices(summary: dict, key: str) -> list[str]:
    """`host:port` of every server registered under `key`."""
    return sorted(
        f"{info['addr'][0]}:{info['addr'][1]}"
        for info in summary.get("server_info", [])
        if info.get("key") == f"server:{key}"
    )


def free_devices(summary: dict, key: str) -> int:
    return int(summary.get("queue_info", {}).get(key, {}).get("free", 0))


def render_summary(address: TrackerAddress, summary: dict) -> str:
    """Per key: devices registered, free, requests waiting; then each device's address."""
    servers = [
        (info.get("key", "").removeprefix("server:"), f"{info['addr'][0]}:{info['addr'][1]}")
        for info in summary.get("server_info", [])
    ]
    queues = summary.get("queue_info", {})
    keys = sorted({key for key, _ in servers} | {k for k, q in queues.items() if q.get("pending")})
    if not keys:
        return f"RPC tracker at {address}: no devices registered"
    width = max(len("key"), *(len(key) for key in keys))
    lines = [f"RPC tracker at {address}", f"{'key':<{width}}  devices  free  pending"]
    for key in keys:
        queue_info = queues.get(key, {})
        count = sum(1 for k, _ in servers if k == key)
        lines.append(
            f"{key:<{width}}  {count:>7}  {queue_info.get('free', 0):>4}  "
            f"{queue_info.get('pending', 0):>7}"
        )
    lines.append("")
    lines += [f"{device:<21}  {key}" for key, device in sorted(servers, key=lambda s: (s[0], s[1]))]
    return "\n".join(lines)


# --- settings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteSettings:
    tracker: TrackerAddress
    key: str
    devices: int | None = None  # measuring at once; None: as many as the tracker has free
    cc: str | None = None  # cross compiler; None: `<triple>-g++` when the triple is foreign
    lease_timeout_s: float = 60.0  # waiting for a free device
    priority: int = 1
    register_grace_s: float = REGISTER_GRACE_S
    # An emulated device's timings (schedlang.testing.board) would rank candidates wrongly:
    # tuning stops at the first one unless this says they are wanted anyway.
    emulated_ok: bool = False


def remote_settings(
    tracker: str | None,
    key: str | None,
    devices: int | None = None,
    cc: str | None = None,
    timeout_s: float = 60.0,
    emulated_ok: bool = False,
) -> RemoteSettings | None:
    """The CLI's --rpc-* options, checked; None when tuning runs on this machine."""
    if tracker is None:
        given = [
            name
            for name, value in (("--rpc-key", key), ("--rpc-devices", devices), ("--rpc-cc", cc))
            if value is not None
        ]
        if given:
            raise SchedlangError(
                f"{', '.join(given)} needs --rpc-tracker HOST:PORT",
                "without --rpc-tracker, candidates are measured on this machine",
            )
        return None
    address = parse_tracker(tracker)
    if not key or not key.strip():
        raise SchedlangError(
            "--rpc-tracker needs --rpc-key KEY: the key the devices registered with",
            f"`schedlang rpc-status --rpc-tracker {address}` lists the keys",
        )
    if devices is not None and devices < 1:
        raise SchedlangError(f"--rpc-devices must be at least 1, got {devices}")
    if timeout_s <= 0:
        raise SchedlangError(f"--rpc-timeout must be positive, got {timeout_s:g}")
    return RemoteSettings(
        address, key.strip(), devices, cc, lease_timeout_s=timeout_s, emulated_ok=emulated_ok
    )


# --- cross compilation ---------------------------------------------------------------------------


def cross_compiler(target: Target, cc: str | None) -> str | None:
    """The compiler that links libraries for `target` (schedlang.run.cross.linker_for): `cc`
    (--rpc-cc) if given, else None on this machine's kind of CPU, else `<triple>-g++`."""
    return linker_for(target, cc, option="--rpc-cc")


# --- the runner (tuner's process) ----------------------------------------------------------------


class RemoteRunner:
    """Measures candidates on devices leased from a tracker, `parallelism` at a time."""

    def __init__(
        self, remote: RemoteSettings, target: Target, run_timeout_s: float, env: dict[str, str]
    ):
        self.remote, self.run_timeout_s = remote, run_timeout_s
        self.cross_compiler = cross_compiler(target, remote.cc)
        with TrackerClient(remote.tracker) as tracker:
            summary = tracker.summary()
        registered = registered_devices(summary, remote.key)
        if not registered:
            others = sorted({i["key"].removeprefix("server:") for i in summary["server_info"]})
            raise SchedlangError(
                f"no device is registered under key `{remote.key}` at the RPC tracker "
                f"{remote.tracker}",
                f"keys registered there: {', '.join(others)}" if others else "",
                f"start one on the device: schedlang rpc-server --rpc-tracker {remote.tracker} "
                f"--rpc-key {remote.key} --host 0.0.0.0 (see docs/remote.md)",
            )
        self.parallelism = remote.devices or max(1, free_devices(summary, remote.key))
        self.slots: queue.Queue[Worker] = queue.Queue()
        self.workers = [
            Worker(f"device{n}", env, jobs={"rpc_run": f"{__name__}:run_on_device"})
            for n in range(self.parallelism)
        ]
        for worker in self.workers:
            self.slots.put(worker)
        # Waiting for a lease, then the session, plus connecting and asking: past this, the
        # device (or the network to it) stopped answering.
        self.call_timeout_s = remote.lease_timeout_s + run_timeout_s + 3 * CONNECT_TIMEOUT_S
        self.stopped: SchedlangError | None = None

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    def run(self, job: MeasureJob) -> Outcome:
        """One candidate's outcome; raises SchedlangError when tuning cannot go on."""
        lost: list[str] = []
        kernel_losses = 0
        while True:
            if self.stopped is not None:
                raise self.stopped
            result = self._call(job, avoid=lost)
            if isinstance(result, NoLease):
                self.stopped = self._stop_error(result.kind, result.reason)
                raise self.stopped
            device = result.device if isinstance(result, DeviceLost) else result.extra.get("device")
            extra = {"rpc_key": self.remote.key, "device": device}
            if lost:
                extra["lost_devices"] = list(lost)
            if isinstance(result, Outcome):
                if result.extra.get("emulated"):
                    extra["emulated"] = True
                    if result.latencies_s and not self.remote.emulated_ok:
                        self.stopped = SchedlangError(
                            f"device {device} under key `{self.remote.key}` is an emulator: "
                            "its timings would rank candidates wrongly, so they are not tuning "
                            "results",
                            "--rpc-emulated-ok records them anyway, marked emulated",
                        )
                        raise self.stopped
                return replace(result, extra=extra)
            lost.append(result.device or "unknown")
            if result.kernel_started:
                kernel_losses += 1
                if kernel_losses == 2:
                    what = Status.TIMEOUT if result.unanswered else Status.CRASH
                    reason = (
                        f"{'hung' if what is Status.TIMEOUT else 'took down'} two devices "
                        f"({', '.join(lost)}) while its kernel ran: {result.reason}"
                    )
                    return Outcome(what, reason, extra=extra)
            elif len(lost) - kernel_losses >= MAX_LOSSES_BEFORE_KERNEL:
                self.stopped = SchedlangError(
                    f"devices under key `{self.remote.key}` keep dropping before a kernel runs "
                    f"(lost {', '.join(lost)}): stopping",
                    f"the last one: {result.reason}",
                )
                raise self.stopped

    def _call(self, job: MeasureJob, avoid: list[str]) -> Outcome | DeviceLost | NoLease:
        worker = self.slots.get()
        try:
            return worker.call(
                "rpc_run",
                self.call_timeout_s,
                remote=self.remote,
                session_timeout_s=self.run_timeout_s,
                measurement=job,
                avoid=avoid,
            )
        except WorkerTimeout as exc:
            return DeviceLost(f"no answer: {exc}", None, kernel_started=True, unanswered=True)
        except WorkerCrash as exc:
            return DeviceLost(str(exc), None, kernel_started=True)
        except JobError as exc:
            return Outcome(Status.RUN_ERROR, str(exc))
        finally:
            self.slots.put(worker)

    def _stop_error(self, status: str, reason: str) -> SchedlangError:
        where = f"key `{self.remote.key}` at the RPC tracker {self.remote.tracker}"
        if status == "no_device":
            return SchedlangError(
                f"no device left under {where}: stopping (every finished candidate is saved)",
                reason,
                "restart the devices' servers, then run the same command again to resume",
            )
        if status == "busy":
            return SchedlangError(
                f"no device under {where} became free within {self.remote.lease_timeout_s:g} s",
                "others may be using them (`schedlang rpc-status`); --rpc-timeout waits longer",
            )
        return SchedlangError(reason, "every finished candidate is saved; rerun to resume")


@dataclass(frozen=True)
class DeviceLost:
    """The device went away during a candidate (its connection is gone): try another."""

    reason: str
    device: str | None  # host:port; None when the worker asking it died or stopped answering
    kernel_started: bool  # then the kernel may have taken the device down
    unanswered: bool = False  # the worker stopped answering (else it died)


@dataclass(frozen=True)
class NoLease:
    """No device could be leased: none registered ("no_device"), none free in time ("busy"), or
    the tracker itself failed ("tracker"). Tuning stops."""

    kind: str
    reason: str


# --- the job (inside a device worker) ------------------------------------------------------------

# This worker's tracker connections, kept between jobs: one leases, one watches the devices.
_trackers: dict[tuple[TrackerAddress, str], TrackerClient] = {}


def _tracker(address: TrackerAddress, use: str) -> TrackerClient:
    client = _trackers.get((address, use))
    if client is None:
        client = _trackers[(address, use)] = TrackerClient(address)
    return client


def _drop_trackers(address: TrackerAddress) -> None:
    for use in ("lease", "watch"):
        client = _trackers.pop((address, use), None)
        if client is not None:
            client.close()


def run_on_device(
    remote: RemoteSettings, session_timeout_s: float, measurement: MeasureJob, avoid: list[str]
) -> Outcome | DeviceLost | NoLease:
    """Lease a device under `remote.key`, preferring one not in `avoid`, then
    `sandbox.verify_then_time` the job's library there, in a session the device ends after
    `session_timeout_s`: an Outcome (ok, wrong, timeout, run_error; its extra names the device),
    DeviceLost when the device went away, or NoLease when no device could be leased."""
    import tvm
    from tvm import rpc

    from schedlang.run.sandbox import load_arrays, verify_job

    address = remote.tracker
    try:
        lease = _lease(remote, avoid)
    except TrackerError:  # a connection kept from an earlier job may be stale: once more
        _drop_trackers(address)
        try:
            lease = _lease(remote, avoid)
        except TrackerError as err:
            _drop_trackers(address)
            return NoLease("tracker", err.message)
    if isinstance(lease, NoLease):
        return lease
    host, port, match_key = lease
    name = f"{host}:{port}"
    session, kernel_started = None, False

    def started() -> None:
        nonlocal kernel_started
        kernel_started = True

    try:
        session = rpc.connect(host, port, match_key, session_timeout=session_timeout_s)
        session.upload(measurement.lib_path, target=Path(measurement.lib_path).name)
        outcome = verify_job(
            measurement,
            session.load_module(Path(measurement.lib_path).name),
            session.device(measurement.device, 0),
            load_arrays(measurement.args_path),
            before_run=started,
        )
        emulated = {"emulated": True} if _emulated(session) else {}
        return replace(outcome, extra={"device": name, **emulated})
    except tvm.error.RPCSessionTimeoutError:
        reason = f"the device ended the session after {session_timeout_s:g} s"
        return Outcome(Status.TIMEOUT, reason, extra={"device": name})
    except Exception as err:  # the device's own error, or the device gone: ask it which
        if session is not None and _answers(session, measurement.device):
            reason = error_line(err, with_type=True)
            return Outcome(Status.RUN_ERROR, reason, extra={"device": name})
        return DeviceLost(
            f"lost device {name}: {error_line(err, with_type=True)}", name, kernel_started
        )


def _lease(remote: RemoteSettings, avoid: list[str]) -> tuple[str, int, str] | NoLease:
    """(host, port, match key) of a free device under `remote.key`, preferring one not in
    `avoid`; NoLease when there is none: none registered under the key for
    `remote.register_grace_s` seconds, or none free within `remote.lease_timeout_s`."""
    address, key, grace_s = remote.tracker, remote.key, remote.register_grace_s
    watch = _tracker(address, "watch")
    last_seen = time.monotonic()

    def no_device_left() -> bool:
        nonlocal last_seen
        if registered_devices(watch.summary(), key):
            last_seen = time.monotonic()
        return time.monotonic() - last_seen > grace_s

    # A device this candidate just lost may come back first; while another is registered, lease
    # again (the unused lease lapses, and its server offers itself anew a few seconds later).
    others = [device for device in registered_devices(watch.summary(), key) if device not in avoid]
    lease: tuple[str, int, str] | None = None
    for _ in range(len(avoid) + 1):
        tracker = _tracker(address, "lease")
        try:
            lease = tracker.request(key, remote.priority, remote.lease_timeout_s, no_device_left)
        except TimeoutError as err:
            _drop_trackers(address)  # the tracker still holds the request
            return NoLease("busy", str(err))
        if lease is None:
            _drop_trackers(address)
            return NoLease("no_device", f"none registered for {grace_s:g} s")
        if f"{lease[0]}:{lease[1]}" not in avoid or not others:
            break
    assert lease is not None  # the loop runs at least once, and returns when nothing is leased
    return lease


def _emulated(session: Any) -> bool:
    """Whether the device says it is an emulator (schedlang.testing.board registers the global
    function `schedlang.emulated` on its server); a real board has no such function."""
    try:
        return bool(session.get_function("schedlang.emulated")())
    except Exception:  # noqa: BLE001 - no such function: not an emulator
        return False


def _answers(session: Any, device: str) -> bool:
    """Whether the device still answers: a one-element array allocated there."""
    import numpy as np
    import tvm

    try:
        tvm.runtime.tensor(np.zeros(1, "float32"), session.device(device, 0))
    except Exception:
        return False
    return True


# --- serving a device ----------------------------------------------------------------------------


def keep_serving_after_crashes() -> None:
    """Make TVM's RPC server, in this process, end only the session whose process died (a kernel
    crashed it). TVM's own raises instead, which ends its listening thread: the device leaves the
    tracker for good while its process lives on. Also usable as a `tvm.rpc.Server`'s
    `server_init_callback`."""
    from tvm.rpc import server

    if not isinstance(server._serving, _ServingThroughCrashes):
        server._serving = _ServingThroughCrashes(server._serving)


class _ServingThroughCrashes:
    """TVM's `server._serving`, a session whose process died logged and ended, not raised."""

    def __init__(self, serving: Callable[..., None]):
        self.serving = serving

    def __call__(self, sock: Any, addr: Any, opts: Any, load_library: Any) -> None:
        from tvm.rpc import server

        cwd = os.getcwd()
        try:
            self.serving(sock, addr, opts, load_library)
        except RuntimeError as err:  # "Child process … exited unsuccessfully with error code -11"
            server.logger.warning("session from %s ended: %s; serving on", addr, err)
            os.chdir(cwd)
            sock.close()


def serve(
    tracker: TrackerAddress,
    key: str,
    host: str = "127.0.0.1",
    port: int = 9090,
    port_end: int = 9199,
    on_start: Callable[[str], None] | None = None,
) -> None:
    """Serve this machine as a device: TVM's RPC server loop, in this process, registered with
    `tracker` under `key`, until interrupted. Each session runs in a forked process; one that a
    kernel crashes ends that session only. Listens on `host` only: 127.0.0.1 unless told."""
    from tvm.rpc import server

    sock = _listen(host, port, port_end)  # a bad --host or --port says so at once
    bound = sock.getsockname()[1]
    _wait_for_tracker(tracker, TRACKER_WAIT_S, on_start)
    keep_serving_after_crashes()
    listener = threading.Thread(
        target=server._listen_loop,
        args=(sock, bound, key, (tracker.host, tracker.port), None, None),
        name="rpc-listen",
        daemon=True,  # Ctrl-C ends the process
    )
    listener.start()
    if on_start:
        on_start(f"serving {host}:{bound} under key `{key}` to the RPC tracker {tracker}")
    while listener.is_alive():
        listener.join(1.0)
    raise SchedlangError("the RPC server stopped; its log above says why")


def _wait_for_tracker(
    tracker: TrackerAddress, wait_s: float, notify: Callable[[str], None] | None
) -> None:
    """A board may come up before its tracker: retry for `wait_s` seconds, then the error."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with TrackerClient(tracker):
                return
        except TrackerError as err:
            if time.monotonic() > deadline:
                raise
            if notify:
                notify(f"{err.message}; trying again for up to {wait_s:g} s")
                notify = None
            time.sleep(2.0)


def _listen(host: str, port: int, port_end: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for candidate in range(port, max(port, port_end) + 1):
        try:
            sock.bind((host, candidate))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                continue
            sock.close()
            raise SchedlangError(f"cannot listen on {host}: {err.strerror or err}") from None
        sock.listen(1)
        return sock
    sock.close()
    raise SchedlangError(
        f"every port from {port} to {port_end} on {host} is taken", "--port and --port-end widen it"
    )
