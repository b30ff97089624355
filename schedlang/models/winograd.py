"""Winograd F(4x4, 3x3): a model's 3x3 convolutions with constant weights, computed with 4x fewer
multiplies.

A 3x3 convolution at stride 1 computes each 4x4 output tile from a 6x6 input tile. Winograd's
algorithm (Lavin and Gray, 2016) transforms the input tile (`Bᵀ d B`) and the weight (`G g Gᵀ`)
into 6x6 planes where the convolution is an elementwise product summed over the input channels:
36 independent matmuls, [positions x input channels] x [input channels x output channels], then
the inverse transform (`Aᵀ m A`) gives the 4x4 outputs. The weight's transform is done here, once,
in numpy, when the pass runs (the weight is a constant of the model); what the model computes per
call is one PrimFunc of six blocks:

    winograd_pad          the input, padded, channel-last: [N, H + 2 rounded up to tiles, …, C]
    winograd_input_rows   R[eps, j, p, ci] = (Bᵀ d) of tile p, row eps
    winograd_input        V[eps, nu, p, ci] = (R B)[eps, nu]
    winograd_gemm         M[eps, nu, p, co] = Σ_ci V[eps, nu, p, ci] · U[eps, nu, ci, co]
    winograd_output_rows  Y[vh, j, p, co] = (Aᵀ M)[vh, j] of tile p
    winograd_output       out[n, co, h, w] = (Y A)[h % 4, w % 4] of the tile holding (h, w)

Each transform step is an explicit sum of its nonzero terms (at most 6), one per row or column,
chosen by a Select: once a schedule unrolls that loop each copy keeps its own sum. The function
is marked `op_pattern` kOutEWiseFusable, so FuseOps folds the bias, residual and ReLU after it,
as it does after a convolution.

Measured on ResNet-18's layers by the tuner (2-core AMD EPYC Zen 4, AVX-512; docs/models.md),
direct (`conv_prepacked`, 1,000 trials) against Winograd: 56x56x64 1.10 -> 0.38 ms, 28x28x128
1.04 -> 0.32, 14x14x256 1.01 -> 0.39. At 7x7x512 the transformed weight (36/9 of the weight's
size, 37 MB) made it 2-3x slower than the direct convolution, so a conv qualifies only when its
transformed weight fits `MAX_WEIGHT_BYTES`. Its error against the direct convolution is a few
1e-6 of the output's scale (F(4x4, 3x3) in float32).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax, te, tirx

from schedlang.propose.rules.winograd import BLOCKS, TILE  # the names the recipe finds

KERNEL = 3
MIN_SIZE = 14  # rows and columns: at 7x7 the tiles' padding wastes 30% and the weight is large
MIN_CHANNELS = 64  # measured from 64 channels up; fewer not measured
CHANNEL_BLOCK = 16  # channels vectorized in whole vectors (the schedule's, on AVX-512 and AVX2)
MAX_WEIGHT_BYTES = 16 << 20  # the transformed weight; 256 x 256 channels are 9.4 MB
OP_PATTERN_OUT_ELEMWISE_FUSABLE = 4  # TVM's kOutEWiseFusable, as a conv2d's legalized function


def transform_matrices(tile: int = TILE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, G) of F(tile x tile, 3x3) in float64, as TVM's topi builds them (Cook-Toom at its
    interpolation points): out = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A."""
    from tvm.topi.nn import winograd_util

    points = winograd_util._interpolation_points(tile + KERNEL - 2)
    a, b, g = winograd_util._cook_toom_convolution(points, tile, KERNEL)
    return np.asarray(a, "float64"), np.asarray(b, "float64"), np.asarray(g, "float64")


def transformed_weight(weight: np.ndarray, tile: int = TILE) -> np.ndarray:
    """U[eps, nu, ci, co] = (G g Gᵀ)[eps, nu] of each output x input channel's 3x3 kernel
    (weight [CO, CI, 3, 3], OIHW), in the weight's dtype."""
    _, _, g = transform_matrices(tile)
    u = np.einsum("ea,ocab,nb->enco", g, weight.astype("float64"), g)
    return np.ascontiguousarray(u, dtype=weight.dtype)


def conv_function(
    batch: int, in_channels: int, out_channels: int, height: int, width: int, dtype: str = "float32"
) -> tirx.PrimFunc:
    """The PrimFunc of the convolution (padding 1, stride 1) taking (X [N, CI, H, W], U, out
    [N, CO, H, W]) with U as `transformed_weight` makes it."""
    a, b, _ = transform_matrices(TILE)
    alpha = TILE + KERNEL - 1
    rows, cols = -(-height // TILE), -(-width // TILE)
    tiles = batch * rows * cols
    # int64 shapes, as LegalizeOps writes them: FuseTIR joins this function's output buffer to
    # its epilogue's input, and the two must be of one type.
    x = te.placeholder(_i64(batch, in_channels, height, width), dtype, name="X")
    u = te.placeholder(_i64(alpha, alpha, in_channels, out_channels), dtype, name="U")
    zero = tirx.const(0.0, dtype)
    pad = te.compute(
        _i64(batch, rows * TILE + 2, cols * TILE + 2, in_channels),
        lambda n, h, w, c: tirx.if_then_else(
            tirx.all(h >= 1, h <= height, w >= 1, w <= width), x[n, c, h - 1, w - 1], zero
        ),
        name=BLOCKS[0],
    )

    # Each transform in two steps, rows then columns (Bᵀ d, then that B): 6 terms a sum at most
    # instead of 36, and expressions small enough for TVM's passes (one-step sums took 4.6 s to
    # build, 3.1 of it in CommonSubexprElim).
    def input_rows(eps: Any, j: Any, p: Any, c: Any) -> Any:
        n, ph, pw = p // (rows * cols), p % (rows * cols) // cols, p % cols
        return _transformed(b, eps, alpha, lambda i: pad[n, ph * TILE + i, pw * TILE + j, c], dtype)

    rows_in = te.compute(_i64(alpha, alpha, tiles, in_channels), input_rows, name=BLOCKS[1])
    data = te.compute(
        _i64(alpha, alpha, tiles, in_channels),
        lambda eps, nu, p, c: _transformed(b, nu, alpha, lambda j: rows_in[eps, j, p, c], dtype),
        name=BLOCKS[2],
    )
    k = te.reduce_axis(_i64(0, in_channels), name="ci")
    gemm = te.compute(
        _i64(alpha, alpha, tiles, out_channels),
        lambda eps, nu, p, co: te.sum(data[eps, nu, p, k] * u[eps, nu, k, co], axis=k),
        name=BLOCKS[3],
    )
    rows_out = te.compute(
        _i64(TILE, alpha, tiles, out_channels),
        lambda vh, j, p, co: _transformed(a, vh, TILE, lambda i: gemm[i, j, p, co], dtype),
        name=BLOCKS[4],
    )

    def output(n: Any, co: Any, h: Any, w: Any) -> Any:
        p = (n * rows + h // TILE) * cols + w // TILE
        return _transformed(a, w % TILE, TILE, lambda j: rows_out[h % TILE, j, p, co], dtype)

    out = te.compute(_i64(batch, out_channels, height, width), output, name=BLOCKS[5])
    func = te.create_prim_func([x, u, out])
    return func.with_attr("op_pattern", OP_PATTERN_OUT_ELEMWISE_FUSABLE)


def _i64(*values: int) -> tuple[Any, ...]:
    return tuple(tirx.IntImm("int64", v) for v in values)


def _transformed(
    matrix: np.ndarray, i: Any, count: int, source: Callable[[int], Any], dtype: str
) -> Any:
    """(matrixᵀ · source)[i] = Σ_k matrix[k, i] · source(k), over the matrix's rows, for an `i`
    among `count` values (chained by `_select`): one step of a transform."""
    return _select(
        i, count, lambda r: _sum([(matrix[k, r], source(k)) for k in range(len(matrix))], dtype)
    )


def _sum(terms: list[tuple[float, Any]], dtype: str) -> Any:
    """Σ coefficient · value over the nonzero coefficients (± 1 without a multiply)."""
    total = None
    for coefficient, value in terms:
        if coefficient == 0:
            continue
        term = value if coefficient == 1 else -value if coefficient == -1 else (
            value * tirx.const(float(coefficient), dtype)
        )  # fmt: skip
        total = term if total is None else total + term
    return total if total is not None else tirx.const(0.0, dtype)


def _select(i: Any, count: int, value: Any) -> Any:
    """value(r) at i == r, as a chain of Selects (folded once i is a constant: an unrolled
    loop)."""
    chosen = value(count - 1)
    for r in reversed(range(count - 1)):
        chosen = tirx.Select(i == r, value(r), chosen)
    return chosen


def unsuitable(call: relax.Call) -> str | None:
    """Why a `relax.nn.conv2d` call is not computed with Winograd, or None when it is."""
    attrs = call.attrs
    data, weight = call.args
    if not isinstance(weight, tvm.ir.expr.Constant):
        return "its weight is not a constant"
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return "not NCHW"
    if [int(s) for s in attrs.strides] != [1, 1] or [int(d) for d in attrs.dilation] != [1, 1]:
        return "strided or dilated"
    if int(attrs.groups) != 1:
        return "grouped"
    if [int(p) for p in attrs.padding] != [1, 1, 1, 1]:
        return "padding other than 1"
    ty = data.ty
    shape = getattr(getattr(ty, "shape", None), "values", None)
    wshape = weight.value.shape
    if shape is None or not all(isinstance(d, tirx.IntImm) for d in shape):
        return "a symbolic shape"
    dtype = str(weight.value.dtype)
    if dtype != "float32" or str(ty.dtype) != dtype:
        return "not float32"
    if tuple(wshape[2:]) != (KERNEL, KERNEL):
        return "not 3x3"
    _, channels, height, width = (int(d) for d in shape)
    if min(height, width) < MIN_SIZE or min(wshape[0], channels) < MIN_CHANNELS:
        return f"smaller than {MIN_SIZE}x{MIN_SIZE} or {MIN_CHANNELS} channels"
    if wshape[0] % CHANNEL_BLOCK or channels % CHANNEL_BLOCK:
        return f"channels not a multiple of {CHANNEL_BLOCK}"
    if (TILE + 2) ** 2 * wshape[0] * wshape[1] * 4 > MAX_WEIGHT_BYTES:
        return f"its transformed weight would pass {MAX_WEIGHT_BYTES >> 20} MB"
    return None


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.conv2d = tvm.ir.Op.get("relax.nn.conv2d")
        self.functions: dict[tuple[int, ...], tvm.ir.GlobalVar] = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not call.op.same_as(self.conv2d) or unsuitable(call) is not None:
            return call
        data, weight = call.args
        n, ci, h, w = (int(d) for d in data.ty.shape.values)
        co = int(weight.value.shape[0])
        key = (n, ci, co, h, w)
        if key not in self.functions:
            func = conv_function(n, ci, co, h, w).without_attr("global_symbol")
            self.functions[key] = self.builder_.add_func(func, "conv2d_winograd")
        u = relax.const(transformed_weight(weight.value.numpy()))
        out = relax.TensorType((n, co, h, w), "float32")
        return relax.call_tir(self.functions[key], [data, u], out)


@tvm.transform.module_pass(opt_level=0, name="schedlang.WinogradConv2D")
def winograd_conv2d(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Each qualifying 3x3 conv2d (`unsuitable` says which) as a call of the Winograd PrimFunc on
    its transformed weight, a constant."""
    rewriter = _Rewriter(mod)
    for global_var, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(global_var, rewriter.visit_expr(func))
    return rewriter.builder_.get()
