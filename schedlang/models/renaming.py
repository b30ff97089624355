"""A function given the names of its structural twin: the block, loop and buffer names a record's
schedule speaks (`Record.extra["names"]`), put on a function that matches it but names them
otherwise, before the schedule is applied to it (schedlang.models.graph)."""

from __future__ import annotations

import io
import keyword
import re
import tokenize
from collections.abc import Mapping, Sequence

import tvm
import tvm_ffi
from tvm import tirx

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.core.opinfo import schedule_names


def rename_like(func: tirx.PrimFunc, names: Mapping[str, Sequence[str]]) -> tirx.PrimFunc:
    """`func` with the block, loop and buffer names of a structurally equal function whose
    `schedule_names` are `names`; raises SchedlangError when that cannot be done.

    The function goes through TVMScript: names are replaced as tokens (block names in
    `T.sblock("…")`, loop variables and buffers as identifiers), and the result must parse, be
    structurally equal to `func` and have exactly `names`. Names come from database records,
    which may come from anyone: only plain names go into the text that is parsed.
    """
    for kind in ("blocks", "loops", "buffers"):
        for name in names.get(kind, ()):
            if not _plain(name, dotted=kind == "blocks"):
                raise SchedlangError(f"the record names its {kind} oddly: {name!r}")
    text = func.script()
    ours = schedule_names(tvm.script.from_source(text))  # the names as printed
    identifiers: dict[str, str] = {}
    blocks: dict[str, str] = {}
    for kind, table in (("loops", identifiers), ("buffers", identifiers), ("blocks", blocks)):
        theirs = list(names.get(kind, ()))
        if len(theirs) != len(ours[kind]):
            raise SchedlangError(f"the functions have different {kind}")
        for old, new in zip(ours[kind], theirs, strict=True):
            if table.setdefault(old, new) != new:
                raise SchedlangError(f"`{old}` would need two names, `{table[old]}` and `{new}`")
    renamed_text = _replace_names(text, identifiers, blocks)
    try:
        renamed = tvm.script.from_source(renamed_text)
    except Exception as exc:
        raise SchedlangError(f"the renamed function does not parse: {error_line(exc)}") from None
    if not tvm_ffi.structural_equal(renamed, func) or schedule_names(renamed) != {
        kind: list(names.get(kind, ())) for kind in ("blocks", "loops", "buffers")
    }:
        raise SchedlangError("renaming changed the function")
    return renamed


def _plain(name: object, dotted: bool) -> bool:
    """An identifier (a block name may have dots: TVM names a cache block `A_shared.dyn`)."""
    pattern = r"[A-Za-z_][A-Za-z0-9_.]*" if dotted else r"[A-Za-z_][A-Za-z0-9_]*"
    return (
        isinstance(name, str) and bool(re.fullmatch(pattern, name)) and not keyword.iskeyword(name)
    )


def _replace_names(text: str, identifiers: dict[str, str], blocks: dict[str, str]) -> str:
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    kept: set[str] = set()  # identifiers left as they are
    depth = 0
    for index, token in enumerate(tokens):
        before = tokens[index - 1].string if index else ""
        after = tokens[index + 1].string if index + 1 < len(tokens) else ""
        if token.type == tokenize.OP:
            depth += token.string in "([{"
            depth -= token.string in ")]}"
        elif token.type == tokenize.NAME and before not in (".", "def"):
            is_keyword_argument = depth > 0 and after == "="
            if token.string in identifiers and not is_keyword_argument:
                edits.append((token.start, token.end, identifiers[token.string]))
            elif not is_keyword_argument:
                kept.add(token.string)
        elif token.type == tokenize.STRING and _is_block_name(tokens, index):
            name = token.string[1:-1]
            if name in blocks:
                edits.append((token.start, token.end, f'"{blocks[name]}"'))
    new_names = {new for old, new in identifiers.items() if old != new}
    clashes = sorted(new_names & (kept - set(identifiers)))
    if clashes:
        raise SchedlangError(
            f"`{clashes[0]}` cannot be given to the function: it names another thing"
        )
    lines = text.splitlines(keepends=True)
    for (row, col), (end_row, end_col), new in sorted(edits, reverse=True):
        assert row == end_row, "names are single-line tokens"
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[end_col:]
    return "".join(lines)


def _is_block_name(tokens: list[tokenize.TokenInfo], index: int) -> bool:
    """Whether the string at `index` is the name in `T.sblock("name")`."""
    return index >= 2 and tokens[index - 1].string == "(" and tokens[index - 2].string == "sblock"
