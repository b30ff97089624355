"""AST → canonical text (`schedlang fmt`): parse(format(s)) == s, comments kept, idempotent.

Canonical layout: one statement per line; statements of a `block` section indented two spaces;
single blank lines kept where the source had them; trailing comments two spaces after the code.
"""

from __future__ import annotations

from schedlang.lang import nodes, statements
from schedlang.lang.statements.args import format_factor
from schedlang.lang.statements.loops import format_tile_factors

__all__ = [
    "format_choices",
    "format_factor",
    "format_schedule",
    "format_stmt",
    "format_tile_factors",
]

INDENT = "  "


def format_schedule(schedule: nodes.Schedule) -> str:
    lines: list[str] = []
    in_section = False
    items = schedule.items
    for index, item in enumerate(items):
        if isinstance(item, nodes.Comment) and item.trailing and lines:
            lines[-1] += f"  # {item.text}".rstrip()
            continue
        if index in schedule.blank_before and lines:
            lines.append("")
        if isinstance(item, nodes.BlockHeader):
            in_section = True
        # A comment takes the indentation of what it annotates: the next statement.
        following = next((i for i in items[index:] if isinstance(i, nodes.Stmt)), None)
        indent = INDENT if in_section and not isinstance(following, nodes.BlockHeader) else ""
        if isinstance(item, nodes.BlockHeader):
            indent = ""
        text = f"# {item.text}".rstrip() if isinstance(item, nodes.Comment) else format_stmt(item)
        lines.append(indent + text)
    return "\n".join(lines) + "\n" if lines else ""


def format_stmt(stmt: nodes.Stmt) -> str:
    match stmt:
        case nodes.BlockHeader(block=block):
            return f"block {block.text}:"
        case nodes.Param(name=name, choices=choices):
            return f"param {name.text} in {format_choices(choices)}"
    spec = statements.BY_NODE.get(type(stmt))
    if spec is None:
        raise TypeError(f"cannot format {type(stmt).__name__}")
    return spec.format(stmt)


def format_choices(choices: nodes.Choices) -> str:
    match choices:
        case nodes.ListChoices(values=values):
            return "[" + ", ".join(map(str, values)) + "]"
        case nodes.Pow2Choices(low=low, high=high):
            return f"pow2({low}, {high})"
        case nodes.RangeChoices(low=low, high=high, step=step):
            return f"range({low}, {high})" if step == 1 else f"range({low}, {high}, {step})"
    raise TypeError(f"not a choice set: {choices!r}")
