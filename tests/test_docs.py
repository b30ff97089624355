"""Every ```sh, ```console and ```python block of README.md and docs/*.md runs, so the docs cannot
rot (issue 15, item 2). docs/llm.md is left to tests/test_docs_llm.py, which runs it against a tiny
model.

Each document runs in order in a folder of its own holding a link to examples/; all share one
tuning database (SCHEDLANG_DB), so `best` and `compile --from-db` read what the document's `tune`
wrote. A `<!-- file: NAME -->` block is written to NAME before the document's first command; a
block that cannot run here (a GPU, an RPC tracker, pip, the test suite itself) carries
`<!-- not-run: REASON -->`. A block marked `<!-- exits: CODE -->` (an error shown on purpose, or
`exits: 0` for output worth keeping true) runs without substitutions, and in a ```console block
each command's output must be what is shown. See tests/docs_blocks.py. An unmarked block that fails
fails the test.

Commands run as written, but for these substitutions, which only keep them fast:

* an example op named with no `-D` gets small shapes (`SMALL`); shapes a command sets itself
  are kept (its schedule may need them);
* `--trials N` becomes `--trials 2`, and a `tune` or `tune-model` without `--trials` gets it.

`schedlang …` and `python -m schedlang …` commands (with `NAME=VALUE` before them, a `> FILE` after
them, globs) run in this process through typer's CliRunner; any other command runs in bash. Python
blocks run in a subprocess. Output shown in ```console blocks without `exits` is not compared (it
holds timings).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from docs_blocks import Block, MarkerError, blocks, commands, console_steps

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "llm.md")]
SMALL = {
    "examples/matmul.py": {"M": "64", "N": "64", "K": "64"},
    "examples/batch_matmul.py": {"batch": "2", "M": "32", "N": "32", "K": "32"},
    "examples/conv2d.py": {"C": "8", "H": "16", "W": "16", "K": "8"},
    "examples/depthwise_conv2d.py": {"C": "8", "H": "16", "W": "16"},
    "examples/softmax.py": {"rows": "64", "cols": "64"},
    "examples/layernorm.py": {"rows": "64", "cols": "64"},
    "examples/models/mlp.py": {"batch": "4", "features": "32", "hidden": "64", "layers": "2"},
    "examples/models/qwen2.py": {"layers": "1", "hidden": "32", "heads": "2", "vocab": "64"},
}
TRIALS = "2"
TIMEOUT_S = 300
FIX = "fix the document, or mark the block <!-- not-run: REASON --> if it cannot run here"


def shrink(args: list[str]) -> list[str]:
    """`SMALL` shapes for the op a command names, and 2 trials."""
    out = list(args)
    if "--trials" in out:
        out[out.index("--trials") + 1] = TRIALS
    elif out[:1] in (["tune"], ["tune-model"]):
        out += ["--trials", TRIALS]
    if "-D" in out or "--define" in out:
        return out  # shapes the document chose (a schedule may need them)
    for path, shape in SMALL.items():
        if path in out:
            at = out.index(path) + 1
            out[at:at] = [part for k, v in shape.items() for part in ("-D", f"{k}={v}")]
    return out


def shrink_shell(command: str) -> str:
    """`shrink` on a bash command's text: operators, quotes and globs stay as written."""
    command = re.sub(r"--trials(\s+|=)\d+", f"--trials {TRIALS}", command)
    if "--trials" not in command:
        command = re.sub(r"\b(schedlang\s+tune(-model)?)(?=\s)", rf"\1 --trials {TRIALS}", command)
    if re.search(r"\s(-D|--define)\s", command):
        return command
    for path, shape in SMALL.items():
        named = rf"(^|\s){re.escape(path)}(?=\s|$)"
        if not re.search(named, command):
            continue
        defines = " ".join(f"-D {k}={v}" for k, v in shape.items())
        command = re.sub(named, rf"\g<1>{path} {defines}", command)
    return command


def in_process(command: str) -> tuple[dict[str, str], list[str], str | None] | None:
    """(environment, arguments, stdout file) of a `schedlang` command this test runs itself; None
    for anything else (pipes, `&&`, other programs), which bash runs."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if any(w in ("|", "&&", "||", ";", "&", "<", "2>", ">>") for w in words):
        return None
    env = {}
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words[:1] == ["schedlang"]:
        words = words[1:]
    elif words[:3] == ["python", "-m", "schedlang"]:
        words = words[3:]
    else:
        return None
    out = None
    if ">" in words:
        at = words.index(">")
        if at != len(words) - 2:
            return None
        out, words = words[-1], words[:at]
    expanded = []
    for word in words:
        matches = sorted(glob.glob(word)) if re.search(r"[*?[]", word) else []
        expanded += matches or [word]
    return env, expanded, out


def run_command(command: str, folder: Path, env: dict[str, str], small: bool) -> tuple[int, str]:
    """Run one command in `folder`: its exit code and output (stdout and stderr)."""
    from typer.testing import CliRunner

    from schedlang.cli import app

    parsed = in_process(command)
    if parsed is None:
        result = subprocess.run(
            ["bash", "-c", shrink_shell(command) if small else command],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        return result.returncode, result.stdout + result.stderr
    extra_env, args, out = parsed
    result = CliRunner().invoke(app, shrink(args) if small else args, env={**env, **extra_env})
    if out is None:
        return result.exit_code, result.output
    (folder / out).write_text(result.stdout)
    return result.exit_code, result.stderr


def run_python(block: Block, folder: Path, env: dict[str, str], expected: int) -> None:
    script = folder / f"snippet_{block.line}.py"
    script.write_text(block.text)
    result = subprocess.run(
        [sys.executable, script.name],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    assert result.returncode == expected, (
        f"{block.where}: the Python block exited {result.returncode}, not {expected}:\n"
        f"{output[-3000:]}\n{FIX}"
    )


@pytest.fixture(scope="session")
def shared_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("docs-db") / "docs.db"


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_every_block_of_the_document_runs(doc: Path, tmp_path: Path, shared_db: Path, monkeypatch):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)  # the in-process commands' relative paths
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "SCHEDLANG_DB": str(shared_db),
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
    }
    found = blocks(doc)
    for block in found:
        if block.marker == "file":
            (tmp_path / block.argument).write_text(block.text)
    for block in found:
        if not block.runnable:
            continue
        start = time.perf_counter()
        expected = int(block.argument) if block.marker == "exits" else 0
        if block.lang == "python":
            run_python(block, tmp_path, env, expected)
            print(f"{time.perf_counter() - start:6.1f} s  {block.where} (python)")
            continue
        if block.lang == "console":
            steps: list[tuple[str, str | None]] = list(console_steps(block))
        else:
            steps = [(command, None) for command in commands(block)]
        assert steps, f"{block.where}: a ```{block.lang} block with no command"
        for command, shown in steps:
            exact = block.marker == "exits"  # as written, and its output as shown
            code, output = run_command(command, tmp_path, env, small=not exact)
            assert code == expected, (
                f"{block.where}: `{command}` exited {code}, not {expected}:\n"
                f"{output[-3000:]}\n{FIX}"
            )
            if exact and shown is not None:
                assert output.strip() == shown, (
                    f"{block.where}: `{command}` printed\n{output}\nnot what the document shows:"
                    f"\n{shown}"
                )
            print(f"{time.perf_counter() - start:6.1f} s  {command}")
            start = time.perf_counter()


# --- the extraction itself ------------------------------------------------------------------------


def test_markers_commands_and_console_output(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- not-run: needs a GPU -->\n\n```sh\nschedlang tune x.py --target cuda\n```\n"
        "<!-- file: a.sched -->\n```schedlang\nsplit i by 4\n```\n"
        "```console\n$ schedlang check x.py \\\n    a.sched  # note\nx.py: ok\n```\n"
        "```sh\n# setup\nschedlang show x.py -s 'a # b'   # blocks\n```\n"
    )
    found = blocks(doc)
    assert [(b.lang, b.marker, b.argument) for b in found] == [
        ("sh", "not-run", "needs a GPU"),
        ("schedlang", "file", "a.sched"),
        ("console", None, ""),
        ("sh", None, ""),
    ]
    assert not found[0].runnable and found[2].runnable
    assert commands(found[2]) == ["schedlang check x.py      a.sched"]
    assert commands(found[3]) == ["schedlang show x.py -s 'a # b'"]
    assert console_steps(found[2]) == [("schedlang check x.py  a.sched", "x.py: ok")]
    doc.write_text("<!-- exits: 1 -->\n```console\n$ false\n```\n")
    assert blocks(doc)[0].runnable and blocks(doc)[0].argument == "1"
    doc.write_text("<!-- exits: some -->\n```sh\nls\n```\n")
    with pytest.raises(MarkerError, match="needs an exit code"):
        blocks(doc)
    doc.write_text("<!-- not-run: -->\n```sh\nls\n```\n")
    with pytest.raises(MarkerError, match="needs a reason"):
        blocks(doc)
    doc.write_text("<!-- skip: later -->\n```sh\nls\n```\n")
    with pytest.raises(MarkerError, match="unknown marker `skip`"):
        blocks(doc)


def test_substitutions_shrink_shapes_and_trials():
    args = ["tune", "examples/matmul.py", "--target", "llvm", "--trials", "64"]
    small = "tune examples/matmul.py -D M=64 -D N=64 -D K=64 --target llvm --trials 2"
    assert shrink(args) == small.split()
    chosen = ["check", "examples/matmul.py", "-D", "M=256", "-D", "N=256", "-D", "K=256"]
    assert shrink(chosen) == chosen
    assert shrink(["tune", *chosen[1:]]) == ["tune", *chosen[1:], "--trials", "2"]
    assert shrink_shell("schedlang tune x.py -D M=8 > out.txt") == (
        "schedlang tune --trials 2 x.py -D M=8 > out.txt"
    )
    assert shrink_shell("schedlang tune examples/softmax.py --trials 8 2>&1 | tail -3") == (
        "schedlang tune examples/softmax.py -D rows=64 -D cols=64 --trials 2 2>&1 | tail -3"
    )
    assert in_process("TVM_NUM_THREADS=4 schedlang history --format csv > r.csv") == (
        {"TVM_NUM_THREADS": "4"},
        ["history", "--format", "csv"],
        "r.csv",
    )
    assert in_process("mv a b") is None
    assert in_process("schedlang show x.py | head") is None


def test_every_document_parses_with_known_markers():
    for doc in [*DOCS, ROOT / "docs" / "llm.md"]:
        blocks(doc)  # raises MarkerError on an unknown marker or one without a reason


def test_llm_md_holds_only_blocks_its_own_test_runs():
    # tests/test_docs_llm.py runs llm.md's ```sh blocks; any other runnable block would run nowhere.
    other = [b.where for b in blocks(ROOT / "docs" / "llm.md") if b.runnable and b.lang != "sh"]
    assert not other, f"{other}: run by neither test; make them ```sh or extend test_docs_llm.py"


# --- op files written for older TVM (docs/ops.md) ------------------------------------------------

OLD_TVM = {
    "from tvm.script import tir as T\n": "from tvm.script import tirx as T",
    "import tvm.tir\n": "IR nodes are in `tvm.tirx`",
    "from tvm import te\nte.create_schedule\n": "te.create_prim_func",
    (
        "from tvm.script import tirx as T\n\n"
        "@T.prim_func\n"
        "def add(A: T.Buffer((8,), 'float32'), B: T.Buffer((8,), 'float32')):\n"
        "    for i in range(8):\n"
        "        with T.block('B'):\n"
        "            vi = T.axis.spatial(8, i)\n"
        "            B[vi] = A[vi] + 1.0\n"
    ): "T.sblock",
}


@pytest.mark.parametrize(
    "source", list(OLD_TVM), ids=["tir", "tvm.tir", "create_schedule", "T.block"]
)
def test_an_op_file_for_older_tvm_is_told_what_to_write(tmp_path, source):
    from schedlang.core.diagnostics import SchedlangError
    from schedlang.core.ops import load_op

    path = tmp_path / "old_op.py"
    path.write_text(source)
    with pytest.raises(SchedlangError) as raised:
        load_op(str(path))
    rendered = raised.value.render()
    assert "TVM 0.27" in rendered and OLD_TVM[source] in rendered, rendered
