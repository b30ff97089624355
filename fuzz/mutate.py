"""The example schedules (examples/, examples/cuda/, prompts/examples/), mutated: statements
dropped, duplicated, moved or swapped, numbers changed, names replaced by other names of the
schedule, scopes and thread axes swapped.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fuzz.nests import Chooser
from schedlang.lang import nodes, statements

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Example:
    """An example schedule and the op it schedules, at a size that builds and runs quickly."""

    name: str
    text: str
    op_file: str | None  # examples/NAME.py, or None for the prompts' `elementwise`
    defines: tuple[tuple[str, str], ...]
    gpu: bool


# Sizes that keep each example's factors meaningful and its run in milliseconds.
SMALL_SIZES = {
    "matmul.py": {"M": "64", "N": "48", "K": "32"},
    "matmul_4x4.py": {},
    "batch_matmul.py": {"batch": "2", "M": "8", "N": "32", "K": "16"},
    "conv2d.py": {"N": "1", "C": "4", "H": "8", "W": "16", "K": "8"},
    "depthwise_conv2d.py": {"N": "1", "C": "4", "H": "8", "W": "16"},
    "layernorm.py": {"rows": "16", "cols": "64"},
    "softmax.py": {"rows": "16", "cols": "64"},
}
_OP_LINE = re.compile(r"#\s*op:\s*(?:examples/)?(\S+)(.*)")


@cache
def examples() -> tuple[Example, ...]:
    """examples/*.sched (CPU, at small sizes), examples/cuda/*.sched and prompts/examples/*.sched
    (at the sizes their `# op:` line gives)."""
    found = []
    for path in sorted((ROOT / "examples").glob("*.sched")):
        op_file = _op_file_for(path)
        found.append(
            Example(
                path.name,
                path.read_text(encoding="utf-8"),
                op_file,
                tuple(SMALL_SIZES.get(op_file, {}).items()),
                False,
            )
        )
    for folder in (ROOT / "examples" / "cuda", ROOT / "prompts" / "examples"):
        for path in sorted(folder.glob("*.sched")):
            text = path.read_text(encoding="utf-8")
            match = _OP_LINE.match(text)
            if not match:
                continue
            op_file = match[1] if match[1].endswith(".py") else None
            defines = tuple(
                tuple(d.split("=", 1)) for d in match[2].replace("-D ", "").split() if "=" in d
            )
            gpu = "cuda" in path.parts or path.stem.endswith("-gpu")
            found.append(Example(f"{folder.name}/{path.name}", text, op_file, defines, gpu))
    return tuple(found)


def _op_file_for(schedule: Path) -> str:
    """`matmul.sched` → `matmul.py`; `matmul_packed.sched` → `matmul.py` unless `matmul_packed.py`
    exists (the longest op-file name the schedule's name starts with, as tests/test_examples.py)."""
    stems = [p.stem for p in (ROOT / "examples").glob("*.py")]
    stem = schedule.stem
    matches = [s for s in stems if stem == s or stem.startswith(f"{s}_")]
    return f"{max(matches, key=len, default=stem)}.py"


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?![\w.])")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*")
_KEYWORDS = {
    *statements.KEYWORDS,
    "by",
    "at",
    "as",
    "in",
    "dim",
    "factor",
    "offset",
    "x",
    "pow2",
    "range",
    *nodes.SCOPES,
    *nodes.THREAD_AXES,
    *nodes.PRAGMA_KEYS,
}
SWAPPED_WORDS = (*nodes.SCOPES, *nodes.THREAD_AXES)
_SWAPPED = re.compile("|".join(re.escape(w) for w in sorted(SWAPPED_WORDS, key=len, reverse=True)))
NUMBERS = (0, 1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 97, 128, 256, 1000, 1024, 4096, -1, 2**31, 10**20)


def mutate(chooser: Chooser, text: str) -> str:
    """`text` with 1-4 mutations: a statement dropped, duplicated or moved, a number changed, a
    name replaced by another name of the schedule, a scope or a thread axis swapped."""
    lines = [
        line for line in text.split("\n") if line.strip() and not line.lstrip().startswith("#")
    ]
    names = sorted({n for line in lines for n in _NAME.findall(line) if n not in _KEYWORDS})
    for _ in range(chooser.integer(1, 4)):
        if not lines:
            break
        index = chooser.integer(0, len(lines) - 1)
        line = lines[index]
        action = chooser.choice(["number", "name", "drop", "duplicate", "move", "swap", "word"])
        if action == "drop":
            del lines[index]
        elif action == "duplicate":
            lines.insert(chooser.integer(0, len(lines)), line)
        elif action == "move":
            del lines[index]
            lines.insert(chooser.integer(0, len(lines)), line)
        elif action == "swap":
            other = chooser.integer(0, len(lines) - 1)
            lines[index], lines[other] = lines[other], line
        elif action == "number":
            lines[index] = _replace_one(chooser, _NUMBER, line, [str(n) for n in NUMBERS])
        elif action == "name" and names:
            lines[index] = _replace_one(chooser, _NAME, line, names, skip=_KEYWORDS)
        elif action == "word":
            lines[index] = _replace_one(chooser, _SWAPPED, line, SWAPPED_WORDS)
    return "\n".join(lines) + "\n"


def _replace_one(
    chooser: Chooser,
    pattern: re.Pattern,
    line: str,
    replacements: Sequence[str],
    skip: Collection[str] = (),
) -> str:
    """`line` with one match of `pattern` (not in `skip`) replaced by one of `replacements`."""
    matches = [m for m in pattern.finditer(line) if m.group(0) not in skip]
    if not matches:
        return line
    match = chooser.choice(matches)
    return line[: match.start()] + chooser.choice(replacements) + line[match.end() :]
