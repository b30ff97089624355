"""TVM's GPU verifier, and its findings mapped back to the statements that caused them.

A schedule that checks clean on a GPU is lowered as far as `tvm.s_tir.analysis.verify_gpu_code`
needs (as MetaSchedule's VerifyGPUCode postproc runs it). The verifier's messages name no
statement: threads per block, shared memory as allocated, vector widths. They are traced back
through what the checker recorded (each bind, each cache, each vectorize) to a Diagnostic at the
statement to change.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import tvm
from tvm import s_tir, tirx

from schedlang.checker.primitives import tvm_reason
from schedlang.checker.state import CheckerState
from schedlang.core.diagnostics import Diagnostic, error
from schedlang.core.target import Target
from schedlang.lang.statements.base import dtype_bytes
from schedlang.lang.statements.tensorize import written_by_intrinsics


def verify_lowered(c: CheckerState, func: tirx.PrimFunc) -> None:
    """Run TVM's GPU verifier on the scheduled function and report what it finds at the
    statements that caused it. It sees what the checks above estimate: the buffers as TVM
    allocates them (padding included) and the threads of each kernel as launched."""
    try:
        lowered = lower_for_verification(func, c.target)
        messages = gpu_verifier_messages(lowered, gpu_constraints(c.target))
    except (RuntimeError, ValueError) as exc:  # the passes' own refusals
        c.error(f"TVM cannot lower the schedule for the GPU: {tvm_reason(exc)}", None)
        return
    kernels = kernel_uses(lowered)
    warp_elements_fit(c, kernels)
    if not messages:
        return
    for message in dict.fromkeys(messages):  # TVM repeats a message once per access
        found = gpu_finding(c, message, kernels)
        # Its error about a vector replaces the warning check_Vectorize gave the same axis.
        if found.span in {axis.span for _, axis in c.vectorized}:
            c.diagnostics[:] = [d for d in c.diagnostics if d.is_error or d.span != found.span]
        c.diagnostics.append(found)


def warp_elements_fit(c: CheckerState, kernels: list[_KernelUse]) -> None:
    """TVM builds warp memory at one element per thread only: with more, the common
    subexpressions it factors out of the indices hide threadIdx.x from LowerWarpMemory, which
    then fails. Found by fuzzing (tests/test_fuzz.py)."""
    for kernel in kernels:
        lanes = kernel.threads.get("threadIdx.x", 1)  # a warp buffer spans threadIdx.x only
        for name, elements in kernel.warp:
            if written_by_intrinsics(c.nest, name):  # tensorize's mma/ldmatrix layout
                continue
            c.require(
                elements <= lanes,
                f"warp memory `{name}` holds {elements} elements for {lanes} threads of "
                "threadIdx.x; TVM builds warp memory only at one element per thread",
                c.buffer_made_by.get(name),
                "bind every loop that indexes it to a thread axis, or use `local`",
            )


def gpu_finding(c: CheckerState, message: str, kernels: list[_KernelUse]) -> Diagnostic:
    note = "found by TVM's GPU verifier (tvm.s_tir.analysis.verify_gpu_code) after lowering"
    if match := _THREADS_USED.search(message):
        total = int(match[1])
        kernel = next((k for k in kernels if k.threads_per_block == total), None)
        threads = kernel.threads if kernel else {}
        binds = [b for b in c.binds if threads.get(b.thread) == b.extent]
        shape = " x ".join(
            f"{e} ({t})" for t, e in sorted(threads.items()) if t.startswith("threadIdx")
        )
        return error(
            f"{total} threads per block, more than the target's {c.target.max_threads_per_block}",
            binds[-1].span if binds else None,
            f"threads: {shape}" if shape else "",
            note,
        )
    if match := _THREAD_EXTENT.search(message):
        thread, extent, limit = match[1], int(match[2]), int(match[3])
        return error(
            f"{thread} extent {extent} exceeds the target's limit of {limit}",
            c.bind_span(thread, extent),
            note,
        )
    if match := _THREAD_MISMATCH.search(message):
        thread, extent, other = match[1], int(match[2]), int(match[3])
        return error(
            f"{thread} is bound to extent {extent} here but to {other} elsewhere in the "
            "same kernel",
            c.bind_span(thread, extent),
            "every loop bound to one thread axis must have the same extent",
            note,
        )
    if match := _SHARED_USED.search(message):
        total = int(match[1])
        kernel = next((k for k in kernels if k.shared_bytes == total), None)
        buffers = sorted(kernel.shared if kernel else [], key=lambda b: -b[1])
        padded = [name for name, _ in buffers if name in c.aligned_by]
        return error(
            f"shared memory use {total} bytes exceeds the target's "
            f"{c.target.max_shared_memory_per_block} per block",
            c.buffer_made_by.get(buffers[0][0]) if buffers else None,
            "by buffer: " + ", ".join(f"{name} {size} B" for name, size in buffers),
            *(f"storage_align (line {c.aligned_by[name].line}) pads `{name}`" for name in padded),
            "cache smaller tiles (compute the cache at an inner loop)",
            note,
        )
    if match := _VECTOR_BYTES.search(message):
        lanes, size, dtype, limit = int(match[1]), int(match[2]), match[3], int(match[4])
        axes = [axis for extent, axis in c.vectorized if extent == lanes]
        fits = max(1, limit * lanes // size)
        return error(
            f"vectors of {lanes} x {dtype} are {size} bytes; a GPU thread loads or stores at "
            f"most {limit} bytes at once",
            axes[0].span if axes else None,
            f"split it first: `split {axes[0].text} by {fits}` and vectorize `{axes[0].text}.i`"
            if axes
            else f"vectorize at most {fits} lanes",
            note,
        )
    return error(f"TVM's GPU verifier: {message}", None, note)


# TVM's GPU verifier's messages (src/s_tir/analysis/verify_gpu_code.cc).
_THREADS_USED = re.compile(r"Used threads per block \((\d+)\)")
_THREAD_EXTENT = re.compile(r"Extent of (\S+) \((\d+)\) is greater than maximum allowed \((\d+)\)")
_THREAD_MISMATCH = re.compile(r"Extent of (\S+) \((\d+)\) does not match the bound (\d+)")
_SHARED_USED = re.compile(r"Used shared memory per block \((\d+)\)")
_VECTOR_BYTES = re.compile(
    r"Number of lanes \((\d+)\) times number of bytes \((\d+)\) for dtype (?:T\.)?([a-z]+\d+)"
    r"x\d+ is greater than the maximum number of vector bytes \((\d+)\)"
)


def gpu_constraints(target: Target) -> dict[str, int]:
    """The limits TVM's GPU verifier checks, from the target's facts and MetaSchedule's two."""
    threads = target.max_threads_per_block or 1024
    x, y, z = target.max_thread_extent or (threads, threads, threads)
    constraints = {
        "max_threads_per_block": threads,
        "max_thread_x": x,
        "max_thread_y": y,
        "max_thread_z": z,
        "max_vthread": target.max_vthread,
        "max_vector_bytes": target.max_vector_bytes,
    }
    if target.max_shared_memory_per_block:
        constraints["max_shared_memory_per_block"] = target.max_shared_memory_per_block
    return constraints


def lower_for_verification(func: tirx.PrimFunc, target: Target) -> tirx.PrimFunc:
    """`func` lowered as far as TVM's GPU verifier needs, by the TIR passes MetaSchedule's
    VerifyGPUCode postproc runs (src/s_tir/meta_schedule/postproc/verify_gpu_code.cc): kernels
    launched with their thread extents, buffers compacted and flattened to what each kernel
    allocates, loops vectorized. No code is generated; it takes milliseconds."""
    passes = [
        s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.LiftThreadBinding(),
        s_tir.transform.ManifestSharedMemoryLocalStage(),
        s_tir.transform.CompactBufferAllocation(),
        tirx.transform.StmtSimplify(),
        s_tir.transform.LowerAutoCopy(),
        s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.InjectSoftwarePipeline(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
        tirx.transform.BF16ComputeLegalize(),
        tirx.transform.NarrowDataType(32),
        tirx.transform.StmtSimplify(),
        tirx.transform.VectorizeLoop(True),
        s_tir.transform.InjectVirtualThread(),
        s_tir.transform.InjectDoubleBuffer(),
        tirx.transform.StorageRewrite(),
        s_tir.transform.MergeSharedMemoryAllocations(),
        tirx.transform.LowerIntrin(),
    ]
    func = (
        func.with_attr("global_symbol", "main")
        .with_attr("target", target.to_tvm())  # LowerIntrin needs it
        .with_attr("tirx.noalias", True)
    )
    return tvm.transform.Sequential(passes)(tvm.IRModule({"main": func}))["main"]


_verify_gpu_code_pass = tvm.get_global_func("s_tir.transform.VerifyGPUCode")


def gpu_verifier_messages(lowered: tirx.PrimFunc, constraints: Mapping[str, int]) -> list[str]:
    """TVM's verdict on a lowered function: [] when it passes, else one message per violation.

    `verify_gpu_code` answers yes or no; its pass form raises with the messages."""
    if s_tir.analysis.verify_gpu_code(lowered, dict(constraints)):
        return []
    try:
        _verify_gpu_code_pass(dict(constraints))(tvm.IRModule({"main": lowered}))
    except RuntimeError as exc:
        text = str(exc).split("violated:", 1)[-1].split("In function", 1)[0]
        return [line.strip().rstrip(";") for line in text.splitlines() if line.strip()]
    return ["the function violates a GPU limit"]


@dataclass
class _KernelUse:
    """One kernel of a lowered function: its thread extents and shared allocations."""

    threads: dict[str, int] = field(default_factory=dict)
    shared: list[tuple[str, int]] = field(default_factory=list)  # (buffer, bytes)
    warp: list[tuple[str, int]] = field(default_factory=list)  # (buffer, elements)

    @property
    def threads_per_block(self) -> int:
        return math.prod(e for t, e in self.threads.items() if t.startswith("threadIdx"))

    @property
    def shared_bytes(self) -> int:
        return sum(size for _, size in self.shared)


def kernel_uses(lowered: tirx.PrimFunc) -> list[_KernelUse]:
    """Each kernel is an outermost thread-extent attribute, as TVM's verifier counts them."""
    kernels: list[_KernelUse] = []

    def visit(node: object, kernel: _KernelUse | None) -> None:
        if isinstance(node, tirx.AttrStmt) and node.attr_key == "thread_extent":
            if kernel is None:
                kernel = _KernelUse()
                kernels.append(kernel)
            if isinstance(node.value, tirx.IntImm):
                kernel.threads.setdefault(node.node.var.name, int(node.value))
        if isinstance(node, tirx.AllocBuffer) and kernel is not None:
            buffer = node.buffer
            elements = math.prod(int(d) for d in buffer.shape if isinstance(d, tirx.IntImm))
            if str(buffer.scope()).startswith("shared"):
                kernel.shared.append((buffer.name, elements * dtype_bytes(str(buffer.dtype))))
            elif str(buffer.scope()) == "warp":
                kernel.warp.append((buffer.name, elements))
        for name in ("seq", "body", "then_case", "else_case"):
            child = getattr(node, name, None)
            if name == "seq" and child is not None:
                for item in child:
                    visit(item, kernel)
            elif child is not None:
                visit(child, kernel)

    visit(lowered.body, None)
    return kernels
