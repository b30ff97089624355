"""The package as a new user meets it: `import schedlang` is cheap, the README's snippet runs
whatever was imported before it, and the console script behaves in a shell pipeline."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer

from schedlang import cli

ROOT = Path(__file__).resolve().parent.parent
SCHEDULE = "tile i, j by 32x32"

# The README's snippet, at a size that builds quickly and with a schedule the checker accepts.
README_SNIPPET = f"""
import schedlang
from schedlang.core.ops import load_op
op = load_op("examples/matmul.py", {{"N": "64", "M": "64", "K": "64"}})
scheduled = schedlang.apply(op.func, "{SCHEDULE}", "llvm")
library = schedlang.build(op.func, "{SCHEDULE}", "llvm")
assert library is not None
"""


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "imported_first",
    [
        "",
        "import schedlang.run.build",
        "import schedlang.checker.check, schedlang.checker.pipeline, schedlang.run.build",
        "from schedlang.checker.pipeline import lower\nfrom schedlang.checker.check import check",
        "from schedlang import build, check, lower",
        "import schedlang\nschedlang.apply",
    ],
    ids=["nothing", "build", "check-lower-build", "from-submodules", "from-package", "apply"],
)
def test_readme_snippet_runs_whatever_was_imported_first(imported_first):
    result = run_python(imported_first + "\n" + README_SNIPPET)
    assert result.returncode == 0, result.stderr


def test_the_package_exports_are_functions_and_their_modules_sit_in_layers():
    code = """
    import schedlang
    from schedlang import build, check, lower
    from schedlang.checker.check import check as check_function
    from schedlang.checker.pipeline import lower as lower_function
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.lang.syntax import parse
    from schedlang.run.build import build as build_function

    assert build is build_function and check is check_function and lower is lower_function
    func = load_op("examples/matmul.py", {"N": "64", "M": "64", "K": "64"}).func
    schedule, target = parse("tile i, j by 32x32"), resolve_target("llvm")
    assert schedlang.check(schedule, func, target).ok
    assert schedlang.lower(schedule, func, target).func is not None
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr


def test_import_schedlang_does_not_import_tvm():
    code = """
    import sys
    import schedlang
    schedlang.__version__, schedlang.parse
    assert "tvm" not in sys.modules, "tvm was imported"
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr


def test_output_piped_into_head_ends_quietly():
    command = f"{sys.executable} -m schedlang show examples/matmul.py --script | head -1"
    result = subprocess.run(
        command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.startswith("op matmul")
    assert "internal error" not in result.stderr
    assert "Traceback" not in result.stderr
    assert "BrokenPipeError" not in result.stderr


def test_stdout_closed_by_its_reader_exits_141_without_a_word():
    # The reader closes its end before anything is written: deterministic, unlike `| head`.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "schedlang", "show", "examples/matmul.py", "--script"],
            cwd=ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert result.returncode == cli.SIGPIPE_EXIT
    assert result.stderr == ""


def test_a_broken_pipe_that_is_not_stdout_is_still_an_internal_error():
    @cli.reports_errors
    def talks_to_a_dead_worker() -> None:
        raise BrokenPipeError("the worker went away")

    with pytest.raises(typer.Exit) as info:
        talks_to_a_dead_worker()
    assert info.value.exit_code == cli.INTERNAL_ERROR_EXIT


def test_every_subpackage_is_installed() -> None:
    """A non-editable install (the README's first command) ships only the packages pyproject
    lists: schedlang.lang.statements was missing once, and `schedlang tune` failed on import."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(root).parts)
        for init in (root / "schedlang").rglob("__init__.py")
    }
    assert found <= listed, sorted(found - listed)


def test_a_script_without_a_main_guard_builds(tmp_path):
    """The verifier's worker is a spawned process, which re-imported the caller's script first: a
    script without `if __name__ == "__main__":` ran again in it, and the worker 'did not start'."""
    script = tmp_path / "build_it.py"
    script.write_text(
        textwrap.dedent(f"""
        import schedlang
        from schedlang.core.ops import load_op

        op = load_op({str(ROOT / "examples" / "matmul.py")!r}, {{"M": "32", "N": "32", "K": "32"}})
        print("the script runs")
        library = schedlang.build(op.func, "tile i, j by 16x16; vectorize j.i", "llvm")
        print("built")
        """)
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the script runs\nbuilt\n"
