"""The built-in proposer's CUDA templates at several knob points, written as `.sched` files that
bench/bench_gpu.py builds (`--schedules DIR`), so that the tuner's own GPU schedules are run and
verified on a GPU, not only the hand-written examples.

    python bench/gpu_templates.py build/gpu_templates            # here: write the schedules
    python bench/bench_gpu.py --prepare build/gpu_tmpl --schedules build/gpu_templates
    # then on the GPU machine, as bench_gpu.py's header says, with --kernels build/gpu_tmpl

Each template gets its first knob point and up to `--points` - 1 random ones (seeded); a point
that does not check clean is left out (the tuner would drop it too). The shapes are the matmuls
of a BERT layer and of the seed, two ResNet convolutions, and softmax rows of attention and of a
1000-class output: what bench_gpu.py can verify (matmul, conv2d, softmax).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CONV = {"N": "1", "R": "3", "pad": "1"}
OPS = [
    ("examples/matmul.py", {"M": "1024", "N": "1024", "K": "1024", "dtype": "float32"}),
    ("examples/matmul.py", {"M": "768", "N": "3072", "K": "768", "dtype": "float32"}),
    ("examples/conv2d.py", {**_CONV, "C": "64", "H": "56", "W": "56", "K": "64", "stride": "1"}),
    ("examples/conv2d.py", {**_CONV, "C": "128", "H": "28", "W": "28", "K": "256", "stride": "2"}),
    ("examples/softmax.py", {"rows": "1536", "cols": "128"}),
    ("examples/softmax.py", {"rows": "4096", "cols": "1000"}),
]


def write_points(out: Path, ops=OPS, points: int = 3, seed: int = 4) -> list[Path]:
    """Write each op's CUDA templates at up to `points` checked knob points into `out`."""
    from schedlang.checker.check import check
    from schedlang.checker.pipeline import bind_knobs
    from schedlang.core.ops import load_op
    from schedlang.core.target import resolve_target
    from schedlang.lang.printer import format_schedule
    from schedlang.lang.syntax import parse
    from schedlang.propose.builtin import BuiltinProposer
    from schedlang.propose.interface import Context

    gpu = resolve_target("cuda", arch="sm_90")
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for path, defines in ops:
        op = load_op(str(ROOT / path), defines)
        op_line = f"# op: {path}" + "".join(f" -D {k}={v}" for k, v in defines.items())
        for proposal in BuiltinProposer().templates(Context(op, gpu)):
            template = parse(proposal.text)
            space = {p.name.text: list(p.choices) for p in template.params}
            tried = [{k: v[0] for k, v in space.items()}]
            tried += [{k: rng.choice(v) for k, v in space.items()} for _ in range(2 * points)]
            kept: set[tuple] = set()
            for point in tried:
                key = tuple(sorted(point.items()))
                if key in kept or len(kept) >= points:
                    continue
                text = format_schedule(bind_knobs(template, point))
                if not check(parse(text), op.func, gpu).ok:
                    continue
                kept.add(key)
                family = proposal.extra.get("family", "template")
                name = out / f"{Path(path).stem}_{len(written):02d}_{family}.sched"
                name.write_text(f"{op_line}\n{text}", encoding="utf-8")
                written.append(name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--points", type=int, default=3, help="knob points per template")
    parser.add_argument("--seed", type=int, default=4)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    written = write_points(args.out, points=args.points, seed=args.seed)
    print(f"{len(written)} schedules in {args.out}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
