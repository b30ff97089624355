"""Shared fixtures. `golden(name, text)` compares text with tests/golden/<name>; `target` is this
machine's CPU and `small_matmul` a 32x32x32 matmul (examples/matmul.py), for the tuning tests.

Golden files are refreshed only by an explicit `pytest --update-golden`, and reviewed in the diff
like code. Without the flag, a missing or different golden file fails the test with a unified diff.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="write the current output to tests/golden/ instead of comparing with it",
    )


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    update = request.config.getoption("--update-golden")

    def compare(name: str, text: str) -> None:
        path = GOLDEN_DIR / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.is_file() or path.read_bytes() != text.encode("utf-8"):
                path.write_bytes(text.encode("utf-8"))
            return
        if not path.is_file():
            pytest.fail(
                f"golden file tests/golden/{name} is missing; run pytest --update-golden to "
                "create it, then review it",
                pytrace=False,
            )
        # Bytes, not read_text: no newline translation may hide a difference.
        expected = path.read_bytes().decode("utf-8")
        if text != expected:
            diff = difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"tests/golden/{name}",
                tofile="actual",
            )
            pytest.fail(
                "output differs from the golden file (pytest --update-golden refreshes it):\n"
                + "".join(line if line.endswith("\n") else line + "\n" for line in diff),
                pytrace=False,
            )

    return compare


# TVM is imported only by the tests that use these, not by every test collected.


@pytest.fixture(scope="module")
def target():
    from schedlang.core.target import resolve_target

    return resolve_target("llvm")


@pytest.fixture(scope="module")
def small_matmul():
    from schedlang.core.ops import load_op

    return load_op(str(EXAMPLES / "matmul.py"), {"M": "32", "N": "32", "K": "32"})


@pytest.fixture(scope="session")
def emulated_board(tmp_path_factory):
    """An aarch64 board emulated by qemu-user, registered under the key `board` at a loopback
    TVM RPC tracker (schedlang.testing.board): its `tracker` is `HOST:PORT`. Started once per
    session, stopped at its end; skipped, with the reason, where it cannot be had here."""
    from schedlang.testing.board import BoardUnavailable, running_board

    try:
        with running_board(tmp_path_factory.mktemp("board"), log=lambda line: None) as board:
            yield board
    except BoardUnavailable as err:
        pytest.skip(f"no emulated aarch64 board: {err}")
