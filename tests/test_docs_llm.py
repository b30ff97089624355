"""Every command of docs/llm.md runs, with the tiny model standing in for VibeThinker and its
loopback server for vLLM; sizes and trial counts are cut so the commands take seconds.

A command is run as written except for the substitutions below (`replacements`, `_shrink`);
installing packages and downloading weights are the only commands skipped. `eval-model` scores one
small op (softmax 16x16) with 64-token replies, and its `eval/` folder is the test's.
"""

from __future__ import annotations

import re
import shlex
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("llguidance")

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "llm.md"
SKIPPED = ("pip install", "hf download", "huggingface-cli")
SMALL = {
    "examples/matmul.py": ["-D", "M=64", "-D", "N=64", "-D", "K=64"],
    "examples/softmax.py": ["-D", "rows=64", "-D", "cols=64"],
}
EVAL_SUITE = ["--ops", "softmax", "-D", "rows=16", "-D", "cols=16"]


def commands(text: str) -> list[str]:
    """The shell commands of every ```sh block, continuation lines joined, comments dropped."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                found.append(line)
    return found


def _shrink(args: list[str]) -> list[str]:
    """Small shapes, 2 trials, 2 answers a round and short replies from the local tiny model: the
    command as documented, quicker; against the tiny server, a budget within its context
    (VibeThinker's is 40k tokens, the tiny model's 8k)."""
    out = list(args)
    if out[:1] == ["eval-model"] and "--compare" not in out:
        out = _one_small_op(out)
        if "--max-new-tokens" not in out:
            out += ["--max-new-tokens", "64", "--answer-tokens", "64"]
    if "--endpoint" in out and "--max-new-tokens" not in out:
        out += ["--max-new-tokens", "768"]
    if "--trials" in out:
        out[out.index("--trials") + 1] = "2"
    if "--candidates-per-round" in out:  # the random model's answers run to their token limit
        out[out.index("--candidates-per-round") + 1] = "2"
    if "--model" in out and "--endpoint" not in out and "--max-new-tokens" not in out:
        out += ["--max-new-tokens", "128", "--answer-tokens", "64"]
    for path, shape in SMALL.items():
        if path in out and "-D" not in out:
            at = out.index(path) + 1
            out[at:at] = shape
    return out


def _one_small_op(args: list[str]) -> list[str]:
    """eval-model's suite and shapes replaced by EVAL_SUITE."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--ops", "-D", "--define"):
            skip = True
        else:
            out.append(arg)
    return out + EVAL_SUITE


def test_every_command_of_the_llm_docs_runs(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from schedlang.cli import app
    from schedlang.testing.tiny_model import main as tiny_main

    listed = commands(DOC.read_text())
    assert any(c.startswith("schedlang tune") and "--endpoint" in c for c in listed)
    tiny = tmp_path / "tiny-qwen2"
    monkeypatch.setenv("SCHEDLANG_DB", str(tmp_path / "docs.db"))
    monkeypatch.chdir(ROOT)
    replacements = {
        "~/models/VibeThinker-1.5B": str(tiny),
        "/tmp/tiny-qwen2": str(tiny),
        "/tmp/prompts": str(tmp_path / "prompts"),
        " eval/": f" {tmp_path}/eval/",
    }
    servers, ran = [], []
    try:
        for command in listed:
            if command.startswith(SKIPPED):
                continue
            for old, new in replacements.items():
                command = command.replace(old, new)
            args = shlex.split(command.rstrip("&").strip())
            if not tiny.is_dir():  # the weights the docs download, or build
                assert tiny_main([str(tiny)]) == 0
            if args[0] == "vllm" or args[:4] == [
                "python",
                "-m",
                "schedlang.testing.tiny_model",
                "serve",
            ]:
                documented = "8000" if args[0] == "vllm" else args[args.index("--port") + 1]
                server, url = _serve(tiny)
                servers.append(server)
                replacements[f"http://127.0.0.1:{documented}"] = url
            elif args[:3] == ["python", "-m", "schedlang.testing.tiny_model"]:
                assert tiny_main(args[3:]) == 0
            else:
                assert args[0] == "schedlang", f"a command this test does not know: {command}"
                result = CliRunner().invoke(app, _shrink(args[1:]))
                assert result.exit_code == 0, f"{command}\n{result.output[-3000:]}"
            ran.append(" ".join(args[:3]))
    finally:
        for server in servers:
            server.shutdown()
    assert len(ran) >= 5, ran
    assert (tmp_path / "prompts" / "round-001" / "prompt-1.md").is_file()
    assert (tmp_path / "eval" / "vibethinker-vllm.md").is_file()


def _serve(folder: Path):
    """The docs' server, in a thread of this process: the server and its URL."""
    from schedlang.testing.tiny_model import make_server

    server = make_server(str(folder), 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
