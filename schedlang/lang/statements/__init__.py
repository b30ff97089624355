"""The statement registry: every DSL statement, declared once, in a module per family.

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

A family module declares each statement's `Syntax` (its keyword, AST class and arguments, in
`STATEMENTS`) and the statement's other facets (`FACETS`: `Checking`, `Lowering`, `Trace`,
`Decoding`; schedlang.lang.statements.facets). Here each kind of facet is keyed by keyword, and
each layer reads its own: the parser's builder and the printer (schedlang.lang.syntax,
schedlang.lang.printer), the decoding grammar's name roles (schedlang.llm.grammar) and the
model's reference (schedlang.llm.proposer) the syntax; the checker `CHECKING`; the lowering
`LOWERING`; the decompiler `TRACE` (`decompilers()`); stepwise decoding `DECODING`
(`step_groups()`); and the summary table of docs/language.md. tests/test_registry.py fails when
a keyword lacks a facet it needs. A new statement needs its grammar rule, its `Syntax` and facets
in its family module, its docs section and its tests.

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
    facets,
    fastmath,
    layout,
    loop_kinds,
    loops,
    moving,
    pragmas,
    reductions,
    tensorize,
)
from schedlang.lang.statements.args import Role
from schedlang.lang.statements.decoding import Choice, StepPattern, StepView
from schedlang.lang.statements.decompiling import TraceReader
from schedlang.lang.statements.facets import (
    Checking,
    Decoding,
    Facet,
    Lowering,
    StepsOver,
    Syntax,
    Trace,
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


def _ordered() -> tuple[Syntax, ...]:
    every = [spec for family in _FAMILIES for spec in family.STATEMENTS]
    rank = {keyword: n for n, keyword in enumerate(_LISTED)}
    return tuple(sorted(every, key=lambda s: rank.get(s.keyword, len(rank))))


STATEMENTS: tuple[Syntax, ...] = _ordered()
BY_KEYWORD: dict[str, Syntax] = {spec.keyword: spec for spec in STATEMENTS}
BY_NODE: dict[type[nodes.Stmt], Syntax] = {spec.node: spec for spec in STATEMENTS}
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


def _facets(kind: type[facets.F]) -> dict[str, facets.F]:
    """Keyword → its facet of `kind`, in registry order."""
    found = facets.declared(kind)
    return {keyword: found[keyword] for keyword in BY_KEYWORD if keyword in found}


CHECKING: dict[str, Checking] = _facets(Checking)
LOWERING: dict[str, Lowering] = _facets(Lowering)
TRACE: dict[str, Trace] = _facets(Trace)
DECODING: dict[str, Decoding] = _facets(Decoding)


def of(stmt: nodes.Stmt) -> Syntax:
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
    return {
        instruction: traces[0].statement.keyword for instruction, traces in decompilers().items()
    }


def decompilers() -> dict[str, tuple[Trace, ...]]:
    """TVM trace instruction → the trace facets that read it back, each for the instructions
    its `reads_instruction` takes (`Annotate`: `pragma` and `annotate`, by key)."""
    table: dict[str, tuple[Trace, ...]] = {}
    for trace in TRACE.values():
        table[trace.instruction] = (*table.get(trace.instruction, ()), trace)
    return table


@dataclass(frozen=True)
class StepGroup:
    """Statements stepwise decoding offers together: for each item they range over, each
    statement's steps in turn."""

    over: StepsOver
    statements: tuple[Decoding, ...]


def step_groups() -> tuple[StepGroup, ...]:
    """The statements with steps, in registry order; those of one family that range over the
    same loops or blocks join the group of the first of them."""
    groups: list[StepGroup] = []
    for decoding in DECODING.values():
        family, over = decoding.statement.family, decoding.over
        joined = next(
            (
                n
                for n, g in enumerate(groups)
                if over != "block" and g.over == over and g.statements[0].statement.family == family
            ),
            None,
        )
        if joined is None:
            groups.append(StepGroup(over, (decoding,)))
        else:
            group = groups[joined]
            groups[joined] = StepGroup(over, (*group.statements, decoding))
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
    "CHECKING",
    "DECODING",
    "KEYWORDS",
    "LOWERING",
    "STATEMENTS",
    "STATEMENT_KINDS",
    "TRACE",
    "Checking",
    "Choice",
    "Decoding",
    "Facet",
    "Lowering",
    "Role",
    "StepGroup",
    "StepPattern",
    "StepView",
    "StepsOver",
    "Syntax",
    "Trace",
    "TraceReader",
    "decompilers",
    "instructions",
    "name_roles",
    "of",
    "step_groups",
    "summary_table",
]
