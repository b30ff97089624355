"""Fenced code blocks of the Markdown docs, their markers, and the shell commands in them.

A block is a fence (three or more backticks and a language word) to the matching closing fence. An
HTML comment on the lines just before the fence (blank lines between are allowed) marks it:

    <!-- not-run: REASON -->   the block is not run here; REASON says why (a GPU, a tracker, pip)
    <!-- file: NAME -->        the block's text is written to NAME in the working folder (an op
                               file or a schedule a later command uses), not run
    <!-- exits: CODE -->       every command of the block must exit with CODE (1: an error shown
                               on purpose); in a ```console block its output must be the one
                               shown (`exits: 0` keeps a command's shown output true)

`tests/test_docs.py` runs every unmarked (or `exits`) ```sh (```bash, ```shell), ```console and
```python block. Any other marker is an error, and so is a `not-run` with no reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = ("sh", "bash", "shell", "console", "python")
MARKERS = ("not-run", "file", "exits")
FENCE = re.compile(r"^(`{3,})([\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*([\w-]+)\s*:?(.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the opening fence's line, 1-based
    lang: str
    text: str
    marker: str | None = None  # "not-run" | "file" | "exits" | None
    argument: str = ""  # the reason, the file name or the exit code

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE and self.marker in (None, "exits")


class MarkerError(ValueError):
    pass


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the marker before it, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, at = [], 0
    while at < len(lines):
        opening = FENCE.match(lines[at])
        if not opening:
            at += 1
            continue
        fence, lang = opening.groups()
        end = at + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        if end == len(lines):
            raise MarkerError(f"{path.name}:{at + 1}: a ``` block that is never closed")
        marker, argument = _marker_before(lines, at, path)
        text = "\n".join(lines[at + 1 : end]) + "\n"
        found.append(Block(path, at + 1, lang, text, marker, argument))
        at = end + 1
    return found


def _marker_before(lines: list[str], fence_at: int, path: Path) -> tuple[str | None, str]:
    before = fence_at - 1
    while before >= 0 and not lines[before].strip():
        before -= 1
    match = MARKER.match(lines[before].strip()) if before >= 0 else None
    if not match:
        return None, ""
    marker, argument = match.group(1), match.group(2).strip()
    where = f"{path.name}:{before + 1}"
    if marker not in MARKERS:
        raise MarkerError(f"{where}: unknown marker `{marker}`; the markers are {MARKERS}")
    if not argument:
        raise MarkerError(
            f"{where}: `{marker}` needs {'a reason' if marker == 'not-run' else 'a name'}"
        )
    if marker == "exits" and not argument.isdigit():
        raise MarkerError(f"{where}: `exits` needs an exit code, not `{argument}`")
    return marker, argument


def console_steps(block: Block) -> list[tuple[str, str]]:
    """A ```console block as (command, the output shown after it) pairs."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            steps.append((line, []))
        elif steps and steps[-1][0].endswith("\\") and not steps[-1][1]:
            steps[-1] = (steps[-1][0][:-1] + " " + line.strip(), [])
        elif steps:
            steps[-1][1].append(line)
    return [(_drop_comment(c[2:]).strip(), "\n".join(out).strip()) for c, out in steps]


def commands(block: Block) -> list[str]:
    """The shell commands of a ```sh or ```console block: continuation lines joined, comments
    dropped. In a console block only `$ ` lines are commands (the rest is output); an sh block
    may show the prompt too."""
    found: list[str] = []
    pending = ""
    for raw in block.text.splitlines():
        line = raw.rstrip()
        if not pending:
            stripped = line.lstrip()
            if stripped.startswith("$ "):
                line = stripped[2:]
            elif block.lang == "console" or stripped.startswith("#") or not stripped:
                continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        found.append(_drop_comment(pending + line).strip())
        pending = ""
    if pending:
        found.append(_drop_comment(pending).strip())
    return [c for c in found if c]


def _drop_comment(command: str) -> str:
    """The command without a trailing `# comment` (a `#` outside quotes, after a space)."""
    quote = None
    for at, char in enumerate(command):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (at == 0 or command[at - 1].isspace()):
            return command[:at]
    return command
