"""Scheduled PrimFunc → a built library, and schedlang as a TVM module pass.

sched = schedlang.apply(func, "tile i, j by 32x32; vectorize j.i", "llvm")
lib = schedlang.build(func, "tile i, j by 32x32; vectorize j.i", "llvm")

seq = tvm.transform.Sequential([schedlang.SchedulePass({"main": text}, target), ...])
"""

from __future__ import annotations

from collections.abc import Mapping

import tvm
from tvm import tirx

from schedlang.checker.pipeline import SCHEDULED_ATTR, Lowered, lower
from schedlang.core.target import Target, as_target
from schedlang.lang import nodes
from schedlang.lang.syntax import parse
from schedlang.run.codegen import compile_func, export, source, watching_builds

ScheduleLike = str | nodes.Schedule

# compile_func, export, source and watching_builds live in schedlang.run.codegen (below
# schedlang.run.measure, which builds references with them); users look for them here too.
__all__ = [
    "ScheduleLike",
    "SchedulePass",
    "apply",
    "as_schedule",
    "build",
    "build_lowered",
    "compile_func",
    "export",
    "source",
    "watching_builds",
]


def as_schedule(schedule: ScheduleLike, file: str = "<string>") -> nodes.Schedule:
    return schedule if isinstance(schedule, nodes.Schedule) else parse(schedule, file)


def apply(
    func: tirx.PrimFunc,
    schedule: ScheduleLike,
    target: Target | str = "llvm",
    knobs: Mapping[str, int] | None = None,
    *,
    strict: bool = False,
    partial: bool = True,
) -> tirx.PrimFunc:
    """The scheduled function; raises DiagnosticError listing every problem.

    The result is not built here, so a GPU schedule may leave blocks unbound for another pass
    to finish (a warning; such a function is not marked `tirx.is_scheduled`); `partial=False`
    refuses it as `build` does."""
    target = as_target(target)
    return lower(as_schedule(schedule), func, target, knobs, strict=strict, partial=partial).func


def build(
    func: tirx.PrimFunc,
    schedule: ScheduleLike | None = None,
    target: Target | str = "llvm",
    knobs: Mapping[str, int] | None = None,
    *,
    verify: bool = True,
) -> tvm.runtime.Executable:
    """Build `func` (scheduled by `schedule`, or as it is) for `target`.

    A scheduled kernel for a target this machine runs is verified first: it runs once in a worker
    process against the unscheduled function (schedlang.run.verify), and a wrong, crashing or
    hanging
    kernel raises SchedlangError. `verify=False` skips that run."""
    target = as_target(target)
    if schedule is None:
        return compile_func(func, target)
    executable = compile_func(apply(func, schedule, target, knobs, partial=False), target)
    if verify:
        from schedlang.run.verify import runs_here, verify_build

        if runs_here(target):
            verify_build(func, executable, target)
    return executable


def build_lowered(lowered: Lowered, target: Target) -> tvm.runtime.Executable:
    return compile_func(lowered.func, target)


@tvm.transform.module_pass(opt_level=0, name="schedlang.ApplySchedules")
class SchedulePass:
    """Apply schedlang schedules to the PrimFuncs of an IRModule, by function name.

    Functions already marked scheduled (`tirx.is_scheduled`) and functions without a schedule are
    left alone, so this composes with dlight or MetaSchedule later in a Sequential. A GPU
    schedule must bind every block, unless `partial`: then a block left unbound is a warning and
    its function stays unmarked, for dlight (or another pass) later in the Sequential to finish.
    """

    def __init__(
        self,
        schedules: Mapping[str, ScheduleLike],
        target: Target | str = "llvm",
        *,
        partial: bool = False,
    ):
        self.schedules = {name: as_schedule(s, f"<{name}>") for name, s in schedules.items()}
        self.target = as_target(target)
        self.partial = partial

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for global_var, func in mod.functions.items():
            name = global_var.name_hint
            if not isinstance(func, tirx.PrimFunc) or name not in self.schedules:
                continue
            if func.attrs is not None and func.attrs.get(SCHEDULED_ATTR, False):
                continue
            scheduled = lower(self.schedules[name], func, self.target, partial=self.partial).func
            updates[global_var] = scheduled.with_attr("global_symbol", name)
        for global_var, func in updates.items():
            mod[global_var] = func
        return mod
