"""The whole-schedule GPU rules: what no single statement shows, checked once every statement is.

Thread bindings of every block, where each buffer lives against its kernel, shared memory per
block, cross-thread reductions that TVM cannot build. Each rule reads the checker's live nest and
provenance (what earlier statements made, moved and bound) and reports through it.
"""

from __future__ import annotations

import math

from schedlang.checker.state import CheckerState
from schedlang.core.diagnostics import one_of, warning
from schedlang.lang.loop import Loop, LoopKind
from schedlang.lang.statements.base import dtype_bytes
from schedlang.lang.statements.tensorize import binds_lanes_itself


def check_schedule(c: CheckerState) -> None:
    check_gpu_bindings(c)
    check_kernel_buffers(c)
    check_shared_memory(c)
    check_accumulation_on_one_thread(c)
    check_unrolled_cross_thread_reduction(c)


def check_gpu_bindings(c: CheckerState) -> None:
    for block in c.nest.block_names():
        if block in c.unknown_blocks or block in c.failed_binds:
            continue
        loops = c.nest.loops(block)
        if loops and not any(loop.thread for loop in loops):
            span = c.block_spans.get(block) or c.created_by.get(block)
            if c.partial:  # the result is not built here: something else binds the block
                c.diagnostics.append(
                    warning(
                        f"block {block} is not bound to GPU threads yet: fine for a result "
                        "another pass finishes, but a build needs every block bound",
                        span,
                        "compile, run, tune and build-model refuse it until it is",
                    )
                )
            else:
                c.error(
                    f"block {block} is not bound to GPU threads",
                    span,
                    "bind its outer loops to blockIdx.x and inner ones to threadIdx.x",
                    one_of([loop.name for loop in loops], f"axes of block {block}"),
                )
            c.unbound[block] = c.diagnostics[-1]
            continue
        bound = [i for i, loop in enumerate(loops) if loop.thread]
        if not bound:
            continue
        check_cross_thread_reduction(c, block, loops)
        outside = [loop for loop in loops[: bound[0]] if loop.annotation]
        if outside:
            c.error(
                f"block {block}: `{outside[0].name}` is {outside[0].annotation} outside the "
                "kernel (above its bound loops), which TVM cannot build",
                c.created_by.get(block) or c.block_spans.get(block),
                "unroll or vectorize loops inside the thread loops",
            )
            continue
        # Above the first bound loop is outside the kernel: TVM runs such a loop on the host
        # and launches the kernel once per iteration. (Serial loops between blockIdx and
        # threadIdx loops are fine: each thread runs them, as in a cooperative fetch.)
        serial = [
            loop.name
            for loop in loops[: bound[0]]
            if not loop.thread and loop.kind is LoopKind.SPATIAL
        ]
        if serial:
            c.diagnostics.append(
                warning(
                    f"block {block}: {', '.join(f'`{n}`' for n in serial)} above the "
                    f"thread loops {'is' if len(serial) == 1 else 'are'} not bound, so the "
                    "host runs it and launches the kernel once per iteration",
                    c.created_by.get(block) or c.block_spans.get(block),
                    "bind it to blockIdx.* (or fuse it into a bound loop)",
                )
            )


def check_cross_thread_reduction(c: CheckerState, block: str, loops: list[Loop]) -> None:
    """TVM reduces across threads only over the innermost loops of a block."""
    reducing = [
        i
        for i, loop in enumerate(loops)
        if loop.thread and loop.kind in (LoopKind.REDUCE, LoopKind.MIXED)
    ]
    if not reducing:
        return
    inside = [loop.name for loop in loops[reducing[0] :] if loop.kind is not LoopKind.REDUCE]
    if not c.require(
        not inside,
        f"block {block} reduces across threads over `{loops[reducing[0]].name}`, so its "
        f"reduction loops must be innermost; {', '.join(f'`{n}`' for n in inside)} "
        f"{'is' if len(inside) == 1 else 'are'} inside",
        c.block_spans.get(block) or c.created_by.get(block),
        "reorder the reduction loops after the others",
    ):
        return
    if any(not loop.thread for loop in loops if loop.kind is LoopKind.REDUCE):
        return  # each thread reduces over the serial loops first: TVM lowers that as written
    across = loops[reducing[0]]
    sref = c.nest.sch.get_sref(across.rv)
    beside = [
        other
        for other in c.nest.block_names()
        if other != block
        and any(c.nest.sch.get_sref(loop.rv).same_as(sref) for loop in c.nest.loops(other))
    ]
    # Found by stepwise decoding: LowerCrossThreadReduction rebuilds the loop inside itself
    # (the same variable bound twice) and TVM 0.27 segfaults in CompactBufferAllocation.
    c.require(
        not beside,
        f"block {block} reduces across threads over `{across.name}` with no reduction loop left "
        f"for each thread, and block {beside[0] if beside else ''} runs under `{across.name}` "
        "too: TVM lowers that to a kernel that binds the loop twice and crashes building it",
        (beside and (c.moved_by.get(beside[0]) or c.created_by.get(beside[0]))) or None,
        f"split `{across.name}` and bind only its inner part, or move block "
        f"{beside[0] if beside else ''} outside `{across.name}`",
    )


def check_kernel_buffers(c: CheckerState) -> None:
    """A CUDA kernel cannot allocate global memory, and shared or local memory does not
    outlive its kernel: both build (or run) wrong, so each buffer must live where it is used."""
    blocks = [b for b in c.nest.block_names() if b not in c.unknown_blocks]
    if c.partial:  # an unbound block has no kernel yet: the pass that binds it decides
        blocks = [b for b in blocks if b not in c.unbound]
    root = c.nest.sch.get(c.nest.root())
    allocated = {buffer.name for buffer in root.alloc_buffers}  # not function parameters
    for writer in blocks:
        buffer = c.nest.write_buffer(writer)
        if buffer is None or buffer.name not in allocated:
            continue
        scope, kernel = str(buffer.scope()), c.kernel_of(writer)
        readers = [b for b in blocks if b != writer and buffer.name in c.nest.reads(b)]
        if scope == "global":
            inside = [r for r in readers if c.kernel_of(r) == kernel]
            if inside:
                c.error(
                    f"`{buffer.name}` is global memory, but block {writer} writes it inside "
                    f"the kernel of block {inside[0]}: a CUDA kernel cannot allocate it",
                    c.moved_by.get(writer) or c.moved_by.get(inside[0]),
                    f"inline it (`compute_inline {writer}`), or compute it in its own kernel",
                )
            continue
        if scope == "warp":
            check_warp_buffer(c, buffer.name, writer, readers)
            continue
        # Seen failing for a guarded block computing into shared memory (cache_write), not
        # for a guarded cache_read copy.
        guarded = c.nest.is_guarded(writer) and writer not in c.read_caches
        if scope.startswith("shared") and guarded:
            c.error(
                f"block {writer} writes shared memory `{buffer.name}` under the `if` of a "
                "non-divisible split; TVM cannot put the __syncthreads it needs in an `if`",
                c.block_spans.get(writer) or c.created_by.get(writer),
                "split by factors that divide the extents, or cache in `local`",
            )
        apart = [r for r in readers if c.kernel_of(r) != kernel]
        if apart:
            c.error(
                f"`{buffer.name}` is {scope} memory written by block {writer} in one kernel "
                f"and read by block {apart[0]} in another; it does not outlive its kernel",
                c.created_by.get(writer) or c.created_by.get(apart[0]),
                "compute both in one kernel: give the cache an `at` loop below the "
                "kernel's blockIdx loops",
            )


def check_accumulation_on_one_thread(c: CheckerState) -> None:
    """A block that reads the result of a cross-thread reduction without binding that
    reduction's threadIdx axes runs on thread 0 only: TVM puts it under `if threadIdx.x == 0`
    (LowerCrossThreadReduction's broadcast). A reduction block accumulating into shared memory
    there needs a __syncthreads between its init and its update, which TVM cannot put inside
    an `if`: the build fails. Found by fuzzing (tests/test_fuzz.py)."""
    reduced: dict[str, tuple[str, set[str], object]] = {}  # buffer → (block, threads, scope)
    for block in c.nest.block_names():
        buffer = c.nest.write_buffer(block)
        if block in c.unknown_blocks or buffer is None:
            continue
        loops = c.nest.loops(block)
        scope = broadcast_scope(c, block, loops)
        across = {
            loop.thread
            for loop in loops
            if loop.thread
            and loop.thread.startswith("threadIdx")
            and loop.kind in (LoopKind.REDUCE, LoopKind.MIXED)
        }
        if across:
            reduced[buffer.name] = (block, across, scope)
            continue
        accumulates = (
            str(buffer.scope()).startswith("shared")
            and c.nest.is_reduction_block(block)
            and c.nest.sch.get(c.nest.block(block)).init is not None
        )
        if not accumulates:
            continue
        bound = {loop.thread for loop in loops if loop.thread}
        for read in dict.fromkeys(c.nest.reads(block)):
            producer, threads, producer_scope = reduced.get(read, (None, set(), None))
            missing = sorted(threads - bound)
            if producer is None or producer_scope != scope or not missing:
                continue
            c.error(
                f"block {block} accumulates into shared memory `{buffer.name}` on one thread "
                f"(under `if {missing[0]} == 0`), where TVM cannot put the __syncthreads it "
                "needs",
                c.buffer_made_by.get(buffer.name) or c.block_spans.get(block),
                f"it reads `{read}`, which block {producer} reduces across {missing[0]}, and "
                f"binds no loop to {missing[0]}, so TVM runs it on thread 0 only",
                f"accumulate in registers (`cache_write {block} local`), split off its init "
                f"(`decompose_reduction {block} at …`), or bind one of its loops to "
                f"{missing[0]}",
            )
            break


def check_unrolled_cross_thread_reduction(c: CheckerState) -> None:
    """TVM cannot build a cross-thread reduction that is copied (LowerThreadAllreduce fails on
    `load_remap_`): no loop around one may be unrolled, by `unroll` or by a `pragma
    auto_unroll_max_step` with explicit unrolling that reaches it, or be bound to fewer than
    16 virtual threads (which TVM interleaves by copying the body). Found by fuzzing."""
    for block in c.nest.block_names():
        if block in c.unknown_blocks:
            continue
        loops = c.nest.loops(block)
        across = next((loop for loop in loops if _reduces_across_threads(loop)), None)
        if across is None:
            continue
        outside = loops[: loops.index(across)]
        for index, loop in enumerate(outside):
            copied = copying_loop(c, loop, outside[index:], loops)
            if copied is None:
                continue
            if copied is loop and loop.thread:
                where = f"virtual thread loop `{loop.name}` ({loop.thread})"
                fix = f"bind at least {c.target.copied_vthreads} virtual threads, or none around it"
            elif copied is loop:
                where, fix = f"unrolled loop `{loop.name}`", "unroll loops inside it only"
            else:
                where = f"loop `{copied.name}`, which the pragma on `{loop.name}` unrolls"
                fix = "give the pragma unroll_explicit=0, or a smaller auto_unroll_max_step"
            made_by = (
                c.bind_span(loop.thread, loop.extent)
                if copied is loop and loop.thread
                else c.unrolled_by.get(c.nest.sch.get_sref(loop.rv))
            )
            c.error(
                f"block {block} reduces across {across.thread} inside {where}: TVM cannot "
                "build a copied cross-thread reduction",
                made_by or c.block_spans.get(block),
                fix,
            )
            break


def copying_loop(c: CheckerState, loop: Loop, below: list[Loop], loops: list[Loop]) -> Loop | None:
    """The loop of `below` (starting at `loop`) whose body TVM copies because of `loop`: an
    unrolled one, one bound to few virtual threads, or one that `loop`'s auto-unroll pragma
    unrolls (TVM auto-unrolls a loop whose iterations times the serial steps inside it fit in
    auto_unroll_max_step)."""
    copies = (loop.extent or 2) > 1 and (
        loop.annotation == "unrolled"
        or (
            bool(loop.thread and loop.thread.startswith("vthread"))
            and (loop.extent or 0) < c.target.copied_vthreads
        )
    )
    if copies:
        return loop
    annotations = c.nest.sch.get(loop.rv).annotations
    max_step = int(annotations.get("pragma_auto_unroll_max_step", 0))
    if not max_step or not int(annotations.get("pragma_unroll_explicit", 1)):
        return None
    for inner in below:
        if inner.thread or (inner.extent or 1) < 2:
            continue
        position = loops.index(inner)
        steps = math.prod(x.extent or 1 for x in loops[position:] if not x.thread)
        if steps <= max_step:
            return inner
    return None


def broadcast_scope(c: CheckerState, block: str, loops: list[Loop]) -> object:
    """What TVM's cross-thread broadcast is keyed by: the innermost blockIdx loop around
    `block`, or else its kernel."""
    grid = [loop for loop in loops if loop.thread and loop.thread.startswith("blockIdx")]
    return c.nest.sch.get_sref(grid[-1].rv) if grid else c.kernel_of(block)


def check_warp_buffer(c: CheckerState, buffer: str, writer: str, readers: list[str]) -> None:
    """Warp memory is spread over the registers of one warp: TVM builds it only when the
    block writing it spreads its stores over threadIdx.x (one of its own loops bound to
    it), of an extent that divides the warp size."""
    warp = c.target.warp_size or 32
    lanes = [
        loop
        for loop in c.nest.loops(writer)
        if loop.thread == "threadIdx.x" and loop.kind is LoopKind.SPATIAL
    ]
    if lanes and lanes[0].extent is not None and warp % lanes[0].extent == 0:
        return
    if binds_lanes_itself(c.nest, writer):  # a tensorized warp-level intrinsic (ldmatrix, mma)
        return
    c.error(
        f"`{buffer}` is warp memory, but block {writer} does not spread its stores over "
        f"threadIdx.x: bind one of its loops to threadIdx.x, with an extent that divides the "
        f"warp size {warp}",
        c.created_by.get(writer),
        f"e.g. `block {writer}:` then `bind ax1 threadIdx.x` on a loop of extent 32",
    )


def check_shared_memory(c: CheckerState) -> None:
    limit = c.target.max_shared_memory_per_block
    if not limit:
        return
    kernels: dict[object, list[tuple[int, str]]] = {}
    for block in c.nest.block_names():
        buffer = c.nest.write_buffer(block)
        if buffer is None or not str(buffer.scope()).startswith("shared"):
            continue
        used = kernels.setdefault(c.kernel_of(block), [])
        elements = 1
        for loop in c.nest.loops(block):
            # A reduction loop of a block computing into shared memory (cache_write) does
            # not index the buffer.
            if loop.kind in (LoopKind.REDUCE, LoopKind.OUTER):
                continue
            if len(c.nest.sch.get_child_blocks(loop.rv)) == 1 and loop.extent:
                elements *= loop.extent
        used.append((elements * dtype_bytes(str(buffer.dtype)), block))
    for used in kernels.values():  # the limit is per thread block: per kernel
        shared_memory_fits(c, used, limit)


def shared_memory_fits(c: CheckerState, used: list[tuple[int, str]], limit: int) -> None:
    total = sum(size for size, _ in used)
    if total > limit:
        largest = max(used)[1]
        detail = ", ".join(f"{b} {s} B" for s, b in sorted(used, reverse=True))
        c.error(
            f"shared memory use {total} bytes exceeds the target's {limit} per block",
            c.created_by.get(largest),
            f"by block: {detail}",
            "cache smaller tiles (compute the cache at an inner loop)",
        )


def _reduces_across_threads(loop: Loop) -> bool:
    """A reduction loop bound to threadIdx: TVM lowers it to a cross-thread reduction."""
    return bool(loop.thread and loop.thread.startswith("threadIdx")) and loop.kind in (
        LoopKind.REDUCE,
        LoopKind.MIXED,
    )
