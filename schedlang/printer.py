"""AST → canonical text (`schedlang fmt`): parse(format(s)) == s, comments kept, idempotent.

Canonical layout: one statement per line; statements of a `block` section indented two spaces;
single blank lines kept where the source had them; trailing comments two spaces after the code.
"""

from __future__ import annotations

from schedlang import ast

INDENT = "  "


def format_schedule(schedule: ast.Schedule) -> str:
    lines: list[str] = []
    in_section = False
    items = schedule.items
    for index, item in enumerate(items):
        if isinstance(item, ast.Comment) and item.trailing and lines:
            lines[-1] += f"  # {item.text}".rstrip()
            continue
        if index in schedule.blank_before and lines:
            lines.append("")
        if isinstance(item, ast.BlockHeader):
            in_section = True
        # A comment takes the indentation of what it annotates: the next statement.
        following = next((i for i in items[index:] if isinstance(i, ast.Stmt)), None)
        indent = INDENT if in_section and not isinstance(following, ast.BlockHeader) else ""
        if isinstance(item, ast.BlockHeader):
            indent = ""
        text = f"# {item.text}".rstrip() if isinstance(item, ast.Comment) else format_stmt(item)
        lines.append(indent + text)
    return "\n".join(lines) + "\n" if lines else ""


def format_stmt(stmt: ast.Stmt) -> str:
    match stmt:
        case ast.BlockHeader(block=block):
            return f"block {block.text}:"
        case ast.Param(name=name, choices=choices):
            return f"param {name.text} in {format_choices(choices)}"
        case ast.Split(axis=axis, factors=factors):
            return f"split {axis.text} by {', '.join(map(format_factor, factors))}"
        case ast.Tile(axes=axes, factors=factors):
            return f"tile {_names(axes)} by {format_tile_factors(factors)}"
        case ast.Reorder(axes=axes):
            return f"reorder {_names(axes)}"
        case ast.Fuse(axes=axes, alias=alias):
            return f"fuse {_names(axes)}{_alias(alias)}"
        case ast.Bind(axis=axis, thread=thread):
            return f"bind {axis.text} {thread.text}"
        case ast.Vectorize(axis=axis) | ast.Unroll(axis=axis) | ast.Parallel(axis=axis):
            return f"{stmt.keyword} {axis.text}"
        case (
            ast.CacheRead(buffer=target, scope=scope, at=at, alias=alias, keep_unit_loops=keep)
            | ast.CacheWrite(block=target, scope=scope, at=at, alias=alias, keep_unit_loops=keep)
        ):
            where = f" at {at.text}{_keep(keep)}" if at else ""
            return f"{stmt.keyword} {target.text} {scope.text}{where}{_alias(alias)}"
        case (
            ast.ComputeAt(block=block, axis=axis, keep_unit_loops=keep)
            | ast.ReverseComputeAt(block=block, axis=axis, keep_unit_loops=keep)
        ):
            return f"{stmt.keyword} {block.text} {axis.text}{_keep(keep)}"
        case ast.ComputeInline(block=block) | ast.ReverseComputeInline(block=block):
            return f"{stmt.keyword} {block.text}"
        case ast.Rfactor(axis=axis, alias=alias, factor_axis=factor_axis):
            position = f" factor_axis {factor_axis.value}" if factor_axis is not None else ""
            return f"rfactor {axis.text}{position}{_alias(alias)}"
        case ast.DecomposeReduction(block=block, axis=axis):
            return f"decompose_reduction {block.text + ' ' if block else ''}at {axis.text}"
        case ast.StorageAlign(block=block, dim=dim, factor=factor, offset=offset):
            return (
                f"storage_align {block.text} dim {dim.value} factor {factor.value} "
                f"offset {offset.value}"
            )
        case ast.Pragma(axis=axis, items=items):
            pairs = ", ".join(f"{i.key.text}={format_factor(i.value)}" for i in items)
            return f"pragma {axis.text} {pairs}"
    raise TypeError(f"cannot format {type(stmt).__name__}")


def format_factor(factor: ast.Factor) -> str:
    match factor:
        case ast.IntFactor(value=value):
            return str(value)
        case ast.KnobFactor(name=name):
            return name
        case ast.InferredFactor():
            return "*"
    raise TypeError(f"not a factor: {factor!r}")


def format_tile_factors(factors: tuple[ast.Factor, ...]) -> str:
    """`32x32` when every factor is a number; `TI x 32` once a knob name needs the spaces."""
    parts = [format_factor(f) for f in factors]
    compact = all(isinstance(f, ast.IntFactor) and f.value >= 0 for f in factors)
    return "x".join(parts) if compact else " x ".join(parts)


def format_choices(choices: ast.Choices) -> str:
    match choices:
        case ast.ListChoices(values=values):
            return "[" + ", ".join(map(str, values)) + "]"
        case ast.Pow2Choices(low=low, high=high):
            return f"pow2({low}, {high})"
        case ast.RangeChoices(low=low, high=high, step=step):
            return f"range({low}, {high})" if step == 1 else f"range({low}, {high}, {step})"
    raise TypeError(f"not a choice set: {choices!r}")


def _names(names: tuple[ast.Name, ...]) -> str:
    return ", ".join(n.text for n in names)


def _alias(alias: ast.Name | None) -> str:
    return f" as {alias.text}" if alias else ""


def _keep(keep_unit_loops: bool) -> str:
    return " keep_unit_loops" if keep_unit_loops else ""
