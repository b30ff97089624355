"""Sample efficiency, as the field reports it (issue 48): a model's latency, measured, against the
trials spent, for schedlang and for MetaSchedule on the same module, 2 threads, one run each; the
trials schedlang needs to reach MetaSchedule's latency at N trials, and the ratio (N over them).

    python bench/bench_sample_efficiency.py --model resnet18 --trials 1000 --out sample.json
    python bench/bench_sample_efficiency.py --model mlp --trials 32 --checkpoints 8 16 32

schedlang: one `tune_model` run of N trials (the gradient task scheduler, no early stop, a fresh
database), paused at each checkpoint (after the round that crosses it) to build the model from
the database's best records, check it against the model's reference (or the default build) and
time it (`--repeat` repeats of at least 100 ms, the median); its estimate (the tasks' best times
their calls) is kept after every round too. MetaSchedule: one `tune_relax` run of N trials on the
fused module TVM's pipeline makes (as bench/bench_models.py: its gradient scheduler, evolutionary
search, XGBoost cost model, 16 trials an iteration, the weights layout-free), then at each
checkpoint k the module built from its first k tuning records in the order they were measured
(its JSON database's file order: `get_all_tuning_records` sorts by speed), timed the same way. A
MetaSchedule trial that failed to build or run is not in its database, so its curve counts only
the trials that produced a record: that favours MetaSchedule, never schedlang.

The trials schedlang needs are read off its measured curve: the first checkpoint at which it is
as fast as MetaSchedule at N, so an upper bound at the checkpoints' spacing (the ratio a lower
bound); also from its estimate, round by round (how issue 48 read 136 trials off the logs). The
machine must be quiet: a shared CPU moves every timing. Needs the metaschedule extra (xgboost,
cloudpickle; `--no-metaschedule` times schedlang's curve alone), torch for ResNet-18.
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_NUM_THREADS", "2")  # before TVM starts: 2 threads, as issue 48 asks

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_models import (  # noqa: E402
    MODELS,
    metaschedule_build,
    metaschedule_fused,
    metaschedule_tune_relax,
    planned_tasks,
)

CHECKPOINTS = (16, 32, 64, 100, 136, 200, 256, 400, 512, 750, 1000)


def checkpoints_for(trials: int, given: Sequence[int] | None = None) -> list[int]:
    """The checkpoints up to `trials`, `trials` itself always the last."""
    chosen = sorted({c for c in (given or CHECKPOINTS) if 0 < c < trials})
    return [*chosen, trials]


# --- the arithmetic ------------------------------------------------------------------------------


def latency_at(points: Sequence[dict], trials: int, key: str = "measured_s") -> float | None:
    """The latency of the last point at or before `trials` (None if none)."""
    before = [p for p in points if p["trials"] <= trials and p.get(key) is not None]
    return before[-1][key] if before else None


def trials_to_reach(
    points: Sequence[dict], latency_s: float, key: str = "measured_s"
) -> int | None:
    """The trials of the first point at least as fast as `latency_s` (None if no point is)."""
    return next(
        (p["trials"] for p in points if p.get(key) is not None and p[key] <= latency_s), None
    )


def efficiency(ours: dict, theirs: dict, at: int) -> dict:
    """MetaSchedule's latency at `at` trials, the trials schedlang needs to reach it (measured,
    and by its estimate), and the ratios `at` over them."""
    target = latency_at(theirs["points"], at)
    if target is None:
        return {"at": at, "metaschedule_s": None}
    measured = trials_to_reach(ours["points"], target)
    estimated = trials_to_reach(ours["estimates"], target, key="estimate_s")
    return {
        "at": at,
        "metaschedule_s": target,
        "schedlang_trials": measured,
        "ratio": at / measured if measured else None,
        "schedlang_trials_by_estimate": estimated,
        "ratio_by_estimate": at / estimated if estimated else None,
        "schedlang_at_same_s": latency_at(ours["points"], at),
    }


def trial_quality(records: Sequence, far: float = 10.0) -> dict:
    """How the trials went (issue 48's figures): of the candidates measured (not a task's
    unscheduled build), the share that ran more than `far` times their task's best, and the
    share refused by the checker (each a trial spent on nothing)."""
    trials = [r for r in records if r.proposer != "baseline" and r.schedule != ""]
    best: dict[str, float] = {}
    for record in trials:
        if record.is_ok and record.median_s:
            best[record.op_key] = min(best.get(record.op_key, float("inf")), record.median_s)
    slow = sum(
        1
        for r in trials
        if r.is_ok and r.median_s and r.op_key in best and r.median_s > far * best[r.op_key]
    )
    refused = sum(1 for r in trials if str(r.status) == "check_error")
    count = len(trials) or 1
    return {
        "trials": len(trials),
        "slower_than_10x_best": round(slow / count, 3),
        "refused_by_checker": round(refused / count, 3),
    }


# --- schedlang ---------------------------------------------------------------------------------


def schedlang_curve(
    model,
    tgt,
    trials: int,
    checkpoints: Sequence[int],
    work: Path,
    seed: int,
    repeat: int,
    cost_model: str = "off",
) -> dict:
    """One `tune_model` run of `trials`, the model built, checked and timed at each checkpoint;
    `cost_model` as `tune-model --cost-model` (to measure whether it pays)."""
    from schedlang.models.graph import build_default, build_model, run_model
    from schedlang.models.tune_model import MIN_REPEAT_MS, REPEAT, tune_model
    from schedlang.store.db import Database
    from schedlang.tuning.tune import Settings

    db_path, tasks, _, proposers, covered = planned_tasks(model, tgt, work)
    expected = model.expected_outputs()
    if expected is None:
        expected = run_model(build_default(model.mod, tgt), model.inputs, tgt)
    left = list(checkpoints)
    points: list[dict] = []
    estimates: list[dict] = []
    tuning_s, started = 0.0, time.perf_counter()
    with Database(str(db_path)) as db:
        scheduler = None
        settings = Settings(  # no early stop: the curve runs to `trials`
            seed=seed, repeat=REPEAT, min_repeat_ms=MIN_REPEAT_MS, cost_model=cost_model,
            early_stop=False,
        )  # fmt: skip
        for turn in tune_model(covered, tgt, db, settings, trials=trials, proposers=proposers):
            scheduler = turn.scheduler
            estimate, missing = scheduler.estimate_s()
            if not missing:
                estimates.append({"trials": scheduler.measured, "estimate_s": estimate})
            if left and scheduler.measured >= left[0]:
                tuning_s += time.perf_counter() - started
                while left and scheduler.measured >= left[0]:
                    left.pop(0)
                points.append(_timed(model, tgt, db, expected, repeat, build_model) | {
                    "trials": scheduler.measured, "estimate_s": estimate if not missing else None,
                    "tuning_s": round(tuning_s, 1),
                })  # fmt: skip
                started = time.perf_counter()
        if scheduler is not None and (not points or points[-1]["trials"] < scheduler.measured):
            tuning_s += time.perf_counter() - started
            estimate, missing = scheduler.estimate_s()
            points.append(_timed(model, tgt, db, expected, repeat, build_model) | {
                "trials": scheduler.measured, "estimate_s": estimate if not missing else None,
                "tuning_s": round(tuning_s, 1),
            })  # fmt: skip
        quality = trial_quality([r for task in covered for r in db.records(task.key, tgt.key)])
    first_round = estimates[0] if estimates else None  # every task had a latency: round one
    return {
        "points": points,
        "estimates": estimates,
        "tasks": len(tasks),
        "quality": quality,
        # the estimate once every task had its first round, and the gain since (issue 48's 2.4%)
        "first_round": first_round,
        "gain_after_first_round": (
            round(first_round["estimate_s"] / estimates[-1]["estimate_s"] - 1, 4)
            if first_round and estimates
            else None
        ),
    }


def _timed(model, tgt, db, expected, repeat: int, build_model) -> dict:
    """The model built from `db`'s best records, checked against `expected`, and timed."""
    from schedlang.models.graph import run_model, time_model
    from schedlang.run.outcome import compare_outputs

    executable, _ = build_model(model.mod, tgt, db)
    ok, reason = compare_outputs(run_model(executable, model.inputs, tgt), expected)
    if not ok:
        return {"measured_s": None, "wrong": reason}
    runs = time_model(executable, model.inputs, tgt, repeat=repeat, min_repeat_ms=100)
    return {"measured_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs)}


# --- MetaSchedule --------------------------------------------------------------------------------


def prefix_database(work_dir: Path, count: int):
    """A MemoryDatabase of the first `count` tuning records of the JSON database in `work_dir`,
    in the order they were measured (the file's order); and how many it holds."""
    from tvm.s_tir import meta_schedule as ms

    workloads = [
        ms.database.Workload.from_json(json.loads(line))
        for line in (work_dir / "database_workload.json").read_text().splitlines()
        if line.strip()
    ]
    memory = ms.database.MemoryDatabase()
    committed = {}
    lines = (work_dir / "database_tuning_record.json").read_text().splitlines()
    held = 0
    for line in lines[:count]:
        if not line.strip():
            continue
        index, record_json = json.loads(line)
        if index not in committed:
            committed[index] = memory.commit_workload(workloads[index].mod)
        memory.commit_tuning_record(
            ms.database.TuningRecord.from_json(record_json, committed[index])
        )
        held += 1
    return memory, held


def tune_metaschedule(model, tgt, trials: int, work: Path, seed: int):
    """`tune_relax`'s run (bench_models.metaschedule_tune_relax), its wall time kept beside its
    records (WORK/metaschedule/tuning.json) for a later `--metaschedule-records`."""
    fused, work_dir, tuning_s = metaschedule_tune_relax(model, tgt, trials, work, seed)
    (work_dir / "tuning.json").write_text(json.dumps({"trials": trials, "tuning_s": tuning_s}))
    return fused, work_dir, tuning_s


def metaschedule_curve(
    model,
    tgt,
    trials: int,
    checkpoints: Sequence[int],
    work: Path,
    seed: int,
    repeat: int,
    reuse: Path | None = None,
) -> dict:
    """One `tune_relax` run of `trials` (or the records of one finished before, in `reuse`), then
    the module built from each checkpoint's prefix of its records, checked and timed."""
    from schedlang.models.graph import build_default, run_model

    if reuse is None:
        fused, work_dir, tuning_s = tune_metaschedule(model, tgt, trials, work, seed)
    else:  # a finished tuning's records (this script's earlier run, or --tune-metaschedule-only)
        fused, work_dir = metaschedule_fused(model, tgt), reuse
        tuning_s = json.loads((reuse / "tuning.json").read_text())["tuning_s"]
    expected = model.expected_outputs()
    if expected is None:
        expected = run_model(build_default(model.mod, tgt), model.inputs, tgt)
    points = []
    for count in checkpoints:
        database, held = prefix_database(work_dir, count)

        def build(mod, _tgt, _db, database=database):
            return metaschedule_build(fused, tgt, database), []

        points.append(
            _timed(model, tgt, None, expected, repeat, build) | {"trials": count, "records": held}
        )
    return {"points": points, "tuning_s": round(tuning_s, 1)}


# --- the report ----------------------------------------------------------------------------------


def markdown(result: dict) -> str:
    """The two curves side by side, and the trials schedlang needs to reach MetaSchedule."""
    from schedlang.core.units import format_seconds

    ours, theirs = result["schedlang"], result.get("metaschedule")
    lines = [
        f"### {result['model']}: sample efficiency at {result['trials']} trials",
        "",
        f"{result['cpu']}, {result['threads']} threads, medians of {result['repeat']} repeats, "
        "one run each.",
        "",
        "| trials | schedlang measured | schedlang estimate | MetaSchedule measured |",
        "|--:|--:|--:|--:|",
    ]
    theirs_points = {p["trials"]: p for p in theirs["points"]} if theirs else {}
    for point in ours["points"]:
        other = theirs_points.get(point["trials"], {})
        lines.append(
            f"| {point['trials']} | {format_seconds(point.get('measured_s'))} | "
            f"{format_seconds(point.get('estimate_s'))} | "
            f"{format_seconds(other.get('measured_s'))} |"
        )
    if (quality := ours.get("quality")) is not None:
        gain = ours.get("gain_after_first_round")
        lines += [
            "",
            f"schedlang: {quality['trials']} candidates measured, "
            f"{100 * quality['slower_than_10x_best']:.0f}% of them slower than ten times their "
            f"task's best, {100 * quality['refused_by_checker']:.0f}% refused by the checker"
            + (
                f"; the estimate gained {100 * gain:.1f}% after the first round "
                f"(trial {ours['first_round']['trials']})."
                if gain is not None
                else "."
            ),
        ]
    summary = result.get("efficiency")
    if summary and summary.get("metaschedule_s") is not None:
        need, ratio = summary["schedlang_trials"], summary["ratio"]
        lines += [
            "",
            f"MetaSchedule at {summary['at']} trials: {format_seconds(summary['metaschedule_s'])}. "
            + (
                f"schedlang reaches it by trial {need} (measured, at the checkpoints): "
                f"**{ratio:.1f}x** MetaSchedule's sample efficiency"
                if need
                else f"schedlang does not reach it in {result['trials']} trials (measured)"
            )
            + (
                f"; by its estimate at trial {summary['schedlang_trials_by_estimate']} "
                f"({summary['ratio_by_estimate']:.1f}x)."
                if summary.get("schedlang_trials_by_estimate")
                else "."
            ),
        ]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: str) -> None:
    """The curves as a picture: latency (ms) against trials, schedlang measured and estimated,
    MetaSchedule measured, and the trial at which schedlang reached MetaSchedule's end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours, theirs = result["schedlang"], result.get("metaschedule")
    figure, axis = plt.subplots(figsize=(7, 4.2), dpi=120)

    def draw(points, key, label, **style):
        pairs = [(p["trials"], 1e3 * p[key]) for p in points if p.get(key) is not None]
        if pairs:
            axis.plot(*zip(*pairs, strict=True), label=label, **style)

    draw(ours["points"], "measured_s", "schedlang, measured", marker="o", color="tab:blue")
    draw(ours["estimates"], "estimate_s", "schedlang, estimate", color="tab:blue", alpha=0.4,
         drawstyle="steps-post")  # fmt: skip
    if theirs:
        draw(theirs["points"], "measured_s", "MetaSchedule, measured", marker="s",
             color="tab:orange")  # fmt: skip
    summary = result.get("efficiency") or {}
    if summary.get("metaschedule_s") is not None:
        axis.axhline(1e3 * summary["metaschedule_s"], color="tab:orange", ls=":", lw=1)
        if summary.get("schedlang_trials"):
            axis.axvline(summary["schedlang_trials"], color="tab:blue", ls=":", lw=1)
            axis.annotate(
                f"{summary['ratio']:.1f}x", (summary["schedlang_trials"], 1e3 * summary[
                    "metaschedule_s"]), textcoords="offset points", xytext=(6, 6),
            )  # fmt: skip
    measured = [1e3 * p["measured_s"] for p in ours["points"] if p.get("measured_s")]
    if theirs:
        measured += [1e3 * p["measured_s"] for p in theirs["points"] if p.get("measured_s")]
    if measured:  # the first checkpoints can be 10x the end: keep the end readable
        axis.set_ylim(0, 3 * min(measured))
    axis.set_xlabel("trials")
    axis.set_ylabel("latency (ms)")
    axis.set_title(f"{result['model']}: latency against trials ({result['cpu']}, "
                   f"{result['threads']} threads)", fontsize=9)  # fmt: skip
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", choices=list(MODELS))
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--checkpoints", type=int, nargs="*", default=None)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--metaschedule", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--cost-model", default="off", choices=("off", "auto", "lightgbm"))
    parser.add_argument("--work-dir", default=None, help="databases and logs (default: a temp dir)")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    parser.add_argument("--plot", default=None, help="draw the curves here (PNG)")
    parser.add_argument(
        "--from-json", default=None,
        help="no run: redraw --plot and reprint the table from an earlier run's --out",
    )  # fmt: skip
    parser.add_argument(
        "--tune-metaschedule-only", action="store_true",
        help="only MetaSchedule's tuning, its records kept in WORK_DIR/metaschedule",
    )  # fmt: skip
    parser.add_argument(
        "--metaschedule-records", default=None,
        help="a finished MetaSchedule tuning's folder (WORK_DIR/metaschedule of an earlier run): "
        "its records timed beside schedlang's curve instead of tuning again",
    )  # fmt: skip
    run(parser.parse_args(argv))
    return 0


def run(args) -> dict:
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        print(markdown(result), flush=True)
        if args.plot:
            plot(result, args.plot)
        return result
    from schedlang.core.imports import allow_torch
    from schedlang.core.target import resolve_target
    from schedlang.models.compare import cpu_name, runtime_threads
    from schedlang.models.model_file import load_model

    allow_torch()
    path, defines = MODELS[args.model]
    model = load_model(str(ROOT / path), defines)
    tgt = resolve_target("llvm")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-sample-"))
    work.mkdir(parents=True, exist_ok=True)
    checkpoints = checkpoints_for(args.trials, args.checkpoints)
    if args.tune_metaschedule_only:  # the long half alone, timed later beside schedlang's curve
        print(f"[{args.model}] MetaSchedule: {args.trials} trials", file=sys.stderr, flush=True)
        _, work_dir, tuning_s = tune_metaschedule(model, tgt, args.trials, work, args.seed)
        print(f"MetaSchedule's records in {work_dir} ({tuning_s:.0f} s)", flush=True)
        return {"metaschedule_dir": str(work_dir), "tuning_s": tuning_s}
    print(f"[{args.model}] schedlang: {args.trials} trials", file=sys.stderr, flush=True)
    ours = schedlang_curve(
        model, tgt, args.trials, checkpoints, work, args.seed, args.repeat, args.cost_model
    )
    result = {
        "model": args.model, "trials": args.trials, "cpu": cpu_name(),
        "threads": runtime_threads(), "repeat": args.repeat, "cost_model": args.cost_model,
        "schedlang": ours,
    }  # fmt: skip
    if args.metaschedule:
        print(f"[{args.model}] MetaSchedule: {args.trials} trials", file=sys.stderr, flush=True)
        reuse = Path(args.metaschedule_records) if args.metaschedule_records else None
        theirs = metaschedule_curve(
            model, tgt, args.trials, checkpoints, work, args.seed, args.repeat, reuse
        )
        result["metaschedule"] = theirs
        result["efficiency"] = efficiency(ours, theirs, args.trials)
    print(markdown(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == "__main__":
    sys.exit(main())
