"""The statement registry: every DSL statement, defined once, in a module per family.

    loops.py        split, tile, reorder, fuse
    loop_kinds.py   bind, vectorize, unroll, parallel
    pragmas.py      pragma (annotations)
    buffers.py      cache_read, cache_write, storage_align, set_scope
    moving.py       compute_at, reverse_compute_at, compute_inline, reverse_compute_inline
    reductions.py   rfactor, decompose_reduction
    annotation.py   annotate (software pipelining, double buffering, unrolling)
    blocks.py       blockize, add_unit_loop, reindex, pad, decompose_padding
    layout.py       transform_layout
    tensorize.py    tensorize
    fastmath.py     fast_math (a block's exp as a vectorizable polynomial)

The parser's builder (schedlang.lang.syntax), the printer, the checker's dispatch and bookkeeping,
the lowering, the decoding grammar's name roles (schedlang.llm.grammar), the model's reference
(schedlang.llm.proposer), the decompiler's handlers (`decompilers()`, read by
schedlang.interop.decompiler), the steps of stepwise decoding (`step_groups()`, read by
schedlang.llm.stepwise) and the summary table of docs/language.md are read from here;
tests/test_registry.py fails when one lacks a statement. A new statement needs its grammar rule, a
`Statement` in its family module, its docs section and its tests.

`block NAME:` and `param` are the frame of a schedule, not statements of a family: the parser and
the checker handle them themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlang.lang import nodes
from schedlang.lang.statements import (
    annotation,
    blocks,
    buffers,
    fastmath,
    layout,
    loop_kinds,
    loops,
    moving,
    pragmas,
    reductions,
    tensorize,
)
from schedlang.lang.statements.base import (
    Choice,
    Role,
    Statement,
    StepPattern,
    Steps,
    StepsOver,
    StepView,
    TraceReader,
)

_FAMILIES = (
    loops, loop_kinds, buffers, moving, reductions, pragmas, annotation, blocks, layout, tensorize,
    fastmath,
)  # fmt: skip
# The order the language has always listed its statements in (error notes, the model's
# reference, docs); a statement not named here follows them, in family order.
_LISTED = (
    "split", "tile", "reorder", "fuse", "bind", "vectorize", "unroll", "parallel", "cache_read",
    "cache_write", "compute_at", "reverse_compute_at", "compute_inline", "reverse_compute_inline",
    "rfactor", "decompose_reduction", "storage_align", "pragma",
)  # fmt: skip


def _ordered() -> tuple[Statement, ...]:
    every = [spec for family in _FAMILIES for spec in family.STATEMENTS]
    rank = {keyword: n for n, keyword in enumerate(_LISTED)}
    return tuple(sorted(every, key=lambda s: rank.get(s.keyword, len(rank))))


STATEMENTS: tuple[Statement, ...] = _ordered()
BY_KEYWORD: dict[str, Statement] = {spec.keyword: spec for spec in STATEMENTS}
BY_NODE: dict[type[nodes.Stmt], Statement] = {spec.node: spec for spec in STATEMENTS}
# Every keyword that starts a line, the frame's first.
KEYWORDS: tuple[str, ...] = (
    nodes.BlockHeader.keyword,
    nodes.Param.keyword,
    *(spec.keyword for spec in STATEMENTS),
)
STATEMENT_KINDS: tuple[type[nodes.Stmt], ...] = (
    nodes.BlockHeader,
    nodes.Param,
    *(spec.node for spec in STATEMENTS),
)


def of(stmt: nodes.Stmt) -> Statement:
    """The registry entry of a statement node (not a block header or a param)."""
    try:
        return BY_NODE[type(stmt)]
    except KeyError:
        raise TypeError(f"{type(stmt).__name__} is not a registered statement") from None


def name_roles() -> dict[str, Role]:
    """Grammar rule → the role of its bare NAME token, for rules that take one."""
    return {spec.rule: spec.name_role for spec in STATEMENTS if spec.name_role}


def instructions() -> dict[str, str]:
    """TVM trace instruction → the keyword of the (first) statement it decompiles to."""
    return {instruction: specs[0].keyword for instruction, specs in decompilers().items()}


def decompilers() -> dict[str, tuple[Statement, ...]]:
    """TVM trace instruction → the statements that read it back, each for the instructions
    its `reads_instruction` takes (`Annotate`: `pragma` and `annotate`, by key)."""
    table: dict[str, tuple[Statement, ...]] = {}
    for spec in STATEMENTS:
        if spec.instruction:
            table[spec.instruction] = (*table.get(spec.instruction, ()), spec)
    return table


@dataclass(frozen=True)
class StepGroup:
    """Statements stepwise decoding offers together: for each item they range over, each
    statement's steps in turn."""

    over: StepsOver
    statements: tuple[Statement, ...]


def step_groups() -> tuple[StepGroup, ...]:
    """The statements with steps, in registry order; those of one family that range over the
    same loops or blocks join the group of the first of them."""
    groups: list[StepGroup] = []
    for spec in STATEMENTS:
        if spec.steps is None:
            continue
        over = spec.steps.over
        joined = next(
            (
                n
                for n, g in enumerate(groups)
                if over != "block" and g.over == over and g.statements[0].family == spec.family
            ),
            None,
        )
        if joined is None:
            groups.append(StepGroup(over, (spec,)))
        else:
            group = groups[joined]
            groups[joined] = StepGroup(over, (*group.statements, spec))
    return tuple(groups)


def summary_table() -> str:
    """The summary table of docs/language.md (`block` and `param` rows first)."""
    rows = [
        "| Statement | `tvm.s_tir.Schedule` primitive(s) | Creates |",
        "|---|---|---|",
        '| `block C:` | `sch.get_sblock("C")` | — |',
        "| `param T in …` | — (the tuner substitutes a value) | knob `T` |",
    ]
    rows += ["| " + " | ".join(spec.summary) + " |" for spec in STATEMENTS]
    return "\n".join(rows) + "\n"


__all__ = [
    "BY_KEYWORD",
    "BY_NODE",
    "KEYWORDS",
    "STATEMENTS",
    "STATEMENT_KINDS",
    "Choice",
    "Role",
    "Statement",
    "StepGroup",
    "StepPattern",
    "StepView",
    "StepsOver",
    "Steps",
    "TraceReader",
    "decompilers",
    "instructions",
    "name_roles",
    "of",
    "step_groups",
    "summary_table",
]
