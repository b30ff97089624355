"""Schedules written as stepwise decoding writes them, checked prefix by prefix, each op in a
child process, so that a crash of the checker (TVM segfaulting in a pass it runs) is found and
named with the prefix that caused it rather than taking the run down.

A uniform choice among what each step offers (a pattern's text drawn uniformly) is the least
likely model: it reaches the corners a trained one never would. Every prefix the decoder builds
is checked (`StepDecoder.state`, the full check once the prefix may end), and every answer is
checked again whole. A finding is a crash (the child died), an internal error (an exception
other than a diagnostic) or an answer the decoder kept that the full check refuses.

    TVM_NUM_THREADS=1 python fuzz/stepwise_run.py --minutes 20 --target cuda --seed 0 \\
        --out fuzz/work/stepwise0

Findings go to OUT/findings.jsonl (kind, op, defines, target, the schedule or prefix, the
error), the figures to OUT/summary.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: `fuzz` is a folder of the repository
    sys.path.insert(0, str(ROOT))

from fuzz.nests import Chooser  # noqa: E402
from fuzz.sizes import OPS, odd_sized_example  # noqa: E402

HANG_S = 300  # an answer that long without a word from the child is a hang


class _Uniform(Chooser):
    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def choice(self, options):
        return self.rng.choice(list(options))

    def boolean(self) -> bool:
        return self.rng.random() < 0.5


def _write(decoder, rng: random.Random, trace: Path):
    """One answer, as `StepDecoder.decode` writes it (its limits, tries and backtracking), each
    step a uniform choice among those offered; every prefix tried is in `trace` first."""
    from schedlang.lang.statements import StepPattern
    from schedlang.llm.stepwise import END, StepAnswer

    answer = StepAnswer(tries_left=decoder.limits.tries)
    answer.state = decoder._initial()
    step = 0
    while (steps := decoder._offer(answer)) is not None:
        step += 1
        state = answer.state
        if state.can_end and not answer.finishing and rng.random() < 0.1:
            text = END
        else:
            chosen = rng.choice(steps)
            text = chosen.sample(rng) if isinstance(chosen, StepPattern) else chosen
        trace.write_text("\n".join([*state.lines, text]) + "\n")
        decoder._take(answer, text + "\n", step)
    return answer


def _child(seed: int, target_name: str, count: int, trace: str, results) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    from schedlang.checker.check import check
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.lang.syntax import parse
    from schedlang.llm.stepwise import StepDecoder

    rng = random.Random(seed)
    example = odd_sized_example(_Uniform(rng), rng.choice(sorted(OPS)))
    defines = dict(example.defines)
    target = resolve_target(target_name)
    where = {"op": example.op_file, "defines": defines}
    results.put({"kind": "op", **where})
    op = load_op(str(ROOT / "examples" / example.op_file), defines)
    decoder = StepDecoder(op, target)
    for _ in range(count):
        try:
            answer = _write(decoder, rng, Path(trace))
            text = answer.text
            verdict = "kept" if answer.state is not None and answer.state.can_end else "unfinished"
            if verdict == "kept" and not check(parse(text), op.func, target).ok:
                verdict = "kept_but_refused"
            results.put({"kind": verdict, **where, "schedule": text})
        except Exception:  # noqa: BLE001 - an internal error is what this run looks for
            prefix = Path(trace).read_text()
            results.put({"kind": "internal_error", **where, "prefix": prefix,
                         "error": traceback.format_exc()})  # fmt: skip
    results.put({"kind": "done"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answers", type=int, default=24, help="answers per op and size")
    parser.add_argument("--out", default="fuzz/work/stepwise")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    findings = (out / "findings.jsonl").open("a")
    counts = {"ops": 0, "answers": 0, "kept": 0, "unfinished": 0, "kept_but_refused": 0,
              "internal_error": 0, "crash": 0, "hang": 0}  # fmt: skip
    context = multiprocessing.get_context("spawn")
    deadline = time.monotonic() + 60 * args.minutes
    seed = args.seed * 1_000_000
    while time.monotonic() < deadline:
        seed += 1
        trace = out / f"trace-{seed}.txt"
        results = context.Queue()
        child = context.Process(
            target=_child, args=(seed, args.target, args.answers, str(trace), results)
        )
        child.start()
        op, heard = None, time.monotonic()
        while True:
            try:
                item = results.get(timeout=5)
                heard = time.monotonic()
            except Exception:  # noqa: BLE001 - queue.Empty: is the child still there?
                hung = time.monotonic() - heard > HANG_S
                if child.is_alive() and not hung:
                    continue
                if hung:
                    child.kill()
                    child.join()
                kind = "hang" if hung else "crash"
                counts[kind] += 1
                prefix = trace.read_text() if trace.exists() else ""
                finding = {"kind": kind, "exitcode": child.exitcode, **(op or {}),
                           "target": args.target, "prefix": prefix}  # fmt: skip
                findings.write(json.dumps(finding) + "\n")
                findings.flush()
                print(f"{kind} (exit {child.exitcode}) on {finding.get('op')}: "
                      f"{finding['prefix']!r}", flush=True)  # fmt: skip
                break
            if item["kind"] == "done":
                break
            if item["kind"] == "op":
                op = {"op": item["op"], "defines": item["defines"]}
                counts["ops"] += 1
                continue
            counts["answers"] += 1
            counts[item["kind"]] += 1
            if item["kind"] in ("internal_error", "kept_but_refused"):
                findings.write(json.dumps({**item, "target": args.target}) + "\n")
                findings.flush()
                print(f"{item['kind']} on {item['op']}", flush=True)
        child.join(timeout=10)
        trace.unlink(missing_ok=True)
    summary = {**counts, "target": args.target, "seed": args.seed, "minutes": args.minutes}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
