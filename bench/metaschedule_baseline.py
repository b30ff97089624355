"""MetaSchedule baseline: tune a PrimFunc with TVM's own auto-scheduler, then time the winner.

    python bench/metaschedule_baseline.py --op matmul --trials 64 --numpy
    python bench/metaschedule_baseline.py --op conv2d --trials 64

Needs, beside the pinned apache-tvm==0.27.0.post1 / apache-tvm-ffi==0.1.14.post1:
`pip install xgboost psutil cloudpickle` (the `metaschedule` extra, plus psutil).

Configuration that works on these 2-core machines (TVM 0.27.0.post1), and why
---------------------------------------------------------------------------
* apache-tvm-ffi must be 0.1.14.post1. With 0.1.15.x every IR serialization segfaults, and
  MetaSchedule's default search and its JSON database serialize IR all the time (per
  shared/TVM-0.27-NOTES.md): that is the "default space generator crashes" report. With the pin the
  default space generator works, so this module uses it as is and refuses any other apache-tvm-ffi.
* Space: `space="post-order-apply"` (tune_tir's default, `ms.space_generator.PostOrderApply()`
  with sch_rules/postprocs/mutators "from-target"), i.e. for an llvm target the x86 rule set:
  AutoInline, AddRFactor, MultiLevelTilingWithIntrin for VNNI/AVX512 dot products (inactive for
  fp32), MultiLevelTiling ("SSRSRS", cache_write "global"), ParallelizeVectorizeUnroll
  (max_jobs_per_core=16, max_vectorize_extent=64, unroll 0/16/64/512), RandomComputeLocation;
  postprocs DisallowDynamicLoop, RewriteParallelVectorizeUnroll, RewriteReductionBlock,
  RewriteLayout; search "evolutionary", cost model "xgb", JSON database in work_dir. Checked with
  the 1024^3 matmul (3 design spaces, 64/64 valid trials) and conv2d: no crash, so no hand-picked
  rule list is needed.
* Builder: `ms.builder.LocalBuilder(max_workers=2, timeout_sec=120, initializer=...)`. The default
  builder's build function imports `tvm.s_tir.tensor_intrin` inside the timed build; that import
  takes ~35-50 s here (each of ~250 `@T.prim_func` calls runs `inspect.stack()`, which reads source
  files for every frame), longer than the default 30 s timeout, so every candidate timed out. The
  initializer (not timed) imports it once per worker with `inspect.stack` temporarily replaced by a
  cheap frame walk (`_cheap_stack`: the same FrameInfo records, with one line of context from
  linecache), which brings the import to ~6 s. The builder restarts its worker pool for every batch,
  so the ~6 s is paid once per batch of `num_trials_per_iter`.
* The tuning process itself imports `tvm.s_tir.tensor_intrin` too (TuneContext does, ~50 s), so
  `import_tensor_intrin_fast()` is called in this process before `tune_tir`.
* Runner: `ms.runner.LocalRunner(timeout_sec=60, EvaluatorConfig(number=3, repeat=1,
  min_repeat_ms=100))` (the defaults, with a longer timeout so that slow but valid candidates of a
  1024^3 matmul are measured rather than dropped). TVM_NUM_THREADS is set to the target's num-cores
  before TVM starts, so the runner's measurements and the final timing both use 2 threads.
* `num_trials_per_iter = min(64, trials)`, `max_trials_global = trials`, `num_tuning_cores` =
  num-cores, `seed` given.
* Target: {"kind": "llvm", "mcpu": llvm_get_system_cpu(), "num-cores": 2} (mcpu "native" is rejected
  by this LLVM and falls back to generic, which loses AVX2/FMA).

After tuning, `ms.tir_integration.compile_tir(database, func, target)` gives the best schedule;
it is built with `tvm.compile` and timed with
`executable.mod.time_evaluator("main", tvm.cpu(), number=1, repeat=N, min_repeat_ms=100)`,
median of the repeats, exactly as any other kernel is timed. On a shared machine the script first
waits (--wait-quiet, up to 300 s) for other processes to leave the CPUs idle and reports how much
CPU they used during the timing. The same seed does not reproduce a schedule (noisy measurements
steer the search), so compare only numbers measured side by side.
"""

from __future__ import annotations

import os

# TVM's runtime reads this when its thread pool starts (default: nproc/2 = 1 thread here).
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import argparse
import logging
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import tvm
from tvm import tirx

REPO = Path(__file__).resolve().parent.parent
OPS = {"matmul": "examples/matmul.py", "conv2d": "examples/conv2d.py"}
REQUIRED_FFI = "0.1.14.post1"


@dataclass
class MetaScheduleResult:
    latency_s: float  # median of the re-measured repeats
    gflops: float
    trials: int  # candidates measured by the runner (tuning records in the database)
    wall_s: float  # wall time of tune_tir (builder/runner start-up included)
    trace_text: str  # str(sch.trace) of the best schedule
    func: tirx.PrimFunc  # the best scheduled PrimFunc
    latencies_s: tuple[float, ...] = ()
    valid_trials: int = 0  # of `trials`, those that built and ran
    tuner_best_latency_s: float | None = None  # the tuner's own measurement of the winner
    flops: int = 0
    verified: bool | None = None  # outputs checked against the reference (None: not checked)
    other_load_cores: float = 0.0  # CPU used by other processes during the final timing
    work_dir: str = ""
    extra: dict = field(default_factory=dict)


def default_target() -> dict:
    return {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": 2}


# --- importing tvm.s_tir.tensor_intrin in seconds rather than a minute ------------------------


def import_tensor_intrin_fast() -> None:
    """Import `tvm.s_tir.tensor_intrin` with `inspect.stack` replaced by a cheap frame walk.

    Self-contained (every import inside) because it is also the builder workers' initializer,
    which is shipped to them with cloudpickle.
    """
    import inspect
    import linecache
    import sys

    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return

    def _cheap_stack(context: int = 1):
        # What inspect.stack() returns (caller first), minus its expensive part: inspect.stack
        # resolves every frame's source file through getsourcefile/getmodule; TVMScript only
        # looks at frame objects and one line of code context.
        frames = []
        frame = sys._getframe(1)
        while frame is not None:
            filename, lineno = frame.f_code.co_filename, frame.f_lineno
            line = linecache.getline(filename, lineno) if context > 0 else ""
            frames.append(
                inspect.FrameInfo(
                    frame,
                    filename,
                    lineno,
                    frame.f_code.co_name,
                    [line] if line else None,
                    0 if line else None,
                )
            )
            frame = frame.f_back
        return frames

    original = inspect.stack
    inspect.stack = _cheap_stack
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.stack = original


def check_versions() -> None:
    ffi = metadata.version("apache-tvm-ffi")
    if ffi != REQUIRED_FFI:
        raise RuntimeError(
            f"apache-tvm-ffi {ffi} is installed; MetaSchedule with TVM 0.27 needs {REQUIRED_FFI} "
            "(0.1.15.x segfaults on IR serialization, which the search and its database use)"
        )
    missing = []
    for module in ("xgboost", "cloudpickle", "psutil"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise RuntimeError(f"MetaSchedule needs: pip install {' '.join(missing)}")


# --- a shared machine: wait for quiet, and say how busy it was ------------------------------


def wait_for_quiet(max_s: float, busy_pct: float = 5.0, samples: int = 3) -> bool:
    """Wait (up to max_s) until the CPUs are under busy_pct% busy for `samples` 2-s samples."""
    import psutil

    deadline, quiet = time.monotonic() + max_s, 0
    while time.monotonic() < deadline:
        quiet = quiet + 1 if psutil.cpu_percent(interval=2.0) < busy_pct else 0
        if quiet >= samples:
            return True
    return False


class OtherLoad:
    """CPU time used by other processes while the block runs, in cores (0.0 = machine to
    ourselves; 1.0 = another process kept one of the 2 cores busy throughout)."""

    def __enter__(self):
        import psutil

        self._process = psutil.Process()
        self._start = (time.monotonic(), self._busy(psutil.cpu_times()), self._ours())
        return self

    def __exit__(self, *exc):
        import psutil

        wall0, busy0, ours0 = self._start
        wall = time.monotonic() - wall0
        others = (self._busy(psutil.cpu_times()) - busy0) - (self._ours() - ours0)
        self.cores = max(0.0, others / wall) if wall > 0 else 0.0
        return False

    @staticmethod
    def _busy(t) -> float:
        return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)

    def _ours(self) -> float:
        t = self._process.cpu_times()
        return t.user + t.system + t.children_user + t.children_system


# --- tuning ------------------------------------------------------------------------------------


def make_builder(cores: int = 2, timeout_sec: float = 120.0):
    from tvm.s_tir import meta_schedule as ms

    if __name__ != "__main__":
        # Imported as a module: ship the initializer by value, so the workers need not import
        # this file (its directory need not be on their sys.path).
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ms.builder.LocalBuilder(
        max_workers=cores, timeout_sec=timeout_sec, initializer=import_tensor_intrin_fast
    )


def make_runner(timeout_sec: float = 60.0):
    from tvm.s_tir import meta_schedule as ms

    config = ms.runner.EvaluatorConfig(
        number=3, repeat=1, min_repeat_ms=100, enable_cpu_cache_flush=False
    )
    return ms.runner.LocalRunner(timeout_sec=timeout_sec, evaluator_config=config)


def tune_metaschedule(
    func: tirx.PrimFunc,
    target: dict,
    trials: int,
    work_dir: str,
    seed: int = 0,
    *,
    repeat: int = 10,
    min_repeat_ms: int = 100,
    reference: Callable[..., np.ndarray] | None = None,
    verify: bool = True,
    quiet: bool = False,
    wait_quiet_s: float = 0.0,
) -> MetaScheduleResult:
    """Tune `func` for `trials` measured candidates, then build and time the best schedule.

    `work_dir` holds MetaSchedule's JSON database and logs; it is emptied first so that a run
    never reuses records of an earlier one. With `verify`, the tuned kernel's outputs are checked
    on random inputs against `reference` (a numpy function of the inputs) or, without one, against
    the unscheduled build of `func`; a mismatch raises.
    """
    from tvm.s_tir import meta_schedule as ms

    check_versions()
    cores = int(target.get("num-cores", os.cpu_count() or 1))
    if os.environ.get("TVM_NUM_THREADS") != str(cores):
        print(
            f"warning: TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')} but the target has "
            f"num-cores {cores}; set it before importing tvm",
            file=sys.stderr,
        )
    tvm_target = tvm.target.Target(target)
    if quiet:
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)

    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir, exist_ok=True)
    import_tensor_intrin_fast()  # TuneContext imports it in this process

    start = time.perf_counter()
    database = ms.tune_tir(
        mod=func,
        target=tvm_target,
        work_dir=work_dir,
        max_trials_global=trials,
        num_trials_per_iter=min(64, trials),
        builder=make_builder(cores),
        runner=make_runner(),
        space="post-order-apply",
        strategy="evolutionary",
        cost_model="xgb",
        num_tuning_cores=cores,
        seed=seed,
    )
    wall_s = time.perf_counter() - start

    return measure_best(
        database,
        func,
        target,
        wall_s=wall_s,
        work_dir=work_dir,
        seed=seed,
        repeat=repeat,
        min_repeat_ms=min_repeat_ms,
        reference=reference,
        verify=verify,
        wait_quiet_s=wait_quiet_s,
    )


def load_database(work_dir: str):
    """The JSON database a tuning run left in `work_dir`."""
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(
        path_workload=os.path.join(work_dir, "database_workload.json"),
        path_tuning_record=os.path.join(work_dir, "database_tuning_record.json"),
        allow_missing=False,
    )


def measure_best(
    database,
    func: tirx.PrimFunc,
    target: dict,
    *,
    wall_s: float = float("nan"),
    work_dir: str = "",
    seed: int = 0,
    repeat: int = 10,
    min_repeat_ms: int = 100,
    reference: Callable[..., np.ndarray] | None = None,
    verify: bool = True,
    wait_quiet_s: float = 0.0,
) -> MetaScheduleResult:
    """Build the best schedule in `database` for `func`, check it, and time it like any kernel.

    With `wait_quiet_s`, first wait (up to that long) for the other processes to go quiet.
    """
    from tvm.s_tir import meta_schedule as ms

    from schedlang.core.opinfo import flop_count

    tvm_target = tvm.target.Target(target)
    records = database.get_all_tuning_records()
    run_secs = [[float(s) for s in r.run_secs] if r.run_secs is not None else [] for r in records]
    valid = [statistics.mean(s) for s in run_secs if s and max(s) < 1e9]
    sch = ms.tir_integration.compile_tir(database, func, tvm_target)
    if sch is None:
        raise RuntimeError(f"MetaSchedule found no valid schedule in {len(records)} trials")

    executable = tvm.compile(sch.mod, target=tvm_target)
    device = tvm.cpu(0)
    arrays, outputs = _random_inputs(func, seed)
    verified = None
    if verify:
        verified = _verify(func, executable, arrays, outputs, reference, device)
        if not verified:
            raise RuntimeError("the tuned kernel's outputs differ from the reference")
    tensors = [tvm.runtime.tensor(a, device) for a in arrays]
    evaluator = executable.mod.time_evaluator(
        "main", device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms
    )
    if wait_quiet_s > 0:
        wait_for_quiet(wait_quiet_s)
    with OtherLoad() as load:
        latencies = tuple(float(r) for r in evaluator(*tensors).results)
    latency = statistics.median(latencies)
    flops = flop_count(func)
    return MetaScheduleResult(
        latency_s=latency,
        gflops=flops / latency / 1e9,
        trials=len(records),
        wall_s=wall_s,
        trace_text=str(sch.trace),
        func=sch.mod["main"],
        latencies_s=latencies,
        valid_trials=len(valid),
        tuner_best_latency_s=min(valid) if valid else None,
        flops=flops,
        verified=verified,
        other_load_cores=load.cores,
        work_dir=work_dir,
    )


def _random_inputs(func: tirx.PrimFunc, seed: int) -> tuple[list[np.ndarray], list[int]]:
    """schedlang's inputs for `func` (floats in [-1, 1), outputs zeros) and the output indices."""
    from schedlang.core.ops import from_primfunc, random_inputs

    op = from_primfunc(func)
    names = [p.name for p in func.params]
    return random_inputs(op, seed), [names.index(b.name) for b in op.outputs]


def _verify(func, executable, arrays, outputs, reference, device) -> bool:
    """Run once; compare the outputs with `reference(*inputs)` or the unscheduled build."""
    tensors = [tvm.runtime.tensor(a, device) for a in arrays]
    executable(*tensors)
    got = [tensors[i].numpy() for i in outputs]
    if reference is not None:
        inputs = [a for i, a in enumerate(arrays) if i not in outputs]
        want = reference(*inputs)
        want = [np.asarray(w) for w in (want if isinstance(want, tuple | list) else (want,))]
    else:
        plain = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target("llvm"))
        plain_tensors = [tvm.runtime.tensor(a, device) for a in arrays]
        plain(*plain_tensors)
        want = [plain_tensors[i].numpy() for i in outputs]
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return False
        if np.issubdtype(g.dtype, np.floating):
            if not np.allclose(g, w, rtol=1e-3, atol=1e-3):
                return False
        elif not np.array_equal(g, w):
            return False
    return True


# --- numpy -----------------------------------------------------------------------------------


def time_numpy_matmul(n: int = 1024, repeat: int = 10, seed: int = 0) -> tuple[float, float, float]:
    """(median seconds, GFLOP/s, other processes' load in cores) of numpy `a @ b` for n^3 fp32
    (OpenBLAS with its default thread count: all cores)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    a @ b  # warm up
    times = []
    with OtherLoad() as load:
        for _ in range(repeat):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return median, 2.0 * n**3 / median / 1e9, load.cores


# --- the script ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=sorted(OPS), default="matmul")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=10, help="timing repeats after tuning")
    parser.add_argument("--work-dir", help="MetaSchedule database/logs (default: a temp dir)")
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="do not tune: rebuild and re-time the best schedule already in --work-dir",
    )
    parser.add_argument("--numpy", action="store_true", help="also time numpy a @ b, 1024^3 fp32")
    parser.add_argument("--no-tune", action="store_true", help="skip tuning (with --numpy)")
    parser.add_argument("--trace", action="store_true", help="print the best schedule's trace")
    parser.add_argument("-q", "--quiet", action="store_true", help="hide MetaSchedule's log")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=300.0,
        metavar="S",
        help="before each timing, wait up to S seconds for other processes to go quiet (0: don't)",
    )
    args = parser.parse_args(argv)

    if args.numpy:
        if args.wait_quiet > 0:
            wait_for_quiet(args.wait_quiet)
        seconds, gflops, others = time_numpy_matmul()
        print(
            f"numpy a @ b 1024^3 fp32: {seconds * 1e3:.2f} ms, {gflops:.1f} GFLOP/s "
            f"(other processes: {others:.2f} cores)",
            flush=True,
        )
    if args.no_tune:
        return 0

    sys.path.insert(0, str(REPO))
    from schedlang.core.ops import load_op

    op = load_op(str(REPO / OPS[args.op]))
    target = default_target()
    if args.remeasure:
        if not args.work_dir:
            parser.error("--remeasure needs --work-dir")
        import_tensor_intrin_fast()
        work_dir = args.work_dir
        result = measure_best(
            load_database(work_dir),
            op.func,
            target,
            work_dir=work_dir,
            seed=args.seed,
            repeat=args.repeat,
            reference=op.reference,
            wait_quiet_s=args.wait_quiet,
        )
    else:
        work_dir = args.work_dir or tempfile.mkdtemp(prefix=f"ms-{args.op}-")
        result = tune_metaschedule(
            op.func,
            target,
            args.trials,
            work_dir,
            args.seed,
            repeat=args.repeat,
            reference=op.reference,
            quiet=args.quiet,
            wait_quiet_s=args.wait_quiet,
        )
    if args.trace:
        print(result.trace_text)
    tuner = (
        f", tuner's own best {result.tuner_best_latency_s * 1e3:.2f} ms"
        if result.tuner_best_latency_s
        else ""
    )
    tuning = "not tuned (--remeasure)" if args.remeasure else f"tuning {result.wall_s:.0f} s"
    print(
        f"metaschedule {args.op} ({target['mcpu']}, {target['num-cores']} cores, "
        f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')}): {result.latency_s * 1e3:.2f} ms, "
        f"{result.gflops:.1f} GFLOP/s; {result.trials} trials ({result.valid_trials} valid), "
        f"{tuning}; verified={result.verified}{tuner}; other processes during timing: "
        f"{result.other_load_cores:.2f} cores; work_dir {work_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
