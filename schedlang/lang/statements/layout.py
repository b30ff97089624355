"""Buffer layouts: `transform_layout BUFFER (i, j) -> (j // 16, i, j % 16) [pad_value 0]`, and
`prepack BLOCK`: a block that packs a constant weight, computed once when the model is built.

The map is written like TVM's `IndexMap`: the buffer's indices, then one expression per
dimension of the new layout, over `+ - * // %`, integers and parentheses (`//` and `%` floor,
as TVM's). It is checked against the buffer before TVM sees it: one index per dimension, each
named once, no index that is not one of them, no division by zero, and a map that sends each
element to its own place. A map whose image is larger than the buffer (`j // 16` over 999
columns) leaves padding, which `pad_value V` fills with V.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schedlang.core.diagnostics import did_you_mean, one_of
from schedlang.lang import nodes
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import Block, Buffer, Int
from schedlang.lang.statements.base import accesses, made_buffer_fits
from schedlang.lang.statements.decoding import StepView
from schedlang.lang.statements.decompiling import TraceReader, Untranslatable
from schedlang.lang.statements.facets import Syntax
from schedlang.lang.statements.index_maps import IndexExpr, IndexMap, map_ok, read_index_map, to_tvm

if TYPE_CHECKING:
    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker


@dataclass(frozen=True)
class TransformLayout(nodes.Stmt, keyword="transform_layout"):
    """`transform_layout B_global (k, j) -> (j // 16, k, j % 16)`: store BUFFER in a new layout."""

    buffer: nodes.Name
    indices: tuple[nodes.Name, ...]
    outputs: tuple[IndexExpr, ...]
    pad: nodes.IntFactor | None = None


# --- the map as TVM's IndexMap -------------------------------------------------------------------


def index_map(stmt: TransformLayout, dtype: str = "int32") -> Any:
    from tvm import tirx

    variables = {n.text: tirx.Var(n.text, dtype) for n in stmt.indices}
    outputs = [to_tvm(e, variables) for e in stmt.outputs]
    return tirx.IndexMap(list(variables.values()), outputs, None)


# --- the guard -----------------------------------------------------------------------------------


def _accessing_block(c: Checker, stmt: TransformLayout, block: str) -> bool:
    return accesses(
        c,
        block,
        stmt.buffer,
        f"block {block} does not read or write `{stmt.buffer.text}`",
        f"block {block} reads and writes",
    )


def _buffer(c: Checker, name: str, block: str) -> Any:
    regions = [*c.nest._block(block).reads, *c.nest._block(block).writes]
    return next(r.source for r in regions if r.source.name == name)


# The block annotation TVM's SplitLayoutRewritePreproc splits into a function of its own
# (src/relax/transform/split_layout_rewrite_preproc.cc), which FoldConstant then runs on the
# constant weight when the model is built.
PREPACK_ANNOTATION = "meta_schedule.layout_rewrite_preproc"


@dataclass(frozen=True)
class Prepack(nodes.Stmt, keyword="prepack"):
    """`prepack B_global`: block BLOCK, a copy of a constant weight (a `cache_read`, its layout
    changed by `transform_layout`), runs once when the model is built instead of at every call."""

    block: nodes.Name


# fmt: off
TRANSFORM_LAYOUT = Syntax("transform_layout", TransformLayout, "layout",
    (Buffer(), IndexMap(), Int("pad", word="pad_value", optional=True)),
    example="e.g. `transform_layout B_global (k, j) -> (j // 16, k, j % 16)` or "
    "`transform_layout B_global (k, j) -> (j // 16, k, j % 16) pad_value 0`",
    description="store buffer BUFFER in a new layout given by an index map, e.g. "
    "(k, j) -> (j // 16, k, j % 16) packs 16-column panels; `pad_value 0` fills what it adds.",
    summary=("`transform_layout B (i, j) -> (…) [pad_value v]`",
        '`sch.transform_layout(block, "B", IndexMap, pad_value=v)`', "—"))

PREPACK = Syntax("prepack", Prepack, "layout", (Block(),),
    example="e.g. `prepack B_global`",
    description="compute block BLOCK, the copy of a constant weight (a cache_read, its layout "
    "changed by transform_layout), once when the model is built instead of at every call.",
    summary=("`prepack B_global`", f'`sch.annotate(block, "{PREPACK_ANNOTATION}", True)`', "—"))
# fmt: on

STATEMENTS = (TRANSFORM_LAYOUT, PREPACK)


@facets.guard(TRANSFORM_LAYOUT)
def guard_transform_layout(c: Checker, stmt: TransformLayout, block: str) -> None:
    if not _accessing_block(c, stmt, block):
        return
    buffer = _buffer(c, stmt.buffer.text, block)
    # A parameter's layout is the caller's: changing it changes what the function takes.
    c.require(
        buffer.name not in c.param_buffers,
        f"`{buffer.name}` is a parameter of the function: its layout is what callers pass",
        stmt.buffer.span,
        f"copy it first, `cache_read {buffer.name} global`, and transform the copy "
        f"(`transform_layout {buffer.name}_global …`)",
    )
    shape = [int(d) for d in buffer.shape]
    names = [n.text for n in stmt.indices]
    ok = map_ok(
        c,
        stmt,
        len(shape),
        f"the map takes {len(names)} ind{'ex' if len(names) == 1 else 'ices'}, but "
        f"`{buffer.name}` has {len(shape)} dimension{'s' * (len(shape) != 1)} "
        f"({' x '.join(map(str, shape))})",
        lambda var, seen: (
            f"unknown index `{var.name}`",
            did_you_mean(var.name, names),
            one_of(list(dict.fromkeys(names)), "the map's indices"),
        ),
    )
    if not ok:
        return
    _bijective(c, stmt, buffer, shape)


def _bijective(c: Checker, stmt: TransformLayout, buffer: Any, shape: list[int]) -> None:

    dtype = _index_dtype(buffer)
    mapping = index_map(stmt, dtype)
    ranges = list(buffer.shape)
    described = f"`{buffer.name}` ({' x '.join(map(str, shape))})"
    try:
        new_shape = [int(d) for d in mapping.map_shape(buffer.shape)]
    except (TypeError, ValueError, RuntimeError):
        c.error(f"the map does not give {described} a constant shape", stmt.span)
        return
    new_elements, elements = math.prod(new_shape), math.prod(shape)
    try:
        mapping.inverse(ranges)
        bijective = True
    except (RuntimeError, ValueError):
        bijective = False
    if not bijective:
        try:
            _, padding = mapping.non_surjective_inverse(ranges)
            injective = new_elements >= elements
        except (RuntimeError, ValueError):
            injective = False
        if not injective:
            c.error(
                f"the map sends several elements of {described} to one place",
                stmt.span,
                "each element needs its own place: keep every index in the result, e.g. "
                "`(i, j) -> (j // 16, i, j % 16)`",
            )
            return
        if stmt.pad is None:
            c.error(
                f"the map leaves padding: {described} becomes "
                f"{' x '.join(map(str, new_shape))} ({new_elements - elements} more elements)",
                stmt.span,
                f"the padding is where {padding}",
                "fill it with `pad_value 0` at the end of the statement",
            )
            return
    elif stmt.pad is not None:
        c.warn(
            f"`pad_value {stmt.pad.value}` fills nothing: the map leaves no padding in {described}",
            stmt.pad.span,
        )
    made_buffer_fits(
        c,
        buffer.name,
        new_elements,
        buffer.dtype,
        stmt.span,
        f"the new layout is {' x '.join(map(str, new_shape))}",
    )


@facets.lower(TRANSFORM_LAYOUT)
def lower_transform_layout(nest: Nest, block: str, stmt: TransformLayout) -> None:
    buffer = next(
        r.source
        for r in [*nest._block(block).reads, *nest._block(block).writes]
        if r.source.name == stmt.buffer.text
    )
    dtype = _index_dtype(buffer)
    pad = None if stmt.pad is None else _pad_value(buffer.dtype, stmt.pad.value)
    nest.sch.transform_layout(
        nest.block(block), stmt.buffer.text, index_map(stmt, dtype), pad_value=pad
    )


def _index_dtype(buffer: Any) -> str:
    return str(buffer.shape[0].ty) if len(buffer.shape) else "int32"


def _pad_value(dtype: Any, value: int) -> Any:
    from tvm import tirx

    dtype = str(dtype)
    if dtype.startswith(("float", "bfloat")):
        return tirx.FloatImm(dtype, float(value))
    return tirx.IntImm(dtype, value)


@facets.decompile(TRANSFORM_LAYOUT, "TransformLayout")
def decompile_transform_layout(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    from tvm import tirx

    block = reader.block_name(inputs[0])
    index, written = int(attrs[0]), int(attrs[1]) == 1
    buffer = (reader.nest.writes(block) if written else reader.nest.reads(block))[index]
    if buffer in {param.name for param in reader.nest.sch.mod["main"].params}:
        raise Untranslatable(
            f"schedlang transforms only buffers a schedule made; `{buffer}` is a parameter "
            "of the function"
        )
    if bool(attrs[3]):
        raise Untranslatable(
            "schedlang checks that a map is bijective (assume_injective_transform)"
        )
    pad = attrs[2]
    if pad is not None and not (
        isinstance(pad, tirx.IntImm | tirx.FloatImm) and float(pad.value).is_integer()
    ):
        raise Untranslatable(f"schedlang pads with an integer constant, not `{pad}`")
    indices, outputs = read_index_map(inputs[1])
    pad_value = None if pad is None else nodes.IntFactor(int(pad.value))
    reader.emit(block, TransformLayout(nodes.Name(buffer), indices, outputs, pad_value))


# Panel widths offered for a packed copy's layout (the matmul templates' NR).
PANELS = ("4", "8", "16", "32", "64")


@facets.steps(TRANSFORM_LAYOUT)
def _transform_layout_steps(view: StepView, block: str, _: None) -> list[str]:
    """A copy the block reads (a cache or padding block's buffer) stored as column panels, as
    the matmul templates store B: `(k, j) -> (j // NR, k, j % NR)` or its transpose."""
    copies = [b for b in view.reads(block) if b.endswith(("_global", "_pad"))]
    return [
        f"transform_layout {buffer} {order} -> (j // {nr}, k, j % {nr})"
        for buffer in copies
        for order in ("(k, j)", "(j, k)")
        for nr in PANELS
    ]


# --- prepack -------------------------------------------------------------------------------------

# What AttachAttrLayoutFreeBuffers attaches to a PrimFunc: the indices of the parameters that are
# constants at every call site.
LAYOUT_FREE_ATTR = "layout_free_buffers"


def layout_free_params(func: Any) -> list[str]:
    """The names of `func`'s parameters that are constants at every call site (TVM's
    `layout_free_buffers` attribute, set by relax.transform.AttachAttrLayoutFreeBuffers)."""
    indices = func.attrs.get(LAYOUT_FREE_ATTR, None) if func.attrs is not None else None
    return [func.params[int(i)].name for i in indices or ()]


def _copied(body: Any, source: str) -> bool:
    """Whether a block's body only stores what it loads from `source` (reordered, or padded with
    a constant): `X[...] = source[...]` or `X[...] = if_then_else(cond, source[...], c)`."""
    import tvm
    from tvm import tirx

    value = getattr(body, "value", None)
    if not isinstance(body, tirx.BufferStore):
        return False
    if isinstance(value, tvm.ir.Call) and str(getattr(value.op, "name", "")).endswith(
        "if_then_else"
    ):
        loaded, padding = value.args[1], value.args[2]
        if isinstance(padding, tirx.IntImm | tirx.FloatImm):
            value = loaded
    return isinstance(value, tvm.ir.expr.TensorLoad) and value.source.name == source


@facets.guard(PREPACK)
def guard_prepack(c: Checker, stmt: Prepack, block: str) -> None:
    packing = c.existing_block(stmt.block)
    found = c.nest._block(packing)
    sources = list(dict.fromkeys(r.source.name for r in found.reads))
    written = list(dict.fromkeys(r.source.name for r in found.writes))
    source = sources[0] if len(sources) == 1 else None
    if not c.require(
        source is not None
        and source in c.param_buffers
        and len(written) == 1
        and found.init is None
        and _copied(found.body, source),
        f"block {packing} does not only copy one parameter: it reads "
        f"{', '.join(f'`{b}`' for b in sources) or 'nothing'} and writes "
        f"{', '.join(f'`{b}`' for b in written)}",
        stmt.block.span,
        "prepack takes the copy of a weight: `cache_read B global` (its layout changed by "
        "`transform_layout B_global …`), then `prepack B_global`",
    ):
        return
    free = layout_free_params(c.nest.sch.mod["main"])
    if not c.require(
        source in free,
        f"block {packing} cannot be computed once: `{source}` is not a constant weight, its "
        "value may change from call to call",
        stmt.block.span,
        "prepack needs a parameter that is a constant at every call site (a model's bound "
        "weight: TVM's AttachAttrLayoutFreeBuffers lists it in `layout_free_buffers`)",
        one_of(free, "constant weights of this function") if free else "this function has none",
    ):
        return
    at_root(c, packing, stmt.block.span)


@facets.lower(PREPACK)
def _lower_prepack(nest: Nest, block: str, stmt: Prepack) -> None:
    nest.sch.annotate(nest.block(stmt.block.text), PREPACK_ANNOTATION, True)


def at_root(c: Checker, packing: str, span: Any) -> bool:
    """The block is a loop nest of its own at the function's root: TVM splits off only such a
    nest (a `cache_read … at` loop copies it inside the kernel's loops)."""
    rv = c.nest.block(packing)
    loops = c.nest.sch.get_loops(rv)
    outer = loops[0] if loops else rv
    parent = c.nest.sch.get_sref(outer).parent
    alone = len(c.nest.sch.get_child_blocks(outer)) == 1 if loops else True
    inside = parent is None or not parent.stmt.same_as(c.nest.sch.get(c.nest.root()))
    return c.require(
        not inside and alone,
        f"block {packing} is not a loop nest of its own at the function's root: TVM computes "
        "only such a nest once",
        span,
        "copy the weight without `at` (`cache_read B global`), and move no block into the "
        "copy's loops",
    )


@facets.decompile(PREPACK, "Annotate")
def _decompile_prepack(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    if reader.is_loop(inputs[0]):
        raise Untranslatable(f"`{PREPACK_ANNOTATION}` goes on a block, not a loop")
    packing = reader.block_name(inputs[0])
    reader.emit(packing, Prepack(nodes.Name(packing)))


@facets.reads_instruction(PREPACK)
def _reads_prepack(attrs: list[Any]) -> bool:
    return str(attrs[0]) == PREPACK_ANNOTATION
