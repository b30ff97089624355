"""A kernel whose schedule `prepack`s a weight, measured as a built model runs it: the packing once,
the kernel per call.

In a model the packing block becomes a function of its own that runs at build time (TVM's
SplitLayoutRewritePreproc, then FoldConstant: schedlang.models.weights). To measure a candidate
the same way, `split_prepacked` splits the scheduled function with that same pass, and the
library built for it holds three functions:

    main                 the whole function: what is verified against the reference
    main_weight_prepack  the packing: run once on the inputs before timing
    main_prepacked       the kernel, taking the packed weights: what is timed

`Prepacked` says where each packed weight goes; the runner (schedlang.run.sandbox) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedlang.lang.statements.layout import PREPACK_ANNOTATION

PACK_SYMBOL = "main_weight_prepack"
KERNEL_SYMBOL = "main_prepacked"


@dataclass(frozen=True)
class PackedWeight:
    """A parameter of `main` that the kernel takes packed: its position, and the packed shape."""

    index: int
    shape: tuple[int, ...]
    dtype: str


def may_prepack(func_json: str) -> bool:
    """Whether a function, as saved JSON, may have a `prepack`ed block (cheap: no parsing)."""
    return PREPACK_ANNOTATION in func_json


def split_prepacked(func: Any, outputs: list[int]) -> tuple[Any, tuple[PackedWeight, ...]] | None:
    """(an IRModule of main, its packing and its kernel; the packed weights) for a scheduled
    function with `prepack`ed blocks, or None when it has none or cannot be split (`outputs`
    not its last parameters, as a call from Relax needs them: it is then measured whole)."""
    import tvm
    from tvm import relax

    params = list(func.params)
    count = len(params) - len(outputs)
    if sorted(outputs) != list(range(count, len(params))):
        return None
    builder = relax.BlockBuilder()
    kernel = builder.add_func(func.without_attr("global_symbol"), "main")
    inputs = [
        relax.Var(f"arg{i}", relax.TensorType([int(d) for d in p.shape], p.dtype))
        for i, p in enumerate(params[:count])
    ]
    results = [relax.TensorType([int(d) for d in p.shape], p.dtype) for p in params[count:]]
    with builder.function("caller", inputs):
        with builder.dataflow():
            out = builder.emit(relax.call_tir(kernel, inputs, results))
            builder.emit_output(out)
        builder.emit_func_output(out)
    split = relax.transform.SplitLayoutRewritePreproc()(builder.get())
    pack = next((g for g in split.functions if g.name_hint.endswith("_weight_prepack")), None)
    compute = next((g for g in split.functions if g.name_hint.endswith("_prepacked")), None)
    if pack is None or compute is None:
        return None
    packed = _packed_weights(split, split[pack], inputs)
    module = tvm.IRModule(
        {
            "main": func.with_attr("global_symbol", "main"),
            PACK_SYMBOL: split[pack].with_attr("global_symbol", PACK_SYMBOL),
            KERNEL_SYMBOL: split[compute].with_attr("global_symbol", KERNEL_SYMBOL),
        }
    )
    return module, packed


def _packed_weights(split: Any, pack: Any, inputs: list) -> tuple[PackedWeight, ...]:
    """Which inputs the packing takes (the call SplitLayoutRewritePreproc emitted says), and the
    shapes it packs them to (its output parameters, after its inputs)."""
    from tvm import relax

    taken: list[int] = []

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and len(expr.args) == 2:
            callee = expr.args[0]
            if getattr(callee, "name_hint", "").endswith("_weight_prepack"):
                for arg in expr.args[1].fields:
                    taken.extend(i for i, var in enumerate(inputs) if arg.same_as(var))

    relax.analysis.post_order_visit(split["caller"], visit)
    outputs = list(pack.params)[len(taken) :]
    return tuple(
        PackedWeight(index, tuple(int(d) for d in buffer.shape), str(buffer.dtype))
        for index, buffer in zip(taken, outputs, strict=True)
    )
