"""The figures of an evaluation (schedlang.llm.evaluate), per op and arm, all read back from the
arm's database (or, for MetaSchedule, its own records): see evaluate's docstring for what each
figure is.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.ops import Op
from schedlang.core.target import Target
from schedlang.llm.feedback import is_baseline
from schedlang.propose.interface import Context
from schedlang.store.db import Database
from schedlang.store.records import Record, op_key

CHECKPOINTS = (8, 16)  # best-so-far figures after these many trials, and after the whole budget
REACH_TOLERANCE = 0.05  # "reached the built-in best": within the timing noise of this machine


def eval_runs(db: Database, key: str, target_key: str) -> list[tuple[dict, list[dict]]]:
    """The arm's runs for this op and target, each with its log (decoded)."""
    found = []
    for run in db.runs(key, target_key):
        if run["proposer"].startswith("eval:"):
            found.append((run, [json.loads(text) for text in db.decisions(run["id"])]))
    return found


def _parses(text: str) -> bool:
    from schedlang.lang.syntax import parse

    try:
        parse(text, "<record>")
    except SchedlangError:
        return False
    return True


def _has_statements(text: str) -> bool:
    from schedlang.lang.syntax import parse

    try:
        return bool(parse(text, "<answer>").statements)
    except SchedlangError:
        return True  # it does not parse: review says so


def trial_records(
    db: Database, key: str, target_key: str, budget: int | None = None
) -> tuple[list[Record], list[Record]]:
    """(trials, unparsed): the arm's measured candidates in order, the first `budget` of them;
    and the answers recorded before the last of them that did not parse (tune keeps those as
    check_error records, but they are no trials)."""
    trials: list[Record] = []
    unparsed: list[Record] = []
    for record in db.records(key, target_key):
        if is_baseline(record):
            continue
        (trials if _parses(record.schedule) else unparsed).append(record)
    trials = trials[:budget] if budget is not None else trials
    if trials:
        unparsed = [r for r in unparsed if (r.id or 0) < (trials[-1].id or 0)]
    return trials, unparsed


def first_answer(record: Record) -> str | None:
    """The model's answer before any repair, as the proposer reviewed it."""
    reply = record.extra.get("reply") or {}
    answer = reply.get("answer")
    return answer if answer is not None else reply.get("text")


def answer_counts(answers: Iterable[str | None], op: Op, target: Target) -> tuple[int, int, int]:
    """(answers, parsed, clean): how many answers parse and check clean on the op and target
    (templates at their knobs' first values, as the proposer reviews them). None, or an answer
    with no statement, counts as an answer that does not parse."""
    from schedlang.llm.proposer import review

    context = Context(op, target)
    total = parsed = clean = 0
    for answer in answers:
        total += 1
        if answer is None or not _has_statements(answer):  # nothing written is no schedule
            continue
        result = review(answer, context)
        parsed += result.parsed
        clean += result.ok
    return total, parsed, clean


def _best(records: Sequence[Record]) -> Record | None:
    ok = [r for r in records if r.is_ok and r.median_s]
    return min(ok, key=lambda r: r.median_s or math.inf) if ok else None


def _point(after: int, record: Record | None) -> dict:
    return {
        "after": after,
        "gflops": record.gflops if record else None,
        "latency_s": record.median_s if record else None,
        "record": record.id if record else None,
    }


def checkpoints(budget: int) -> list[int]:
    return [n for n in CHECKPOINTS if n < budget] + [budget]


def trials_to_reach(trials: Sequence[Record], latency_s: float | None) -> int | None:
    """The 1-based trial at which a latency within REACH_TOLERANCE of `latency_s` was first
    measured; None if never."""
    if not latency_s:
        return None
    limit = latency_s * (1 + REACH_TOLERANCE)
    for number, record in enumerate(trials, 1):
        if record.is_ok and record.median_s and record.median_s <= limit:
            return number
    return None


def _rate(part: float | None, whole: int | None) -> float | None:
    return round(part / whole, 4) if part is not None and whole else None


def figures(
    db: Database,
    op: Op,
    target: Target,
    budget: int,
    kind: str,
    builtin_latency_s: float | None = None,
) -> dict:
    """Every figure of one arm on one op, from its database (see the module's docstring)."""
    key, target_key = op_key(op.func), target.key
    trials, unparsed = trial_records(db, key, target_key, budget)
    # Time and tokens were spent on every trial of the arm: more than the budget when a run
    # with a larger budget shares it.
    measured = max(len(trial_records(db, key, target_key)[0]), 1)
    runs = eval_runs(db, key, target_key)
    rounds = [entry for _, log in runs for entry in log if "round" in entry]
    best = _best(trials)
    out: dict[str, Any] = {
        "trials": len(trials),
        "budget": budget,
        "ok": sum(r.is_ok for r in trials),
        "ok_rate": _rate(sum(r.is_ok for r in trials), len(trials)),
        "best": [_point(n, _best(trials[:n])) for n in checkpoints(budget)],
        "best_record": best.id if best else None,
        # The built-in arm's own: how soon it found (nearly) its best.
        "reached_builtin_best": trials_to_reach(
            trials, best.median_s if kind == "builtin" and best else builtin_latency_s
        ),
        "wall_s": round(_wall_s(db, runs, key, target_key), 3),
        "error": _last_error(runs) if len(trials) < budget else None,
    }
    out["wall_s_per_trial"] = _rate(out["wall_s"], measured) if trials else None
    if kind == "model":
        out |= _model_figures(trials, unparsed, rounds, op, target, measured)
    return out


def _model_figures(trials, unparsed, rounds, op: Op, target: Target, measured: int) -> dict:
    answers: dict[Any, Record] = {}  # one record per answer: a template's points share theirs
    for record in [*unparsed, *trials]:
        run = record.extra.get("run_id")
        answers.setdefault((run, record.template) if record.template else record.id, record)
    no_answer = sum(entry["no_answer"] for entry in rounds)
    texts = [first_answer(r) for r in answers.values()] + [None] * no_answer
    total, parsed, clean = answer_counts(texts, op, target)
    tokens = sum(entry["tokens"] for entry in rounds)
    model_s = sum(entry["model_s"] for entry in rounds)
    steps = [r.extra.get("steps") or {} for r in answers.values()]
    replies = sum(entry["replies"] for entry in rounds)
    proposals = sum(entry["proposals"] for entry in rounds)
    return {
        "replies": replies,
        "answers": len(answers),
        "no_answer": no_answer,
        "repeats": replies - no_answer - proposals,
        "parsed": parsed,
        "parse_rate": _rate(parsed, total),
        "clean": clean,
        "clean_rate": _rate(clean, total),
        "repairs": {
            "asked": sum("repair" in r.extra for r in answers.values()),
            "clean": sum(bool(r.extra.get("repaired")) for r in answers.values()),
            "resampled": sum(len(s.get("rejected") or ()) for s in steps),
            "backtracks": sum(int(s.get("backtracks") or 0) for s in steps),
        },
        "rounds": len(rounds),
        "tokens": tokens,
        "tokens_per_trial": _rate(tokens, measured) if trials else None,
        "model_s": round(model_s, 3),
        "model_s_per_trial": _rate(model_s, measured) if trials else None,
    }


def _wall_s(db: Database, runs, key: str, target_key: str) -> float:
    """The arm's runs, each from its start to its logged end (else its last record)."""
    created = sorted(r.created_at for r in db.records(key, target_key))
    starts = [run["started_at"] for run, _ in runs] + [math.inf]
    total = 0.0
    for (run, log), next_start in zip(runs, starts[1:], strict=True):
        ends = [entry["end"] for entry in log if "end" in entry]
        inside = [t for t in created if run["started_at"] <= t < next_start]
        end = ends[-1] if ends else max(inside, default=run["started_at"])
        total += max(end - run["started_at"], 0.0)
    return total


def _last_error(runs) -> str | None:
    errors = [entry["error"] for _, log in runs for entry in log if "error" in entry]
    return errors[-1] if errors else None


def total_figures(per_op: Sequence[dict], kind: str) -> dict:
    """One arm's figures over the suite: counts summed, rates over the sums, best figures as
    geometric means over the ops that have one."""
    arms = [figures for figures in per_op if figures is not None]
    trials = sum(a["trials"] for a in arms)
    out: dict[str, Any] = {
        "ops": len(arms),
        "trials": trials,
        "ok": sum(a["ok"] for a in arms),
        "ok_rate": _rate(sum(a["ok"] for a in arms), trials),
        "wall_s": round(sum(a["wall_s"] for a in arms), 3),
        "reached_builtin_best": sum(a["reached_builtin_best"] is not None for a in arms),
    }
    out["wall_s_per_trial"] = _rate(out["wall_s"], trials)
    out["best_geomean_gflops"] = {
        str(n): _geomean([p["gflops"] for a in arms for p in a["best"] if p["after"] == n])
        for n in sorted({p["after"] for a in arms for p in a["best"]})
    }
    if kind == "model":
        for name in ("replies", "answers", "no_answer", "repeats", "parsed", "clean", "tokens"):
            out[name] = sum(a[name] for a in arms)
        total = out["answers"] + out["no_answer"]
        out["parse_rate"] = _rate(out["parsed"], total)
        out["clean_rate"] = _rate(out["clean"], total)
        out["tokens_per_trial"] = _rate(out["tokens"], trials)
        out["model_s_per_trial"] = _rate(sum(a["model_s"] for a in arms), trials)
        out["repairs"] = {
            name: sum(a["repairs"][name] for a in arms)
            for name in ("asked", "clean", "resampled", "backtracks")
        }
    return out


def _geomean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v]
    if not present or len(present) < len(values):
        return None
    return round(math.exp(sum(math.log(v) for v in present) / len(present)), 4)


# --- MetaSchedule's figures, from its own records -----------------------------------------------


def metaschedule_dir(arm_path: Path, op: Op, target: Target) -> Path:
    """Where MetaSchedule's tuning of `op` on `target` for the arm at `arm_path` is kept."""
    digest = hashlib.sha256(target.key.encode()).hexdigest()[:8]
    return arm_path.with_suffix("") / f"{op_key(op.func)}-{digest}"


def metaschedule_trials(folder: Path) -> list[float | None]:
    """Each trial's mean run time in order (None: it failed), from MetaSchedule's record file."""
    path = folder / "database_tuning_record.json"
    if not path.is_file():
        return []
    trials: list[float | None] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        run_secs = json.loads(line)[1][1] or []
        valid = [float(s) for s in run_secs if float(s) < 1e9]
        trials.append(sum(valid) / len(valid) if valid and len(valid) == len(run_secs) else None)
    return trials


def metaschedule_figures(
    arm_path: Path, op: Op, target: Target, budget: int, builtin_latency_s: float | None
) -> dict:
    """The figures of the MetaSchedule arm at `arm_path`, from MetaSchedule's own records."""
    from schedlang.core.opinfo import flop_count

    folder = metaschedule_dir(arm_path, op, target)
    latencies = metaschedule_trials(folder)[:budget]
    flops = flop_count(op.func)

    def best_after(n: int) -> dict:
        measured = [t for t in latencies[:n] if t]
        fastest = min(measured, default=None)
        gflops = flops / fastest / 1e9 if fastest else None
        return {"after": n, "gflops": gflops, "latency_s": fastest, "record": None}

    reached = None
    for number, latency in enumerate(latencies, 1):
        if latency and builtin_latency_s and latency <= builtin_latency_s * (1 + REACH_TOLERANCE):
            reached = number
            break
    times = folder / "eval.json"
    wall = json.loads(times.read_text()) if times.is_file() else None
    ok = sum(t is not None for t in latencies)
    wall_s = round(wall["end"] - wall["started"], 3) if wall else 0.0
    return {
        "trials": len(latencies),
        "budget": budget,
        "ok": ok,
        "ok_rate": _rate(ok, len(latencies)),
        "best": [best_after(n) for n in checkpoints(budget)],
        "best_record": None,
        "reached_builtin_best": reached,
        "wall_s": wall_s,
        "wall_s_per_trial": _rate(wall_s, len(latencies)),
        "error": None,
        "timing": "MetaSchedule's runner: mean of 3 runs of at least 100 ms",
    }
