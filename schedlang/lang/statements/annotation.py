"""Annotations TVM's lowering passes read: `annotate` (software pipelining, double buffering,
unrolling), each key with the kind of thing it goes on and the type of its value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lark import Token

from schedlang.lang import nodes
from schedlang.lang.statements import facets
from schedlang.lang.statements.args import Axis, Block, Children, Items
from schedlang.lang.statements.base import loop
from schedlang.lang.statements.decoding import Choice, StepPattern, StepView
from schedlang.lang.statements.decompiling import TraceReader, Untranslatable, join_items
from schedlang.lang.statements.facets import Syntax
from schedlang.lang.statements.pragmas import PRAGMA_ATTRS, auto_unroll_fits

if TYPE_CHECKING:
    from schedlang.core.diagnostics import Span
    from schedlang.lang.loop import Loop
    from schedlang.lang.nest import Nest
    from schedlang.lang.statements.facade import Checker


@dataclass(frozen=True)
class Key:
    on: Literal["loop", "block"]
    value: Literal["int", "list"]
    means: str  # for the docs and for notes


# The keys `annotate` takes; grammar/schedlang.lark's ANNOTATION_KEY lists the same.
KEYS: dict[str, Key] = {
    "software_pipeline_stage": Key(
        "loop", "list", "the pipeline stage of each statement of the loop's body"
    ),
    "software_pipeline_order": Key(
        "loop", "list", "the order the statements of the loop's body run in, in the pipeline"
    ),
    "software_pipeline_async_stages": Key(
        "loop", "list", "the stages whose copies run asynchronously (cp.async, GPUs only)"
    ),
    "pragma_auto_unroll_max_step": Key(
        "loop", "int", "unroll the loops below up to this many iterations"
    ),
    "pragma_unroll_explicit": Key("loop", "int", "1: unroll in TVM, 0: leave it to LLVM/NVCC"),
    "pragma_loop_partition_hint": Key(
        "loop", "int", "1: split the loop where a guard below it stops holding (a tail)"
    ),
    "double_buffer_scope": Key(
        "block", "int", "double-buffer the block's written buffer of this index"
    ),
}
_PIPELINE = ("software_pipeline_stage", "software_pipeline_order")


@dataclass(frozen=True)
class AnnotationItem(nodes.Node):
    key: nodes.Name
    value: nodes.IntFactor | tuple[nodes.IntFactor, ...]


@dataclass(frozen=True)
class Annotate(nodes.Stmt, keyword="annotate"):
    """`annotate k.o software_pipeline_stage=[0, 0, 1], software_pipeline_order=[0, 1, 2]` or
    `annotate block A_sh double_buffer_scope=0`: TVM annotations on a loop of the current
    block, or on a block."""

    axis: nodes.Name | None
    block: nodes.Name | None
    items: tuple[AnnotationItem, ...]


class AnnotationItems(Items):
    """`key=value` pairs, each value an integer or a list: `software_pipeline_stage=[0, 0, 1]`."""

    def matches(self, child: Any) -> bool:
        return isinstance(child, Token) and child.type == "ANNOTATION_KEY"

    def value(self, key: Token, children: Children) -> AnnotationItem:
        value = children.take()
        name = children.name(key)
        if value.type != "INT_LIST":
            return AnnotationItem(name, children.int(value), span=name.span)
        # One INT token per number, placed at the list, so that a number out of range is
        # reported there like any other.
        numbers = tuple(
            children.int(Token.new_borrow_pos("INT", part.strip(), value))
            for part in value.strip("[] \t").split(",")
        )
        return AnnotationItem(name, numbers, span=name.span)

    def value_text(self, value: nodes.IntFactor | tuple[nodes.IntFactor, ...]) -> str:
        return format_value(value)


def format_value(value: nodes.IntFactor | tuple[nodes.IntFactor, ...]) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v.value) for v in value) + "]"
    return str(value.value)


def _body_statements(c: Checker, target: Loop) -> int:
    body = c.nest.sch.get(target.rv).body
    return len(body.seq) if hasattr(body, "seq") else 1


# fmt: off
ANNOTATE = Syntax("annotate", Annotate, "annotation",
    (Axis(optional=True), Block(word="block", optional=True), AnnotationItems()),
    example="e.g. `annotate k.o software_pipeline_stage=[0, 0, 1], "
    "software_pipeline_order=[0, 1, 2]` or `annotate block A_l double_buffer_scope=0`",
    description="put TVM annotations on loop AXIS (or, after `block`, on block BLOCK): "
    "software_pipeline_stage/order=[…] pipeline the loop's body, double_buffer_scope=0 "
    "double-buffers a block's output.",
    summary=("`annotate a\\|block B key=v, …`", '`sch.annotate(loop or block, "key", v)`', "—"),
    name_after="a block name")
# fmt: on

STATEMENTS = (ANNOTATE,)


@facets.guard(ANNOTATE)
def guard_annotate(c: Checker, stmt: Annotate, block: str) -> None:
    target = c.axis(stmt.axis, block) if stmt.axis is not None else None
    annotated = c.existing_block(stmt.block) if stmt.block is not None else None
    on = "loop" if target is not None else "block"
    seen: set[str] = set()
    for item in stmt.items:
        key, value = item.key.text, item.value
        if not c.require_known(
            item.key, KEYS, f"unknown annotation key `{key}`", "annotation keys"
        ):
            continue
        spec = KEYS[key]
        if not c.require(key not in seen, f"`{key}` is given twice", item.key.span):
            continue
        seen.add(key)
        if not c.require(
            spec.on == on,
            f"`{key}` annotates a {spec.on}, not a {on}",
            item.key.span,
            f"write `annotate block NAME {key}=…`"
            if spec.on == "block"
            else f"write `annotate AXIS {key}=…` with a loop of block {block}",
        ):
            continue
        if not c.require(
            isinstance(value, tuple) == (spec.value == "list"),
            f"`{key}` takes "
            + ("a list of integers, like [0, 0, 1]" if spec.value == "list" else "an integer"),
            _span(item),
        ):
            continue
        if target is not None:
            _loop_value(c, block, target, key, value, item)
        elif annotated is not None and isinstance(value, nodes.IntFactor):
            written = c.nest.writes(annotated)
            c.require(
                0 <= value.value < len(written),
                f"double_buffer_scope {value.value} is out of range: block {annotated} writes "
                f"{len(written)} buffer{'s' * (len(written) != 1)}",
                value.span,
                f"0 is `{written[0]}`" if written else "",
            )
    if target is not None:
        _pipeline_complete(c, stmt, target)


def _span(item: AnnotationItem) -> Span | None:
    value = item.value
    return value[0].span if isinstance(value, tuple) and value else getattr(value, "span", None)


def _loop_int(c: Checker, block: str, target: Loop, key: str, value: nodes.IntFactor) -> None:
    if key in ("pragma_unroll_explicit", "pragma_loop_partition_hint"):
        c.require(
            value.value in (0, 1), f"{key} takes 0 or 1, got {value.value}",
            value.span,
        )  # fmt: skip
    elif key == "pragma_auto_unroll_max_step" and c.require(
        value.value >= 0, f"{key} must be at least 0, got {value.value}", value.span
    ):
        auto_unroll_fits(c, value.value, target, block, value.span)


def _loop_value(
    c: Checker,
    block: str,
    target: Loop,
    key: str,
    value: nodes.IntFactor | tuple[nodes.IntFactor, ...],
    item: AnnotationItem,
) -> None:
    """A loop's annotation: an integer (a pragma) or a list, one entry per statement of the body
    (a software pipeline's stages and order; the checks before make the kinds match the key)."""
    if isinstance(value, nodes.IntFactor):
        _loop_int(c, block, target, key, value)
        return
    numbers = [v.value for v in value]
    body = _body_statements(c, target)
    if key == "software_pipeline_async_stages":
        c.require(
            c.target.is_gpu,
            f"software_pipeline_async_stages needs a GPU: {c.target.kind} has no asynchronous "
            "copies, and TVM fails to build them there",
            item.key.span,
        )
        c.require(all(n >= 0 for n in numbers), "a pipeline stage is at least 0", _span(item))
        return
    if not c.require(
        len(numbers) == body,
        f"`{key}` has {len(numbers)} entr{'y' if len(numbers) == 1 else 'ies'}, but the body of "
        f"`{target.name}` holds {body} statement{'s' * (body != 1)}: one entry each",
        _span(item),
        "the statements of the body are the blocks and loops directly inside the loop, in "
        "order (a cache_read … at this loop adds one)",
    ):
        return
    if key == "software_pipeline_stage":
        c.require(all(n >= 0 for n in numbers), "a pipeline stage is at least 0", _span(item))
    else:
        c.require(
            sorted(numbers) == list(range(body)),
            f"software_pipeline_order must list 0 to {body - 1}, each once; got "
            f"{format_value(value)}",
            _span(item),
        )


def _pipeline_complete(c: Checker, stmt: Annotate, target: Loop) -> None:
    """TVM fails to build a loop with a pipeline stage but no order, or the other way round
    ("Order of the software pipeline is not defined")."""
    given = {item.key.text for item in stmt.items}
    present = set(c.nest.sch.get(target.rv).annotations.keys())
    for key, other in (_PIPELINE, _PIPELINE[::-1]):
        c.require(
            key not in given or other in given or other in present,
            f"`{key}` needs `{other}` on the same loop: TVM cannot build one without the other",
            stmt.span,
            f"add `{other}=[…]` to this statement",
        )


@facets.steps(ANNOTATE)
def _annotate_steps(view: StepView, block: str, _: None) -> list[StepPattern]:
    """The loop-partition hint on a CPU loop (`matmul_panels` writes it on its row blocks or
    their tiles, whose extent may be symbolic); the pipelining keys are for GPU loops, which no
    template offers a model this way."""
    if view.gpu:
        return []
    return [
        StepPattern((f"annotate {x.name} pragma_loop_partition_hint=", Choice(("0", "1"))))
        for x in view.loops(block)
    ]


@facets.lower(ANNOTATE)
def lower_annotate(nest: Nest, block: str, stmt: Annotate) -> None:
    if stmt.axis is not None:
        target = loop(nest, block, stmt.axis)
    else:
        assert stmt.block is not None, "the grammar gives an annotation a loop or a block"
        target = nest.block(stmt.block.text)
    for item in stmt.items:
        value = item.value
        tvm_value = [v.value for v in value] if isinstance(value, tuple) else value.value
        nest.sch.annotate(target, item.key.text, tvm_value)


@facets.record(ANNOTATE)
def _record(c: Checker, stmt: Annotate, block: str) -> None:
    # Unrolling the GPU verifier finds is traced back to the annotation that asked for it.
    if stmt.axis is not None and any(i.key.text.startswith("pragma_") for i in stmt.items):
        found = c.nest.find(block, stmt.axis.text)
        if found is not None:
            c.unrolled_by[c.nest.sch.get_sref(found.rv)] = stmt.span


@facets.decompile(ANNOTATE, "Annotate")
def decompile_annotate(reader: TraceReader, inputs: list[Any], attrs: list[Any]) -> None:
    from tvm import tirx

    key, raw = str(attrs[0]), inputs[1]
    if isinstance(raw, int | tirx.IntImm):
        value: Any = nodes.IntFactor(int(raw))
    else:
        try:
            value = tuple(nodes.IntFactor(int(v)) for v in raw)
        except TypeError:
            raise Untranslatable(f"`{key}` takes integers in schedlang, not {raw!r}") from None
    item = AnnotationItem(nodes.Name(key), value)
    if reader.is_loop(inputs[0]):
        block, axis = reader.axis(inputs[0])
        reader.emit(block, Annotate(nodes.Name(axis), None, (item,)))
    else:
        block = reader.block_name(inputs[0])
        reader.emit(block, Annotate(None, nodes.Name(block), (item,)))


@facets.absorbs(ANNOTATE)
def _absorbs_annotate(first: Annotate, second: nodes.Stmt) -> Annotate | None:
    """Annotations of one loop or block with no key in common are one statement (a pipeline's
    stages and order: neither builds alone)."""
    if not isinstance(second, Annotate) or (first.axis, first.block) != (second.axis, second.block):
        return None
    return join_items(first, second)


@facets.reads_instruction(ANNOTATE)
def _reads_annotation(attrs: list[Any]) -> bool:
    return str(attrs[0]) in KEYS and str(attrs[0]) not in PRAGMA_ATTRS
