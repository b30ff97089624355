"""Verified builds: a built kernel runs once, in a worker process, before anyone gets its library.

`schedlang compile`, `schedlang run` and `schedlang.build` call `verify_build` for a target this
machine can run. The kernel runs in a sandbox worker (schedlang.run.sandbox), never in the caller's
process, so a kernel that writes out of bounds or crashes costs an error message, not the caller's
heap. Before the run:

- inputs are the op's seeded random inputs (`ops.random_inputs`);
- every output the function does not also read is poisoned (NaN, or a bit pattern for integers),
  so a kernel that leaves part of its output unwritten fails instead of passing on zeros;
- the worker's C heap is poisoned too (glibc's MALLOC_PERTURB_, with the mmap threshold raised so
  that buffers up to 32 MiB come from the heap): a kernel that reads an intermediate buffer before
  writing it reads 0x7f7f7f7f (3.4e38 as float32), not what the last run happened to leave there.
  Buffers TVM puts on the stack (under 1 KiB) and buffers over 32 MiB are not poisoned;
- every argument sits between guard bytes (`sandbox.GuardedArray`): a write past either end is
  reported with its distance.

Outputs are compared with the op's numpy reference, or else with the unscheduled function built
for this CPU (trusted code: it runs in the calling process, while the worker starts).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import tvm
from tvm import tirx

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import read_buffers
from schedlang.core.ops import Op, from_primfunc, random_inputs
from schedlang.core.target import Target, require_runs_here
from schedlang.run.measure import expected_outputs, output_indices
from schedlang.run.outcome import Outcome
from schedlang.run.sandbox import JobError, MeasureJob, Worker, WorkerCrash, WorkerTimeout

RUN_TIMEOUT_S = 300.0  # one run of the kernel
# The byte glibc fills fresh allocations with is MALLOC_PERTURB_ ^ 0xff: 0x7f, a float32 of 3.4e38.
POISONED_HEAP = {"MALLOC_PERTURB_": str(0x80), "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}


def verify_build(
    op_or_func: Op | tirx.PrimFunc,
    executable: tvm.runtime.Executable,
    target: Target,
    *,
    seed: int = 0,
    timeout_s: float = RUN_TIMEOUT_S,
) -> str:
    """Run `executable` once in the verifier worker and compare it with the reference; the
    one-line reason when it matches, SchedlangError when it does not (or crashes, or hangs)."""
    op = op_or_func if isinstance(op_or_func, Op) else from_primfunc(op_or_func)
    # A fresh worker for each kernel: TVM's workspace pool keeps freed buffers for the next run,
    # which would then read what the last kernel left instead of the poison. It starts while the
    # reference is computed here (the numpy reference, or the unscheduled build: trusted code).
    worker = Worker("verifier", _worker_env())
    worker.spawn()
    try:
        with tempfile.TemporaryDirectory(prefix="schedlang-verify-") as folder:
            work = Path(folder)
            library = work / "kernel.so"
            try:
                executable.export_library(str(library))
            except Exception as exc:  # TVM raises several types
                raise SchedlangError(f"cannot export the kernel to verify it: {exc}") from None
            args = random_inputs(op, seed)
            outputs = output_indices(op)
            np.savez(work / "args.npz", *args)
            np.savez(work / "expected.npz", *expected_outputs(op, [a.copy() for a in args]))
            job = MeasureJob(
                lib_path=str(library),
                args_path=str(work / "args.npz"),
                expected_path=str(work / "expected.npz"),
                outputs=outputs,
                device=target.device(),
                repeat=0,
                min_repeat_ms=0,
                poison=unread_outputs(op.func, outputs),
                names=[op.func.params[n].name for n in outputs],
            )
            outcome = _call(worker, timeout_s, job)
    finally:
        worker.close()
    if not outcome.is_ok:
        raise SchedlangError(
            f"the built kernel is wrong: {outcome.reason}",
            "schedlang checked this schedule clean, so this is a bug in schedlang's checker "
            "(or in TVM): please report it with the command you ran",
            "--no-verify skips this run (and writes the wrong kernel)",
        )
    return outcome.reason


def runs_here(target: Target) -> bool:
    """Whether this machine can run kernels built for `target` (else they are not verified)."""
    if target.is_gpu:
        return bool(tvm.device(target.device(), 0).exist)
    try:
        require_runs_here(target)
    except SchedlangError:  # another architecture, or instructions this CPU lacks
        return False
    return True


def unread_outputs(func: tirx.PrimFunc, outputs: list[int]) -> list[int]:
    """The outputs no block reads: they can be poisoned before the run."""
    read = read_buffers(func)
    return [n for n in outputs if func.params[n].name not in read]


def _call(worker: Worker, timeout_s: float, job: MeasureJob) -> Outcome:
    try:
        return worker.call("measure", timeout_s, measurement=job)
    except WorkerCrash as exc:
        raise SchedlangError(
            f"the kernel crashed while being verified: {exc}",
            "schedlang checked this schedule clean: please report it with the command you ran",
        ) from None
    except WorkerTimeout:
        raise SchedlangError(
            f"the kernel ran longer than {timeout_s:g} s while being verified"
        ) from None
    except JobError as exc:
        raise SchedlangError(f"cannot verify the kernel: {exc}") from None


def _worker_env() -> dict[str, str]:
    env = {"TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS", str(os.cpu_count() or 1))}
    env.update(POISONED_HEAP)
    return env
