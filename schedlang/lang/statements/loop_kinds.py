"""Loop kinds: `bind`, `vectorize`, `unroll`, `parallel`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schedlang.lang import nodes
from schedlang.lang.loop import Loop, LoopKind
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import Axis, Thread
from schedlang.lang.statements.base import compiler, loop, not_decomposed
from schedlang.lang.statements.decoding import StepView
from schedlang.lang.statements.decompiling import Decompile, TraceReader
from schedlang.lang.statements.facets import Syntax

if TYPE_CHECKING:
    from schedlang.core.diagnostics import Span
    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker

# The threads stepwise decoding offers to bind a loop to.
STEP_THREADS = ("blockIdx.x", "blockIdx.y", "threadIdx.x", "threadIdx.y", "vthread.x")


def _decompile_loop_kind(
    statement: Callable[[nodes.Name], nodes.Stmt], annotation: str
) -> Decompile:
    """A loop made parallel, vectorized or unrolled, unless schedlang's already is."""

    def decompile(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
        block, axis = reader.axis(inputs[0])
        found = reader.nest.find(block, axis)
        if found is None or found.annotation != annotation:
            reader.emit(block, statement(nodes.Name(axis)))

    return decompile


def _inside(loops: list[Loop], loop: Loop) -> str:
    inner = [f"`{other.name}`" for other in loops[loops.index(loop) + 1 :]]
    return ", ".join(inner)


def keeps_binding(c: Checker, loop: Loop, stmt: nodes.Stmt) -> None:
    """Unroll and vectorize replace a loop's thread binding. Legal (TVM runs the loop in each
    thread instead), but rarely meant; a kernel left with no bound loop is an error of its own
    (gpu_rules)."""
    if loop.thread is not None:
        c.warn_or_error(
            f"`{loop.name}` is bound to {loop.thread}; `{stmt.keyword}` replaces the binding, "
            "and each thread runs the whole loop",
            stmt.span,
            f"to {stmt.keyword} within a thread, split `{loop.name}` and {stmt.keyword} the "
            "inner loop",
        )


@dataclass(frozen=True)
class Bind(nodes.Stmt, keyword="bind"):
    axis: nodes.Name
    thread: nodes.Name


@dataclass(frozen=True)
class LoopStmt(nodes.Stmt):
    """A statement that changes how one loop of the current block runs."""

    axis: nodes.Name


class Vectorize(LoopStmt, keyword="vectorize"): ...


class Unroll(LoopStmt, keyword="unroll"): ...


class Parallel(LoopStmt, keyword="parallel"): ...


# fmt: off
BIND = Syntax("bind", Bind, "loop_kinds", (Axis(), Thread()),
    example="e.g. `bind i.o blockIdx.x`",
    description="run a loop across GPU threads or thread blocks.",
    summary=("`bind a T`", '`sch.bind(loop, "T")`', "—"))

# The loop kinds differ only in their keyword (the primitive's name), AST class and description.
VECTORIZE, UNROLL, PARALLEL = (
    Syntax(keyword, node, "loop_kinds", (Axis(),), example=f"e.g. `{keyword} {example}`",
        description=description, summary=(f"`{keyword} a`", f"`sch.{keyword}(loop)`", "—"))
    for keyword, node, example, description in (
        ("vectorize", Vectorize, "j.i",
            "run the innermost loop as SIMD lanes (a spatial loop)."),
        ("unroll", Unroll, "k.i", "unroll a loop."),
        ("parallel", Parallel, "i.o",
            "run a loop's iterations on CPU cores (a spatial loop, outermost)."),
    )
)
# fmt: on

STATEMENTS = (BIND, VECTORIZE, UNROLL, PARALLEL)


# --- bind ----------------------------------------------------------------------------------------


@facets.guard(BIND)
def guard_bind(c: Checker, stmt: Bind, block: str) -> None:
    thread = stmt.thread.text
    target = c.target
    if not c.require(
        target.is_gpu,
        f"`bind` needs a GPU target, not {target.kind}",
        stmt.span,
        "on a CPU, run loops on several cores with `parallel`",
    ):
        return
    not_decomposed(c, stmt, block)
    loop = c.axis(stmt.axis, block)
    if loop.thread is not None:
        # Legal: TVM replaces the binding, as if the loop had only ever had the new one.
        c.warn_or_error(
            f"`{loop.name}` is already bound to {loop.thread}; this binding replaces it",
            stmt.axis.span,
            f"bind `{loop.name}` once",
        )
    if loop.kind in (LoopKind.REDUCE, LoopKind.MIXED) and not thread.startswith("threadIdx"):
        c.error(
            f"cannot bind reduction axis `{loop.name}` to {thread}",
            stmt.axis.span,
            "rfactor it first (`rfactor …`), or bind it to threadIdx.* for a "
            "cross-thread reduction",
        )
        return
    if loop.extent is not None and _thread_extent_fits(c, stmt, loop, loop.extent):
        _kernel_threads_fit(c, stmt, block, loop, loop.extent)


@facets.lower(BIND)
def _lower_bind(nest: Nest, block: str, stmt: Bind) -> None:
    nest.sch.bind(loop(nest, block, stmt.axis), stmt.thread.text)


def _thread_extent_fits(c: Checker, stmt: Bind, loop: Loop, extent: int) -> bool:
    """The extent bound to one thread axis, against the target's limit for that axis. False
    when the rest need not be checked."""
    thread, target = stmt.thread.text, c.target
    dim = "xyz".index(thread[-1])
    if thread.startswith("threadIdx") and target.max_thread_extent:
        limit = target.max_thread_extent[dim]
        if not c.require(
            extent <= limit,
            f"{thread} extent {extent} exceeds the target's limit of {limit}",
            stmt.span,
            f"split `{loop.name}` by {limit} or less, and bind the inner loop",
        ):
            return False
    if thread.startswith("vthread") and extent > target.max_vthread:
        c.warn(
            f"{extent} virtual threads on {thread}, more than the "
            f"{target.max_vthread} MetaSchedule's GPU checks allow",
            stmt.span,
            "TVM interleaves the code of fewer than 16 virtual threads and runs more as "
            f"a loop; split `{loop.name}` and bind at most {target.max_vthread}",
        )
    if thread.startswith("blockIdx") and target.max_grid_extent:
        limit = target.max_grid_extent[dim]
        c.require(
            extent <= limit,
            f"{thread} extent {extent} exceeds the grid limit of {limit}",
            stmt.span,
        )
    return True


def _kernel_threads_fit(c: Checker, stmt: Bind, block: str, loop: Loop, extent: int) -> None:
    """Every loop of a kernel bound to one thread axis has one extent, and the threads of a
    block multiply to at most the target's limit."""
    thread = stmt.thread.text
    extents = c.kernel_threads(block, loop)
    if thread in extents:
        other, line = extents[thread]
        # TVM builds it, launches one extent and guards neither loop: wrong values (the CUDA
        # source of the golden case copies 128 elements with 32 threads and no `if`).
        c.require(
            other == extent,
            f"{thread} is bound to extent {extent} here but to {other} at "
            f"line {line} in the same kernel",
            stmt.span,
            "every loop bound to one thread axis must have the same extent: TVM builds it "
            "with no guard, and computes wrong values",
        )
        return
    extents[thread] = (extent, stmt.span.line)
    threads = {t: e for t, (e, _) in extents.items() if t.startswith("threadIdx")}
    total = math.prod(threads.values())
    limit = c.target.max_threads_per_block or total
    if total > limit:
        shape = " x ".join(
            f"{e} ({t})" for t, e in sorted(threads.items()) if t.startswith("threadIdx")
        )
        c.error(
            f"{total} threads per block, more than the target's {limit}",
            stmt.span,
            f"threads: {shape}",
        )


@facets.record(BIND)
def _record_bind(c: Checker, stmt: Bind, block: str) -> None:
    loop = c.nest.find(block, stmt.axis.text)
    c.record_bind(stmt.thread.text, loop.extent if loop else None, stmt.span)


@facets.decompile(BIND, "Bind")
def decompile_bind(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    block, axis = reader.axis(inputs[0])
    found = reader.nest.find(block, axis)
    if found is None or found.thread != str(attrs[0]):
        reader.emit(block, Bind(nodes.Name(axis), nodes.Name(str(attrs[0]))))


@facets.untranslatable(BIND)
def _bind_untranslatable(attrs: list[Any]) -> tuple[str, ...] | None:
    if str(attrs[0]) not in nodes.THREAD_AXES:
        return (f"schedlang binds loops to {', '.join(nodes.THREAD_AXES)}, not `{attrs[0]}`",)
    return None


@facets.steps(BIND, over="free loop")
def _bind_steps(view: StepView, block: str, loop: Loop) -> list[str]:
    if not view.gpu:
        return []
    # A thread an outer loop of another block binds may be bound again inside (a cooperative
    # fetch under the consumer's thread loops, at the same extent): the check says when not.
    loops = view.loops(block)
    used = {other.thread for other in loops if other.thread and other.kind is not LoopKind.OUTER}
    return [
        f"bind {loop.name} {thread}"
        for thread in STEP_THREADS
        if thread not in used and view.thread_fits(thread, loop.extent or 0)
    ]


# --- vectorize -----------------------------------------------------------------------------------


@facets.guard(VECTORIZE)
def guard_vectorize(c: Checker, stmt: Vectorize, block: str) -> None:
    not_decomposed(c, stmt, block)
    loop = c.axis(stmt.axis, block)
    keeps_binding(c, loop, stmt)
    if not c.require(
        loop.kind is not LoopKind.REDUCE and loop.kind is not LoopKind.MIXED,
        f"cannot vectorize reduction axis `{loop.name}`",
        stmt.axis.span,
        "vectorize a spatial axis, or rfactor the reduction first",
    ):
        return
    if _vector_placed(c, stmt, block, loop):
        _lanes_fit(c, stmt, block, loop)


def _vector_placed(c: Checker, stmt: Vectorize, block: str, loop: Loop) -> bool:
    """Where a vectorized loop may be: innermost on a GPU, one per nest, around one block (and
    with a warning around spatial loops on a CPU). False when the rest need not be checked."""
    target = c.target
    loops = c.nest.loops(block)
    inner_loops = loops[loops.index(loop) + 1 :]
    # Both placement hints end by offering the innermost loop, if that one could be vectorized.
    or_innermost = (
        f", or vectorize `{loops[-1].name}`" if loops[-1].kind is LoopKind.SPATIAL else ""
    )
    if inner_loops and target.is_gpu:
        # Not verified on a GPU (nothing here runs CUDA): refused there, as before.
        c.error(
            f"vectorize needs the innermost loop on a GPU; `{loop.name}` has "
            f"{_inside(loops, loop)} inside it",
            stmt.axis.span,
            f"`reorder` to make `{loop.name}` innermost{or_innermost}",
        )
        return False
    # A vector of vectors: TVM ignores the inner one or fails to build ("VectorizeLoop before
    # LiftStorageAlloc" when the nest allocates; found by the differential fuzzer, TVM 0.27).
    vectorized = next((x for x in loops if x.annotation == "vectorized" and x != loop), None)
    if not c.require(
        vectorized is None,
        f"cannot vectorize `{loop.name}`: `{getattr(vectorized, 'name', '')}` in the same nest "
        "is vectorized already",
        stmt.axis.span,
        "TVM builds no vector of vectors (it fails to build some, TVM 0.27): vectorize one loop "
        "per nest",
    ):
        return False
    if any(x.kind is not LoopKind.REDUCE for x in inner_loops):
        # Legal on a CPU: TVM vectorizes the body of the inner loops and computes the same
        # values, but each vector access strides over the inner loops' elements. With only
        # reduction loops inside (the README's `j.i` around `k`), each step is one vector
        # multiply-add: the usual CPU matmul, and no warning.
        others = [f"`{x.name}`" for x in inner_loops if x.kind is not LoopKind.REDUCE]
        c.warn_or_error(
            f"vectorize of `{loop.name}`, which has {_inside(loops, loop)} inside it: each "
            "vector lane runs the inner loops, with strided accesses",
            stmt.axis.span,
            f"`reorder` to put `{loop.name}` inside {', '.join(others)}{or_innermost}",
        )
    # Another block under the loop shares a buffer with this one, which TVM would vectorize
    # as one scalar: the result is wrong.
    inside = [c.nest.sch.get(rv).name_hint for rv in c.nest.sch.get_child_blocks(loop.rv)]
    return c.require(
        len(inside) == 1,
        f"vectorize needs a loop holding one block; `{loop.name}` holds blocks "
        + ", ".join(inside),
        stmt.axis.span,
        f"split `{loop.name}`, vectorize the inner part and compute the other block at "
        "the outer part",
    )


def _lanes_fit(c: Checker, stmt: Vectorize, block: str, loop: Loop) -> None:
    """A vector's lanes: at least 2, and at most what the target's compiler builds."""
    target = c.target
    if loop.extent is None:
        c.error(f"cannot vectorize `{loop.name}`: its extent is not a constant", stmt.span)
        return
    # TVM fails on a 1-lane vector in some nests ("Check failed: lanes > 1", with a pragma on
    # the loop; found by the differential fuzzer, TVM 0.27), and it is never faster.
    if not c.require(
        loop.extent > 1,
        f"cannot vectorize `{loop.name}`: its extent is 1, and a vector needs at least 2 lanes",
        stmt.axis.span,
        "TVM may fail to build a 1-lane vector (a TVM bug, 0.27): vectorize a longer loop",
    ):
        return
    dtype = c.nest.write_dtype(block)
    lanes = target.vector_lanes(dtype)
    split_first = f"split it first: `split {loop.name} by {lanes}` and vectorize `{loop.name}.i`"
    if not target.is_gpu and not c.require(
        loop.extent <= target.cpu_max_lanes,
        f"vectorizing {loop.extent} lanes, more than the {target.cpu_max_lanes} LLVM builds in "
        "seconds",
        stmt.axis.span,
        split_first,
    ):
        return
    if not target.is_gpu and loop.extent > 4 * lanes:
        c.warn(
            f"vectorizing {loop.extent} lanes; the target's SIMD holds {lanes} x {dtype}",
            stmt.axis.span,
            split_first,
        )
    if target.is_gpu and loop.extent > target.gpu_max_lanes:
        c.error(
            f"CUDA has no vector type of {loop.extent} x {dtype}; TVM builds at most "
            f"{target.gpu_max_lanes} lanes",
            stmt.axis.span,
            split_first,
        )
    elif target.is_gpu and loop.extent > lanes:
        c.warn(
            f"vectorizing {loop.extent} lanes on a GPU; a thread loads at most "
            f"{lanes} x {dtype} at once",
            stmt.axis.span,
        )


@facets.record(VECTORIZE)
def _record_vectorize(c: Checker, stmt: Vectorize, block: str) -> None:
    loop = c.nest.find(block, stmt.axis.text)
    c.vectorized.append((loop.extent if loop else None, stmt.axis))


@facets.steps(VECTORIZE)
def _vectorize_steps(view: StepView, block: str, _: None) -> list[str]:
    """The innermost loop, when it is free and spatial."""
    loops, free = view.loops(block), view.free(block)
    if free and free[-1] is loops[-1] and free[-1].kind is LoopKind.SPATIAL:
        return [f"vectorize {free[-1].name}"]
    return []


# --- unroll --------------------------------------------------------------------------------------


@facets.guard(UNROLL)
def guard_unroll(c: Checker, stmt: Unroll, block: str) -> None:
    loop = c.axis(stmt.axis, block)
    keeps_binding(c, loop, stmt)
    if not unrolled_size_fits(c, loop, block, stmt.axis.span):
        return
    warn_extent = c.target.unroll_warn_extent
    if loop.extent is not None and loop.extent > warn_extent:
        c.warn(
            f"unrolling {loop.extent} iterations makes the code large",
            stmt.axis.span,
            f"split it first, or unroll at most {warn_extent}",
        )


def unrolled_size_fits(c: Checker, loop: Loop, block: str, span: Span | None) -> bool:
    """On a CPU, the copies of the body that unrolling `loop` lays out: every unrolled loop of
    the block, times the other loops inside the outermost one when they are short enough for
    LLVM to unroll them too. Past the target's unroll_max_copies the build takes minutes. Found
    by fuzzing (tests/test_fuzz.py). On a GPU TVM unrolls the loop in TIR before NVRTC or nvcc
    sees it: a 10^6-iteration unroll compiled for minutes at 1.6 GB, so the same limit holds."""
    target = c.target
    loops = c.nest.loops(block)
    unrolled = [x for x in loops if x.annotation == "unrolled" or x.name == loop.name]
    outermost = min(loops.index(x) for x in unrolled)
    # LLVM fully unrolls the innermost loops whose trip counts multiply to at most
    # llvm_full_unroll: a 64-iteration unroll around loops of 2, 4 and 13 took LLVM 154 s
    # (4 x 13 unrolled in each copy; found by the differential fuzzer). A short loop that the
    # block's `if` tests is unrolled past that product, since the `if` folds in every copy: a
    # 67-iteration unroll around guarded loops of 8 and 16 (k of 3 split by *, 8, 16) took
    # LLVM minutes, 16 iterations 7 s (found by the differential fuzzer).
    guarded = set(c.nest.guarded_loops(block))
    inside = 1
    for x in reversed(loops[outermost + 1 :]):
        if x in unrolled or x.annotation == "vectorized":
            continue
        short_guarded = x in guarded and (x.extent or 1) <= target.llvm_full_unroll
        if inside * (x.extent or 1) > target.llvm_full_unroll and not short_guarded:
            break
        inside *= x.extent or 1
    inside = inside if not target.is_gpu else 1
    copies = math.prod(x.extent or 1 for x in unrolled) * inside
    factors = [f"`{x.name}` {x.extent}" for x in unrolled]
    factors += [f"{inside} iterations inside"] if inside > 1 else []
    # An `if` that tests only loops outside the copies is the same in each, and LLVM builds such
    # copies several times as slowly (Target.unroll_guard_weight; the long run of issue 33).
    same_guard = bool(guarded) and not guarded & set(loops[outermost:]) and not target.is_gpu
    weight = target.unroll_guard_weight if same_guard else 1
    tested = ", ".join(f"`{x.name}`" for x in loops if x in guarded)
    notes = [f"copies: {' x '.join(factors)}"]
    if weight > 1:
        notes.append(
            f"each copy is under the same `if` (on {tested}, outside the copies), which LLVM "
            f"builds {weight} times as slowly: split that loop by a factor that divides its extent"
        )
    return c.require(
        copies * weight <= target.unroll_max_copies,
        f"unrolling `{loop.name}` makes {copies} copies of the loop body, "
        + (f"weighing {copies * weight}, " if weight > 1 else "")
        + f"more than the {target.unroll_max_copies} {compiler(c)} builds in seconds",
        span,
        *notes,
        f"split `{loop.name}` and unroll its inner part",
    )


@facets.provenance(UNROLL)
def record_unrolled(c: Checker, stmt: Any, block: str) -> None:
    """The statement that unrolls a loop (`stmt`, an `unroll` or a `pragma`): its `unroll`, else
    the first pragma on it."""
    loop = c.nest.find(block, stmt.axis.text)
    if loop is not None:
        sref = c.nest.sch.get_sref(loop.rv)
        if isinstance(stmt, Unroll) or sref not in c.unrolled_by:
            c.unrolled_by[sref] = stmt.span


@facets.steps(UNROLL, over="free loop")
def _unroll_steps(view: StepView, block: str, loop: Loop) -> list[str]:
    # Extent 1 too: the templates unroll a loop a knob may leave with one iteration.
    return [f"unroll {loop.name}"] if 1 <= (loop.extent or 0) <= 64 else []


# --- parallel ------------------------------------------------------------------------------------


@facets.guard(PARALLEL)
def guard_parallel(c: Checker, stmt: Parallel, block: str) -> None:
    not_decomposed(c, stmt, block)
    if not c.require(
        not c.target.is_gpu,
        "`parallel` is for CPU targets",
        stmt.span,
        "on a GPU, bind the loop to blockIdx.x",
    ):
        return
    loop = c.axis(stmt.axis, block)
    c.require(
        loop.kind not in (LoopKind.REDUCE, LoopKind.MIXED),
        f"cannot parallelize reduction axis `{loop.name}`",
        stmt.axis.span,
        "threads would race on the accumulator; parallelize a spatial axis, or "
        "rfactor the reduction first",
    )
    loops = c.nest.loops(block)
    position = loops.index(loop)
    outer = [o.name for o in loops[:position] if o.annotation == "parallel"]
    inner = [i.name for i in loops[position + 1 :] if i.annotation == "parallel"]
    # ... nor one of another block under it (a cache computed at it; found by the differential
    # fuzzer: "Nested parallel loop is not supported by threadpool").
    sref = c.nest.sch.get_sref(loop.rv)
    for child in c.nest.sch.get_child_blocks(loop.rv):
        theirs = c.nest.loops(c.nest.sch.get(child).name_hint)
        at = next((k for k, x in enumerate(theirs) if c.nest.sch.get_sref(x.rv) == sref), None)
        if at is not None:
            inner += [i.name for i in theirs[at + 1 :] if i.annotation == "parallel"]
    if outer or inner:
        c.error(
            f"`{loop.name}` is inside parallel loop `{outer[0]}`"
            if outer
            else f"`{loop.name}` holds parallel loop `{inner[0]}`",
            stmt.axis.span,
            "TVM's thread pool cannot nest parallel loops: fuse them and parallelize once",
        )


@facets.lower(VECTORIZE)
@facets.lower(UNROLL)
@facets.lower(PARALLEL)
def _lower_loop_kind(nest: Nest, block: str, stmt: Vectorize | Unroll | Parallel) -> None:
    primitive = getattr(nest.sch, stmt.keyword)  # sch.vectorize, sch.unroll, sch.parallel
    primitive(loop(nest, block, stmt.axis))


@facets.steps(PARALLEL)
def _parallel_steps(view: StepView, block: str, _: None) -> list[str]:
    """On a CPU, the outermost loop, when it is free and spatial (or outer: above several
    blocks, as a fused tile loop over a cache block is); or the one inside it, where the
    outermost is a free spatial loop left serial (`matmul_panels`: parallel over B's column
    panels inside each row block)."""
    loops = view.loops(block)
    if view.gpu or not loops or loops[0] not in view.free(block):
        return []
    kinds = (LoopKind.SPATIAL, LoopKind.OUTER)
    steps = [f"parallel {loops[0].name}"] if loops[0].kind in kinds else []
    if loops[0].kind == LoopKind.SPATIAL and len(loops) > 1 and loops[1] in view.free(block):
        steps += [f"parallel {loops[1].name}"] if loops[1].kind == LoopKind.SPATIAL else []
    return steps


facets.decompile(VECTORIZE, "Vectorize")(_decompile_loop_kind(Vectorize, "vectorized"))
facets.decompile(UNROLL, "Unroll")(_decompile_loop_kind(Unroll, "unrolled"))
facets.decompile(PARALLEL, "Parallel")(_decompile_loop_kind(Parallel, "parallel"))
