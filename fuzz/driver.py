"""Running a harness: under atheris (coverage-guided libFuzzer) when it is installed, or with a
plain mutation-based random driver (`--random N`) when it is not.

    python fuzz/fuzz_parse.py fuzz/corpus/parse -max_total_time=600 -timeout=60
    python fuzz/fuzz_parse.py --random 20000 [--seed 1] [--corpus fuzz/corpus/parse]

The random driver replays the seed corpus, then feeds inputs made by mutating corpus entries
(bytes flipped, inserted, deleted, duplicated, spliced, and the language's keywords inserted) or
fresh random bytes. An input that raises is saved to fuzz/crashes/<harness>-<sha1> and the run goes
on; every 1000 inputs and at the end it prints what it has counted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import random
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
CRASH_DIR = HERE / "crashes"
# Inserted by the random driver (and given to libFuzzer as a dictionary, fuzz/schedlang.dict).
TOKENS = [
    b"block ", b"split ", b" by ", b"tile ", b"reorder ", b"fuse ", b" as ", b"bind ",
    b"vectorize ", b"unroll ", b"parallel ", b"cache_read ", b"cache_write ", b" at ",
    b"compute_at ", b"reverse_compute_at ", b"compute_inline ", b"reverse_compute_inline ",
    b"rfactor ", b"decompose_reduction ", b"storage_align ", b" dim ", b" factor ", b" offset ",
    b"pragma ", b"auto_unroll_max_step=", b"unroll_explicit=", b"param ", b" in ", b"pow2(",
    b"range(", b"[", b"]", b",", b"x", b"*", b":", b";", b"\n", b"#", b".o", b".i", b".0",
    b"blockIdx.x", b"threadIdx.y", b"vthread.z", b"shared", b"shared.dyn", b"local", b"global",
    b"warp", b"0", b"1", b"-1", b"4096", b"99999999999999999999", b"i", b"j", b"k", b"C",
]  # fmt: skip


def main(test_one_input: Callable[[bytes], None], name: str, stats: collections.Counter) -> None:
    """The harness's entry point: `--random N` runs the random driver, anything else atheris."""
    if "--random" in sys.argv:
        parser = argparse.ArgumentParser(prog=f"fuzz/{name}.py")
        parser.add_argument("--random", type=int, required=True, help="inputs to run")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--corpus", type=Path, default=HERE / "corpus" / name.split("_")[-1])
        args = parser.parse_args()
        failures = random_driver(test_one_input, name, stats, args.random, args.seed, args.corpus)
        sys.exit(1 if failures else 0)
    try:
        import atheris
    except ImportError:
        sys.exit(f"atheris is not installed (pip install atheris); or run: {name}.py --random N")
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


def instrumented() -> contextlib.AbstractContextManager:
    """Around a harness's imports: atheris's coverage instrumentation of schedlang, lark and the
    fuzz modules when the harness runs as a script under atheris, else nothing. (Instrumenting
    everything loaded would include TVM and torch: tens of thousands of functions.)"""
    script = Path(getattr(sys.modules.get("__main__"), "__file__", None) or "").name
    if "--random" in sys.argv or not script.startswith("fuzz_"):
        return contextlib.nullcontext()
    try:
        import atheris
    except ImportError:
        return contextlib.nullcontext()
    return atheris.instrument_imports(include=["schedlang", "lark", "fuzz"])


def corpus_inputs(corpus: Path) -> list[bytes]:
    return [path.read_bytes() for path in sorted(corpus.glob("*")) if path.is_file()]


def mutated(rng: random.Random, seeds: list[bytes]) -> bytes:
    """One input: a corpus entry with a few mutations, or (one in ten) fresh random bytes."""
    if not seeds or rng.random() < 0.1:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 512)))
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 6)):
        position = rng.randint(0, len(data))
        action = rng.randrange(6)
        if action == 0 and data:
            data[min(position, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif action == 1:
            data[position:position] = bytes([rng.getrandbits(8)])
        elif action == 2:
            del data[position : position + rng.randint(1, 16)]
        elif action == 3:
            data[position:position] = data[position : position + rng.randint(1, 32)]
        elif action == 4:
            other = rng.choice(seeds)
            start = rng.randint(0, len(other))
            data[position:] = other[start : start + rng.randint(0, 256)]
        else:
            data[position:position] = rng.choice(TOKENS)
    return bytes(data)


def random_driver(
    test_one_input: Callable[[bytes], None],
    name: str,
    stats: collections.Counter,
    count: int,
    seed: int,
    corpus: Path,
) -> int:
    """Run the corpus, then `count` mutated inputs; return how many raised."""
    rng = random.Random(seed)
    seeds = corpus_inputs(corpus)
    failures: collections.Counter = collections.Counter()
    start = time.perf_counter()
    inputs = [*seeds, *(None for _ in range(count))]
    for executed, data in enumerate(inputs, 1):
        data = mutated(rng, seeds) if data is None else data
        try:
            test_one_input(data)
        except Exception as exc:
            kind = f"{type(exc).__name__}: {_first_line(exc)}"
            if not failures[kind]:
                path = save_crash(name, data)
                print(f"\n=== {kind}\nsaved to {path}", flush=True)
                traceback.print_exc()
            failures[kind] += 1
        if executed % 1000 == 0 or executed == len(inputs):
            elapsed = time.perf_counter() - start
            print(f"{name}: {executed} inputs in {elapsed:.0f} s, {sum(failures.values())} "
                  f"failures ({len(failures)} distinct); {dict(stats)}", flush=True)  # fmt: skip
    return sum(failures.values())


def save_crash(name: str, data: bytes) -> Path:
    CRASH_DIR.mkdir(exist_ok=True)
    path = CRASH_DIR / f"{name}-{hashlib.sha1(data).hexdigest()}"
    path.write_bytes(data)
    return path


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0][:200] if lines else ""
