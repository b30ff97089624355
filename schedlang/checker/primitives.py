"""Schedule AST → `tvm.s_tir.Schedule` primitives, one checked statement at a time.

Lowering is pure: it never mutates the function it starts from; `finish` returns a new scheduled
PrimFunc and the TVM trace that produced it. Each statement's primitives are its registry entry's
`lower` (schedlang.lang.statements); the checker (schedlang.checker.check) runs its guards before
each one, and schedlang.checker.pipeline puts the two together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import s_tir, tirx

from schedlang.core.diagnostics import error_line
from schedlang.lang import nodes, statements
from schedlang.lang.nest import Nest

SCHEDULED_ATTR = "tirx.is_scheduled"


@dataclass(frozen=True)
class Lowered:
    """A scheduled PrimFunc, the trace that made it, and the concrete schedule it came from."""

    func: tirx.PrimFunc
    trace: s_tir.Trace
    schedule: nodes.Schedule

    @property
    def mod(self) -> tvm.IRModule:
        return tvm.IRModule({"main": self.func})

    def script(self) -> str:
        text: str = self.func.script()
        return text

    def trace_python(self) -> str:
        return "\n".join(self.trace.as_python())


def bind_knobs(schedule: nodes.Schedule, values: Mapping[str, int]) -> nodes.Schedule:
    """The concrete schedule: every knob use replaced by its value, `param` lines dropped."""

    def factor(f: nodes.Factor) -> nodes.Factor:
        if isinstance(f, nodes.KnobFactor) and f.name in values:
            return nodes.IntFactor(int(values[f.name]), span=f.span)
        return f

    items: list[nodes.Stmt | nodes.Comment] = []
    blank_before: set[int] = set()
    for index, item in enumerate(schedule.items):
        if index in schedule.blank_before and items:
            blank_before.add(len(items))
        if isinstance(item, nodes.Param):
            continue
        spec = statements.BY_NODE.get(type(item)) if isinstance(item, nodes.Stmt) else None
        if spec is not None:
            item = spec.bind_factors(item, factor)
        items.append(item)
    return nodes.Schedule(tuple(items), schedule.file, schedule.source, frozenset(blank_before))


def finish(nest: Nest, schedule: nodes.Schedule, finished: bool = True) -> Lowered:
    """The scheduled function, marked scheduled unless it is not `finished` (a partial GPU
    schedule that leaves blocks unbound: dlight, which skips a function so marked, finishes it)."""
    func = nest.sch.mod["main"]
    func = func.with_attr(SCHEDULED_ATTR, True) if finished else func
    # The checker's look-ups (get_sblock, get_loops) are in the trace too; keep what matters.
    trace = nest.sch.trace.simplified(remove_postproc=False)
    return Lowered(func, trace if _defines_its_inputs(trace) else nest.sch.trace, schedule)


def _defines_its_inputs(trace: s_tir.Trace) -> bool:
    """TVM's Trace.simplified drops the look-up of a block passed only inside a list (cache_read's
    consumer_blocks), leaving a trace that does not replay (TVM 0.27)."""
    from tvm.s_tir.schedule import LoopRV, SBlockRV

    defined: set[object] = set()

    def ok(value: Any) -> bool:  # a trace's input: a TVM object, a list of them or a constant
        if isinstance(value, SBlockRV | LoopRV):
            return value in defined
        if isinstance(value, list | tuple) or type(value).__name__ == "Array":
            return all(ok(v) for v in value)
        return True

    for inst in trace.insts:
        if not all(ok(v) for v in inst.inputs):
            return False
        defined.update(inst.outputs)
    return True


# --- one statement -------------------------------------------------------------------------------


def apply_statement(nest: Nest, block: str, stmt: nodes.Stmt) -> None:
    """Apply one checked, knob-free statement of the section of `block`.

    Raises s_tir.ScheduleError (or another TVM error) when TVM rejects it.
    """
    try:
        _apply(nest, block, stmt)
    finally:
        nest.changed()


def _apply(nest: Nest, block: str, stmt: nodes.Stmt) -> None:
    lowering = statements.LOWERING.get(stmt.keyword)
    if lowering is None:
        raise TypeError(f"no lowering for {type(stmt).__name__}")
    lowering.lower(nest, block, stmt)


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
    text = text.rsplit("Error message:", 1)[1] if "Error message:" in text else error_line(exc)
    text = re.sub(r"^\s*(ScheduleError|[A-Za-z]*Error):\s*", "", text.strip())
    text = _REF.sub(lambda m: f"`{names[m[0]]}`" if m[0] in names else f"a {m[1].lower()}", text)
    text = text.replace("``", "`, `").replace(":`", ": `")  # TVM lists references back to back
    return " ".join(text.split())
