"""Bounds that keep the package readable in one sitting (issue 30): no module over 800 lines, no
class over 400, no function over 80, tables excepted; no module named like a standard-library
module; few duplicated blocks. Read from the source with `ast` and `tokenize`, nothing imported.

A table is a literal display (dict, list, tuple, set) of constants, names and nested displays: its
lines are data, not code to read, and do not count towards the size of what holds it.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
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
    Call(...)` whose arguments are all declarative. A registry entry (`SPLIT = Statement(keyword=
    "split", node=nodes.Split, guard=guard_split, ...)`) is a table row; the bodies of its lambdas
    are code and still count."""
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


def is_field(node: ast.AST) -> bool:
    """`name: type`, `name: type = a table` or `NAME = a table` in a class (a field, an enum
    member): a declaration, not code."""
    if isinstance(node, ast.Assign):
        return all(isinstance(t, ast.Name) for t in node.targets) and is_table(node.value)
    return isinstance(node, ast.AnnAssign) and (node.value is None or is_table(node.value))


def shape_lines(path: Path) -> list[tuple[int, str]]:
    """Each line that counts, as (line number, shape): names, strings and numbers replaced, so
    code alike but for its names reads the same. Blank lines, comments, docstrings, imports and
    lines of lone punctuation do not count (as for the `duplicates` tool), nor do tables, a
    class's field declarations (and the header of a class that holds nothing else), function
    signatures, and lines of string literals alone."""
    keywords = set(__import__("keyword").kwlist) | {"self"}
    text = path.read_text()
    tree = ast.parse(text)
    skipped = table_lines(tree)  # data, not code
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):  # field declarations are data too
            fields = [f for f in node.body if is_field(f)]
            for field in fields:
                skipped.update(range(field.lineno, field.end_lineno + 1))
            if len(fields) + (ast.get_docstring(node) is not None) == len(node.body):
                skipped.update(range(node.lineno - len(node.decorator_list), node.lineno + 1))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            # A signature declares parameters: lines from `def` to the body are not code either.
            skipped.update(range(node.lineno, node.body[0].lineno))
        docstring = (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        )
        if docstring or isinstance(node, ast.Import | ast.ImportFrom):
            skipped.update(range(node.lineno, node.end_lineno + 1))
    shapes: dict[int, list[str]] = defaultdict(list)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        line = token.start[0]
        if token.type == tokenize.NAME:
            shapes[line].append(token.string if token.string in keywords else "N" + token.string)
        elif token.type == tokenize.STRING:
            shapes[line].append("S")
        elif token.type == tokenize.NUMBER:
            shapes[line].append("0")
        elif token.type == tokenize.OP:
            shapes[line].append(token.string)
    return [
        (line, " ".join(parts))
        for line, parts in sorted(shapes.items())
        if line not in skipped and any(p[0].isalnum() for p in parts) and not is_text(parts)
    ]


def is_text(parts: list[str]) -> bool:
    """A line of string literals alone (a message that goes on from the line before): prose."""
    return "S" in parts and all(p == "S" or not p[0].isalnum() for p in parts)


def renamed(shapes) -> str:
    """The lines with each name replaced by the order of its first use: code alike but for its
    names reads the same; code that uses one name where the other uses two does not."""
    order: dict[str, str] = {}
    words = []
    for shape in shapes:
        for part in shape.split(" "):
            if part.startswith("N") and part != "None":
                part = order.setdefault(part, f"${len(order)}")
            words.append(part)
        words.append("\n")
    return " ".join(words)


def duplicate_pairs() -> list[str]:
    """Pairs of places (a file's run of lines, another run) sharing WINDOW lines of one shape."""
    windows: dict[str, list[tuple[Path, int]]] = defaultdict(list)
    files = {path: shape_lines(path) for path in sources()}
    for path, lines in files.items():
        for start in range(len(lines) - WINDOW + 1):
            windows[renamed(shape for _, shape in lines[start : start + WINDOW])].append(
                (path, start)
            )
    pairs: dict[tuple[Path, Path], set[tuple[int, int]]] = defaultdict(set)
    for places in windows.values():
        if len(places) < 2 or len(places) > TOO_COMMON:
            continue
        for i, (a, start_a) in enumerate(places):
            for b, start_b in places[i + 1 :]:
                if a == b and abs(start_a - start_b) < WINDOW:
                    continue  # a run overlapping itself (a repeated line)
                pairs[(a, b)].add((start_a, start_b))
    found = []
    for (a, b), starts in sorted(pairs.items()):
        # Consecutive windows along one diagonal are one run; a pair of files counts once, at
        # its first run, with how many more it has (as the `duplicates` tool counts).
        runs = [s for s in sorted(starts) if (s[0] - 1, s[1] - 1) not in starts]
        line_a, line_b = files[a][runs[0][0]][0], files[b][runs[0][1]][0]
        more = f" (+{len(runs) - 1} more runs)" if len(runs) > 1 else ""
        found.append(f"{a.relative_to(PACKAGE)}:{line_a} ~ {b.relative_to(PACKAGE)}:{line_b}{more}")
    return found


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
    assert pair.startswith("one.py:2 ~ two.py:2")
    assert oversized() == []
