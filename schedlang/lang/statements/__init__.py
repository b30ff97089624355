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
the
lowering, the decoding grammar's name roles (schedlang.llm.grammar), the model's reference
(schedlang.llm.proposer), the decompiler's instruction table (schedlang.interop.metaschedule) and
the summary
table of docs/language.md are read from here; tests/test_registry.py fails when one lacks a
statement. A new statement needs its grammar rule, a `Statement` in its family module, its docs
section and its tests.

`block NAME:` and `param` are the frame of a schedule, not statements of a family: the parser and
the checker handle them themselves.
"""

from __future__ import annotations

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
from schedlang.lang.statements.base import Role, Statement

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
    """TVM trace instruction → the keyword of the statement it decompiles to."""
    return {spec.instruction: spec.keyword for spec in STATEMENTS if spec.instruction}


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
    "Role",
    "Statement",
    "instructions",
    "name_roles",
    "of",
    "summary_table",
]
