"""Schedule AST → `tvm.s_tir.Schedule` primitives.

Lowering is pure: `lower(schedule, func, target)` never mutates `func`; it returns a new scheduled
PrimFunc and the TVM trace that produced it. Every statement maps to one or a few primitives
(`apply_statement`); the checker (schedlang.check) runs its guards before each one and turns what
TVM still rejects into a Diagnostic at the statement that caused it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

import tvm
from tvm import s_tir, tirx

from schedlang import ast, make_callable
from schedlang.diagnostics import DiagnosticError
from schedlang.nest import Consumed, Nest
from schedlang.target import Target

SCHEDULED_ATTR = "tirx.is_scheduled"


@dataclass(frozen=True)
class Lowered:
    """A scheduled PrimFunc, the trace that made it, and the concrete schedule it came from."""

    func: tirx.PrimFunc
    trace: s_tir.Trace
    schedule: ast.Schedule

    @property
    def mod(self) -> tvm.IRModule:
        return tvm.IRModule({"main": self.func})

    def script(self) -> str:
        return self.func.script()

    def trace_python(self) -> str:
        return "\n".join(self.trace.as_python())


def lower(
    schedule: ast.Schedule,
    func: tirx.PrimFunc,
    target: Target,
    knobs: Mapping[str, int] | None = None,
    *,
    strict: bool = False,
) -> Lowered:
    """Check and apply a concrete schedule (or a template with every knob given in `knobs`)."""
    from schedlang.check import check  # the checker drives lowering statement by statement

    result = check(schedule, func, target, knobs=knobs, strict=strict, template_ok=False)
    if result.lowered is None:
        raise DiagnosticError(result.diagnostics, schedule.source)
    return result.lowered


def bind_knobs(schedule: ast.Schedule, values: Mapping[str, int]) -> ast.Schedule:
    """The concrete schedule: every knob use replaced by its value, `param` lines dropped."""

    def factor(f: ast.Factor) -> ast.Factor:
        if isinstance(f, ast.KnobFactor) and f.name in values:
            return ast.IntFactor(int(values[f.name]), span=f.span)
        return f

    items: list[ast.Stmt | ast.Comment] = []
    blank_before: set[int] = set()
    for index, item in enumerate(schedule.items):
        if index in schedule.blank_before and items:
            blank_before.add(len(items))
        match item:
            case ast.Param():
                continue
            case ast.Split(factors=factors) | ast.Tile(factors=factors):
                item = replace(item, factors=tuple(factor(f) for f in factors))
            case ast.Pragma(items=pragma_items):
                pairs = tuple(replace(p, value=factor(p.value)) for p in pragma_items)
                item = replace(item, items=pairs)
        items.append(item)
    return ast.Schedule(tuple(items), schedule.file, schedule.source, frozenset(blank_before))


def finish(nest: Nest, schedule: ast.Schedule) -> Lowered:
    func = nest.sch.mod["main"].with_attr(SCHEDULED_ATTR, True)
    # The checker's look-ups (get_sblock, get_loops) are in the trace too; keep what matters.
    return Lowered(func, nest.sch.trace.simplified(remove_postproc=False), schedule)


# --- one statement -------------------------------------------------------------------------------


def apply_statement(nest: Nest, block: str, stmt: ast.Stmt) -> None:
    """Apply one checked, knob-free statement of the section of `block`.

    Raises s_tir.ScheduleError (or another TVM error) when TVM rejects it.
    """
    try:
        _apply(nest, block, stmt)
    finally:
        nest.changed()


def _apply(nest: Nest, block: str, stmt: ast.Stmt) -> None:
    sch = nest.sch

    def loop(name: ast.Name, in_block: str = block) -> s_tir.LoopRV:
        found = nest.find(in_block, name.text)
        assert found is not None, f"checker let unknown axis {name.text} through"
        return found.rv

    match stmt:
        case ast.Split(axis=axis, parts=parts):
            sizes = [None if isinstance(p, ast.InferredFactor) else _int(p) for p in parts]
            new_loops = sch.split(loop(axis), factors=sizes)
            _name_all(nest, block, axis, new_loops, stmt.derived_names, "split", stmt)
        case ast.Tile(axes=axes, factors=factors):
            outer, inner = [], []
            for axis, factor in zip(axes, factors, strict=True):
                names = ast.derived_axis_names(axis.text, 2)
                new_loops = sch.split(loop(axis), factors=[None, _int(factor)])
                _name_all(nest, block, axis, new_loops, names, "tiled", stmt)
                outer.append(new_loops[0])
                inner.append(new_loops[1])
            sch.reorder(*outer, *inner)
        case ast.Reorder(axes=axes):
            sch.reorder(*(loop(a) for a in axes))
        case ast.Fuse(axes=axes):
            fused = sch.fuse(*(loop(a) for a in axes))
            nest.set_name(fused, stmt.fused_name)
            for axis in axes:
                nest.consumed[(block, axis.text)] = Consumed(
                    "fused", stmt.span.line, (stmt.fused_name,)
                )
        case ast.Bind(axis=axis, thread=thread):
            sch.bind(loop(axis), thread.text)
        case ast.Vectorize(axis=axis):
            sch.vectorize(loop(axis))
        case ast.Unroll(axis=axis):
            sch.unroll(loop(axis))
        case ast.Parallel(axis=axis):
            sch.parallel(loop(axis))
        case ast.CacheRead(buffer=buffer, scope=scope, at=at, alias=alias):
            index = nest.reads(block).index(buffer.text)
            copy = sch.cache_read(nest.block(block), index, scope.text)
            nest.name_block(copy, alias.text if alias else ast.cache_block_name(buffer, scope))
            if at is not None:
                sch.compute_at(copy, loop(at), preserve_unit_loops=stmt.keep_unit_loops)
        case ast.CacheWrite(block=target, scope=scope, at=at, alias=alias):
            # Resolve `at` before cache_write: the write-back block goes where the loop is now.
            at_loop = loop(at) if at is not None else None
            write_back = sch.cache_write(nest.block(target.text), 0, scope.text)
            nest.name_block(
                write_back, alias.text if alias else ast.cache_block_name(target, scope)
            )
            if at_loop is not None:
                sch.reverse_compute_at(
                    write_back, at_loop, preserve_unit_loops=stmt.keep_unit_loops
                )
        case ast.ComputeAt(block=moved, axis=axis, keep_unit_loops=keep):
            sch.compute_at(nest.block(moved.text), loop(axis), preserve_unit_loops=keep)
        case ast.ReverseComputeAt(block=moved, axis=axis, keep_unit_loops=keep):
            sch.reverse_compute_at(nest.block(moved.text), loop(axis), preserve_unit_loops=keep)
        case ast.ComputeInline(block=inlined):
            sch.compute_inline(nest.block(inlined.text))
        case ast.ReverseComputeInline(block=inlined):
            sch.reverse_compute_inline(nest.block(inlined.text))
        case ast.Rfactor(axis=axis, alias=alias):
            factored = sch.rfactor(loop(axis), factor_axis=stmt.factor_position)
            nest.name_block(factored, alias.text if alias else None)
        case ast.DecomposeReduction(block=reduced, axis=axis):
            owner = reduced.text if reduced else block
            owner_rv = nest.block(owner)
            sch.decompose_reduction(owner_rv, loop(axis, owner))
            # TVM renames the block `<name>_update`; the schedule keeps calling it by its name.
            nest.name_block(owner_rv, owner)
        case ast.StorageAlign(block=aligned, dim=dim, factor=factor, offset=offset):
            sch.storage_align(nest.block(aligned.text), 0, dim.value, factor.value, offset.value)
        case ast.Pragma(axis=axis, items=items):
            for item in items:
                sch.annotate(loop(axis), f"pragma_{item.key.text}", _int(item.value))
        case _:
            raise TypeError(f"no lowering for {type(stmt).__name__}")


def _int(factor: ast.Factor) -> int:
    assert isinstance(factor, ast.IntFactor), f"unbound factor {factor!r} reached lowering"
    return factor.value


def _name_all(nest, block, axis, new_loops, names, how, stmt) -> None:
    for new_loop, name in zip(new_loops, names, strict=True):
        nest.set_name(new_loop, name)
    nest.consumed[(block, axis.text)] = Consumed(how, stmt.span.line, tuple(names))


# --- TVM's reasons, in one line ------------------------------------------------------------------

# Blocks print as `s_tir.SBlock#0`; loops as `s_tir.For#0` or (rfactor, for one) `tirx.For#0`.
_REF = re.compile(r"(?:s_tir|tirx)\.(SBlock|For)#\d+")
# The IR dump names each reference in a comment on the line before the block or loop.
_REF_IN_DUMP = re.compile(
    r'# ((?:s_tir|tirx)\.(?:SBlock|For)#\d+)\n\s*(?:with T\.sblock\("([^"]+)"\)|for (\w+) in)'
)


def tvm_reason(exc: BaseException) -> str:
    """TVM's own reason for rejecting a primitive, without the IR dump.

    TVM's messages refer to blocks and loops as `s_tir.SBlock#0`; they become their names.
    """
    text = str(exc)
    names = {ref: block or loop for ref, block, loop in _REF_IN_DUMP.findall(text)}
    if "Error message:" in text:
        text = text.rsplit("Error message:", 1)[1]
    else:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        text = lines[-1] if lines else type(exc).__name__
    text = re.sub(r"^\s*(ScheduleError|[A-Za-z]*Error):\s*", "", text.strip())
    text = _REF.sub(lambda m: f"`{names[m[0]]}`" if m[0] in names else f"a {m[1].lower()}", text)
    text = text.replace("``", "`, `").replace(":`", ": `")  # TVM lists references back to back
    return " ".join(text.split())


# Importing this module rebinds the package attribute `lower` to it: let
# `schedlang.lower(...)` still call lower().
make_callable(__name__)
