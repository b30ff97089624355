"""Tensor intrinsics: `tensorize LOOP with INTRIN`.

INTRIN names one of TVM's registered tensor intrinsics (`tvm.s_tir.tensor_intrin`: CUDA
`mma_*`/`wmma_*` with `ldmatrix`, x86 `dot_*` int8 dot products, Arm `dot_*`/`sdot`). The loops
from LOOP inward are replaced by the intrinsic's implementation. Before TVM compares the two, the
checker compares what a person can read: the loops under LOOP against the intrinsic's loop nest
(count and extents), the dtypes and memory scopes of what the block reads and writes against the
intrinsic's buffers, and the target the intrinsic is for.

Importing TVM's intrinsics defines ~250 TVMScript functions; each `@T.prim_func` walks the Python
stack with `inspect.stack()`, which reads source files, ~35 s in all here. The import runs once,
the first time a schedule uses `tensorize`, with a frame walk that reads no files instead.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from schedlang.core.diagnostics import did_you_mean, one_of
from schedlang.lang import nodes
from schedlang.lang.loop import Consumed
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import Axis, Intrinsic
from schedlang.lang.statements.base import checked_loop, loop
from schedlang.lang.statements.decompiling import TraceReader, Untranslatable
from schedlang.lang.statements.facets import Syntax

if TYPE_CHECKING:
    from types import FrameType

    from schedlang.core.target import Target
    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker


@dataclass(frozen=True)
class Tensorize(nodes.Stmt, keyword="tensorize"):
    """`tensorize k.i with mma_f16f16f16`: compute the loops from AXIS inward with INTRIN."""

    axis: nodes.Name
    intrin: nodes.Name


# --- TVM's intrinsics ----------------------------------------------------------------------------

# The module that registers an intrinsic says what hardware it needs.
_FAMILY_MODULES = {
    "cuda": "CUDA tensor cores",
    "x86": "x86 CPUs",
    "arm_cpu": "Arm CPUs",
    "rocm": "AMD GPUs",
    "hexagon": "Hexagon DSPs",
    "riscv_cpu": "RISC-V CPUs",
    "metal": "Apple GPUs",
}


def _frames_without_source(context: int = 1) -> list[inspect.FrameInfo]:
    frame: FrameType | None = sys._getframe(1)
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append(
            inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None)
        )
        frame = frame.f_back
    return frames


@cache
def intrinsics() -> dict[str, str]:
    """Every registered tensor intrinsic → the family module that registered it."""
    stack = inspect.stack
    inspect.stack = _frames_without_source  # see the module's docstring
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.stack = stack
    found: dict[str, str] = {}
    for family in _FAMILY_MODULES:
        module = sys.modules.get(f"tvm.s_tir.tensor_intrin.{family}")
        for attr, value in (vars(module) if module else {}).items():
            if attr.endswith("_INTRIN") and isinstance(value, str):
                found.setdefault(value, family)
    return found


def intrinsic(name: str) -> Any | None:
    from tvm.s_tir import TensorIntrin

    intrinsics()
    return TensorIntrin.get(name, allow_missing=True)


@dataclass(frozen=True)
class Shape:
    """What an intrinsic's description computes: its loop extents, outer first, and the
    (dtype, scope) of the buffers its block reads and writes."""

    extents: tuple[int, ...]
    reads: tuple[tuple[str, str], ...]
    writes: tuple[tuple[str, str], ...]
    readable: bool = True


def describe(desc: Any) -> Shape:
    from tvm import s_tir, tirx

    extents: list[int] = []
    blocks: list[Any] = []
    node = desc.body
    while node is not None:  # a description is one nest: root block, loops, one block
        if isinstance(node, s_tir.SBlockRealize):
            node = node.block
        elif isinstance(node, s_tir.SBlock):
            blocks.append(node)
            node = node.body
        elif isinstance(node, tirx.For):
            extents.append(int(node.extent) if isinstance(node.extent, tirx.IntImm) else -1)
            node = node.body
        elif isinstance(node, tirx.SeqStmt) and len(node.seq) == 1:
            node = node.seq[0]
        else:
            node = None
    if not blocks:  # not a description schedlang can read: TVM's own comparison decides
        return Shape(tuple(extents), (), (), readable=False)
    inner = blocks[-1]
    return Shape(
        tuple(extents),
        tuple(_access(r.source) for r in inner.reads),
        tuple(_access(r.source) for r in inner.writes),
    )


def _access(buffer: Any) -> tuple[str, str]:
    return str(buffer.dtype), buffer.scope()


def _accesses(regions: Any) -> tuple[tuple[str, str], ...]:
    return tuple(_access(r.source) for r in regions)


def _sm(arch: str | None) -> int | None:
    match = re.fullmatch(r"sm_(\d+)a?", arch or "")
    return int(match[1]) if match else None


def binds_lanes_itself(nest: Nest, block: str) -> bool:
    """Whether the block's body binds threadIdx.x itself, as the body of a warp-level intrinsic
    (ldmatrix, mma) put there by tensorize does: its stores are spread over a warp's lanes."""
    todo = [nest.sch.get(nest.block(block)).body]
    while todo:
        node = todo.pop()
        if node is None:
            continue
        binding = getattr(node, "thread_binding", None)  # a For bound to a thread axis
        if binding is not None and binding.thread_tag == "threadIdx.x":
            return True
        todo += list(getattr(node, "seq", None) or ())
        todo += [getattr(node, name, None) for name in ("body", "then_case", "else_case")]
        if hasattr(node, "block") and hasattr(node, "iter_values"):  # a block realize
            todo.append(node.block)
    return False


def written_by_intrinsics(nest: Nest, buffer: str) -> bool:
    """Whether every block that writes `buffer` is a warp-level intrinsic (see above): TVM's
    warp-memory lowering then takes the intrinsic's layout (e.g. 8 halves per lane)."""
    writers = [b for b in nest.block_names() if buffer in nest.writes(b)]
    return bool(writers) and all(binds_lanes_itself(nest, b) for b in writers)


# fmt: off
TENSORIZE = Syntax("tensorize", Tensorize, "tensorize",
    (Axis(consumed=True), Intrinsic("intrin", word="with")),
    example="e.g. `tensorize k.i with mma_f16f16f16` or `tensorize ax0.i with "
    "mma_ldmatrix_f16_a_dyn`",
    description="compute the loops from AXIS inward with a TVM tensor intrinsic (CUDA mma_*, "
    "wmma_*, ldmatrix; x86/Arm int8 dot_*), whose loop nest they must match.",
    summary=("`tensorize a with INTRIN`", '`sch.tensorize(loop, "INTRIN")`', "—"))
# fmt: on

STATEMENTS = (TENSORIZE,)


# --- the guard -----------------------------------------------------------------------------------


@facets.guard(TENSORIZE)
def guard_tensorize(c: Checker, stmt: Tensorize, block: str) -> None:
    at = c.axis(stmt.axis, block)
    name = stmt.intrin.text
    known = intrinsics()
    intrin = _lookup(name)
    if intrin is None:
        suitable = [n for n, family in known.items() if _fits_target(c.target, family)]
        c.error(
            f"unknown tensor intrinsic `{name}`",
            stmt.intrin.span,
            did_you_mean(name, list(known)),
            one_of(sorted(suitable), f"intrinsics for {c.target.kind}")
            if len(suitable) <= 40
            else f"{len(suitable)} intrinsics suit {c.target.kind}, e.g. "
            + ", ".join(sorted(suitable)[:8]),
        )
        return
    family = known.get(name)
    if family is not None and not _fits_target(c.target, family):
        c.error(
            f"`{name}` is an intrinsic for {_FAMILY_MODULES[family]}, not for {c.target.kind}",
            stmt.intrin.span,
        )
        return
    if family == "cuda":
        sm, needed = _sm(c.target.arch), 70 if name.startswith("wmma") else 80
        c.require(
            sm is None or sm >= needed,
            f"`{name}` needs sm_{needed} or newer; the target is {c.target.arch}",
            stmt.intrin.span,
        )
    shape = describe(intrin.desc)
    if not shape.readable:
        return
    loops = c.nest.loops(block)
    under = loops[loops.index(at) :]
    extents = tuple(x.extent if x.extent is not None else -1 for x in under)
    if extents != shape.extents:
        c.error(
            f"`{name}` computes a {_dims(shape.extents)} loop nest; the loops from "
            f"`{at.name}` inward are {_dims(extents)} "
            f"({', '.join(x.name for x in under)})",
            stmt.axis.span,
            "split the block's loops so that the innermost ones match the intrinsic, and "
            "tensorize the outermost of them",
        )
        return
    realize = c.nest._block(block)
    reads, writes = _accesses(realize.reads), _accesses(realize.writes)
    for what, wanted, found in (("reads", shape.reads, reads), ("writes", shape.writes, writes)):
        if Counter(wanted) != Counter(found):
            c.error(
                f"`{name}` {what} {_buffers(wanted)}; block {block} {what} {_buffers(found)}",
                stmt.intrin.span,
                "the dtypes and memory scopes must be the intrinsic's: cache the buffers in "
                "its scopes (`cache_read A warp`), or pick the intrinsic of these dtypes",
            )


def _lookup(name: str) -> Any | None:
    try:
        return intrinsic(name)
    except (RuntimeError, ValueError):
        return None


def _fits_target(target: Target, family: str) -> bool:
    if family in ("cuda", "rocm", "metal"):
        return target.is_gpu and target.kind == {"cuda": "cuda", "rocm": "rocm"}.get(family, family)
    if target.is_gpu:
        return False
    triple = str(target.tvm_config.get("mtriple", ""))
    is_arm = triple.startswith(("aarch64", "arm"))
    if family == "arm_cpu":
        return is_arm
    if family == "x86":
        return not is_arm
    return False


def _dims(extents: tuple[int, ...]) -> str:
    return " x ".join("?" if e < 0 else str(e) for e in extents) or "scalar"


def _buffers(accesses: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{dtype} in {scope}" for dtype, scope in accesses) or "nothing"


# --- lowering ------------------------------------------------------------------------------------


@facets.lower(TENSORIZE)
def lower_tensorize(nest: Nest, block: str, stmt: Tensorize) -> None:
    intrinsics()
    loops = nest.loops(block)
    at = checked_loop(nest, block, stmt.axis.text)
    inside = [x.name for x in loops[loops.index(at) :]]
    tvm_name = nest.sch.get(nest.block(block)).name_hint
    nest.sch.tensorize(loop(nest, block, stmt.axis), stmt.intrin.text)
    nest.changed()
    for name in inside:
        nest.consumed[(block, name)] = Consumed(
            f"tensorized with {stmt.intrin.text}", stmt.span.line, (f"{tvm_name}_o",)
        )
    # The block is now TVM's `<block>_o`, which holds the intrinsic; schedlang keeps its name.
    for alias, name in list(nest.block_aliases.items()):
        if name == tvm_name:
            nest.block_aliases[alias] = f"{tvm_name}_o"
    if block == tvm_name:
        nest.block_aliases[block] = f"{tvm_name}_o"


@facets.decompile(TENSORIZE, "Tensorize")
def decompile_tensorize(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    if not reader.is_loop(inputs[0]):
        raise Untranslatable("schedlang tensorizes the loops from one inward, not a block")
    block, axis = reader.axis(inputs[0])
    reader.emit(block, Tensorize(nodes.Name(axis), nodes.Name(str(attrs[0]))))
