"""TVM traces of schedlang schedules: a schedule lowers to the trace that applied it (`to_trace`),
in TVM's JSON form (`trace_to_json`, `trace_from_json`); and what the decompiler and the
MetaSchedule database share about traces and the functions they make.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import tvm_ffi
from tvm import s_tir, tirx

from schedlang.checker.pipeline import SCHEDULED_ATTR, lower, tvm_reason
from schedlang.core.diagnostics import SchedlangError
from schedlang.core.target import Target, as_target
from schedlang.lang import nodes
from schedlang.lang.statements.layout import PREPACK_ANNOTATION

# The prefix of MetaSchedule's own annotations ("hints") on blocks and loops.
HINT = "meta_schedule."
# The hints a statement says (`prepack`): kept like any other annotation.
STATEMENT_HINTS = frozenset({PREPACK_ANNOTATION})
_TRACE_FORM = (
    "a trace's JSON is [instructions, decisions], as `Trace.as_json()` or "
    "`schedlang export --trace-json` writes it"
)


def to_trace(
    func: tirx.PrimFunc,
    schedule: nodes.Schedule | str,
    target: Target | str,
    knobs: Mapping[str, int] | None = None,
) -> s_tir.Trace:
    """The TVM trace of a checked schedule: replayed on `s_tir.Schedule(func)` it gives the
    scheduled function."""
    schedule = as_schedule(schedule)
    require_traceable(schedule)
    return lower(schedule, func, as_target(target), knobs).trace


def require_traceable(schedule: nodes.Schedule) -> None:
    """A trace holds TVM schedule primitives only: `fast_math` rewrites the block's TIR itself,
    so a trace (and a MetaSchedule record) of a schedule using it would build the kernel without
    it. Refused instead of exported wrong."""
    from schedlang.lang.statements.fastmath import FastMath

    for stmt in schedule.statements:
        if isinstance(stmt, FastMath):
            raise SchedlangError(
                f"{stmt.span}: `fast_math` rewrites the "
                "block's TIR itself, not through a TVM schedule primitive, so a TVM trace or "
                "MetaSchedule record cannot hold it",
                "export the schedule without `fast_math` (its kernel then calls expf), or build "
                "the kernel with `schedlang compile`",
            )


def trace_to_json(trace: s_tir.Trace) -> list:
    """The trace as TVM writes it in a tuning record (`[instructions, decisions]`), in plain JSON
    types: `json.dumps` takes it, `Trace.apply_json_to_schedule` replays it."""
    return plain_json(trace.as_json(remove_postproc=False))


def trace_from_json(data: Any, func: tirx.PrimFunc) -> s_tir.Trace:
    """A trace read from its JSON form (text or data), replayed once on `func` to check it."""
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as err:
            raise SchedlangError(f"the trace is not valid JSON: {err}", _TRACE_FORM) from None
    if not (
        isinstance(data, list)
        and len(data) == 2
        and all(isinstance(part, list) for part in data)
        and all(isinstance(inst, list) and len(inst) == 4 for inst in data[0])
    ):
        raise SchedlangError("this JSON is not a TVM trace", _TRACE_FORM)
    decided = {entry[0] for entry in data[1] if isinstance(entry, list) and entry}
    require_decisions([(str(inst[0]), index in decided) for index, inst in enumerate(data[0])])
    sch = s_tir.Schedule(func)
    try:
        s_tir.Trace.apply_json_to_schedule(data, sch)
    except Exception as exc:  # TVM's own refusal: malformed, or made for another op
        raise SchedlangError(
            f"the trace does not apply to this op: {tvm_reason(exc)}",
            "is it the trace of another op, or of other shapes?",
        ) from None
    return sch.trace


def require_decisions(samples: list[tuple[str, bool]]) -> None:
    """TVM samples afresh where a decision is missing: the schedule would not be the one saved."""
    for index, (kind, decided) in enumerate(samples):
        if kind.startswith("Sample") and not decided:
            raise SchedlangError(
                f"instruction #{index} of the trace ({kind}) has no decision",
                "this is a design space, not a schedule: import a trace whose values were "
                "chosen (a MetaSchedule tuning record, or a sampled design space)",
            )


def python_lines(trace: s_tir.Trace) -> list[str]:
    """One line of Python per instruction, as diagnostics quote them. TVM 0.27 cannot print a
    trace with DecomposePadding (its printer rejects its own loop argument): each instruction is
    then named by its kind and attributes."""
    try:
        return [" ".join(line.split("\n")) for line in trace.as_python(False)]
    except (TypeError, RuntimeError):
        return [f"{inst.kind.name}(attrs={list(inst.attrs)})" for inst in trace.insts]


def as_schedule(schedule: nodes.Schedule | str) -> nodes.Schedule:
    return (
        schedule if isinstance(schedule, nodes.Schedule) else parse_schedule(schedule, "<schedule>")
    )


def parse_schedule(text: str, file: str) -> nodes.Schedule:
    from schedlang.lang.syntax import parse

    return parse(text, file)


def plain_json(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, tirx.IntImm):
        return int(value)
    if isinstance(value, tirx.FloatImm):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, Iterable):
        return [plain_json(v) for v in value]
    return str(value)


def same_function(a: tirx.PrimFunc, b: tirx.PrimFunc) -> bool:
    """Structurally equal, whatever the attributes naming or marking the function."""
    for attr in ("global_symbol", SCHEDULED_ATTR, "tirx.noalias"):
        a, b = a.without_attr(attr), b.without_attr(attr)
    return bool(tvm_ffi.structural_equal(a, b))


def without_hints(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` without MetaSchedule's `meta_schedule.*` annotations on its blocks and loops.
    Rebuilt from the IR rather than by unannotating a copy of the schedule: done from inside the
    decompiler's replay callback, that breaks TVM's replay (TVM 0.27 fails with
    `unordered_map::at`)."""
    body = _strip_hints(func.body)
    return func if body.same_as(func.body) else func.with_body(body)


def _strip_hints(stmt):
    """`stmt` with the hint annotations of its blocks and loops removed (the same object when it
    has none)."""
    if isinstance(stmt, s_tir.SBlockRealize):
        block = _strip_hints(stmt.block)
        if block.same_as(stmt.block):
            return stmt
        return s_tir.SBlockRealize(list(stmt.iter_values), stmt.predicate, block)
    if isinstance(stmt, s_tir.SBlock | tirx.For):
        body = _strip_hints(stmt.body)
        kept = {
            k: v
            for k, v in stmt.annotations.items()
            if not str(k).startswith(HINT) or str(k) in STATEMENT_HINTS
        }
        if body.same_as(stmt.body) and len(kept) == len(stmt.annotations):
            return stmt
        if isinstance(stmt, tirx.For):
            return tirx.For(
                stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, kept,
                stmt.step,
            )  # fmt: skip
        return s_tir.SBlock(
            stmt.iter_vars, stmt.reads, stmt.writes, stmt.name_hint, body, stmt.init,
            stmt.alloc_buffers, stmt.match_buffers, kept,
        )  # fmt: skip
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_strip_hints(s) for s in stmt.seq]
        if all(new.same_as(old) for new, old in zip(seq, stmt.seq, strict=True)):
            return stmt
        return tirx.SeqStmt(seq)
    if isinstance(stmt, tirx.IfThenElse):
        then_case = _strip_hints(stmt.then_case)
        else_case = _strip_hints(stmt.else_case) if stmt.else_case is not None else None
        if then_case.same_as(stmt.then_case) and (
            else_case is None or else_case.same_as(stmt.else_case)
        ):
            return stmt
        return tirx.IfThenElse(stmt.condition, then_case, else_case)
    return stmt
