"""The long differential run: live cases (fuzz/cases.py `live_case`: an example op at odd sizes or
a random loop nest, and a schedule written over its live nest) through parse → check (errors
repaired) → poisoned build → guarded run in a sandbox worker → compare (fuzz/properties.py).

    TVM_NUM_THREADS=1 nice -n 19 python fuzz/diff_run.py --minutes 15 --seed 1

Every input is `--input-bytes` fresh random bytes from the seed, so a run repeats exactly. Each
finding (a verdict other than "verified", or any exception) is appended to
`<out>/findings.jsonl` with its bytes and the schedule that checked clean, and its bytes saved to
fuzz/crashes/; `python fuzz/shrink.py <out>/findings.jsonl` turns them into reproducers. Progress
goes to stdout every `--every` seconds; the last line is the run's figures as JSON.

An input that runs past the hard cap (a build that LLVM does not finish) ends the process
(fuzz/properties.py `hard_cap`). Run the same command with `--resume`: the input that was running
(`<out>/current.json`) is recorded as a "hang" finding and the run goes on after it. `--resume`
after a run that ended on time goes on with the next input, until `--minutes` in all.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz import live
from fuzz.cases import live_case
from fuzz.classes import classify
from fuzz.differential import WorkerBroken
from fuzz.driver import save_crash
from fuzz.nests import ByteChooser
from fuzz.properties import HARD_CAP_S, PropertyFailure, hard_cap, run_case

HERE = Path(__file__).resolve().parent
RETRY_S = 30.0  # how long to wait before running an input again when the worker itself broke
RETRIES = 20


def run(
    seconds: float,
    seed: int,
    input_bytes: int,
    out: Path,
    every: float,
    limit: int,
    resume: bool = False,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    counts: collections.Counter = collections.Counter()
    classes: collections.Counter = collections.Counter()
    current, state = out / "current.json", out / "state.json"
    skip, before = 0, 0.0  # inputs and seconds of the run resumed
    if resume and current.exists():
        hung = json.loads(current.read_text())
        record(out, bytes.fromhex(hung["input"]), "hang", hung["message"], None, hung["classes"])
        skip = hung["index"] + 1
        if state.exists():
            saved = json.loads(state.read_text())
            counts.update(saved["counts"])
            classes.update(saved["classes"])
            before = saved["seconds"]
        counts["inputs"] += 1
        counts["hang"] += 1
    elif resume and state.exists():  # a run that ended on time: go on where it stopped
        saved = json.loads(state.read_text())
        counts.update(saved["counts"])
        classes.update(saved["classes"])
        before = saved["seconds"]
        skip = counts["inputs"]
    for _ in range(skip):
        rng.randbytes(input_bytes)
    start = last = time.perf_counter() - before
    index = skip - 1
    while time.perf_counter() - start < seconds and counts["inputs"] < limit:
        data = rng.randbytes(input_bytes)
        index += 1
        counts["inputs"] += 1
        case = live_case(ByteChooser(data))
        found = classify(case)
        classes.update(found)
        message = f"ran past the hard cap of {HARD_CAP_S:g} s\n{case.describe()}"
        current.write_text(json.dumps({"index": index, "input": data.hex(),
                                       "message": message, "classes": sorted(found)}))  # fmt: skip
        try:
            outcome = run_once_more_if_broken(case)
            counts[outcome.stage] += 1
        except PropertyFailure as failure:
            counts[failure.kind] += 1
            record(out, data, failure.kind, str(failure), failure.schedule, found)
        except Exception as exc:  # the front end itself failing on an input is a finding too
            counts["exception"] += 1
            message = "".join(traceback.format_exception(exc))
            record(out, data, "exception", message, None, found)
        state.write_text(json.dumps({"counts": counts, "classes": classes,
                                     "seconds": time.perf_counter() - start}))  # fmt: skip
        if time.perf_counter() - last > every:
            last = time.perf_counter()
            print(json.dumps(figures(counts, classes, last - start)), flush=True)
    current.unlink(missing_ok=True)
    result = figures(counts, classes, time.perf_counter() - start)
    print(json.dumps(result), flush=True)
    return result


def run_once_more_if_broken(case):
    """run_case under the hard cap; again after a pause while the worker cannot run anything
    (WorkerBroken)."""
    for _ in range(RETRIES):
        try:
            with hard_cap(case.describe()):
                return run_case(case)
        except WorkerBroken as broken:
            print(f"worker broken ({broken}); again in {RETRY_S:g} s", flush=True)
            time.sleep(RETRY_S)
    with hard_cap(case.describe()):
        return run_case(case)


def figures(counts: collections.Counter, classes: collections.Counter, seconds: float) -> dict:
    findings = sum(v for k, v in counts.items() if k not in ("inputs", "syntax", "diagnosed",
                                                               "verified"))  # fmt: skip
    clean = counts["verified"] + findings - counts["exception"] - counts["internal"]
    return {
        "inputs": counts["inputs"],
        "check_clean": clean,
        "verified": counts["verified"],
        "findings": findings,
        # Builds past properties.BUILD_LIMIT_S, and inputs that ran past the hard cap (a build
        # that did not end, mostly): outcomes of their own, apart from the differential verdicts.
        "slow_builds": counts["slow_build"],
        "hangs": counts["hang"],
        "by_kind": {k: v for k, v in counts.items() if k not in ("inputs",)},
        "classes_generated": dict(sorted(classes.items())),
        "seconds": round(seconds, 1),
        "inputs_per_s": round(counts["inputs"] / seconds, 2) if seconds else 0.0,
    }


def record(out: Path, data: bytes, kind: str, message: str, schedule, classes) -> None:
    path = save_crash("fuzz_diff", data)
    entry = {"input": data.hex(), "kind": kind, "message": message, "schedule": schedule,
             "classes": sorted(classes), "file": str(path)}  # fmt: skip
    with (out / "findings.jsonl").open("a", encoding="utf-8") as findings:
        findings.write(json.dumps(entry) + "\n")
    print(f"=== {kind}: {message.splitlines()[0]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="fuzz/diff_run.py", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--inputs", type=int, default=10**9, help="stop after this many")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--input-bytes", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=HERE / "work" / "diff")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between progress lines")
    parser.add_argument("--resume", action="store_true", help="go on after a hang (see above)")
    parser.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="STATEMENT=W",
        help="how often the live writer writes a statement (fuzz/live.py WEIGHTS), e.g. rfactor=9",
    )
    args = parser.parse_args()
    for item in args.weight:
        name, _, weight = item.partition("=")
        if name not in live.WEIGHTS or not weight.isdigit():
            parser.error(f"--weight {item}: one of {', '.join(live.WEIGHTS)}, then =N")
        live.WEIGHTS[name] = int(weight)
    run(args.minutes * 60, args.seed, args.input_bytes, args.out, args.every, args.inputs,
        args.resume)  # fmt: skip


if __name__ == "__main__":
    main()
