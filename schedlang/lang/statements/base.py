"""The helpers the facets of statements share (schedlang.lang.statements.facets): what a
decompile handler reads a trace with (`TraceReader`), what steps are written from (`StepView`,
`StepPattern`), and the lowering and guard helpers of several families.

Guards and lowerings take the checker or the live nest as an argument and call only what they are
given (the checker as the `Checker` Protocol of facade.py): this package imports nothing above
schedlang.lang.nest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from schedlang.core.diagnostics import Span
from schedlang.lang import nodes
from schedlang.lang.loop import Consumed, Loop, LoopKind

if TYPE_CHECKING:
    from tvm import s_tir

    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker

# --- decompiling ---------------------------------------------------------------------------------


class Untranslatable(Exception):
    """A trace instruction schedlang cannot express: the message, then notes."""

    def __init__(self, message: str, *notes: str):
        super().__init__(message)
        self.message = message
        self.notes = notes


class TraceReader(Protocol):
    """What a statement's `decompile(reader, inputs, attrs)` reads its TVM trace instruction with
    (schedlang.interop.decompiler). `reference` is the schedule TVM replays the trace on, `nest`
    schedlang's, equal to it after every instruction; the names are schedlang's."""

    nest: Nest
    reference: s_tir.Schedule

    def block_name(self, block_rv: Any) -> str:
        """schedlang's name for a block of the reference."""

    def axis(
        self, loop_rv: Any, exclude: str | None = None, prefer: str | None = None
    ) -> tuple[str, str]:
        """(a block under the loop, the loop's schedlang name in it)."""

    def axes(self, loop_rvs: list) -> tuple[str, list[str]]:
        """A block under all the loops, and their names in it."""

    def value(self, value: Any) -> int | None:
        """An integer input: a constant, or a sampled value (its decision)."""

    def is_loop(self, rv: Any) -> bool:
        """Whether an input is a loop (else a block)."""

    def location(self, block: str) -> int | None:
        """The compute location sampled for `block` (-2: inline, -1: root), if any."""

    def other_section(self, leaving: str) -> str:
        """A section for a statement that makes block `leaving` disappear."""

    def emit(self, block: str, stmt: nodes.Stmt) -> None:
        """Apply `stmt` to the nest and write it, in block `block`'s section."""

    def restate(self, stmt: nodes.Stmt) -> None:
        """Write the statement just emitted as `stmt` instead (it does the same)."""

    def defer(self) -> None:
        """Compare the two schedules only after the next instruction, which completes this one."""


def join_items(first: Any, second: Any) -> Any:
    """`first` with the items (key = value) of `second` after its own, or None when the two
    set a key in common."""
    if {item.key.text for item in first.items} & {item.key.text for item in second.items}:
        return None
    return replace(first, items=first.items + second.items)


def owner_and_loop(reader: TraceReader, inputs: list) -> tuple[str, str]:
    """The block an instruction changes (its first input) and the name of the loop of it that
    the instruction names (its second input)."""
    owner = reader.block_name(inputs[0])
    _, axis = reader.axis(inputs[1], prefer=owner)
    if axis not in [loop.name for loop in reader.nest.loops(owner)]:
        raise Untranslatable(f"the loop is not a loop of block {owner}")
    return owner, axis


# --- stepwise decoding ---------------------------------------------------------------------------


class StepView(Protocol):
    """What a statement's steps are written from (schedlang.llm.stepwise): the live nest after
    the prefix the model wrote, and the decoder's limits."""

    gpu: bool
    blocks: list[str]
    pending: list[str]  # GPU blocks not bound to threads yet
    limits: Any  # schedlang.llm.stepwise.StepLimits

    def loops(self, block: str) -> list[Loop]: ...

    def free(self, block: str) -> list[Loop]:
        """The block's loops not bound to a thread nor annotated."""

    def reads(self, block: str) -> list[str]: ...

    def factors(self, loop: Loop, count: int, knobs: bool = True) -> list[str]:
        """Split factors of the loop's extent worth offering (knobs whose values all divide it)."""

    def thread_fits(self, thread: str, extent: int) -> bool: ...

    def math(self, block: str) -> tuple[str, ...]:
        """The functions `fast_math` would rewrite in the block."""


@dataclass(frozen=True)
class Choice:
    """One of `options`, or (`most` > 1) `least` to `most` of them, distinct, joined by `sep`."""

    options: tuple[str, ...]
    least: int = 1
    most: int = 1
    sep: str = ", "


@dataclass(frozen=True)
class StepPattern:
    """A step offered as a small grammar where its texts are too many to list: its `parts` in
    order, each a text or a `Choice` (`reorder` of any order of eight loops has 40,320 texts; a
    `tile` of two axes, every pair of their factors). Whatever the model writes under it is
    checked, as every step is; a repeated choice's distinctness is left to that check."""

    parts: tuple[str | Choice, ...]

    def under(self, header: str) -> StepPattern:
        """The same step after a block header (or an indent)."""
        return StepPattern((header, *self.parts)) if header else self

    def lark(self, name: str) -> str:
        """An llguidance Lark terminal `name` (upper case) that matches exactly these texts."""
        body = self._written(
            json.dumps,
            lambda options: "(" + " | ".join(options) + ")",
            lambda one, sep, least, most: f"{one} ({sep} {one}){{{least},{most}}}",
            " ",
        )
        return f"{name}: {body}"

    def __str__(self) -> str:
        """As a person reads it: `reorder {i|j|k}, …` (a choice in braces, a repeat with `, …`)."""
        return self._written(
            str, lambda options: "{" + "|".join(options) + "}",
            lambda one, sep, least, most: f"{one}{sep}…", "",
        )  # fmt: skip

    def matches(self, text: str) -> bool:
        regex = self._written(
            re.escape,
            lambda options: "(?:" + "|".join(options) + ")",
            lambda one, sep, least, most: f"{one}(?:{sep}{one}){{{least},{most}}}",
            "",
        )
        return re.fullmatch(regex, text) is not None

    def _written(self, literal, one_of, repeated, joiner: str) -> str:
        """The parts in one notation: `literal(text)`, `one_of(literals)`, and `repeated(one,
        separator, least, most)` for the repeats after the first of a choice."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(literal(part))
                continue
            one = one_of([literal(option) for option in part.options])
            sep = literal(part.sep)
            out.append(repeated(one, sep, part.least - 1, part.most - 1) if part.most > 1 else one)
        return joiner.join(out)

    def sample(self, rng) -> str:
        """A text of the pattern, each choice uniform (a repeat's items distinct)."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                count = rng.randint(part.least, min(part.most, len(part.options)))
                out.append(part.sep.join(rng.sample(part.options, count)))
        return "".join(out)


# --- lowering ------------------------------------------------------------------------------------


def loop(nest: Nest, block: str, name: nodes.Name) -> s_tir.LoopRV:
    found = nest.find(block, name.text)
    assert found is not None, f"checker let unknown axis {name.text} through"
    return found.rv


def int_value(factor: nodes.Factor) -> int:
    assert isinstance(factor, nodes.IntFactor), f"unbound factor {factor!r} reached lowering"
    return factor.value


def name_all(nest: Nest, block: str, axis: nodes.Name, new_loops, new_names, how, stmt) -> None:
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


def new_block_free(c: Checker, stmt: nodes.Stmt, names: Iterable[str], tvm_name: str) -> None:
    """The blocks the statement makes are named apart from the others: `names` by schedlang (its
    syntax's `creates_blocks`), `tvm_name` by TVM."""
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


def format_bytes(size: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


def dtype_bytes(dtype: str) -> int:
    import tvm  # only a checker, which has imported it already, asks

    return max(1, tvm.DataType(dtype).bits * tvm.DataType(dtype).lanes // 8)


# Shared by the cache statements (buffers: cache_read/cache_write; blocks: reindex_cache_*); here,
# not in buffers, so that blocks does not import buffers: the AST classes register in family order.
def cache_scope_untranslatable(attrs: list) -> tuple[str, ...] | None:
    """A cache instruction's scope (its second attribute) that schedlang has no name for."""
    if str(attrs[1]) not in nodes.SCOPES:
        return (f"schedlang caches in {', '.join(nodes.SCOPES)}, not `{attrs[1]}`",)
    return None
