"""The checker's reporting and name resolution: what a name in a statement refers to, and why not.

`NameResolution` is the part of the checker (schedlang.checker.check) that turns the names a
statement writes into the live schedule's blocks and loops, reporting an unknown one once with
what it might have meant, and raising `Skip` for a name an earlier error left undefined, so one
mistake never cascades. `Reporting` records diagnostics; the guards reach both through the
`Checker` Protocol (schedlang.lang.statements.facade).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from schedlang.core.diagnostics import Diagnostic, Span, did_you_mean, error, one_of, warning
from schedlang.lang import nodes, statements
from schedlang.lang.nest import Loop, Nest
from schedlang.lang.statements import loop_kinds
from schedlang.lang.statements.base import padded_extent_limit


class Skip(Exception):
    """The statement touches a name an earlier error left undefined: skip it silently."""


class Reporting:
    """Every finding, in the order found: reported in one pass, never raised."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.diagnostics: list[Diagnostic] = []

    def error(self, message: str, span: Span | None, *notes: str) -> None:
        self.diagnostics.append(error(message, span, *notes))

    def warn(self, message: str, span: Span | None, *notes: str) -> None:
        self.diagnostics.append(warning(message, span, *notes))

    def warn_or_error(self, message: str, span: Span | None, *notes: str) -> None:
        """A warning, or an error under --strict."""
        report = error if self.strict else warning
        self.diagnostics.append(report(message, span, *notes))

    def require(self, condition: bool, message: str, span: Span | None, *notes: str) -> bool:
        if not condition:
            self.error(message, span, *notes)
        return condition

    def unknown(self, message: str, name: nodes.Name, known: Collection[str], what: str) -> None:
        """An error for a name that refers to nothing: the closest of the `known` names, and all
        of them."""
        self.error(message, name.span, did_you_mean(name.text, known), one_of(known, what))

    def require_known(
        self, name: nodes.Name, known: Collection[str], message: str, what: str
    ) -> bool:
        """`name` is one of `known`, else an error as `unknown` reports it."""
        if name.text in known:
            return True
        self.unknown(message, name, known, what)
        return False


class NameResolution(Reporting):
    """Blocks and axes by name, in the current section, against the live nest."""

    def __init__(self, nest: Nest, strict: bool):
        super().__init__(strict)
        self.nest = nest
        self.block: str | None = None  # the current section's block
        self.block_spans: dict[str, Span] = {}  # block → the start of its first section
        self.unknown_blocks: set[str] = set()  # blocks an earlier error left undefined
        self.unknown_axes: set[tuple[str, str]] = set()  # (block, axis) likewise
        self.moved_by: dict[str, Span] = {}  # block → the last compute_at that moved it
        self.failed_binds: set[str] = set()  # blocks with a rejected `bind`: already reported

    # --- sections --------------------------------------------------------------------------------

    def enter_block(self, header: nodes.BlockHeader) -> None:
        name = header.block.text
        self.block = name
        self.block_spans.setdefault(name, header.block.span)
        if name in self.unknown_blocks or self.nest.has_block(name):
            return
        self.unknown(f"unknown block `{name}`", header.block, self.all_blocks(), "blocks")
        self.unknown_blocks.add(name)

    def all_blocks(self) -> list[str]:
        """The op's blocks and those nested in them: what a section or a block name may name."""
        return self.nest.block_names() + self.nest.nested_block_names()

    def current_block(self, span: Span) -> str:
        if self.block is None:
            self.block = self.default_block(span)
        if self.block in self.unknown_blocks:
            raise Skip
        return self.block

    def default_block(self, span: Span) -> str:
        """The op's only block, or else its only reduction block; otherwise a section is needed."""
        blocks = self.nest.block_names()
        reductions = self.nest.reduction_blocks()
        if len(blocks) == 1:
            return blocks[0]
        if len(reductions) == 1:
            return reductions[0]
        self.error(
            f"this op has {len(blocks)} blocks: say which one with `block NAME:`",
            span,
            one_of(blocks, "blocks"),
        )
        self.unknown_blocks.add("<none>")
        return "<none>"

    def mark_unknown(self, stmt: nodes.Stmt) -> None:
        """Record the names a skipped statement would have made, so later uses stay quiet."""
        block = self.block or "<none>"
        spec = statements.of(stmt)
        names = (*spec.consumes_axes(stmt), *spec.creates_axes(stmt))
        self.unknown_axes |= {(block, n) for n in names}
        self.unknown_blocks |= set(spec.creates_blocks(stmt, block))
        if isinstance(stmt, loop_kinds.Bind):
            self.failed_binds.add(block)

    # --- names in a statement --------------------------------------------------------------------

    def axis(self, name: nodes.Name, block: str) -> Loop:
        """The loop `name` in `block`, or an error saying why there is none."""
        loop = self.nest.find(block, name.text)
        if loop is not None:
            return loop
        if (block, name.text) in self.unknown_axes:
            raise Skip
        loops = [loop.name for loop in self.nest.loops(block)]
        consumed = self.nest.consumed.get((block, name.text))
        if consumed is not None:
            into = ", ".join(f"`{n}`" for n in consumed.into)
            self.error(
                f"axis `{name.text}` no longer exists",
                name.span,
                f"`{name.text}` was {consumed.how} into {into} at line {consumed.line}",
                one_of(loops, f"axes of block {block}"),
            )
            raise Skip
        moved = self.moved_by.get(block)
        elsewhere = [b for b in self.nest.blocks_with_axis(name.text) if b != block]
        if moved is not None:
            # compute_at regenerates the moved block's own loops (named after its iteration
            # variables; the ax0, ax1, … TVM gives them still resolve).
            self.error(
                f"unknown axis `{name.text}` in block {block}",
                name.span,
                f"block {block} was moved at line {moved.line}, which gave it new loops",
                one_of(loops, f"axes of block {block}"),
                "split or reorder a block's loops before moving it",
            )
        elif elsewhere:
            self.error(
                f"`{name.text}` is an axis of block {elsewhere[0]}, not of block {block}",
                name.span,
                one_of(loops, f"axes of block {block}"),
                f"start a section with `block {elsewhere[0]}:` to schedule it",
            )
        else:
            self.unknown(
                f"unknown axis `{name.text}` in block {block}",
                name,
                loops,
                f"axes of block {block}",
            )
        raise Skip

    def axes(self, names: Iterable[nodes.Name], block: str) -> list[Loop]:
        """Resolve several axes, reporting every unknown one before skipping."""
        loops, missing = [], False
        for name in names:
            try:
                loops.append(self.axis(name, block))
            except Skip:
                missing = True
        if missing:
            raise Skip
        return loops

    def existing_block(self, name: nodes.Name) -> str:
        if name.text in self.unknown_blocks:
            raise Skip
        if self.nest.has_block(name.text):
            return name.text
        self.unknown(f"unknown block `{name.text}`", name, self.all_blocks(), "blocks")
        raise Skip

    def distinct(self, names: tuple[nodes.Name, ...]) -> None:
        seen: set[str] = set()
        for name in names:
            self.require(name.text not in seen, f"axis `{name.text}` is listed twice", name.span)
            seen.add(name.text)

    def factor_fits(self, factor: int, loop: Loop, span: Span, what: str = "factor") -> bool:
        if not self.require(factor > 0, f"{what} must be positive, got {factor}", span):
            return False
        if loop.extent is not None and factor > loop.extent:
            if not self.require(
                factor <= padded_extent_limit(loop.extent),
                f"{what} {factor} is larger than the extent {loop.extent} of `{loop.name}`, "
                f"past the {padded_extent_limit(loop.extent)} iterations a guarded loop may run",
                span,
                f"the inner loop would run {factor} iterations to do {loop.extent}: TVM "
                "builds and runs the empty ones (a factor of 2^31 - 1 did not build in 120 s)",
            ):
                return False
            # Legal: TVM makes the outer loop of extent 1 and guards the inner one.
            self.warn_or_error(
                f"{what} {factor} is larger than the extent {loop.extent} of `{loop.name}`: "
                "TVM adds a guard",
                span,
                f"the inner loop runs {factor} iterations and an `if` skips all but "
                f"{loop.extent}; a {what} of {loop.extent} or less needs no guard",
            )
        return True

    def new_names_free(self, names: Iterable[str], block: str, span: Span) -> None:
        existing = {loop.name for loop in self.nest.loops(block)}
        for name in names:
            self.require(
                name not in existing,
                f"`{name}` already names a loop of block {block}",
                span,
                "choose another name with `as`",
            )
