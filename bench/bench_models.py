"""Whole models, side by side in one run: schedlang's `tune-model` at a trial budget, MetaSchedule's
Relax tuning at the same budget, `tvm.compile`'s default build, PyTorch eager, torch.compile and
onnxruntime, on the same inputs, with one thread count for all.

    python bench/bench_models.py --models mlp convnet --trials 64
    python bench/bench_models.py --models resnet18 bert1 bert12 mlp --trials 1000 --out models.json

Models (each a schedlang model file; ResNet-18 and BERT in bench/models/):

| name | what |
|---|---|
| `mlp` | examples/models/mlp.py, the Relax example (64 x 512 -> 1024 -> 1024 -> 512) |
| `convnet` | examples/models/convnet.py, a small PyTorch conv + batch norm + pooling network |
| `attention` | tests/models/attention.py, a small PyTorch attention block |
| `encoder` | bench/models/encoder.py, `nn.TransformerEncoderLayer` (256 wide, 4 heads, seq 128) |
| `resnet18` | torchvision's ResNet-18 architecture, random weights, batch 1, 224 x 224 |
| `mobilenetv2` | torchvision's MobileNetV2 (width 1.0), random weights, batch 1, 224 x 224 |
| `bert1`, `bert12` | transformers' BertModel, BERT-base config, random weights, 1 or 12 layers |

For each model: schedlang tunes every task into a fresh database (`schedlang.models.tune_model`, the
gradient task scheduler, no early stop: the whole budget) and builds with it; MetaSchedule tunes the
fused module TVM's pipeline makes (the same inference passes and Relax lowering, `to_tir`, without
schedlang's Winograd rewrite of the 3x3 convolutions: MetaSchedule gets what TVM gives it) with
`tune_relax` (its gradient task scheduler, evolutionary search, XGBoost cost model, 16 trials an
iteration; the constant weights marked layout-free, as TVM's `static_shape_tuning` pipeline does
with `cpu_weight_prepack`) and builds it with `MetaScheduleApplyDatabase`, the weight packing split
out and folded into the constants; both builds are checked against the model's reference (PyTorch,
onnxruntime or numpy) before anything is timed. Then every row is timed in turn
(schedlang.models.compare.compare_builds, then MetaSchedule's build), medians of `--repeat` repeats
of at least 100 ms each, with their range. Tuning wall time is reported for both tuners.
A baseline that cannot run says why. Timings are noisy on a shared machine: read only ratios
taken in one run. Needs the metaschedule extra (xgboost, cloudpickle) for the MetaSchedule row
(`--no-metaschedule` skips it), torch for the PyTorch models, transformers for BERT.
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))  # before TVM starts

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

MODELS = {
    "mlp": ("examples/models/mlp.py", {}),
    "convnet": ("examples/models/convnet.py", {}),
    "attention": ("tests/models/attention.py", {}),
    "encoder": ("bench/models/encoder.py", {}),
    "resnet18": ("bench/models/resnet18.py", {}),
    "mobilenetv2": ("bench/models/mobilenet_v2.py", {}),
    "bert1": ("bench/models/bert.py", {"layers": "1"}),
    "bert12": ("bench/models/bert.py", {"layers": "12"}),
}


def planned_tasks(model, tgt, work: Path):
    """What `tune_model` is given: a fresh database's path in `work`, the model's tasks, their
    plans and proposers, and the tasks some template covers (bench_sample_efficiency.py too)."""
    from schedlang.models.tune_model import model_tasks, plan_tasks

    db_path = work / "schedlang.db"
    db_path.unlink(missing_ok=True)
    tasks = model_tasks(model, tgt)
    plans, proposers = plan_tasks(tasks, tgt)
    covered = [task for task in tasks if plans[task.key].templates]
    return db_path, tasks, plans, proposers, covered


def tune_schedlang(model, tgt, trials: int, work: Path, seed: int) -> dict:
    """tune-model's path: plans, the task scheduler, a fresh database; then the build."""
    from schedlang.models.graph import build_model
    from schedlang.models.tune_model import MIN_REPEAT_MS, REPEAT, tune_model
    from schedlang.store.db import Database
    from schedlang.tuning.tune import Settings

    start = time.perf_counter()
    db_path, tasks, plans, proposers, covered = planned_tasks(model, tgt, work)
    with Database(str(db_path)) as db:
        scheduler = None
        for turn in tune_model(
            covered,
            tgt,
            db,
            # every trial spent: the rows compare the tuners at the same budget (issue 48)
            Settings(seed=seed, repeat=REPEAT, min_repeat_ms=MIN_REPEAT_MS, early_stop=False),
            trials=trials,
            proposers=proposers,
        ):
            scheduler = turn.scheduler
        wall_s = time.perf_counter() - start
        executable, applied = build_model(model.mod, tgt, db)
    estimate, untimed = scheduler.estimate_s() if scheduler else (None, len(tasks))
    return {
        "executable": executable,
        "wall_s": wall_s,
        "tasks": len(tasks),
        "uncovered": [task.name for task in tasks if not plans[task.key].templates],
        "generic_only": [task.name for task in tasks if plans[task.key].generic_only],
        "measured": scheduler.measured if scheduler else 0,
        "from_db": sum(item.record is not None for item in applied),
        "estimate_s": estimate,
        "untimed_tasks": untimed,
        "per_task": [
            {"task": s.task.name, "calls": s.task.calls, "trials": s.trials, "best_s": s.latency_s}
            for s in (scheduler.states if scheduler else [])
        ],
    }


def tune_metaschedule(model, tgt, trials: int, work: Path, seed: int) -> dict:
    """MetaSchedule's Relax tuning of the fused module TVM makes (schedlang's Winograd
    rewrite left out: MetaSchedule tunes what TVM's own pipeline gives it), then its build."""
    fused, work_dir, wall_s = metaschedule_tune_relax(model, tgt, trials, work, seed)
    return {"executable": metaschedule_build(fused, tgt, str(work_dir)), "wall_s": wall_s}


def metaschedule_tune_relax(model, tgt, trials: int, work: Path, seed: int):
    """One `tune_relax` run of `trials` on the fused module TVM's pipeline makes, its records in
    WORK/metaschedule: (the fused module, that folder, the tuning's wall time in seconds).
    bench_sample_efficiency.py builds from prefixes of the same records."""
    import metaschedule_baseline as msb
    from tvm.s_tir import meta_schedule as ms

    msb.check_versions()
    work_dir = work / "metaschedule"
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    msb.import_tensor_intrin_fast()
    start = time.perf_counter()
    fused = metaschedule_fused(model, tgt)
    ms.relax_integration.tune_relax(
        fused, {}, tgt.to_tvm(), str(work_dir), max_trials_global=trials, num_trials_per_iter=16,
        builder=msb.make_builder(tgt.cores), runner=msb.make_runner(), seed=seed,
    )  # fmt: skip
    return fused, work_dir, time.perf_counter() - start


def metaschedule_fused(model, tgt):
    """The module MetaSchedule tunes: TVM's static_shape_tuning pipeline with cpu_weight_prepack,
    the constant weights marked layout-free before tuning (MetaSchedule's RewriteLayout then packs
    them as its kernels want; the packing is split out and folded into the constants after, once,
    at build time)."""
    from tvm import relax

    from schedlang.models.graph import to_tir

    return relax.transform.AttachAttrLayoutFreeBuffers()(to_tir(model.mod, tgt, winograd=False))


def metaschedule_build(fused, tgt, records):
    """`fused` built with MetaSchedule's records (a work folder's path, or a database, entered
    while building), the layout rewrites folded into the constants."""
    import tvm
    from tvm import relax

    target = tgt.to_tvm()
    work_dir = records if isinstance(records, str) else None
    in_scope = contextlib.nullcontext() if work_dir else records
    with target, in_scope, tvm.transform.PassContext(opt_level=3):
        applied = relax.transform.MetaScheduleApplyDatabase(work_dir)(fused)
        applied = relax.transform.SplitLayoutRewritePreproc()(applied)
        applied = relax.transform.FoldConstant()(applied)
        return tvm.compile(applied, target=target)


def bench_model(name: str, args) -> dict:
    from schedlang.core.diagnostics import SchedlangError
    from schedlang.core.target import resolve_target
    from schedlang.models.compare import compare_builds
    from schedlang.models.graph import run_model
    from schedlang.models.model_file import load_model
    from schedlang.run.outcome import compare_outputs

    path, defines = MODELS[name]
    model = load_model(str(ROOT / path), defines)
    tgt = resolve_target("llvm")
    work = Path(args.work_dir) / name
    work.mkdir(parents=True, exist_ok=True)
    print(f"[{name}] schedlang: {args.trials} trials", file=sys.stderr, flush=True)
    ours = tune_schedlang(model, tgt, args.trials, work, args.seed)
    theirs, why_not = None, None
    if args.metaschedule:
        print(f"[{name}] MetaSchedule: {args.trials} trials", file=sys.stderr, flush=True)
        try:
            theirs = tune_metaschedule(model, tgt, args.trials, work, args.seed)
            expected = model.expected_outputs() or run_model(ours["executable"], model.inputs, tgt)
            ok, reason = compare_outputs(
                run_model(theirs["executable"], model.inputs, tgt), expected
            )
            if not ok:
                why_not, theirs = f"MetaSchedule's build differs from the reference: {reason}", None
        except Exception as exc:  # a baseline that fails is reported, not fatal
            why_not = f"MetaSchedule failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    print(f"[{name}] timing", file=sys.stderr, flush=True)
    # MetaSchedule's build is timed in the same rounds as the others (compare_builds' `others`).
    others = [(f"MetaSchedule ({args.trials} trials)", theirs.pop("executable"))] if theirs else []
    try:
        comparison = compare_builds(model, tgt, ours.pop("executable"), args.repeat, others=others)
    except SchedlangError as err:
        return {"model": name, "error": err.message, "schedlang": ours}
    rows = [row.as_json(comparison.tuned_s) for row in comparison.rows]
    rows[0]["label"] = f"schedlang tuned ({args.trials} trials)"
    if theirs is None and args.metaschedule:
        rows.insert(1, {"label": "MetaSchedule", "skipped": why_not})
    return {
        "model": name,
        "threads": comparison.threads,
        "cpu": comparison.as_json()["cpu"],
        "repeat": args.repeat,
        "checked_against": comparison.checked_against,
        "schedlang": ours,
        "metaschedule_wall_s": theirs["wall_s"] if theirs else None,
        "rows": rows,
    }


def markdown(result: dict) -> str:
    """One model's rows as a table: median, range, and how many times faster schedlang is."""
    from schedlang.core.units import format_seconds

    if "error" in result:
        return f"### {result['model']}\n\nerror: {result['error']}\n"
    ours = result["schedlang"]
    lines = [
        f"### {result['model']}",
        "",
        f"{result['cpu']}, {result['threads']} threads each, medians of {result['repeat']} "
        f"repeats; outputs checked against {result['checked_against']}. schedlang: "
        f"{ours['tasks']} tasks ({len(ours['generic_only'])} with only the generic template, "
        f"{len(ours['uncovered'])} uncovered), {ours['measured']} trials measured in "
        f"{ours['wall_s']:.0f} s"
        + (
            f"; MetaSchedule tuned in {result['metaschedule_wall_s']:.0f} s"
            if result["metaschedule_wall_s"]
            else ""
        )
        + ".",
        "",
        "| build | median | range | schedlang is |",
        "|---|--:|--:|--:|",
    ]
    for row in result["rows"]:
        if "skipped" in row:
            lines.append(f"| {row['label']} | – | – | skipped: {row['skipped']} |")
            continue
        spread = f"{format_seconds(row['min_s'])} – {format_seconds(row['max_s'])}"
        lines.append(
            f"| {row['label']} | {format_seconds(row['median_s'])} | {spread} | "
            f"{row['x_tuned']:.2f}× |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "convnet"], choices=list(MODELS))
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--metaschedule", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--work-dir", default=None, help="databases and logs (default: a temp dir)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    args.work_dir = args.work_dir or tempfile.mkdtemp(prefix="bench-models-")
    from schedlang.core.imports import allow_torch

    allow_torch()
    results = []
    for name in args.models:
        result = bench_model(name, args)
        results.append(result)
        print(markdown(result), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
