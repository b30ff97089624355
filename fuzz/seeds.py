"""Write the seed corpora: `python fuzz/seeds.py` (re)creates fuzz/corpus/parse and
fuzz/corpus/check from the example schedules (what the fuzzers add to those folders stays), and
fuzz/schedlang.dict, the language's tokens as a libFuzzer dictionary.

- parse: every example schedule (examples/, examples/cuda/, prompts/examples/) and a few edge
  cases (empty, comments only, CRLF, `;`-separated, knobs).
- check: for each example, `bytes([2, index]) + its text` (the text against the example's own op,
  see fuzz/cases.py `case_from_bytes`); and fixed pseudo-random decisions for generated (`0…`),
  mutated (`1…`) and live (`3…`) cases.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.driver import TOKENS
from fuzz.mutate import examples

CORPUS = Path(__file__).resolve().parent / "corpus"
DICTIONARY = Path(__file__).resolve().parent / "schedlang.dict"
EDGE_CASES = {
    "empty": "",
    "comments_only": "# nothing\n\n#\n",
    "crlf": "block C:\r\n  split i by 4\r\n  vectorize i.i\r\n",
    "semicolons": "block C: split i by 4; unroll i.o;; vectorize i.i\n",
    "knobs": "param T in [8, 16]\nparam U in pow2(1, 64)\nparam V in range(1, 9, 2)\nsplit i by T",
    "every_statement": (
        "param T in [8]\nblock C:\n  split i by *, 2, T\n  tile i.0, j by 2x2\n"
        "  reorder j.o, i.0.o\n"
        "  fuse i.1, i.2 as f\n  bind f threadIdx.x\n  vectorize j.i\n  unroll i.0.i\n"
        "  parallel j.o\n  cache_read A shared at k as A_sh\n  cache_write C local at j.o\n"
        "  compute_at A_sh k\n  reverse_compute_at C_local j.o\n  compute_inline B\n"
        "  reverse_compute_inline D\n  rfactor k as C_rf\n  decompose_reduction C at k\n"
        "  storage_align A_sh dim 0 factor 32 offset 1\n"
        "  pragma i auto_unroll_max_step=16, unroll_explicit=0\n"
    ),
}


def _escape(byte: int) -> str:
    """A byte as libFuzzer's dictionary format writes it."""
    return chr(byte) if 32 <= byte < 127 and chr(byte) not in '"\\' else f"\\x{byte:02X}"


def write(folder: Path, name: str, data: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def main() -> None:
    for index, example in enumerate(examples()):
        name = example.name.replace("/", "-")
        write(CORPUS / "parse", name, example.text.encode("utf-8"))
        write(CORPUS / "check", f"text-{name}", bytes([2, index]) + example.text.encode("utf-8"))
    for name, text in EDGE_CASES.items():
        write(CORPUS / "parse", f"{name}.sched", text.encode("utf-8"))
    lines = ['"' + "".join(_escape(byte) for byte in token) + '"' for token in TOKENS]
    DICTIONARY.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rng = random.Random(0)
    for kind, label, count in ((0, "generated", 12), (1, "mutated", 12), (3, "live", 6)):
        for n in range(count):
            size = rng.randint(32, 256) if kind != 3 else rng.randint(512, 1024)
            data = bytes([kind]) + bytes(rng.getrandbits(8) for _ in range(size))
            write(CORPUS / "check", f"{label}-{n:02d}", data)


if __name__ == "__main__":
    main()
