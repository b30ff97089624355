"""Random schedules written against the live loop nest: every statement is drawn from the blocks
and loops as they are at that point, and applied to a real `s_tir.Schedule` before the next.

fuzz/schedules.py keeps its own model of the loops, which drifts from TVM's after a cache or a
moved block; this writer asks `schedlang.lang.nest.Nest` (the checker's own view: names, extents,
kinds, annotations, which block reads and writes what) and applies each statement with
`schedlang.checker.pipeline.apply_statement`, without the checker's guards. So almost every
statement is one TVM accepts, and the checker, not the generator, decides what is safe: what it lets
through is built and run against the reference (fuzz/differential.py).

What it draws, and why:
- every statement of the language, with its options (`at … keep_unit_loops`, `as`, `factor_axis`,
  knobs as factors, `decompose_reduction BLOCK at`), for any block, not only the main one;
- split factors that divide, that do not divide (guards), and a few that are wrong;
- reorders that swap a split's parts (inner above outer) and move an annotated loop (vectorized,
  unrolled, parallel) outward;
- after a statement creates a block (cache_read, cache_write, rfactor), often a statement about it
  next: a compute_at or reverse_compute_at in either direction between it and the block it feeds
  or reads, or a section that schedules it;
- moves between any producer and consumer (padding blocks, epilogues, caches), at any loop.

A statement TVM rejects is dropped, or (one in four) kept so the checker has to say why; one
statement in twenty names an axis that does not exist.
"""

from __future__ import annotations

import math
from dataclasses import replace

from fuzz.nests import Chooser, weighted
from schedlang.lang import nodes
from schedlang.lang.printer import format_schedule
from schedlang.lang.statements.buffers import CacheRead, CacheWrite, StorageAlign
from schedlang.lang.statements.loop_kinds import Parallel, Unroll, Vectorize
from schedlang.lang.statements.loops import Fuse, Reorder, Split, Tile
from schedlang.lang.statements.moving import (
    ComputeAt,
    ComputeInline,
    ReverseComputeAt,
    ReverseComputeInline,
)
from schedlang.lang.statements.pragmas import Pragma, PragmaItem
from schedlang.lang.statements.reductions import DecomposeReduction, Rfactor

N = nodes.Name
SCOPES = ((5, "global"), (2, "local"), (1, "shared"))
PRAGMAS = {"auto_unroll_max_step": (16, 0, 4, 64, 512), "unroll_explicit": (1, 0)}
MAX_STATEMENTS = 10
# How often each statement is written, relative to the others (LiveWriter's methods by name);
# `diff_run.py --weight rfactor=9` weighs one up for a run.
WEIGHTS = {
    "split": 6,
    "tile": 2,
    "reorder": 4,
    "fuse": 2,
    "vectorize": 3,
    "unroll": 2,
    "parallel": 2,
    "cache_read": 3,
    "cache_write": 3,
    "move": 4,
    "compute_inline": 1,
    "reverse_compute_inline": 1,
    "rfactor": 3,
    "decompose_reduction": 2,
    "storage_align": 1,
    "pragma": 1,
}


class LiveWriter:
    """Writes a random schedule for `func`, statement by statement, over the live nest."""

    def __init__(self, chooser: Chooser, func):
        self.chooser = chooser
        self.func = func
        self.params = {p.name for p in func.params}  # 0.27: a buffer argument is its own Var
        self.items: list[nodes.Stmt] = []  # the text: headers, statements (knobs go first)
        self.knobs: list[nodes.Param] = []
        self.applied: list[tuple[str, nodes.Stmt]] = []  # what the live nest has seen
        self.nest = self.replay()
        self.section: str | None = None
        self.created: str | None = None  # the block the last statement made, if any
        self.reshaped: str | None = None  # the block whose loops the last statement changed
        self.names = 0  # aliases made so far

    # --- the live nest ---

    def replay(self):
        """A fresh nest with every applied statement: how a rejected statement is undone (a
        primitive that fails half-way may leave the schedule changed)."""
        from tvm import s_tir

        from schedlang.checker.pipeline import apply_statement
        from schedlang.lang.nest import Nest

        nest = Nest(s_tir.Schedule(self.func, error_render_level="none"))
        for block, stmt in self.applied:
            apply_statement(nest, block, stmt)
        return nest

    def blocks(self) -> list[str]:
        return self.nest.block_names()

    def loops(self, block: str, *kinds: str):
        loops = self.nest.loops(block)
        return [loop for loop in loops if loop.kind in kinds] if kinds else loops

    def own_loops(self, block: str):
        return [loop for loop in self.nest.loops(block) if loop.kind != "outer"]

    def producers(self, block: str) -> list[str]:
        reads = set(self.nest.reads(block))
        return [b for b in self.blocks() if b != block and set(self.nest.writes(b)) & reads]

    def consumers(self, block: str) -> list[str]:
        writes = set(self.nest.writes(block))
        return [b for b in self.blocks() if b != block and set(self.nest.reads(b)) & writes]

    def alias(self, base: str) -> nodes.Name | None:
        if self.chooser.integer(0, 4):
            return None
        self.names += 1
        return N(f"{base}_{self.chooser.choice(['c', 'x', 'rf'])}{self.names}")

    # --- writing ---

    def emit(self, block: str, stmt: nodes.Stmt, text: nodes.Stmt | None = None) -> bool:
        """Apply `stmt` in the section of `block` and write it (as `text`, its form with knobs,
        if given); a statement TVM rejects is undone, and written one time in four."""
        from schedlang.checker.pipeline import apply_statement

        if self.section != block:
            self.items.append(nodes.BlockHeader(N(block)))
            self.section = block
        if self.chooser.integer(0, 19) == 0 and (wrong := _misnamed(stmt)) is not None:
            self.items.append(wrong)
            return False
        before = set(self.blocks())
        try:
            apply_statement(self.nest, block, stmt)
            names = self.blocks()
            if len(set(names)) < len(names):  # a second rfactor, say: a name no longer says which
                raise ValueError("two blocks of one name")
        except Exception:  # TVM's errors have several types; what it rejects is simply undone
            self.nest = self.replay()
            if self.chooser.integer(0, 3) == 0:
                self.items.append(text or stmt)
            return False
        self.items.append(text or stmt)
        self.applied.append((block, stmt))
        created = [b for b in self.blocks() if b not in before]
        self.created = created[0] if created else None
        loop_statements = (Split, Tile, Reorder, Fuse, Vectorize)
        self.reshaped = block if isinstance(stmt, loop_statements) else None
        return True

    def text(self) -> str:
        return format_schedule(nodes.Schedule((*self.knobs, *self.items)))

    # --- factors ---

    def factor_value(self, extent: int) -> int:
        kind = self.chooser.integer(0, 19)
        divisors = [d for d in range(2, min(extent, 4096)) if extent % d == 0]
        if kind == 0:  # wrong on purpose (numbers past int32 are the parser's: fuzz/schedules.py)
            # (far past the extent too: a warning up to GUARDED_ITERATIONS since issue 32)
            return self.chooser.choice([0, -1, extent + 1, 2 * extent, 2**31 - 1, 40 * extent + 7])
        if kind <= 6 and divisors:
            return self.chooser.choice(divisors)
        if kind <= 12 and extent > 2:
            return self.chooser.integer(2, extent - 1)
        if kind <= 17:
            return self.chooser.choice([2, 3, 4, 8, 16, 32])
        return self.chooser.choice([extent, 1])

    def factor(self, value: int) -> nodes.Factor:
        """`value` as a number, or (one in eight) a knob whose first value it is."""
        if not 0 < value < 2**31 or self.chooser.integer(0, 7):  # knob values are int32
            return nodes.IntFactor(value)
        name = f"T{len(self.knobs)}"
        rest = self.chooser.choice([(), (value * 2,), (1, 64)])
        self.knobs.append(nodes.Param(N(name), nodes.ListChoices((value, *rest))))
        return nodes.KnobFactor(name)

    # --- statements ---

    def statement(self) -> None:
        blocks = self.blocks()
        if self.created in blocks and self.chooser.boolean():
            self.follow_up(self.created)
            return
        if self.reshaped in blocks and self.chooser.boolean():
            self.place_in(self.reshaped)
            return
        block = self.section
        if block not in blocks or self.chooser.integer(0, 3) == 0:
            block = self.chooser.choice(blocks)
        kinds = [(weight, getattr(self, name)) for name, weight in WEIGHTS.items()]
        self.created = None
        weighted(self.chooser, kinds)(block)

    def follow_up(self, new: str) -> None:
        """A statement about the block just made: move it, move into it, or schedule it."""
        self.created = None
        if self.chooser.integer(0, 2):
            self.move(new, involving=new)
        else:
            self.section_of(new)

    def place_in(self, block: str) -> None:
        """A block placed at a loop of `block`, whose loops just changed."""
        self.reshaped = None
        action = self.chooser.choice([self.cache_read, self.cache_write, self.move])
        action(block, placed=True)

    def section_of(self, block: str) -> None:
        action = self.chooser.choice([self.split, self.vectorize, self.move, self.reorder])
        action(block)

    def split(self, block: str) -> None:
        loops = self.loops(block)
        if not loops:
            return
        loop = self.chooser.choice(loops)
        extent = loop.extent or 16
        ways = weighted(self.chooser, [(6, 2), (2, 3), (1, 4)])
        if ways == 2 and self.chooser.integer(0, 3):
            values: list[int | None] = [self.factor_value(extent)]
        else:
            values = [self.factor_value(max(2, extent // 4)) for _ in range(ways - 1)]
            if self.chooser.integer(0, 3):
                values.insert(self.chooser.integer(0, ways - 1), None)
            else:
                covered = max(math.prod(v for v in values if v), 1)
                values.insert(0, max(1, math.ceil(extent / covered)))
        applied = tuple(nodes.InferredFactor() if v is None else nodes.IntFactor(v) for v in values)
        text = tuple(nodes.InferredFactor() if v is None else self.factor(v) for v in values)
        self.emit(block, Split(N(loop.name), applied), Split(N(loop.name), text))

    def tile(self, block: str) -> None:
        own = self.own_loops(block)
        if len(own) < 2:
            return
        count = min(len(own), self.chooser.integer(2, 3))
        chosen = []
        for _ in range(count):
            loop = self.chooser.choice([x for x in own if x not in chosen])
            chosen.append(loop)
        values = [self.factor_value(loop.extent or 16) for loop in chosen]
        axes = tuple(N(loop.name) for loop in chosen)
        self.emit(
            block,
            Tile(axes, tuple(nodes.IntFactor(v) for v in values)),
            Tile(axes, tuple(self.factor(v) for v in values)),
        )

    def reorder(self, block: str) -> None:
        own = self.own_loops(block)
        if len(own) < 2:
            return
        names = [loop.name for loop in own]
        strategy = weighted(self.chooser, [(2, "any"), (2, "parts"), (1, "annotated")])
        order: list[str] = []
        if strategy == "parts":  # a split's parts, inner above outer
            parts = [(a, b) for a in names for b in names if _outer_part(b, a)]
            if parts:
                inner, outer = self.chooser.choice(parts)
                order = [inner, outer]
        elif strategy == "annotated":  # an annotated loop moved outward
            marked = [n for n, loop in enumerate(own) if loop.annotation and n > 0]
            if marked:
                index = self.chooser.choice(marked)
                order = [names[index], names[self.chooser.integer(0, index - 1)]]
        if not order:
            names = list(dict.fromkeys(names))
            for _ in range(min(len(names), self.chooser.integer(2, 4))):
                order.append(self.chooser.choice([n for n in names if n not in order]))
        if len(order) > 1:
            self.emit(block, Reorder(tuple(N(n) for n in order)))

    def fuse(self, block: str) -> None:
        own = self.own_loops(block)
        if len(own) < 2:
            return
        start = self.chooser.integer(0, len(own) - 2)
        count = min(len(own) - start, self.chooser.integer(2, 3))
        axes = tuple(N(loop.name) for loop in own[start : start + count])
        alias = None if self.chooser.integer(0, 3) else N(f"f{len(self.items)}")
        self.emit(block, Fuse(axes, alias))

    def vectorize(self, block: str) -> None:
        loops = self.loops(block)
        if not loops:
            return
        loop = loops[-1] if self.chooser.integer(0, 3) else self.chooser.choice(loops)
        self.emit(block, Vectorize(N(loop.name)))

    def unroll(self, block: str) -> None:
        loops = self.loops(block)
        small = [loop for loop in loops if (loop.extent or 0) <= 16]
        pool = small if small and self.chooser.integer(0, 3) else loops
        if pool:
            self.emit(block, Unroll(N(self.chooser.choice(pool).name)))

    def parallel(self, block: str) -> None:
        loops = self.loops(block)
        if loops:
            loop = loops[0] if self.chooser.boolean() else self.chooser.choice(loops)
            self.emit(block, Parallel(N(loop.name)))

    def scope(self) -> nodes.Name:
        return N(weighted(self.chooser, SCOPES))

    def at(self, block: str, placed: bool = False) -> tuple[nodes.Name | None, bool]:
        loops = self.loops(block)
        if not loops or (not placed and self.chooser.boolean()):
            return None, False
        return N(self.chooser.choice(loops).name), self.chooser.integer(0, 3) == 0

    def cache_read(self, block: str, placed: bool = False) -> None:
        # rfactor's buffer is `C.rf`: no name a schedule can write
        reads = [name for name in self.nest.reads(block) if name.isidentifier()]
        if not reads:
            return
        buffer = self.chooser.choice(reads)
        at, keep = self.at(block, placed)
        alias = self.alias(buffer)
        self.emit(block, CacheRead(N(buffer), self.scope(), at, alias, keep))

    def cache_write(self, block: str, placed: bool = False) -> None:
        target = block if self.chooser.integer(0, 4) else self.chooser.choice(self.blocks())
        at, keep = self.at(block, placed)
        alias = self.alias(target)
        self.emit(block, CacheWrite(N(target), self.scope(), at, alias, keep))

    def move(self, block: str, involving: str | None = None, placed: bool = False) -> None:
        """compute_at of a producer, or reverse_compute_at of a consumer, at a loop of the block
        it feeds or reads; between `involving` and its neighbours when given, else between any
        two blocks (one time in three, unless `placed` in `block`) or `block` and its
        neighbours."""
        blocks = self.blocks()
        anywhere = involving or (not placed and self.chooser.integer(0, 2) == 0)
        hosts = blocks if anywhere else [block]
        pairs = [(host, mover, ComputeAt) for host in hosts for mover in self.producers(host)]
        pairs += [
            (host, mover, ReverseComputeAt) for host in hosts for mover in self.consumers(host)
        ]
        if involving:
            pairs = [p for p in pairs if involving in p[:2]]
        if not pairs:
            return
        host, mover, kind = self.chooser.choice(pairs)
        loops = self.loops(host)
        if not loops:
            return
        loop = self.chooser.choice(loops)
        self.emit(host, kind(N(mover), N(loop.name), self.chooser.integer(0, 3) == 0))

    def compute_inline(self, block: str) -> None:
        self._inline(ComputeInline, block)

    def reverse_compute_inline(self, block: str) -> None:
        self._inline(ReverseComputeInline, block)

    def _inline(self, kind, block: str) -> None:
        candidates = [b for b in self.blocks() if not self.nest.is_reduction_block(b)]
        if candidates:
            self.emit(block, kind(N(self.chooser.choice(candidates))))

    def rfactor(self, block: str) -> None:
        reductions = self.nest.reduction_blocks()
        if not reductions:
            return
        if block not in reductions:
            block = self.chooser.choice(reductions)
        loops = self.loops(block, "reduce")
        if not loops:
            return
        loop = self.chooser.choice(loops)
        position = None
        if self.chooser.integer(0, 3) == 0:
            rank = len(self.nest.write_buffer(block).shape)
            position = nodes.IntFactor(self.chooser.integer(0, rank))
        self.emit(block, Rfactor(N(loop.name), self.alias(block), position))

    def decompose_reduction(self, block: str) -> None:
        reductions = self.nest.reduction_blocks()
        if not reductions:
            return
        owner = block if block in reductions else self.chooser.choice(reductions)
        loops = self.loops(owner)
        if not loops:
            return
        named = N(owner) if owner != block or self.chooser.integer(0, 3) == 0 else None
        section = block if named else owner
        self.emit(section, DecomposeReduction(named, N(self.chooser.choice(loops).name)))

    def storage_align(self, block: str) -> None:
        scratch = [b for b in self.blocks() if set(self.nest.writes(b)) - self.params]
        if not scratch:
            return
        aligned = self.chooser.choice(scratch)
        rank = len(self.nest.write_buffer(aligned).shape)
        dim = self.chooser.integer(0, rank - 1) if self.chooser.integer(0, 9) else rank
        factor = self.chooser.choice([16, 8, 4, 32, 2, 64, 1, 2**30])
        # Past the factor too: TVM pads to the offset modulo the factor (issue 32).
        offset = self.chooser.choice([1, 0, factor - 1, factor // 2, factor + 3, 3 * factor])
        self.emit(
            block,
            StorageAlign(N(aligned), *(nodes.IntFactor(v) for v in (dim, factor, offset))),
        )

    def pragma(self, block: str) -> None:
        loops = self.loops(block)
        if not loops:
            return
        loop = loops[0] if self.chooser.boolean() else self.chooser.choice(loops)
        keys = list(PRAGMAS)
        if self.chooser.integer(0, 3):
            keys = [self.chooser.choice(keys)]
        items = tuple(
            PragmaItem(N(key), nodes.IntFactor(self.chooser.choice(PRAGMAS[key]))) for key in keys
        )
        self.emit(block, Pragma(N(loop.name), items))


def _part(name: str) -> tuple[str, int] | None:
    """`i.o` → ("i", 0), `i.i` → ("i", 1), `k.2` → ("k", 2): a split's part and its rank."""
    parent, dot, suffix = name.rpartition(".")
    if not dot:
        return None
    if suffix in ("o", "i"):
        return parent, "oi".index(suffix)
    return (parent, int(suffix)) if suffix.isdigit() else None


def _outer_part(outer: str, inner: str) -> bool:
    """Whether `outer` is a part of the same split as `inner`, further out."""
    a, b = _part(outer), _part(inner)
    return a is not None and b is not None and a[0] == b[0] and a[1] < b[1]


def _misnamed(stmt: nodes.Stmt) -> nodes.Stmt | None:
    """`stmt` naming an axis that does not exist."""
    if hasattr(stmt, "axis"):
        return replace(stmt, axis=N(f"{stmt.axis.text}.x"))
    return None


def live_schedule(chooser: Chooser, func) -> str:
    """A schedule of 1-10 statements for `func`, as text."""
    writer = LiveWriter(chooser, func)
    for _ in range(chooser.integer(1, MAX_STATEMENTS)):
        writer.statement()
    return writer.text()


def apply_unchecked(text: str, func):
    """`func` scheduled by `text` without the checker's guards (what TVM accepts is applied):
    how a test shows what a kernel the checker now rejects would compute."""
    from tvm import s_tir

    from schedlang.checker.pipeline import apply_statement
    from schedlang.lang.nest import Nest
    from schedlang.lang.syntax import parse

    nest = Nest(s_tir.Schedule(func, error_render_level="none"))
    block = None
    for stmt in parse(text).statements:
        if isinstance(stmt, nodes.BlockHeader):
            block = stmt.block.text
            continue
        if block is None:  # the op's only block, or its only reduction block
            blocks, reductions = nest.block_names(), nest.reduction_blocks()
            block = blocks[0] if len(blocks) == 1 else reductions[0]
        apply_statement(nest, block, stmt)
    return nest.sch.mod["main"]
