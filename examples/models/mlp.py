"""A multi-layer perceptron in Relax: x[64, 512] → 1024 → 1024 → 512, fp32, ReLU between layers.

Each layer is `relu(h @ W + b)` (no ReLU after the last); TVM fuses each into one PrimFunc
(`fused_matmul_add_relu`, …), so the model has one task per distinct layer shape:

    schedlang tune-model examples/models/mlp.py --target llvm --trials 64
    schedlang build-model examples/models/mlp.py --target llvm --compare

`-D layers=4` repeats the hidden layer: two calls of one task. `-D constant_weights=1` binds
the weights into the model as constants, as a PyTorch or ONNX model's are: `main` then takes `x`
alone, and a schedule may `prepack` a weight (pack it once, when the model is built).
"""

from itertools import pairwise

import numpy as np
from tvm import relax

import schedlang


def reference(x, *weights, batch, features, hidden, layers, dtype):
    if not weights:  # bound as constants: the same arrays `mlp` made
        weights = tuple(_arrays(batch, features, hidden, layers, dtype)[1:])
    h = x
    for layer in range(len(weights) // 2):
        h = h @ weights[2 * layer] + weights[2 * layer + 1]
        if layer < len(weights) // 2 - 1:
            h = np.maximum(h, 0)
    return h


def _arrays(batch, features, hidden, layers, dtype):
    """x, then each layer's weight and bias, scaled by 1/sqrt(fan in), as initialised for
    training: outputs stay near 1."""
    widths = [features] + [hidden] * (layers - 1) + [features]
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-1, 1, (batch, features)).astype(dtype)]
    for fan_in, fan_out in pairwise(widths):
        scale = 1 / np.sqrt(fan_in)
        arrays.append((rng.uniform(-1, 1, (fan_in, fan_out)) * scale).astype(dtype))
        arrays.append((rng.uniform(-1, 1, fan_out) * scale).astype(dtype))
    return arrays


@schedlang.model(reference=reference)
def mlp(
    batch: int = 64,
    features: int = 512,
    hidden: int = 1024,
    layers: int = 3,
    dtype: str = "float32",
    constant_weights: int = 0,
):
    widths = [features] + [hidden] * (layers - 1) + [features]
    x = relax.Var("x", relax.TensorType((batch, features), dtype))
    params = []
    for layer, (fan_in, fan_out) in enumerate(pairwise(widths)):
        params.append(relax.Var(f"w{layer + 1}", relax.TensorType((fan_in, fan_out), dtype)))
        params.append(relax.Var(f"b{layer + 1}", relax.TensorType((fan_out,), dtype)))

    builder = relax.BlockBuilder()
    with builder.function("main", [x, *params]):
        with builder.dataflow():
            h = x
            for layer in range(layers):
                h = builder.emit(relax.op.matmul(h, params[2 * layer]))
                h = builder.emit(relax.op.add(h, params[2 * layer + 1]))
                if layer < layers - 1:
                    h = builder.emit(relax.op.nn.relu(h))
            output = builder.emit_output(h)
        builder.emit_func_output(output)

    arrays = _arrays(batch, features, hidden, layers, dtype)
    if not constant_weights:
        return builder.get(), arrays
    bound = {p.name: a for p, a in zip(params, arrays[1:], strict=True)}
    return relax.transform.BindParams("main", bound)(builder.get()), arrays[:1]
