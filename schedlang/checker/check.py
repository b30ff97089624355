"""Type-check a schedule against the op's loop nests and the target's limits.

The checker walks the statements in order over a live schedule (schedlang.lang.nest), so every check
sees the loops as they are at that point: their names, extents, kinds and bindings. Each statement
runs its guards (its entry in schedlang.lang.statements); a statement that passes is applied
(schedlang.checker.primitives.apply_statement) and anything TVM still rejects becomes a Diagnostic
at that
statement. A statement that fails is skipped, and the names it would have created are marked
unknown-but-fine, so one mistake is reported once and never cascades. Every problem is reported
in one pass.

On a GPU target, a schedule that checks clean is then lowered as far as TVM's own GPU verifier
(`tvm.s_tir.analysis.verify_gpu_code`, as MetaSchedule runs it) needs, and what the verifier finds
(threads per block, shared memory as allocated, vector widths) is mapped back to the statement that
caused it: a bind, a cache_read or cache_write, a vectorize.

The parts: this module drives the pass, resolves names and remembers what each statement did
(provenance); the guards are the statements' own (schedlang.lang.statements); the whole-schedule GPU
rules are schedlang.checker.gpu_rules; TVM's GPU verifier and the mapping of its messages are
schedlang.checker.gpu_verifier. The limits are the target's (schedlang.core.target.Target).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from tvm import s_tir, tirx

from schedlang.checker import gpu_rules
from schedlang.checker import gpu_verifier as verifier_messages
from schedlang.checker.gpu_verifier import gpu_constraints, kernel_uses, lower_for_verification
from schedlang.checker.primitives import Lowered, apply_statement, bind_knobs, finish, tvm_reason
from schedlang.core.diagnostics import (
    Diagnostic,
    Severity,
    Span,
    did_you_mean,
    error,
    one_of,
    warning,
)
from schedlang.core.target import Target
from schedlang.lang import nodes, statements
from schedlang.lang.nest import Loop, LoopKind, Nest, UncheckedSchedule
from schedlang.lang.printer import format_choices

__all__ = [
    "CheckResult",
    "PrefixCheck",
    "check",
    "check_prefix",
    "gpu_constraints",
    "kernel_uses",
    "lower_for_verification",
]


@dataclass
class CheckResult:
    diagnostics: list[Diagnostic]
    lowered: Lowered | None  # None when there were errors

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)


def check(
    schedule: nodes.Schedule,
    func: tirx.PrimFunc,
    target: Target,
    *,
    knobs: Mapping[str, int] | None = None,
    strict: bool = False,
    template_ok: bool = True,
) -> CheckResult:
    """Check `schedule` on `func` for `target`; lower it when no error is found.

    A template (a schedule with knobs) is checked with the values in `knobs`; knobs without a value
    take their first candidate when `template_ok`, and are errors otherwise.
    """
    checker = _Checker(func, target, strict)
    concrete = checker.bind_knobs(schedule, dict(knobs or {}), template_ok)
    for stmt in concrete.statements:
        checker.statement(stmt)
    checker.finish()
    if strict:  # every warning, the whole-schedule rules' included
        checker.diagnostics = [_as_error(d) for d in checker.diagnostics]
    lowered = None
    if not any(d.is_error for d in checker.diagnostics):
        lowered = finish(checker.nest, concrete)
        if target.is_gpu:
            verifier_messages.verify_lowered(checker, lowered.func)
            if strict:
                checker.diagnostics = [_as_error(d) for d in checker.diagnostics]
            if any(d.is_error for d in checker.diagnostics):
                lowered = None
    return CheckResult(sorted(checker.diagnostics, key=_position), lowered)


@dataclass
class PrefixCheck:
    """A schedule's first statements checked as a prefix of a longer one: what per-statement
    decoding needs to decide what may come next (schedlang.llm.stepwise)."""

    nest: Nest  # the live schedule after the statements, with schedlang names
    block: str | None  # the block the next statement schedules, if the section says
    diagnostics: list[Diagnostic]  # the statements' own findings
    final: list[Diagnostic]  # the whole-schedule findings, as if the schedule ended here
    unbound: dict[str, Diagnostic]  # GPU blocks not bound to threads yet, and what says so

    @property
    def statements_ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)

    @property
    def blocking(self) -> list[Diagnostic]:
        """Whole-schedule errors other than "block X is not bound": no later `bind` fixes them."""
        return [d for d in self.final if d.is_error and d not in self.unbound.values()]


def check_prefix(schedule: nodes.Schedule, func: tirx.PrimFunc, target: Target) -> PrefixCheck:
    """Check `schedule` statement by statement (knobs at their first values), then the
    whole-schedule rules, without lowering."""
    checker = _Checker(func, target, strict=False)
    concrete = checker.bind_knobs(schedule, {}, True)
    for stmt in concrete.statements:
        checker.statement(stmt)
    statements = list(checker.diagnostics)
    block = checker.block
    if statements_ok := not any(d.is_error for d in statements):
        checker.finish()
    final = checker.diagnostics[len(statements) :] if statements_ok else []
    return PrefixCheck(checker.nest, block, statements, final, dict(checker.unbound))


def _as_error(diagnostic: Diagnostic) -> Diagnostic:
    return replace(diagnostic, severity=Severity.ERROR)


def _position(diagnostic: Diagnostic) -> tuple[int, int]:
    span = diagnostic.span
    return (span.line, span.column) if span else (10**9, 0)


class _Skip(Exception):
    """The statement touches a name an earlier error left undefined: skip it silently."""


@dataclass(frozen=True)
class _Bound:
    """One `bind` statement: the thread axis, the loop's extent and where it was written."""

    thread: str
    extent: int | None
    span: Span


class _Checker:
    def __init__(self, func: tirx.PrimFunc, target: Target, strict: bool):
        self.nest = Nest(UncheckedSchedule(func, error_render_level="detail"))
        self.param_buffers = {param.name for param in func.params}
        self.target = target
        self.strict = strict
        self.diagnostics: list[Diagnostic] = []
        self.block: str | None = None  # the current section's block
        self.block_spans: dict[str, Span] = {}  # block → the start of its first section
        self.unknown_blocks: set[str] = set()  # blocks an earlier error left undefined
        self.unknown_axes: set[tuple[str, str]] = set()  # (block, axis) likewise
        self.created_by: dict[str, Span] = {}  # block → the statement that created it
        self.decomposed: dict[str, int] = {}  # block → line of its decompose_reduction
        self.failed_binds: set[str] = set()  # blocks with a rejected `bind`: already reported
        self.moved_by: dict[str, Span] = {}  # block → the last compute_at that moved it
        self.read_caches: set[str] = set()  # the copy blocks made by cache_read
        self.reordered_by: Span | None = None  # the last reorder or tile
        self.decomposed_by: Span | None = None  # the last decompose_reduction
        # For the GPU verifier's findings, which name no statement: what each one did.
        self.binds: list[_Bound] = []
        self.vectorized: list[tuple[int | None, nodes.Name]] = []  # (extent, axis)
        self.buffer_made_by: dict[str, Span] = {}  # cache buffer → its cache_read/cache_write
        self.aligned_by: dict[str, Span] = {}  # buffer → its storage_align
        self.unrolled_by: dict[object, Span] = {}  # loop sref → its unroll or pragma
        self.unbound: dict[str, Diagnostic] = {}  # GPU blocks with no thread binding (finish)

    # --- reporting -------------------------------------------------------------------------------

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

    # --- knobs -----------------------------------------------------------------------------------

    def bind_knobs(
        self, schedule: nodes.Schedule, values: dict[str, int], template_ok: bool
    ) -> nodes.Schedule:
        declared = {p.name.text: p for p in schedule.params}
        for name in values:
            self.require(
                name in declared,
                f"knob `{name}` is not declared in the schedule",
                None,
                did_you_mean(name, declared),
                one_of(sorted(declared), "knobs"),
            )
        rejected: set[str] = set()
        for name, param in declared.items():
            if name in values:
                value = values[name]
                if not self.require(
                    value in param.choices,
                    f"knob `{name}` = {value} is not one of its values",
                    param.choices.span,
                    f"`{name}` takes {_describe_choices(param.choices)}",
                ):
                    del values[name]  # its statements are skipped, not checked with a bad value
                    rejected.add(name)
            elif template_ok:
                values[name] = next(iter(param.choices), 1)
        for stmt in schedule.statements:
            spec = statements.BY_NODE.get(type(stmt))
            for factor in spec.factors(stmt) if spec else ():
                if not isinstance(factor, nodes.KnobFactor):
                    continue
                if factor.name not in declared:
                    self.error(
                        f"unknown knob `{factor.name}`",
                        factor.span,
                        did_you_mean(factor.name, declared),
                        f"declare it first: `param {factor.name} in [8, 16, 32]`",
                    )
                elif factor.name not in values and factor.name not in rejected:
                    self.error(
                        f"knob `{factor.name}` has no value",
                        factor.span,
                        "this schedule is a template: tune it, or give a value "
                        f"with `-k {factor.name}=…`",
                    )
        return bind_knobs(schedule, {k: v for k, v in values.items() if k in declared})

    # --- statements ------------------------------------------------------------------------------

    def statement(self, stmt: nodes.Stmt) -> None:
        if isinstance(stmt, nodes.BlockHeader):
            self.enter_block(stmt)
            return
        if isinstance(stmt, nodes.Param):
            return
        # Only this statement's diagnostics: counting them all, each time, made a long file's
        # check quadratic.
        reported_before = len(self.diagnostics)
        try:
            block = self.current_block(stmt.span)
            # Whole-schedule findings about a block point at its section: its header, or else
            # its first statement.
            self.block_spans.setdefault(block, stmt.span)
            spec = statements.of(stmt)
            if any(isinstance(f, nodes.KnobFactor) for f in spec.factors(stmt)):
                raise _Skip  # its unbound knob is already reported
            spec.guard(self, stmt, block)
        except _Skip:
            self.mark_unknown(stmt)
            return
        except (s_tir.ScheduleError, RuntimeError, ValueError) as exc:
            # A guard's look-up that TVM rejects: report it here rather than crash the checker.
            self.error(f"cannot check `{stmt.keyword}`: {tvm_reason(exc)}", stmt.span)
            self.mark_unknown(stmt)
            return
        if any(d.is_error for d in self.diagnostics[reported_before:]):
            self.mark_unknown(stmt)
            return
        try:
            apply_statement(self.nest, block, stmt)
        except (s_tir.ScheduleError, RuntimeError, ValueError) as exc:
            self.error(f"TVM cannot apply `{stmt.keyword}`: {tvm_reason(exc)}", stmt.span)
            self.mark_unknown(stmt)
            return
        if spec.soundness is not None:
            spec.soundness(self, stmt, block)
        self.after(spec, stmt, block)

    def error_count(self) -> int:
        return sum(d.is_error for d in self.diagnostics)

    def enter_block(self, header: nodes.BlockHeader) -> None:
        name = header.block.text
        self.block = name
        self.block_spans.setdefault(name, header.block.span)
        if name in self.unknown_blocks or self.nest.has_block(name):
            return
        blocks = self.nest.block_names() + self.nest.nested_block_names()
        self.error(
            f"unknown block `{name}`",
            header.block.span,
            did_you_mean(name, blocks),
            one_of(blocks, "blocks"),
        )
        self.unknown_blocks.add(name)

    def current_block(self, span: Span) -> str:
        if self.block is None:
            self.block = self.default_block(span)
        if self.block in self.unknown_blocks:
            raise _Skip
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
        if isinstance(stmt, nodes.Bind):
            self.failed_binds.add(block)

    def after(self, spec: statements.Statement, stmt: nodes.Stmt, block: str) -> None:
        for created in spec.creates_blocks(stmt, block):
            self.created_by[created] = stmt.span
        moved = spec.moves_block(stmt)
        if moved is not None:
            self.moved_by[moved] = stmt.span
        if stmt.keyword in ("reorder", "tile"):
            self.reordered_by = stmt.span
        if stmt.keyword == "decompose_reduction":
            self.decomposed_by = stmt.span
        if spec.provenance is not None:
            spec.provenance(self, stmt, block)
        if self.target.is_gpu and spec.record is not None:
            spec.record(self, stmt, block)

    # --- name resolution -------------------------------------------------------------------------

    def axis(self, name: nodes.Name, block: str) -> Loop:
        """The loop `name` in `block`, or an error saying why there is none."""
        loop = self.nest.find(block, name.text)
        if loop is not None:
            return loop
        if (block, name.text) in self.unknown_axes:
            raise _Skip
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
            raise _Skip
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
            self.error(
                f"unknown axis `{name.text}` in block {block}",
                name.span,
                did_you_mean(name.text, loops),
                one_of(loops, f"axes of block {block}"),
            )
        raise _Skip

    def axes(self, names: Iterable[nodes.Name], block: str) -> list[Loop]:
        """Resolve several axes, reporting every unknown one before skipping."""
        loops, missing = [], False
        for name in names:
            try:
                loops.append(self.axis(name, block))
            except _Skip:
                missing = True
        if missing:
            raise _Skip
        return loops

    def existing_block(self, name: nodes.Name) -> str:
        if name.text in self.unknown_blocks:
            raise _Skip
        if self.nest.has_block(name.text):
            return name.text
        blocks = self.nest.block_names() + self.nest.nested_block_names()
        self.error(
            f"unknown block `{name.text}`",
            name.span,
            did_you_mean(name.text, blocks),
            one_of(blocks, "blocks"),
        )
        raise _Skip

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

    # --- provenance: what earlier statements did --------------------------------------------------

    def record_bind(self, thread: str, extent: int | None, span: Span) -> None:
        self.binds.append(_Bound(thread, extent, span))

    def kernel_threads(self, block: str, besides: Loop) -> dict[str, tuple[int, int]]:
        """The threads bound now in the kernel of `block` by loops other than `besides`:
        thread → (extent, line of its bind). Read off the live nest, since unroll, vectorize
        and a second bind replace a binding."""
        kernel, threads = self.kernel_of(block), {}
        rebound = self.nest.sch.get_sref(besides.rv)
        for other in self.nest.block_names():
            if other in self.unknown_blocks or self.kernel_of(other) != kernel:
                continue
            for loop in self.nest.loops(other):
                bound = loop.thread is not None and loop.extent is not None
                if not bound or loop.thread in threads:
                    continue
                if self.nest.sch.get_sref(loop.rv).same_as(rebound):
                    continue
                span = self.bind_span(loop.thread, loop.extent)
                threads[loop.thread] = (loop.extent, span.line if span else 0)
        return threads

    def kernel_of(self, block: str) -> object:
        """A GPU kernel is one outermost loop nest: key it by that loop's sref."""
        loops = self.nest.loops(block)
        return self.nest.sch.get_sref(loops[0].rv) if loops else block

    # --- soundness: what TVM applies without complaint but computes wrong -------------------------

    def copies_only_computed(self, stmt: nodes.CacheWrite, block: str, at: nodes.Name) -> None:
        """`cache_write … at L` copies back, in each iteration of L, the box around what the
        block wrote there. When the tile loops under L are strided (an inner tile loop reordered
        outside its outer one), the box holds points computed in other iterations, which TVM's
        per-iteration cache no longer has: the copy writes garbage over them (TVM 0.27)."""
        written = stmt.block.text
        if not self.outside_reduction(stmt, f"{written}'s write-back", written, at):
            return
        loop = self.nest.find(block, at.text)
        copy = next(iter(statements.of(stmt).creates_blocks(stmt, block)), None)
        if loop is None or copy is None or not self.nest.has_block(copy):
            return
        computed = self.nest.spatial_iterations(written, below=loop)
        copied = self.nest.spatial_iterations(copy, below=loop)
        if computed is None or copied is None:
            return
        self.require(
            copied <= computed,
            f"`cache_write … at {loop.name}` would copy back {copied} elements per iteration of "
            f"`{loop.name}` while block {written} computes only {computed} there: the rest "
            "would be garbage",
            at.span,
            "the tile loops under the `at` loop are strided: keep each split's outer loop "
            "outside its inner one, or write the cache back at an outer loop",
        )

    def covers_domain(self, stmt: nodes.ComputeAt | nodes.ReverseComputeAt) -> None:
        """A moved block must still compute every point it writes that someone reads. TVM
        regenerates a consumer's loops over what its producer writes under the loop: a padding
        block moved into the loop of the copy of its input computes only the interior, and the
        border is never written (TVM 0.27). A producer keeps what its consumers under the loop
        read: that is all of it unless the producer writes an output of the function."""
        moved = stmt.block.text
        if isinstance(stmt, nodes.ReverseComputeAt) and self.block is not None:
            producer = self.block
            if not self.outside_reduction(stmt, moved, producer, stmt.axis):
                return
            if not self.reads_whole_elements(stmt, moved, producer):
                return
        self.reduces_whole_domain(stmt, moved)
        if isinstance(stmt, nodes.ComputeAt) and not self.writes_output(moved):
            return
        needed = self.nest.spatial_points(moved)
        computed = self.nest.spatial_iterations(moved)
        if needed is None or computed is None:
            return
        self.require(
            computed >= needed,
            f"`{stmt.keyword}` leaves block {moved} computing {computed} of its {needed} "
            "points: the rest would never be written",
            stmt.block.span,
            f"the loop it is moved to runs only over part of what block {moved} writes "
            f"(a padding border, say): leave block {moved} where it is",
        )

    def outside_reduction(
        self, stmt: nodes.Stmt, moved: str, producer: str, at: nodes.Name
    ) -> bool:
        """A consumer moved into a loop over which its producer still reduces runs once per
        iteration of it, on partial results. An accumulating consumer (the final block of an
        rfactor, a second reduction) adds them up again; a copy writes them back, and a block
        later computed at the copy's loops gets them (decompose_reduction then computes wrong
        values). TVM checks none of it (found by the differential fuzzer, TVM 0.27)."""
        loop = self.nest.find(producer, at.text)
        if loop is None or loop.kind not in (LoopKind.REDUCE, LoopKind.MIXED):
            return True
        return self.require(
            loop.extent == 1,
            f"`{stmt.keyword}` would put block {moved} inside `{loop.name}`, over which block "
            f"{producer} is still reducing: it would run {loop.extent or 'many'} times, on "
            "partial results",
            at.span,
            f"move block {moved} to a loop of block {producer} outside its reduction loops",
        )

    def reads_whole_elements(self, stmt: nodes.ReverseComputeAt, moved: str, producer: str) -> bool:
        """A consumer that reads a window or a strided slice of what the blocks under the loop
        write (a convolution moved into the loops of its padding block) gets loops over too
        small a region from TVM: wrong values, for every stride the fuzzer tried (TVM 0.27).
        Allowed: a consumer reading one element per point, each index one of its iterators
        (plus a constant)."""
        loop = self.nest.find(producer, stmt.axis.text)
        if loop is None:
            return True
        sch = self.nest.sch
        moved_sref = sch.get_sref(self.nest.block(moved))
        written = {
            region.source.name
            for rv in sch.get_child_blocks(loop.rv)
            if not sch.get_sref(rv).same_as(moved_sref)
            for region in sch.get(rv).writes
        }
        for region in sch.get(self.nest.block(moved)).reads:
            if region.source.name not in written:
                continue
            for index in region.region:
                start = index.min
                plain = isinstance(start, tirx.Var) or (
                    isinstance(start, tirx.Add | tirx.Sub)
                    and isinstance(start.a, tirx.Var)
                    and isinstance(start.b, tirx.IntImm)
                )
                if plain and isinstance(index.extent, tirx.IntImm) and int(index.extent) == 1:
                    continue
                return self.require(
                    False,
                    f"`{stmt.keyword}` of block {moved}, which reads "
                    f"`{region.source.name}[… {start} …]`, a window or stride of what block "
                    f"{producer} writes under `{loop.name}`: TVM would compute it over too "
                    "small a region",
                    stmt.block.span,
                    f"compute block {producer} at a loop of block {moved} instead "
                    f"(`compute_at {producer} …` in block {moved}'s section)",
                    "a TVM bug (0.27): wrong values, found by the differential fuzzer",
                )
        return True

    def cache_fits_buffer(self, stmt: nodes.CacheWrite, block: str) -> None:
        """TVM sizes the cache of `cache_write` from the block's loops, ignoring the `if` of a
        split (after a fuse, a split that does not divide and a fuse again, it came out 32 x 3
        for an 11 x 3 output), and copies all of it back: out of bounds (TVM 0.27)."""
        copy = next(iter(statements.of(stmt).creates_blocks(stmt, block)), None)
        if copy is None or not self.nest.has_block(copy):
            return
        buffer = self.nest.write_buffer(copy)  # the write-back writes the block's buffer
        made = self.nest.write_buffer(stmt.block.text)  # the block computes into the cache
        if buffer is None or made is None:
            return
        shape = [int(d) for d in buffer.shape if isinstance(d, tirx.IntImm)]
        made_shape = [int(d) for d in made.shape if isinstance(d, tirx.IntImm)]
        if len(shape) != len(buffer.shape) or len(made_shape) != len(shape):
            return
        self.require(
            all(m <= b for m, b in zip(made_shape, shape, strict=True)),
            f"TVM would make the cache `{made.name}` {' x '.join(map(str, made_shape))}, "
            f"larger than the {' x '.join(map(str, shape))} of `{buffer.name}`, and copy all "
            "of it back: out of bounds",
            stmt.span,
            "TVM sizes the cache from the block's loops and ignores the `if` of a split that "
            "does not divide (a TVM bug, 0.27): split by divisors before cache_write",
        )

    def reduces_whole_domain(
        self, stmt: nodes.ComputeAt | nodes.ReverseComputeAt, moved: str
    ) -> None:
        """A moved reduction must still run over its whole reduction: TVM regenerates its
        reduction loops from the region the producer writes under the loop, and with a stride it
        can come out short (a 3x3 depthwise window at stride 3 reduced over 1 row: partial sums;
        found by the differential fuzzer, TVM 0.27)."""
        needed = self.nest.reduce_points(moved)
        reduced = self.nest.reduce_iterations(moved)
        if needed is None or reduced is None:
            return
        self.require(
            reduced >= needed,
            f"`{stmt.keyword}` leaves block {moved} reducing over {reduced} of its {needed} "
            "reduction points: its results would be partial sums",
            stmt.block.span,
            f"TVM gives block {moved} reduction loops over only what the blocks under the loop "
            f"provide: leave block {moved} where it is",
        )

    def writes_output(self, block: str) -> bool:
        return any(buffer in self.param_buffers for buffer in self.nest.writes(block))

    def finish(self) -> None:
        """The whole-schedule rules, once every statement is checked."""
        self.unrolled_copies_fit()
        if self.target.is_gpu:
            gpu_rules.check_schedule(self)
        if not any(d.is_error for d in self.diagnostics):
            self.no_replayed_reduction() or self.no_partial_reads() or self.sound_dataflow()

    def no_replayed_reduction(self) -> bool:
        """No reduction block under a loop that feeds none of its iterators, inside a loop that
        feeds its reduction: each iteration of that loop would add the same terms again. A
        `reverse_compute_at` of a reduction to a loop of a block inside its own nest leaves it so
        (TVM 0.27; found by the differential fuzzer). True if one is reported."""
        for block in self.nest.block_names():
            reducing = None
            for loop in self.nest.loops(block):
                if loop.kind in (LoopKind.REDUCE, LoopKind.MIXED):
                    reducing = loop
                elif loop.kind == LoopKind.OUTER and reducing is not None and loop.extent != 1:
                    self.error(
                        f"block {block} is a reduction under `{loop.name}`, a loop that feeds "
                        f"none of its iterators, inside `{reducing.name}`, which feeds its "
                        f"reduction: each iteration of `{loop.name}` adds the same terms again",
                        self.last_moved([block]),
                        f"move block {block} to a loop outside `{reducing.name}`, or leave it "
                        "where it was",
                    )
                    return True
        return False

    def no_partial_reads(self) -> bool:
        """No block reads a reduction's output inside a loop over which the reduction still runs:
        it would read partial sums. Checked on the finished kernel, since a later statement can
        move either block there (a split of the loop a row sum was computed at, then a consumer
        moved to its outer part; found by the differential fuzzer). Thread loops are left out:
        TVM completes a reduction across threads before they go on. True if one is reported."""
        for writer in self.nest.block_names():
            if not self.nest.is_reduction_block(writer):
                continue
            written = set(self.nest.writes(writer))
            for reader in self.nest.block_names():
                read = written & set(self.nest.reads(reader))
                if reader == writer or not read:
                    continue
                partial = next(
                    (
                        x
                        for x in self.nest.shared_loops(writer, reader)
                        if x.kind in (LoopKind.REDUCE, LoopKind.MIXED)
                        and not (x.thread or "").startswith(("threadIdx", "vthread"))
                    ),
                    None,
                )
                if partial is not None:
                    buffer = ", ".join(sorted(read))
                    self.error(
                        f"block {reader} reads `{buffer}` inside `{partial.name}`, over which "
                        f"block {writer} still reduces: it would read partial results",
                        self.last_moved([reader, writer]),
                        f"compute block {reader} at a loop outside `{partial.name}`",
                    )
                    return True
        return False

    def sound_dataflow(self) -> None:
        """What every block reads was written before, in the same iteration of the loops it
        shares with the writers, and every index is inside its buffer
        (schedlang.checker.dataflow)."""
        from schedlang.checker import dataflow

        finding = dataflow.find_unsound(self.nest.sch.mod["main"], self.target.to_tvm())
        if finding is None:
            return
        reverse = {tvm_name: alias for alias, tvm_name in self.nest.block_aliases.items()}
        block = reverse.get(finding.block, finding.block)
        writers = [reverse.get(w, w) for w in finding.writers]
        point = f"`{finding.buffer}[{', '.join(map(str, finding.point))}]`"
        names = self.nest.loop_names_by_var()
        where = ", ".join(f"{names.get(var, var)} = {value}" for var, value in finding.where)
        at = f" at {where}" if where else ""
        span = self.last_moved([block, *writers])
        if finding.kind == "out of bounds":
            shape = " x ".join(map(str, finding.shape))
            self.error(
                f"block {block} reaches {point}{at}, outside the buffer ({shape}): TVM sized the "
                "buffer or the block's loops without an `if` the schedule depends on (TVM 0.27)",
                span,
                "compute the blocks at loops outside the guarded, fused or strided ones, or pick "
                "split factors that divide the extents",
            )
            return
        if finding.kind == "wiped":
            self.error(
                f"block {block} starts {point} over again{at}, after block {writers[0]} has "
                "added to it: the init runs more than once for a point (under a loop that "
                "feeds none of its iterators, or a fused one that comes back to the point) and "
                "updates come between the runs",
                self.decomposed_by or span,
                "decompose the reduction at a loop inside that loop, or leave it undecomposed",
            )
            return
        if finding.kind == "replayed":
            self.error(
                f"block {block} adds the same terms to {point} twice{at}, with no init between: "
                "a loop above it comes back to the point and runs the whole reduction again",
                self.decomposed_by or span,
                "keep each point's reduction in one iteration of the loops above it (compute the "
                "block at a loop that feeds its iterators one to one), or leave it undecomposed",
            )
            return
        if finding.kind == "late init":
            self.error(
                f"block {block}'s reduction starts {point} (its init) after it has added terms "
                "to it: loops fused from spatial and reduction loops run in another order than "
                "the fused one",
                self.reordered_by or span,
                "keep the parts of a loop fused from a reduction in their order, or fuse only "
                "spatial loops",
            )
            return
        by = ", ".join(writers)
        if where:
            message = (
                f"block {block} reads {point}{at}, in an iteration of the loops it shares with "
                f"block {by} in which {by} does not write it"
            )
        else:
            message = f"block {block} reads {point}, a point that block {by} never writes"
        self.error(
            message,
            span,
            "TVM sizes what a moved block computes from the loops alone: without the `if` of a "
            "split that does not divide its extent, as the box around the points of a fused or "
            "strided loop, or under the `if` of the block it joins (TVM 0.27); the kernel would "
            "read a value that is not computed yet",
            "compute the block at a loop outside the guarded, fused or strided loops, or pick "
            "split factors that divide the extents",
        )

    def last_moved(self, blocks: list[str]) -> Span | None:
        """The last statement that created or moved one of `blocks`, else the first block's
        section."""
        spans = [
            span
            for b in blocks
            for span in (self.moved_by.get(b), self.created_by.get(b))
            if span is not None
        ]
        if spans:
            return max(spans, key=lambda span: (span.line, span.column))
        return next((self.block_spans[b] for b in blocks if b in self.block_spans), None)

    def unrolled_copies_fit(self) -> None:
        """An unroll checked when written can grow later: a split of a loop inside it makes
        loops short enough for LLVM to unroll too (a 64-iteration unroll, then a split of the
        97-iteration loop inside by 2, 4 and 13: 154 s of LLVM; found by the differential
        fuzzer). Counted again once every statement is applied."""
        from schedlang.lang.statements.loop_kinds import unrolled_size_fits

        for block in self.nest.block_names():
            if block in self.unknown_blocks:
                continue
            unrolled = [x for x in self.nest.loops(block) if x.annotation == "unrolled"]
            if unrolled:
                span = self.unrolled_by.get(self.nest.sch.get_sref(unrolled[0].rv))
                unrolled_size_fits(self, unrolled[0], block, span or self.block_spans.get(block))

    def bind_span(self, thread: str, extent: int) -> Span | None:
        spans = [b.span for b in self.binds if b.thread == thread and b.extent == extent]
        return spans[0] if spans else None


def padded_extent_limit(extent: int) -> int:
    """How many iterations a guarded loop of `extent` may run (a split past the extent): twice
    the extent, or 1024 for a short loop."""
    return max(2 * extent, 1024)


def _describe_choices(choices: nodes.Choices) -> str:
    return format_choices(choices)
