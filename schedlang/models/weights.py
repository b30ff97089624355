"""Constant weights: which parameters of a model's PrimFuncs are constants, and their packing done
once, when the model is built (a schedule's `prepack`).

    to_tir (LegalizeOps, FuseOps, FuseTIR)
      │  AttachLayoutFreeBuffers: each PrimFunc's parameters that are constants at every call
      ▼  site, as TVM's `layout_free_buffers` attribute (what `prepack` requires)
    ApplySchedlangDatabase
      │  SplitLayoutRewritePreproc: each block a schedule `prepack`ed becomes NAME_weight_prepack,
      │  the rest NAME_prepacked, taking the packed weight
      │  FoldConstant: NAME_weight_prepack runs on the constant, at build time
      ▼  DeadCodeElimination: the packing functions are no longer called
    the built model: each call runs the kernels alone

TVM's own pipeline (`static_shape_tuning_pipeline(cpu_weight_prepack=True)`) runs the same
passes, with TVM's AttachAttrLayoutFreeBuffers, which renames every function it marks (a second
`fused_matmul_add_relu` becomes `fused_matmul_add_relu1`), and LiftTransformParams, which moves
the packing of weights passed as `main`'s parameters (`num_input`) into `main_transform_params`,
for the caller to run. schedlang keeps the names (records and the profile name functions) and
the models' `main`: only weights bound as constants are layout-free, and FoldConstant packs them.
"""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from schedlang.lang.statements.layout import LAYOUT_FREE_ATTR, PREPACK_ANNOTATION


def layout_free_indices(mod: tvm.IRModule) -> dict[str, list[int]]:
    """For each PrimFunc the module's Relax functions call, the positions of its arguments that
    are Relax constants at every call site. TVM's pass counts `main`'s parameters past its
    `num_input` too, and lifts their packing into `main_transform_params`, which the caller must
    run; schedlang does not lift, so such a weight would be packed at every call after all: only
    constants count here."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    found: dict[str, set[int]] = {}

    def visit(expr: Any) -> None:
        if not (isinstance(expr, relax.Call) and expr.op.same_as(call_tir)):
            return
        callee, args = expr.args[0], expr.args[1].fields
        constant = {i for i, arg in enumerate(args) if isinstance(arg, tvm.ir.expr.Constant)}
        name = callee.name_hint
        found[name] = found[name] & constant if name in found else constant

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return {name: sorted(indices) for name, indices in found.items()}


@tvm.transform.module_pass(opt_level=0, name="schedlang.AttachLayoutFreeBuffers")
def attach_layout_free_buffers(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """TVM's AttachAttrLayoutFreeBuffers, keeping the functions' names: each PrimFunc called gets
    `layout_free_buffers`, its parameters constant at every call site."""
    indices = layout_free_indices(mod)
    result = mod.clone()
    for global_var, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and global_var.name_hint in indices:
            free = [tvm.runtime.convert(i) for i in indices[global_var.name_hint]]
            result[global_var] = func.with_attr(LAYOUT_FREE_ATTR, free)
    return result


def prepacks(func: tirx.PrimFunc) -> bool:
    """Whether a block of `func` is a packing a schedule `prepack`ed."""
    found: list[bool] = []

    def visit(block: s_tir.SBlock) -> s_tir.SBlock:
        found.append(PREPACK_ANNOTATION in block.annotations)
        return block

    tvm_ffi.structural_map(func.body, [(s_tir.SBlock, visit)])
    return any(found)


@tvm.transform.module_pass(opt_level=0, name="schedlang.SplitLayoutRewritePreproc")
def split_prepacked(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """TVM's SplitLayoutRewritePreproc on the PrimFuncs that prepack a weight, and only them.

    TVM's pass visits every PrimFunc, and stops on one whose root block holds no block (`Check
    failed: (current_subtree_ == -1) ... There should be a compute block if there is only one
    subtree under the root`, src/relax/transform/split_layout_rewrite_preproc.cc, in
    `visit_root_block`): the functions topi writes with its IR builder are such, as the `cumsum`
    CPU library dispatch gives (`DispatchSortScan`: one opaque `cumsum_generic` block and its
    loops). A function with nothing to split is returned as it is by the pass anyway, so those
    are set aside while it runs and put back after."""
    aside = {
        global_var: func
        for global_var, func in mod.functions.items()
        if isinstance(func, tirx.PrimFunc) and not prepacks(func)
    }
    if len(aside) == sum(isinstance(f, tirx.PrimFunc) for f in mod.functions.values()):
        return mod
    shown = tvm.IRModule(
        {gv: func for gv, func in mod.functions.items() if gv not in aside},
        mod.attrs,
        mod.global_infos,
    )
    split = relax.transform.SplitLayoutRewritePreproc()(shown)
    for global_var, func in aside.items():
        split[global_var] = func
    return split


def prepack_passes() -> list[tvm.transform.Pass]:
    """After the schedules: the weights a schedule `prepack`s packed once, at build time (see
    the module's docstring)."""
    return [split_prepacked, relax.transform.FoldConstant(), relax.transform.DeadCodeElimination()]
