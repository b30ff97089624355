"""Harness: bytes → a loop nest and a schedule → parse → check → build → run and compare.

The bytes are the generator's decisions (fuzz/generate.py, `case_from_bytes`): a random loop nest
with a mostly-right random schedule, a mutated example schedule, or an example's op with the rest
of the bytes as the schedule's text. Checking must return diagnostics or a lowered function, and a
schedule that checks clean must build (llvm, or CUDA C) and, on llvm, match the reference
(fuzz/properties.py, `run_case`).

    python fuzz/fuzz_check.py fuzz/corpus/check -max_total_time=1200 -timeout=120
    python fuzz/fuzz_check.py --random 2000      # without atheris
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `fuzz` and `schedlang` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.driver import instrumented, main

with instrumented():
    from fuzz.cases import case_from_bytes
    from fuzz.properties import hard_cap, run_case

STATS: collections.Counter = collections.Counter()


def test_one_input(data: bytes) -> None:
    case = case_from_bytes(data)
    with hard_cap(case.describe()):
        outcome = run_case(case)
    STATS[outcome.stage] += 1


if __name__ == "__main__":
    main(test_one_input, "fuzz_check", STATS)
