"""Where `schedlang generate MODEL` finds a decoder: a checkpoint folder, or a model file.

A model file is Python, loaded as every model file is (schedlang.core.loader): a function
decorated with `@schedlang.model` returning a transformers causal LM (or `(model, inputs)`: the
inputs are ignored), its keyword parameters set with `-D NAME=VALUE`; or a module-level model.

`tune-model` and `build-model` take both kinds of model: `open_model` tells them apart by one
rule. A checkpoint folder, or a model function returning a transformers causal LM *alone* (an
object with a `config` and a `state_dict`, no example inputs), is a decoder (DecoderSource:
prefill and decode of any length, tuned at several lengths). A function returning anything else
— `(module, example_input_ids)` for torch.export at a fixed length, a Relax IRModule — and an
.onnx file go the fixed-shape way (schedlang.models.model_file), as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.loader import (
    DEFAULT_TIMEOUT_S,
    bind_params,
    call_user,
    pick_definition,
    running,
)
from schedlang.models.model_file import Model, ModelDefinition, Returned, open_model_file

USABLE = (
    "expected a function decorated with @schedlang.model returning a transformers causal LM "
    "(Qwen2ForCausalLM, LlamaForCausalLM), or such a model at module level"
)


def open_source(
    path: str,
    defines: Mapping[str, str] | None = None,
    name: str | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> Any:
    """A checkpoint folder as its path; a model file's causal LM, the file run to make it."""
    if Path(path).is_dir():
        if defines:
            raise SchedlangError(f"{path}: a checkpoint folder has no parameters to define")
        return Path(path)
    if not path.endswith(".py") and not Path(path).exists():
        raise SchedlangError(f"no such model file or checkpoint folder: {path}")
    with running(path, "model file", USABLE, timeout_s) as (namespace, filename):
        attr, candidate = pick_definition(
            namespace, path, name, ModelDefinition, _causal_lm, "model", "", (USABLE,)
        )
        if not isinstance(candidate, ModelDefinition):
            return candidate
        params = bind_params(candidate, dict(defines or {}), path, "model")
        result = call_user(candidate.fn, f"model function `{attr}`", filename, path)(**params)
    model = result[0] if isinstance(result, tuple) and len(result) == 2 else result
    if _causal_lm(model) is None:
        raise SchedlangError(
            f"model function `{attr}` in {path} returned {type(model).__name__}", USABLE
        )
    return model


def _causal_lm(value: Any) -> Any:
    """`value` when it looks like a transformers model (a config and a state_dict), else None."""
    is_model = hasattr(value, "config") and callable(getattr(value, "state_dict", None))
    return value if is_model and not isinstance(value, type) else None


@dataclass(frozen=True)
class DecoderSource:
    """A decoder named to tune-model or build-model: what `decoder.load` takes (a checkpoint
    folder's path or a transformers causal LM), with the model's name."""

    name: str
    source: Any


def is_decoder(value: Any) -> bool:
    """A model function's result that is a transformers causal LM alone (no example inputs)."""
    return not isinstance(value, tuple) and _causal_lm(value) is not None


def open_model(
    path: str,
    defines: Mapping[str, str] | None = None,
    name: str | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> Model | DecoderSource:
    """A decoder (a checkpoint folder, or a model function returning a causal LM alone), or
    the fixed-shape Model of any other model file (the module's docstring: the rule)."""
    if Path(path).is_dir():
        if defines:
            raise SchedlangError(f"{path}: a checkpoint folder has no parameters to define")
        return DecoderSource(Path(path).resolve().name, Path(path))
    loaded = open_model_file(path, defines, name, timeout_s, keep=is_decoder)
    if isinstance(loaded, Returned):
        return DecoderSource(loaded.name, loaded.value)
    return loaded
