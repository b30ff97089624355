"""CPU weight pre-packing, measured: the same record of examples/models/mlp.py's hidden layer
(`fused_matmul1_add_relu`, 64 x 1024 x 1024 + bias + ReLU, the weights bound as constants) with
its B panels made once at build time (`prepack`) and made at every call (the line removed),
side by side in one run: the kernel as the tuner times it, and the whole model (each of its three
layers with its template's first point, prepacked or not).

    python bench/bench_prepack.py [--rounds 5] [--family matmul_panels]

Medians of `--rounds` alternating rounds; the ratios are what to read (a shared machine moves
both sides together).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics

import tvm

from schedlang.core.opinfo import schedule_names
from schedlang.core.ops import from_primfunc, random_inputs
from schedlang.core.target import resolve_target
from schedlang.lang.printer import format_schedule
from schedlang.lang.syntax import parse
from schedlang.models.graph import build_model, extract_tasks, time_model
from schedlang.models.model_file import load_model
from schedlang.propose.builtin import write_templates
from schedlang.run.build import apply, compile_func
from schedlang.run.measure import output_indices, set_runtime_threads, verify
from schedlang.run.packing import KERNEL_SYMBOL, PACK_SYMBOL, split_prepacked
from schedlang.store.db import Database
from schedlang.store.records import Record, Status, current_versions, op_key

TASK = "fused_matmul1_add_relu"


def add_record(db: Database, func, schedule: str, target) -> None:
    """A verified record of `schedule` for `func` (its latency not measured: this script times
    the builds itself), with the function's names, as the tuner keeps them."""
    op = from_primfunc(func)
    ok, reason = verify(op, compile_func(apply(func, schedule, target), target), target)
    assert ok, reason
    versions = current_versions()
    db.add(
        Record(
            op_key=op_key(func), op_name=op.name, target_key=target.key,
            target=target.tvm_config, schedule=format_schedule(parse(schedule)), knobs={},
            template=None, status=Status.OK, reason="", latencies_s=(1.0,), median_s=1.0,
            gflops=0.0, proposer="human", seed=None, created_at=0.0,
            schedlang_version=versions[0], tvm_version=versions[1],
            extra={"names": schedule_names(func)},
        )
    )  # fmt: skip


def first_point(task, target, family: str) -> str:
    draft = next(d for d in write_templates(task.op, target) if d.family == family)
    text = draft.text
    for knob, value in re.findall(r"param (\w+) in \[(\d+)", draft.text):
        text = re.sub(rf"\b{knob}\b", value, text)
    return re.sub(r"param \w+ in \[[^\n]*\n", "", text)


def kernel_times(task, target, schedule: str, rounds: int) -> dict[str, list[float]]:
    """The tuner's view: `main` (packing + kernel, per call) and `main_prepacked` (the kernel on
    weights packed once), from one library, alternating."""
    func = apply(task.op.func, schedule, target)
    module, packed = split_prepacked(func, output_indices(task.op))
    library = tvm.compile(module, target=target.to_tvm()).jit()
    device = tvm.cpu(0)
    args = [tvm.runtime.tensor(a, device) for a in random_inputs(task.op, 0)]
    weights = [tvm.runtime.empty(w.shape, w.dtype, device) for w in packed]
    library[PACK_SYMBOL](*(args[w.index] for w in packed), *weights)
    kernel_args = list(args)
    for w, array in zip(packed, weights, strict=True):
        kernel_args[w.index] = array
    times: dict[str, list[float]] = {"per call": [], "prepacked": [], "packing": []}
    for _ in range(rounds):
        for name, symbol, call_args in (
            ("per call", "main", args),
            ("prepacked", KERNEL_SYMBOL, kernel_args),
            ("packing", PACK_SYMBOL, [*(args[w.index] for w in packed), *weights]),
        ):
            evaluator = library.time_evaluator(symbol, device, number=1, repeat=5, min_repeat_ms=50)
            times[name].append(statistics.median(evaluator(*call_args).results))
    return times


def model_times(model, target, db: Database, rounds: int, per_call_db: Database):
    built = {
        "prepacked": build_model(model.mod, target, db)[0],
        "per call": build_model(model.mod, target, per_call_db)[0],
    }
    times: dict[str, list[float]] = {name: [] for name in built}
    for _ in range(rounds):
        for name, executable in built.items():
            times[name].append(statistics.median(time_model(executable, model.inputs, target)))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--family", default="matmul_panels")
    args = parser.parse_args()
    set_runtime_threads()  # the core count, before TVM's thread pool starts
    target = resolve_target("llvm")
    model = load_model("examples/models/mlp.py", {"constant_weights": "1"})
    task = next(t for t in extract_tasks(model.mod, target) if t.name == TASK)
    schedule = first_point(task, target, args.family)
    print(f"target {target.key}, TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}")
    print(schedule)
    kernel = kernel_times(task, target, schedule, args.rounds)
    with Database(":memory:") as db, Database(":memory:") as per_call_db:
        for layer in extract_tasks(model.mod, target):
            text = first_point(layer, target, args.family)
            add_record(db, layer.op.func, text, target)
            per_call = re.sub(r"\n *prepack [^\n]*", "", text)
            add_record(per_call_db, layer.op.func, per_call, target)
        whole = model_times(model, target, db, args.rounds, per_call_db)
    flops = task.flops or 0
    for title, times in (("kernel", kernel), ("model", whole)):
        medians = {name: statistics.median(values) for name, values in times.items()}
        for name, median in medians.items():
            rate = f", {flops / median / 1e9:.1f} GFLOP/s" if title == "kernel" else ""
            print(f"{title} {name}: {median * 1e6:.1f} us{rate}")
        print(f"{title} per call / prepacked: {medians['per call'] / medians['prepacked']:.2f}x")


if __name__ == "__main__":
    main()
