"""Kernels built here for aarch64 run on an emulated board, through TVM's RPC as on a real one.

The board (schedlang.testing.board, the `emulated_board` fixture) is TVM's RPC server on an
aarch64 Python run by qemu-user, registered at a tracker on 127.0.0.1: every kernel below is
cross-compiled for aarch64, linked by `aarch64-linux-gnu-g++`, leased, uploaded, run once and its
outputs checked here against the op's reference, then timed once by the board's time evaluator
(`schedlang.run.leased.run_on_board`, the remote runner tuning uses). Emulated timings mean nothing:
only right or wrong is asserted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedlang.checker.pipeline import lower
from schedlang.cli import app
from schedlang.core.ops import load_op
from schedlang.core.presets import PRESETS
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse
from schedlang.run.build import compile_func
from schedlang.run.leased import run_on_board
from schedlang.run.remote import RemoteRunner, RemoteSettings, parse_tracker
from schedlang.store.records import Status

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NEON = '{"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"], "num-cores": 2}'
# Each example op at a size its schedule accepts and the emulator runs in about a second.
SIZES = {
    "matmul": {"M": "256", "N": "256", "K": "256"},
    "batch_matmul": {"batch": "2", "M": "128", "N": "128", "K": "128"},
    "conv2d": {"C": "16", "K": "32", "H": "28", "W": "28"},
    "conv2d_winograd": {"C": "16", "K": "16", "H": "16", "W": "16"},
    "depthwise_conv2d": {"C": "32", "H": "28", "W": "28"},
    "layernorm": {"rows": "256"},
    "softmax": {"rows": "256"},
    "matmul_4x4": {},
}


TEMPLATES_PER_OP = 2  # the best-ranked ones: each costs a build here and a run on the board


def _schedules() -> list[Path]:
    return sorted(EXAMPLES.glob("*.sched"))


def _op_file(schedule: Path) -> Path:
    candidates = [p for p in EXAMPLES.glob("*.py") if schedule.stem.startswith(p.stem)]
    return max(candidates, key=lambda p: len(p.stem))


def _remote(board) -> RemoteSettings:
    return RemoteSettings(parse_tracker(board.tracker), board.key, devices=1, emulated_ok=True)


def _run_built(board, runner, op, func, target, repeat: int):
    """`func` (`op`'s, lowered) compiled for `target` and run on the board: its outcome."""
    return run_on_board(
        op, compile_func(func, target), target, _remote(board), repeat=repeat, runner=runner
    )


@pytest.fixture(scope="module")
def neon_runner(emulated_board):
    """One remote runner for the module: its device worker imports TVM once, not per kernel."""
    runner = RemoteRunner(_remote(emulated_board), resolve_target(NEON), 120.0, env={})
    yield runner
    runner.close()


@pytest.mark.parametrize("schedule_path", _schedules(), ids=lambda p: p.stem)
def test_every_example_schedule_runs_right_on_the_board(emulated_board, neon_runner, schedule_path):
    target = resolve_target(NEON)
    op_path = _op_file(schedule_path)
    op = load_op(str(op_path), defines=SIZES[op_path.stem])
    lowered = lower(parse(schedule_path.read_text(), str(schedule_path)), op.func, target)
    executable = compile_func(lowered.func, target)
    started = time.monotonic()
    outcome = run_on_board(
        op, executable, target, _remote(emulated_board), repeat=1, runner=neon_runner
    )
    print(
        f"{schedule_path.stem}: {outcome.status} {outcome.reason} "
        f"({time.monotonic() - started:.1f} s on the board)"
    )
    assert outcome.status is Status.OK, outcome.reason
    assert outcome.extra["rpc_key"] == emulated_board.key and outcome.latencies_s


@pytest.mark.parametrize("op_name", sorted(SIZES))
def test_the_templates_first_points_for_a_pi_run_right_on_the_board(
    emulated_board, neon_runner, op_name
):
    """The built-in templates written for the Pi 4's data (4 cores, NEON's 4 lanes and 32
    registers), each at its first point, built for it and run on the board."""
    from schedlang.propose.builtin import BuiltinProposer
    from schedlang.propose.interface import Context

    target = resolve_target("rpi4")
    op = load_op(str(EXAMPLES / f"{op_name}.py"), defines=SIZES[op_name])
    templates = BuiltinProposer().templates(Context(op, target))
    assert templates, f"no template for {op_name} on the Pi 4"
    for template in templates[:TEMPLATES_PER_OP]:
        schedule = parse(template.text)
        first = {p.name.text: next(iter(p.choices)) for p in schedule.params}
        lowered = lower(schedule, op.func, target, first)
        outcome = _run_built(emulated_board, neon_runner, op, lowered.func, target, repeat=0)
        assert outcome.status is Status.OK, f"{template.note}: {outcome.reason}"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_presets_build_runs_right_on_the_board(emulated_board, neon_runner, preset):
    """Built for each preset's CPU and features (the Cortex-X4's with SVE2, which the emulated
    CPU has, at 128 bits): a tiled, vectorized matmul and its reduction unrolled."""
    target = resolve_target(preset)
    op = load_op(str(EXAMPLES / "matmul.py"), defines={"M": "64", "N": "64", "K": "64"})
    schedule = "tile i, j by 8x16; split k by 4; reorder i.o, j.o, k.o, i.i, k.i, j.i; unroll k.i"
    schedule += "; vectorize j.i"
    lowered = lower(parse(schedule), op.func, target)
    outcome = _run_built(emulated_board, neon_runner, op, lowered.func, target, repeat=1)
    assert outcome.status is Status.OK, outcome.reason


SDOT_TENSORIZED = (
    "split j by 4; split k by 4; reorder i, j.o, k.o, j.i, k.i; cache_read B global; "
    "transform_layout B_global (j, k) -> (j // 4, k // 4, j % 4, k % 4); "
    "decompose_reduction at k.o; tensorize j.i with dot_4x4_i8i8s32_sdot"
)


@pytest.mark.parametrize("schedule", [None, SDOT_TENSORIZED], ids=["vectorized", "tensorized"])
def test_an_int8_gemm_built_with_sdot_runs_right_on_the_board(
    emulated_board, neon_runner, schedule
):
    """Built for the Pi 5 (+dotprod), the int8 GEMM's k loop is `sdot`, by LLVM's vectorizer or
    by TVM's Arm intrinsic (tests/test_cross_asm.py shows both); the board runs those
    instructions, and the int32 results match exactly."""
    target = resolve_target("rpi5")
    op = load_op(str(Path(__file__).parent / "ops" / "dot_int8.py"))
    func = lower(parse(schedule), op.func, target).func if schedule else op.func
    outcome = _run_built(emulated_board, neon_runner, op, func, target, repeat=1)
    assert outcome.status is Status.OK, outcome.reason


def test_sdot_on_an_unpacked_b_is_refused_here_and_wrong_on_the_board(emulated_board, neon_runner):
    """Issue 47: TVM's tensorize takes `dot_4x4_i8i8s32_sdot` on B as it is (a 4 x 4 tile whose
    rows are K apart) and the board's int32 results are wrong, as the intrinsic loads the tile as
    16 contiguous bytes; the checker refuses that schedule, naming B's row stride."""
    from schedlang.core.diagnostics import DiagnosticError
    from tests.tvm_tensorize import tensorized_by_tvm

    target = resolve_target("rpi5")
    op = load_op(str(Path(__file__).parent / "ops" / "dot_int8.py"))
    unpacked = SDOT_TENSORIZED.replace(
        "cache_read B global; transform_layout B_global (j, k) -> (j // 4, k // 4, j % 4, k % 4); ",
        "",
    )
    assert "cache_read" not in unpacked
    with pytest.raises(DiagnosticError, match=r"B's 4x4 region is strided \(row stride 64\)"):
        lower(parse(unpacked), op.func, target)
    tensorized = tensorized_by_tvm(op.func, 4, "dot_4x4_i8i8s32_sdot")  # TVM takes it
    outcome = _run_built(emulated_board, neon_runner, op, tensorized, target, repeat=0)
    assert outcome.status is Status.WRONG, outcome.reason
    assert outcome.reason.startswith("C differs from the reference"), outcome.reason


def test_a_wrong_result_on_the_board_is_caught_here(emulated_board, neon_runner):
    """The board's outputs are checked here, not trusted: against a reference that adds 1, the
    right kernel is `wrong`."""
    target = resolve_target(NEON)
    op = load_op(str(EXAMPLES / "matmul_4x4.py"))
    off_by_one = dataclasses.replace(op, reference=lambda a, b: a @ b + 1)
    outcome = _run_built(emulated_board, neon_runner, off_by_one, op.func, target, repeat=0)
    assert outcome.status is Status.WRONG, outcome.reason


def test_schedlang_run_measures_one_schedule_on_the_board(emulated_board):
    result = CliRunner().invoke(
        app,
        [
            "run",
            str(EXAMPLES / "matmul.py"),
            "-D",
            "M=128",
            "-D",
            "N=128",
            "-D",
            "K=128",
            "--target",
            NEON,
            "-s",
            "tile i, j by 8x16; vectorize j.i",
            "--repeat",
            "1",
            "--rpc-tracker",
            emulated_board.tracker,
            "--rpc-key",
            emulated_board.key,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "verified, matches the reference" in result.output
    assert f"(key {emulated_board.key}; an emulator: its timing means nothing)" in result.output


def _tune_on_board(board, db: Path, *more: str):
    return CliRunner().invoke(
        app,
        [
            *("tune", str(EXAMPLES / "matmul.py"), "-D", "M=32", "-D", "N=32", "-D", "K=32"),
            *("--target", "rpi5", "--trials", "2", "--db", str(db)),
            *("--rpc-tracker", board.tracker, "--rpc-key", board.key, "--rpc-devices", "1"),
            *more,
        ],
    )


def test_tuning_on_an_emulator_is_refused_unless_asked(emulated_board, tmp_path):
    """An emulator's timings would rank candidates wrongly: tuning stops at the first, saying
    why; with --rpc-emulated-ok its records are kept, each marked emulated."""
    refused = _tune_on_board(emulated_board, tmp_path / "refused.db")
    assert refused.exit_code == 1
    assert "is an emulator: its timings would rank candidates wrongly" in refused.output
    kept = _tune_on_board(emulated_board, tmp_path / "kept.db", "--rpc-emulated-ok")
    assert kept.exit_code == 0, kept.output
    history = CliRunner().invoke(
        app, ["history", "--db", str(tmp_path / "kept.db"), "--format", "json"]
    )
    records = json.loads(history.stdout)
    assert records and {r["status"] for r in records} == {"ok"}
    assert all(r["extra"]["emulated"] is True for r in records)
    assert {r["extra"]["rpc_key"] for r in records} == {emulated_board.key}


REQUEST_TARGET = '{"preset": "rpi4", "l1_bytes": 32768}'


# Slow: tuning on the board is test_tuning_on_an_emulator_is_refused_unless_asked's (its kept
# run), the Winograd op on the board test_every_example_schedule_runs_right_on_the_board's.
@pytest.mark.slow
def test_the_request_winograd_on_an_arm_cpu_with_a_32k_l1_is_tuned_on_the_board(
    emulated_board, tmp_path
):
    """Issue 47's request as a user types it (docs/remote.md, "The request"): a 3x3 conv by
    Winograd, for the Pi 4 with its L1 given as 32 KB, the winograd template named by the hint;
    each candidate cross-built for aarch64, run on the board and checked against the reference."""
    db = tmp_path / "request.db"
    result = CliRunner().invoke(
        app,
        [
            *("tune", str(EXAMPLES / "conv2d_winograd.py")),
            *(f"-D{k}={v}" for k, v in SIZES["conv2d_winograd"].items()),
            *("--target", REQUEST_TARGET, "--hint", "winograd", "--trials", "2"),
            *("--db", str(db), "--rpc-tracker", emulated_board.tracker),
            *("--rpc-key", emulated_board.key, "--rpc-devices", "1", "--rpc-emulated-ok"),
        ],
    )
    assert result.exit_code == 0, result.output
    history = CliRunner().invoke(app, ["history", "--db", str(db), "--format", "json"])
    records = json.loads(history.stdout)
    assert len(records) == 2 and {r["status"] for r in records} == {"ok"}, records
    assert {r["extra"]["family"] for r in records} == {"winograd"}, [r["extra"] for r in records]
    assert all(r["extra"]["emulated"] is True for r in records)


# Item 3's two whole models, each at its file's default size, with as many trials as it has tasks.
WHOLE_MODELS = {
    "convnet": (EXAMPLES / "models" / "convnet.py", 5),  # through the command line
    "attention": (Path(__file__).resolve().parent / "models" / "attention.py", 11),
}


def test_the_attention_block_tuned_on_the_board_then_built_runs_right_there(
    emulated_board, tmp_path
):
    """The small attention block, as on a real board, through the library's workflows: every
    task tuned for the Pi 4 on the board (its unscheduled baseline and a trial, each cross-built,
    run there and checked), then the whole model built for aarch64 from those records, exported
    with the cross compiler and run on the board by the Relax VM over RPC (schedlang.run.leased.
    run_model_on_board), its outputs checked here against PyTorch's."""
    from schedlang.models.model_file import load_model
    from schedlang.store.db import Database
    from schedlang.workflows import build_model, tune_model
    from schedlang.workflows.model_tuning import MODEL_SETTINGS

    path, tasks = WHOLE_MODELS["attention"]
    target, remote = resolve_target("rpi4"), _remote(emulated_board)
    model = load_model(str(path))
    settings = dataclasses.replace(MODEL_SETTINGS, remote=remote, repeat=1, min_repeat_ms=0)
    with Database(tmp_path / "board.db") as db:
        tuned = tune_model(model, target, db, trials=tasks, settings=settings)
        built = build_model(model, target, db, remote=remote)
    assert len(tuned.tasks) == tasks and tuned.unmeasured == 0, tuned.states
    assert {item.how for item in built.applied} == {"schedlang"}, built.applied
    assert re.fullmatch(
        r"the reference \(PyTorch\), run on device 127\.0\.0\.1:\d+ under key `board`, "
        r"an emulator",
        built.verified or "",
    ), built.verified


def test_the_convnet_tuned_and_built_for_a_board_from_the_command_line(emulated_board, tmp_path):
    """The test convnet as a user with a board types it: `tune-model --rpc-tracker` (every task
    measured on the board), then `build-model --rpc-tracker`, whose outputs on the board are
    checked against PyTorch's before the library is written."""
    path, tasks = WHOLE_MODELS["convnet"]
    db, library = str(tmp_path / "board.db"), tmp_path / "convnet-rpi4.so"
    board = ("--rpc-tracker", emulated_board.tracker, "--rpc-key", emulated_board.key)
    tuned = CliRunner().invoke(
        app,
        [
            *("tune-model", str(path), "--target", "rpi4", "--trials", str(tasks), "--db", db),
            *("--repeat", "1", "--min-repeat-ms", "0", *board, "--rpc-emulated-ok"),
        ],
    )
    assert tuned.exit_code == 0, tuned.output
    built = CliRunner().invoke(
        app,
        ["build-model", str(path), "--target", "rpi4", "--db", db, *board, "-o", str(library)],
    )
    assert built.exit_code == 0, built.output
    assert re.search(
        r"^outputs agree with the reference \(PyTorch\), run on device 127\.0\.0\.1:\d+ under "
        r"key `board`, an emulator$",
        built.output,
        re.MULTILINE,
    ), built.output
    assert "5 of 5 functions scheduled from the database" in built.output, built.output
    header = library.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # aarch64


def test_a_whole_model_that_differs_on_the_board_is_refused(emulated_board):
    """The board's outputs are checked, not trusted: against a reference that adds 1, the
    attention block's right build is a SchedlangError naming the difference."""
    from schedlang.core.diagnostics import SchedlangError
    from schedlang.models.compare import verify_on_board
    from schedlang.models.graph import build_model
    from schedlang.models.model_file import load_model
    from schedlang.store.db import Database

    target = resolve_target("rpi4")
    model = load_model(str(WHOLE_MODELS["attention"][0]), {"seq": "8", "width": "16"})
    with Database(":memory:") as db:
        executable, _ = build_model(model.mod, target, db)
    reference = model.reference
    assert reference is not None
    off_by_one = dataclasses.replace(model, reference=lambda *a: reference(*a) + 1)
    with pytest.raises(SchedlangError) as raised:
        verify_on_board(off_by_one, target, executable, _remote(emulated_board))
    assert raised.value.message.startswith(
        "the build differs on the board from the model's reference (PyTorch): "
    ), raised.value.message


def _session_processes(board) -> list[int]:
    """The board server's sessions: the other processes of its process group (run.remote.serve
    forks one per session), oldest first."""
    server = board.process.pid
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        pid, group = int(stat.parent.name), int(fields[2])
        if group == server and pid != server:
            found.append(pid)
    return sorted(found)


def test_a_board_that_vanishes_mid_run_loses_nothing_and_the_candidate_is_retried(
    emulated_board, neon_runner
):
    """The candidate's session is killed while it runs on the board (its connection cut, as when
    a board dies or a kernel takes its server down): nothing is recorded for that try, the
    candidate is leased again and finishes, its record naming the device it lost. One board
    only, so the retry leases the same one again once its server has re-registered (its server
    process survives: a second emulated board, or a restarted one, costs 20-50 s of TVM's import
    under qemu; tests/test_rpc.py kills whole servers, with two of them, on this machine)."""
    target = resolve_target(NEON)
    # Unscheduled 512^3: several seconds under qemu, so the session is still there when killed
    # (at 256^3 a loaded machine saw it finish first).
    op = load_op(str(EXAMPLES / "matmul.py"), defines={"M": "512", "N": "512", "K": "512"})
    executable = compile_func(op.func, target)
    killed: list[int] = []

    def kill_the_first_session() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            sessions = _session_processes(emulated_board)
            if sessions:
                time.sleep(0.3)  # the library uploaded, its run begun
                try:
                    os.kill(sessions[0], signal.SIGKILL)
                except ProcessLookupError:
                    continue  # it ended first: wait for the next session
                killed.append(sessions[0])
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_the_first_session)
    watcher.start()
    try:
        outcome = run_on_board(
            op, executable, target, _remote(emulated_board), repeat=1, runner=neon_runner
        )
    finally:
        watcher.join()
    assert killed, "no session was seen on the board"
    assert outcome.status is Status.OK, outcome.reason
    assert outcome.extra["lost_devices"] == [outcome.extra["device"]], outcome.extra
    assert emulated_board.alive


# --- compile -o for a board (no board needed) -----------------------------------------------------


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None, reason="no aarch64 g++ here")
def test_compile_links_an_aarch64_library_with_the_cross_compiler(tmp_path):
    library = tmp_path / "a.so"
    result = CliRunner().invoke(
        app,
        [
            "compile",
            str(EXAMPLES / "matmul.py"),
            "-D",
            "M=64",
            "-D",
            "N=64",
            "-D",
            "K=64",
            "--target",
            NEON,
            "-s",
            "tile i, j by 16x16; vectorize j.i",
            "-o",
            str(library),
        ],
    )
    assert result.exit_code == 0, result.output
    header = library.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # aarch64


def test_compile_without_the_cross_compiler_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setattr("schedlang.run.cross.shutil.which", lambda name: None)
    result = CliRunner().invoke(
        app,
        [
            "compile",
            str(EXAMPLES / "matmul_4x4.py"),
            "--target",
            NEON,
            "-o",
            str(tmp_path / "a.so"),
        ],
    )
    assert result.exit_code == 1
    assert result.output.startswith(
        "error: the target's triple aarch64-linux-gnu is not this machine's"
    ), result.output
    assert "apt install g++-aarch64-linux-gnu" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "a.so").exists()


def test_a_board_that_cannot_be_had_says_what_is_missing(tmp_path, monkeypatch):
    """No qemu and no root to install it: the fixture's skip reason names the packages."""
    from schedlang.testing import board

    monkeypatch.setattr(board.shutil, "which", lambda name: None)
    monkeypatch.setattr(board.os, "geteuid", lambda: 1000)
    with pytest.raises(board.BoardUnavailable) as raised:
        board.prepare(tmp_path, log=lambda line: None)
    assert str(raised.value) == (
        "qemu-user, g++-aarch64-linux-gnu not installed, and apt-get needs root: "
        "apt-get install qemu-user g++-aarch64-linux-gnu"
    )


def test_build_model_on_a_board_does_not_time_here():
    """--compare and --profile time the build on this machine: with --rpc-tracker, one line
    saying so, before anything is built."""
    result = CliRunner().invoke(
        app,
        [
            *("build-model", str(WHOLE_MODELS["convnet"][0]), "-D", "size=8", "--target", "llvm"),
            *("--rpc-tracker", "127.0.0.1:9190", "--rpc-key", "board", "--profile"),
        ],
    )
    assert result.exit_code == 1
    assert result.output.startswith(
        "error: --compare and --profile time the build on this machine, not on a board"
    ), result.output
    assert "Traceback" not in result.output
