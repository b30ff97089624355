"""Harness: bytes → parse → validate → format → reparse.

The parser must return a schedule or Diagnostics for any text (never raise anything else), every
diagnostic must point inside the text, and what parses must print back to text that reparses to
the same AST (fuzz/properties.py, `parse_property`).

    python fuzz/fuzz_parse.py fuzz/corpus/parse -dict=fuzz/schedlang.dict -max_total_time=600
    python fuzz/fuzz_parse.py --random 20000      # without atheris
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `fuzz` and `schedlang` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.driver import instrumented, main

with instrumented():
    from fuzz.properties import parse_property

STATS: collections.Counter = collections.Counter()


def decode(data: bytes) -> str:
    """UTF-8 when the bytes are UTF-8; otherwise one character per byte, so that control
    characters, NUL and stray high bytes all reach the parser."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def test_one_input(data: bytes) -> None:
    schedule = parse_property(decode(data))
    STATS["parsed" if schedule is not None else "diagnosed"] += 1


if __name__ == "__main__":
    main(test_one_input, "fuzz_parse", STATS)
