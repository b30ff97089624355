"""TVM traces read back as schedlang: `from_trace(trace, func)` turns a trace (a `Trace` or its
JSON) into schedlang text, `decompile` gives the diagnostics too. MetaSchedule's sampled decisions
become constants; its `meta_schedule.*` hints either become the statements MetaSchedule's
postprocessors would have made of them, or, for pure bookkeeping, are dropped with a note; an
instruction schedlang has no statement for is an error naming it and its position in the trace
(`--partial` keeps what translates and comments the rest out).

Each statement reads its own instruction back: the registry (schedlang.lang.statements) gives,
per instruction, the statements whose `decompile(reader, inputs, attrs)` writes it, and the
decompiler is the `TraceReader` they read the trace with.

How the decompiler stays honest: TVM replays the trace on one schedule (the reference) and calls
back before each instruction; the callback translates the instruction into schedlang statements
and applies them to a second schedule through schedlang's own lowering (`apply_statement`), so the
names it writes are the ones schedlang gives. The two functions are compared after every
instruction, so a statement that does not do exactly what the instruction did is reported at that
instruction. The finished text is then parsed, checked and lowered like any schedule and compared
with the trace applied directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV

from schedlang.checker.pipeline import apply_statement, tvm_reason
from schedlang.core.diagnostics import (
    Diagnostic,
    DiagnosticError,
    SchedlangError,
    Severity,
    Span,
    error,
    render_all,
)
from schedlang.core.target import Target, as_target
from schedlang.interop.traces import (
    HINT,
    parse_schedule,
    python_lines,
    require_decisions,
    same_function,
    trace_from_json,
    without_hints,
)
from schedlang.lang import nodes, statements
from schedlang.lang.nest import Nest
from schedlang.lang.printer import format_schedule
from schedlang.lang.statements import annotation
from schedlang.lang.statements.decompiling import Untranslatable

IMPORTED = "<imported>"  # the file name diagnostics about an imported schedule carry

# Instructions that only look something up or sample a value: no statement of their own.
_LOOKUPS = {
    "GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers", "GetOutputBlocks",
}  # fmt: skip
_SAMPLES = {"SamplePerfectTile", "SamplePartitionedTile", "SampleCategorical"}
_DECOMPILERS = statements.decompilers()  # instruction → the statements that read it back
_STATEMENTS = statements.instructions()  # instruction → the schedlang statement it becomes
SUPPORTED_INSTRUCTIONS = frozenset(
    {*_LOOKUPS, *_SAMPLES, *_STATEMENTS, "SampleComputeLocation", "Unannotate", "EnterPostproc"}
)
# Hints MetaSchedule's RewriteParallelVectorizeUnroll postprocessor turns into fuse, parallel,
# vectorize and unroll pragmas (and then removes).
_PARALLEL_HINTS = {
    f"{HINT}{k}" for k in ("parallel", "vectorize", "unroll_explicit", "unroll_implicit")
}
# Block annotations only MetaSchedule's own rules read; TVM drops block annotations when it lowers
# (LowerOpaqueBlock), so they do not change the built code.
BOOKKEEPING_HINTS = frozenset(
    f"{HINT}{k}"
    for k in (
        "tiling_structure",
        "random_compute_producer",
        "thread_extent_low_inclusive",
        "thread_extent_high_inclusive",
    )
)


@dataclass(frozen=True)
class Decompiled:
    text: str  # schedlang, canonically formatted
    diagnostics: tuple[Diagnostic, ...]  # notes and warnings (and, with partial, what is left out)
    source: str  # the trace as Python, one instruction per line: what the diagnostics point at
    complete: bool  # every instruction translated, and the text lowers to the trace's function

    def render(self) -> str:
        """The diagnostics as text: those about the trace against its Python form, those about
        the imported schedule (the checker's) against the text."""
        on_text = [d for d in self.diagnostics if d.span is not None and d.span.file == IMPORTED]
        on_trace = [d for d in self.diagnostics if d not in on_text]
        parts = (render_all(on_trace, self.source), render_all(on_text, self.text))
        return "\n\n".join(part for part in parts if part)


def from_trace(
    trace: s_tir.Trace | list | str,
    func: tirx.PrimFunc,
    target: Target | str | None = None,
    *,
    partial: bool = False,
) -> str:
    """A trace (a `Trace`, or its JSON as data or text) as schedlang text for `func`."""
    return decompile(trace, func, target, partial=partial).text


def decompile(
    trace: s_tir.Trace | list | str,
    func: tirx.PrimFunc,
    target: Target | str | None = None,
    *,
    partial: bool = False,
    file: str = "<trace>",
    header: str | None = None,
) -> Decompiled:
    """Translate a trace into schedlang. Raises DiagnosticError (pointing at the instructions, in
    the trace's Python form) when an instruction has no schedlang equivalent; with `partial`, the
    translated part is returned with the rest commented out instead."""
    if not isinstance(trace, s_tir.Trace):
        trace = trace_from_json(trace, func)
    require_decisions([(i.kind.name, trace.get_decision(i) is not None) for i in trace.insts])
    if target is None:
        bound = any(inst.kind.name == "Bind" for inst in trace.insts)
        target = "cuda" if bound else "llvm"
    target = as_target(target)
    trace, applied_hints = _apply_parallel_hints(trace, func)
    decompiler = _Decompiler(trace, func, target, partial, file, header)
    if applied_hints:
        decompiler.notes.append(
            Diagnostic(
                Severity.NOTE,
                "the trace's parallel, vectorize and unroll hints were applied as MetaSchedule's "
                "RewriteParallelVectorizeUnroll postprocessor applies them",
                decompiler.span(applied_hints[0]),
            )
        )
    return decompiler.run()


def _apply_parallel_hints(trace: s_tir.Trace, func: tirx.PrimFunc) -> tuple[s_tir.Trace, list]:
    """A design space (a trace not post-processed) still holds MetaSchedule's parallel, vectorize
    and unroll hints: apply them the way MetaSchedule does before it builds a candidate, so they
    become instructions the decompiler translates. Returns the trace and the hints' positions."""
    pending: dict[str, int] = {}
    for index, inst in enumerate(trace.insts):
        key = str(inst.attrs[0]) if inst.attrs else ""
        if inst.kind.name == "Annotate" and key in _PARALLEL_HINTS:
            pending.setdefault(key, index)
        elif inst.kind.name == "Unannotate":
            pending.pop(key, None)
    if not pending:
        return trace, []
    from tvm.s_tir import meta_schedule as ms

    sch = s_tir.Schedule(func)
    try:
        trace.apply_to_schedule(sch, remove_postproc=False)
    except Exception as exc:  # TVM's own refusal: a trace made for another op
        raise SchedlangError(f"the trace does not apply to this op: {tvm_reason(exc)}") from None
    sch.enter_postproc()
    if not ms.postproc.RewriteParallelVectorizeUnroll().apply(sch):
        raise SchedlangError(
            "MetaSchedule's RewriteParallelVectorizeUnroll postprocessor rejects this trace's "
            "parallel, vectorize and unroll hints",
        )
    return sch.trace, sorted(pending.values())


@dataclass(eq=False)
class _Decompiler:
    """One trace being translated (see the module): TVM's replay calls `on_instruction` before
    each instruction. It is the `TraceReader` the statements' decompile handlers read with."""

    trace: s_tir.Trace
    func: tirx.PrimFunc
    target: Target
    partial: bool
    file: str
    header: str | None
    items: list[nodes.Stmt | nodes.Comment] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)  # per item, the instruction it came from
    blank_before: set[int] = field(default_factory=set)
    section: str | None = None
    index: int = -1
    stopped_at: int | None = None
    problems: list[Diagnostic] = field(default_factory=list)
    notes: list[Diagnostic] = field(default_factory=list)
    hints: list[tuple[int, object, str]] = field(default_factory=list)  # (instruction, rv, key)
    locations: dict[str, int] = field(default_factory=dict)  # block → sampled compute location
    postproc_at: int | None = None
    changed: bool = False  # whether the last instruction can have changed the function
    deferred: bool = False  # skip the next comparison: the instruction after completes it
    pending: int | None = None  # the instruction a skipped comparison would blame

    def __post_init__(self) -> None:
        self.lines = python_lines(self.trace)
        self.source = "\n".join(self.lines)
        self.reference = s_tir.Schedule(self.func)  # TVM replays the trace here
        self.nest = Nest(s_tir.Schedule(self.func))  # schedlang's statements are applied here

    # --- driving ---------------------------------------------------------------------------------

    def run(self) -> Decompiled:
        if not self.partial:  # every instruction schedlang lacks, in one report
            for index, inst in enumerate(self.trace.insts):
                reason = _static_problem(inst.kind.name, list(inst.attrs))
                if reason is not None:
                    self.problems.append(self.error(index, *reason))
            if self.problems:
                raise DiagnosticError(self.problems, self.source)
        try:
            self.trace.apply_to_schedule(self.reference, False, self.on_instruction)
        except Exception as exc:  # TVM refused an instruction of the trace itself
            self.problems.append(
                self.error(
                    self.index,
                    f"TVM cannot apply this instruction to the op: {tvm_reason(exc)}",
                    "is the trace made for another op, or other shapes?",
                )
            )
            raise DiagnosticError(self.problems, self.source) from None
        if self.stopped_at is None:
            self.compare()
        if self.stopped_at is None:
            self.leftover_hints()
        if self.problems and not self.partial:
            raise DiagnosticError(self.problems, self.source)
        items, origins, blank = _merged(self.items, self.origins, self.blank_before)
        complete = self.stopped_at is None and not self.problems
        text = self.render(items, blank)
        if complete:
            self.verify(text, items, origins)
        found = sorted(self.problems, key=lambda d: d.span.line if d.span else 0)
        if self.partial:  # asked for: what is left out is reported, not fatal
            found = [replace(d, severity=Severity.WARNING) for d in found]
        return Decompiled(text, (*self.notes, *found), self.source, complete)

    def on_instruction(self, inst, inputs, attrs, decision):
        """TVM's callback before each instruction: the states after the previous one are compared,
        then this one is translated. Nothing may escape into TVM: problems are recorded."""
        if self.stopped_at is not None:
            return decision
        try:
            self.compare()
            self.index += 1
            if self.stopped_at is None:
                kind = inst.kind.name
                reason = _static_problem(kind, list(attrs))
                if reason is not None:
                    raise Untranslatable(*reason)
                self.changed = kind not in _LOOKUPS and kind not in _SAMPLES
                self.translate(kind, list(inputs), list(attrs), decision)
        except Untranslatable as problem:
            self.stop(self.error(self.index, problem.message, *problem.notes))
        except Exception as exc:  # a bug here must not become a crash inside TVM's replay
            self.stop(
                self.error(
                    self.index,
                    f"cannot translate this instruction: {exc!r}",
                    "this is a bug in schedlang's decompiler; please report it with the trace",
                )
            )
        return decision

    def stop(self, diagnostic: Diagnostic, at: int | None = None) -> None:
        """Stop translating at instruction `at` (default: this one); what came from it goes."""
        at = self.index if at is None else at
        keep = [i for i, origin in enumerate(self.origins) if origin < at]
        self.items = [self.items[i] for i in keep]
        self.origins = [self.origins[i] for i in keep]
        self.blank_before = {i for i in self.blank_before if i < len(self.items)}
        self.problems.append(diagnostic)
        self.stopped_at = at

    def compare(self) -> None:
        """The reference (hints aside) and schedlang's schedule must be equal after every
        instruction; the first one where they are not is reported."""
        if self.index < 0 or self.stopped_at is not None or not self.changed:
            return
        if self.deferred:  # an instruction whose effect the next one completes
            self.deferred = False
            self.pending = self.index if self.pending is None else self.pending
            return
        if same_function(without_hints(self.reference.mod["main"]), self.nest.sch.mod["main"]):
            self.pending = None
            return
        at = self.index if self.pending is None else self.pending
        inst = self.trace.insts[at]
        self.stop(
            self.error(
                at,
                f"schedlang's `{_STATEMENTS.get(inst.kind.name, inst.kind.name)}` does not give "
                f"the same loop nest as this instruction: {_divergence(inst)}",
                "import with --partial to get the schedule up to here, then edit it",
            ),
            at,
        )

    # --- diagnostics -----------------------------------------------------------------------------

    def span(self, index: int) -> Span:
        line = self.lines[index] if 0 <= index < len(self.lines) else ""
        return Span(self.file, index + 1, 1, index + 1, len(line) + 1)

    def error(self, index: int, message: str, *notes: str) -> Diagnostic:
        kind = self.trace.insts[index].kind.name if 0 <= index < len(self.lines) else "?"
        return error(
            message, self.span(index), f"instruction #{index} of the trace ({kind})", *notes
        )

    # --- translation -----------------------------------------------------------------------------

    def translate(self, kind: str, inputs: list, attrs: list, decision) -> None:
        if kind in _LOOKUPS or kind in _SAMPLES:
            return
        if kind == "EnterPostproc":
            self.postproc_at = len(self.items)
            return
        if kind == "SampleComputeLocation":
            self.locations[self.block_name(inputs[0])] = int(decision)
            return
        trace = next((t for t in _DECOMPILERS.get(kind, ()) if t.reads_instruction(attrs)), None)
        # A hint no statement reads (`prepack` reads meta_schedule.layout_rewrite_preproc).
        if kind in ("Annotate", "Unannotate") and str(attrs[0]).startswith(HINT) and not trace:
            self.hint(kind, inputs, str(attrs[0]))
            return
        if trace is None:
            raise Untranslatable(f"schedlang has no statement for `{kind}`")
        trace.decompile(self, inputs, attrs)

    def hint(self, kind: str, inputs: list, key: str) -> None:
        """Kept aside: a postprocessor consumes it later in the trace (Unannotate), or, for
        bookkeeping only, it is dropped at the end with a note."""
        if kind == "Annotate":
            self.hints.append((self.index, inputs[0], key))
            return
        sref = self.reference.get_sref(inputs[0])
        self.hints = [
            h
            for h in self.hints
            if not (h[2] == key and self.reference.get_sref(h[1]).same_as(sref))
        ]

    def leftover_hints(self) -> None:
        dropped: dict[str, list[int]] = {}
        for index, target, key in self.hints:
            if key in BOOKKEEPING_HINTS and isinstance(target, SBlockRV):
                dropped.setdefault(key, []).append(index)
                continue
            self.problems.append(
                self.error(
                    index,
                    f"schedlang has no statement for MetaSchedule's hint `{key}`",
                    "it is left for a MetaSchedule postprocessor, and this trace does not apply "
                    "it: import a post-processed trace (a tuning record)",
                )
            )
        for key, indices in dropped.items():
            self.notes.append(
                Diagnostic(
                    Severity.NOTE,
                    f"dropped MetaSchedule's bookkeeping annotation `{key}` "
                    f"({len(indices)}x): TVM drops it when it builds",
                    self.span(indices[0]),
                )
            )

    # --- names -----------------------------------------------------------------------------------

    # --- names (the TraceReader) ---------------------------------------------------------------

    def value(self, value) -> int | None:
        """An integer input: a constant, or a sampled value (its decision)."""
        if value is None or isinstance(value, str):
            return None
        if isinstance(value, tirx.Var):
            value = self.reference.get(value)
        return int(value) if isinstance(value, int | tirx.IntImm) else None

    def block_name(self, block_rv) -> str:
        """schedlang's name for a block of the reference (the same block exists in the nest)."""
        tvm_name = self.reference.get(block_rv).name_hint
        aliases = {tvm: alias for alias, tvm in self.nest.block_aliases.items()}
        return aliases.get(tvm_name, tvm_name)

    def axis(self, loop_rv, exclude: str | None = None, prefer: str | None = None):
        """(a block under the loop, the loop's schedlang name in it). The two states are equal, so
        the loop is at the same position among the loops of the same block in the nest."""
        sref = self.reference.get_sref(loop_rv)
        under = [(self.block_name(rv), rv) for rv in self.reference.get_child_blocks(loop_rv)]
        under = [(name, rv) for name, rv in under if name != exclude]
        if not under:
            raise Untranslatable("the loop holds no block that schedlang could name it by")
        names = [name for name, _ in under]
        # The current section reads best; otherwise the last block, the one the others feed.
        block = next((b for b in (prefer, self.section) if b in names), names[-1])
        block_rv = under[names.index(block)][1]
        loops = self.reference.get_loops(block_rv)
        position = next(
            i for i, rv in enumerate(loops) if self.reference.get_sref(rv).same_as(sref)
        )
        return block, self.nest.loops(block)[position].name

    def axes(self, loop_rvs: list) -> tuple[str, list[str]]:
        """A block under all the loops (under the innermost one), and their names in it."""
        block, _ = self.axis(loop_rvs[-1])
        return block, [self.axis(rv, prefer=block)[1] for rv in loop_rvs]

    def other_section(self, leaving: str) -> str:
        """A section for a statement that makes block `leaving` disappear."""
        blocks = [b for b in self.nest.block_names() if b != leaving]
        if self.section in blocks:
            return self.section
        return blocks[0] if blocks else leaving

    # --- output ----------------------------------------------------------------------------------

    def is_loop(self, rv) -> bool:
        return isinstance(rv, LoopRV)

    def location(self, block: str) -> int | None:
        return self.locations.get(block)

    def emit(self, block: str, stmt: nodes.Stmt) -> None:
        try:
            apply_statement(self.nest, block, stmt)
        except (s_tir.ScheduleError, RuntimeError, ValueError) as exc:
            raise Untranslatable(
                f"schedlang's `{stmt.keyword}` fails here: {tvm_reason(exc)}"
            ) from None
        if self.postproc_at is not None:
            if self.items:
                self.blank_before.add(len(self.items))
            self.add(nodes.Comment("MetaSchedule's postprocessing"))
            self.postproc_at = None
            self.section = None  # a header after the comment, for the reader
        if block != self.section:
            if self.items and not isinstance(self.items[-1], nodes.Comment):
                self.blank_before.add(len(self.items))
            self.add(nodes.BlockHeader(nodes.Name(block)))
            self.section = block
        self.add(stmt)

    def add(self, item: nodes.Stmt | nodes.Comment) -> None:
        self.items.append(item)
        self.origins.append(self.index)

    def restate(self, stmt: nodes.Stmt) -> None:
        self.items[-1] = stmt

    def defer(self) -> None:
        self.deferred = True

    def render(self, items: list[nodes.Stmt | nodes.Comment], blank: set[int]) -> str:
        items = list(items)
        if self.header is not None:
            items.insert(0, nodes.Comment(self.header))
            blank = {i + 1 for i in blank} | ({1} if len(items) > 1 else set())
        if self.stopped_at is not None:
            if items:
                blank.add(len(items))
            items.append(nodes.Comment(f"not translated, from instruction #{self.stopped_at} on:"))
            items += [nodes.Comment(line) for line in self.lines[self.stopped_at :]]
        return format_schedule(nodes.Schedule(tuple(items), IMPORTED, "", frozenset(blank)))

    def verify(self, text: str, items: list, origins: list[int]) -> None:
        """The text must parse, check clean, and lower to the trace's function."""
        from schedlang.checker.check import check

        schedule = parse_schedule(text, IMPORTED)
        result = check(schedule, self.func, self.target)
        lines = [s.span.line for s in schedule.statements if not isinstance(s, nodes.BlockHeader)]
        emitted = [
            origin
            for item, origin in zip(items, origins, strict=True)
            if isinstance(item, nodes.Stmt) and not isinstance(item, nodes.BlockHeader)
        ]
        by_line = dict(zip(lines, emitted, strict=True))

        def traced(d: Diagnostic) -> Diagnostic:
            origin = by_line.get(d.span.line) if d.span else None
            if origin is None:
                return d
            return replace(d, notes=(*d.notes, f"from instruction #{origin}: {self.lines[origin]}"))

        if not result.ok or result.lowered is None:
            raise DiagnosticError([traced(d) for d in result.diagnostics], text)
        self.notes += [traced(d) for d in result.diagnostics]
        if not same_function(result.lowered.func, without_hints(self.reference.mod["main"])):
            raise SchedlangError(
                "the imported schedule does not lower to the trace's function",
                "this is a bug in schedlang's decompiler; please report it with the trace",
            )


def _merged(
    items: list[nodes.Stmt | nodes.Comment], origins: list[int], blank_before: set[int]
) -> tuple[list[nodes.Stmt | nodes.Comment], list[int], set[int]]:
    """The statements as a person writes them: a statement absorbs the one after it where its
    registry entry says the two are one (`cache_read A s` then `compute_at A_s x` is
    `cache_read A s at x`; pragmas on one loop are one line)."""
    merged: list[nodes.Stmt | nodes.Comment] = []
    merged_origins: list[int] = []
    blank: set[int] = set()
    for index, (item, origin) in enumerate(zip(items, origins, strict=True)):
        previous = merged[-1] if merged and index not in blank_before else None
        spec = statements.BY_NODE.get(type(previous)) if isinstance(previous, nodes.Stmt) else None
        trace = statements.TRACE.get(spec.keyword) if spec is not None else None
        both = trace.absorbs(previous, item) if trace is not None else None
        if both is not None:
            merged[-1] = both
            continue
        if index in blank_before and merged:
            blank.add(len(merged))
        merged.append(item)
        merged_origins.append(origin)
    return merged, merged_origins, blank


def _static_problem(kind: str, attrs: list) -> tuple[str, ...] | None:
    """(message, notes…) when the instruction itself has no schedlang equivalent."""
    if kind not in SUPPORTED_INSTRUCTIONS:
        return (
            f"schedlang has no statement for `{kind}`",
            "schedlang's statements: " + ", ".join(statements.BY_KEYWORD),
        )
    if kind in ("Annotate", "Unannotate"):
        key = str(attrs[0])
        known = any(trace.reads_instruction(attrs) for trace in _DECOMPILERS["Annotate"])
        if not key.startswith(HINT) and (kind == "Unannotate" or not known):
            return (
                f"schedlang has no statement for the annotation `{key}`",
                "schedlang annotates with " + ", ".join(annotation.KEYS),
            )
        return None
    for trace in _DECOMPILERS.get(kind, ()):
        problem = trace.untranslatable(attrs)
        if problem:
            return problem
    return None


def _divergence(inst) -> str:
    """Why schedlang's statement differs from this instruction, as far as its attributes say."""
    inputs, attrs = list(inst.inputs), list(inst.attrs)
    for trace in _DECOMPILERS.get(inst.kind.name, ()):
        why = trace.divergence(inputs, attrs)
        if why:
            return why
    return "the two functions differ"
