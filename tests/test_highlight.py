"""Highlighting: the Pygments lexer and the TextMate grammar of editors/ know every word of
grammar/schedlang.lark (a keyword added to the grammar fails here until both have it), the
committed TextMate file is what `python -m schedlang.lang.lexer` writes, `pygmentize` finds the
lexer by its entry point, and the CLI colours a schedule only on a terminal without NO_COLOR or
--no-color."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pygments.token import Error, Keyword, Name, Number

from schedlang.lang import lexer
from schedlang.lang.syntax import grammar_text

ROOT = Path(__file__).resolve().parent.parent
TEXTMATE = ROOT / "editors" / "vscode" / "syntaxes" / "schedlang.tmLanguage.json"
SCHEDULES = sorted(
    path for folder in ("examples", "prompts", "tests") for path in (ROOT / folder).rglob("*.sched")
)


def rules(grammar: str) -> dict[str, str]:
    """Each rule or terminal of the grammar: its name and its body (continuation lines joined)."""
    bodies: dict[str, str] = {}
    name = None
    for line in grammar.splitlines():
        if line.startswith("//") or not line.strip():
            continue
        head = re.match(r"^([_A-Za-z][_A-Za-z0-9]*)\s*:(.*)$", line)
        if head:
            name = head.group(1)
            bodies[name] = head.group(2)
        elif name is not None:
            bodies[name] += " " + line.strip()
    return bodies


GRAMMAR = rules(grammar_text())


def literal_words() -> set[str]:
    """Every quoted word of the grammar's rules and terminals."""
    return {
        word
        for body in GRAMMAR.values()
        for word in re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', body)
    }


def statement_words() -> set[str]:
    """The first word of each statement `_stmt` lists, and `block`."""
    statements = re.findall(r"[a-z_]+", GRAMMAR["_stmt"])
    first = {re.match(r'\s*"([a-z_0-9]+)"', GRAMMAR[name]).group(1) for name in statements}
    return first | {"block"}


def terminal_words(name: str) -> set[str]:
    """The words of a terminal that is an alternation of fixed words (its first group, if any)."""
    pattern = GRAMMAR[name].strip().strip("/")
    group = re.match(r"^\((.*?)\)", pattern)
    alternatives = (group.group(1) if group else pattern).split("|")
    return {alternative.replace("\\.", ".") for alternative in alternatives}


def test_the_grammar_is_read_as_expected() -> None:
    # The readers above, on words whose place in the grammar is known.
    assert {"split", "tile", "param", "tensorize", "block"} <= statement_words()
    assert {"by", "keep_unit_loops", "pow2", "pad_value", "exp", "erf"} <= literal_words()
    assert "shared.dyn" in terminal_words("SCOPE")
    assert "double_buffer_scope" in terminal_words("ANNOTATION_KEY")


def test_the_lexer_knows_every_statement_of_the_grammar() -> None:
    assert set(lexer.STATEMENTS) == statement_words()


def test_the_lexer_knows_every_word_of_the_grammar() -> None:
    known = set(lexer.STATEMENTS) | set(lexer.WORDS) | set(lexer.MATH_FNS)
    assert literal_words() == known


def test_the_lexer_knows_every_scope_key_function_and_thread() -> None:
    assert set(lexer.SCOPES) == terminal_words("SCOPE")
    assert set(lexer.KEYS) == terminal_words("PRAGMA_KEY") | terminal_words("ANNOTATION_KEY")
    assert set(lexer.MATH_FNS) == set(re.findall(r'"(\w+)"', GRAMMAR["MATH_FN"]))
    assert lexer.THREAD.replace("?:", "") == GRAMMAR["THREAD"].strip().strip("/")


def tokens(text: str) -> list[tuple]:
    found = lexer.SchedlangLexer().get_tokens(text)
    return [(kind, value) for kind, value in found if value.strip()]


def test_a_schedule_is_highlighted_as_the_grammar_reads_it() -> None:
    text = "block C:\n  tile i, j by 64x64 # t\n  compute_at pad i.o; vectorize j.i\n"
    assert tokens(text) == [
        (Keyword, "block"), (Name.Class, "C"), (lexer.Punctuation, ":"),
        (Keyword, "tile"), (Name, "i"), (lexer.Punctuation, ","), (Name, "j"),
        (Keyword.Pseudo, "by"), (Number.Integer, "64"), (Keyword.Pseudo, "x"),
        (Number.Integer, "64"), (lexer.Comment.Single, "# t"),
        # `pad` names a block here: a statement's word counts only where a statement starts
        (Keyword, "compute_at"), (Name, "pad"), (Name, "i.o"), (lexer.Punctuation, ";"),
        (Keyword, "vectorize"), (Name, "j.i"),
    ]  # fmt: skip


def test_scopes_threads_and_knobs_have_their_own_colours() -> None:
    found = tokens("param T in pow2(8, 64)\ncache_read A shared.dyn at k.o\nbind i threadIdx.x\n")
    assert (Name.Variable, "T") in found
    assert (Keyword.Pseudo, "pow2") in found
    assert (Name.Builtin, "shared.dyn") in found
    assert (Name.Builtin, "threadIdx.x") in found


@pytest.mark.parametrize("path", SCHEDULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_schedule_in_the_repository_lexes_without_an_error_token(path: Path) -> None:
    assert [value for kind, value in tokens(path.read_text()) if kind is Error] == []


def test_the_textmate_grammar_is_the_one_the_lexer_writes() -> None:
    assert TEXTMATE.read_text() == lexer.textmate_json(), (
        "editors/vscode/syntaxes/schedlang.tmLanguage.json is stale: run "
        "`python -m schedlang.lang.lexer > editors/vscode/syntaxes/schedlang.tmLanguage.json`"
    )


def test_the_textmate_grammar_matches_every_word_of_the_grammar() -> None:
    """Its patterns, run with Python's re (Oniguruma reads these the same), on each word."""
    grammar = json.loads(TEXTMATE.read_text())
    patterns = [re.compile(rule["match"]) for rule in grammar["patterns"]]
    statement = patterns[3]
    words = [p for p in patterns if p.pattern.startswith("(?<![\\w.])")]
    for word in statement_words() - {"block"}:
        assert statement.fullmatch(f"  {word}"), word
    for word in literal_words() - statement_words() | {"global", "warp", "unroll_explicit"}:
        assert any(p.fullmatch(word) for p in words), word


def test_pygmentize_finds_the_lexer_by_its_entry_point() -> None:
    """The entry point of pyproject.toml, as installed by `pip install -e .`."""
    pygmentize = Path(sys.executable).parent / "pygmentize"  # Pygments is a dependency
    found = subprocess.run(
        [pygmentize, "-l", "schedlang", "-f", "html", ROOT / "examples" / "matmul.sched"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert '<span class="k">vectorize</span>' in found.stdout


def on_a_terminal(*args: str, env: dict[str, str] | None = None) -> str:
    """`python -m schedlang ARGS` with its stdout on a pseudo-terminal; what it printed there."""
    import os
    import pty

    main, secondary = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | (env or {})
    process = subprocess.run(
        [sys.executable, "-m", "schedlang", *args],
        stdout=secondary, stderr=subprocess.PIPE, env=environment, cwd=ROOT, timeout=60,
    )  # fmt: skip
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other end is closed: all was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert process.returncode == 0, process.stderr
    return b"".join(chunks).decode()


@pytest.fixture
def unformatted(tmp_path: Path) -> Path:
    path = tmp_path / "s.sched"
    path.write_text("block C:\n  split   k by 4\n")
    return path


def test_fmt_diff_is_coloured_on_a_terminal(unformatted: Path) -> None:
    shown = on_a_terminal("fmt", "--diff", str(unformatted))
    assert "\x1b[" in shown
    assert "split k by 4" in re.sub(r"\x1b\[[0-9;]*m", "", shown)


@pytest.mark.parametrize("how", ["--no-color", "NO_COLOR"])
def test_no_color_or_NO_COLOR_turns_the_colours_off(unformatted: Path, how: str) -> None:
    if how == "NO_COLOR":
        shown = on_a_terminal("fmt", "--diff", str(unformatted), env={"NO_COLOR": "1"})
    else:
        shown = on_a_terminal("--no-color", "fmt", "--diff", str(unformatted))
    assert "\x1b" not in shown
    assert "+  split k by 4" in shown


def test_a_schedule_is_plain_text_where_stdout_is_no_terminal(unformatted: Path) -> None:
    """As every other test of the CLI sees it: CliRunner's stdout is no terminal."""
    from typer.testing import CliRunner

    from schedlang import cli

    result = CliRunner().invoke(cli.app, ["fmt", "--diff", str(unformatted)])
    assert "\x1b" not in result.output and "+  split k by 4" in result.output
