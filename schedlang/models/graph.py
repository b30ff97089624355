"""Whole models: the PrimFuncs of a Relax IRModule as tuning tasks, and the database's best
schedules applied to them in a Relax build.

    model = load_model("examples/models/mlp.py")
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
matching function named otherwise is first given them (`rename_like`), then scheduled.

A model file is Python, like an op file (schedlang.core.ops): a function decorated with
`@schedlang.model`, whose keyword parameters are shape parameters (`-D batch=16`), returning a
Relax IRModule with a `main` function, or `(IRModule, inputs)` with one numpy array per parameter
of `main`, or a PyTorch module with its example inputs (or an ExportedProgram: see
schedlang.models.frontends); or a module-level IRModule. An .onnx file is a model too. Model files
are code and run with your privileges.
"""

from __future__ import annotations

import io
import keyword
import re
import tokenize
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx

from schedlang.checker.pipeline import SCHEDULED_ATTR, lower
from schedlang.core.diagnostics import SchedlangError, error_line, one_of
from schedlang.core.loader import (
    DEFAULT_TIMEOUT_S,
    Definition,
    ParamValue,
    Reference,
    bind_params,
    bind_reference,
    decorate,
    pick_definition,
    raised_by_file,
    running,
)
from schedlang.core.opinfo import describe, flop_count, schedule_names
from schedlang.core.ops import Op, OpDefinition, from_primfunc, numpy_dtype
from schedlang.core.target import Target, as_target
from schedlang.lang.statements.layout import LAYOUT_FREE_ATTR, layout_free_params
from schedlang.lang.syntax import parse
from schedlang.models.pipeline import (  # noqa: F401  (to_tir and inference_passes: from here too)
    inference_passes,
    relax_pipeline,
    to_tir,
)
from schedlang.run.outcome import compare_outputs  # noqa: F401  (a model's outputs too)
from schedlang.store.db import Database
from schedlang.store.records import Record, op_key

NOTHING_USABLE = (
    "expected a function decorated with @schedlang.model returning a Relax IRModule (or "
    "(IRModule, inputs)), or a module-level Relax IRModule"
)
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


# --- model files ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelDefinition(Definition):
    """What `@schedlang.model` turns a function into; calling it calls the function."""


def model(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, reference: Reference = None
) -> Any:
    """Mark a function returning a Relax IRModule as a model: `@model` or `@model(reference=...)`.

    `reference` is a numpy implementation of `main`: it takes the input arrays and returns the
    output (or a tuple of them). Its keyword-only parameters named like shape parameters receive
    their values.
    """
    return decorate(ModelDefinition, fn, name, reference)


@dataclass(frozen=True, eq=False)  # numpy inputs have no single truth value
class Model:
    name: str
    mod: tvm.IRModule
    inputs: tuple[np.ndarray, ...]  # one per parameter of `main`
    path: str | None = None
    params: dict[str, ParamValue] = field(default_factory=dict, hash=False)
    reference: Callable[..., Any] | None = None
    reference_kind: str = "numpy"  # what the reference runs: numpy, PyTorch, onnxruntime

    def expected_outputs(self) -> list[np.ndarray] | None:
        """The reference's outputs on `inputs`; None without a reference."""
        if self.reference is None:
            return None
        result = self.reference(*(a.copy() for a in self.inputs))
        return [np.asarray(r) for r in (result if isinstance(result, tuple | list) else [result])]


def from_irmodule(
    mod: tvm.IRModule,
    name: str = "model",
    inputs: Sequence[np.ndarray] | None = None,
    reference: Callable[..., Any] | None = None,
) -> Model:
    """A Model for an IRModule built in Python (no file); random inputs unless given."""
    main = _main_function(mod, f"IRModule {name}")
    return Model(name, mod, _checked_inputs(main, inputs, name), reference=reference)


def load_model(
    path: str,
    defines: Mapping[str, str] | None = None,
    name: str | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> Model:
    """Run a model file and build its IRModule with `defines` applied to its shape parameters; an
    .onnx file is a model too (schedlang.models.frontends)."""
    if str(path).endswith(".onnx"):
        return _onnx_model(path, defines)
    with running(path, "model file", NOTHING_USABLE, timeout_s) as (namespace, filename):
        attr, candidate = _pick_model(namespace, path, name)
        if isinstance(candidate, ModelDefinition):
            return _call_model(candidate, attr, dict(defines or {}), filename, path)
        if defines:
            raise SchedlangError(
                f"{path}: `{attr}` is an IRModule and has no parameters to define",
                "use a function decorated with @schedlang.model for shape parameters",
            )
        where = f"`{attr}` in {path}"
        main = _main_function(candidate, where)
        return Model(attr, candidate, _checked_inputs(main, where=where), path)


def _call_model(
    definition: ModelDefinition, attr: str, defines: dict[str, str], filename: str, path: str
) -> Model:
    params = bind_params(definition, defines, path, "model")
    try:
        result = definition.fn(**params)
    except SchedlangError:
        raise
    except Exception as e:
        raise raised_by_file(e, f"model function `{attr}`", filename, path) from None
    where = f"model `{definition.name}` ({path})"
    imported = _imported(result, attr, path, where)
    reference = bind_reference(definition.reference, params)
    return Model(
        definition.name,
        imported.mod,
        _checked_inputs(_main_function(imported.mod, where), imported.inputs, where),
        path,
        params,
        reference or imported.reference,
        "numpy" if reference else imported.reference_kind,
    )


def _onnx_model(path: str, defines: Mapping[str, str] | None) -> Model:
    from schedlang.models import frontends

    if defines:
        raise SchedlangError(f"{path}: an ONNX model has no parameters to define")
    if not Path(path).is_file():
        raise SchedlangError(f"{path}: no such file")
    imported = frontends.from_onnx_file(path)
    where = f"ONNX model {path}"
    inputs = _checked_inputs(_main_function(imported.mod, where), None, where)
    name = Path(path).stem
    return Model(name, imported.mod, inputs, path, {}, imported.reference, imported.reference_kind)


def _pick_model(namespace: dict[str, Any], path: str, name: str | None) -> tuple[str, Any]:
    ops = [k for k, v in namespace.items() if isinstance(v, OpDefinition | tirx.PrimFunc)]
    hint = f"it defines the op {', '.join(ops)}: tune an op file with `schedlang tune`" * bool(ops)
    return pick_definition(
        namespace,
        path,
        name,
        ModelDefinition,
        lambda value: value if _is_relax_module(value) else None,
        "model",
        "",
        (NOTHING_USABLE, hint),
    )


def _is_relax_module(value: Any) -> bool:
    return isinstance(value, tvm.IRModule) and any(
        isinstance(f, relax.Function) for f in value.functions.values()
    )


def _imported(result: Any, attr: str, path: str, where: str):
    """What a model function returned, as Relax: an IRModule or (IRModule, inputs) as it is; a
    torch.nn.Module with its example inputs, or an ExportedProgram, through TVM's frontend."""
    from schedlang.models import frontends

    model, inputs = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    if frontends.is_torch_model(model):
        return frontends.from_torch(model, inputs, where)
    if not isinstance(model, tvm.IRModule):
        raise SchedlangError(
            f"model function `{attr}` in {path} returned {type(result).__name__}, "
            "expected a Relax IRModule, (IRModule, inputs), (torch.nn.Module, example_inputs) "
            "or a torch ExportedProgram",
            "build it with relax.BlockBuilder or TVMScript (@I.ir_module), or return a PyTorch "
            "module with its example inputs",
        )
    return frontends.Imported(model, inputs, None, "numpy")


def _main_function(mod: tvm.IRModule, where: str) -> relax.Function:
    functions = {gv.name_hint: f for gv, f in mod.functions.items()}
    main = functions.get("main")
    if not isinstance(main, relax.Function):
        relax_names = [n for n, f in functions.items() if isinstance(f, relax.Function)]
        raise SchedlangError(
            f"{where} has no Relax function `main`",
            one_of(relax_names, "Relax functions it has"),
        )
    return main


def _checked_inputs(
    main: relax.Function, inputs: Sequence[Any] | None = None, where: str = "model", seed: int = 0
) -> tuple[np.ndarray, ...]:
    """The inputs given, checked against `main`'s parameters; random ones when none are."""
    types = [(p.name, _tensor_type(p, where, given=inputs is not None)) for p in main.params]
    if inputs is None:
        rng = np.random.default_rng(seed)
        return tuple(_random_array(rng, shape, dtype) for _, (shape, dtype) in types)
    if not isinstance(inputs, Sequence) or len(inputs) != len(types):
        given = f"{len(inputs)} inputs" if isinstance(inputs, Sequence) else type(inputs).__name__
        raise SchedlangError(
            f"{where}: gave {given} for the {len(types)} parameters of `main`",
            f"parameters of main: {', '.join(n for n, _ in types)}",
        )
    checked = []
    for (param, expected), value in zip(types, inputs, strict=True):
        array = np.asarray(value)
        if expected is not None:
            shape, dtype = expected
            if array.shape != shape or array.dtype != numpy_dtype(dtype):
                raise SchedlangError(
                    f"{where}: input `{param}` is {array.dtype}{list(array.shape)}, "
                    f"`main` takes {dtype}{list(shape)}"
                )
        checked.append(array)
    return tuple(checked)


def _tensor_type(param: Any, where: str, given: bool) -> tuple[tuple[int, ...], str] | None:
    ty = param.ty
    shape = getattr(getattr(ty, "shape", None), "values", None)
    if isinstance(ty, relax.TensorType) and shape is not None:
        if all(isinstance(d, tirx.IntImm) for d in shape):
            return tuple(int(d) for d in shape), str(ty.dtype)
    if given:
        return None  # symbolic or not a tensor: whatever the model gives is taken as it is
    raise SchedlangError(
        f"{where}: parameter `{param.name}` of main is {ty}, not a tensor of static shape",
        "return (IRModule, inputs) from the model function to give its inputs",
    )


def _random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    np_dtype = numpy_dtype(dtype)
    if np.issubdtype(np_dtype, np.floating):
        return rng.uniform(-1.0, 1.0, shape).astype(np_dtype)
    if np_dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np_dtype)
    return rng.integers(0, 5, shape).astype(np_dtype)


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


# --- names ---------------------------------------------------------------------------------------


def rename_like(func: tirx.PrimFunc, names: Mapping[str, Sequence[str]]) -> tirx.PrimFunc:
    """`func` with the block, loop and buffer names of a structurally equal function whose
    `schedule_names` are `names`; raises SchedlangError when that cannot be done.

    The function goes through TVMScript: names are replaced as tokens (block names in
    `T.sblock("…")`, loop variables and buffers as identifiers), and the result must parse, be
    structurally equal to `func` and have exactly `names`. Names come from database records,
    which may come from anyone: only plain names go into the text that is parsed.
    """
    for kind in ("blocks", "loops", "buffers"):
        for name in names.get(kind, ()):
            if not _plain(name, dotted=kind == "blocks"):
                raise SchedlangError(f"the record names its {kind} oddly: {name!r}")
    text = func.script()
    ours = schedule_names(tvm.script.from_source(text))  # the names as printed
    identifiers: dict[str, str] = {}
    blocks: dict[str, str] = {}
    for kind, table in (("loops", identifiers), ("buffers", identifiers), ("blocks", blocks)):
        theirs = list(names.get(kind, ()))
        if len(theirs) != len(ours[kind]):
            raise SchedlangError(f"the functions have different {kind}")
        for old, new in zip(ours[kind], theirs, strict=True):
            if table.setdefault(old, new) != new:
                raise SchedlangError(f"`{old}` would need two names, `{table[old]}` and `{new}`")
    renamed_text = _replace_names(text, identifiers, blocks)
    try:
        renamed = tvm.script.from_source(renamed_text)
    except Exception as exc:
        raise SchedlangError(f"the renamed function does not parse: {error_line(exc)}") from None
    if not tvm_ffi.structural_equal(renamed, func) or schedule_names(renamed) != {
        kind: list(names.get(kind, ())) for kind in ("blocks", "loops", "buffers")
    }:
        raise SchedlangError("renaming changed the function")
    return renamed


def _plain(name: object, dotted: bool) -> bool:
    """An identifier (a block name may have dots: TVM names a cache block `A_shared.dyn`)."""
    pattern = r"[A-Za-z_][A-Za-z0-9_.]*" if dotted else r"[A-Za-z_][A-Za-z0-9_]*"
    return (
        isinstance(name, str) and bool(re.fullmatch(pattern, name)) and not keyword.iskeyword(name)
    )


def _replace_names(text: str, identifiers: dict[str, str], blocks: dict[str, str]) -> str:
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    kept: set[str] = set()  # identifiers left as they are
    depth = 0
    for index, token in enumerate(tokens):
        before = tokens[index - 1].string if index else ""
        after = tokens[index + 1].string if index + 1 < len(tokens) else ""
        if token.type == tokenize.OP:
            depth += token.string in "([{"
            depth -= token.string in ")]}"
        elif token.type == tokenize.NAME and before not in (".", "def"):
            is_keyword_argument = depth > 0 and after == "="
            if token.string in identifiers and not is_keyword_argument:
                edits.append((token.start, token.end, identifiers[token.string]))
            elif not is_keyword_argument:
                kept.add(token.string)
        elif token.type == tokenize.STRING and _is_block_name(tokens, index):
            name = token.string[1:-1]
            if name in blocks:
                edits.append((token.start, token.end, f'"{blocks[name]}"'))
    new_names = {new for old, new in identifiers.items() if old != new}
    clashes = sorted(new_names & (kept - set(identifiers)))
    if clashes:
        raise SchedlangError(
            f"`{clashes[0]}` cannot be given to the function: it names another thing"
        )
    lines = text.splitlines(keepends=True)
    for (row, col), (end_row, end_col), new in sorted(edits, reverse=True):
        assert row == end_row, "names are single-line tokens"
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[end_col:]
    return "".join(lines)


def _is_block_name(tokens: list[tokenize.TokenInfo], index: int) -> bool:
    """Whether the string at `index` is the name in `T.sblock("name")`."""
    return index >= 2 and tokens[index - 1].string == "(" and tokens[index - 2].string == "sblock"


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
    executable = _compile(mod, target, relax_pipeline(target, schedule, fuse, winograd))
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
    return _compile(mod, as_target(target), "default")


def _compile(mod: tvm.IRModule, target: Target, pipeline: Any) -> tvm.runtime.Executable:
    try:
        return tvm.compile(mod, target=target.to_tvm(), relax_pipeline=pipeline)
    except SchedlangError:
        raise
    except Exception as exc:
        raise SchedlangError(f"TVM could not build the model: {error_line(exc)}") from None


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
