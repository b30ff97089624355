"""Models from the frameworks people already run them in: a PyTorch module and an ONNX file become
a Relax IRModule through TVM's own frontends, with their inputs and their reference.

    (torch.nn.Module, example_inputs)  ─ torch.export ─► ExportedProgram
                                        ─ relax.frontend.torch.from_exported_program ─► IRModule
    model.onnx                          ─ relax.frontend.onnx.from_onnx ─► IRModule

Weights are bound into the module as constants (`keep_params_as_input=False`): TVM's inference
passes fold them (batch norm into convolutions, constant subexpressions), and the built model takes
the inputs alone. The reference is the framework itself — the module under `torch.no_grad()`, or
onnxruntime where installed — so every build is checked against what the user runs today.

A model `torch.export` cannot trace, or an operator TVM's frontend does not convert, is one
SchedlangError naming it and what to try, never a traceback. torch and onnx are imported only
here, and only for a model that needs them.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schedlang.core.diagnostics import SchedlangError, error_line


@dataclass(frozen=True, eq=False)
class Imported:
    """A framework's model as Relax: the module, its inputs, the framework as its reference."""

    mod: Any  # tvm.IRModule
    inputs: tuple[np.ndarray, ...] | None
    reference: Callable[..., Any] | None
    reference_kind: str  # what the reference runs: "PyTorch", "onnxruntime"


def is_torch_model(value: Any) -> bool:
    """A torch.nn.Module or an ExportedProgram (torch is not imported to tell)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return isinstance(value, torch.nn.Module | torch.export.ExportedProgram)


def from_torch(
    model: Any, example_inputs: Sequence[Any] | None, where: str, dynamic_shapes: Any = None
) -> Imported:
    """`model` (a torch.nn.Module or an ExportedProgram) as Relax, `example_inputs` (tensors or
    arrays) its inputs; a module is exported in eval mode, without gradients, with
    `dynamic_shapes` (torch.export's argument: `torch.export.Dim`s) for symbolic dimensions."""
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        if dynamic_shapes is not None:
            raise SchedlangError(
                f"{where}: an ExportedProgram was exported already: its dynamic shapes are its own",
                "return (program, example_inputs), or the module with its dynamic_shapes",
            )
        program, module = model, model.module()
        example = _example_of(program, example_inputs, where)
        keywords = _keyword_inputs(program)
    else:
        if example_inputs is None:
            raise SchedlangError(
                f"{where} returned a torch.nn.Module without example inputs",
                "return (module, (input_tensor, ...)): torch.export traces it on them",
            )
        module = model.eval()
        example = tuple(_as_tensor(x, where) for x in _as_sequence(example_inputs))
        program = _export(module, example, where, dynamic_shapes)
        keywords = ()
    mod = _convert(program, where)
    inputs = tuple(t.detach().cpu().numpy() for t in example)
    return Imported(mod, inputs, TorchReference(module, keywords), "PyTorch")


def _as_sequence(inputs: Any) -> Sequence[Any]:
    return inputs if isinstance(inputs, tuple | list) else (inputs,)


def _as_tensor(value: Any, where: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    raise SchedlangError(
        f"{where}: an example input is a {type(value).__name__}, expected a tensor or an array"
    )


def _example_of(program: Any, given: Sequence[Any] | None, where: str) -> tuple[Any, ...]:
    """An ExportedProgram's inputs: those given, else the example it was exported with."""
    if given is not None:
        return tuple(_as_tensor(x, where) for x in _as_sequence(given))
    args, kwargs = program.example_inputs or ((), dict[str, Any]())
    if kwargs and not args:  # exported with keywords only (transformers' executorch modules)
        return tuple(kwargs[name] for name in _keyword_inputs(program))
    if kwargs or not args:
        raise SchedlangError(
            f"{where}: the ExportedProgram keeps no positional example inputs",
            "return (program, (input_tensor, ...))",
        )
    return tuple(args)


def _export(module: Any, example: tuple[Any, ...], where: str, dynamic_shapes: Any) -> Any:
    import torch

    try:
        with torch.no_grad(), quiet():
            return torch.export.export(module, example, dynamic_shapes=dynamic_shapes)
    except Exception as e:  # torch.export raises many kinds: each is the model's, not ours
        raise SchedlangError(
            f"torch.export cannot trace {where}: {first_line(e)}",
            "make the forward traceable (no data-dependent Python control flow on tensor "
            "values; dynamic_shapes keyed by the forward's parameter names), or export it "
            "yourself and return the ExportedProgram",
        ) from None


UNSUPPORTED = re.compile(r"Unsupported function types?\s*:?\s*\[([^\]\n]*)\]")


def _aten_names(listed: str) -> str:
    """`['erfinv.default', '_fft_r2c.default']` → `aten.erfinv`, `aten._fft_r2c`."""
    names = [name.split(".")[0] for name in re.findall(r"'([^']+)'", listed)] or [listed]
    return ", ".join(f"`aten.{name}`" for name in names)


def _convert(program: Any, where: str) -> Any:
    from tvm.relax.frontend.torch import from_exported_program

    from schedlang.models.aten import CONVERTERS

    try:
        with quiet():
            return from_exported_program(
                program, keep_params_as_input=False, custom_convert_map=dict(CONVERTERS)
            )
    except Exception as e:  # the frontend's own assertion or error: one line for the user
        found = UNSUPPORTED.search(str(e))
        if found:
            raise SchedlangError(
                f"TVM's PyTorch frontend does not convert {_aten_names(found.group(1))} in {where}",
                "write that part with operators TVM converts, or export the model to ONNX "
                "(torch.onnx.export) and load the .onnx file",
            ) from None
        raise SchedlangError(
            f"TVM's PyTorch frontend failed on {where}: {error_line(e)}",
            "export the model to ONNX (torch.onnx.export) and load the .onnx file",
        ) from None


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """What torch logs, warns and prints while exporting (its deprecations, the graph it gave up
    on) is not the user's to act on: the error, if any, says what is."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logging.disable(previous)


def _keyword_inputs(program: Any) -> tuple[str, ...]:
    """The names of an ExportedProgram's inputs when it was exported with keywords only (its
    module then takes keywords only), in the order of `main`'s parameters; () otherwise."""
    args, kwargs = program.example_inputs or ((), dict[str, Any]())
    return tuple(kwargs) if kwargs and not args else ()


@dataclass(frozen=True, eq=False)
class TorchReference:
    """The module under `torch.no_grad()` on numpy arrays; `module` is kept so `--compare` can
    time it as PyTorch runs it (eager, torch.compile, exported to onnxruntime)."""

    module: Any  # torch.nn.Module, in eval mode
    keywords: tuple[str, ...] = ()  # the inputs' names, for a module that takes keywords only

    def __call__(self, *arrays: np.ndarray) -> Any:
        import torch

        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        with torch.no_grad():
            if self.keywords:
                result = self.module(**dict(zip(self.keywords, tensors, strict=True)))
            else:
                result = self.module(*tensors)
        if isinstance(result, tuple | list):
            return tuple(r.detach().cpu().numpy() for r in result)
        return result.detach().cpu().numpy()


def from_onnx_file(path: str | Path) -> Imported:
    """An .onnx file as Relax; onnxruntime (where installed) is its reference."""
    try:
        import onnx
    except ImportError:
        raise SchedlangError(
            f"{path}: an ONNX model needs the onnx package, which is not installed",
            "pip install onnx onnxruntime",
        ) from None
    from tvm.relax.frontend.onnx import from_onnx

    try:
        graph = onnx.load(str(path))
    except Exception as e:
        raise SchedlangError(f"{path}: not an ONNX model ({error_line(e)})") from None
    try:
        mod = from_onnx(graph, keep_params_in_input=False)
    except Exception as e:
        raise SchedlangError(
            f"TVM's ONNX frontend cannot convert {path}: {error_line(e)}",
            "check the operator and opset the message names (opset 13–18 convert best)",
        ) from None
    return Imported(mod, None, _onnxruntime_reference(path), "onnxruntime")


def _onnxruntime_reference(path: str | Path) -> Callable[..., Any] | None:
    try:
        import onnxruntime
    except ImportError:
        return None

    @functools.cache
    def session() -> Any:  # made once, on the first call: --compare times the runs, not this
        return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def reference(*arrays: np.ndarray) -> Any:
        names = [i.name for i in session().get_inputs()]
        outputs = session().run(None, dict(zip(names, arrays, strict=True)))
        return tuple(outputs) if len(outputs) > 1 else outputs[0]

    return reference


def first_line(error: BaseException) -> str:
    """torch says what went wrong first, then where: its first line, with its type."""
    return error_line(error, first=True, with_type=True)
