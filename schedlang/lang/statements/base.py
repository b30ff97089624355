"""The lowering and guard helpers several families share (what a decompile handler reads a trace
with is in decompiling.py, what steps are written from in decoding.py).

Guards and lowerings take the checker or the live nest as an argument and call only what they are
given (the checker as the `Checker` Protocol of facade.py): this package imports nothing above
schedlang.lang.nest.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from schedlang.core.diagnostics import Span
from schedlang.lang import nodes
from schedlang.lang.loop import Consumed, Loop, LoopKind
from schedlang.lang.statements.facade import MadeBuffer

if TYPE_CHECKING:
    from tvm import s_tir

    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker


# --- lowering ------------------------------------------------------------------------------------


def loop(nest: Nest, block: str, name: nodes.Name) -> s_tir.LoopRV:
    return checked_loop(nest, block, name.text).rv


def checked_loop(nest: Nest, block: str, name: str) -> Loop:
    """The loop `name` of `block`, which the checker (or the trace) has made sure exists."""
    found = nest.find(block, name)
    assert found is not None, f"checker let unknown axis {name} through"
    return found


def int_value(factor: nodes.Factor) -> int:
    assert isinstance(factor, nodes.IntFactor), f"unbound factor {factor!r} reached lowering"
    return factor.value


def name_all(
    nest: Nest,
    block: str,
    axis: nodes.Name,
    new_loops: Sequence[s_tir.LoopRV],
    new_names: Sequence[str],
    how: str,
    stmt: nodes.Stmt,
) -> None:
    for new_loop, name in zip(new_loops, new_names, strict=True):
        nest.set_name(new_loop, name)
    nest.consumed[(block, axis.text)] = Consumed(how, stmt.span.line, tuple(new_names), stmt.span)


# --- guards --------------------------------------------------------------------------------------


# Iterations a guarded loop may run whatever its extent (a split past the extent: TVM runs the
# empty ones behind an `if`). TVM's own tests split 128 iterations by 1000 x 2 x 3 (6,000); a
# factor of 2^31 - 1 did not build in 120 s, and its indices would pass int32.
GUARDED_ITERATIONS = 1 << 20


def padded_extent_limit(extent: int) -> int:
    """How many iterations a guarded loop of `extent` may run (a split past the extent): twice
    the extent, or `GUARDED_ITERATIONS` for a shorter loop; a warning says each one past it."""
    return max(2 * extent, GUARDED_ITERATIONS)


def scope_ok(c: Checker, scope: nodes.Name) -> bool:
    shared = scope.text.startswith("shared") or scope.text == "warp"
    return c.require(
        not shared or c.target.is_gpu,
        f"`{scope.text}` memory exists only on GPUs, not on {c.target.kind}",
        scope.span,
        "on a CPU use `global` (a packed copy) or `local`",
    )


def accesses(
    c: Checker,
    block: str,
    buffer: nodes.Name,
    message: str,
    what: str,
    *,
    reads: bool = True,
    writes: bool = True,
) -> bool:
    """`block` reads (if `reads`) or writes (if `writes`) `buffer`; else an error with the closest
    of those buffers and all of them, each once, reads first."""
    used = [*(c.nest.reads(block) if reads else ()), *(c.nest.writes(block) if writes else ())]
    return c.require_known(buffer, list(dict.fromkeys(used)), message, what)


def not_decomposed(c: Checker, stmt: nodes.Stmt, block: str) -> None:
    """TVM cannot vectorize or parallelize the loops of a reduction after its init was split
    off ("does not have compact dataflow"): say so in words."""
    line = c.decomposed.get(block)
    c.require(
        line is None,
        f"`{stmt.keyword}` must come before `decompose_reduction` (line {line})",
        stmt.span,
        "put decompose_reduction last in the block's section",
    )


def compiler(c: Checker) -> str:
    return "the CUDA compiler" if c.target.is_gpu else "LLVM"


def at_loop(c: Checker, name: nodes.Name, block: str) -> Loop:
    """A loop another block is computed at. Not a vectorized one, nor one inside a vectorized
    loop (after a reorder moved it outward): TVM would then vectorize the buffer between the
    two blocks as one scalar and compute wrong values."""
    loop = c.axis(name, block)
    loops = c.nest.loops(block)
    outside = next(
        (x for x in loops[: loops.index(loop) + 1] if x.annotation == "vectorized"), None
    )
    if outside is not None:
        where = (
            f"vectorized loop `{loop.name}`"
            if outside.name == loop.name
            else f"`{loop.name}`, which is inside vectorized loop `{outside.name}`"
        )
        c.error(
            f"cannot compute another block inside {where}",
            name.span,
            "compute it at a loop outside the vectorized one",
        )
    hazard = _unsound_to_compute_at(c, block, loop)
    if hazard is not None:
        why, fix = hazard
        c.error(f"cannot compute another block at `{loop.name}`: {why}", name.span, fix)
    return loop


def _unsound_to_compute_at(c: Checker, block: str, loop: Loop) -> tuple[str, str] | None:
    """Why TVM would compute wrong values for a block computed at `loop`, and what to do
    instead; None when nothing is known against it."""
    if (strided := c.nest.strided_across(block, loop)) is not None:
        outer, inner = strided
        return (
            f"`{outer.name}` steps by less than `{inner.name}` inside it, so an iteration of "
            f"`{loop.name}` covers a strided set of points, which TVM takes for the box around "
            "it and computes wrong values (TVM 0.27)",
            "keep each split's outer loop outside its inner one, or compute it at a loop "
            f"outside `{outer.name}`",
        )
    if (overlapping := c.nest.overlapping_at(block, loop)) is not None:
        first, second = overlapping
        return (
            f"the steps of `{first.name}` and `{second.name}` overlap, and only block "
            f"{block}'s `if` keeps them from computing a point twice; TVM leaves the `if` out "
            "when it sizes what the other block computes there, which then copies garbage over "
            "finished points (TVM 0.27)",
            "split with factors whose product does not pass the extent (a factor larger than "
            "the extent leaves an outer loop of 1), or compute it at a loop outside them",
        )
    return None


def outside_reduction(
    c: Checker, stmt: nodes.Stmt, moved: str, producer: str, at: nodes.Name
) -> bool:
    """A consumer moved into a loop over which its producer still reduces runs once per
    iteration of it, on partial results. An accumulating consumer (the final block of an
    rfactor, a second reduction) adds them up again; a copy writes them back, and a block
    later computed at the copy's loops gets them (decompose_reduction then computes wrong
    values). TVM checks none of it (found by the differential fuzzer, TVM 0.27)."""
    loop = c.nest.find(producer, at.text)
    if loop is None or loop.kind not in (LoopKind.REDUCE, LoopKind.MIXED):
        return True
    return c.require(
        loop.extent == 1,
        f"`{stmt.keyword}` would put block {moved} inside `{loop.name}`, over which block "
        f"{producer} is still reducing: it would run {loop.extent or 'many'} times, on "
        "partial results",
        at.span,
        f"move block {moved} to a loop of block {producer} outside its reduction loops",
    )


def tvm_name(nest: Nest, block: str) -> str:
    """The name TVM gives schedlang's block `block` (they differ once `as` named it)."""
    return nest.block_aliases.get(block, block)


def new_block_free(
    c: Checker, stmt: nodes.Stmt, names: Iterable[str], tvm_name: str | None
) -> None:
    """The blocks the statement makes are named apart from the others: `names` by schedlang (its
    syntax's `creates_blocks`), `tvm_name` by TVM (None: not known, nothing to compare)."""
    for name in names:
        if not c.require(
            not c.nest.has_block(name),
            f"a block named `{name}` already exists",
            stmt.span,
            "name the new block with `as NAME`",
        ):
            return
    # TVM names the new block itself (`as` only adds a schedlang name) and cannot tell two
    # blocks of one name apart afterwards.
    root = c.nest.root()
    existing = {c.nest.sch.get(rv).name_hint for rv in c.nest.sch.get_child_blocks(root)}
    c.require(
        tvm_name not in existing,
        f"TVM would name the new block `{tvm_name}`, like an existing block",
        stmt.span,
        "TVM names a cache block after its buffer and scope: cache a buffer once per scope",
    )


def made_buffer_fits(
    c: Checker, name: str, elements: int, dtype: object, span: Span, *notes: str
) -> bool:
    """A buffer a statement makes: int32 indices reach it, and it fits in memory."""
    most_elements, most_bytes = c.target.int32_elements, c.target.max_made_buffer_bytes
    size = elements * dtype_bytes(str(dtype))
    if not c.require(
        elements <= most_elements,
        f"`{name}` would hold {elements} elements, more than the {most_elements} that "
        "TVM's int32 indices reach",
        span,
        *notes,
    ):
        return False
    return c.require(
        size <= most_bytes,
        f"`{name}` would take {format_bytes(size)}, more than the "
        f"{format_bytes(most_bytes)} one statement may add",
        span,
        *notes,
    )


def made_buffer_fits_later(
    c: Checker, name: str, elements: int, dtype: object, span: Span, *notes: str
) -> None:
    """`made_buffer_fits`, once every statement is applied (schedlang.checker.kernel_rules
    sizes the buffer as TVM allocates it then)."""
    c.made_buffers[name] = MadeBuffer(name, elements, str(dtype), span, notes)


def format_bytes(size: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


def dtype_bytes(dtype: str) -> int:
    import tvm  # only a checker, which has imported it already, asks

    bits: int = tvm.DataType(dtype).bits * tvm.DataType(dtype).lanes
    return max(1, bits // 8)
