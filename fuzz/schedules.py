"""Random schedules that are mostly right, for fuzzing the checker.

A model of each block's loops follows the names schedlang gives them (`i` → `i.o`, `i.i` after a
split; `i_j` after a fuse; `ax0` … for the loops TVM makes for a cache block or a moved block), so
most statements name real axes and real blocks. Factors are drawn from divisors, non-divisors, 0,
1, negative and huge numbers, and about one name in twelve is wrong on purpose. On a GPU target the
writer usually ends by binding every block to blockIdx/threadIdx loops, as a GPU schedule must.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from fuzz.nests import Chooser, NestSpec, build_nest, producer_axis_names, weighted
from schedlang.lang import nodes
from schedlang.lang.printer import format_schedule
from schedlang.lang.statements.buffers import CacheRead, CacheWrite, StorageAlign
from schedlang.lang.statements.loop_kinds import Bind, Parallel, Unroll, Vectorize
from schedlang.lang.statements.loops import Fuse, Reorder, Split, Tile
from schedlang.lang.statements.moving import (
    ComputeAt,
    ComputeInline,
    ReverseComputeAt,
    ReverseComputeInline,
)
from schedlang.lang.statements.pragmas import Pragma, PragmaItem
from schedlang.lang.statements.reductions import DecomposeReduction, Rfactor

# --- a model of the loop nests, as the schedule names them ---------------------------------------


@dataclass
class Loop:
    name: str
    extent: int
    kind: str  # "s" spatial, "r" reduction, "m" both (a fuse of both), "o" outer (not its own)
    thread: str | None = None
    annotation: str | None = None


@dataclass
class Block:
    name: str
    loops: list[Loop]
    buffer: str  # the buffer it writes
    reads: list[str]
    reduction: bool


@dataclass
class Model:
    """What the generator believes the nest looks like. It follows the language's naming rules
    but not every detail of TVM's (a moved block's new loops, say), so some names it produces
    are wrong: those statements get diagnostics, which is fine for a fuzzer."""

    blocks: dict[str, Block]
    buffers: dict[str, tuple[int, ...]]
    gpu: bool

    @classmethod
    def of(cls, spec: NestSpec, gpu: bool) -> Model:
        nest = build_nest(spec)
        blocks = {}
        if spec.producer:
            shape = nest.buffers[spec.producer]
            loops = [
                Loop(n, e, "s")
                for n, e in zip(producer_axis_names(len(shape), spec), shape, strict=True)
            ]
            blocks[spec.producer] = Block(spec.producer, loops, spec.producer, ["A"], False)
        loops = [Loop(n, e, "s") for n, e in spec.spatial] + [
            Loop(n, e, "r") for n, e in spec.reduce
        ]
        blocks[spec.main] = Block(
            spec.main, loops, spec.main, list(nest.reads[spec.main]), bool(spec.reduce)
        )
        if spec.consumer:
            loops = [Loop(f"{n}2", e, "s") for n, e in spec.spatial]
            blocks[spec.consumer] = Block(spec.consumer, loops, spec.consumer, [spec.main], False)
        for position, name in enumerate(spec.epilogue):
            loops = [Loop(f"{n}{position + 2}", e, "s") for n, e in spec.spatial]
            blocks[name] = Block(name, loops, name, list(nest.reads[name]), False)
        return cls(blocks, dict(nest.buffers), gpu)

    def replace_loops(self, block: str, old: Sequence[str], new: Sequence[Loop]) -> None:
        """Replace the loops named `old` (adjacent or not) by `new` at the first one's place."""
        loops = self.blocks[block].loops
        positions = [i for i, loop in enumerate(loops) if loop.name in old]
        if not positions:
            return
        first = positions[0]
        kept = [loop for loop in loops if loop.name not in old]
        kept[first:first] = new
        self.blocks[block].loops = kept

    def permute(self, block: str, order: Sequence[str]) -> None:
        """reorder: the named loops take each other's places, in the order given."""
        loops = self.blocks[block].loops
        by_name = {loop.name: loop for loop in loops}
        order = [name for name in dict.fromkeys(order) if name in by_name]
        positions = [i for i, loop in enumerate(loops) if loop.name in order]
        for position, name in zip(positions, order, strict=True):
            loops[position] = by_name[name]

    def moved(self, block: str, host: str, at: str) -> None:
        """`block` computed at loop `at` of block `host`: the host's loops down to `at`, then a
        loop `ax<n>` for each remaining dimension of what it writes."""
        host_loops = self.blocks[host].loops
        names = [loop.name for loop in host_loops]
        if at not in names:
            return
        outer = [replace(loop, kind="o") for loop in host_loops[: names.index(at) + 1]]
        shape = self.buffers.get(self.blocks[block].buffer, ())
        inner = [Loop(f"ax{n}", e, "s") for n, e in enumerate(e for e in shape if e > 1)]
        if self.blocks[block].reduction:
            inner += [
                Loop(f"ax{len(inner) + n}", loop.extent, "r")
                for n, loop in enumerate(self.blocks[block].loops)
                if loop.kind == "r"
            ]
        self.blocks[block].loops = outer + inner


# --- statements ----------------------------------------------------------------------------------

N = nodes.Name
THREADS_X = ("threadIdx.x", "threadIdx.x", "threadIdx.y", "vthread.x")


def _factor_value(chooser: Chooser, extent: int) -> int:
    """A split factor for a loop of `extent`: usually one that fits, one time in ten a wrong one."""
    kind = chooser.integer(0, 9)
    if kind == 0:
        return chooser.choice([0, -1, -extent, extent + 1, 2 * extent, 2**31, 10**20])
    if kind <= 4:
        return chooser.choice([d for d in range(1, min(extent, 4096) + 1) if extent % d == 0])
    if kind <= 8:
        return chooser.choice([2, 3, 4, 7, 8, 16, 32, 64, 128])
    return extent


class ScheduleWriter:
    """Writes a random schedule statement by statement, updating the model as it goes."""

    def __init__(self, chooser: Chooser, spec: NestSpec, gpu: bool):
        self.chooser = chooser
        self.model = Model.of(spec, gpu)
        self.items: list[nodes.Stmt] = []
        self.block: str | None = None
        self.knobs: dict[str, tuple[int, ...]] = {}

    # --- choosing names ---

    def wrong(self) -> bool:
        """Whether to make this name wrong on purpose (about one in twelve)."""
        return self.chooser.integer(0, 11) == 0

    def pick_loop(self, block: str, kinds: str = "srmo") -> Loop | None:
        loops = [loop for loop in self.model.blocks[block].loops if loop.kind in kinds]
        return self.chooser.choice(loops) if loops else None

    def axis_name(self, loop: Loop | None, block: str) -> nodes.Name:
        if loop is None or self.wrong():
            others = [loop.name for b in self.model.blocks.values() for loop in b.loops]
            junk = [f"{loop.name}.o" if loop else "i.o", "ax9", "nope", *others]
            return N(self.chooser.choice(junk))
        return N(loop.name)

    def block_name(self, candidates: Sequence[str]) -> nodes.Name:
        if not candidates or self.wrong():
            return N(self.chooser.choice(["A", "B", "nope", *self.model.blocks]))
        return N(self.chooser.choice(list(candidates)))

    def enter(self, block: str) -> None:
        if block != self.block:
            self.items.append(nodes.BlockHeader(N(block)))
            self.block = block

    def factor(self, extent: int) -> nodes.Factor:
        value = _factor_value(self.chooser, extent)
        if value > 0 and self.chooser.integer(0, 7) == 0:  # a knob whose first value is it
            name = f"T{len(self.knobs)}"
            self.knobs[name] = (value, *self.chooser.choice([(), (2,), (value + 1, 64)]))
            self.items.insert(0, nodes.Param(N(name), nodes.ListChoices(self.knobs[name])))
            return nodes.KnobFactor(name)
        return nodes.IntFactor(value)

    # --- one statement ---

    def statement(self) -> None:
        blocks = list(self.model.blocks)
        if not blocks:
            return
        if self.block not in blocks or self.chooser.integer(0, 4) == 0:
            self.enter(self.chooser.choice(blocks))
        assert self.block is not None
        gpu = self.model.gpu
        kinds = [
            (6, self.split),
            (2, self.tile),
            (3, self.reorder),
            (2, self.fuse),
            (2, self.vectorize),
            (2, self.unroll),
            (1 if gpu else 3, self.parallel),
            (4 if gpu else 1, self.bind),
            (2, self.cache_read),
            (2, self.cache_write),
            (2, self.compute_at),
            (1, self.reverse_compute_at),
            (1, self.compute_inline),
            (1, self.reverse_compute_inline),
            (2, self.rfactor),
            (2, self.decompose_reduction),
            (1, self.storage_align),
            (1, self.pragma),
        ]
        weighted(self.chooser, kinds)(self.block)

    def split(self, block: str) -> None:
        loop = self.pick_loop(block)
        axis = self.axis_name(loop, block)
        extent, kind = (loop.extent, loop.kind) if loop else (16, "s")
        ways = weighted(self.chooser, [(5, 2), (2, 3), (1, 4)])
        if ways == 2 and self.chooser.integer(0, 3):
            factors = [self.factor(extent)]  # `split i by F`: the outer part is inferred
        else:
            factors = [self.factor(max(1, extent // 4)) for _ in range(ways - 1)]
            if self.chooser.integer(0, 3):
                factors.insert(self.chooser.integer(0, ways - 1), nodes.InferredFactor())
            else:  # every factor given, the outer one covering the extent
                covered = max(math.prod(self.value(f) or 1 for f in factors), 1)
                factors.insert(0, nodes.IntFactor(math.ceil(extent / covered)))
        stmt = Split(axis, tuple(factors))
        self.items.append(stmt)
        sizes = [self.value(f) for f in stmt.parts]
        inferred = math.ceil(extent / max(math.prod(size or 1 for size in sizes), 1))
        self.model.replace_loops(block, [axis.text], [
            Loop(name, max(size or inferred, 1), kind)
            for name, size in zip(stmt.derived_names, sizes, strict=True)
        ])  # fmt: skip

    def value(self, factor: nodes.Factor) -> int | None:
        """A factor's number (a knob's first value); None for `*`."""
        if isinstance(factor, nodes.IntFactor):
            return factor.value
        if isinstance(factor, nodes.KnobFactor):
            return self.knobs[factor.name][0]
        return None

    def tile(self, block: str) -> None:
        count = self.chooser.integer(2, 3)
        loops = [self.pick_loop(block, "sr") for _ in range(count)]
        axes = tuple(self.axis_name(loop, block) for loop in loops)
        factors = tuple(self.factor(loop.extent if loop else 16) for loop in loops)
        self.items.append(Tile(axes, factors))
        if len({a.text for a in axes}) < len(axes):
            return
        outer, inner = [], []
        for axis, loop, f in zip(axes, loops, factors, strict=True):
            extent, kind = (loop.extent, loop.kind) if loop else (16, "s")
            value = max(self.value(f) or 1, 1)
            o, i = nodes.derived_axis_names(axis.text, 2)
            outer.append(Loop(o, math.ceil(extent / value), kind))
            inner.append(Loop(i, value, kind))
            self.model.replace_loops(block, [axis.text], [outer[-1], inner[-1]])
        self.model.permute(block, [x.name for x in outer + inner])

    def reorder(self, block: str) -> None:
        loops = [loop for loop in self.model.blocks[block].loops if loop.kind != "o"]
        count = min(len(loops), self.chooser.integer(2, 4))
        if count < 2:
            return
        chosen = [loops[self.chooser.integer(0, len(loops) - 1)] for _ in range(count)]
        names = list(dict.fromkeys(loop.name for loop in chosen))
        if len(names) < 2:
            names = [loop.name for loop in loops[-2:]][::-1]
        if self.wrong():
            names.append(self.axis_name(None, block).text)
        self.items.append(Reorder(tuple(N(n) for n in names)))
        self.model.permute(block, names)

    def fuse(self, block: str) -> None:
        loops = self.model.blocks[block].loops
        if len(loops) < 2:
            return
        start = self.chooser.integer(0, len(loops) - 2)
        count = min(len(loops) - start, self.chooser.integer(2, 3))
        chosen = loops[start : start + count]
        names = [loop.name for loop in chosen]
        if self.wrong():
            names.reverse()
        alias = (
            N(self.chooser.choice(["f", "ij", "fused"]))
            if self.chooser.integer(0, 3) == 0
            else None
        )
        stmt = Fuse(tuple(N(n) for n in names), alias)
        self.items.append(stmt)
        kinds = {loop.kind for loop in chosen}
        kind = kinds.pop() if len(kinds) == 1 else "m"
        fused = Loop(stmt.fused_name, math.prod(loop.extent for loop in chosen), kind)
        self.model.replace_loops(block, names, [fused])

    def vectorize(self, block: str) -> None:
        loops = self.model.blocks[block].loops
        loop = loops[-1] if loops and self.chooser.integer(0, 3) else self.pick_loop(block)
        self.items.append(Vectorize(self.axis_name(loop, block)))
        if loop:
            loop.annotation = "vectorized"

    def unroll(self, block: str) -> None:
        # Mostly small loops: unrolling a long loop over a long body builds for minutes (the
        # checker rejects it, which is worth trying now and then).
        loops = self.model.blocks[block].loops
        small = [loop for loop in loops if loop.extent <= 64]
        if small and self.chooser.integer(0, 3):
            loops = small
        loop = self.chooser.choice(loops) if loops else None
        self.items.append(Unroll(self.axis_name(loop, block)))
        if loop:
            loop.annotation = "unrolled"

    def parallel(self, block: str) -> None:
        loops = self.model.blocks[block].loops
        loop = loops[0] if loops and self.chooser.boolean() else self.pick_loop(block, "s")
        self.items.append(Parallel(self.axis_name(loop, block)))
        if loop:
            loop.annotation = "parallel"

    def bind(self, block: str) -> None:
        loop = self.pick_loop(block)
        thread = self.chooser.choice(nodes.THREAD_AXES)
        self.items.append(Bind(self.axis_name(loop, block), N(thread)))
        if loop:
            loop.thread = thread

    def scope(self) -> str:
        if self.model.gpu:
            return self.chooser.choice(
                ["shared", "local", "shared", "global", "shared.dyn", "warp"]
            )
        return self.chooser.choice(["global", "local", "global", "shared"])

    def at(self, block: str) -> nodes.Name | None:
        if self.chooser.boolean():
            return None
        return self.axis_name(self.pick_loop(block, "srmo"), block)

    def alias(self) -> nodes.Name | None:
        if self.chooser.integer(0, 3):
            return None
        return N(self.chooser.choice(["X_c", "cache", "C", "A"]))

    def cache_read(self, block: str) -> None:
        reads = self.model.blocks[block].reads
        buffer = self.block_name(reads).text
        scope, at, alias = self.scope(), self.at(block), self.alias()
        self.items.append(CacheRead(N(buffer), N(scope), at, alias))
        name = alias.text if alias else f"{buffer}_{scope.replace('.', '_')}"
        if buffer not in reads or name in self.model.blocks:
            return
        shape = self.model.buffers.get(buffer, (16,))
        self.model.buffers[name] = shape
        loops = [Loop(f"ax{n}", e, "s") for n, e in enumerate(shape)]
        self.model.blocks = _insert_before(
            self.model.blocks, block, Block(name, loops, name, [buffer], False)
        )
        self.model.blocks[block].reads = [name if r == buffer else r for r in reads]
        if at is not None:
            self.model.moved(name, block, at.text)

    def cache_write(self, block: str) -> None:
        written = self.block_name([block, *self.model.blocks]).text
        scope, at, alias = self.scope(), self.at(block), self.alias()
        self.items.append(CacheWrite(N(written), N(scope), at, alias))
        name = alias.text if alias else f"{written}_{scope.replace('.', '_')}"
        if written not in self.model.blocks or name in self.model.blocks:
            return
        writer = self.model.blocks[written]
        shape = self.model.buffers.get(writer.buffer, (16,))
        loops = [Loop(f"ax{n}", e, "s") for n, e in enumerate(shape)]
        # The block now computes into the cache; the new block copies it out to the buffer.
        self.model.buffers[name] = shape
        copy = Block(name, loops, writer.buffer, [name], False)
        writer.buffer = name
        self.model.blocks = _insert_after(self.model.blocks, written, copy)
        if at is not None:
            self.model.moved(name, block, at.text)

    def compute_at(self, block: str) -> None:
        others = [b for b in self.model.blocks if b != block]
        producers = [
            b for b in others if self.model.blocks[b].buffer in self.model.blocks[block].reads
        ]
        moved = self.block_name(producers or others)
        loop = self.pick_loop(block, "srmo")
        axis = self.axis_name(loop, block)
        self.items.append(ComputeAt(moved, axis))
        if moved.text in self.model.blocks and moved.text != block:
            self.model.moved(moved.text, block, axis.text)

    def reverse_compute_at(self, block: str) -> None:
        buffer = self.model.blocks[block].buffer
        consumers = [b for b, v in self.model.blocks.items() if buffer in v.reads and b != block]
        moved = self.block_name(consumers)
        axis = self.axis_name(self.pick_loop(block, "srmo"), block)
        self.items.append(ReverseComputeAt(moved, axis))
        if moved.text in self.model.blocks and moved.text != block:
            self.model.moved(moved.text, block, axis.text)

    def compute_inline(self, block: str) -> None:
        candidates = [b for b, v in self.model.blocks.items() if not v.reduction]
        inlined = self.block_name(candidates)
        self.items.append(ComputeInline(inlined))
        self._remove(inlined.text, keep=block)

    def reverse_compute_inline(self, block: str) -> None:
        candidates = [b for b, v in self.model.blocks.items() if not v.reduction]
        inlined = self.block_name(candidates)
        self.items.append(ReverseComputeInline(inlined))
        self._remove(inlined.text, keep=block)

    def _remove(self, name: str, keep: str) -> None:
        if name in self.model.blocks and name != keep:
            buffer = self.model.blocks.pop(name).buffer
            for other in self.model.blocks.values():
                other.reads = [r for r in other.reads if r != buffer]

    def rfactor(self, block: str) -> None:
        loop = self.pick_loop(block, "r")
        axis = self.axis_name(loop, block)
        alias = self.alias() if self.chooser.integer(0, 2) == 0 else None
        self.items.append(Rfactor(axis, alias))
        name = alias.text if alias else f"{block}_rf"
        if loop is None or name in self.model.blocks:
            return
        current = self.model.blocks[block]
        rf_loops = [replace(x, kind="s" if x.name == axis.text else x.kind) for x in current.loops]
        rf_block = Block(name, rf_loops, name, list(current.reads), True)
        self.model.buffers[name] = (loop.extent, *self.model.buffers.get(current.buffer, ()))
        current.loops = [replace(x) for x in current.loops if x.kind != "r" or x.name == axis.text]
        current.reads = [name]
        self.model.blocks = _insert_before(self.model.blocks, block, rf_block)

    def decompose_reduction(self, block: str) -> None:
        owner = block
        named = None
        if self.chooser.integer(0, 3) == 0:
            named = self.block_name([b for b, v in self.model.blocks.items() if v.reduction])
            owner = named.text
        loop = self.pick_loop(owner, "rs") if owner in self.model.blocks else None
        self.items.append(DecomposeReduction(named, self.axis_name(loop, owner)))

    def storage_align(self, block: str) -> None:
        aligned = self.block_name(list(self.model.blocks))
        found = self.model.blocks.get(aligned.text)
        rank = len(self.model.buffers.get(found.buffer, ())) if found else 2
        dim = self.chooser.choice([max(rank - 2, 0), max(rank - 1, 0), rank, 0])
        factor = self.chooser.choice([32, 16, 8, 1, 0])
        offset = self.chooser.choice([1, 0, 4, factor, factor + 1])
        self.items.append(
            StorageAlign(
                aligned, nodes.IntFactor(dim), nodes.IntFactor(factor), nodes.IntFactor(offset)
            )
        )

    def pragma(self, block: str) -> None:
        loops = self.model.blocks[block].loops
        loop = loops[0] if loops and self.chooser.boolean() else self.pick_loop(block)
        key = self.chooser.choice(nodes.PRAGMA_KEYS)
        if key == "unroll_explicit":
            value = self.chooser.choice([1, 0, 2])
        else:
            value = self.chooser.choice([16, 0, 64, 512, -1, 99999])
        self.items.append(
            Pragma(self.axis_name(loop, block), (PragmaItem(N(key), nodes.IntFactor(value)),))
        )

    # --- binding every block to GPU threads ---

    def bind_all(self) -> None:
        """What a GPU schedule needs: each block's outer spatial loops fused, split, and bound to
        blockIdx.x and a thread axis (a loop nest left unbound cannot run on a GPU)."""
        for name in list(self.model.blocks):
            block = self.model.blocks[name]
            if any(loop.thread for loop in block.loops):
                continue
            if block.loops and block.loops[0].kind == "o":
                self.bind_inner(name)
                continue
            leading = []
            for loop in block.loops:
                if loop.kind != "s" or loop.annotation:
                    break
                leading.append(loop)
            if not leading:
                continue
            self.enter(name)
            fused = leading[0]
            if len(leading) > 1:
                stmt = Fuse(tuple(N(loop.name) for loop in leading))
                self.items.append(stmt)
                fused = Loop(stmt.fused_name, math.prod(x.extent for x in leading), "s")
                self.model.replace_loops(name, [x.name for x in leading], [fused])
            threads = self.chooser.choice([32, 64, 128, 256, 1024, 3, 97, fused.extent])
            thread_axis = self.chooser.choice(THREADS_X)
            if threads >= fused.extent:
                self.items.append(Bind(N(fused.name), N(thread_axis)))
                fused.thread = thread_axis
                continue
            split = Split(N(fused.name), (nodes.IntFactor(threads),))
            self.items.append(split)
            outer, inner = split.derived_names
            grid_axis = self.chooser.choice(["blockIdx.x", "blockIdx.y"])
            self.items.append(Bind(N(outer), N(grid_axis)))
            self.items.append(Bind(N(inner), N(thread_axis)))
            self.model.replace_loops(
                name,
                [fused.name],
                [
                    Loop(outer, math.ceil(fused.extent / threads), "s", grid_axis),
                    Loop(inner, threads, "s", thread_axis),
                ],
            )

    def bind_inner(self, name: str) -> None:
        """A block computed at a loop of another: its own loops, fused, spread over the threads."""
        own = [loop for loop in self.model.blocks[name].loops if loop.kind == "s"]
        if not own or self.chooser.boolean():
            return
        self.enter(name)
        fused = own[0]
        if len(own) > 1:
            stmt = Fuse(tuple(N(loop.name) for loop in own))
            self.items.append(stmt)
            fused = Loop(stmt.fused_name, math.prod(x.extent for x in own), "s")
            self.model.replace_loops(name, [x.name for x in own], [fused])
        threads = self.chooser.choice([32, 64, 8, 128])
        split = Split(N(fused.name), (nodes.IntFactor(threads),))
        self.items.append(split)
        self.items.append(Bind(N(split.derived_names[1]), N("threadIdx.x")))


def _insert_before(blocks: dict[str, Block], before: str, new: Block) -> dict[str, Block]:
    items = list(blocks.items())
    index = next((n for n, (name, _) in enumerate(items) if name == before), len(items))
    items.insert(index, (new.name, new))
    return dict(items)


def _insert_after(blocks: dict[str, Block], after: str, new: Block) -> dict[str, Block]:
    items = list(blocks.items())
    index = next((n for n, (name, _) in enumerate(items) if name == after), len(items) - 1)
    items.insert(index + 1, (new.name, new))
    return dict(items)


def random_schedule(chooser: Chooser, spec: NestSpec, gpu: bool) -> str:
    """A schedule for `spec`, as text: random statements, then on a GPU target (usually) the
    bindings every block needs, then a few more statements."""
    writer = ScheduleWriter(chooser, spec, gpu)
    for _ in range(chooser.integer(0, 8)):
        writer.statement()
    if gpu and chooser.integer(0, 4):
        writer.bind_all()
    for _ in range(chooser.integer(0, 2)):
        writer.statement()
    return format_schedule(nodes.Schedule(tuple(writer.items)))
