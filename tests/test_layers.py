"""The package's layers import downward only, and no import cycle among schedlang's modules.

The layers, lowest first, each a subpackage, are `schedlang.LAYERS`: the one list of them, which
docs/architecture.md's drawing must show in the same order (highest at the top).

A module may import its own layer and the layers below it. Every import counts: at module
level, inside a function, under `if TYPE_CHECKING:`. A cycle that only a function-level import
closes still means neither module can be read, tested or replaced without the other. The graph is
read from the source with `ast`, so nothing but the package's cheap `__init__` is imported here.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

from schedlang import LAYERS

PACKAGE = Path(__file__).resolve().parent.parent / "schedlang"
TOP = {"", "__main__"}  # the package's own __init__ (lazy exports) and `python -m schedlang`


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> dict[str, int]:
    """The schedlang modules `path` imports, each with the line of its first import."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target and target not in modules:  # `schedlang.lang.statements.loops.X` → its module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("schedlang."):
                    add(alias.name.removeprefix("schedlang."), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                absolute = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module == "schedlang" or (node.module or "").startswith("schedlang."):
                absolute = node.module.removeprefix("schedlang").lstrip(".")
            else:
                continue
            for alias in node.names:  # `from schedlang import ast` imports a module
                submodule = f"{absolute}.{alias.name}" if absolute else alias.name
                add(submodule if submodule in modules else absolute, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths} - {""}
    return {module_name(path): imported_modules(path, modules) for path in paths}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one cycle
    through all its modules where there is one, else its modules sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph.get(node, {}):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(component)
    edges = [
        f"{source} → {target} (schedlang/{source.replace('.', '/')}.py:{line})"
        for source in component
        for target, line in sorted(graph[source].items())
        if target in members
    ]
    return f"{' ↔ '.join(component)}:\n    " + "\n    ".join(edges)


def test_the_graph_sees_module_and_function_level_imports() -> None:
    graph = import_graph()
    assert "core.diagnostics" in graph["lang.syntax"]  # module level
    assert "tuning.plot" in graph["workflows.op_tuning"]  # in a function


def test_a_cycle_is_found_whichever_import_closes_it() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert "c → a (schedlang/c.py:3)" in describe(["a", "b", "c"], graph)


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles among schedlang's modules:\n" + "\n".join(
        describe(c, graph) for c in found
    )


def test_a_worker_starts_without_tvm_or_torch() -> None:
    """A spawned worker imports schedlang.run.sandbox before it can block torch (which tvm_ffi
    imports whenever it is installed): if sandbox pulled TVM in at import, every worker would pay
    for torch, 2.5x its start-up (it did once, through outcome → ops)."""
    import subprocess
    import sys

    code = "import sys, schedlang.run.sandbox; print('tvm' in sys.modules, 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["False", "False"], result.stderr


def layer_of(module: str) -> int | None:
    return None if module in TOP else LAYERS.index(module.split(".")[0])


def test_every_module_sits_in_a_layer() -> None:
    strays = [m for m in import_graph() if m not in TOP and m.split(".")[0] not in LAYERS]
    assert not strays, f"modules outside the layers {LAYERS}: {strays}"


def test_layers_import_downward_only() -> None:
    graph = import_graph()
    upward = [
        f"{source} → {target} (schedlang/{source.replace('.', '/')}.py:{line})"
        for source, targets in sorted(graph.items())
        if layer_of(source) is not None
        for target, line in sorted(targets.items())
        if layer_of(target) is not None and layer_of(target) > layer_of(source)
    ]
    assert not upward, "imports of a higher layer:\n    " + "\n    ".join(upward)


# The layers below workflows that hold the database and a proposer's internals: the CLI reaches
# them only through schedlang.workflows (its queries, its tune_op and tune_model), issue 46.
BEHIND_THE_WORKFLOWS = ("store", "propose", "tuning")


def test_the_cli_reaches_the_database_and_proposers_only_through_workflows() -> None:
    graph = import_graph()
    direct = [
        f"{source} → {target} (schedlang/{source.replace('.', '/')}.py:{line})"
        for source, targets in sorted(graph.items())
        if source.split(".")[0] == "cli"
        for target, line in sorted(targets.items())
        if target.split(".")[0] in BEHIND_THE_WORKFLOWS
    ]
    assert not direct, "CLI modules importing below the workflows:\n    " + "\n    ".join(direct)


def drawing() -> str:
    """The tree drawn in docs/architecture.md: its first ```text block."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    return text.split("```text\n", 1)[1].split("```", 1)[0]


def drawn_layers() -> list[str]:
    """The layers the drawing shows, top to bottom."""
    return [line.split()[0][:-1] for line in drawing().splitlines() if line[:1].strip()]


def test_the_drawing_shows_the_layers_in_their_order() -> None:
    assert drawn_layers() == list(reversed(LAYERS)), (
        "docs/architecture.md draws the layers (top to bottom) otherwise than schedlang.LAYERS "
        f"(lowest first): {drawn_layers()} vs {list(LAYERS)}"
    )


def test_the_drawing_says_where_each_command_lives() -> None:
    """Each command is named on its cli/ module's line of the drawing and on no other line of a
    module that registers commands (`best` and `history` live in cli/db.py, not cli/tune.py)."""
    registered = {
        path.stem: set(re.findall(r'^@command\("([\w-]+)"', path.read_text(), re.MULTILINE))
        for path in (PACKAGE / "cli").glob("*.py")
    }
    cli_block = drawing().split("\ncli/", 1)[1].split("\n")[1:]
    lines = {
        line.split()[0]: set(re.split(r"[\s,:]+", line.split(None, 1)[1]))
        for line in itertools.takewhile(lambda line: line.startswith("  "), cli_block)
    }
    misplaced = [
        f"{name}: registered in cli/{module}.py, drawn on the line of cli/{other}.py"
        for module, names in registered.items()
        for name in names
        for other, words in lines.items()
        if registered.get(other) and (name in words) != (other == module)
    ]
    assert not misplaced, "\n".join(misplaced)


def drawn_modules() -> set[str]:
    """The modules docs/architecture.md's drawing lists, as dotted names below schedlang."""
    drawn: set[str] = set()
    layer = sub = ""
    for line in drawing().splitlines():
        indent = len(line) - len(line.lstrip())
        first = line.split()[0] if line.strip() else ""
        if indent == 0 and first.endswith("/"):
            layer, sub = first[:-1], ""
        elif indent == 2 and first.endswith("/"):
            sub = first[:-1]
        elif indent == 2 and first:
            drawn.add(f"{layer}.{first}")
            sub = ""
        elif indent == 4 and sub:
            drawn.update(f"{layer}.{sub}.{name}" for name in line.split())
    return {name.removesuffix(".__init__") for name in drawn}


def test_the_drawing_in_architecture_md_matches_the_tree() -> None:
    modules = {m for m in import_graph() if m not in TOP}
    packages = {
        str(p.parent.relative_to(PACKAGE)).replace("/", ".") for p in PACKAGE.rglob("*/__init__.py")
    }
    drawn = drawn_modules()
    assert not drawn - modules, f"drawn but not in the tree: {sorted(drawn - modules)}"
    missing = modules - drawn - packages
    assert not missing, f"in the tree but not drawn: {sorted(missing)}"
