"""Run a built kernel: check its outputs against a reference, then time it.

Verification comes first: a fast wrong kernel is a failure, never a result. Timing uses TVM's time
evaluator (several repeats, each long enough to be measurable, the median reported). Set
TVM_NUM_THREADS to the core count before timing: TVM's runtime otherwise uses half the cores.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import flop_count
from schedlang.core.ops import Op, random_inputs, reference_outputs
from schedlang.core.target import Target, require_runs_here, resolve_target
from schedlang.run.codegen import compile_func
from schedlang.run.outcome import compare_outputs
from schedlang.run.packing import KERNEL_SYMBOL, PackedWeight
from schedlang.run.sandbox import packed_once


@dataclass(frozen=True)
class Timing:
    latencies_s: tuple[float, ...]  # one per repeat
    flops: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.latencies_s)

    @property
    def gflops(self) -> float:
        return self.flops / self.median_s / 1e9 if self.median_s > 0 else 0.0


def set_runtime_threads(cores: int | None = None) -> None:
    """TVM reads TVM_NUM_THREADS when its thread pool starts; set it before the first run."""
    os.environ.setdefault("TVM_NUM_THREADS", str(cores or os.cpu_count() or 1))


def device_for(target: Target) -> tvm.runtime.Device:
    """The device kernels for `target` run on here; SchedlangError if there is none (no GPU, or a
    CPU target this machine's CPU cannot run)."""
    require_runs_here(target)
    device = tvm.device(target.device(), 0)
    if target.is_gpu and not device.exist:
        raise SchedlangError(
            f"no {target.kind} device on this machine: the kernel can be built but not run",
            "use `schedlang compile --emit source` to see the generated code",
        )
    return device


def expected_outputs(op: Op, args: list[np.ndarray]) -> list[np.ndarray]:
    """The op's numpy reference when it has one, else its unscheduled build on the CPU."""
    outputs = reference_outputs(op, args)
    if outputs is not None:
        return outputs
    results = run_once(compile_func(op.func, resolve_target("llvm")), args, tvm.cpu(0))
    return [results[i] for i in output_indices(op)]


def output_indices(op: Op) -> list[int]:
    """Positions of the op's outputs among the function's parameters."""
    names = [param.name for param in op.func.params]
    return [names.index(buffer.name) for buffer in op.outputs if buffer.name in names]


def run_once(executable, args: list[np.ndarray], device) -> list[np.ndarray]:
    tensors = [tvm.runtime.tensor(a, device) for a in args]
    executable(*tensors)
    return [t.numpy() for t in tensors]


def verify(op: Op, executable, target: Target, seed: int = 0) -> tuple[bool, str]:
    """Run once on random inputs and compare with the reference; (ok, one-line reason)."""
    args = random_inputs(op, seed)
    expected = expected_outputs(op, [a.copy() for a in args])
    results = run_once(executable, args, device_for(target))
    indices = output_indices(op)
    names = [op.func.params[i].name for i in indices]
    return compare_outputs([results[i] for i in indices], expected, names)


def time_kernel(
    op: Op,
    executable,
    target: Target,
    *,
    repeat: int = 5,
    min_repeat_ms: int = 100,
    seed: int = 0,
    prepacked: Sequence[PackedWeight] = (),
) -> Timing:
    """Seconds per run of `main`, one figure per repeat. `prepacked`: `executable` is the
    library of a prepacked kernel (schedlang.run.packing), timed as a built model runs it: its
    packing once, then its kernel alone on the packed weights."""
    device = device_for(target)
    tensors = [tvm.runtime.tensor(a, device) for a in random_inputs(op, seed)]
    timed = "main"
    if prepacked:
        weights = [(w.index, w.shape, w.dtype) for w in prepacked]
        tensors, timed = packed_once(executable.mod, device, tensors, weights), KERNEL_SYMBOL
    evaluator = executable.mod.time_evaluator(
        timed, device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms
    )
    result = evaluator(*tensors)
    return Timing(tuple(float(r) for r in result.results), flop_count(op.func))
