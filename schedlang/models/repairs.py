"""Relax rewrites that let TVM 0.27's lowering take what its frontends give it: each one replaces
a call TVM's legalization gets wrong with an equal call it gets right, before the operators
become PrimFuncs (schedlang.models.pipeline runs them first).

- `relax.strided_slice` with a negative axis and a symbolic begin or end (transformers' causal
  mask slices `position_ids[..., 1:]` along dim -1; with a symbolic length the end is the
  length). Its legalization then calls topi's `dynamic_strided_slice_with_axes`, which compares
  the axis, an int, with the rank, a size_t, without adding the rank to a negative one first
  (include/tvm/topi/transform.h, `TVM_FFI_ICHECK_LT(axis, src_tensor_dim)`): `Check failed:
  axis < src_tensor_dim (-1 vs. 2)`. The static form (`strided_slice_with_axes`) normalizes the
  axes; the rewrite does it for both.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax


@relax.expr_functor.mutator
class _NonNegativeSliceAxes(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.strided_slice"):
            return call
        data, axes = call.args[0], call.args[1]
        ndim = getattr(data.ty, "ndim", -1)
        if ndim < 0 or not isinstance(axes, relax.Tuple):
            return call
        values = [int(axis.value) for axis in axes.fields]
        if all(value >= 0 for value in values):
            return call
        fixed = relax.Tuple([relax.prim_value(v + ndim if v < 0 else v) for v in values])
        return relax.Call(call.op, [data, fixed, *call.args[2:]], call.attrs)


@tvm.transform.module_pass(opt_level=0, name="schedlang.NonNegativeSliceAxes")
def non_negative_slice_axes(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Every `relax.strided_slice` of a tensor of known rank with its axes counted from 0."""
    result = mod.clone()
    for global_var, func in mod.functions.items():
        if isinstance(func, relax.Function):
            mutator: Any = _NonNegativeSliceAxes(mod)
            result[global_var] = mutator.visit_expr(func)
    return result
