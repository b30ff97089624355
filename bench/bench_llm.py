"""The model loop from the command line: how each decoding of a model's answers fares.

    python bench/bench_llm.py [--model DIR] [--trials 16] [--ops matmul softmax conv2d]
                              [--decodings stepwise whole none] [--backends local http]
                              [--full] [--out results.md]

For every backend (the model in this process through transformers, or the same model behind an
OpenAI-compatible server on 127.0.0.1: `python -m schedlang.testing.tiny_model serve`), decoding
(`--decoding stepwise|whole|none`) and op, it runs

    schedlang tune OP --proposer model --model … --decoding … --trials N --seed 0 --log-prompts …

as a user would, in a fresh database, and reads back every reply the model wrote (the prompt log)
and every record of the run (the database):

    answers   replies the model wrote (repairs and duplicates included)
    parse     answers holding schedlang that parses
    clean     answers that check clean on the op and target
    ok        trials measured ok (built, verified against the reference, timed) / trials
    trials/min  trials over the command's whole wall time (model load, baseline, builds included)

Without `--model` it builds the tiny random-weight Qwen2 of schedlang.testing.tiny_model: its
figures say how often each decoding lets a model's answer reach measurement, not how fast its
schedules are. The ops run at small shapes (matmul 256³, softmax 256×256, conv2d 16→32 channels
28×28) so that the
loop, not the kernels, sets the pace; `--full` adds the acceptance runs of issue 12 at the
examples' own sizes (8 trials, local model, stepwise).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEDLANG = [sys.executable, "-m", "schedlang"]
SHAPES = {
    "matmul": ["-D", "M=256", "-D", "N=256", "-D", "K=256"],
    "softmax": ["-D", "rows=256", "-D", "cols=256"],
    "conv2d": ["-D", "C=16", "-D", "H=28", "-D", "W=28", "-D", "K=32"],
}


@dataclass
class Row:
    backend: str
    decoding: str
    op: str
    answers: int
    parsed: int
    clean: int
    trials: int
    ok: int
    wall_s: float
    shape: str

    def cells(self) -> list[str]:
        def share(n: int, of: int) -> str:
            return f"{n}/{of} ({100 * n / of:.0f}%)" if of else "—"

        per_minute = 60 * self.trials / self.wall_s if self.wall_s else 0.0
        return [
            self.backend,
            self.decoding,
            f"{self.op} {self.shape}".strip(),
            str(self.answers),
            share(self.parsed, self.answers),
            share(self.clean, self.answers),
            share(self.ok, self.trials),
            f"{per_minute:.1f}",
            f"{self.wall_s:.0f} s",
        ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_server(model: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "schedlang.testing.tiny_model", "serve", model, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = process.stdout.readline() if process.stdout else ""
    if "serving" not in line:
        process.kill()
        raise SystemExit(f"the model server did not start: {line!r}")
    return process, f"http://127.0.0.1:{port}"


def _answers(log: Path, op_path: str, shape: list[str], target: str) -> tuple[int, int, int]:
    """(answers, parsed, clean) over every reply in a prompt log (schedlang.llm.eval_figures's
    count)."""
    from schedlang.core.ops import load_op, parse_defines
    from schedlang.core.target import resolve_target
    from schedlang.llm.eval_figures import answer_counts

    op = load_op(op_path, parse_defines(shape[1::2]))
    replies = [
        json.loads(path.read_text()).get("answer")
        for path in sorted(log.glob("round-*/reply-*.json"))
    ]
    return answer_counts(replies, op, resolve_target(target))


def run(
    backend: str,
    decoding: str,
    op: str,
    model: str,
    url: str | None,
    trials: int,
    work: Path,
    shape: list[str],
    target: str = "llvm",
) -> Row:
    from schedlang.store.db import Database

    name = f"{backend}-{decoding}-{op}-{len(shape)}"
    db_path, log = work / f"{name}.db", work / name
    op_path = str(ROOT / "examples" / f"{op}.py")
    where = ["--endpoint", url, "--model", "tiny"] if backend == "http" else ["--model", model]
    command = [
        *SCHEDLANG,
        "tune",
        op_path,
        *shape,
        "--target",
        target,
        "--proposer",
        "model",
        *where,
        "--decoding",
        decoding,
        "--trials",
        str(trials),
        "--seed",
        "0",
        "--db",
        str(db_path),
        "--log-prompts",
        str(log),
    ]
    if backend == "http":
        command += ["--max-new-tokens", "1024", "--answer-tokens", "256"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    wall = time.perf_counter() - started
    if done.returncode != 0 and "nothing to tune" not in done.stderr:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        print(f"  {name}: exit {done.returncode}: {' / '.join(tail)}", file=sys.stderr)
    records = []
    if db_path.exists():
        with Database(db_path) as db:
            records = [r for r in db.records() if not r.extra.get("baseline")]
    answers, parsed, clean = _answers(log, op_path, shape, target)
    size = " ".join(shape[1::2]) if shape else "default size"
    return Row(
        backend,
        decoding,
        op,
        answers,
        parsed,
        clean,
        len(records),
        sum(r.is_ok for r in records),
        wall,
        f"({size})",
    )


def _table(rows: list[Row]) -> str:
    head = [
        "backend",
        "decoding",
        "op",
        "answers",
        "parse",
        "check clean",
        "ok / trials",
        "trials/min",
        "wall",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a folder of weights (default: build the tiny model)")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--ops", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--decodings", nargs="+", default=["stepwise", "whole", "none"])
    parser.add_argument("--backends", nargs="+", default=["local", "http"])
    parser.add_argument("--full", action="store_true", help="add the full-size acceptance runs")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        work = Path(tmp)
        model = args.model
        if model is None:
            from schedlang.testing.tiny_model import build_tiny_model

            model = str(build_tiny_model(work / "tiny"))
        server, url = _start_server(model) if "http" in args.backends else (None, None)
        rows = []
        try:
            for backend in args.backends:
                for decoding in args.decodings:
                    for op in args.ops:
                        row = run(backend, decoding, op, model, url, args.trials, work, SHAPES[op])
                        print(" | ".join(row.cells()), flush=True)
                        rows.append(row)
            if args.full:
                for op in args.ops:
                    row = run("local", "stepwise", op, model, url, 8, work, [])
                    print(" | ".join(row.cells()), flush=True)
                    rows.append(row)
        finally:
            if server is not None:
                server.kill()
    report = (
        f"Measured {date.today()} on {os.cpu_count()} cores, `--trials {args.trials}`, "
        f"seed 0, llvm:\n\n{_table(rows)}\n"
    )
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
