"""Model files: `@schedlang.model`, `load_model`, and a model's inputs checked against `main`.

A model file is Python, like an op file (schedlang.core.ops): a function decorated with
`@schedlang.model`, whose keyword parameters are shape parameters (`-D batch=16`), returning a
Relax IRModule with a `main` function, or `(IRModule, inputs)` with one numpy array per parameter
of `main`, or a PyTorch module with its example inputs (and, for symbolic dimensions, the
`dynamic_shapes` torch.export takes: `(module, (ids,), {"input_ids": {1: Dim("n", max=512)}})`),
or an ExportedProgram (see schedlang.models.frontends); or a module-level IRModule. An .onnx
file is a model too. Model files are code and run with your privileges.

    model = load_model("examples/models/mlp.py", {"batch": "16"})
    model.mod, model.inputs, model.expected_outputs()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx

from schedlang.core import loader
from schedlang.core.diagnostics import SchedlangError, one_of
from schedlang.core.ops import OpDefinition, numpy_dtype

NOTHING_USABLE = (
    "expected a function decorated with @schedlang.model returning a Relax IRModule (or "
    "(IRModule, inputs)), or a module-level Relax IRModule"
)


@dataclass(frozen=True)
class ModelDefinition(loader.Definition):
    """A model file's function, marked by `@schedlang.model`."""


def model(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    reference: loader.Reference = None,
) -> Any:
    """Mark a function returning a Relax IRModule as a model: `@model` or `@model(reference=...)`.

    `reference` is a numpy implementation of `main`: it takes the input arrays and returns the
    output (or a tuple of them). Its keyword-only parameters named like shape parameters receive
    their values.
    """
    return loader.decorate(ModelDefinition, fn, name, reference)


@dataclass(frozen=True, eq=False)  # numpy inputs have no single truth value
class Model:
    name: str
    mod: tvm.IRModule
    inputs: tuple[np.ndarray, ...]  # one per parameter of `main`
    path: str | None = None
    params: dict[str, loader.ParamValue] = field(default_factory=dict, hash=False)
    reference: Callable[..., Any] | None = None
    reference_kind: str = "numpy"  # what the reference runs: numpy, PyTorch, onnxruntime

    def expected_outputs(
        self, inputs: Sequence[np.ndarray] | None = None
    ) -> list[np.ndarray] | None:
        """The reference's outputs on `inputs` (default: the model's); None without one."""
        if self.reference is None:
            return None
        result = self.reference(*(a.copy() for a in (self.inputs if inputs is None else inputs)))
        return [np.asarray(r) for r in (result if isinstance(result, tuple | list) else [result])]


def symbolic_lengths(mod: tvm.IRModule) -> dict[str, tuple[int, int | None]]:
    """The symbolic variables of `main`'s parameters' shapes (a prompt's length) by name, each
    with the values it takes: at least 1 (and its lower bound), at most its upper bound (None
    when unbounded), as torch.export recorded them (`tir_var_upper_bound`)."""
    main = next((f for g, f in mod.functions.items() if g.name_hint == "main"), None)
    if not isinstance(main, relax.Function):
        return {}  # no Relax `main`: nothing symbolic to measure (load_model says what is wrong)
    attrs = main.attrs if main.attrs is not None else {}
    lower = {str(k): int(v) for k, v in dict(attrs.get("tir_var_lower_bound", {})).items()}
    upper = {str(k): int(v) for k, v in dict(attrs.get("tir_var_upper_bound", {})).items()}
    return {
        var.name: (max(1, lower.get(var.name, 1)), upper.get(var.name))
        for var in relax.analysis.defined_symbolic_vars(main)
    }


def inputs_at(model: Model, values: Mapping[str, int], seed: int = 1) -> tuple[np.ndarray, ...]:
    """Inputs of `model` with its symbolic dimensions at `values`, drawn like its own: floats
    in their range, integers (token ids) among the values they hold."""
    rng = np.random.default_rng(seed)
    arrays = []
    for param, example in zip(
        _main_function(model.mod, model.name).params, model.inputs, strict=True
    ):
        dims = getattr(getattr(param.ty, "shape", None), "values", None) or []
        shape = tuple(values[d.name] if isinstance(d, tirx.Var) else int(d) for d in dims)
        if np.issubdtype(example.dtype, np.floating):
            drawn = rng.uniform(float(example.min()), float(example.max()), shape)
        else:
            drawn = rng.choice(example.reshape(-1), shape)
        arrays.append(np.asarray(drawn, example.dtype))
    return tuple(arrays)


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
    timeout_s: float | None = loader.DEFAULT_TIMEOUT_S,
) -> Model:
    """Run a model file and build its IRModule with `defines` applied to its shape parameters; an
    .onnx file is a model too (schedlang.models.frontends)."""
    loaded = open_model_file(path, defines, name, timeout_s)
    assert isinstance(loaded, Model)  # nothing is kept without `keep`
    return loaded


@dataclass(frozen=True)
class Returned:
    """What a model function returned that `open_model_file`'s `keep` took as it is."""

    name: str  # the model's name
    value: Any


def open_model_file(
    path: str,
    defines: Mapping[str, str] | None = None,
    name: str | None = None,
    timeout_s: float | None = loader.DEFAULT_TIMEOUT_S,
    keep: Callable[[Any], bool] | None = None,
) -> Model | Returned:
    """`load_model`, but a model function's result for which `keep` is true is returned as it
    is (Returned), not imported: the file runs once whichever it is (the decoder's rule in
    schedlang.models.decoder.sources)."""
    if str(path).endswith(".onnx"):
        return _onnx_model(path, defines)
    with loader.running(path, "model file", NOTHING_USABLE, timeout_s) as (namespace, filename):
        attr, candidate = _pick_model(namespace, path, name)
        if isinstance(candidate, ModelDefinition):
            return _call_model(candidate, attr, dict(defines or {}), filename, path, keep)
        if defines:
            raise SchedlangError(
                f"{path}: `{attr}` is an IRModule and has no parameters to define",
                "use a function decorated with @schedlang.model for shape parameters",
            )
        where = f"`{attr}` in {path}"
        main = _main_function(candidate, where)
        return Model(attr, candidate, _checked_inputs(main, where=where), path)


def _call_model(
    definition: ModelDefinition,
    attr: str,
    defines: dict[str, str],
    filename: str,
    path: str,
    keep: Callable[[Any], bool] | None = None,
) -> Model | Returned:
    params = loader.bind_params(definition, defines, path, "model")
    result = loader.call_user(definition.fn, f"model function `{attr}`", filename, path)(**params)
    if keep is not None and keep(result):
        return Returned(definition.name, result)
    where = f"model `{definition.name}` ({path})"
    imported = _imported(result, attr, path, where)
    reference = loader.bind_reference(definition.reference, params)
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
    return loader.pick_definition(
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

    dynamic_shapes = None
    if isinstance(result, tuple) and len(result) == 3 and frontends.is_torch_model(result[0]):
        result, dynamic_shapes = result[:2], result[2]
    model, inputs = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    if frontends.is_torch_model(model):
        return frontends.from_torch(model, inputs, where, dynamic_shapes)
    if not isinstance(model, tvm.IRModule):
        raise SchedlangError(
            f"model function `{attr}` in {path} returned {type(result).__name__}, "
            "expected a Relax IRModule, (IRModule, inputs), (torch.nn.Module, example_inputs), "
            "(torch.nn.Module, example_inputs, dynamic_shapes) or a torch ExportedProgram",
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
        # Every type is static here: _tensor_type raised for one that is not.
        static = [spec for _, spec in types if spec is not None]
        return tuple(_random_array(rng, shape, dtype) for shape, dtype in static)
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
    if (
        isinstance(ty, relax.TensorType)
        and shape is not None
        and all(isinstance(d, tirx.IntImm) for d in shape)
    ):
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
