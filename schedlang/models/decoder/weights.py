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
import math
import os
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from io import BufferedReader
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
    checkpoint read, then copied to the device) and a caller that wants the config reads none.

    Each file is opened once (its header read then) and read through that handle, one tensor
    at a time into an array of its own: no memory map, whose pages would stay resident as a
    load touches them (the whole checkpoint by its end). The handles close with the mapping,
    or when `laid_out` is done."""

    def __init__(self, files: list[Path]) -> None:
        self._file: dict[str, Path] = {}
        self._entry: dict[str, _Entry] = {}
        self._handles: dict[Path, BufferedReader] = {}
        weakref.finalize(self, _close_all, self._handles)
        for file in files:
            handle = self._handle(file)
            for name, entry in _read_header(file, handle).items():
                self._file[name], self._entry[name] = file, entry

    def __getitem__(self, name: str) -> np.ndarray:
        file = self._file[name]
        return _read_tensor(file, self._handle(file), name, self._entry[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._file)

    def __len__(self) -> int:
        return len(self._file)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry[name].shape

    def close(self) -> None:
        """Each file's handle closed (a later read opens it again)."""
        _close_all(self._handles)

    def _handle(self, file: Path) -> BufferedReader:
        if file not in self._handles:
            try:
                self._handles[file] = open(file, "rb")  # noqa: SIM115 (kept for the load)
            except OSError as exc:
                raise SchedlangError(f"{file}: cannot read: {exc}") from None
        return self._handles[file]


def _close_all(handles: dict[Path, BufferedReader]) -> None:
    for handle in handles.values():
        handle.close()
    handles.clear()


@dataclass(frozen=True)
class _Entry:
    """Where one tensor lies in its file (from the file's start) and what it holds."""

    dtype: str  # safetensors' name: F32, BF16, ...
    shape: tuple[int, ...]
    start: int
    end: int


# safetensors' dtypes as numpy reads them (little-endian); BF16 is read as its 16 bits.
_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
    "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
}  # fmt: skip


def _read_header(file: Path, handle: BufferedReader) -> dict[str, _Entry]:
    """The tensors a safetensors file holds: an 8-byte little-endian header size, a JSON
    header of each tensor's dtype, shape and [begin, end) bytes after it, then the data."""

    def damaged(why: str) -> SchedlangError:
        return SchedlangError(f"{file}: damaged safetensors file: {why}")

    size = os.fstat(handle.fileno()).st_size
    handle.seek(0)
    prefix = handle.read(8)
    if len(prefix) < 8:
        raise damaged(f"{size} bytes, shorter than a header")
    length = int.from_bytes(prefix, "little")
    if 8 + length > size:
        raise damaged(f"a header of {length} bytes in a file of {size}")
    try:
        header = json.loads(handle.read(length))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged(f"its header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise damaged("its header is not a JSON object")
    entries: dict[str, _Entry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = str(info["dtype"]), tuple(int(d) for d in info["shape"])
            begin, end = (8 + length + int(offset) for offset in info["data_offsets"])
        except (TypeError, KeyError, ValueError) as exc:
            raise damaged(f"`{name}`'s entry: {exc!r}") from None
        if dtype not in _DTYPES:
            raise SchedlangError(f"{file}: cannot read `{name}`: dtype {dtype}")
        expected = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
        if end - begin != expected or not 8 + length <= begin <= end <= size:
            raise damaged(f"`{name}` at bytes [{begin}, {end}) of {size}, {expected} expected")
        entries[name] = _Entry(dtype, shape, begin, end)
    return entries


def _read_tensor(file: Path, handle: BufferedReader, name: str, entry: _Entry) -> np.ndarray:
    """One tensor read into an array of its own (bfloat16 widened to float32: numpy has no
    bfloat16)."""
    array = np.empty(entry.shape, _DTYPES[entry.dtype])
    handle.seek(entry.start)
    try:
        read = handle.readinto(array.reshape(-1).view(np.uint8).data)
    except OSError as exc:
        raise SchedlangError(f"{file}: cannot read `{name}`: {exc}") from None
    if read != entry.end - entry.start:
        raise SchedlangError(f"{file}: damaged safetensors file: `{name}` is cut short")
    if entry.dtype == "BF16":  # the upper half of a float32's bits
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array


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
    try:
        for name, sources in plan(config):
            arrays = [_as_float32(tensors[hf_name]) for hf_name, _ in sources]
            array = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            yield name, as_panels(array) if name in stored_as_panels else array
    finally:  # the files read once each, through one handle each: closed now
        if isinstance(tensors, _FileTensors):
            tensors.close()


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
