"""Type-check a schedule against the op's loop nests and the target's limits.

The checker walks the statements in order over a live schedule (schedlang.lang.nest), so every check
sees the loops as they are at that point: their names, extents, kinds and bindings. Each statement
runs its guards (its entry in schedlang.lang.statements); a statement that passes is applied
(schedlang.checker.primitives.apply_statement) and anything TVM still rejects becomes a Diagnostic
at that statement. A statement that fails is skipped, and the names it would have created are marked
unknown-but-fine, so one mistake is reported once and never cascades. Every problem is reported
in one pass.

On a GPU target, a schedule that checks clean is then lowered as far as TVM's own GPU verifier
(`tvm.s_tir.analysis.verify_gpu_code`, as MetaSchedule runs it) needs, and what the verifier finds
(threads per block, shared memory as allocated, vector widths) is mapped back to the statement that
caused it: a bind, a cache_read or cache_write, a vectorize.

The parts: this module drives the pass and remembers what each statement did (provenance); names
are resolved and findings recorded by schedlang.checker.names; the guards and soundness rules are
the statements' own (schedlang.lang.statements, which see the checker as the `Checker` Protocol of
its facade module); the whole-kernel rules are schedlang.checker.kernel_rules, the GPU's among them
schedlang.checker.gpu_rules; TVM's GPU verifier and the mapping of its messages are
schedlang.checker.gpu_verifier. The limits are the target's (schedlang.core.target.Target).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from tvm import s_tir, tirx

from schedlang.checker import gpu_verifier, kernel_rules
from schedlang.checker.gpu_verifier import gpu_constraints, kernel_uses, lower_for_verification
from schedlang.checker.names import NameResolution, Skip
from schedlang.checker.primitives import Lowered, apply_statement, bind_knobs, finish, tvm_reason
from schedlang.checker.state import Bound
from schedlang.core.diagnostics import Diagnostic, Severity, Span, did_you_mean, one_of
from schedlang.core.target import Target
from schedlang.lang import nodes, statements
from schedlang.lang.nest import Loop, Nest, UncheckedSchedule
from schedlang.lang.printer import format_choices
from schedlang.lang.statements.facade import MadeBuffer

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
    partial: bool = False,
) -> CheckResult:
    """Check `schedule` on `func` for `target`; lower it when no error is found.

    A template (a schedule with knobs) is checked with the values in `knobs`; knobs without a value
    take their first candidate when `template_ok`, and are errors otherwise. A `partial` schedule
    is one whose result something else finishes before it is built (`apply`, `SchedulePass`
    before dlight): a GPU block it leaves unbound is a warning, not an error, and the rules that
    need a finished kernel (TVM's GPU verifier, the lowered kernel's buffers and dataflow) wait
    for the schedule that binds it.
    """
    checker = _Checker(func, target, strict, partial)
    concrete = checker.bind_knobs(schedule, dict(knobs or {}), template_ok)
    for stmt in concrete.statements:
        checker.statement(stmt)
    checker.finish()
    if strict:  # every warning, the whole-schedule rules' included
        checker.diagnostics = [_as_error(d) for d in checker.diagnostics]
    lowered = None
    if not any(d.is_error for d in checker.diagnostics):
        lowered = finish(checker.nest, concrete, finished=not checker.unbound)
        if target.is_gpu and not checker.unbound:
            gpu_verifier.verify_lowered(checker, lowered.func)
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


class _Checker(NameResolution):
    """One pass over a schedule: each statement's guards, then the statement applied; what it did
    remembered for the findings of later statements and of the whole-kernel rules."""

    def __init__(self, func: tirx.PrimFunc, target: Target, strict: bool, partial: bool = False):
        super().__init__(Nest(UncheckedSchedule(func, error_render_level="detail")), strict)
        self.partial = partial  # a GPU block may stay unbound: something else finishes it
        self.written = func  # the function as written, before any statement
        self.param_buffers = {param.name for param in func.params}
        self.target = target
        self.created_by: dict[str, Span] = {}  # block → the statement that created it
        self.decomposed: dict[str, int] = {}  # block → line of its decompose_reduction
        self.read_caches: set[str] = set()  # the copy blocks made by cache_read
        self.reordered_by: Span | None = None  # the last reorder or tile
        self.decomposed_by: Span | None = None  # the last decompose_reduction
        # For the GPU verifier's findings, which name no statement: what each one did.
        self.binds: list[Bound] = []
        self.vectorized: list[tuple[int | None, nodes.Name]] = []  # (extent, axis)
        self.buffer_made_by: dict[str, Span] = {}  # cache buffer → its cache_read/cache_write
        self.aligned_by: dict[str, Span] = {}  # buffer → its storage_align
        self.unrolled_by: dict[object, Span] = {}  # loop sref → its unroll or pragma
        self.made_buffers: dict[str, MadeBuffer] = {}  # rfactor's and pad's, sized at the end
        self.unbound: dict[str, Diagnostic] = {}  # GPU blocks with no thread binding (finish)

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
                raise Skip  # its unbound knob is already reported
            checking = statements.CHECKING[spec.keyword]
            checking.guard(self, stmt, block)
        except Skip:
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
        if checking.soundness is not None:
            checking.soundness(self, stmt, block)
        self.after(checking, stmt, block)

    def after(self, checking: statements.Checking, stmt: nodes.Stmt, block: str) -> None:
        spec = checking.statement
        for created in spec.creates_blocks(stmt, block):
            self.created_by[created] = stmt.span
        moved = spec.moves_block(stmt)
        if moved is not None:
            self.moved_by[moved] = stmt.span
        if stmt.keyword in ("reorder", "tile"):
            self.reordered_by = stmt.span
        if stmt.keyword == "decompose_reduction":
            self.decomposed_by = stmt.span
        if checking.provenance is not None:
            checking.provenance(self, stmt, block)
        if self.target.is_gpu and checking.record is not None:
            checking.record(self, stmt, block)

    def finish(self) -> None:
        """The whole-schedule rules, once every statement is checked."""
        kernel_rules.check_kernel(self)

    # --- provenance: what earlier statements did --------------------------------------------------

    def record_bind(self, thread: str, extent: int | None, span: Span) -> None:
        self.binds.append(Bound(thread, extent, span))

    def kernel_threads(self, block: str, besides: Loop) -> dict[str, tuple[int, int]]:
        """The threads bound now in the kernel of `block` by loops other than `besides`:
        thread → (extent, line of its bind). Read off the live nest, since unroll, vectorize
        and a second bind replace a binding."""
        kernel, threads = self.kernel_of(block), dict[str, tuple[int, int]]()
        rebound = self.nest.sch.get_sref(besides.rv)
        for other in self.nest.block_names():
            if other in self.unknown_blocks or self.kernel_of(other) != kernel:
                continue
            for loop in self.nest.loops(other):
                thread, extent = loop.thread, loop.extent
                if thread is None or extent is None or thread in threads:
                    continue
                if self.nest.sch.get_sref(loop.rv).same_as(rebound):
                    continue
                span = self.bind_span(thread, extent)
                threads[thread] = (extent, span.line if span else 0)
        return threads

    def kernel_of(self, block: str) -> object:
        """A GPU kernel is launched at the outermost loop bound to a thread (blockIdx or
        threadIdx; the loops above it run on the host, as TVM's UnifyThreadBinding and
        SplitHostDevice split it): key it by that loop's sref, or by the outermost loop where
        none is bound yet. Two threadIdx.x loops side by side under a host loop are two
        kernels, each with its own extent (TVM's test_bind2)."""
        loops = self.nest.loops(block)
        bound = [loop for loop in loops if loop.thread is not None]
        outermost = bound[0] if bound else loops[0] if loops else None
        return self.nest.sch.get_sref(outermost.rv) if outermost is not None else block

    def bind_span(self, thread: str, extent: int | None) -> Span | None:
        """The first `bind` of `thread` to a loop of `extent`."""
        spans = [b.span for b in self.binds if b.thread == thread and b.extent == extent]
        return spans[0] if spans else None


def _describe_choices(choices: nodes.Choices) -> str:
    return format_choices(choices)
