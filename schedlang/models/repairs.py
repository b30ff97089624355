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
- Shapes a symbolic length of 0 would change. torch.export records a `Dim`'s lower bound as
  0, and Relax infers shapes for every value of it: transformers' packed-sequence detection
  slices `position_ids[:, :1]` (`min(1, n)` long), concatenates it in front (`min(1, n) + n`)
  and subtracts two slices of that, whose lengths Relax cannot prove equal (`min(n, min(1, n)
  + n)` against `max(min(1, n) + n - 1, 0)`); the difference's shape is unknown and
  legalization stops: `emit_te now only supports Tensor that has ShapeExpr shape`. Every
  shape is simplified here with each symbolic variable of `main`'s parameters at least 1 (no
  prompt is empty) and at most its upper bound; a value whose shape simplifies is cast to the
  simpler shape (`R.match_cast`: checked when it runs), so both slices are `n` long.
"""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import relax, tirx


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


@relax.expr_functor.mutator
class _ShapesOfPositiveLengths(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, analyzer: Any) -> None:
        super().__init__(mod)
        self.analyzer = analyzer

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = self._in_bounds(self.visit_expr(binding.value))
        name = binding.var.name
        if not isinstance(binding.var, relax.DataflowVar):  # a block's output: as it is
            self.set_var_remap(binding.var, self.builder_.emit_output(value, name))
            return
        emitted = self.builder_.emit(value, name)
        sinfo = emitted.ty
        shape = getattr(getattr(sinfo, "shape", None), "values", None)
        if shape is not None:
            simpler = [self.analyzer.simplify(dim) for dim in shape]
            if not all(tvm_ffi.structural_equal(a, b) for a, b in zip(shape, simpler, strict=True)):
                cast = relax.TensorType(simpler, sinfo.dtype, sinfo.vdevice)
                emitted = self.builder_.match_cast(emitted, cast, name)
        self.set_var_remap(binding.var, emitted)

    def _in_bounds(self, value: relax.Expr) -> relax.Expr:
        """A `strided_slice` of step 1 whose bounds, counted from the start (a negative one
        from the end, one past the end at the end: torch's `x[:, 1:]`, `x[:, :-1]`), are
        provably within its input's shape: with those bounds and `assume_inbound`. Otherwise
        topi clamps them into shapes of `if_then_else` that Relax cannot infer a type for
        (FuseOps: `Cannot find the FInferType attribute registered to op: prim.if_then_else`)."""
        if not (
            isinstance(value, relax.Call)
            and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.strided_slice"
            and not value.attrs.assume_inbound
            and len(value.args) == 5
            and all(isinstance(a, relax.Tuple) for a in value.args[1:])
            and all(tvm.ir.is_prim_expr(f) for a in value.args[1:] for f in a.fields)
        ):
            return value
        data, axes, begin, end, strides = value.args
        shape = getattr(getattr(data.ty, "shape", None), "values", None)
        if shape is None:
            return value
        starts, stops = [], []
        for axis, first, last, step in zip(
            axes.fields, begin.fields, end.fields, strides.fields, strict=True
        ):
            dim = shape[int(axis)]
            first, last = self._from_start(first, dim), self._from_start(last, dim)
            if not (
                isinstance(step, tirx.IntImm)
                and int(step) == 1
                and self.analyzer.can_prove(first >= 0)
                and self.analyzer.can_prove(first <= last)
                and self.analyzer.can_prove(last <= dim)
            ):
                return value
            starts.append(first)
            stops.append(last)
        begin, end = relax.Tuple(starts), relax.Tuple(stops)
        return relax.op.strided_slice(data, axes, begin, end, strides, assume_inbound=True)

    def _from_start(self, bound: Any, dim: Any) -> Any:
        """A slice's bound counted from the start: a negative constant from the end, one at
        or past the end (torch's `x[1:]` ends at 2**63 - 1) the end itself."""
        if isinstance(bound, tirx.IntImm) and int(bound) < 0:
            return self.analyzer.simplify(dim + bound)
        if self.analyzer.can_prove(bound >= dim):
            return dim
        return bound


def _length_analyzer(func: relax.Function) -> Any | None:
    """An analyzer knowing each symbolic variable of `func`'s parameters is at least 1 (and at
    most its upper bound); None when there is none."""
    variables = relax.analysis.defined_symbolic_vars(func)
    if not variables:
        return None
    attrs = func.attrs if func.attrs is not None else {}
    upper = dict(attrs.get("tir_var_upper_bound", {}))
    analyzer = tvm.sym.Analyzer()
    for var in variables:
        bound = upper.get(var.name)
        end = int(bound) + 1 if bound is not None else 2**31
        dtype = str(var.ty.dtype)
        analyzer.bind(var, tvm.ir.Range(tirx.const(1, dtype), tirx.const(end, dtype)))
    return analyzer


@tvm.transform.module_pass(opt_level=0, name="schedlang.ShapesOfPositiveLengths")
def shapes_of_positive_lengths(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Every value's shape simplified with `main`'s symbolic lengths at least 1."""
    main = next((f for g, f in mod.functions.items() if g.name_hint == "main"), None)
    analyzer = _length_analyzer(main) if isinstance(main, relax.Function) else None
    if analyzer is None:
        return mod
    result = mod.clone()
    mutator: Any = _ShapesOfPositiveLengths(mod, analyzer)
    result[mod.get_global_var("main")] = mutator.visit_expr(main)
    return result
