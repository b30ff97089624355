"""Differential runs: a checked kernel built with its scratch memory poisoned, run in a sandbox
worker on poisoned outputs inside guard bytes, and compared with the op's reference.

A kernel that reads memory it never wrote, or leaves part of its output unwritten, often still
matches the reference: fresh pages read as zeros, and zero is what a padding border or an
accumulator's start should hold. So before the run every output argument is filled with poison
(NaN for floats, the bit pattern 0b1010… for integers), and the build inserts, after every buffer
the kernel allocates itself (caches, rfactor and padding buffers), a loop filling it with the same
poison. Each argument lies inside 64 KiB of guard bytes (schedlang.run.sandbox.GuardedArray), so a
write past either end is caught even when it corrupts nothing visible. The kernel runs in a
`schedlang.run.sandbox.Worker`: a kernel that segfaults or aborts (heap corruption) costs the
worker, which restarts, never the fuzzer.

    verdict = run_differential(op, lowered.func)   # Verdict("verified" | "wrong" | …, reason)
"""

from __future__ import annotations

import atexit
import functools
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

RUN_TIMEOUT_S = 30.0  # one run of a kernel of at most ~10^6 iterations; past this it hangs
# The worker loads each kernel under a new name (dlopen returns the library already loaded under
# a name it has seen) and never unloads one: a fresh worker after this many.
RUNS_PER_WORKER = 500
POISON_PIPELINE = "fuzz_poisoned"

# How a differential run ends; all but "verified" are findings against the checker.
VERDICTS = {
    "verified": "computes what the reference computes",
    "build_error": "checks clean but does not build",
    "wrong": "checks clean but computes wrong values",
    "out_of_bounds": "checks clean but writes out of bounds",
    "crash": "checks clean but crashes when run",
    "timeout": "checks clean but hangs when run",
    "run_error": "checks clean but fails when run",
}


class WorkerBroken(Exception):
    """The worker could not run the job for a reason of its own (it could not import schedlang,
    say, while the working tree is being edited): not a finding. Run the input again later."""


# A job failing with one of these failed in the worker's own code, not in the kernel.
_WORKER_ERRORS = ("ImportError", "ModuleNotFoundError", "SyntaxError", "NameError")


@dataclass(frozen=True)
class Verdict:
    kind: str  # a key of VERDICTS
    reason: str
    build_seconds: float = 0.0  # the poisoned build alone

    @property
    def ok(self) -> bool:
        return self.kind == "verified"

    def describe(self) -> str:
        return f"{VERDICTS[self.kind]}: {self.reason}"


# --- poison ---------------------------------------------------------------------------------------


def poison_value(dtype: str):
    """What an unwritten element of `dtype` holds: NaN, or alternating bits for integers."""
    kind = np.dtype(dtype).kind if dtype != "bfloat16" else "f"
    if kind == "f":
        return float("nan")
    if kind == "b":
        return True
    bits = np.dtype(dtype).itemsize * 8
    pattern = int("10" * (bits // 2), 2)
    return pattern - (1 << bits) if kind == "i" else pattern


def poisoned_like(array: np.ndarray) -> np.ndarray:
    return np.full(array.shape, poison_value(str(array.dtype)), array.dtype)


# Element stores the poison fills may add to a run: a buffer allocated inside loops is filled in
# every iteration. Past this a fill is left out: a 236,000-element buffer (storage_align) inside
# 196,608 iterations made a 2 ms kernel take 31 s poisoned, a false "hang" (seed 13).
POISON_BUDGET = 1 << 27


def _poison_allocations(stmt):
    """`stmt` with a loop after each AllocBuffer that fills the buffer with poison (unless the
    fills would pass POISON_BUDGET stores in all)."""
    import math

    import tvm
    from tvm import tirx

    def fill(buffer, trips: int) -> tirx.Stmt | None:
        dtype = str(buffer.dtype)
        if tvm.DataType(dtype).lanes != 1 or not all(
            isinstance(d, tirx.IntImm) for d in buffer.shape
        ):
            return None
        if trips * math.prod(int(d) for d in buffer.shape) > POISON_BUDGET:
            return None
        try:
            value = tirx.const(poison_value(dtype), dtype)
        except TypeError:
            return None
        indices = [tirx.Var(f"poison{n}", "int32") for n in range(len(buffer.shape))]
        body: tirx.Stmt = tirx.BufferStore(buffer, value, indices)
        for var, extent in reversed(list(zip(indices, buffer.shape, strict=True))):
            body = tirx.For(var, 0, int(extent), tirx.ForKind.SERIAL, body)
        return body

    def visit(node, trips: int):
        if isinstance(node, tirx.SeqStmt):
            children = []
            for child in node.seq:
                children.append(visit(child, trips))
                if isinstance(child, tirx.AllocBuffer) and (poison := fill(child.buffer, trips)):
                    children.append(poison)
            return tirx.SeqStmt(children)
        if isinstance(node, tirx.AllocBuffer):  # alone: nothing reads it, nothing to poison
            return node
        if isinstance(node, tirx.For):
            extent = int(node.extent) if isinstance(node.extent, tirx.IntImm) else POISON_BUDGET
            return tirx.For(node.loop_var, node.min, node.extent, node.kind,
                            visit(node.body, trips * max(extent, 1)),
                            node.thread_binding, node.annotations, node.step)  # fmt: skip
        if isinstance(node, tirx.IfThenElse):
            other = visit(node.else_case, trips) if node.else_case is not None else None
            return tirx.IfThenElse(node.condition, visit(node.then_case, trips), other)
        if isinstance(node, tirx.AttrStmt):
            return tirx.AttrStmt(node.node, node.attr_key, node.value, visit(node.body, trips))
        if isinstance(node, tirx.While):
            return tirx.While(node.condition, visit(node.body, POISON_BUDGET))
        return node

    return visit(stmt, 1)


@functools.cache
def register_poison_pipeline() -> str:
    """TVM's default s_tir pipeline (0.27) with the poison fill after FlattenBuffer, where every
    scratch buffer is an AllocBuffer of its final, compacted shape."""
    import tvm
    from tvm import s_tir, tirx
    from tvm.s_tir import pipeline as s_tir_pipeline
    from tvm.tirx import compilation_pipeline

    @tirx.transform.prim_func_pass(opt_level=0, name="FuzzPoisonAllocations")
    def poison(func, _mod, _ctx):
        return func.with_body(_poison_allocations(func.body))

    def passes(config) -> list:
        early = [
            s_tir.transform.CanonicalizeLoop(),
            s_tir.transform.LowerCrossThreadReduction(),
            s_tir.transform.LowerInitBlock(),
            s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque(),
            s_tir.transform.LiftThreadBinding(),
            s_tir.transform.ManifestSharedMemoryLocalStage(),
            s_tir.transform.CompactBufferAllocation(),
            s_tir.transform.LowerAutoCopy(),
            s_tir.transform.UnifyThreadBinding(),
            s_tir.transform.LowerMatchBuffer(),
            s_tir.transform.StmtSimplify(),
            s_tir.transform.InjectPermutedLayout(),
            s_tir.transform.AnnotateIrregularLoop(),
            s_tir.transform.InjectSoftwarePipeline(),
            s_tir.transform.TransformMmaBufferLayout(),
            s_tir.transform.LowerOpaqueBlock(),
            tirx.transform.FlattenBuffer(),
            poison,
            tirx.transform.BF16ComputeLegalize(),
            tirx.transform.NarrowDataType(32),
            s_tir.transform.LoopPartition(),
            tirx.transform.VectorizeLoop(not bool(config.get("tirx.disable_vectorize", False))),
            s_tir.transform.InjectVirtualThread(),
            s_tir.transform.InjectDoubleBuffer(),
            tirx.transform.StorageRewrite(),
            s_tir.transform.HoistIfThenElse(),
            tirx.transform.UnrollLoop(),
            s_tir.transform.RenormalizeSplitPattern(),
            tirx.transform.StmtSimplify(),
            tirx.transform.RemoveNoOp(),
            s_tir.transform.RewriteUnsafeSelect(),
            tirx.transform.CommonSubexprElim(),
            tirx.transform.FP8ComputeLegalize(),
            s_tir.transform.VerifyVTCMLimit(),
            s_tir.transform.LowerVtcmAlloc(),
            tirx.transform.VerifyMemory(),
            tirx.transform.AnnotateEntryFunc(),
            s_tir.transform.ThreadSync("shared"),
            s_tir.transform.ThreadSync("shared.dyn"),
            s_tir.transform.ThreadSync("warp"),
            s_tir.transform.InferFragment(),
            s_tir.transform.LowerThreadAllreduce(),
            s_tir.transform.MergeSharedMemoryAllocations(),
            tirx.transform.SplitHostDevice(),
            tirx.transform.MakePackedAPI(),
            tirx.transform.FP8StorageLegalize(),
            tirx.transform.BF16StorageLegalize(),
        ]
        return early

    def factory():
        @tvm.transform.module_pass(opt_level=0, name="FuzzPoisonedPipeline")
        def pipeline(mod, _ctx):
            config = tvm.transform.PassContext.current().config
            return tvm.ir.transform.Sequential(passes(config))(mod)

        return (pipeline, s_tir_pipeline.finalize_host_passes,
                s_tir_pipeline.finalize_device_passes)  # fmt: skip

    compilation_pipeline.register_tir_pipeline(POISON_PIPELINE, factory)
    return POISON_PIPELINE


def build_poisoned(func, target="llvm"):
    """`tvm.compile` of `func` with every scratch buffer poisoned."""
    import tvm

    return tvm.compile(
        tvm.IRModule({"main": func}), target=target, tir_pipeline=register_poison_pipeline()
    )


# --- running --------------------------------------------------------------------------------------


@functools.cache
def _scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="schedlang-fuzz-"))


@functools.cache
def worker():
    """This process's runner: a sandbox worker, started on first use and restarted after a
    crash by `Worker.call` itself."""
    from schedlang.run.sandbox import Worker

    env = {"TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS", "1")}
    log = _scratch() / "worker.log"  # what a crashing kernel prints (glibc's "free(): …")
    runner = Worker("fuzz-runner", {**env, "SCHEDLANG_WORKER_LOG": str(log)})
    atexit.register(_close, runner)
    return runner


def _close(runner) -> None:
    import shutil

    runner.close()
    shutil.rmtree(_scratch(), ignore_errors=True)


def reference_arrays(op, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """(arguments with the outputs poisoned, the expected outputs, the outputs' positions)."""
    from schedlang.core.ops import random_inputs
    from schedlang.run.measure import expected_outputs, output_indices

    args = random_inputs(op, seed)
    expected = expected_outputs(op, [a.copy() for a in args])
    outputs = output_indices(op)
    for index in outputs:
        args[index] = poisoned_like(args[index])
    return args, expected, outputs


_RUNS = [0]


def run_differential(
    op, func, *, seed: int = 0, timeout_s: float = RUN_TIMEOUT_S, target=None
) -> Verdict:
    """Build `func` (a checked schedule of `op` for `target`, by default schedlang's `llvm`:
    this machine's CPU) poisoned, run it once in the worker, and compare with the reference.
    The build is for the target the schedule was checked for: a bare `llvm` (generic x86-64,
    which schedlang never builds for) failed in LLVM on a 5-lane scatter that builds for the
    host (the third long run)."""
    from schedlang.core.target import resolve_target

    tvm_target = (target or resolve_target("llvm")).to_tvm()
    started = time.perf_counter()
    try:
        executable = build_poisoned(func, tvm_target)
    except Exception as exc:  # TVM raises several types; the finding is the same
        executable = _unpoisoned_build(func, tvm_target)
        if executable is None:
            return Verdict("build_error", _last_line(exc), time.perf_counter() - started)
    built = time.perf_counter() - started
    return replace(_run_built(op, executable, seed, timeout_s), build_seconds=built)


def _run_built(op, executable, seed: int, timeout_s: float) -> Verdict:
    from schedlang.run.sandbox import JobError, WorkerCrash, WorkerTimeout

    scratch = _scratch()
    runner = worker()
    _RUNS[0] += 1
    if _RUNS[0] % RUNS_PER_WORKER == 0:
        runner.kill()
    if runner.process is None or not runner.process.is_alive():
        try:
            runner.start()
        except WorkerCrash as exc:  # this machine's problem (or the tree's), not the kernel's
            raise WorkerBroken(str(exc)) from None
    lib = scratch / f"kernel-{_RUNS[0]}.so"
    executable.export_library(str(lib))
    args, expected, outputs = reference_arrays(op, seed)
    np.savez(scratch / "args.npz", *args)
    np.savez(scratch / "expected.npz", *expected)
    try:
        answer = runner.call(
            "run",
            timeout_s,
            lib_path=str(lib),
            args_path=str(scratch / "args.npz"),
            expected_path=str(scratch / "expected.npz"),
            outputs=outputs,
            device="cpu",
            repeat=1,
            min_repeat_ms=0,
        )
    except WorkerCrash as exc:
        return Verdict("crash", f"{exc}{_crash_output()}")
    except WorkerTimeout as exc:
        return Verdict("timeout", str(exc))
    except JobError as exc:
        if str(exc).startswith(_WORKER_ERRORS):
            runner.kill()
            raise WorkerBroken(str(exc)) from None
        return Verdict("run_error", str(exc))
    finally:
        lib.unlink(missing_ok=True)
    if answer["ok"]:
        return Verdict("verified", answer["reason"])
    reason = answer["reason"]
    return Verdict("out_of_bounds" if reason.startswith("wrote out of bounds") else "wrong", reason)


def _unpoisoned_build(func, target):
    """TVM's own build of `func`, where the poisoned one failed: None if it fails too (the
    finding). LLVM's verifier has rejected a poisoned build TVM's own pipeline makes ("Instruction
    does not dominate all uses" in a vector shuffle, the third long run): the kernel then runs
    without poisoned scratch buffers, still compared with the reference."""
    import tvm

    try:
        return tvm.compile(tvm.IRModule({"main": func}), target=target)
    except Exception:
        return None


def _crash_output() -> str:
    """The last line a crashed kernel printed (glibc's `free(): invalid next size`), if any."""
    log = _scratch() / "worker.log"
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        log.write_text("")
    except OSError:
        return ""
    return f": {lines[-1].strip()}" if lines else ""


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
