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


CONVERTERS: dict[str, Callable[[Any, Any], relax.Var]] = {"cumsum.default": cumsum}
