"""Bounds that keep the package readable in one sitting (issue 30): no module over 800 lines, no
class over 400, no function over 80, tables excepted; no module named like a standard-library
module; few duplicated blocks. Read from the source, nothing imported.

A table is a literal display (dict, list, tuple, set) of constants, names and nested displays: its
lines are data, not code to read, and do not count towards the size of what holds it. Duplicated
blocks are counted as the `duplicates` tool counts them (issue 46), declarations and tables
included: a statement's declaration that looks like another's is a place to derive one from the
other.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "schedlang"
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 800, 400, 80
WINDOW = 6  # lines alike that make a duplicated block
# Pairs of places sharing a run of WINDOW or more lines of the same shape (names, strings and
# numbers aside); the issue asked for at most 10 by the `duplicates` tool's count, which also
# leaves out runs found in more than 8 places (too common to be one piece of code).
MAX_DUPLICATE_PAIRS = 10
TOO_COMMON = 8


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def is_table(node: ast.AST) -> bool:
    if isinstance(node, ast.Dict):
        return all(k is None or is_table(k) for k in node.keys) and all(map(is_table, node.values))
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return all(map(is_table, node.elts))
    if isinstance(node, ast.UnaryOp):
        return is_table(node.operand)
    return isinstance(node, ast.Constant | ast.Name | ast.Attribute)


def is_declarative(node: ast.AST) -> bool:
    """A table, a lambda, or a call of names whose arguments are declarative (a factory)."""
    if isinstance(node, ast.Lambda) or is_table(node):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
        return all(map(is_declarative, [*node.args, *(k.value for k in node.keywords)]))
    return False


def table_lines(tree: ast.Module) -> set[int]:
    """The lines of every multi-line table in `tree`, and of a module-level declaration: `NAME =
    Call(...)` whose arguments are all declarative. A statement's declaration (`SPLIT = Syntax(
    "split", Split, "loops", (Axis(consumed=True), Factors(word="by")), ...)`) is a table row
    (for the sizes; duplicated blocks count it); the bodies of its lambdas are code and still
    count."""
    lines: set[int] = set()

    def add(node: ast.AST) -> None:
        lines.update(range(node.lineno, node.end_lineno + 1))

    for node in ast.walk(tree):
        table = isinstance(node, ast.Dict | ast.List | ast.Tuple | ast.Set) and is_table(node)
        if table and node.end_lineno > node.lineno:
            add(node)
    for statement in tree.body:
        value = statement.value if isinstance(statement, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Call) and is_declarative(value):
            add(value)
            for node in ast.walk(value):
                if isinstance(node, ast.Lambda):
                    lines.difference_update(range(node.body.lineno, node.body.end_lineno + 1))
    return lines


def size(node: ast.AST, tables: set[int]) -> int:
    span = range(node.lineno, node.end_lineno + 1)
    return sum(1 for line in span if line not in tables)


def oversized() -> list[str]:
    found = []
    for path in sources():
        text = path.read_text()
        tree = ast.parse(text, str(path))
        tables = table_lines(tree)
        where = path.relative_to(PACKAGE.parent)
        lines = len(text.splitlines()) - len(tables)
        if lines > MAX_MODULE:
            found.append(f"{where}: {lines} lines, max {MAX_MODULE}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and size(node, tables) > MAX_CLASS:
                found.append(
                    f"{where}:{node.lineno}: class {node.name}: {size(node, tables)} lines, "
                    f"max {MAX_CLASS}"
                )
            function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if function and size(node, tables) > MAX_FUNCTION:
                found.append(
                    f"{where}:{node.lineno}: {node.name}(): {size(node, tables)} lines, "
                    f"max {MAX_FUNCTION}"
                )
    return found


# --- duplicated blocks, counted as the `duplicates` tool counts them -----------------------------

# A line that is only punctuation, too short to say anything, a comment or a docstring's opening
# line, or an import, is passed over; every other line counts, declarations and tables included.
NO_SUBSTANCE = re.compile(r"[\s{}()\[\];,:.]*")
PASSED_OVER = ("#", '"""', "'''")
IMPORT = re.compile(r"^(import\b|from \S+ import\b)")
TOKEN = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[A-Za-z_]\w*|[0-9][0-9a-fA-FxX_.]*|\S")
# Words that make a line a statement (a line that does something), when they start it.
STATEMENT_WORDS = {
    "if", "for", "while", "return", "else", "elif", "try", "except", "with", "raise", "yield",
    "await", "assert", "del", "continue", "break",
}  # fmt: skip
MIN_TOKENS, MIN_STATEMENTS = 4, 2  # a run thinner than this is alike only to the letter


def counted_lines(text: str) -> list[tuple[int, str, str, list[str]]]:
    """(line number, the line with its white space folded, its shape, its tokens) of each line
    that counts. The shape writes a name as `x`, a string as `s` and a number as `0`, so code
    alike but for its names and values reads the same."""
    found = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = " ".join(raw.split())
        if not len(line) >= 3 or NO_SUBSTANCE.fullmatch(line) or line.startswith(PASSED_OVER):
            continue
        if IMPORT.match(line):
            continue
        tokens = TOKEN.findall(line)
        shape = " ".join(
            "x"
            if t[0].isalpha() or t[0] == "_"
            else "s"
            if t[0] in "\"'"
            else "0"
            if t[0].isdigit()
            else t
            for t in tokens
        )
        found.append((number, line, shape, tokens))
    return found


def is_statement(shape: str, tokens: list[str]) -> bool:
    """A line that does something: it starts with a statement word, assigns, or is long."""
    parts = shape.split()
    if tokens and tokens[0] in STATEMENT_WORDS:
        return True
    for k, part in enumerate(parts):
        alone = k + 1 >= len(parts) or parts[k + 1] not in "=>"
        if part == "=" and alone and (k == 0 or parts[k - 1] not in "=!<>"):
            return True
    return len(parts) >= 8


def windows(path: Path) -> list[tuple[str, str | None, int, int]]:
    """Each run of WINDOW counted lines: (its text, its shape or None when too thin to be alike
    by shape alone, its first line, its last line)."""
    lines = counted_lines(path.read_text())
    runs = []
    for start in range(len(lines) - WINDOW + 1):
        run = lines[start : start + WINDOW]
        tokens = sum(len(shape.split()) for _, _, shape, _ in run)
        statements = sum(is_statement(shape, words) for _, _, shape, words in run)
        thin = tokens < MIN_TOKENS * WINDOW or statements < MIN_STATEMENTS
        shape = None if thin else "\n".join(shape for _, _, shape, _ in run)
        runs.append(("\n".join(line for _, line, _, _ in run), shape, run[0][0], run[-1][0]))
    return runs


def duplicate_pairs() -> list[str]:
    """Pairs of files (a file and itself included) with a run of WINDOW lines alike, to the letter
    or by shape, that stands in no more than TOO_COMMON places."""
    places: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for path in sources():
        name = str(path.relative_to(PACKAGE))
        for text, shape, first, last in windows(path):
            places["=" + text].append((name, first, last))
            if shape is not None:
                places["~" + shape].append((name, first, last))
    pairs: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for where in places.values():
        where = sorted(set(where))
        if len(where) > TOO_COMMON:
            continue
        for i, (a, a_first, a_last) in enumerate(where):
            for b, b_first, _ in where[i + 1 :]:
                if a == b and b_first <= a_last:
                    continue  # a run overlapping itself
                pairs[(a, b)].append((a_first, b_first))
    return [
        f"{a}:{min(starts)[0]} ~ {b}:{min(starts)[1]}" for (a, b), starts in sorted(pairs.items())
    ]


def test_no_module_class_or_function_past_its_bound() -> None:
    found = oversized()
    assert not found, "past the bounds:\n    " + "\n    ".join(found)


def test_no_module_named_like_the_standard_library() -> None:
    clashes = [
        str(path.relative_to(PACKAGE.parent))
        for path in sources()
        if path.stem in sys.stdlib_module_names or path.parent.name in sys.stdlib_module_names
    ]
    assert not clashes, f"named like a standard-library module: {clashes}"


def test_few_duplicated_blocks() -> None:
    found = duplicate_pairs()
    assert len(found) <= MAX_DUPLICATE_PAIRS, (
        f"{len(found)} duplicated blocks of {WINDOW}+ lines alike, max {MAX_DUPLICATE_PAIRS}:\n    "
        + "\n    ".join(found)
    )


def test_the_duplicate_finder_sees_code_alike_but_for_its_names(tmp_path, monkeypatch) -> None:
    body = "\n".join(
        f"    {v} = {v}_source.read({i})\n    total += {v}" for i, v in enumerate("abcd")
    )
    (tmp_path / "one.py").write_text(f"def one():\n    total = 0\n{body}\n    return total\n")
    renamed = body.replace("_source", "_input").replace("total", "count")
    (tmp_path / "two.py").write_text(f"def two():\n    count = 0\n{renamed}\n    return count\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    (tmp_path / "three.py").write_text(f"def three():\n    total = 0\n{body}\n    return 1\n")
    (pair,) = [p for p in duplicate_pairs() if p.startswith("one.py") and "two.py" in p]
    assert pair == "one.py:1 ~ two.py:1"
    assert oversized() == []


def test_the_duplicate_finder_counts_declarations_and_skips_the_too_common(tmp_path, monkeypatch):
    """Declarations alike are duplicates like any code; a run in more than TOO_COMMON places is
    too common to be one piece of code, and a run that is alike only in its punctuation and
    keywords (too thin) counts only when it is the same to the letter."""
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    declaration = (
        '{name} = Statement(\n    "{name}", nodes.{name}, "family",\n    example="e.g. {name}",\n'
        '    description="what {name} does",\n    summary=("a", "b", "c"),\n'
        "    guard={name}_guard,\n)\n"
    )
    (tmp_path / "one.py").write_text(declaration.format(name="split") + "x = 1\n")
    (tmp_path / "two.py").write_text(declaration.format(name="fuse") + "y = 2\n")
    assert duplicate_pairs() == ["one.py:1 ~ two.py:1"]
    for n in range(TOO_COMMON - 1):
        (tmp_path / f"more{n}.py").write_text(declaration.format(name=f"s{n}") + "z = 3\n")
    assert duplicate_pairs() == []
