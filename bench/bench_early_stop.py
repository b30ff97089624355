"""Does a default run stop by itself at what a whole budget reaches (issue 48's goal: within 200
trials, at >= 98% of 1,000 trials)? One default `tune_model` run (the stopping rule on) into a
fresh database, then its build and the build of a finished full-budget run's database
(`--against`: e.g. bench_sample_efficiency.py's WORK_DIR/schedlang.db, no early stop) checked and
timed side by side with the default build and the frameworks (`compare_builds`: `--repeat` rounds,
one repeat of every row in turn), on one machine in one run.

    python bench/bench_early_stop.py --model resnet18 --against r18/schedlang.db --out stop.json

Quality is the full run's latency over the stopped run's (>= 0.98 meets the goal), by the
measured medians and by the tuner's estimates (each task's best times its calls, from each
database). The stopped run's database keeps the model and the latencies as `tune-model` and
`build-model --compare` do, for `schedlang report` (bench/report_screenshot.py --db). The
machine must be quiet.
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_NUM_THREADS", "2")  # before TVM starts: 2 threads, as issue 48 asks

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_models import MODELS, planned_tasks  # noqa: E402


def database_estimate(db, tasks, target_key: str) -> tuple[float | None, int]:
    """The model's estimated latency from a database (each task's best times its calls; None
    while a task has none) and the trials it holds: the last point of the curve a rerun replays
    (`convergence.database_curve`), the tuner's own arithmetic."""
    from schedlang.tuning.convergence import database_curve

    curve = database_curve(db, {task.key: task.calls for task in tasks}, target_key)
    if curve:
        trials, estimate = curve[-1]
        return estimate, trials
    records = [r for task in tasks for r in db.records(task.key, target_key)]
    return None, sum(1 for r in records if r.proposer != "baseline")


def run(args) -> dict:
    from schedlang.core.imports import allow_torch
    from schedlang.core.target import resolve_target
    from schedlang.models.compare import compare_builds, cpu_name
    from schedlang.models.graph import build_model, model_key
    from schedlang.models.model_file import load_model
    from schedlang.models.tune_model import MIN_REPEAT_MS, REPEAT, tune_model
    from schedlang.store.db import Database
    from schedlang.tuning.tune import Settings
    from schedlang.workflows.model_tuning import keep_model

    allow_torch()
    path, defines = MODELS[args.model]
    given = dict(item.split("=", 1) for item in args.define or ())
    model = load_model(str(ROOT / path), {**defines, **given})
    tgt = resolve_target("llvm")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-stop-"))
    work.mkdir(parents=True, exist_ok=True)
    db_path, tasks, _, proposers, covered = planned_tasks(model, tgt, work)
    print(f"[{args.model}] default run, at most {args.trials} trials", file=sys.stderr, flush=True)
    started = time.perf_counter()
    settings = Settings(seed=args.seed, repeat=REPEAT, min_repeat_ms=MIN_REPEAT_MS)
    with Database(str(db_path)) as db:
        keep_model(db, model, tgt, covered)  # for `schedlang report`, as tune-model does
        scheduler = None
        for turn in tune_model(covered, tgt, db, settings, trials=args.trials, proposers=proposers):
            scheduler = turn.scheduler
        wall_s = time.perf_counter() - started
        assert scheduler is not None
        stop = scheduler.stop
        ours_estimate, ours_trials = database_estimate(db, covered, tgt.key)
        ours, _ = build_model(model.mod, tgt, db)
    with Database(args.against) as db:
        full_estimate, full_trials = database_estimate(db, covered, tgt.key)
        full, _ = build_model(model.mod, tgt, db)
    label = f"full run ({full_trials} trials)"
    comparison = compare_builds(model, tgt, ours, args.repeat, others=[(label, full)])
    rows = comparison.as_json()["rows"]
    with Database(str(db_path)) as db:  # the latencies too, as build-model --compare keeps them
        db.add_model_timings(model_key(model.mod), tgt.key, [
            {"label": row.label, "median_s": row.median_s, "skipped": row.skipped}
            for row in comparison.rows
        ])  # fmt: skip
    measured = {row["label"]: row.get("median_s") for row in rows}
    result = {
        "model": args.model, "cpu": cpu_name(), "threads": comparison.threads,
        "repeat": args.repeat, "tasks": len(tasks),
        "stopped": {
            "trials": scheduler.measured, "wall_s": round(wall_s, 1),
            "reason": stop.reason if stop else "the budget was spent",
            "estimate_s": ours_estimate, "records": ours_trials,
        },
        "full": {"trials": full_trials, "estimate_s": full_estimate, "database": args.against},
        "quality_measured": measured[label] / measured["tuned"],
        "quality_estimated": (
            full_estimate / ours_estimate if full_estimate and ours_estimate else None
        ),
        "rows": rows,
    }  # fmt: skip
    print(markdown(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    return result


def markdown(result: dict) -> str:
    from schedlang.core.units import format_seconds

    stopped, full = result["stopped"], result["full"]
    lines = [
        f"### {result['model']}: a default run against {full['trials']} trials",
        "",
        f"{result['cpu']}, {result['threads']} threads, {result['repeat']} rounds timed in turn.",
        "",
        f"Default run: stopped at trial {stopped['trials']} after {stopped['wall_s']:.0f} s "
        f"({stopped['reason']}), estimate {format_seconds(stopped['estimate_s'])}; the full "
        f"run's estimate {format_seconds(full['estimate_s'])}. Quality (full over stopped): "
        f"**{result['quality_measured']:.3f}** measured"
        + (
            f", {result['quality_estimated']:.3f} by the estimates."
            if result["quality_estimated"]
            else "."
        ),
        "",
        "| row | median | min | max | x stopped run |",
        "|---|--:|--:|--:|--:|",
    ]
    for row in result["rows"]:
        label = "stopped run (default)" if row["label"] == "tuned" else row["label"]
        if "skipped" in row:
            lines.append(f"| {label} | skipped: {row['skipped']} | | | |")
            continue
        lines.append(
            f"| {label} | {format_seconds(row['median_s'])} | {format_seconds(row['min_s'])} | "
            f"{format_seconds(row['max_s'])} | {row['x_tuned']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", choices=list(MODELS))
    parser.add_argument("--trials", type=int, default=1000, help="the ceiling")
    parser.add_argument("--against", required=True, help="a full-budget run's database")
    parser.add_argument("-D", "--define", action="append", help="a model parameter, NAME=VALUE")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=None)
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
