"""Fast and slow modes (issue 47, item 6): why the same build times at 6 ms in one run and 11 ms
in the next. A tuned MobileNetV2 (from a database), onnxruntime and PyTorch eager are timed in
rounds, each system `--runs` calls a round (their median is the round's figure), in fresh
processes so each process's own placement shows:

- `alone`: each system in a process of its own (only its runtime loaded);
- `interleaved`: all three in one process, one round of each in turn, as
  `build-model --compare` and issue 47's figures time them;
- the same interleaved process with one suspect changed at a time: `TVM_BIND_THREADS=0` (TVM pins
  no thread to a core), and no spinning (TVM's pool, onnxruntime's and OpenMP's threads sleep
  as soon as their work ends instead of spinning for the next).

Each process also reports every thread's allowed CPUs (`/proc/self/task/*/status`) after the
timing: a thread pinned to one core, and the threads created after it that inherit its mask,
are what a per-process mode would come from. A round is "slow" when its median is more than
`--slow` (1.3) times the fastest round median that system had in any process. Timings on a
shared machine mean nothing: run it alone.

    python bench/bench_modes.py --db mnv2.db --processes 3 --rounds 20 --out modes.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("schedlang", "onnxruntime", "PyTorch eager")

# What each setting changes in the child's environment (the systems it runs: all, or one).
SETTINGS: dict[str, dict[str, str]] = {
    "alone": {},
    "interleaved": {},
    "interleaved, TVM_BIND_THREADS=0": {"TVM_BIND_THREADS": "0"},
    "interleaved, no spinning": {
        "TVM_THREAD_POOL_SPIN_COUNT": "0",
        "OMP_WAIT_POLICY": "PASSIVE",
        "SCHEDLANG_ORT_SPINNING": "0",
    },
}


def mobilenet():
    """MobileNetV2's PyTorch module (eval mode, seeded weights) and its example input, as
    bench/models/mobilenet_v2.py makes them."""
    sys.path.insert(0, str(ROOT / "bench" / "models"))
    from mobilenet_v2 import mobilenet_v2

    return mobilenet_v2()


def export_onnx(path: Path) -> None:
    """MobileNetV2 exported to ONNX (TorchScript's exporter), for onnxruntime."""
    import torch

    net, example = mobilenet()
    with torch.no_grad():
        torch.onnx.export(net, example, str(path), dynamo=False, verbose=False)


# --- the child: times what it is told, prints JSON ------------------------------------------------


def _thread_cpus() -> dict[str, int]:
    """How many of this process's threads may run on each CPU set ('0-1': 5, '0': 2)."""
    counts: dict[str, int] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended
            continue
        for line in status.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                cpus = line.split(":", 1)[1].strip()
                counts[cpus] = counts.get(cpus, 0) + 1
    return counts


def _runner(system: str, work: Path, threads: int):
    """A function running `system` once on its input."""
    import numpy as np

    inputs = np.load(work / "input.npy")
    if system == "schedlang":
        import tvm
        from tvm import relax

        device = tvm.cpu()
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(work / "tuned.so")), device)
        data = tvm.runtime.tensor(inputs, device)
        return lambda: vm["main"](data)
    if system == "onnxruntime":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        if os.environ.get("SCHEDLANG_ORT_SPINNING") == "0":
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = onnxruntime.InferenceSession(
            str(work / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        name = session.get_inputs()[0].name
        return lambda: session.run(None, {name: inputs})
    import torch

    torch.set_num_threads(threads)
    net, _ = mobilenet()
    tensor = torch.from_numpy(inputs)

    def eager():
        with torch.no_grad():
            return net(tensor)

    return eager


def child(systems: list[str], work: Path, rounds: int, runs: int, threads: int) -> dict:
    runners = {system: _runner(system, work, threads) for system in systems}
    for run in runners.values():  # warm up: first-call allocations, lazy initialization
        for _ in range(3):
            run()
    medians: dict[str, list[float]] = {system: [] for system in systems}
    for _ in range(rounds):
        for system, run in runners.items():
            time.sleep(0.02)
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            medians[system].append(statistics.median(times))
    return {"medians_s": medians, "thread_cpus": _thread_cpus()}


# --- the parent: builds once, starts the processes, counts the modes ------------------------------


def prepare(db: str, work: Path) -> None:
    """The tuned build (checked against PyTorch) as a library, the ONNX export and the input."""
    import numpy as np

    from schedlang.core.imports import allow_torch
    from schedlang.core.target import resolve_target
    from schedlang.models.graph import build_model, run_model
    from schedlang.models.model_file import load_model
    from schedlang.run.outcome import compare_outputs
    from schedlang.store.db import Database

    allow_torch()
    model = load_model(str(ROOT / "bench/models/mobilenet_v2.py"))
    tgt = resolve_target("llvm")
    with Database(db) as database:
        executable, _ = build_model(model.mod, tgt, database)
    ok, reason = compare_outputs(run_model(executable, model.inputs, tgt), model.expected_outputs())
    if not ok:
        raise SystemExit(f"the tuned build is wrong: {reason}")
    executable.export_library(str(work / "tuned.so"))
    np.save(work / "input.npy", model.inputs[0])
    export_onnx(work / "model.onnx")


def run_child(systems: list[str], env: dict[str, str], args, work: Path) -> dict:
    command = [sys.executable, __file__, "--child", ",".join(systems), "--work-dir", str(work)]
    command += ["--rounds", str(args.rounds), "--runs", str(args.runs)]
    command += ["--threads", str(args.threads)]
    full = os.environ | env | {"TVM_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, env=full, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{systems} under {env} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def modes(processes: list[dict], slow: float) -> dict:
    """For each (setting, system): the rounds in the fast and the slow mode, each process's
    median, and the fast mode's floor (the system's fastest round median anywhere)."""
    floor: dict[str, float] = {}
    for process in processes:
        for system, medians in process["medians_s"].items():
            floor[system] = min(floor.get(system, float("inf")), *medians)
    table: dict[str, dict] = {}
    for process in processes:
        for system, medians in process["medians_s"].items():
            row = table.setdefault(f"{process['setting']} | {system}", {
                "setting": process["setting"], "system": system, "fast": 0, "slow": 0,
                "process_medians_s": [], "floor_s": floor[system],
            })  # fmt: skip
            slow_rounds = sum(1 for m in medians if m > slow * floor[system])
            row["slow"] += slow_rounds
            row["fast"] += len(medians) - slow_rounds
            row["process_medians_s"].append(statistics.median(medians))
    return table


def markdown(result: dict) -> str:
    ms = 1e3
    lines = [
        f"{result['cpu']}, {result['threads']} threads; {result['processes']} processes a "
        f"setting, {result['rounds']} rounds of {result['runs']} runs each; a round is slow "
        f"above {result['slow']}x the system's fastest round.",
        "",
        "| setting | system | rounds fast / slow | each process's median (ms) | fastest round |",
        "|---|---|--:|---|--:|",
    ]
    for row in result["modes"].values():
        medians = ", ".join(f"{ms * m:.2f}" for m in row["process_medians_s"])
        lines.append(
            f"| {row['setting']} | {row['system']} | {row['fast']} / {row['slow']} | "
            f"{medians} | {ms * row['floor_s']:.2f} |"
        )
    lines += ["", "Threads' allowed CPUs after the timing (threads: count), by process:", ""]
    for process in result["processes_run"]:
        lines.append(f"- {process['setting']} ({', '.join(process['systems'])}): "
                     f"{process['thread_cpus']}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="the tuned MobileNetV2's database")
    parser.add_argument("--processes", type=int, default=3, help="fresh processes a setting")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slow", type=float, default=1.3)
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = child(args.child.split(","), Path(args.work_dir), args.rounds, args.runs,
                       args.threads)  # fmt: skip
        print(json.dumps(result))
        return 0
    if not args.db:
        parser.error("--db is needed (a database of a tuned MobileNetV2)")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-modes-"))
    work.mkdir(parents=True, exist_ok=True)
    prepare(args.db, work)
    runs = []
    for _ in range(args.processes):  # the settings interleaved, so a slow spell falls on all
        for setting in args.settings:
            groups = [[s] for s in SYSTEMS] if setting == "alone" else [list(SYSTEMS)]
            for systems in groups:
                out = run_child(systems, SETTINGS[setting], args, work)
                runs.append({"setting": setting, "systems": systems, **out})
                print(f"{setting} {systems}: " + ", ".join(
                    f"{s} {1e3 * statistics.median(m):.2f} ms"
                    for s, m in out["medians_s"].items()
                ), file=sys.stderr, flush=True)  # fmt: skip
    from schedlang.models.compare import cpu_name

    result = {
        "cpu": cpu_name(), "threads": args.threads, "processes": args.processes,
        "rounds": args.rounds, "runs": args.runs, "slow": args.slow,
        "modes": modes(runs, args.slow), "processes_run": runs,
    }  # fmt: skip
    print(markdown(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
