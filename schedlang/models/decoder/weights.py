"""A decoder's weights, read once and laid out as the kernels want them.

    config, tensors = read_source(source)           # a model object, a state_dict, a folder
    check(config, tensors)                          # every tensor there, of its shape
    for name, array in laid_out(config, tensors):   # float32, fused, one at a time

Sources: a transformers causal LM (`Qwen2ForCausalLM`, `LlamaForCausalLM`, or any module with a
`config` and a `state_dict()`), a `(config, state_dict)` pair, or a checkpoint folder holding
config.json and *.safetensors (one file, or shards listed by model.safetensors.index.json). Each
tensor is mapped by its transformers name; a missing or damaged file, a missing tensor or one of
the wrong shape is one error line naming it.

Layouts: q, k and v's projections (and biases) are concatenated into one matrix, gate and up into
another, so a decode step runs one GEMV where transformers runs three and two. Each matrix of a
projection (and the LM head, and the embedding table where the LM head shares it) is then stored
as column panels: W [out, in] becomes [out / P, in, P] (P = `panel_width(out)`, 32 where it
divides), panel p holding outputs p * P to p * P + P - 1 side by side for every input. Both of
the kernels that read it stream it contiguously: decode's GEMV keeps the P outputs of a panel in
registers (two AVX-512 vectors of partial sums, one FMA per loaded vector, no horizontal sum),
and prefill's GEMM (`matmul_panels`) finds B already in the panels it would otherwise copy B
into at every call. Done here, once: the built library computes nothing of the kind per call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from schedlang.core.diagnostics import SchedlangError
from schedlang.models.decoder.config import DecoderConfig

Tensors = Mapping[str, Any]  # transformers name -> array-like (numpy array or torch tensor)
INDEX = "model.safetensors.index.json"


def read_source(source: Any) -> tuple[DecoderConfig, Tensors]:
    """The config and the tensors of a model object, a (config, state_dict) pair, or a folder."""
    if isinstance(source, str | Path):
        return read_folder(Path(source))
    if isinstance(source, tuple) and len(source) == 2:
        config, state = source
        return DecoderConfig.from_hf(_config_dict(config)), state
    config = getattr(source, "config", None)
    if config is None or not callable(getattr(source, "state_dict", None)):
        raise SchedlangError(
            f"cannot build a decoder from {type(source).__name__}: give a transformers causal "
            "LM, a (config, state_dict) pair or a checkpoint folder"
        )
    architecture = type(source).__name__
    return DecoderConfig.from_hf(_config_dict(config), architecture), source.state_dict()


def _config_dict(config: Any) -> dict[str, Any]:
    return dict(config) if isinstance(config, Mapping) else config.to_dict()


def read_folder(folder: Path) -> tuple[DecoderConfig, Tensors]:
    """config.json and the safetensors files of a checkpoint folder."""
    if not folder.is_dir():
        raise SchedlangError(f"checkpoint folder not found: {folder}")
    config_file = folder / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SchedlangError(f"{folder}: no config.json: not a checkpoint folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchedlangError(f"{config_file}: damaged: {exc}") from None
    if not isinstance(config, dict):
        raise SchedlangError(f"{config_file}: damaged: expected a JSON object")
    decoder = DecoderConfig.from_hf(config)
    return decoder, _FileTensors(_weight_files(folder))


def _weight_files(folder: Path) -> list[Path]:
    index = folder / INDEX
    if index.is_file():
        try:
            names = sorted(
                set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise SchedlangError(f"{index}: damaged: {exc}") from None
        missing = [name for name in names if not (folder / name).is_file()]
        if missing:
            raise SchedlangError(
                f"{folder}: weight file {missing[0]} is missing ({INDEX} lists it)"
            )
        return [folder / name for name in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SchedlangError(f"{folder}: no *.safetensors file: the weights are missing")
    return files


class _FileTensors(Mapping[str, np.ndarray]):
    """The tensors of safetensors files, each read when it is asked for: a checkpoint's shapes
    and names come from the files' headers, so a 7 GB model is never in memory twice (the whole
    checkpoint read, then copied to the device) and a caller that wants the config reads none."""

    def __init__(self, files: list[Path]) -> None:
        self._file: dict[str, Path] = {}
        self._shape: dict[str, tuple[int, ...]] = {}
        for file in files:
            with _opened(file) as handle:
                for name in handle.keys():  # noqa: SIM118 (a safetensors handle)
                    self._file[name] = file
                    self._shape[name] = tuple(handle.get_slice(name).get_shape())

    def __getitem__(self, name: str) -> np.ndarray:
        return _read_tensor(self._file[name], name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file)

    def __len__(self) -> int:
        return len(self._file)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shape[name]


def _opened(file: Path, framework: str = "numpy") -> Any:
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(file), framework=framework)
    except SafetensorError as exc:
        raise SchedlangError(f"{file}: damaged safetensors file: {exc}") from None
    except OSError as exc:
        raise SchedlangError(f"{file}: cannot read: {exc}") from None


def _read_tensor(file: Path, name: str) -> np.ndarray:
    from safetensors import SafetensorError

    try:
        with _opened(file) as handle:
            return handle.get_tensor(name)
    except SafetensorError as exc:
        raise SchedlangError(f"{file}: damaged safetensors file: {exc}") from None
    except TypeError as exc:  # numpy has no bfloat16: read through torch, which has it
        if "bfloat16" not in str(exc) and "bf16" not in str(exc).lower():
            raise SchedlangError(f"{file}: cannot read `{name}`: {exc}") from None
    with _opened(file, "pt") as handle:
        return handle.get_tensor(name).float().numpy()


Plan = list[tuple[str, list[tuple[str, tuple[int, ...]]]]]


def plan(config: DecoderConfig) -> Plan:
    """Each parameter of the network (network.DecoderNetwork) with the transformers tensors it
    is made of, concatenated in order, and the shape each must have."""
    hidden, inner = config.hidden_size, config.intermediate_size
    q_rows = config.num_heads * config.head_dim
    kv_rows = config.num_kv_heads * config.head_dim
    parts: Plan = [("embed", [("model.embed_tokens.weight", (config.vocab_size, hidden))])]
    for i in range(config.num_layers):
        hf, ours = f"model.layers.{i}", f"layers.{i}"
        attn = f"{hf}.self_attn"
        projections = [("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)]
        parts += [
            (f"{ours}.input_norm", [(f"{hf}.input_layernorm.weight", (hidden,))]),
            (
                f"{ours}.attn.qkv",
                [(f"{attn}.{p}.weight", (rows, hidden)) for p, rows in projections],
            ),
        ]
        if config.qkv_bias:
            parts.append(
                (
                    f"{ours}.attn.qkv_bias",
                    [(f"{attn}.{p}.bias", (rows,)) for p, rows in projections],
                )
            )
        parts.append((f"{ours}.attn.o", [(f"{attn}.o_proj.weight", (hidden, q_rows))]))
        if config.o_bias:
            parts.append((f"{ours}.attn.o_bias", [(f"{attn}.o_proj.bias", (hidden,))]))
        parts += [
            (f"{ours}.post_norm", [(f"{hf}.post_attention_layernorm.weight", (hidden,))]),
            (
                f"{ours}.mlp.gate_up",
                [(f"{hf}.mlp.{p}_proj.weight", (inner, hidden)) for p in ("gate", "up")],
            ),
            (f"{ours}.mlp.down", [(f"{hf}.mlp.down_proj.weight", (hidden, inner))]),
        ]
    parts.append(("norm", [("model.norm.weight", (hidden,))]))
    if not config.tie_word_embeddings:
        parts.append(("lm_head", [("lm_head.weight", (config.vocab_size, hidden))]))
    return parts


def check(config: DecoderConfig, tensors: Tensors) -> None:
    """Every tensor the network needs is there, of the config's shape: before a build, so a
    damaged checkpoint costs no build."""
    for _, sources in plan(config):
        for name, shape in sources:
            if name not in tensors:
                raise SchedlangError(f"the weights lack `{name}`")
            found = _shape(tensors, name)
            if found != shape:
                raise SchedlangError(
                    f"weight `{name}` has shape {list(found)}, the config says {list(shape)}"
                )


def _shape(tensors: Tensors, name: str) -> tuple[int, ...]:
    if isinstance(tensors, _FileTensors):
        return tensors.shape(name)  # from the file's header: nothing read
    return tuple(tensors[name].shape)


def laid_out(config: DecoderConfig, tensors: Tensors) -> Iterator[tuple[str, np.ndarray]]:
    """(parameter name, float32 array) for each parameter, one at a time: a caller that moves
    each to the device before taking the next holds one fused copy at most. The matrices of
    `paneled(config)` come as panels (`as_panels`)."""
    stored_as_panels = paneled(config)
    for name, sources in plan(config):
        arrays = [_as_float32(tensors[hf_name]) for hf_name, _ in sources]
        array = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        yield name, as_panels(array) if name in stored_as_panels else array


PANEL = 32  # outputs per panel: two AVX-512 vectors of float32 (four of AVX2)


def panel_width(rows: int) -> int:
    """The panel width of a matrix of `rows` outputs: PANEL, or the largest power of two below
    it that divides `rows` (a small test config's odd sizes)."""
    width = PANEL
    while rows % width:
        width //= 2
    return width


def panel_shape(rows: int, columns: int) -> tuple[int, int, int]:
    """The shape of a [rows, columns] matrix stored as panels."""
    width = panel_width(rows)
    return (rows // width, columns, width)


def as_panels(matrix: np.ndarray) -> np.ndarray:
    """[out, in] as [out / P, in, P]: element [j // P, k, j % P] is matrix[j, k]."""
    rows, columns = matrix.shape
    width = panel_width(rows)
    return np.ascontiguousarray(matrix.reshape(rows // width, width, columns).transpose(0, 2, 1))


def paneled(config: DecoderConfig) -> set[str]:
    """The parameters stored as panels: every projection's matrix, the LM head, and the
    embedding table where the LM head is the table (tied: the gather reads a token's row with
    a stride of P, a few thousand values per token)."""
    names = {"lm_head" if not config.tie_word_embeddings else "embed"}
    parts = ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down")
    for i in range(config.num_layers):
        names |= {f"layers.{i}.{part}" for part in parts}
    return names


def _as_float32(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor (bfloat16 and half included)
        value = value.detach().float().cpu().numpy()
    return np.ascontiguousarray(value, dtype=np.float32)
