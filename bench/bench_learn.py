"""Learning from the database, measured (issue 29, item 4): a corpus tuned on a declared grid of ops
and shapes, a model trained on it, and the arms tuned on the held-out ops and shapes.

    python bench/bench_learn.py [--grid small|full] [--corpus-trials 16] [--trials 16]
                                [--builtin-trials 64] [--steps 300] [--seed 0] [--out learn.json]

1. Corpus: every op of the grid tuned by the built-in proposer (`--corpus-trials` each) into one
   database; its cost (seconds) is written down.
2. Dataset: `build_samples` and `split_by_op` with the grid's held-out ops (the `held_out` shapes
   below, never in training whatever their names: the split is by structural key).
3. Training: a small Qwen2 from scratch on the `train` lines (`--steps`); the same architecture
   trained for one step at a learning rate of 1e-9 stands for the untrained model.
4. Each held-out op tuned in each arm, each arm in a copy of the corpus's database (the warm
   start and retrieval read the corpus; no arm sees another's records): the trained model and the
   untrained one (`--trials` each), the built-in proposer with its warm start and without, and
   MetaSchedule (`--builtin-trials` each; MetaSchedule's `tune_tir` timed on as many threads as
   schedlang's runner, skipped with `--no-metaschedule` or when xgboost is missing; `--arms`
   runs some of them). Best GFLOP/s after 8, 16 and 64 trials per op and arm (each arm's trials
   in the order it measured them), the geometric mean of each, and the trials each arm took to
   reach 90% of the best any arm found for the op, to OUT.json and a table to OUT.md.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TVM_NUM_THREADS", "1")

import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
# (op file, shape); the held-out shapes are those a model is scored on.
GRIDS = {
    "small": {
        "corpus": [
            ("matmul.py", {"M": "64", "N": "64", "K": "64"}),
            ("matmul.py", {"M": "128", "N": "64", "K": "64"}),
            ("matmul.py", {"M": "64", "N": "128", "K": "128"}),
            ("softmax.py", {"rows": "64", "cols": "128"}),
            ("softmax.py", {"rows": "128", "cols": "256"}),
        ],
        "held_out": [
            ("matmul.py", {"M": "128", "N": "128", "K": "64"}),
            ("softmax.py", {"rows": "64", "cols": "256"}),
        ],
    },
    "full": {
        "corpus": [
            *(("matmul.py", {"M": m, "N": n, "K": k})
              for m in ("64", "256", "512") for n in ("64", "256") for k in ("64", "512")),
            *(("conv2d.py", {"C": c, "H": "28", "W": "28", "K": c}) for c in ("16", "64")),
            *(("softmax.py", {"rows": r, "cols": "512"}) for r in ("64", "512")),
            *(("layernorm.py", {"rows": r, "cols": "768"}) for r in ("64", "512")),
        ],
        "held_out": [
            ("matmul.py", {"M": "128", "N": "128", "K": "128"}),
            ("conv2d.py", {"C": "32", "H": "28", "W": "28", "K": "32"}),
            ("softmax.py", {"rows": "128", "cols": "512"}),
            ("layernorm.py", {"rows": "128", "cols": "768"}),
        ],
    },
}  # fmt: skip
ARMS = ("trained", "untrained", "builtin-warm", "builtin-cold", "metaschedule")
CHECKPOINTS = (8, 16, 64)
REACH = 0.9  # "reached": within 90% of the best GFLOP/s any arm found for the op


def load(entry):
    from schedlang.core.ops import load_op

    path, shape = entry
    return load_op(str(EX / path), dict(shape))


def build_corpus(grid: dict, db_path: Path, trials: int, seed: int) -> float:
    from schedlang.core.target import resolve_target
    from schedlang.store.db import Database
    from schedlang.tuning.tune import Settings, tune

    target = resolve_target("llvm")
    started = time.perf_counter()
    with Database(db_path) as db:
        for entry in grid["corpus"]:
            tune(load(entry), target, db, settings=Settings(trials=trials, seed=seed))
    return time.perf_counter() - started


def proposer_of(arm: str, models: dict[str, Path], seed: int):
    from schedlang.llm.spec import ModelSpec
    from schedlang.propose.builtin import BuiltinProposer

    if arm.startswith("builtin"):
        return BuiltinProposer(transfers=0 if arm == "builtin-cold" else BuiltinProposer.TRANSFERS)
    spec = ModelSpec(str(models[arm]), max_new_tokens=400, answer_tokens=400)
    return spec.proposer(spec.backend(), seed)


def budget_of(arm: str, args) -> int:
    return args.trials if arm in ("trained", "untrained") else args.builtin_trials


def score(grid, corpus_db: Path, models: dict[str, Path], args, work: Path, arms) -> list[dict]:
    """Per held-out op: each arm's GFLOP/s trial by trial (None: the trial failed), in order."""
    from schedlang.core.target import resolve_target
    from schedlang.llm.eval_figures import trial_records
    from schedlang.store.db import Database
    from schedlang.store.records import op_key
    from schedlang.tuning.tune import Settings, tune

    target = resolve_target("llvm")
    rows = []
    for entry in grid["held_out"]:
        op = load(entry)
        row = {"op": op.name, "shape": entry[1], "trials": {}, "seconds": {}}
        for arm in arms:
            started, budget = time.perf_counter(), budget_of(arm, args)
            if arm == "metaschedule":
                row["trials"][arm] = metaschedule_gflops(op, target, budget, args.seed, work)
            else:
                path = work / f"{arm}-{op.name}-{'x'.join(entry[1].values())}.db"
                shutil.copy(corpus_db, path)
                with Database(path) as db:
                    tune(op, target, db, proposer=proposer_of(arm, models, args.seed),
                         settings=Settings(trials=budget, seed=args.seed))  # fmt: skip
                    trials, _ = trial_records(db, op_key(op.func), target.key)
                row["trials"][arm] = [r.gflops if r.is_ok else None for r in trials]
            row["seconds"][arm] = round(time.perf_counter() - started, 1)
            print(f"{op.name} {entry[1]} {arm}: {best_after(row['trials'][arm], None):.2f} GFLOP/s",
                  file=sys.stderr)  # fmt: skip
        rows.append(row)
    return rows


def metaschedule_gflops(op, target, budget: int, seed: int, work: Path) -> list[float | None]:
    from schedlang.core.opinfo import flop_count
    from schedlang.llm.eval_arms import metaschedule_arm, run_metaschedule
    from schedlang.llm.eval_figures import metaschedule_dir, metaschedule_trials

    arm = metaschedule_arm(seed, work / "metaschedule")
    arm.path.parent.mkdir(parents=True, exist_ok=True)
    run_metaschedule(arm, op, target, budget, seed)
    flops = flop_count(op.func)
    latencies = metaschedule_trials(metaschedule_dir(arm.path, op, target))[:budget]
    return [flops / s / 1e9 if s else None for s in latencies]


def best_after(trials: list[float | None], n: int | None) -> float:
    return max((g for g in trials[:n] if g), default=0.0)


def reached(trials: list[float | None], goal: float) -> int | None:
    """The 1-based trial that first came within REACH of `goal` GFLOP/s; None if none did."""
    return next((i for i, g in enumerate(trials, 1) if g and g >= REACH * goal), None)


def summarise(rows: list[dict], arms) -> dict:
    """Each row's best after each checkpoint its arm reached ("8", "16", "64": JSON's keys) and
    the trials to reach 90% of the op's best; the geometric means per arm and checkpoint, over
    the ops every one of which the arm ran that far."""
    for row in rows:
        top = max(best_after(t, None) for t in row["trials"].values())
        row["best_gflops"] = {
            arm: {str(n): best_after(t, n) for n in CHECKPOINTS if n <= max(len(t), CHECKPOINTS[0])}
            for arm, t in row["trials"].items()
        }
        row["reached_90"] = {arm: reached(t, top) for arm, t in row["trials"].items()}
    return {
        arm: {
            str(n): geomean([r["best_gflops"][arm][str(n)] for r in rows])
            for n in CHECKPOINTS
            if all(str(n) in r["best_gflops"][arm] for r in rows)
        }
        for arm in arms
    }


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else 0.0


def markdown(report: dict) -> str:
    """Best GFLOP/s per op and arm after 8 / 16 / 64 trials (what the arm's budget reached),
    then the geometric means, then the trials to reach 90% of the op's best."""
    arms = report["arms"]
    lines = [f"| op | shape | {' | '.join(arms)} |", "|---|---|" + "--:|" * len(arms)]

    def cell(best: dict) -> str:
        return " / ".join(f"{best[n]:.1f}" if n in best else "–" for n in map(str, CHECKPOINTS))

    for row in report["rows"]:
        shape = ", ".join(f"{k}={v}" for k, v in row["shape"].items())
        cells = " | ".join(cell(row["best_gflops"][arm]) for arm in arms)
        lines.append(f"| {row['op']} | {shape} | {cells} |")
    means = " | ".join(cell(report["geomean"][arm]) for arm in arms)
    lines.append(f"| geomean | | {means} |")
    lines.append("")
    lines.append(f"| op | trials to 90% of the op's best: {' | '.join(arms)} |")
    lines.append("|---|" + "--:|" * len(arms))
    for row in report["rows"]:
        cells = " | ".join(str(row["reached_90"][arm] or "–") for arm in arms)
        lines.append(f"| {row['op']} | {cells} |")
    return "\n".join(lines) + "\n"


def metaschedule_available(args) -> bool:
    from schedlang.core.diagnostics import SchedlangError
    from schedlang.llm.eval_arms import require_metaschedule

    if not args.metaschedule:
        return False
    try:
        require_metaschedule()
    except SchedlangError as err:
        print(f"MetaSchedule arm left out: {err.message}", file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="small")
    parser.add_argument("--corpus-trials", type=int, default=16)
    parser.add_argument("--trials", type=int, default=16, help="Each model arm's trials.")
    parser.add_argument(
        "--builtin-trials", type=int, default=64, help="The built-in and MetaSchedule arms' trials."
    )
    parser.add_argument("--metaschedule", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--arms", nargs="+", choices=ARMS, default=list(ARMS),
        help="The arms to run (the corpus only where a model or the warm start reads it).",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="learn.json")
    parser.add_argument("--keep", help="Keep the databases and models in this folder.")
    args = parser.parse_args(argv)

    from schedlang.learn.dataset import build_samples, write_dataset
    from schedlang.learn.train import TrainSettings, train
    from schedlang.store.db import Database

    grid = GRIDS[args.grid]
    arms = [a for a in args.arms if a != "metaschedule" or metaschedule_available(args)]
    learns = {"trained", "untrained"} & set(arms)
    corpus, training, models = None, None, {}
    with tempfile.TemporaryDirectory(prefix="bench-learn-") as temporary:
        work = Path(args.keep or temporary)
        work.mkdir(parents=True, exist_ok=True)
        corpus_db = work / "corpus.db"
        if learns or "builtin-warm" in arms:
            corpus_s = build_corpus(grid, corpus_db, args.corpus_trials, args.seed)
            with Database(corpus_db, read_only=True) as db:
                samples, report = build_samples(db)
            corpus = {"ops": report.ops, "samples": report.samples}
            corpus |= {"trials_per_op": args.corpus_trials, "seconds": round(corpus_s, 1)}
        else:
            Database(corpus_db).close()  # the cold arms' copies: an empty database
        if learns:
            write_dataset(samples, work / "data.jsonl")  # the corpus holds no held-out op
            started = time.perf_counter()
            trained = train(work / "data.jsonl", work / "trained",
                            TrainSettings(steps=args.steps, seed=args.seed))  # fmt: skip
            training = {"steps": args.steps, "seconds": round(time.perf_counter() - started, 1)}
            training |= {"first_loss": trained.losses[0], "last_loss": trained.losses[-1]}
            train(work / "data.jsonl", work / "untrained",
                  TrainSettings(steps=1, learning_rate=1e-9, seed=args.seed))  # fmt: skip
            models = {"trained": work / "trained", "untrained": work / "untrained"}
        rows = score(grid, corpus_db, models, args, work, arms)
        means = summarise(rows, arms)
    result = {
        "grid": args.grid,
        "corpus": corpus,
        "training": training,
        "trials": {arm: budget_of(arm, args) for arm in arms},
        "arms": arms,
        "rows": rows,
        "geomean": means,
        "machine": os.uname().nodename,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
