"""The Relax passes around the schedules: a model's operators to PrimFuncs (the tasks), and the
whole build with a scheduling pass in it (schedlang.models.graph uses both).

    Relax IRModule
      │  inference passes: batch norm folded into its convolution, the constants folded
      │  Winograd (CPUs): each qualifying 3x3 convolution as schedlang.models.winograd computes it
      │  library dispatch, LegalizeOps, FuseOps + FuseTIR, as tvm.compile does
      │  functions that only reshape made views (as tvm.compile's dataflow lowering does)
      ▼  AttachLayoutFreeBuffers: each PrimFunc's constant parameters (models.weights)
    Relax functions calling PrimFuncs                     (to_tir: what the tasks come from)
      │  the schedules (a pass: ApplySchedlangDatabase)
      │  the weights a schedule `prepack`s packed once (models.weights.prepack_passes)
      ▼  dataflow lowering, memory planning, VM code      (relax_pipeline: what tvm.compile runs)
"""

from __future__ import annotations

import importlib
from typing import Any

import tvm
from tvm import relax

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.core.target import Target, as_target
from schedlang.models.repairs import non_negative_slice_axes, shapes_of_positive_lengths
from schedlang.models.weights import attach_layout_free_buffers, prepack_passes
from schedlang.models.winograd import winograd_conv2d


def _backend(target: Target) -> Any:
    """TVM's Relax backend for the target (its pipeline's passes, stage by stage)."""
    name = {"llvm": "cpu_generic", "cuda": "cuda", "rocm": "rocm"}.get(target.kind, "gpu_generic")
    return importlib.import_module(f"tvm.relax.backend.{name}.pipeline")


def inference_passes() -> list[tvm.transform.Pass]:
    """The model as TVM's own tuning pipeline (`static_shape_tuning`) sees it before tuning:
    batch norm folded into the convolution before it where the weights are constants (a PyTorch
    or ONNX model's are: schedlang.models.frontends binds them), what is left of it decomposed
    into arithmetic for inference, and the constants folded, so no batch-norm function is left
    to schedule and the scale is computed once, when the model is built."""
    return [
        relax.transform.FoldBatchnormToConv2D(),
        relax.transform.DecomposeOpsForInference(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.FoldConstant(),
    ]


def constant_folding() -> list[tvm.transform.Pass]:
    """The legalized operators whose inputs are all constants, run once at build time.

    One FoldConstant does not reach them all: an operator taking a tuple of tensors (transformers'
    causal mask indexes a tensor with `aten.index.Tensor`, `relax.index_tensor`) is legalized
    to a call whose arguments read `(a, b)[0]`, `(a, b)[1]`; FoldConstant folds `a` and `b` but
    not the reads of the tuple, so the call is left with arguments it does not see as constants.
    CanonicalizeBindings replaces those reads with the constants, and a second FoldConstant
    folds the call (and what depends only on it: the whole mask)."""
    return [
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.FoldConstant(),
    ]


def to_tir_passes(
    target: Target, fuse: bool = True, winograd: bool = True
) -> list[tvm.transform.Pass]:
    """Operators to PrimFuncs, as TVM's default pipeline does it (fused, unless `fuse` is False),
    after the inference passes and without the dlight schedules its GPU pipelines add; on CPUs
    the 3x3 convolutions Winograd suits computed with it, unless `winograd` is False."""
    passes = [
        non_negative_slice_axes,
        shapes_of_positive_lengths,
        *inference_passes(),
        *([winograd_conv2d] if winograd and not target.is_gpu else []),
        *_backend(target).library_dispatch_passes(target.to_tvm()),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        *constant_folding(),
    ]
    if fuse:
        passes += [relax.transform.FuseOps(), relax.transform.FuseTIR()]
    # A PrimFunc that only reshapes is never run: the build's dataflow lowering makes each call
    # of one a view of its input (RewriteDataflowReshape). Done here, the tasks do not count
    # them (transformers' decoders call a dozen; each got trials, and a share of the estimate).
    passes += [relax.transform.RewriteDataflowReshape(), relax.transform.DeadCodeElimination()]
    # Which parameters of each PrimFunc are constants at every call site (`layout_free_buffers`):
    # where a schedule may `prepack` them.
    return [*passes, attach_layout_free_buffers]


def to_tir(
    mod: tvm.IRModule, target: Target | str, fuse: bool = True, winograd: bool = True
) -> tvm.IRModule:
    """The module with every Relax operator legalized to a call of a PrimFunc."""
    target = as_target(target)
    try:
        with target.to_tvm():
            return tvm.transform.Sequential(to_tir_passes(target, fuse, winograd))(mod)
    except Exception as exc:  # TVM raises several types; the user needs its reason either way
        raise SchedlangError(f"TVM could not legalize the model: {error_line(exc)}") from None


def relax_pipeline(
    target: Target | str,
    schedule: tvm.transform.Pass | None,
    fuse: bool = True,
    winograd: bool = True,
) -> tvm.transform.Pass:
    """TVM's Relax pipeline for `target` with `schedule` (a pass over the PrimFuncs) between
    legalization and the lowering of the dataflow."""
    target = as_target(target)
    tvm_target = target.to_tvm()
    backend = _backend(target)
    passes = [
        *to_tir_passes(target, fuse, winograd),
        *([schedule] if schedule is not None else []),
        *prepack_passes(),
        *backend.dataflow_lower_passes(tvm_target),
        *backend.finalize_passes(tvm_target),
    ]

    @tvm.transform.module_pass(opt_level=0, name="schedlang.RelaxPipeline")
    def run(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with tvm_target:
            return tvm.transform.Sequential(passes)(mod)

    return run


def compile_relax(
    mod: tvm.IRModule, target: Target, pipeline: Any, what: str = "model"
) -> tvm.runtime.Executable:
    """`tvm.compile` with `pipeline` (a Relax pipeline, or its name); TVM's error, which may be of
    any type, a SchedlangError naming `what` was built."""
    try:
        return tvm.compile(mod, target=target.to_tvm(), relax_pipeline=pipeline)
    except SchedlangError:
        raise
    except Exception as exc:
        raise SchedlangError(f"TVM could not build the {what}: {error_line(exc)}") from None
