"""The shapes of schedule behind the wrong kernels of issue 17, recognised in a generated case.

The checker rejects these shapes once it has a guard for them, so whether the fuzzer can reach
them is measured on what the generator writes, not on what the checker or the kernel does: each
statement is applied to a live nest (the checker's `schedlang.lang.nest.Nest`, through
`schedlang.checker.pipeline.apply_statement`, without the checker's guards) and looked at just
before it is applied. A statement TVM rejects is skipped.

- A: `rfactor` in a block that runs under a split's guard (a split that does not divide).
- B: a block placed at a loop (`cache_read`/`cache_write … at`, `compute_at`,
  `reverse_compute_at`) that has a split's inner part above it and that split's outer part below.
- C: `reverse_compute_at` of a padding block (one that stores `if_then_else(…)`).
- D: a block placed at, or under, a vectorized loop.
"""

from __future__ import annotations

from fuzz.cases import Case, case_op
from fuzz.live import _outer_part
from schedlang.lang import nodes
from schedlang.lang.statements.buffers import CacheRead, CacheWrite
from schedlang.lang.statements.moving import ComputeAt, ReverseComputeAt
from schedlang.lang.statements.reductions import Rfactor

CLASSES = {
    "A": "rfactor after a split that does not divide its extent",
    "B": "a block placed at a loop between a split's inner part (above) and outer part (below)",
    "C": "reverse_compute_at of a padding block",
    "D": "a block placed inside a vectorized loop",
}
_PLACED = (CacheRead, CacheWrite, ComputeAt, ReverseComputeAt)


def classify(case: Case) -> set[str]:
    """The classes of CLASSES that `case`'s schedule contains."""
    from schedlang.checker.pipeline import apply_statement, bind_knobs
    from schedlang.lang.syntax import parse_with_diagnostics

    schedule, diagnostics = parse_with_diagnostics(case.text)
    if schedule is None or any(d.is_error for d in diagnostics):
        return set()
    values = {p.name.text: next(iter(p.choices), 1) for p in schedule.params}
    func = case_op(case).func
    nest = _nest(func, [])
    padding = _padding_blocks(nest)
    found: set[str] = set()
    applied: list[tuple[str, nodes.Stmt]] = []
    block = None
    for stmt in bind_knobs(schedule, values).statements:
        if isinstance(stmt, nodes.BlockHeader):
            block = stmt.block.text
            continue
        try:
            if block is None:  # the op's only block, or its only reduction block
                blocks, reductions = nest.block_names(), nest.reduction_blocks()
                block = blocks[0] if len(blocks) == 1 else reductions[0]
            found |= _classes_of(nest, block, stmt, padding)
            apply_statement(nest, block, stmt)
            applied.append((block, stmt))
        except Exception:  # TVM rejects it, or it names what does not exist: not applied
            nest = _nest(func, applied)
    return found


def _nest(func, applied: list[tuple[str, nodes.Stmt]]):
    from tvm import s_tir

    from schedlang.checker.pipeline import apply_statement
    from schedlang.lang.nest import Nest

    nest = Nest(s_tir.Schedule(func, error_render_level="none"))
    for block, stmt in applied:
        apply_statement(nest, block, stmt)
    return nest


def _classes_of(nest, block: str, stmt: nodes.Stmt, padding: set[str]) -> set[str]:
    found = set()
    if isinstance(stmt, Rfactor) and nest.is_guarded(block):
        found.add("A")
    if isinstance(stmt, ReverseComputeAt) and stmt.block.text in padding:
        found.add("C")
    at = getattr(stmt, "at", None) or getattr(stmt, "axis", None)
    if isinstance(stmt, _PLACED) and at is not None:
        names = [loop.name for loop in nest.loops(block)]
        if at.text in names:
            index = names.index(at.text)
            above, below = names[: index + 1], names[index + 1 :]
            if any(_outer_part(outer, inner) for inner in above for outer in below):
                found.add("B")
            if any(loop.annotation == "vectorized" for loop in nest.loops(block)[: index + 1]):
                found.add("D")
    return found


def _padding_blocks(nest) -> set[str]:
    from tvm import tirx

    padding = set()
    for name in nest.block_names():
        body = nest.sch.get(nest.block(name)).body
        if isinstance(body, tirx.BufferStore) and "if_then_else" in str(body.value):
            padding.add(name)
    return padding
