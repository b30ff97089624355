"""Type-check a schedule against the op's loop nests and the target's limits.

The checker walks the statements in order over a live schedule (schedlang.nest), so every check
sees the loops as they are at that point: their names, extents, kinds and bindings. Each statement
runs its guards; a statement that passes is applied (schedlang.lower.apply_statement) and anything
TVM still rejects becomes a Diagnostic at that statement. A statement that fails is skipped, and
the names it would have created are marked unknown-but-fine, so one mistake is reported once and
never cascades. Every problem is reported in one pass.

On a GPU target, a schedule that checks clean is then lowered as far as TVM's own GPU verifier
(`tvm.s_tir.analysis.verify_gpu_code`, as MetaSchedule runs it) needs, and what the verifier finds
(threads per block, shared memory as allocated, vector widths) is mapped back to the statement that
caused it: a bind, a cache_read or cache_write, a vectorize.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import tvm
from tvm import s_tir, tirx

from schedlang import ast, make_callable
from schedlang.diagnostics import (
    Diagnostic,
    Span,
    did_you_mean,
    error,
    one_of,
    warning,
)
from schedlang.lower import Lowered, apply_statement, bind_knobs, finish, tvm_reason
from schedlang.nest import Loop, LoopKind, Nest
from schedlang.target import Target

UNROLL_WARN_EXTENT = 512
# Straight-line copies of a loop body past which LLVM's build time explodes (measured on 2 cores:
# 1940 copies of a multiply-add reading a local cache build in 3 s, 3686 in 20 s; 6144 copies of
# an integer multiply-add in 66 s, 15360 in 141 s), and the trip count up to which LLVM unrolls a
# constant inner loop fully on its own.
UNROLL_MAX_COPIES = 2048
LLVM_FULL_UNROLL = 64
MAX_LOOP_NAME = 1024  # characters of a TVM loop variable's name (see check_Fuse)
# The widest vector LLVM builds quickly when its loads are strided (gathers): measured for int32,
# 128 lanes in 2.5 s, 256 in 17 s, 512 in 141 s. Found by fuzzing (tests/test_fuzz.py).
CPU_MAX_LANES = 128
GPU_MAX_LANES = 8  # the widest vector type TVM's CUDA code generator emits
# The limits MetaSchedule's VerifyGPUCode postproc adds to the target's: virtual threads per axis,
# and the bytes one vector load or store may move (128 bits).
GPU_MAX_VTHREAD = 8
GPU_COPIED_VTHREADS = 16  # TVM interleaves fewer virtual threads than this by copying the body
GPU_MAX_VECTOR_BYTES = 16
# TVM indexes buffers with int32 unless a buffer is declared int64: a buffer a statement makes
# (rfactor's, a storage-aligned one) must stay under this many elements, or its indices overflow.
INT32_ELEMENTS = 2**31 - 1
# The largest buffer a statement may add to the kernel's memory (rfactor multiplies the output by
# the reduction's extent: a 1000 x 999 x 997 matmul's C_rf is 4 GB).
MAX_MADE_BUFFER_BYTES = 2**30


@dataclass
class CheckResult:
    diagnostics: list[Diagnostic]
    lowered: Lowered | None  # None when there were errors

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)


def check(
    schedule: ast.Schedule,
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
    lowered = None
    if not any(d.is_error for d in checker.diagnostics):
        lowered = finish(checker.nest, concrete)
        if target.is_gpu:
            checker.verify_lowered(lowered.func)
            if any(d.is_error for d in checker.diagnostics):
                lowered = None
    return CheckResult(sorted(checker.diagnostics, key=_position), lowered)


@dataclass
class PrefixCheck:
    """A schedule's first statements checked as a prefix of a longer one: what per-statement
    decoding needs to decide what may come next (schedlang.stepwise)."""

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


def check_prefix(schedule: ast.Schedule, func: tirx.PrimFunc, target: Target) -> PrefixCheck:
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


def _position(diagnostic: Diagnostic) -> tuple[int, int]:
    span = diagnostic.span
    return (span.line, span.column) if span else (10**9, 0)


class _Skip(Exception):
    """The statement touches a name an earlier error left undefined: skip it silently."""


@dataclass
class _Kernel:
    """Thread bindings seen in one GPU kernel (one outermost loop nest)."""

    extents: dict[str, tuple[int, int]] = field(default_factory=dict)  # thread → (extent, line)


@dataclass(frozen=True)
class _Bound:
    """One `bind` statement: the thread axis, the loop's extent and where it was written."""

    thread: str
    extent: int | None
    span: Span


class _Checker:
    def __init__(self, func: tirx.PrimFunc, target: Target, strict: bool):
        self.nest = Nest(s_tir.Schedule(func, error_render_level="detail"))
        self.param_buffers = {param.name for param in func.params}
        self.target = target
        self.strict = strict
        self.diagnostics: list[Diagnostic] = []
        self.block: str | None = None  # the current section's block
        self.block_spans: dict[str, Span] = {}  # block → the start of its first section
        self.unknown_blocks: set[str] = set()  # blocks an earlier error left undefined
        self.unknown_axes: set[tuple[str, str]] = set()  # (block, axis) likewise
        self.kernels: dict[object, _Kernel] = {}
        self.created_by: dict[str, Span] = {}  # block → the statement that created it
        self.decomposed: dict[str, int] = {}  # block → line of its decompose_reduction
        self.failed_binds: set[str] = set()  # blocks with a rejected `bind`: already reported
        self.moved_by: dict[str, Span] = {}  # block → the last compute_at that moved it
        self.read_caches: set[str] = set()  # the copy blocks made by cache_read
        # For the GPU verifier's findings, which name no statement: what each one did.
        self.binds: list[_Bound] = []
        self.vectorized: list[tuple[int | None, ast.Name]] = []  # (extent, axis)
        self.buffer_made_by: dict[str, Span] = {}  # cache buffer → its cache_read/cache_write
        self.aligned_by: dict[str, Span] = {}  # buffer → its storage_align
        self.unrolled_by: dict[object, Span] = {}  # loop sref → its unroll or pragma
        self.unbound: dict[str, Diagnostic] = {}  # GPU blocks with no thread binding (finish)

    # --- reporting -------------------------------------------------------------------------------

    def error(self, message: str, span: Span | None, *notes: str) -> None:
        self.diagnostics.append(error(message, span, *notes))

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
        self, schedule: ast.Schedule, values: dict[str, int], template_ok: bool
    ) -> ast.Schedule:
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
            for factor in _factors(stmt):
                if not isinstance(factor, ast.KnobFactor):
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

    def statement(self, stmt: ast.Stmt) -> None:
        if isinstance(stmt, ast.BlockHeader):
            self.enter_block(stmt)
            return
        if isinstance(stmt, ast.Param):
            return
        # Only this statement's diagnostics: counting them all, each time, made a long file's
        # check quadratic.
        reported_before = len(self.diagnostics)
        try:
            block = self.current_block(stmt.span)
            # Whole-schedule findings about a block point at its section: its header, or else
            # its first statement.
            self.block_spans.setdefault(block, stmt.span)
            if any(isinstance(f, ast.KnobFactor) for f in _factors(stmt)):
                raise _Skip  # its unbound knob is already reported
            guard = getattr(self, f"check_{type(stmt).__name__}")
            guard(stmt, block)
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
        self.applied_soundly(stmt, block)
        self.after(stmt, block)

    def error_count(self) -> int:
        return sum(d.is_error for d in self.diagnostics)

    def enter_block(self, header: ast.BlockHeader) -> None:
        name = header.block.text
        self.block = name
        self.block_spans.setdefault(name, header.block.span)
        if name in self.unknown_blocks or self.nest.has_block(name):
            return
        blocks = self.nest.block_names()
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

    def mark_unknown(self, stmt: ast.Stmt) -> None:
        """Record the names a skipped statement would have made, so later uses stay quiet."""
        block = self.block or "<none>"
        match stmt:
            case ast.Split(axis=axis):
                names = (axis.text, *stmt.derived_names)
            case ast.Tile(axes=axes):
                names = tuple(n for a in axes for n in (a.text, *ast.derived_axis_names(a.text, 2)))
            case ast.Fuse(axes=axes):
                names = (*(a.text for a in axes), stmt.fused_name)
            case _:
                names = ()
        self.unknown_axes |= {(block, n) for n in names}
        self.unknown_blocks |= set(_created_blocks(stmt, block))
        if isinstance(stmt, ast.Bind):
            self.failed_binds.add(block)

    def after(self, stmt: ast.Stmt, block: str) -> None:
        for created in _created_blocks(stmt, block):
            self.created_by[created] = stmt.span
        if isinstance(stmt, ast.ComputeAt | ast.ReverseComputeAt):
            self.moved_by[stmt.block.text] = stmt.span
        if isinstance(stmt, ast.CacheRead):
            self.read_caches.update(_created_blocks(stmt, block))
        if isinstance(stmt, ast.DecomposeReduction):
            self.decomposed[stmt.block.text if stmt.block else block] = stmt.span.line
        if self.target.is_gpu:
            self.record_for_verifier(stmt, block)

    def record_for_verifier(self, stmt: ast.Stmt, block: str) -> None:
        match stmt:
            case ast.Bind(axis=axis, thread=thread):
                loop = self.nest.find(block, axis.text)
                self.binds.append(_Bound(thread.text, loop.extent if loop else None, stmt.span))
            case ast.Vectorize(axis=axis):
                loop = self.nest.find(block, axis.text)
                self.vectorized.append((loop.extent if loop else None, axis))
            case ast.CacheRead() | ast.CacheWrite():
                # cache_read: the copy block writes the cache; cache_write: the block computes
                # into it.
                writer = (
                    _created_blocks(stmt, block)[0]
                    if isinstance(stmt, ast.CacheRead)
                    else stmt.block.text
                )
                buffer = self.nest.write_buffer(writer)
                if buffer is not None:
                    self.buffer_made_by[buffer.name] = stmt.span
            case ast.StorageAlign(block=aligned):
                buffer = self.nest.write_buffer(aligned.text)
                if buffer is not None:
                    self.aligned_by[buffer.name] = stmt.span
            case ast.Unroll(axis=axis) | ast.Pragma(axis=axis):
                loop = self.nest.find(block, axis.text)
                if loop is not None:
                    self.unrolled_by[self.nest.sch.get_sref(loop.rv)] = stmt.span

    def not_decomposed(self, stmt: ast.Stmt, block: str) -> None:
        """TVM cannot vectorize or parallelize the loops of a reduction after its init was split
        off ("does not have compact dataflow"): say so in words."""
        line = self.decomposed.get(block)
        self.require(
            line is None,
            f"`{stmt.keyword}` must come before `decompose_reduction` (line {line})",
            stmt.span,
            "put decompose_reduction last in the block's section",
        )

    # --- name resolution -------------------------------------------------------------------------

    def axis(self, name: ast.Name, block: str) -> Loop:
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
            # compute_at regenerates the moved block's own loops (TVM names them ax0, ax1, …).
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

    def axes(self, names: Iterable[ast.Name], block: str) -> list[Loop]:
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

    def existing_block(self, name: ast.Name) -> str:
        if name.text in self.unknown_blocks:
            raise _Skip
        if self.nest.has_block(name.text):
            return name.text
        blocks = self.nest.block_names()
        self.error(
            f"unknown block `{name.text}`",
            name.span,
            did_you_mean(name.text, blocks),
            one_of(blocks, "blocks"),
        )
        raise _Skip

    def distinct(self, names: tuple[ast.Name, ...]) -> None:
        seen: set[str] = set()
        for name in names:
            self.require(name.text not in seen, f"axis `{name.text}` is listed twice", name.span)
            seen.add(name.text)

    def factor_fits(self, factor: int, loop: Loop, span: Span, what: str = "factor") -> bool:
        if not self.require(factor > 0, f"{what} must be positive, got {factor}", span):
            return False
        if loop.extent is None:
            return True
        return self.require(
            factor <= loop.extent,
            f"{what} {factor} is larger than the extent {loop.extent} of `{loop.name}`",
            span,
        )

    def new_names_free(self, names: Iterable[str], block: str, span: Span) -> None:
        existing = {loop.name for loop in self.nest.loops(block)}
        for name in names:
            self.require(
                name not in existing,
                f"`{name}` already names a loop of block {block}",
                span,
                "choose another name with `as`",
            )

    # --- loop transformations --------------------------------------------------------------------

    def check_Split(self, stmt: ast.Split, block: str) -> None:
        loop = self.axis(stmt.axis, block)
        known = [f for f in stmt.parts if isinstance(f, ast.IntFactor)]
        if not all(self.factor_fits(f.value, loop, f.span) for f in known):
            return
        self.new_names_free(stmt.derived_names, block, stmt.span)
        product = math.prod(f.value for f in known)
        if loop.extent is None:
            return
        if len(known) == len(stmt.parts):  # every factor given: they must cover the extent
            self.require(
                product >= loop.extent,
                f"factors multiply to {product}, less than the extent {loop.extent} "
                f"of `{loop.name}`",
                stmt.span,
                "use `*` for the factor to infer",
            )
            if product > loop.extent:
                self.warn_or_error(
                    f"factors multiply to {product}, more than the extent {loop.extent} of "
                    f"`{loop.name}`: TVM adds a guard",
                    stmt.span,
                )
            return
        self.require(
            product <= loop.extent,
            f"factors multiply to {product}, more than the extent {loop.extent} of `{loop.name}`",
            stmt.span,
        )
        if product <= loop.extent and loop.extent % product:
            self.warn_or_error(
                f"extent {loop.extent} of `{loop.name}` is not divisible by {product}: "
                "TVM adds a guard (an `if` in the loop body)",
                stmt.span,
                _divisors_note(loop.extent, product),
            )

    def check_Tile(self, stmt: ast.Tile, block: str) -> None:
        self.distinct(stmt.axes)
        loops = self.axes(stmt.axes, block)
        for loop, factor in zip(loops, stmt.factors, strict=True):
            assert isinstance(factor, ast.IntFactor)
            if self.factor_fits(factor.value, loop, factor.span) and loop.extent:
                if loop.extent % factor.value:
                    self.warn_or_error(
                        f"extent {loop.extent} of `{loop.name}` is not divisible by "
                        f"{factor.value}: TVM adds a guard",
                        factor.span,
                        _divisors_note(loop.extent, factor.value),
                    )
        names = [n for a in stmt.axes for n in ast.derived_axis_names(a.text, 2)]
        self.new_names_free(names, block, stmt.span)

    def check_Reorder(self, stmt: ast.Reorder, block: str) -> None:
        self.distinct(stmt.axes)
        self.axes(stmt.axes, block)

    def check_Fuse(self, stmt: ast.Fuse, block: str) -> None:
        self.distinct(stmt.axes)
        loops = self.axes(stmt.axes, block)
        order = [loop.name for loop in self.nest.loops(block)]
        positions = [order.index(loop.name) for loop in loops]
        for (a, pa), (b, pb) in zip(zip(loops, positions), zip(loops[1:], positions[1:])):  # noqa: B905
            if pb == pa + 1:
                continue
            if pb < pa:
                self.error(
                    f"fuse lists `{b.name}` after `{a.name}`, but it is the outer loop",
                    stmt.span,
                    "list the loops outer to inner: "
                    + ", ".join(order[min(positions) : max(positions) + 1]),
                )
            else:
                between = ", ".join(f"`{n}`" for n in order[pa + 1 : pb])
                self.error(
                    f"fuse needs adjacent loops: {between} lies between `{a.name}` and `{b.name}`",
                    stmt.span,
                    "reorder them first",
                )
            return
        self.new_names_free([stmt.fused_name], block, stmt.span)
        # TVM names a fused loop after all of its loops (`i_0_i_1_fused`), so fusing the parts of a
        # split again doubles the name each round: 25 rounds take gigabytes. Found by a long-file
        # test (tests/test_fuzz.py).
        length = len("_".join(self.nest.sch.get(loop.rv).loop_var.name for loop in loops)) + 6
        self.require(
            length <= MAX_LOOP_NAME,
            f"fuse would give TVM's loop a {length}-character name, more than {MAX_LOOP_NAME}: "
            "each split and fuse of the same loop doubles it",
            stmt.span,
            "split the fused loop once instead of splitting and fusing it again",
        )

    # --- loop kinds ------------------------------------------------------------------------------

    def check_Bind(self, stmt: ast.Bind, block: str) -> None:
        thread = stmt.thread.text
        if not self.require(
            self.target.is_gpu,
            f"`bind` needs a GPU target, not {self.target.kind}",
            stmt.span,
            "on a CPU, run loops on several cores with `parallel`",
        ):
            return
        self.not_decomposed(stmt, block)
        loop = self.axis(stmt.axis, block)
        self.require(
            loop.thread is None, f"`{loop.name}` is already bound to {loop.thread}", stmt.axis.span
        )
        if loop.kind in (LoopKind.REDUCE, LoopKind.MIXED) and not thread.startswith("threadIdx"):
            self.error(
                f"cannot bind reduction axis `{loop.name}` to {thread}",
                stmt.axis.span,
                "rfactor it first (`rfactor …`), or bind it to threadIdx.* for a "
                "cross-thread reduction",
            )
            return
        if loop.extent is None:
            return
        dim = "xyz".index(thread[-1])
        if thread.startswith("threadIdx") and self.target.max_thread_extent:
            limit = self.target.max_thread_extent[dim]
            if not self.require(
                loop.extent <= limit,
                f"{thread} extent {loop.extent} exceeds the target's limit of {limit}",
                stmt.span,
                f"split `{loop.name}` by {limit} or less, and bind the inner loop",
            ):
                return
        if thread.startswith("vthread") and loop.extent > GPU_MAX_VTHREAD:
            self.diagnostics.append(
                warning(
                    f"{loop.extent} virtual threads on {thread}, more than the "
                    f"{GPU_MAX_VTHREAD} MetaSchedule's GPU checks allow",
                    stmt.span,
                    "TVM interleaves the code of fewer than 16 virtual threads and runs more as "
                    f"a loop; split `{loop.name}` and bind at most {GPU_MAX_VTHREAD}",
                )
            )
        if thread.startswith("blockIdx") and self.target.max_grid_extent:
            limit = self.target.max_grid_extent[dim]
            self.require(
                loop.extent <= limit,
                f"{thread} extent {loop.extent} exceeds the grid limit of {limit}",
                stmt.span,
            )
        kernel = self.kernels.setdefault(self.kernel_of(block), _Kernel())
        if thread in kernel.extents:
            extent, line = kernel.extents[thread]
            self.require(
                extent == loop.extent,
                f"{thread} is bound to extent {loop.extent} here but to {extent} at "
                f"line {line} in the same kernel",
                stmt.span,
                "every loop bound to one thread axis must have the same extent",
            )
            return
        kernel.extents[thread] = (loop.extent, stmt.span.line)
        threads = {t: e for t, (e, _) in kernel.extents.items() if t.startswith("threadIdx")}
        total = math.prod(threads.values())
        limit = self.target.max_threads_per_block or total
        if total > limit:
            shape = " x ".join(
                f"{e} ({t})" for t, e in sorted(threads.items()) if t.startswith("threadIdx")
            )
            self.error(
                f"{total} threads per block, more than the target's {limit}",
                stmt.span,
                f"threads: {shape}",
            )

    def kernel_of(self, block: str) -> object:
        """A GPU kernel is one outermost loop nest: key it by that loop's sref."""
        loops = self.nest.loops(block)
        return self.nest.sch.get_sref(loops[0].rv) if loops else block

    def check_Vectorize(self, stmt: ast.Vectorize, block: str) -> None:
        self.not_decomposed(stmt, block)
        loop = self.axis(stmt.axis, block)
        if not self.keeps_binding(loop, stmt):
            return
        if not self.require(
            loop.kind is not LoopKind.REDUCE and loop.kind is not LoopKind.MIXED,
            f"cannot vectorize reduction axis `{loop.name}`",
            stmt.axis.span,
            "vectorize a spatial axis, or rfactor the reduction first",
        ):
            return
        loops = self.nest.loops(block)
        innermost = loops[-1].name
        if not self.require(
            loop.name == innermost,
            f"vectorize needs the innermost loop; `{loop.name}` has "
            f"{_inside(loops, loop)} inside it",
            stmt.axis.span,
            f"`reorder` to make `{loop.name}` innermost, or vectorize `{innermost}`",
        ):
            return
        # Another block under the loop shares a buffer with this one, which TVM would vectorize
        # as one scalar: the result is wrong.
        inside = [self.nest.sch.get(rv).name_hint for rv in self.nest.sch.get_child_blocks(loop.rv)]
        if not self.require(
            len(inside) == 1,
            f"vectorize needs a loop holding one block; `{loop.name}` holds blocks "
            + ", ".join(inside),
            stmt.axis.span,
            f"split `{loop.name}`, vectorize the inner part and compute the other block at "
            "the outer part",
        ):
            return
        if loop.extent is None:
            self.error(f"cannot vectorize `{loop.name}`: its extent is not a constant", stmt.span)
            return
        dtype = self.nest.write_dtype(block)
        lanes = self.target.vector_lanes(dtype)
        if not self.target.is_gpu and not self.require(
            loop.extent <= CPU_MAX_LANES,
            f"vectorizing {loop.extent} lanes, more than the {CPU_MAX_LANES} LLVM builds in "
            "seconds",
            stmt.axis.span,
            f"split it first: `split {loop.name} by {lanes}` and vectorize `{loop.name}.i`",
        ):
            return
        if not self.target.is_gpu and loop.extent > 4 * lanes:
            self.diagnostics.append(
                warning(
                    f"vectorizing {loop.extent} lanes; the target's SIMD holds {lanes} x {dtype}",
                    stmt.axis.span,
                    f"split it first: `split {loop.name} by {lanes}` and vectorize `{loop.name}.i`",
                )
            )
        if self.target.is_gpu and loop.extent > GPU_MAX_LANES:
            self.error(
                f"CUDA has no vector type of {loop.extent} x {dtype}; TVM builds at most "
                f"{GPU_MAX_LANES} lanes",
                stmt.axis.span,
                f"split it first: `split {loop.name} by {lanes}` and vectorize `{loop.name}.i`",
            )
        elif self.target.is_gpu and loop.extent > lanes:
            self.diagnostics.append(
                warning(
                    f"vectorizing {loop.extent} lanes on a GPU; a thread loads at most "
                    f"{lanes} x {dtype} at once",
                    stmt.axis.span,
                )
            )

    def keeps_binding(self, loop: Loop, stmt: ast.Stmt) -> bool:
        """Unroll and vectorize replace a loop's thread binding: its kernel can't be launched."""
        return self.require(
            loop.thread is None,
            f"`{loop.name}` is bound to {loop.thread}; `{stmt.keyword}` would undo the binding",
            stmt.span,
            f"split `{loop.name}` and {stmt.keyword} the inner loop",
        )

    def check_Unroll(self, stmt: ast.Unroll, block: str) -> None:
        loop = self.axis(stmt.axis, block)
        if not self.keeps_binding(loop, stmt):
            return
        if not self.unrolled_size_fits(loop, block, stmt.axis.span):
            return
        if loop.extent is not None and loop.extent > UNROLL_WARN_EXTENT:
            self.diagnostics.append(
                warning(
                    f"unrolling {loop.extent} iterations makes the code large",
                    stmt.axis.span,
                    f"split it first, or unroll at most {UNROLL_WARN_EXTENT}",
                )
            )

    def unrolled_size_fits(self, loop: Loop, block: str, span: Span) -> bool:
        """On a CPU, the copies of the body that unrolling `loop` lays out: every unrolled loop of
        the block, times the other loops inside the outermost one when they are short enough for
        LLVM to unroll them too. Past UNROLL_MAX_COPIES the build takes minutes. Found by fuzzing
        (tests/test_fuzz.py). On a GPU TVM unrolls the loop in TIR before NVRTC or nvcc sees it:
        a 10^6-iteration unroll compiled for minutes at 1.6 GB, so the same limit holds."""
        loops = self.nest.loops(block)
        unrolled = [x for x in loops if x.annotation == "unrolled" or x.name == loop.name]
        outermost = min(loops.index(x) for x in unrolled)
        inside = math.prod(
            x.extent or 1
            for x in loops[outermost + 1 :]
            if x not in unrolled and x.annotation != "vectorized"
        )
        inside = inside if inside <= LLVM_FULL_UNROLL and not self.target.is_gpu else 1
        copies = math.prod(x.extent or 1 for x in unrolled) * inside
        factors = [f"`{x.name}` {x.extent}" for x in unrolled]
        factors += [f"{inside} iterations inside"] if inside > 1 else []
        return self.require(
            copies <= UNROLL_MAX_COPIES,
            f"unrolling `{loop.name}` makes {copies} copies of the loop body, more than the "
            f"{UNROLL_MAX_COPIES} {self.compiler()} builds in seconds",
            span,
            "copies: " + " x ".join(factors),
            f"split `{loop.name}` and unroll its inner part",
        )

    def compiler(self) -> str:
        return "the CUDA compiler" if self.target.is_gpu else "LLVM"

    def check_Parallel(self, stmt: ast.Parallel, block: str) -> None:
        self.not_decomposed(stmt, block)
        if not self.require(
            not self.target.is_gpu,
            "`parallel` is for CPU targets",
            stmt.span,
            "on a GPU, bind the loop to blockIdx.x",
        ):
            return
        loop = self.axis(stmt.axis, block)
        self.require(
            loop.kind not in (LoopKind.REDUCE, LoopKind.MIXED),
            f"cannot parallelize reduction axis `{loop.name}`",
            stmt.axis.span,
            "threads would race on the accumulator; parallelize a spatial axis, or "
            "rfactor the reduction first",
        )
        loops = self.nest.loops(block)
        position = loops.index(loop)
        outer = [o.name for o in loops[:position] if o.annotation == "parallel"]
        inner = [i.name for i in loops[position + 1 :] if i.annotation == "parallel"]
        if outer or inner:
            self.error(
                f"`{loop.name}` is inside parallel loop `{outer[0]}`"
                if outer
                else f"`{loop.name}` holds parallel loop `{inner[0]}`",
                stmt.axis.span,
                "TVM's thread pool cannot nest parallel loops: fuse them and parallelize once",
            )

    # --- blocks and buffers ----------------------------------------------------------------------

    def scope_ok(self, scope: ast.Name) -> bool:
        shared = scope.text.startswith("shared") or scope.text == "warp"
        return self.require(
            not shared or self.target.is_gpu,
            f"`{scope.text}` memory exists only on GPUs, not on {self.target.kind}",
            scope.span,
            "on a CPU use `global` (a packed copy) or `local`",
        )

    def check_CacheRead(self, stmt: ast.CacheRead, block: str) -> None:
        reads = list(dict.fromkeys(self.nest.reads(block)))
        self.require(
            stmt.buffer.text in reads,
            f"block {block} does not read `{stmt.buffer.text}`",
            stmt.buffer.span,
            did_you_mean(stmt.buffer.text, reads),
            one_of(reads, f"block {block} reads"),
        )
        self.scope_ok(stmt.scope)
        if stmt.at is not None:
            self.at_loop(stmt.at, block)
        self.new_block_free(stmt, block)

    def check_CacheWrite(self, stmt: ast.CacheWrite, block: str) -> None:
        written = self.existing_block(stmt.block)
        self.require(
            bool(self.nest.writes(written)), f"block {written} writes no buffer", stmt.block.span
        )
        self.scope_ok(stmt.scope)
        if stmt.at is not None:
            self.at_loop(stmt.at, block)
        self.new_block_free(stmt, block)

    def new_block_free(self, stmt: ast.Stmt, block: str) -> None:
        for name in _created_blocks(stmt, block):
            if not self.require(
                not self.nest.has_block(name),
                f"a block named `{name}` already exists",
                stmt.span,
                "name the new block with `as NAME`",
            ):
                return
        # TVM names the new block itself (`as` only adds a schedlang name) and cannot tell two
        # blocks of one name apart afterwards.
        tvm_name = self.tvm_block_name(stmt, block)
        root = self.nest.sch.get_sblock("root")
        existing = {self.nest.sch.get(rv).name_hint for rv in self.nest.sch.get_child_blocks(root)}
        self.require(
            tvm_name not in existing,
            f"TVM would name the new block `{tvm_name}`, like an existing block",
            stmt.span,
            "TVM names a cache block after its buffer and scope: cache a buffer once per scope",
        )

    def tvm_block_name(self, stmt: ast.Stmt, block: str) -> str | None:
        match stmt:
            case ast.CacheRead(buffer=buffer, scope=scope):
                return f"{buffer.text}_{scope.text}"
            case ast.CacheWrite(block=written, scope=scope):
                buffer = self.nest.write_buffer(written.text)
                return f"{buffer.name}_{scope.text}" if buffer is not None else None
            case ast.Rfactor():
                return f"{self.nest.block_aliases.get(block, block)}_rf"
        return None

    def check_ComputeAt(self, stmt: ast.ComputeAt, block: str) -> None:
        moved = self.existing_block(stmt.block)
        self.require(moved != block, f"cannot compute block {block} at its own loop", stmt.span)
        self.keeps_guard(moved, stmt)
        loop = self.at_loop(stmt.axis, block)
        reads, _ = self.buffers_under(loop, moved)
        self.require(
            bool(reads & set(self.nest.writes(moved))),
            f"compute_at moves a producer into a loop of its consumer, but no block under "
            f"`{loop.name}` reads what block {moved} writes",
            stmt.span,
            f"to move a consumer after its producer, use `reverse_compute_at {moved} {loop.name}`",
        )

    def check_ReverseComputeAt(self, stmt: ast.ReverseComputeAt, block: str) -> None:
        # TVM checks only that the block's producers are under the loop, so it moves a block
        # with no producer block (one reading only inputs) anywhere, even after its consumers.
        moved = self.existing_block(stmt.block)
        self.require(moved != block, f"cannot compute block {block} at its own loop", stmt.span)
        self.keeps_guard(moved, stmt)
        loop = self.at_loop(stmt.axis, block)
        _, writes = self.buffers_under(loop, moved)
        self.require(
            bool(writes & set(self.nest.reads(moved))),
            f"reverse_compute_at moves a consumer into a loop of its producer, but block "
            f"{moved} reads nothing the blocks under `{loop.name}` write",
            stmt.span,
            f"to move a producer before its consumer, use `compute_at {moved} {loop.name}`",
        )

    def applied_soundly(self, stmt: ast.Stmt, block: str) -> None:
        """What TVM applied without complaint but computes wrong: checked on the result."""
        match stmt:
            case ast.CacheWrite(at=ast.Name() as at):
                self.copies_only_computed(stmt, block, at)
            case ast.ReverseComputeAt() | ast.ComputeAt():
                self.covers_domain(stmt)

    def copies_only_computed(self, stmt: ast.CacheWrite, block: str, at: ast.Name) -> None:
        """`cache_write … at L` copies back, in each iteration of L, the box around what the
        block wrote there. When the tile loops under L are strided (an inner tile loop reordered
        outside its outer one), the box holds points computed in other iterations, which TVM's
        per-iteration cache no longer has: the copy writes garbage over them (TVM 0.27)."""
        written = stmt.block.text
        loop = self.nest.find(block, at.text)
        copy = next(iter(_created_blocks(stmt, block)), None)
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

    def covers_domain(self, stmt: ast.ComputeAt | ast.ReverseComputeAt) -> None:
        """A moved block must still compute every point it writes that someone reads. TVM
        regenerates a consumer's loops over what its producer writes under the loop: a padding
        block moved into the loop of the copy of its input computes only the interior, and the
        border is never written (TVM 0.27). A producer keeps what its consumers under the loop
        read: that is all of it unless the producer writes an output of the function."""
        moved = stmt.block.text
        if isinstance(stmt, ast.ComputeAt) and not self.writes_output(moved):
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

    def writes_output(self, block: str) -> bool:
        return any(buffer in self.param_buffers for buffer in self.nest.writes(block))

    def keeps_guard(self, moved: str, stmt: ast.ComputeAt | ast.ReverseComputeAt) -> None:
        """TVM moves a block by regenerating its loops over its iterators' domains, dropping the
        `if` of a non-divisible split when the iterators are the split's parts (after rfactor): the
        moved block then reads and writes out of bounds. Found by fuzzing (tests/test_fuzz.py)."""
        self.require(
            not self.nest.guards_own_iterators(moved),
            f"`{stmt.keyword}` would drop the `if` that block {moved} runs under, and compute it "
            "out of bounds",
            stmt.block.span,
            f"block {moved} was made by rfactor of a split whose factor does not divide the "
            "extent: split by a divisor, or leave the block where it is",
        )

    def at_loop(self, name: ast.Name, block: str) -> Loop:
        """A loop another block is computed at. Not a vectorized one, nor one inside a vectorized
        loop (after a reorder moved it outward): TVM would then vectorize the buffer between the
        two blocks as one scalar and compute wrong values."""
        loop = self.axis(name, block)
        loops = self.nest.loops(block)
        outside = next(
            (x for x in loops[: loops.index(loop) + 1] if x.annotation == "vectorized"), None
        )
        if outside is not None:
            where = (
                f"vectorized loop `{loop.name}`"
                if outside.name == loop.name
                else f"`{loop.name}`, which is inside vectorized loop `{outside.name}`"
            )
            self.error(
                f"cannot compute another block inside {where}",
                name.span,
                "compute it at a loop outside the vectorized one",
            )
        return loop

    def buffers_under(self, loop: Loop, excluded: str) -> tuple[set[str], set[str]]:
        """The buffers read and written by the blocks under `loop`, except block `excluded`."""
        sch, excluded_rv = self.nest.sch, self.nest.block(excluded)
        blocks = [
            sch.get(rv)
            for rv in sch.get_child_blocks(loop.rv)
            if not sch.get_sref(rv).same_as(sch.get_sref(excluded_rv))
        ]
        reads = {region.source.name for b in blocks for region in b.reads}
        writes = {region.source.name for b in blocks for region in b.writes}
        return reads, writes

    def check_ComputeInline(self, stmt: ast.ComputeInline, block: str) -> None:
        self.existing_block(stmt.block)

    def check_ReverseComputeInline(self, stmt: ast.ReverseComputeInline, block: str) -> None:
        # TVM's own message for this case ("reads 1 region(s)") does not say what is wrong.
        inlined = self.existing_block(stmt.block)
        inputs = list(dict.fromkeys(self.nest.reads(inlined)))
        produced = {buffer for b in self.nest.block_names() for buffer in self.nest.writes(b)}
        self.require(
            any(buffer in produced for buffer in inputs),
            f"block {inlined} has no producer block to be inlined into: it reads only "
            + ", ".join(f"`{buffer}`" for buffer in inputs),
            stmt.block.span,
            "reverse_compute_inline moves a consumer into the block that produces its input",
        )

    def check_Rfactor(self, stmt: ast.Rfactor, block: str) -> None:
        loop = self.axis(stmt.axis, block)
        self.require(
            loop.kind is LoopKind.REDUCE,
            f"rfactor needs a reduction axis; `{loop.name}` is {loop.kind.value}",
            stmt.axis.span,
        )
        buffer = self.nest.write_buffer(block)
        if stmt.factor_axis is not None and buffer is not None:
            # TVM takes [-ndim - 1, ndim] of the written buffer; the grammar has no negatives.
            ndim = len(buffer.shape)
            self.require(
                stmt.factor_axis.value <= ndim,
                f"factor_axis {stmt.factor_axis.value} is out of range: `{buffer.name}` has "
                f"{ndim} dimensions, so the factored axis goes at 0 to {ndim}",
                stmt.factor_axis.span,
                f"0 puts the factored axis first in the shape of `{buffer.name}_rf`, {ndim} last",
            )
        guarded = self.nest.guarded_spatial_loops(block)
        self.require(
            not guarded,
            f"rfactor of block {block} would write past `{getattr(buffer, 'name', '?')}`: TVM "
            f"drops the `if` on {', '.join(f'`{x.name}`' for x in guarded)} from the final "
            "reduction block (a TVM bug)",
            stmt.span,
            "the `if` comes from a split whose factor does not divide the extent: split by a "
            "divisor, or rfactor before splitting",
        )
        if buffer is not None and loop.extent is not None:
            self.made_buffer_fits(
                f"{buffer.name}_rf",
                math.prod(int(d) for d in buffer.shape) * loop.extent,
                buffer.dtype,
                stmt.span,
                f"`{buffer.name}_rf` holds one `{buffer.name}` per iteration of `{loop.name}` "
                f"({loop.extent}): split `{loop.name}` and rfactor the inner part",
            )
        self.new_block_free(stmt, block)

    def made_buffer_fits(
        self, name: str, elements: int, dtype: object, span: Span, *notes: str
    ) -> bool:
        """A buffer a statement makes: int32 indices reach it, and it fits in memory."""
        size = elements * _dtype_bytes(str(dtype))
        if not self.require(
            elements <= INT32_ELEMENTS,
            f"`{name}` would hold {elements} elements, more than the {INT32_ELEMENTS} that "
            "TVM's int32 indices reach",
            span,
            *notes,
        ):
            return False
        return self.require(
            size <= MAX_MADE_BUFFER_BYTES,
            f"`{name}` would take {_format_bytes(size)}, more than the "
            f"{_format_bytes(MAX_MADE_BUFFER_BYTES)} one statement may add",
            span,
            *notes,
        )

    def check_DecomposeReduction(self, stmt: ast.DecomposeReduction, block: str) -> None:
        owner = self.existing_block(stmt.block) if stmt.block else block
        self.require(
            self.nest.is_reduction_block(owner),
            f"block {owner} is not a reduction",
            stmt.block.span if stmt.block else stmt.span,
        )
        self.axis(stmt.axis, owner)

    def check_StorageAlign(self, stmt: ast.StorageAlign, block: str) -> None:
        aligned = self.existing_block(stmt.block)
        buffer = self.nest.write_buffer(aligned)
        ndim = len(buffer.shape) if buffer is not None else 0
        self.require(
            0 <= stmt.dim.value < ndim,
            f"dim {stmt.dim.value} is out of range: buffer `{getattr(buffer, 'name', '?')}` "
            f"has {ndim} dimensions",
            stmt.dim.span,
        )
        self.require(
            stmt.factor.value > 0,
            f"factor must be positive, got {stmt.factor.value}",
            stmt.factor.span,
        )
        if not self.require(
            0 <= stmt.offset.value < max(stmt.factor.value, 1),
            f"offset {stmt.offset.value} must be at least 0 and below the factor "
            f"{stmt.factor.value}",
            stmt.offset.span,
        ):
            return
        if buffer is None or not 0 <= stmt.dim.value < ndim:
            return
        shape = [int(d) for d in buffer.shape]
        dim, factor, offset = stmt.dim.value, stmt.factor.value, stmt.offset.value
        stride = math.prod(shape[dim + 1 :])
        aligned = stride + (offset - stride) % factor
        self.made_buffer_fits(
            buffer.name,
            math.prod(shape[: dim + 1]) * aligned,
            buffer.dtype,
            stmt.factor.span,
            f"aligning dim {dim} to {factor} pads its stride from {stride} to {aligned} "
            "elements: use a factor like 32 or 64",
        )

    def check_Pragma(self, stmt: ast.Pragma, block: str) -> None:
        self.axis(stmt.axis, block)
        for item in stmt.items:
            assert isinstance(item.value, ast.IntFactor)
            value = item.value.value
            # The parser only lets these keys through; a schedule built as an AST is checked too,
            # since the key becomes a TVM annotation on the loop.
            if not self.require(
                item.key.text in ast.PRAGMA_KEYS,
                f"unknown pragma key `{item.key.text}`",
                item.key.span,
                did_you_mean(item.key.text, ast.PRAGMA_KEYS),
                one_of(ast.PRAGMA_KEYS, "pragma keys"),
            ):
                continue
            if item.key.text == "unroll_explicit":
                self.require(
                    value in (0, 1), f"unroll_explicit takes 0 or 1, got {value}", item.value.span
                )
            elif self.require(
                value >= 0, f"{item.key.text} must be at least 0, got {value}", item.value.span
            ):
                self.auto_unroll_fits(value, stmt, block, item.value.span)

    def auto_unroll_fits(self, max_step: int, stmt: ast.Pragma, block: str, span: Span) -> None:
        """auto_unroll_max_step unrolls the loops under the pragma up to `max_step` iterations of
        the body: on a CPU, as many copies as `unroll` makes. Found by fuzzing."""
        loops = self.nest.loops(block)
        loop = self.axis(stmt.axis, block)
        iterations = math.prod(x.extent or 1 for x in loops[loops.index(loop) :])
        copies = min(max_step, iterations)
        self.require(
            copies <= UNROLL_MAX_COPIES,
            f"auto_unroll_max_step={max_step} unrolls {copies} iterations under `{loop.name}`, "
            f"more than the {UNROLL_MAX_COPIES} {self.compiler()} builds in seconds",
            span,
            f"use at most {UNROLL_MAX_COPIES}, e.g. auto_unroll_max_step=512",
        )

    # --- whole-schedule checks -------------------------------------------------------------------

    def finish(self) -> None:
        if self.target.is_gpu:
            self.check_gpu_bindings()
            self.check_kernel_buffers()
            self.check_shared_memory()
            self.check_accumulation_on_one_thread()
            self.check_unrolled_cross_thread_reduction()

    def check_gpu_bindings(self) -> None:
        for block in self.nest.block_names():
            if block in self.unknown_blocks or block in self.failed_binds:
                continue
            loops = self.nest.loops(block)
            if loops and not any(loop.thread for loop in loops):
                self.error(
                    f"block {block} is not bound to GPU threads",
                    self.block_spans.get(block) or self.created_by.get(block),
                    "bind its outer loops to blockIdx.x and inner ones to threadIdx.x",
                    one_of([loop.name for loop in loops], f"axes of block {block}"),
                )
                self.unbound[block] = self.diagnostics[-1]
                continue
            bound = [i for i, loop in enumerate(loops) if loop.thread]
            if not bound:
                continue
            self.check_cross_thread_reduction(block, loops)
            outside = [loop for loop in loops[: bound[0]] if loop.annotation]
            if outside:
                self.error(
                    f"block {block}: `{outside[0].name}` is {outside[0].annotation} outside the "
                    "kernel (above its bound loops), which TVM cannot build",
                    self.created_by.get(block) or self.block_spans.get(block),
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
                self.diagnostics.append(
                    warning(
                        f"block {block}: {', '.join(f'`{n}`' for n in serial)} above the "
                        f"thread loops {'is' if len(serial) == 1 else 'are'} not bound, so the "
                        "host runs it and launches the kernel once per iteration",
                        self.created_by.get(block) or self.block_spans.get(block),
                        "bind it to blockIdx.* (or fuse it into a bound loop)",
                    )
                )

    def check_cross_thread_reduction(self, block: str, loops: list[Loop]) -> None:
        """TVM reduces across threads only over the innermost loops of a block."""
        reducing = [
            i
            for i, loop in enumerate(loops)
            if loop.thread and loop.kind in (LoopKind.REDUCE, LoopKind.MIXED)
        ]
        if not reducing:
            return
        inside = [loop.name for loop in loops[reducing[0] :] if loop.kind is not LoopKind.REDUCE]
        self.require(
            not inside,
            f"block {block} reduces across threads over `{loops[reducing[0]].name}`, so its "
            f"reduction loops must be innermost; {', '.join(f'`{n}`' for n in inside)} "
            f"{'is' if len(inside) == 1 else 'are'} inside",
            self.block_spans.get(block) or self.created_by.get(block),
            "reorder the reduction loops after the others",
        )

    def check_kernel_buffers(self) -> None:
        """A CUDA kernel cannot allocate global memory, and shared or local memory does not
        outlive its kernel: both build (or run) wrong, so each buffer must live where it is used."""
        blocks = [b for b in self.nest.block_names() if b not in self.unknown_blocks]
        root = self.nest.sch.get(self.nest.sch.get_sblock("root"))
        allocated = {buffer.name for buffer in root.alloc_buffers}  # not function parameters
        for writer in blocks:
            buffer = self.nest.write_buffer(writer)
            if buffer is None or buffer.name not in allocated:
                continue
            scope, kernel = str(buffer.scope()), self.kernel_of(writer)
            readers = [b for b in blocks if b != writer and buffer.name in self.nest.reads(b)]
            if scope == "global":
                inside = [r for r in readers if self.kernel_of(r) == kernel]
                if inside:
                    self.error(
                        f"`{buffer.name}` is global memory, but block {writer} writes it inside "
                        f"the kernel of block {inside[0]}: a CUDA kernel cannot allocate it",
                        self.moved_by.get(writer) or self.moved_by.get(inside[0]),
                        f"inline it (`compute_inline {writer}`), or compute it in its own kernel",
                    )
                continue
            if scope == "warp":
                self.check_warp_buffer(buffer.name, writer, readers)
                continue
            # Seen failing for a guarded block computing into shared memory (cache_write), not
            # for a guarded cache_read copy.
            guarded = self.nest.is_guarded(writer) and writer not in self.read_caches
            if scope.startswith("shared") and guarded:
                self.error(
                    f"block {writer} writes shared memory `{buffer.name}` under the `if` of a "
                    "non-divisible split; TVM cannot put the __syncthreads it needs in an `if`",
                    self.block_spans.get(writer) or self.created_by.get(writer),
                    "split by factors that divide the extents, or cache in `local`",
                )
            apart = [r for r in readers if self.kernel_of(r) != kernel]
            if apart:
                self.error(
                    f"`{buffer.name}` is {scope} memory written by block {writer} in one kernel "
                    f"and read by block {apart[0]} in another; it does not outlive its kernel",
                    self.created_by.get(writer) or self.created_by.get(apart[0]),
                    "compute both in one kernel: give the cache an `at` loop below the "
                    "kernel's blockIdx loops",
                )

    def check_accumulation_on_one_thread(self) -> None:
        """A block that reads the result of a cross-thread reduction without binding that
        reduction's threadIdx axes runs on thread 0 only: TVM puts it under `if threadIdx.x == 0`
        (LowerCrossThreadReduction's broadcast). A reduction block accumulating into shared memory
        there needs a __syncthreads between its init and its update, which TVM cannot put inside
        an `if`: the build fails. Found by fuzzing (tests/test_fuzz.py)."""
        reduced: dict[str, tuple[str, set[str], object]] = {}  # buffer → (block, threads, scope)
        for block in self.nest.block_names():
            buffer = self.nest.write_buffer(block)
            if block in self.unknown_blocks or buffer is None:
                continue
            loops = self.nest.loops(block)
            scope = self.broadcast_scope(block, loops)
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
                and self.nest.is_reduction_block(block)
                and self.nest.sch.get(self.nest.block(block)).init is not None
            )
            if not accumulates:
                continue
            bound = {loop.thread for loop in loops if loop.thread}
            for read in dict.fromkeys(self.nest.reads(block)):
                producer, threads, producer_scope = reduced.get(read, (None, set(), None))
                missing = sorted(threads - bound)
                if producer is None or producer_scope != scope or not missing:
                    continue
                self.error(
                    f"block {block} accumulates into shared memory `{buffer.name}` on one thread "
                    f"(under `if {missing[0]} == 0`), where TVM cannot put the __syncthreads it "
                    "needs",
                    self.buffer_made_by.get(buffer.name) or self.block_spans.get(block),
                    f"it reads `{read}`, which block {producer} reduces across {missing[0]}, and "
                    f"binds no loop to {missing[0]}, so TVM runs it on thread 0 only",
                    f"accumulate in registers (`cache_write {block} local`), split off its init "
                    f"(`decompose_reduction {block} at …`), or bind one of its loops to "
                    f"{missing[0]}",
                )
                break

    def check_unrolled_cross_thread_reduction(self) -> None:
        """TVM cannot build a cross-thread reduction that is copied (LowerThreadAllreduce fails on
        `load_remap_`): no loop around one may be unrolled, by `unroll` or by a `pragma
        auto_unroll_max_step` with explicit unrolling that reaches it, or be bound to fewer than
        16 virtual threads (which TVM interleaves by copying the body). Found by fuzzing."""
        for block in self.nest.block_names():
            if block in self.unknown_blocks:
                continue
            loops = self.nest.loops(block)
            across = next((loop for loop in loops if _reduces_across_threads(loop)), None)
            if across is None:
                continue
            outside = loops[: loops.index(across)]
            for index, loop in enumerate(outside):
                copied = self.copying_loop(loop, outside[index:], loops)
                if copied is None:
                    continue
                if copied is loop and loop.thread:
                    where = f"virtual thread loop `{loop.name}` ({loop.thread})"
                    fix = f"bind at least {GPU_COPIED_VTHREADS} virtual threads, or none around it"
                elif copied is loop:
                    where, fix = f"unrolled loop `{loop.name}`", "unroll loops inside it only"
                else:
                    where = f"loop `{copied.name}`, which the pragma on `{loop.name}` unrolls"
                    fix = "give the pragma unroll_explicit=0, or a smaller auto_unroll_max_step"
                made_by = (
                    self.bind_span(loop.thread, loop.extent)
                    if copied is loop and loop.thread
                    else self.unrolled_by.get(self.nest.sch.get_sref(loop.rv))
                )
                self.error(
                    f"block {block} reduces across {across.thread} inside {where}: TVM cannot "
                    "build a copied cross-thread reduction",
                    made_by or self.block_spans.get(block),
                    fix,
                )
                break

    def copying_loop(self, loop: Loop, below: list[Loop], loops: list[Loop]) -> Loop | None:
        """The loop of `below` (starting at `loop`) whose body TVM copies because of `loop`: an
        unrolled one, one bound to few virtual threads, or one that `loop`'s auto-unroll pragma
        unrolls (TVM auto-unrolls a loop whose iterations times the serial steps inside it fit in
        auto_unroll_max_step)."""
        copies = (loop.extent or 2) > 1 and (
            loop.annotation == "unrolled"
            or bool(loop.thread and loop.thread.startswith("vthread"))
            and (loop.extent or 0) < GPU_COPIED_VTHREADS
        )
        if copies:
            return loop
        annotations = self.nest.sch.get(loop.rv).annotations
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

    def broadcast_scope(self, block: str, loops: list[Loop]) -> object:
        """What TVM's cross-thread broadcast is keyed by: the innermost blockIdx loop around
        `block`, or else its kernel."""
        grid = [loop for loop in loops if loop.thread and loop.thread.startswith("blockIdx")]
        return self.nest.sch.get_sref(grid[-1].rv) if grid else self.kernel_of(block)

    def check_warp_buffer(self, buffer: str, writer: str, readers: list[str]) -> None:
        """Warp memory is spread over the registers of one warp: TVM builds it only when the
        block writing it spreads its stores over threadIdx.x (one of its own loops bound to
        it), of an extent that divides the warp size."""
        warp = self.target.warp_size or 32
        lanes = [
            loop
            for loop in self.nest.loops(writer)
            if loop.thread == "threadIdx.x" and loop.kind is LoopKind.SPATIAL
        ]
        if lanes and lanes[0].extent is not None and warp % lanes[0].extent == 0:
            return
        self.error(
            f"`{buffer}` is warp memory, but block {writer} does not spread its stores over "
            f"threadIdx.x: bind one of its loops to threadIdx.x, with an extent that divides the "
            f"warp size {warp}",
            self.created_by.get(writer),
            f"e.g. `block {writer}:` then `bind ax1 threadIdx.x` on a loop of extent 32",
        )

    def check_shared_memory(self) -> None:
        limit = self.target.max_shared_memory_per_block
        if not limit:
            return
        kernels: dict[object, list[tuple[int, str]]] = {}
        for block in self.nest.block_names():
            buffer = self.nest.write_buffer(block)
            if buffer is None or not str(buffer.scope()).startswith("shared"):
                continue
            used = kernels.setdefault(self.kernel_of(block), [])
            elements = 1
            for loop in self.nest.loops(block):
                # A reduction loop of a block computing into shared memory (cache_write) does
                # not index the buffer.
                if loop.kind in (LoopKind.REDUCE, LoopKind.OUTER):
                    continue
                if len(self.nest.sch.get_child_blocks(loop.rv)) == 1 and loop.extent:
                    elements *= loop.extent
            used.append((elements * _dtype_bytes(str(buffer.dtype)), block))
        for used in kernels.values():  # the limit is per thread block: per kernel
            self.shared_memory_fits(used, limit)

    def shared_memory_fits(self, used: list[tuple[int, str]], limit: int) -> None:
        total = sum(size for size, _ in used)
        if total > limit:
            largest = max(used)[1]
            detail = ", ".join(f"{b} {s} B" for s, b in sorted(used, reverse=True))
            self.error(
                f"shared memory use {total} bytes exceeds the target's {limit} per block",
                self.created_by.get(largest),
                f"by block: {detail}",
                "cache smaller tiles (compute the cache at an inner loop)",
            )

    # --- after lowering: TVM's GPU verifier ------------------------------------------------------

    def verify_lowered(self, func: tirx.PrimFunc) -> None:
        """Run TVM's GPU verifier on the scheduled function and report what it finds at the
        statements that caused it. It sees what the checks above estimate: the buffers as TVM
        allocates them (padding included) and the threads of each kernel as launched."""
        try:
            lowered = lower_for_verification(func, self.target)
            messages = gpu_verifier_messages(lowered, gpu_constraints(self.target))
        except (RuntimeError, ValueError) as exc:  # the passes' own refusals
            self.error(f"TVM cannot lower the schedule for the GPU: {tvm_reason(exc)}", None)
            return
        kernels = kernel_uses(lowered)
        self.warp_elements_fit(kernels)
        if not messages:
            return
        for message in dict.fromkeys(messages):  # TVM repeats a message once per access
            found = self.gpu_finding(message, kernels)
            # Its error about a vector replaces the warning check_Vectorize gave the same axis.
            if found.span in {axis.span for _, axis in self.vectorized}:
                self.diagnostics = [
                    d for d in self.diagnostics if d.is_error or d.span != found.span
                ]
            self.diagnostics.append(found)

    def warp_elements_fit(self, kernels: list[_KernelUse]) -> None:
        """TVM builds warp memory at one element per thread only: with more, the common
        subexpressions it factors out of the indices hide threadIdx.x from LowerWarpMemory, which
        then fails. Found by fuzzing (tests/test_fuzz.py)."""
        for kernel in kernels:
            lanes = kernel.threads.get("threadIdx.x", 1)  # a warp buffer spans threadIdx.x only
            for name, elements in kernel.warp:
                self.require(
                    elements <= lanes,
                    f"warp memory `{name}` holds {elements} elements for {lanes} threads of "
                    "threadIdx.x; TVM builds warp memory only at one element per thread",
                    self.buffer_made_by.get(name),
                    "bind every loop that indexes it to a thread axis, or use `local`",
                )

    def gpu_finding(self, message: str, kernels: list[_KernelUse]) -> Diagnostic:
        note = "found by TVM's GPU verifier (tvm.s_tir.analysis.verify_gpu_code) after lowering"
        if match := _THREADS_USED.search(message):
            total = int(match[1])
            kernel = next((k for k in kernels if k.threads_per_block == total), None)
            threads = kernel.threads if kernel else {}
            binds = [b for b in self.binds if threads.get(b.thread) == b.extent]
            shape = " x ".join(
                f"{e} ({t})" for t, e in sorted(threads.items()) if t.startswith("threadIdx")
            )
            return error(
                f"{total} threads per block, more than the target's "
                f"{self.target.max_threads_per_block}",
                binds[-1].span if binds else None,
                f"threads: {shape}" if shape else "",
                note,
            )
        if match := _THREAD_EXTENT.search(message):
            thread, extent, limit = match[1], int(match[2]), int(match[3])
            return error(
                f"{thread} extent {extent} exceeds the target's limit of {limit}",
                self.bind_span(thread, extent),
                note,
            )
        if match := _THREAD_MISMATCH.search(message):
            thread, extent, other = match[1], int(match[2]), int(match[3])
            return error(
                f"{thread} is bound to extent {extent} here but to {other} elsewhere in the "
                "same kernel",
                self.bind_span(thread, extent),
                "every loop bound to one thread axis must have the same extent",
                note,
            )
        if match := _SHARED_USED.search(message):
            total = int(match[1])
            kernel = next((k for k in kernels if k.shared_bytes == total), None)
            buffers = sorted(kernel.shared if kernel else [], key=lambda b: -b[1])
            padded = [name for name, _ in buffers if name in self.aligned_by]
            return error(
                f"shared memory use {total} bytes exceeds the target's "
                f"{self.target.max_shared_memory_per_block} per block",
                self.buffer_made_by.get(buffers[0][0]) if buffers else None,
                "by buffer: " + ", ".join(f"{name} {size} B" for name, size in buffers),
                *(
                    f"storage_align (line {self.aligned_by[name].line}) pads `{name}`"
                    for name in padded
                ),
                "cache smaller tiles (compute the cache at an inner loop)",
                note,
            )
        if match := _VECTOR_BYTES.search(message):
            lanes, size, dtype, limit = int(match[1]), int(match[2]), match[3], int(match[4])
            axes = [axis for extent, axis in self.vectorized if extent == lanes]
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

    def bind_span(self, thread: str, extent: int) -> Span | None:
        spans = [b.span for b in self.binds if b.thread == thread and b.extent == extent]
        return spans[0] if spans else None


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
        "max_vthread": GPU_MAX_VTHREAD,
        "max_vector_bytes": GPU_MAX_VECTOR_BYTES,
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
                kernel.shared.append((buffer.name, elements * _dtype_bytes(str(buffer.dtype))))
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


def _reduces_across_threads(loop: Loop) -> bool:
    """A reduction loop bound to threadIdx: TVM lowers it to a cross-thread reduction."""
    return bool(loop.thread and loop.thread.startswith("threadIdx")) and loop.kind in (
        LoopKind.REDUCE,
        LoopKind.MIXED,
    )


def _format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


def _dtype_bytes(dtype: str) -> int:
    return max(1, tvm.DataType(dtype).bits * tvm.DataType(dtype).lanes // 8)


def _factors(stmt: ast.Stmt) -> tuple[ast.Factor, ...]:
    match stmt:
        case ast.Split(factors=factors) | ast.Tile(factors=factors):
            return factors
        case ast.Pragma(items=items):
            return tuple(item.value for item in items)
    return ()


def _created_blocks(stmt: ast.Stmt, block: str) -> list[str]:
    """The names of the blocks a statement creates (TVM's naming, or the `as` alias)."""
    match stmt:
        case ast.CacheRead(buffer=buffer, scope=scope, alias=alias):
            return [alias.text if alias else ast.cache_block_name(buffer, scope)]
        case ast.CacheWrite(block=written, scope=scope, alias=alias):
            return [alias.text if alias else ast.cache_block_name(written, scope)]
        case ast.Rfactor(alias=alias):
            return [alias.text if alias else f"{block}_rf"]
        case ast.DecomposeReduction(block=reduced):
            return [f"{reduced.text if reduced else block}_init"]
    return []


def _inside(loops: list[Loop], loop: Loop) -> str:
    inner = [f"`{other.name}`" for other in loops[loops.index(loop) + 1 :]]
    return ", ".join(inner)


def _divisors_note(extent: int, factor: int) -> str:
    small = [d for d in range(1, math.isqrt(extent) + 1) if extent % d == 0]
    divisors = sorted({*small, *(extent // d for d in small)})
    nearest = sorted(sorted(divisors, key=lambda d: abs(d - factor))[:4])
    return f"factors that divide {extent}: " + ", ".join(map(str, nearest))


def _describe_choices(choices: ast.Choices) -> str:
    from schedlang.printer import format_choices

    return format_choices(choices)


# Importing this module rebinds the package attribute `check` to it: let
# `schedlang.check(...)` still call check().
make_callable(__name__)
