"""Decoder LLMs on this CPU (issue 45, item 6): schedlang's build against PyTorch eager,
torch.compile, onnxruntime-genai and llama.cpp, side by side in one run, with the roofline.

    python bench/bench_decoder.py --configs small,0.5b,1.5b \\
        --systems schedlang,eager,compile,ortgenai,llamacpp --rounds 3 \\
        --workdir ~/decoder-bench [--tune --trials 8 --lengths 1,16,128,1024 | --db DB] \\
        --out results.md            # and results.json beside it, written as it goes

Configs (random weights, fp32): `small` (4 layers, width 512, 8 heads, 2 KV heads,
intermediate 1408, vocabulary 8192, tied), `0.5b` (Qwen2-0.5B's config), `1.5b`
(VibeThinker-1.5B's, i.e. Qwen2.5-Math-1.5B's, untied LM head), and `tiny` (the tests'). What is
made once per config (checkpoint, tokenizer, GGUF, onnxruntime-genai model) is described in
bench/decoder_prepare.py; how each system is timed in bench/decoder_systems.py (one process per
system and round: its peak RSS is its own). Round r runs every system once, in an order rotated
by r; each figure is the median over rounds with its min..max.

The roofline: the machine's read bandwidth (a 1 GiB float32 tensor summed by torch on the same
threads, best of `BANDWIDTH_REPEATS`, before and after the timings; the better of the two is
used) divided by the bytes one decode step reads (`step_bytes`), as tokens/s; each system's
decode as a fraction of it. A system not installed, or failing, is a row saying why (its
stderr's last line), never a lost run. docs/llm-benchmark.md says more, and holds the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import decoder_prepare as prepare  # noqa: E402
from decoder_systems import SYSTEMS  # noqa: E402

SHAPES = {
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512,
                 tied=True, max_position=128, rope_theta=10000.0),
    "small": dict(hidden=512, layers=4, heads=8, kv_heads=2, intermediate=1408, vocab=8192,
                  tied=True, max_position=2048, rope_theta=10000.0),
    # Qwen2-0.5B's config.json (max_position_embeddings 131072, rope_theta 1e6)
    "0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936,
                 tied=True, max_position=131072, rope_theta=1000000.0),
    # Qwen2.5-Math-1.5B's (VibeThinker-1.5B's): an untied LM head
    "1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936,
                 tied=False, max_position=4096, rope_theta=10000.0),
}  # fmt: skip
MAX_CACHE = 2048  # the cache's length: the model's maximum up to this (tune-model's default)
BANDWIDTH_REPEATS = 10
BANDWIDTH = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
x = torch.ones(int(sys.argv[3]) * 2**18, dtype=torch.float32)  # MiB of float32
best = min(
    (lambda t: (x.sum(), time.perf_counter() - t)[1])(time.perf_counter())
    for _ in range(int(sys.argv[2]))
)
print(x.numel() * 4 / best)
"""


def parameters(shape: dict) -> int:
    """Every parameter of the model (the untied embedding and LM head both counted)."""
    head_dim = shape["hidden"] // shape["heads"]
    kv = shape["kv_heads"] * head_dim
    hidden, inner = shape["hidden"], shape["intermediate"]
    layer = 2 * hidden * hidden + hidden + 2 * (hidden * kv + kv) + 3 * hidden * inner + 2 * hidden
    tables = shape["vocab"] * hidden * (1 if shape["tied"] else 2)
    return shape["layers"] * layer + hidden + tables


def step_bytes(shape: dict, context: float) -> float:
    """Bytes one decode step reads at `context` cached tokens, fp32: every layer's matrices,
    biases and norms, the final norm, the LM head, one embedding row, and the KV cache."""
    hidden = shape["hidden"]
    kv = shape["kv_heads"] * (hidden // shape["heads"])
    untouched = shape["vocab"] * hidden - hidden if not shape["tied"] else 0  # table but a row
    weights = parameters(shape) - untouched
    cache = shape["layers"] * 2 * kv * context
    return 4.0 * (weights + cache)


def max_length(shape: dict) -> int:
    return min(shape["max_position"], MAX_CACHE)


def describe_machine() -> dict:
    """lscpu's model name, LLVM's host CPU (as TVM sees it), cores, memory, load."""
    info = {
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "load_before": os.getloadavg(),
    }
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        names = [line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                 if line.startswith("Model name")]  # fmt: skip
        info["cpu"] = names[0] if names else "unknown"
    except (OSError, subprocess.SubprocessError):
        info["cpu"] = "unknown (no lscpu)"
    try:
        from tvm.target import codegen

        info["llvm_cpu"] = str(codegen.llvm_get_system_cpu())
    except Exception as error:  # noqa: BLE001 (only a description)
        info["llvm_cpu"] = f"unknown ({error})"
    with open("/proc/meminfo") as meminfo:
        kib = int(meminfo.readline().split()[1])
    info["memory_gib"] = round(kib / 2**20, 1)
    return info


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env


def bandwidth(threads: int, repeats: int = BANDWIDTH_REPEATS, mib: int = 1024) -> float | str:
    """Bytes/s of the sum of `mib` MiB, best of `repeats`, in a process of its own; or why."""
    command = [sys.executable, "-c", BANDWIDTH, str(threads), str(repeats), str(mib)]
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(threads))
    if done.returncode != 0:
        return f"failed: {prepare.last_line(done.stderr)}"
    return float(done.stdout.strip())


def run_system(system: str, spec: dict, timeout_s: float) -> dict:
    """One system timed in its own process: its figures, or {"error": why}."""
    with tempfile.TemporaryDirectory() as scratch:
        spec_path, result_path = Path(scratch, "spec.json"), Path(scratch, "result.json")
        spec_path.write_text(json.dumps(spec))
        command = [sys.executable, str(HERE / "decoder_systems.py"), system, str(spec_path),
                   str(result_path)]  # fmt: skip
        start = time.perf_counter()
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout_s,
                env=child_env(spec["threads"]),
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"error": f"no result in {timeout_s:.0f} s"}
        if done.returncode < 0:  # e.g. 9: the kernel's out-of-memory killer
            return {
                "error": f"killed by signal {-done.returncode}: {prepare.last_line(done.stderr)}"
            }
        if done.returncode != 0 or not result_path.exists():
            return {"error": prepare.last_line(done.stderr)}
        result = json.loads(result_path.read_text())
        result["process_s"] = time.perf_counter() - start
        return result


class Bench:
    """One run: the settings, the results so far (written to `json_path` after every step)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(args.workdir).expanduser()
        self.json_path = Path(args.out).with_suffix(".json")
        self.results: dict = {
            "settings": {key: value for key, value in vars(args).items()},
            "machine": describe_machine(),
            "bandwidth": {},
            "configs": {},
        }

    def save(self) -> None:
        self.json_path.write_text(json.dumps(self.results, indent=1))

    def prepare(self, name: str) -> dict:
        """The files of config `name` each system needs, or the reason one could not be made."""
        args, shape = self.args, SHAPES[name]
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        entry = {"shape": shape, "parameters": parameters(shape), "max_length": max_length(shape),
                 "unavailable": {}, "spec": {}, "tuning": None}  # fmt: skip
        self.results["configs"][name] = entry
        spec = entry["spec"]
        spec.update(
            threads=args.threads, seed=args.seed, vocab_size=shape["vocab"],
            max_length=max_length(shape), prefill=args.prefill, contexts=args.contexts,
            steps=args.steps, target=args.target, flash_attn=args.llama_flash_attn,
        )  # fmt: skip
        start = time.perf_counter()
        try:
            spec["checkpoint"] = str(prepare.checkpoint(folder, shape))
        except Exception as error:  # noqa: BLE001 (every system's row says why)
            why = f"the checkpoint could not be written: {type(error).__name__}: {error}"
            entry["unavailable"] = dict.fromkeys(args.systems, why)
            self.save()
            return entry
        entry["checkpoint_s"] = time.perf_counter() - start
        wanted = set(args.systems)
        for system, make in (("llamacpp", self._gguf), ("ortgenai", self._genai),
                             ("schedlang", self._database)):  # fmt: skip
            if system not in wanted:
                continue
            try:
                make(folder, spec, entry)
            except prepare.PrepareError as error:
                entry["unavailable"][system] = str(error)
            except Exception as error:  # noqa: BLE001 (the system's row says why)
                entry["unavailable"][system] = f"{type(error).__name__}: {error}"
            self.save()
        return entry

    def _gguf(self, folder: Path, spec: dict, entry: dict) -> None:
        start = time.perf_counter()
        source = prepare.converter(self.workdir, self.args.llama_cpp_dir)
        spec["gguf"] = str(prepare.gguf(folder, Path(spec["checkpoint"]), source))
        entry["gguf_s"] = time.perf_counter() - start

    def _genai(self, folder: Path, spec: dict, entry: dict) -> None:
        start = time.perf_counter()
        out = prepare.genai(folder, Path(spec["checkpoint"]), self.args.threads)
        spec["genai_dir"] = str(out)
        entry["genai_s"] = time.perf_counter() - start

    def _database(self, folder: Path, spec: dict, entry: dict) -> None:
        """schedlang's database: `--db` as given, else the config's own (DB_DIR/CONFIG.db, by
        default in its work folder) when it exists; `--tune` makes it first with `schedlang
        tune-model` (its wall time kept beside it, CONFIG.tuning.json: a second run reuses
        both). Without either, schedlang runs untuned."""
        args = self.args
        db = Path(args.db) if args.db else Path(args.db_dir or folder, f"{folder.name}.db")
        timing = db.with_suffix(".tuning.json")
        if args.tune and not args.db and not (db.exists() and timing.exists()):
            db.parent.mkdir(parents=True, exist_ok=True)
            command = [sys.executable, "-m", "schedlang", "tune-model", spec["checkpoint"],
                       "--trials", str(args.trials), "--db", str(db)]  # fmt: skip
            if args.lengths:
                command += ["--lengths", args.lengths]
            db.unlink(missing_ok=True)
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True,
                                  env=child_env(args.threads))  # fmt: skip
            if done.returncode != 0:
                raise prepare.PrepareError(f"tune-model failed: {prepare.last_line(done.stderr)}")
            tail = done.stdout.strip().splitlines()[-3:]
            timing.write_text(json.dumps({"wall_s": time.perf_counter() - start,
                                          "command": command, "tail": tail}))  # fmt: skip
        if args.db and not db.exists():
            raise prepare.PrepareError(f"--db {db}: no such file")
        if db.exists():
            spec["db"] = str(db.resolve())
        if timing.exists():
            entry["tuning"] = json.loads(timing.read_text())

    def measure(self, name: str) -> None:
        """`rounds` rounds of every system on config `name`, in rotated orders."""
        entry = self.results["configs"][name]
        runs = entry.setdefault("runs", {system: [] for system in self.args.systems})
        systems = self.args.systems
        for round_index in range(self.args.rounds):
            shift = round_index % len(systems)
            for system in systems[shift:] + systems[:shift]:
                if system in entry["unavailable"]:
                    result = {"error": entry["unavailable"][system]}
                else:
                    result = run_system(system, entry["spec"], self.args.child_timeout)
                result["round"] = round_index
                runs[system].append(result)
                self.save()
                print(f"{name} round {round_index + 1} {system}: "
                      f"{result.get('error') or 'ok'}", file=sys.stderr, flush=True)  # fmt: skip

    def run(self) -> dict:
        threads, mib = self.args.threads, self.args.bandwidth_mib
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        self.results["bandwidth"]["before"] = bandwidth(threads, mib=mib)
        self.save()
        start = time.perf_counter()
        for name in self.args.configs:
            self.prepare(name)
        self.results["prepare_s"] = time.perf_counter() - start
        for name in self.args.configs:
            self.measure(name)
        self.results["bandwidth"]["after"] = bandwidth(threads, mib=mib)
        self.results["machine"]["load_after"] = os.getloadavg()
        self.save()
        return self.results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def names(known: tuple[str, ...] | list[str]):
        def parse(text: str) -> list[str]:
            words = [word.strip() for word in text.split(",") if word.strip()]
            bad = [word for word in words if word not in known]
            if bad or not words:
                raise argparse.ArgumentTypeError(f"{','.join(bad) or text!r}: one of {known}")
            return words

        return parse

    def lengths(text: str) -> list[int]:
        words = text.split(",")
        if not all(word.strip().isdigit() and int(word) > 0 for word in words):
            raise argparse.ArgumentTypeError(f"{text!r}: positive integers, e.g. 128,1024")
        return [int(word) for word in words]

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", type=names(list(SHAPES)), default=["small"])
    parser.add_argument("--systems", type=names(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefill", type=lengths, default=[128, 1024], help="prompt lengths")
    parser.add_argument("--contexts", type=lengths, default=[128, 1024],
                        help="decode after a prompt of this many tokens")  # fmt: skip
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per context")
    parser.add_argument("--seed", type=int, default=0, help="of the prompt's token ids")
    parser.add_argument("--workdir", default="decoder-bench", help="files made once per config")
    parser.add_argument("--db-dir", default=None,
                        help="where CONFIG.db is (default: WORKDIR/CONFIG)")  # fmt: skip
    parser.add_argument("--db", default=None, help="one database for every config")
    parser.add_argument("--tune", action="store_true", help="tune-model each config first")
    parser.add_argument("--trials", type=int, default=8, help="tune-model's --trials")
    parser.add_argument("--lengths", default=None, help="tune-model's --lengths")
    parser.add_argument("--target", default="llvm", help="schedlang's target")
    parser.add_argument("--llama-cpp-dir", default=None,
                        help="where convert_hf_to_gguf.py is (else: the sdist)")  # fmt: skip
    parser.add_argument("--llama-flash-attn", action="store_true",
                        help="llama.cpp with flash attention (default: off)")  # fmt: skip
    parser.add_argument("--child-timeout", type=float, default=3600.0)
    parser.add_argument("--bandwidth-mib", type=int, default=1024, help="the tensor summed")
    parser.add_argument("--out", default="decoder-bench.md", help="the report (.json beside)")
    args = parser.parse_args(argv)
    for name in args.configs:
        needed = max(args.contexts) + args.steps + 1
        if max(max(args.prefill), needed) > max_length(SHAPES[name]):
            parser.error(f"{name}: a cache of {max_length(SHAPES[name])} tokens is shorter than "
                         f"the longest prompt or context + steps ({needed})")  # fmt: skip
    return args


def main(argv: list[str] | None = None) -> int:
    from decoder_report import render

    args = parse_args(argv)
    bench = Bench(args)
    try:
        bench.run()
    finally:  # interrupted too: the report of what was measured
        Path(args.out).write_text(render(bench.results))
        print(f"wrote {args.out} and {bench.json_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
