"""Whole models: the PrimFuncs of a Relax IRModule as tuning tasks, and the database's best
schedules applied to them in a Relax build.

    model = load_model("examples/models/mlp.py")  # schedlang.models.model_file
    tasks = extract_tasks(model.mod, target)     # what `schedlang tune-model` tunes
    executable, applied = build_model(model.mod, target, db)

`build_model` runs TVM's own Relax pipeline with one pass added where MetaSchedule's database pass
goes, after the operators became PrimFuncs and before they are called through the VM:

    Relax IRModule
      │  batch norm folded, Winograd for 3x3 convolutions on CPUs (winograd=False: not), then
      │  library dispatch, LegalizeOps, FuseOps + FuseTIR   (as tvm.compile does; fuse=False
      ▼  keeps one PrimFunc per operator; schedlang.models.pipeline)
    Relax functions calling PrimFuncs, each marked with its constant weights (models.weights)
      │  ApplySchedlangDatabase: each PrimFunc not yet scheduled gets the fastest verified record
      │  of its op_key on this target, re-checked and lowered by schedlang; a function without
      │  one (or whose records no longer apply) gets dlight's default schedule
      │  the weights a record `prepack`s packed once, here (models.weights.prepack_passes)
      ▼
    dataflow lowering, memory planning, VM code  ─► tvm.compile ─► Executable for the Relax VM

Matching is structural. A function's key is `records.op_key` (names do not count) of its
int32-index form: Relax legalizes operators with int64 shapes and loop variables, `te` op files use
int32, and `ForceNarrowIndexToInt32` makes the two forms equal. So a matmul tuned as
`examples/matmul.py -D M=64 -D N=1024 -D K=512` serves the same unfused matmul inside a model, and
the other way round.

Names. A schedule speaks the names of the function it was tuned on (`block matmul:`, `split i0`,
`cache_read w1`), and two matching functions may name their blocks, loops and buffers differently.
The tuner keeps those names with each record (`Record.extra["names"]`, `schedule_names`); a
matching function named otherwise is first given them (`models.renaming.rename_like`), then
scheduled.

Model files (`@schedlang.model`, `load_model`) are schedlang.models.model_file's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx

from schedlang.checker.pipeline import SCHEDULED_ATTR, lower
from schedlang.core.diagnostics import SchedlangError, error_line, one_of
from schedlang.core.opinfo import describe, flop_count, schedule_names
from schedlang.core.ops import Op, from_primfunc
from schedlang.core.target import Target, as_target
from schedlang.lang.statements.layout import LAYOUT_FREE_ATTR, layout_free_params
from schedlang.lang.syntax import parse
from schedlang.models.pipeline import (  # noqa: F401  (to_tir and inference_passes: from here too)
    compile_relax,
    inference_passes,
    relax_pipeline,
    to_tir,
)
from schedlang.models.renaming import rename_like
from schedlang.run.outcome import compare_outputs  # noqa: F401  (a model's outputs too)
from schedlang.store.db import Database
from schedlang.store.records import Record, op_key

FALLBACKS = ("auto", "dlight", "none")
# dlight's rules for the fallback, in the order they are tried: on GPUs those TVM's CUDA pipeline
# applies; dlight has only these two for CPUs.
DLIGHT_RULES = {
    "gpu": ("Matmul", "GEMV", "Reduction", "GeneralReduction", "Fallback"),
    "cpu": ("GEMV", "Reduction"),
}
# Records tried per function, fastest first, before falling back.
RECORDS_TRIED = 3


class StaleRecordWarning(UserWarning):
    """A record matched a function but its schedule no longer applies; the next one is tried."""


# --- from Relax to PrimFuncs, and tasks ----------------------------------------------------------


def int32_indices(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with int32 loop variables, shapes and indices, so that it keys like a `te` op; as it
    is when narrowing would change the dtype of a buffer's data (ForceNarrowIndexToInt32 narrows
    int64 data too) or fails."""
    try:
        narrowed = tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"]
    except Exception:  # extents beyond int32, or IR the pass does not know: keep int64
        return func
    if _buffer_dtypes(narrowed) != _buffer_dtypes(func):
        return func
    return narrowed


def task_function(func: tirx.PrimFunc, name: str) -> tirx.PrimFunc:
    """A module's PrimFunc as an op: int32 indices, without the fusion pattern Relax annotates it
    with (it does not change the code), and with a symbol (Relax's PrimFuncs are private, and a
    private function cannot be built on its own to measure it).

    Its constant weights (`layout_free_buffers`) stay, and count in its key: a record that
    `prepack`s a weight, timed without the packing, is not one for the same function called with
    a weight that may change. An empty list goes, so the function keys like its op file."""
    canonical = int32_indices(func).without_attr("op_pattern").with_attr("global_symbol", name)
    if not layout_free_params(canonical):
        canonical = canonical.without_attr(LAYOUT_FREE_ATTR)
    return canonical


def _buffer_dtypes(func: tirx.PrimFunc) -> list[str]:
    return [b.dtype for b in describe(func).buffers]


def is_scheduled(func: tirx.PrimFunc) -> bool:
    return bool(func.attrs is not None and func.attrs.get(SCHEDULED_ATTR, False))


@dataclass(frozen=True)
class Task:
    """One distinct PrimFunc of a model: what `schedlang tune-model` tunes."""

    name: str  # its first function's name in the module
    op: Op  # the function with int32 indices, ready for `tune`
    key: str  # op_key(op.func): records are looked up by it
    functions: tuple[str, ...]  # every function of the module with this key
    calls: int  # call sites in the module's Relax functions
    flops: int | None

    @property
    def weight(self) -> float:
        """Its share of the model's work: flops per call times calls."""
        return float(self.flops or 0) * self.calls


def model_key(mod: tvm.IRModule) -> str:
    """A structural hash of a model's module, as 16 hex digits (as `records.op_key` of an op):
    how the database tells the model `tune-model` tuned from the one `build-model` timed."""
    return f"{tvm_ffi.structural_hash(mod) & (2**64 - 1):016x}"


def extract_tasks(
    mod: tvm.IRModule, target: Target | str, *, fuse: bool = True, winograd: bool = True
) -> list[Task]:
    """The model's distinct PrimFuncs after legalization (and fusion), heaviest first.

    Functions already scheduled are not tasks. Two functions that differ only in names and index
    dtype are one task, with the calls of both.
    """
    lowered = to_tir(mod, target, fuse, winograd)
    calls = call_counts(lowered)
    tasks: dict[str, dict[str, Any]] = {}
    for global_var, func in lowered.functions.items():
        if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
            continue
        name = global_var.name_hint
        canonical = task_function(func, name)
        key = op_key(canonical)
        task = tasks.setdefault(key, {"name": name, "func": canonical, "functions": [], "calls": 0})
        task["functions"].append(name)
        task["calls"] += calls.get(name, 0)
    found = []
    for key, task in tasks.items():
        op = from_primfunc(task["func"], task["name"])
        flops = _static_flops(op)
        found.append(Task(task["name"], op, key, tuple(task["functions"]), task["calls"], flops))
    return sorted(found, key=lambda t: (-t.weight, t.name))


def _static_flops(op: Op) -> int | None:
    """The op's flops; None for symbolic shapes (TVM's estimator then guesses a size) or when
    they cannot be counted. Such a task gets no trials: the tuner needs static shapes."""
    if any(isinstance(d, str) for b in (*op.inputs, *op.outputs) for d in b.shape):
        return None
    try:
        return flop_count(op.func)
    except SchedlangError:
        return None


def call_counts(mod: tvm.IRModule) -> dict[str, int]:
    """How often the module's Relax functions call each PrimFunc (call_tir and its variants)."""
    counts: dict[str, int] = {}
    call_ops = [tvm.ir.Op.get(f"relax.{name}") for name in ("call_tir", "call_tir_inplace")]

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and any(expr.op.same_as(op) for op in call_ops):
            callee = expr.args[0]
            if isinstance(callee, relax.GlobalVar):
                counts[callee.name_hint] = counts.get(callee.name_hint, 0) + 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


# --- the pass ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """What one PrimFunc of the module got."""

    function: str
    how: str  # "schedlang", "dlight", "unscheduled" or "scheduled before"
    key: str
    record: Record | None = None
    warnings: tuple[str, ...] = ()

    def summary(self) -> str:
        if self.record is not None:
            gflops = f"{self.record.gflops:.1f} GFLOP/s" if self.record.gflops else "no figure"
            if not self.record.schedule.strip():  # the baseline measured fastest
                return f"unscheduled: record #{self.record.id} ({gflops}), the fastest measured"
            return f"schedlang record #{self.record.id} ({gflops})"
        return self.how


@tvm.transform.module_pass(opt_level=0, name="schedlang.ApplySchedlangDatabase")
class ApplySchedlangDatabase:
    """Schedule every PrimFunc of a module from a schedlang tuning database.

    For each PrimFunc not marked scheduled (`tirx.is_scheduled`): the fastest verified records of
    its op_key on `target` are tried in turn (checked and lowered again by schedlang, so a record
    that no longer applies is skipped with a `StaleRecordWarning`); a function none applies to gets
    dlight's default schedule (`fallback="dlight"`) or stays as it is (`fallback="none"`);
    `"auto"` is dlight on GPUs and none on CPUs, as `tvm.compile` builds them.

    dlight's rules: on GPUs Matmul, GEMV, Reduction, GeneralReduction and Fallback, as TVM's CUDA
    pipeline applies them, so every function gets threads. On CPUs dlight has only GEMV and
    Reduction (it treats a matmul or a convolution as a reduction); measured, they made whole
    models slower than no schedule at all (2026-12-03, 2-core Zen 4, nothing tuned: the convnet
    example 138 us with them against 28 us without, the attention block 212 us against 12 us),
    hence none on CPUs unless asked for.

    After the pass runs, `applied` lists what each function got, in module order.
    """

    def __init__(self, db: Database, target: Target | str = "llvm", fallback: str = "auto") -> None:
        if fallback not in FALLBACKS:
            raise SchedlangError(f"unknown fallback `{fallback}`", one_of(FALLBACKS, "fallbacks"))
        self.db = db
        self.target = as_target(target)
        if fallback == "auto":
            fallback = "dlight" if self.target.is_gpu else "none"
        self.fallback = fallback
        self.applied: list[Applied] = []

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.applied = []
        updates = {}
        for global_var, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            scheduled, applied = self.schedule(global_var.name_hint, func)
            self.applied.append(applied)
            if scheduled is not None:
                updates[global_var] = scheduled
        result = mod.clone()  # a Python pass would otherwise change the caller's module in place
        for global_var, func in updates.items():
            result[global_var] = func
        return result

    def schedule(self, name: str, func: tirx.PrimFunc) -> tuple[tirx.PrimFunc | None, Applied]:
        """The scheduled function (None when it stays as it is) and what it got."""
        if is_scheduled(func):
            return None, Applied(name, "scheduled before", "")
        canonical = task_function(func, name)
        key = op_key(canonical)
        problems: list[str] = []
        for record in self.db.best(key, self.target.key, n=RECORDS_TRIED):
            try:
                scheduled = self.apply_record(record, canonical)
            except Exception as exc:  # a build goes on without the record, whatever went wrong
                reason = exc.message if isinstance(exc, SchedlangError) else error_line(exc)
                problem = f"{name}: record #{record.id} no longer applies: {reason}"
                warnings.warn(problem, StaleRecordWarning, stacklevel=2)
                problems.append(problem)
                continue
            return _like(scheduled, func), Applied(name, "schedlang", key, record, tuple(problems))
        fallback = self.dlight(func) if self.fallback == "dlight" else None
        if fallback is None:
            return None, Applied(name, "unscheduled", key, None, tuple(problems))
        return _like(fallback, func), Applied(name, "dlight", key, None, tuple(problems))

    def apply_record(self, record: Record, func: tirx.PrimFunc) -> tirx.PrimFunc:
        names = record.extra.get("names") if isinstance(record.extra, dict) else None
        if names and names != schedule_names(func):
            func = rename_like(func, names)
        return lower(parse(record.schedule, f"<record #{record.id}>"), func, self.target).func

    def dlight(self, func: tirx.PrimFunc) -> tirx.PrimFunc | None:
        """dlight's default schedule for `func`, or None when no rule takes it."""
        from tvm.s_tir import dlight

        kind = "gpu" if self.target.is_gpu else "cpu"
        rules = [getattr(getattr(dlight, kind), rule)() for rule in DLIGHT_RULES[kind]]
        try:
            with self.target.to_tvm():
                result = dlight.ApplyDefaultSchedule(*rules)(tvm.IRModule({"main": func}))["main"]
        except Exception as exc:  # a rule that fails leaves the function to TVM's defaults
            warnings.warn(f"dlight could not schedule it: {error_line(exc)}", stacklevel=3)
            return None
        return result if is_scheduled(result) else None


def _like(scheduled: tirx.PrimFunc, original: tirx.PrimFunc) -> tirx.PrimFunc:
    """`scheduled` with `original`'s attributes (its symbol, or none: the VM names private
    functions itself) plus the scheduled mark."""
    attrs = dict(original.attrs) if original.attrs is not None else {}
    result = scheduled.without_attr("global_symbol")
    for key, value in attrs.items():
        result = result.with_attr(key, value)
    return result.with_attr(SCHEDULED_ATTR, True)


# --- building and running ------------------------------------------------------------------------


def build_model(
    mod: tvm.IRModule,
    target: Target | str,
    db: Database,
    *,
    fuse: bool = True,
    winograd: bool = True,
    fallback: str = "auto",
) -> tuple[tvm.runtime.Executable, list[Applied]]:
    """Build a Relax model with the database's best schedules; (executable, what each PrimFunc
    got)."""
    target = as_target(target)
    schedule = ApplySchedlangDatabase(db, target, fallback)
    executable = compile_relax(mod, target, relax_pipeline(target, schedule, fuse, winograd))
    unscheduled = [item.function for item in schedule.applied if item.how == "unscheduled"]
    if target.is_gpu and unscheduled:
        # TVM builds a function without threads for the host: it would read GPU memory there.
        raise SchedlangError(
            f"no schedule for {', '.join(unscheduled)} on {target.kind}: without threads, TVM "
            "would run it on the host",
            "keep the dlight fallback, or tune it",
        )
    return executable, list(schedule.applied)


def build_default(mod: tvm.IRModule, target: Target | str) -> tvm.runtime.Executable:
    """The model as `tvm.compile` builds it: no schedules on CPUs, dlight's on GPUs."""
    return compile_relax(mod, as_target(target), "default")


def run_model(
    executable: tvm.runtime.Executable, inputs: Sequence[np.ndarray], target: Target | str
) -> list[np.ndarray]:
    """`main` once on `inputs`; its outputs (a tuple's items, in order)."""
    vm, device = _vm(executable, as_target(target))
    result = vm["main"](*(tvm.runtime.tensor(a, device) for a in inputs))
    return _flatten(result)


def time_model(
    executable: tvm.runtime.Executable,
    inputs: Sequence[np.ndarray],
    target: Target | str,
    *,
    repeat: int = 5,
    min_repeat_ms: int = 100,
) -> tuple[float, ...]:
    """Seconds per run of `main`, one figure per repeat (TVM's time evaluator)."""
    vm, device = _vm(executable, as_target(target))
    tensors = [tvm.runtime.tensor(a, device) for a in inputs]
    evaluator = vm.time_evaluator(
        "main", device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms
    )
    return tuple(float(t) for t in evaluator(*tensors).results)


def timer(
    executable: tvm.runtime.Executable,
    inputs: Sequence[np.ndarray],
    target: Target | str,
    min_repeat_ms: int = 100,
) -> Callable[[], float]:
    """One repeat of `main` at a time (TVM's time evaluator, at least `min_repeat_ms` of runs):
    seconds per run, for timing beside other builds in turns (baselines.interleave)."""
    vm, device = _vm(executable, as_target(target))
    tensors = [tvm.runtime.tensor(a, device) for a in inputs]
    evaluator = vm.time_evaluator("main", device, number=1, repeat=1, min_repeat_ms=min_repeat_ms)
    return lambda: float(evaluator(*tensors).results[0])


def _vm(executable: tvm.runtime.Executable, target: Target) -> tuple[Any, tvm.runtime.Device]:
    from schedlang.run.measure import device_for

    device = device_for(target)
    return relax.VirtualMachine(executable, device), device


def _flatten(result: Any) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [array for item in result for array in _flatten(item)]
