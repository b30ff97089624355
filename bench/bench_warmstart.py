"""The built-in proposer's warm start, measured: ResNet-18's convolutions tuned by `tune-model`
with one round of trials each, with the warm start and without, side by side in one run.

    python bench/bench_warmstart.py [--size 64] [--batch 8] [--seed 0] [--out warmstart.md]

Both arms are the same `tune_model` over the model's convolution tasks, heaviest first, each in
a fresh database, `batch` trials per task (the first round): the warm arm's proposers move the
best records of the tasks measured before onto each new task (schedlang.propose.warmstart), the
cold arm's start from the templates' first points. The arms are advanced a round each in turn,
so that a task's two rounds are measured minutes apart at most on a shared machine. The first
task has nothing to start from: it is measured the same way in both arms, and shows the noise.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def first_rounds(
    size: int, batch: int, seed: int, passes: int, keep: Path | None = None, count: int = 0
) -> list[dict]:
    """Per conv task, in the order tuned: its best candidate after its first round in each arm."""
    from schedlang.core.target import resolve_target
    from schedlang.models.model_file import load_model
    from schedlang.models.tune_model import model_tasks, plan_tasks, tune_model
    from schedlang.store.db import Database
    from schedlang.tuning.tune import Settings

    target = resolve_target("llvm")
    model = load_model(str(ROOT / "bench" / "models" / "resnet18.py"), {"size": str(size)})
    tasks = model_tasks(model, target)
    plans, warm = plan_tasks(tasks, target)
    convs = [t for t in tasks if plans[t.key].kind == "conv" and t.name.startswith("fused_conv")]
    convs = convs[:count] if count else convs
    cold = {key: proposer.again() for key, proposer in warm.items()}
    for proposer in cold.values():
        proposer.transfers = 0
    settings, trials = Settings(seed=seed, batch=batch), batch * len(convs)
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-warmstart-") as temporary:
        work = keep or temporary
        warm_path, cold_path = Path(work) / "warm.db", Path(work) / "cold.db"
        with Database(warm_path) as warm_db, Database(cold_path) as cold_db:
            arms = {
                "warm": tune_model(convs, target, warm_db, settings, trials=trials, proposers=warm),
                "cold": tune_model(convs, target, cold_db, settings, trials=trials, proposers=cold),
            }
            dbs = {"warm": warm_db, "cold": cold_db}
            try:  # Ctrl-C (SIGINT) stops the rounds; the tasks with both arms are timed again
                for index in range(len(convs)):
                    for arm in ("warm", "cold") if index % 2 == 0 else ("cold", "warm"):
                        turn = next(arms[arm])
                        name = turn.state.task.name
                        row = rows.setdefault(name, {"task": name})
                        row[arm] = _round(turn, dbs[arm])
                        row["calls"], row["op"] = turn.state.task.calls, turn.state.task.op
                        shown = {k: v for k, v in row[arm].items() if "schedule" not in k}
                        print(arm, row["task"], shown, file=sys.stderr, flush=True)
            except KeyboardInterrupt:
                rows = {name: row for name, row in rows.items() if "warm" in row and "cold" in row}
                print(f"stopped: {len(rows)} tasks with both arms", file=sys.stderr, flush=True)
            for rounds in arms.values():
                rounds.close()  # stops its workers
    retime(rows, target, passes)
    return list(rows.values())


def retime(rows: dict[str, dict], target, passes: int) -> None:
    """Each task's two bests and the warm arm's best moved point, built again here and timed one
    after the other, `passes` times, the fastest pass kept: the tuner timed them minutes apart,
    and while its builders compiled the rest of the batch."""
    from schedlang.checker.check import check
    from schedlang.lang.syntax import parse
    from schedlang.run.build import compile_func
    from schedlang.run.measure import time_kernel

    for row in rows.values():
        op, built = row.pop("op"), {}
        for arm, key in (("cold", "schedule"), ("warm", "schedule"), ("warm", "moved_schedule")):
            if text := row[arm].get(key):
                lowered = check(parse(text, "<best>"), op.func, target).lowered
                built[(arm, key)] = compile_func(lowered.func, target)
        for _ in range(passes):
            for (arm, key), executable in built.items():
                median = time_kernel(op, executable, target).median_s
                name = "retimed_s" if key == "schedule" else "moved_retimed_s"
                row[arm][name] = min(row[arm].get(name, median), median)


def _round(turn, db) -> dict:
    """Its best candidate, its first, and the transferred ones with where they came from."""
    records = [r for r in turn.result.records if r.is_ok] if turn.result else []
    best = min(records, key=lambda r: r.median_s, default=None)
    moved = [r for r in records if "transferred_from" in r.extra]
    sources = [db.select("WHERE id = ?", (r.extra["transferred_from"],)) for r in moved]
    return {
        "best_s": best.median_s if best else None,
        "schedule": best.schedule if best else None,
        "first_s": records[0].median_s if records else None,
        "best_index": records.index(best) if best else None,
        "moved_best_s": min((r.median_s for r in moved), default=None),
        "moved_schedule": min(moved, key=lambda r: r.median_s).schedule if moved else None,
        "moved_from": [s[0].op_name for s in sources if s],
        "baseline_s": getattr(turn.result and turn.result.baseline, "median_s", None),
    }


def markdown(rows: list[dict], size: int, batch: int, wall_s: float) -> str:
    lines = [
        f"ResNet-18 at {size} x {size}, its {len(rows)} convolution tasks in tuning order, "
        f"{batch} trials each (one round); µs; {wall_s / 60:.0f} min in all",
        "",
        "| task | as tuned: cold best; warm moved, best | timed again: cold best; warm moved, "
        "best | warm / cold | moved from |",
        "| --- | --- | --- | --- | --- |",
    ]
    us = lambda s: "–" if s is None else f"{s * 1e6:.0f}"  # noqa: E731
    for row in rows:
        cold, warm = row["cold"], row["warm"]
        again = cold.get("retimed_s"), warm.get("retimed_s")
        ratio = f"{again[1] / again[0]:.2f}" if all(again) else "–"
        lines.append(
            f"| {row['task']} | {us(cold['best_s'])}; {us(warm['moved_best_s'])}, "
            f"{us(warm['best_s'])} | {us(again[0])}; {us(warm.get('moved_retimed_s'))}, "
            f"{us(again[1])} | {ratio} | {', '.join(warm['moved_from'])} |"
        )
    lines.append("")
    for arm in ("cold", "warm"):
        total = sum((r[arm].get("retimed_s") or 0) * max(r["calls"], 1) for r in rows)
        lines.append(f"{arm}: the bests timed again, times their calls: {total * 1e3:.3f} ms")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--passes", type=int, default=3, help="Times each best is timed again.")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tasks", type=int, default=0, help="The first N conv tasks only.")
    parser.add_argument("--keep", type=Path, help="A folder to keep both arms' databases in.")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = first_rounds(args.size, args.batch, args.seed, args.passes, args.keep, args.tasks)
    text = markdown(rows, args.size, args.batch, time.perf_counter() - start)
    print(text)
    if args.out:
        args.out.write_text(text)
        shown = [{k: v for k, v in r.items() if k != "op"} for r in rows]
        args.out.with_suffix(".json").write_text(json.dumps(shown, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
