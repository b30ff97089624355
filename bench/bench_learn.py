"""Learning from the database, measured (issue 29, item 4): a corpus tuned on a declared grid of ops
and shapes, a model trained on it, and the arms tuned on the held-out ops and shapes.

    python bench/bench_learn.py [--grid small|full] [--corpus-trials 16] [--trials 8]
                                [--steps 300] [--seed 0] [--out learn.json]

1. Corpus: every op of the grid tuned by the built-in proposer (`--corpus-trials` each) into one
   database; its cost (seconds) is written down.
2. Dataset: `build_samples` and `split_by_op` with the grid's held-out ops (the `held_out` shapes
   below, never in training whatever their names: the split is by structural key).
3. Training: a small Qwen2 from scratch on the `train` lines (`--steps`); the same architecture
   trained for one step at a learning rate of 1e-9 stands for the untrained model.
4. Each held-out op tuned with `--trials` trials in each arm, each arm in a copy of the corpus's
   database (the warm start and retrieval read the corpus; no arm sees another's records): the
   trained model, the untrained one, the built-in proposer with its warm start, and without.
   Best GFLOP/s per op and arm, and the geometric mean, to OUT.json and a table to OUT.md.

MetaSchedule is not an arm here (bench/metaschedule_baseline.py times it on its own).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TVM_NUM_THREADS", "1")

import math  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

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
ARMS = ("trained", "untrained", "builtin-warm", "builtin-cold")


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


def score(grid, corpus_db: Path, models: dict[str, Path], trials: int, seed: int, work: Path):
    from schedlang.core.target import resolve_target
    from schedlang.store.db import Database
    from schedlang.tuning.tune import Settings, tune

    target = resolve_target("llvm")
    rows = []
    for entry in grid["held_out"]:
        op = load(entry)
        row = {"op": op.name, "shape": entry[1], "best_gflops": {}, "seconds": {}}
        for arm in ARMS:
            path = work / f"{arm}-{op.name}-{'x'.join(entry[1].values())}.db"
            shutil.copy(corpus_db, path)
            started = time.perf_counter()
            with Database(path) as db:
                result = tune(op, target, db, settings=Settings(trials=trials, seed=seed),
                              proposer=proposer_of(arm, models, seed))  # fmt: skip
            row["best_gflops"][arm] = result.best.gflops if result.best else 0.0
            row["seconds"][arm] = round(time.perf_counter() - started, 1)
            print(f"{op.name} {entry[1]} {arm}: {row['best_gflops'][arm]:.2f} GFLOP/s",
                  file=sys.stderr)  # fmt: skip
        rows.append(row)
    return rows


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else 0.0


def markdown(report: dict) -> str:
    lines = [
        f"| op | shape | {' | '.join(ARMS)} |",
        "|---|---|" + "---|" * len(ARMS),
    ]
    for row in report["rows"]:
        shape = ", ".join(f"{k}={v}" for k, v in row["shape"].items())
        cells = " | ".join(f"{row['best_gflops'][arm]:.2f}" for arm in ARMS)
        lines.append(f"| {row['op']} | {shape} | {cells} |")
    means = " | ".join(f"{report['geomean'][arm]:.2f}" for arm in ARMS)
    lines.append(f"| geomean | | {means} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="small")
    parser.add_argument("--corpus-trials", type=int, default=16)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="learn.json")
    parser.add_argument("--keep", help="Keep the databases and models in this folder.")
    args = parser.parse_args(argv)

    from schedlang.learn.dataset import build_samples, write_dataset
    from schedlang.learn.train import TrainSettings, train
    from schedlang.store.db import Database

    grid = GRIDS[args.grid]
    with tempfile.TemporaryDirectory(prefix="bench-learn-") as temporary:
        work = Path(args.keep or temporary)
        work.mkdir(parents=True, exist_ok=True)
        corpus_db = work / "corpus.db"
        corpus_s = build_corpus(grid, corpus_db, args.corpus_trials, args.seed)
        with Database(corpus_db, read_only=True) as db:
            samples, report = build_samples(db)
        write_dataset(samples, work / "data.jsonl")  # the corpus holds no held-out op
        started = time.perf_counter()
        trained = train(work / "data.jsonl", work / "trained",
                        TrainSettings(steps=args.steps, seed=args.seed))  # fmt: skip
        train_s = time.perf_counter() - started
        train(work / "data.jsonl", work / "untrained",
              TrainSettings(steps=1, learning_rate=1e-9, seed=args.seed))  # fmt: skip
        models = {"trained": work / "trained", "untrained": work / "untrained"}
        rows = score(grid, corpus_db, models, args.trials, args.seed, work)
    result = {
        "grid": args.grid,
        "corpus": {"ops": report.ops, "samples": report.samples, "trials_per_op":
                   args.corpus_trials, "seconds": round(corpus_s, 1)},
        "training": {"steps": args.steps, "seconds": round(train_s, 1),
                     "first_loss": trained.losses[0], "last_loss": trained.losses[-1]},
        "trials": args.trials,
        "rows": rows,
        "geomean": {arm: geomean([r["best_gflops"][arm] for r in rows]) for arm in ARMS},
        "machine": os.uname().nodename,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
