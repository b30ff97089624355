"""Loop transformations: `split`, `tile`, `reorder`, `fuse`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schedlang.lang import nodes
from schedlang.lang.loop import Consumed, Loop, LoopKind
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import Alias, Axes, Axis, Factors, format_factor
from schedlang.lang.statements.base import int_value, loop, name_all, padded_extent_limit
from schedlang.lang.statements.decoding import Choice, StepPattern, StepView
from schedlang.lang.statements.decompiling import TraceReader
from schedlang.lang.statements.facets import Syntax

if TYPE_CHECKING:
    from schedlang.core.diagnostics import Span
    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker

# Characters of a TVM loop variable's name (see guard_fuse).
MAX_LOOP_NAME = 1024


def divisors_note(extent: int, factor: int) -> str:
    small = [d for d in range(1, math.isqrt(extent) + 1) if extent % d == 0]
    divisors = sorted({*small, *(extent // d for d in small)})
    nearest = sorted(sorted(divisors, key=lambda d: abs(d - factor))[:4])
    return f"factors that divide {extent}: " + ", ".join(map(str, nearest))


def format_tile_factors(factors: tuple[nodes.Factor, ...]) -> str:
    """`32x32` when every factor is a number; `TI x 32` once a knob name needs the spaces."""
    parts = [format_factor(f) for f in factors]
    compact = all(isinstance(f, nodes.IntFactor) and f.value >= 0 for f in factors)
    return "x".join(parts) if compact else " x ".join(parts)


class TileFactors(Factors):
    """A tile's factors, one per axis: `32x32`."""

    def text(self, value: Any) -> str:
        return format_tile_factors(value)


@dataclass(frozen=True)
class Split(nodes.Stmt, keyword="split"):
    """`split i by 32` → i.o, i.i; `split i by *, 4, 8` → i.0, i.1, i.2."""

    axis: nodes.Name
    factors: tuple[nodes.Factor, ...]

    @property
    def parts(self) -> tuple[nodes.Factor, ...]:
        """The factor of each resulting loop, outer to inner (outer inferred if omitted)."""
        if len(self.factors) == 1:
            return (nodes.InferredFactor(span=self.axis.span), *self.factors)
        return self.factors

    @property
    def derived_names(self) -> tuple[str, ...]:
        return nodes.derived_axis_names(self.axis.text, len(self.parts))


@dataclass(frozen=True)
class Tile(nodes.Stmt, keyword="tile"):
    """`tile i, j by 32x32` → i.o, j.o, i.i, j.i (Halide: split each, outer loops first)."""

    axes: tuple[nodes.Name, ...]
    factors: tuple[nodes.Factor, ...]


@dataclass(frozen=True)
class Reorder(nodes.Stmt, keyword="reorder"):
    axes: tuple[nodes.Name, ...]


@dataclass(frozen=True)
class Fuse(nodes.Stmt, keyword="fuse"):
    """`fuse i.o, j.o` → `i.o_j.o`; `fuse i.o, j.o as ij` → `ij`."""

    axes: tuple[nodes.Name, ...]
    alias: nodes.Name | None = None

    @property
    def fused_name(self) -> str:
        return self.alias.text if self.alias else "_".join(a.text for a in self.axes)


# fmt: off
SPLIT = Syntax("split", Split, "loops", (Axis(consumed=True), Factors(word="by")),
    example="e.g. `split i by 32` or `split i by *, 4, 8`",
    description="split a loop into nested loops, outer to inner; one factor is the inner extent.",
    summary=("`split i by F`", "`sch.split(loop, factors=[None, F])`", "`i.o`, `i.i` / `i.0` …"),
    creates_axes=lambda s: s.derived_names)

TILE = Syntax("tile", Tile, "loops", (Axes(consumed=True), TileFactors(word="by")),
    example="e.g. `tile i, j by 32x32` (one factor per axis)",
    description="split each axis by its factor, then order all outer loops before all inner ones.",
    summary=("`tile i, j by Fi x Fj`", "`sch.split` per axis, `sch.reorder`",
        "`i.o`, `j.o`, `i.i`, `j.i`"),
    creates_axes=lambda s: tuple(_tile_names(s)))

REORDER = Syntax("reorder", Reorder, "loops", (Axes(),),
    example="e.g. `reorder i.o, j.o, i.i, j.i` (at least two axes)",
    description="put these loops in this order, outer to inner (they must be nested in one chain).",
    summary=("`reorder a, b, …`", "`sch.reorder(a, b, …)`", "—"))

FUSE = Syntax("fuse", Fuse, "loops", (Axes(consumed=True), Alias()),
    example="e.g. `fuse i.o, j.o` or `fuse i.o, j.o as ij`",
    description="fuse consecutive nested loops into one.",
    summary=("`fuse a, b [as n]`", "`sch.fuse(a, b)`", "`a_b` / `n`"),
    creates_axes=lambda s: (s.fused_name,))
# fmt: on

STATEMENTS = (SPLIT, TILE, REORDER, FUSE)


# --- split ---------------------------------------------------------------------------------------


@facets.guard(SPLIT)
def guard_split(c: Checker, stmt: Split, block: str) -> None:
    loop = c.axis(stmt.axis, block)
    known = [f for f in stmt.parts if isinstance(f, nodes.IntFactor)]
    if not all(c.factor_fits(f.value, loop, f.span) for f in known):
        return
    c.new_names_free(stmt.derived_names, block, stmt.span)
    product = math.prod(f.value for f in known)
    if loop.extent is None:
        return
    # One warning is enough: a factor past the extent already said that TVM adds a guard.
    over_extent = any(f.value > loop.extent for f in known)
    limit = padded_extent_limit(loop.extent)
    if not c.require(
        product <= limit,
        f"factors multiply to {product}, past the {limit} iterations a guarded loop of "
        f"extent {loop.extent} may run",
        stmt.span,
        f"the split loops would run {product} iterations to do {loop.extent}",
    ):
        return
    if len(known) == len(stmt.parts):  # every factor given: they must cover the extent
        c.require(
            product >= loop.extent,
            f"factors multiply to {product}, less than the extent {loop.extent} of `{loop.name}`",
            stmt.span,
            "use `*` for the factor to infer",
        )
        if product > loop.extent and not over_extent:
            c.warn_or_error(
                f"factors multiply to {product}, more than the extent {loop.extent} of "
                f"`{loop.name}`: TVM adds a guard",
                stmt.span,
            )
        return
    if product > loop.extent:
        # Legal: the inferred factor is 1 and TVM guards the rest.
        if not over_extent:
            c.warn_or_error(
                f"factors multiply to {product}, more than the extent {loop.extent} of "
                f"`{loop.name}`: TVM adds a guard",
                stmt.span,
                "the inferred factor becomes 1",
            )
    elif loop.extent % product:
        c.warn_or_error(
            f"extent {loop.extent} of `{loop.name}` is not divisible by {product}: "
            "TVM adds a guard (an `if` in the loop body)",
            stmt.span,
            divisors_note(loop.extent, product),
        )


@facets.lower(SPLIT)
def lower_split(nest: Nest, block: str, stmt: Split) -> None:
    sizes = [None if isinstance(p, nodes.InferredFactor) else int_value(p) for p in stmt.parts]
    new_loops = nest.sch.split(loop(nest, block, stmt.axis), factors=sizes)
    name_all(nest, block, stmt.axis, new_loops, stmt.derived_names, "split", stmt)


@facets.decompile(SPLIT, "Split")
def decompile_split(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    block, axis = reader.axis(inputs[0])
    factors = [reader.value(f) for f in inputs[1:]]
    if len(factors) == 2 and factors[0] is None and factors[1] is not None:
        parts: tuple[nodes.Factor, ...] = (nodes.IntFactor(factors[1]),)
    else:
        parts = tuple(nodes.InferredFactor() if f is None else nodes.IntFactor(f) for f in factors)
    reader.emit(block, Split(nodes.Name(axis), parts))


@facets.untranslatable(SPLIT)
def _split_untranslatable(attrs: list[Any]) -> tuple[str, ...] | None:
    if len(attrs) > 1 and bool(attrs[1]):
        return ("schedlang's split guards a non-divisible tail; this one disables that "
                "(disable_predication=True)",)  # fmt: skip
    return None


@facets.steps(SPLIT, over="free loop")
def _split_steps(view: StepView, block: str, loop: Loop) -> list[str | StepPattern]:
    """By one factor (1 and the extent too: templates keep the parts' names when a knob leaves
    one of them a single iteration), and in three or four parts, the outermost inferred
    (`split i by *, 16, 8`)."""
    if (loop.extent or 0) <= 1:
        return []
    factors = [*view.factors(loop, view.limits.factors), str(loop.extent)]
    steps: list[str | StepPattern] = [f"split {loop.name} by {f}" for f in ("1", *factors)]
    if factors:
        inner = Choice(("1", *factors))
        steps.append(StepPattern((f"split {loop.name} by *, ", inner)))
        steps.append(StepPattern((f"split {loop.name} by *, ", inner, ", ", inner)))
    return steps


def _drops_unit_loops(keyword: str) -> Callable[[list[Any], list[Any]], str | None]:
    def divergence(inputs: list[Any], attrs: list[Any]) -> str | None:
        if attrs and not bool(attrs[0]):
            return ("it drops loops of extent 1 (preserve_unit_iters=False); schedlang's "
                    f"`{keyword}` keeps them")  # fmt: skip
        return None

    return divergence


# --- tile ----------------------------------------------------------------------------------------


@facets.guard(TILE)
def guard_tile(c: Checker, stmt: Tile, block: str) -> None:
    c.distinct(stmt.axes)
    loops = c.axes(stmt.axes, block)
    mixed = [x for x in loops if x.kind is LoopKind.MIXED]
    if len(mixed) > 1:  # the first one's inner part goes inside the second one's outer part
        init_runs_late(c, mixed[1], mixed[0], stmt.span)
    for tiled, factor in zip(loops, stmt.factors, strict=True):
        assert isinstance(factor, nodes.IntFactor)
        if (
            c.factor_fits(factor.value, tiled, factor.span)
            and tiled.extent
            and tiled.extent % factor.value
            and factor.value < tiled.extent
        ):
            c.warn_or_error(
                f"extent {tiled.extent} of `{tiled.name}` is not divisible by "
                f"{factor.value}: TVM adds a guard",
                factor.span,
                divisors_note(tiled.extent, factor.value),
            )
    c.new_names_free(_tile_names(stmt), block, stmt.span)


def _tile_names(stmt: Tile) -> list[str]:
    return [n for a in stmt.axes for n in nodes.derived_axis_names(a.text, 2)]


@facets.lower(TILE)
def lower_tile(nest: Nest, block: str, stmt: Tile) -> None:
    outer, inner = [], []
    for axis, factor in zip(stmt.axes, stmt.factors, strict=True):
        new_names = nodes.derived_axis_names(axis.text, 2)
        new_loops = nest.sch.split(loop(nest, block, axis), factors=[None, int_value(factor)])
        name_all(nest, block, axis, new_loops, new_names, "tiled", stmt)
        outer.append(new_loops[0])
        inner.append(new_loops[1])
    nest.sch.reorder(*outer, *inner)


@facets.steps(TILE)
def _tile_steps(view: StepView, block: str, _: None) -> list[StepPattern]:
    """Tiles of two spatial loops, by any factors of their extents (the extent itself too)."""
    free = view.free(block)
    tileable = [loop for loop in free if loop.kind is LoopKind.SPATIAL and (loop.extent or 0) >= 4]
    steps = []
    for a, b in itertools.combinations(tileable, 2):
        fa, fb = (
            Choice((*view.factors(x, view.limits.factors, knobs=False), str(x.extent)))
            for x in (a, b)
        )
        steps.append(StepPattern((f"tile {a.name}, {b.name} by ", fa, "x", fb)))
    return steps


# --- reorder -------------------------------------------------------------------------------------


@facets.guard(REORDER)
def guard_reorder(c: Checker, stmt: Reorder, block: str) -> None:
    c.distinct(stmt.axes)
    loops = c.axes(stmt.axes, block)
    order = [x.name for x in c.nest.loops(block)]
    mixed = [x for x in loops if x.kind is LoopKind.MIXED and x.name in order]
    for a, b in itertools.pairwise(mixed):
        if order.index(a.name) > order.index(b.name):
            init_runs_late(c, b, a, stmt.span)
            return


def init_runs_late(c: Checker, outer: Loop, inner: Loop, span: Span) -> None:
    """Two loops fused from spatial and reduction loops, put in the other order: an output's
    first iteration is then not the one where its reduction starts, and the init runs after some
    of its updates (found by the differential fuzzer: `fuse i, j` of a row sum, split, then a
    tile or reorder of the parts; TVM 0.27 accepts it)."""
    c.error(
        f"`{inner.name}` and `{outer.name}` both run spatial and reduction iterations (fused "
        f"from both); putting `{inner.name}` inside `{outer.name}` makes the reduction's init "
        "run after some of its updates",
        span,
        "keep loops fused from a reduction in their order, or fuse only spatial loops",
    )


@facets.lower(REORDER)
def _lower_reorder(nest: Nest, block: str, stmt: Reorder) -> None:
    nest.sch.reorder(*(loop(nest, block, axis) for axis in stmt.axes))


@facets.decompile(REORDER, "Reorder")
def decompile_reorder(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    block, axes = reader.axes(inputs)
    reader.emit(block, Reorder(tuple(nodes.Name(a) for a in axes)))


@facets.steps(REORDER)
def _reorder_steps(view: StepView, block: str, _: None) -> list[StepPattern]:
    """Any order of two or more of the block's free loops (the check keeps those nested in one
    chain, each named once)."""
    free = tuple(loop.name for loop in view.free(block))
    if len(free) < 2:
        return []
    return [StepPattern(("reorder ", Choice(free, least=2, most=len(free))))]


# --- fuse ----------------------------------------------------------------------------------------


@facets.guard(FUSE)
def guard_fuse(c: Checker, stmt: Fuse, block: str) -> None:
    c.distinct(stmt.axes)
    loops = c.axes(stmt.axes, block)
    order = [loop.name for loop in c.nest.loops(block)]
    positions = [order.index(loop.name) for loop in loops]
    for (a, pa), (b, pb) in zip(zip(loops, positions), zip(loops[1:], positions[1:])):  # noqa: B905
        if pb == pa + 1:
            continue
        if pb < pa:
            c.error(
                f"fuse lists `{b.name}` after `{a.name}`, but it is the outer loop",
                stmt.span,
                "list the loops outer to inner: "
                + ", ".join(order[min(positions) : max(positions) + 1]),
            )
        else:
            between = ", ".join(f"`{n}`" for n in order[pa + 1 : pb])
            c.error(
                f"fuse needs adjacent loops: {between} lies between `{a.name}` and `{b.name}`",
                stmt.span,
                "reorder them first",
            )
        return
    c.new_names_free([stmt.fused_name], block, stmt.span)
    # TVM names a fused loop after all of its loops (`i_0_i_1_fused`), so fusing the parts of a
    # split again doubles the name each round: 25 rounds take gigabytes. Found by a long-file
    # test (tests/test_fuzz.py).
    length = len("_".join(c.nest.sch.get(loop.rv).loop_var.name for loop in loops)) + 6
    c.require(
        length <= MAX_LOOP_NAME,
        f"fuse would give TVM's loop a {length}-character name, more than {MAX_LOOP_NAME}: "
        "each split and fuse of the same loop doubles it",
        stmt.span,
        "split the fused loop once instead of splitting and fusing it again",
    )


@facets.lower(FUSE)
def lower_fuse(nest: Nest, block: str, stmt: Fuse) -> None:
    fused = nest.sch.fuse(*(loop(nest, block, a) for a in stmt.axes))
    nest.set_name(fused, stmt.fused_name)
    for axis in stmt.axes:
        nest.consumed[(block, axis.text)] = Consumed("fused", stmt.span.line, (stmt.fused_name,))


@facets.decompile(FUSE, "Fuse")
def decompile_fuse(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    if len(inputs) == 1:
        # MetaSchedule "fuses" a single loop to rename it, which also makes it serial; it
        # then parallelizes (or vectorizes) it again, which schedlang's loop already is.
        reader.defer()
        return
    block, axes = reader.axes(inputs)
    reader.emit(block, Fuse(tuple(nodes.Name(a) for a in axes)))


# The names the built-in templates give the loops they fuse (schedlang.propose.rules): a model
# trained on their schedules writes them, and the statements after refer to them.
FUSED_NAMES = ("tasks", "tiles", "rows", "row", "f", "batch", "planes")


@facets.steps(FUSE)
def _fuse_steps(view: StepView, block: str, _: None) -> list[str]:
    """Runs of two or more adjacent free loops of one kind, unnamed or named as templates name
    them."""
    loops, free = view.loops(block), view.free(block)
    steps = []
    for start in range(len(loops)):
        for end in range(start + 2, len(loops) + 1):
            run = loops[start:end]
            if not all(loop in free for loop in run) or len({loop.kind for loop in run}) > 1:
                break
            fuse = "fuse " + ", ".join(loop.name for loop in run)
            steps += [fuse, *(f"{fuse} as {name}" for name in FUSED_NAMES)]
    return steps


@facets.divergence(FUSE)
def _fuse_divergence(inputs: list[Any], attrs: list[Any]) -> str | None:
    if len(inputs) == 1:
        return ("it fuses one loop alone, which makes a parallel, vectorized, unrolled or bound "
                "loop serial again; schedlang cannot")  # fmt: skip
    return _drops_unit_loops("fuse")(inputs, attrs)


facets.divergence(SPLIT)(_drops_unit_loops("split"))
