"""Converters of our own for aten operators TVM's PyTorch frontend converts wrongly, passed to
`from_exported_program(custom_convert_map=...)` (schedlang.models.frontends).

Each one gives the Relax result the type torch.export recorded for the node (`node.meta["val"]`,
a FakeTensor), where TVM's converter infers another:

- `aten.cumsum` of a bool or integer tensor is int64 in torch (its type promotion for sums);
  TVM's converter (`_cumsum` in relax/frontend/torch/base_fx_graph_translator.py) passes no
  dtype, so the sum stays bool: wrong (it saturates), and LLVM cannot add bools
  (`CodeGenLLVM::CreateAdd` accepts int, uint and float only, src/target/llvm/codegen_llvm.cc,
  DEFINE_CODEGEN_BINARY_OP). transformers' causal mask computes one: packed-sequence detection
  is a cumsum over `position_ids[1:] - position_ids[:-1] != 1`.
- `aten.index_put` with one index tensor and full slices (`None`) around it, as
  `cache[:, :, cache_position] = key` is (transformers' static KV cache: `index_copy_` along the
  sequence axis, which torch.export decomposes into `index_put(cache, [None, None, position],
  key)`). TVM's converter (`_index_put`, same file) leaves out the trailing slices, and gives
  each leading one the shape `[size, 1]`, which broadcasts against the others only by accident:
  `IndexPut requires the number of index tensors (3) to match the data tensor dimensions (4)`.
  Here every dimension gets an index tensor on an axis of its own, as torch's rule for one
  advanced index says: the index's dimensions stand where the indexed dimension stood.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tvm import relax


def _recorded_dtype(node: Any, importer: Any) -> str:
    """The dtype torch.export recorded for the node's result."""
    return importer._convert_data_type(node.meta["val"].dtype)


def cumsum(node: Any, importer: Any) -> relax.Var:
    """`aten.cumsum(x, dim, dtype=None)` with torch's result type."""
    data = importer.env[node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
    dtype = _recorded_dtype(node, importer)
    return importer.block_builder.emit(relax.op.cumsum(data, dim, dtype))


def index_put(node: Any, importer: Any) -> relax.Var:
    """`aten.index_put(data, indices, values, accumulate)` with one index tensor among slices;
    TVM's own converter for any other form."""
    indices = node.args[1]
    given = [i for i, index in enumerate(indices) if index is not None]
    shape = list(node.args[0].meta["val"].shape)
    index_shape = list(indices[given[0]].meta["val"].shape) if len(given) == 1 else []
    if len(given) != 1 or not all(isinstance(d, int) for d in [*shape, *index_shape]):
        return importer._index_put(node)  # several index tensors, or symbolic shapes
    builder = importer.block_builder
    data, values = importer.env[node.args[0]], importer.env[node.args[2]]
    accumulate = bool(node.args[3]) if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    at = given[0]
    index = importer.env[indices[at]]
    rank = len(shape) - 1 + len(index_shape)  # the broadcast shape of the update
    tensors = []
    for axis, size in enumerate(shape):
        if axis == at:
            placed = [1] * at + index_shape + [1] * (len(shape) - 1 - at)
            tensors.append(builder.emit(relax.op.reshape(index, placed)))
            continue
        position = axis if axis < at else axis - 1 + len(index_shape)
        placed = [1] * rank
        placed[position] = size
        arange = builder.emit(relax.op.arange(0, size, 1, "int64"))
        tensors.append(builder.emit(relax.op.reshape(arange, placed)))
    result = builder.emit(relax.op.index_put(data, relax.Tuple(tensors), values, accumulate))
    if str(node.target).startswith("aten.index_put_"):  # in place: later reads see the update
        for key, value in list(importer.env.items()):
            if value is data:
                importer.env[key] = result
    return result


CONVERTERS: dict[str, Callable[[Any, Any], relax.Var]] = {
    "cumsum.default": cumsum,
    "index_put.default": index_put,
    "index_put_.default": index_put,
}
