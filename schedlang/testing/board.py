"""An emulated aarch64 board: TVM's RPC server on an aarch64 Python, run by qemu-user.

    files = prepare()                                   # installs, or finds in its cache
    with EmulatedBoard(files, tracker, key="board") as board:
        ...                                             # lease it from the tracker as any board

What it is made of, all from Debian's packages and the package index, nothing built here:
  - `qemu-aarch64` (Debian's `qemu-user`) runs aarch64 Linux programs on this machine;
  - a sysroot: Debian's arm64 `python3.11` and the libraries it and TVM link, each `.deb` fetched
    by `apt-get download` (after `dpkg --add-architecture arm64`) and unpacked with `dpkg -x`
    (nothing is installed into this machine's own arm64 side);
  - `apache-tvm`, `apache-tvm-ffi`, numpy and psutil as `manylinux_2_28_aarch64` wheels, installed
    with `pip install --target` into the sysroot's `site` folder;
  - `aarch64-linux-gnu-g++` (Debian's `g++-aarch64-linux-gnu`), which links what runs there.
All of it is kept in a cache folder (~/.cache/schedlang/board, or $SCHEDLANG_BOARD_CACHE) and
made again only when the versions below change. Installing the Debian packages needs root; where
something cannot be had, `prepare` raises `BoardUnavailable` saying what is missing.

The board serves `schedlang.run.remote.serve` (`schedlang rpc-server`'s loop: a crashed session
ends that session only), imported from this repository's source: TVM's stock
`python -m tvm.exec.rpc_server` starts its server through `tvm.support.popen_pool`, which execs a
new Python, and an aarch64 program that execs another needs binfmt_misc, which a container lacks.
The board's results are right or wrong exactly as a real board's; its timings mean nothing.

    python -m schedlang.testing.board --prepare               # install, print what was found
    python -m schedlang.testing.board --tracker 127.0.0.1:9190 --key board   # serve until ^C
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TVM_WHEELS = ("apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1", "numpy<2.5", "psutil")
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")
PYTHON = "3.11"
# Debian 12's aarch64 Python and every library it or TVM's wheel loads (by `ldd` under qemu).
DEBIAN_PACKAGES = (
    "libc6", "libgcc-s1", "libstdc++6", "gcc-12-base", "zlib1g", "libbz2-1.0", "liblzma5",
    "libexpat1", "libffi8", "libssl3", "libsqlite3-0", "libncursesw6", "libtinfo6",
    "libreadline8", "libuuid1", "libcrypt1", "libdb5.3", "libnsl2", "libtirpc3",
    "libgssapi-krb5-2", "libk5crypto3", "libkrb5-3", "libkrb5support0", "libkeyutils1",
    "libcom-err2", "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib",
    "python3.11",
)  # fmt: skip
HOST_PACKAGES = {"qemu-aarch64": "qemu-user", "aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu"}
# The emulated CPU: every Armv9 feature qemu has (NEON, dot product, i8mm, SVE2), with SVE
# registers of 128 bits as on the Cortex-X4 and A720 (qemu's default for user mode is 512).
QEMU_CPU = "max,sve-default-vector-length=16"
REGISTER_TIMEOUT_S = 300.0  # TVM's import under qemu takes 20-40 s on a busy 2-core machine
REPO_ROOT = Path(__file__).resolve().parents[2]


class BoardUnavailable(Exception):
    """The board cannot be made here: a package missing and no root, no network, …"""


@dataclass(frozen=True)
class BoardFiles:
    root: Path  # the sysroot qemu loads the dynamic linker and libraries from
    site: Path  # TVM and numpy for the board's Python

    @property
    def python(self) -> Path:
        return self.root / "usr" / "bin" / f"python{PYTHON}"

    def command(self, *args: str) -> list[str]:
        """A command line running the board's Python on this machine."""
        return [shutil.which("qemu-aarch64") or "qemu-aarch64", str(self.python), *args]

    def env(self, threads: int = 2) -> dict[str, str]:
        return dict(
            os.environ,
            QEMU_LD_PREFIX=str(self.root),
            QEMU_CPU=QEMU_CPU,
            PYTHONPATH=os.pathsep.join([str(self.site), str(REPO_ROOT)]),
            TVM_NUM_THREADS=str(threads),
        )


def default_cache() -> Path:
    given = os.environ.get("SCHEDLANG_BOARD_CACHE")
    return Path(given) if given else Path.home() / ".cache" / "schedlang" / "board"


def prepare(cache: Path | None = None, log=print) -> BoardFiles:
    """The board's files, made in `cache` on first use (a few minutes) and found there after."""
    cache = cache or default_cache()
    files = BoardFiles(cache / "root", cache / "site")
    stamp = cache / "stamp.json"
    wanted = {"debian": DEBIAN_PACKAGES, "wheels": TVM_WHEELS, "python": PYTHON}
    _host_tools(log)
    if stamp.is_file() and json.loads(stamp.read_text()) == json.loads(json.dumps(wanted)):
        return files
    started = time.monotonic()
    shutil.rmtree(cache, ignore_errors=True)
    (cache / "debs").mkdir(parents=True)
    _sysroot(cache / "debs", files.root, log)
    log(f"board: installing {', '.join(TVM_WHEELS)} for aarch64")
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--target",
            str(files.site),
            *platforms,
            "--only-binary=:all:",
            "--python-version",
            PYTHON,
            "--implementation",
            "cp",
            *list(TVM_WHEELS),
        ],
        "pip could not fetch TVM's aarch64 wheels (no network to the package index?)",
    )
    shutil.rmtree(cache / "debs")
    stamp.write_text(json.dumps(wanted))
    log(f"board: ready in {time.monotonic() - started:.0f} s ({cache})")
    return files


def _host_tools(log) -> None:
    missing = [package for tool, package in HOST_PACKAGES.items() if not shutil.which(tool)]
    if not missing:
        return
    if not _can_apt():
        raise BoardUnavailable(
            f"{', '.join(missing)} not installed, and apt-get needs root: "
            f"apt-get install {' '.join(missing)}"
        )
    log(f"board: apt-get install {' '.join(missing)}")
    _apt(["install", "-y", "-qq", *missing], "cannot install " + ", ".join(missing))


def _sysroot(debs: Path, root: Path, log) -> None:
    if "arm64" not in _output(["dpkg", "--print-foreign-architectures"]).split():
        if not _can_apt():
            raise BoardUnavailable("Debian's arm64 packages need `dpkg --add-architecture arm64`")
        _run(["dpkg", "--add-architecture", "arm64"], "cannot add the arm64 architecture")
        _run(["apt-get", "update", "-qq"], "apt-get update failed (no network?)")
    log(f"board: downloading {len(DEBIAN_PACKAGES)} Debian arm64 packages")
    names = [f"{package}:arm64" for package in DEBIAN_PACKAGES]
    try:
        _run(["apt-get", "download", *names], "apt-get download failed", cwd=debs)
    except BoardUnavailable:  # stale lists: update once, then again
        _run(["apt-get", "update", "-qq"], "apt-get update failed (no network?)")
        _run(["apt-get", "download", *names], "apt-get download failed", cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg", "-x", str(deb), str(root)], f"cannot unpack {deb.name}")


def _can_apt() -> bool:
    return shutil.which("apt-get") is not None and os.geteuid() == 0


def _apt(args: list[str], what: str) -> None:
    try:
        _run(["apt-get", *args], what)
    except BoardUnavailable:
        _run(["apt-get", "update", "-qq"], "apt-get update failed (no network?)")
        _run(["apt-get", *args], what)


def _run(command: list[str], what: str, cwd: Path | None = None) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise BoardUnavailable(f"{what}: {last[0]}")


def _output(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""


class EmulatedBoard:
    """The board's RPC server, registered under `key` at the tracker `tracker` (HOST:PORT), in a
    process group of its own: `stop` ends it with its session processes."""

    def __init__(
        self, files: BoardFiles, tracker: str, key: str, port: int, log_path: Path | None = None
    ):
        self.files, self.tracker, self.key, self.log_path = files, tracker, key, log_path
        self.registered_after_s: float | None = None  # since it started
        host, tracker_port = tracker.rsplit(":", 1)
        script = (  # says it is an emulator, so that its timings are marked (run.remote)
            "import tvm\n"
            "tvm.register_global_func('schedlang.emulated', lambda: True)\n"
            "from schedlang.run.remote import TrackerAddress, serve\n"
            f"serve(TrackerAddress({host!r}, {int(tracker_port)}), {key!r}, port={port}, "
            f"port_end={port + 50}, on_start=lambda line: print(line, flush=True))\n"
        )
        with open(log_path or os.devnull, "wb") as log:
            self.process = subprocess.Popen(
                files.command("-c", script),
                env=files.env(),
                stdin=subprocess.DEVNULL,
                stdout=log if log_path else None,
                stderr=subprocess.STDOUT if log_path else None,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path else ""

    def stop(self) -> None:
        if self.alive:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def __enter__(self) -> EmulatedBoard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_board(work_dir: Path, key: str = "board", log=print) -> Iterator[EmulatedBoard]:
    """A loopback tracker (TVM's, in a thread of this process) and the board registered there; both
    stopped, with their children, at the end. Raises BoardUnavailable where it cannot be had,
    or when the board does not register within REGISTER_TIMEOUT_S (its log says why)."""
    from tvm.rpc.tracker import PopenTrackerServerState

    from schedlang.run.remote import TrackerAddress, TrackerClient, registered_devices

    files = prepare(log=log)
    port = _free_port()
    tracker = PopenTrackerServerState("127.0.0.1", port, port + 50, silent=True)
    address = TrackerAddress("127.0.0.1", tracker.port)
    board = EmulatedBoard(files, str(address), key, _free_port(), work_dir / "board.log")
    try:
        started = time.monotonic()
        while True:
            with TrackerClient(address) as client:
                if registered_devices(client.summary(), key):
                    break
            if not board.alive or time.monotonic() - started > REGISTER_TIMEOUT_S:
                raise BoardUnavailable(f"the emulated board did not register: {board.log()}")
            time.sleep(0.5)
        board.registered_after_s = time.monotonic() - started
        yield board
    finally:
        board.stop()
        _stop_tracker(tracker)


def _stop_tracker(tracker) -> None:
    """Stop a tracker that runs in a thread of this process, as its own STOP message does."""
    from tvm.rpc import base

    with socket.create_connection(("127.0.0.1", tracker.port), timeout=10) as sock:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        base.recvall(sock, 4)
        base.sendjson(sock, [base.TrackerCode.STOP, tracker.stop_key])
        base.recvjson(sock)
    tracker.thread.join(10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _main() -> None:
    parser = argparse.ArgumentParser(prog="python -m schedlang.testing.board", description=__doc__)
    parser.add_argument("--prepare", action="store_true", help="install the board's files, only")
    parser.add_argument("--tracker", help="HOST:PORT of the RPC tracker to register with")
    parser.add_argument("--key", default="board", help="the key to register under")
    parser.add_argument("--port", type=int, default=9090, help="the first port to listen on")
    args = parser.parse_args()
    try:
        files = prepare()
    except BoardUnavailable as err:
        sys.exit(f"error: {err}")
    if args.prepare or not args.tracker:
        print(f"board files: {files.root} (python), {files.site} (TVM)")
        return
    with EmulatedBoard(files, args.tracker, args.key, args.port) as board:
        board.process.wait()


if __name__ == "__main__":
    _main()
