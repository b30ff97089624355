"""The decoder's Relax module and its build.

    mod, names = export(config, max_length)         # prefill + decode, weights as parameters
    executable = compile_decoder(mod, target)        # or with schedule=ApplySchedlangDatabase(...)

The build is schedlang's whole-model pipeline (schedlang.models.pipeline.relax_pipeline):
legalization, fusion, then `schedule` — any pass over the PrimFuncs, such as
schedlang.models.graph.ApplySchedlangDatabase with a tuning database — then TVM's lowering to
the VM. Without one, each PrimFunc keeps the default TVM gives it (on CPUs: none). dlight's CPU
rules are not used: measured (2026-12-06, TVM 0.27, the tiny config), its GEMV rule makes LLVM
take 4 to more than 30 s per decode GEMV (the LM head: over 30 s), where the unscheduled
function builds in 0.1 s. `kernels(mod, target)` lists the PrimFuncs a tuner sees: the module
as it is right before the schedule pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax, tirx

from schedlang.core.opinfo import arg_buffers
from schedlang.core.target import Target, as_target
from schedlang.models.decoder.config import DecoderConfig
from schedlang.models.decoder.network import DecoderNetwork
from schedlang.models.pipeline import compile_relax, relax_pipeline, to_tir


def export(
    config: DecoderConfig, max_length: int, fused_prefill: bool = True
) -> tuple[tvm.IRModule, list[str]]:
    """The Relax module of the decoder (functions `prefill` and `decode`) and the names of its
    parameters in the order the functions take them (network.DecoderNetwork's); prefill's
    attention the fused kernel (attention_prefill.py), or kernels.attention's computation as
    decode's without `fused_prefill`."""
    network = DecoderNetwork(config, fused_prefill)
    mod, params = network.export_tvm(spec=network.spec(max_length))
    return mod, [name for name, _ in params]


def compile_decoder(
    mod: tvm.IRModule,
    target: Target | str = "llvm",
    schedule: tvm.transform.Pass | None = None,
) -> tvm.runtime.Executable:
    """The module built for `target`: an Executable for the Relax VM."""
    target = as_target(target)
    pipeline = relax_pipeline(target, schedule, fuse=True, winograd=False)
    return compile_relax(mod, target, pipeline, "decoder")


@dataclass(frozen=True)
class Kernel:
    """One PrimFunc of the built decoder: its name, its buffers' shapes then its scalar
    parameters (`past`), and the entry points calling it."""

    name: str
    shapes: tuple[str, ...]
    callers: tuple[str, ...]

    def summary(self) -> str:
        return f"{self.name}: {', '.join(self.shapes)} (called by {', '.join(self.callers)})"


def kernels(mod: tvm.IRModule, target: Target | str = "llvm") -> list[Kernel]:
    """The PrimFuncs the schedule pass sees, in module order, each with its buffers' shapes
    (symbolic extents by name: n, past) and the entry points calling it."""
    lowered = to_tir(mod, target, fuse=True, winograd=False)
    callers: dict[str, set[str]] = {}
    for global_var, func in lowered.functions.items():
        if isinstance(func, relax.Function):
            for callee in _callees(func):
                callers.setdefault(callee, set()).add(global_var.name_hint)
    found = []
    for global_var, func in lowered.functions.items():
        if isinstance(func, tirx.PrimFunc):
            shapes = tuple(f"{b.name}[{', '.join(map(str, b.shape))}]" for b in arg_buffers(func))
            # Scalar parameters (the cached length `past`): symbolic extents no buffer shows.
            scalars = [p for p in func.params if not isinstance(p.ty, tvm.tirx.BufferType)]
            shapes += tuple(p.name for p in scalars)
            name = global_var.name_hint
            found.append(Kernel(name, shapes, tuple(sorted(callers.get(name, ())))))
    return found


def _callees(func: relax.Function) -> set[str]:
    names: set[str] = set()

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call):
            for arg in expr.args:
                if isinstance(arg, tvm.ir.GlobalVar):
                    names.add(arg.name_hint)

    relax.analysis.post_order_visit(func, visit)
    return names
