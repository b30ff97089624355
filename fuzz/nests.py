"""Random loop nests for fuzzing the front end, and the decisions every generator draws through.

Every generator here and in fuzz/schedules.py, fuzz/mutate.py draws each decision through a
`Chooser`. The hypothesis tests (tests/strategies.py) wrap `draw`, so a failure shrinks to a small
nest and a short schedule; the harnesses (fuzz/fuzz_check.py) read the decisions from the fuzzer's
bytes with `ByteChooser`, so a byte string always replays to the same case, with or without atheris.

`random_nest` makes an op of 1-4 spatial axes and 0-2 reduction axes (extents from `EXTENTS`, odd
and prime ones among them, or small random ones; the iteration space bounded by `MAX_POINTS` so
that it builds and runs in milliseconds): elementwise, a sum or max reduction, a matmul-like
contraction, a dense layer (a contraction, then bias and relu epilogue blocks), or a window
reduction over a padding block (`pad[...] = A[... - p]` inside the border, 0 outside: a pooling or
convolution's shape). Optionally a producer stage before the main block (for compute_at,
compute_inline), a consumer stage after it (for reverse_compute_at, reverse_compute_inline), and
epilogue blocks. `build_nest` makes its PrimFunc with `te` and the numpy reference it is verified
against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Protocol, TypeVar

import numpy as np

T = TypeVar("T")

# Tiny, odd and prime extents (non-divisible splits: the guards TVM adds) and powers of two.
EXTENTS = (1, 2, 3, 5, 7, 11, 13, 16, 17, 31, 33, 45, 64, 67, 97, 128, 997, 1000, 1024, 4096)
MAX_POINTS = 1 << 16  # spatial x reduction iterations of the main block
MAX_FLOAT_REDUCTION = 1024  # longer fp32 sums differ from the reference by more than its tolerance


class Chooser(Protocol):
    def integer(self, low: int, high: int) -> int:
        """A number from low to high inclusive; `low` is the simplest (what a shrinker goes to)."""
        ...

    def choice(self, options: Sequence[T]) -> T:
        """One of `options`; the first is the simplest."""
        ...

    def boolean(self) -> bool: ...


class ByteChooser:
    """Decisions read from a byte string, as libFuzzer's FuzzedDataProvider reads them; once the
    bytes run out every decision is the simplest one, so any input is a complete case."""

    def __init__(self, data: bytes):
        self.data = data
        self.position = 0

    def integer(self, low: int, high: int) -> int:
        span = high - low
        if span <= 0:
            return low
        value, width = 0, 0
        while span >> width and self.position < len(self.data):
            value = (value << 8) | self.data[self.position]
            self.position += 1
            width += 8
        return low + value % (span + 1)

    def choice(self, options: Sequence[T]) -> T:
        return options[self.integer(0, len(options) - 1)]

    def boolean(self) -> bool:
        return bool(self.integer(0, 1))

    def rest(self) -> bytes:
        """The bytes no decision has used."""
        return self.data[self.position :]


def weighted(chooser: Chooser, table: Sequence[tuple[int, T]]) -> T:
    return chooser.choice([item for weight, item in table for _ in range(weight)])


# --- loop nests ----------------------------------------------------------------------------------

# Axis names: plain, keywords of the language (reserved only where a keyword may come), and names
# that a fuse or a split of another axis would make.
SPATIAL_NAMES = (
    ("i", "j", "l", "m"),
    ("x", "y", "z", "w"),
    ("at", "by", "x", "i_j"),
    ("i", "j", "i_j", "ax0"),
)
REDUCE_NAMES = (("k", "r"), ("rk", "k0"), ("in", "as"))
# Block names: the main block, a producer before it, a consumer after it. Some are the names TVM
# gives a cache block or an rfactor block.
MAIN_NAMES = ("C", "out", "A_global", "C_rf")
PRODUCER_NAMES = ("P", "pre", "B_local")
CONSUMER_NAMES = ("D", "post", "C_shared")
# Epilogue blocks (bias add, then relu; or relu alone) and padding blocks.
EPILOGUE_NAMES = (("T_add", "T_relu"), ("D", "E"), ("bias", "relu"))
PAD_NAMES = ("pad", "A_pad", "P")
KINDS = ("matmul", "elementwise", "reduce", "dense", "window")


@dataclass(frozen=True)
class NestSpec:
    kind: str  # one of KINDS ("dense" is a matmul; its epilogue makes it one)
    spatial: tuple[tuple[str, int], ...]
    reduce: tuple[tuple[str, int], ...]
    reducer: str  # "sum" or "max"
    dtype: str
    main: str
    # P = A * 2 + 1, read by the main block instead of A; for "window", the padding block.
    producer: str | None = None
    consumer: str | None = None  # D = main + 1
    pad: int = 0  # "window": the border the padding block adds on each side of a windowed axis
    # (bias add, relu) blocks after the main one, reading an input `Bias` of the last axis's
    # extent; or (relu,) alone
    epilogue: tuple[str, ...] = ()


def random_nest(chooser: Chooser) -> NestSpec:
    kind = chooser.choice(KINDS)
    spatial_names = chooser.choice(SPATIAL_NAMES)
    reduce_names = chooser.choice(REDUCE_NAMES)
    rank = chooser.integer(1, 4) if kind != "dense" else chooser.integer(2, 3)
    if kind == "window":
        reductions = min(rank, chooser.integer(1, 2))
    else:
        reductions = 0 if kind == "elementwise" else chooser.integer(1, 2)
    extents = [_extent(chooser) for _ in range(rank)]
    if kind == "window":  # window sizes
        extents += [chooser.choice([3, 1, 2, 5]) for _ in range(reductions)]
    else:
        extents += [_extent(chooser) for _ in range(reductions)]
    while math.prod(extents) > MAX_POINTS:  # shrink the largest until the nest is small
        largest = extents.index(max(extents))
        extents[largest] = chooser.choice([1, 2, 3, 7, 16, 64, 97])
    spatial = tuple(zip(spatial_names, extents[:rank], strict=False))
    reduce = tuple(zip(reduce_names, extents[rank:], strict=False))
    dtype = chooser.choice(["float32", "int32"])
    if dtype == "float32" and math.prod(extents[rank:]) > MAX_FLOAT_REDUCTION:
        dtype = "int32"
    main = chooser.choice(MAIN_NAMES)
    pad = 0
    if kind == "window":
        producer = chooser.choice(PAD_NAMES)
        # The input keeps at least one element along each windowed axis.
        windowed = zip(extents[rank - reductions : rank], extents[rank:], strict=True)
        smallest = min(e + r - 1 for e, r in windowed)
        pad = min(chooser.choice([1, 0, 2]), (smallest - 1) // 2)
    else:
        producer = chooser.choice([None, *PRODUCER_NAMES])
    epilogue: tuple[str, ...] = ()
    if kind == "dense" or chooser.integer(0, 5) == 0:
        names = chooser.choice(EPILOGUE_NAMES)
        epilogue = names if kind == "dense" or chooser.boolean() else names[1:]
    consumer = None if epilogue else chooser.choice([None, *CONSUMER_NAMES])
    return NestSpec(
        kind,
        spatial,
        reduce,
        reducer="max" if kind in ("reduce", "window") and chooser.boolean() else "sum",
        dtype=dtype,
        main=main,
        producer=producer,
        consumer=consumer,
        pad=pad,
        epilogue=epilogue,
    )


def _extent(chooser: Chooser) -> int:
    if chooser.boolean():
        return chooser.choice(EXTENTS)
    return chooser.integer(1, 20)


@dataclass(frozen=True)
class Nest:
    func: object  # tirx.PrimFunc
    reference: Callable[..., np.ndarray]
    buffers: dict[str, tuple[int, ...]]  # every buffer, by name
    reads: dict[str, tuple[str, ...]]  # block → the buffers it reads


@cache
def build_nest(spec: NestSpec) -> Nest:  # noqa: C901 - each kind twice: its TE and its numpy
    """The PrimFunc (made with `te`) and its numpy reference."""
    from tvm import te

    dtype = spec.dtype
    spatial = [e for _, e in spec.spatial]
    reduce = [e for _, e in spec.reduce]
    rank, windows = len(spatial), len(reduce)
    if spec.kind == "elementwise":
        a_shape, b_shape = tuple(spatial), (spatial[-1],)
    elif spec.kind == "reduce":
        a_shape, b_shape = tuple(spatial + reduce), None
    elif spec.kind == "window":
        padded_shape = tuple(spatial[: rank - windows]) + tuple(
            e + r - 1 for e, r in zip(spatial[rank - windows :], reduce, strict=True)
        )
        a_shape = padded_shape[: rank - windows] + tuple(
            e - 2 * spec.pad for e in padded_shape[rank - windows :]
        )
        b_shape = None
    else:
        a_shape, b_shape = tuple(spatial[:-1] + reduce), tuple(reduce + spatial[-1:])
    a = te.placeholder(a_shape, dtype, name="A")
    b = te.placeholder(b_shape, dtype, name="B") if b_shape else None
    two, one, three, zero = (_const(v, dtype) for v in (2, 1, 3, 0))
    source = a
    if spec.kind == "window":
        source = _compute(
            padded_shape,
            producer_axis_names(rank, spec),
            spec.producer,
            lambda idx: _padded(a, idx, rank - windows, spec.pad, zero),
        )
    elif spec.producer:
        source = _compute(
            a_shape,
            producer_axis_names(len(a_shape), spec),
            spec.producer,
            lambda idx: a[idx] * two + one,
        )
    names = [n for n, _ in spec.spatial]
    axes = [te.reduce_axis((0, e), name=n) for n, e in spec.reduce]
    combine = te.max if spec.reducer == "max" else te.sum
    if spec.kind == "elementwise":
        main = _compute(spatial, names, spec.main, lambda s: source[s] * three + b[s[-1]])
    elif spec.kind == "reduce":
        main = _compute(
            spatial, names, spec.main, lambda s: combine(source[(*s, *axes)], axis=axes)
        )
    elif spec.kind == "window":
        main = _compute(
            spatial,
            names,
            spec.main,
            lambda s: combine(
                source[(*s[: rank - windows],
                        *(x + r for x, r in zip(s[rank - windows :], axes, strict=True)))],
                axis=axes,
            ),
        )  # fmt: skip
    else:
        main = _compute(
            spatial,
            names,
            spec.main,
            lambda s: te.sum(
                source[(*s[: rank - 1], *axes)] * b[(*axes, *s[rank - 1 :])], axis=axes
            ),
        )
    output = main
    if spec.consumer:
        consumer_names = [f"{n}2" for n in names]
        output = _compute(spatial, consumer_names, spec.consumer, lambda s: main[s] + one)
    bias = None
    reads = {}
    if len(spec.epilogue) == 2:
        bias = te.placeholder((spatial[-1],), dtype, name="Bias")
        added = output
        output = _compute(spatial, [f"{n}2" for n in names], spec.epilogue[0],
                          lambda s: added[s] + bias[s[-1]])  # fmt: skip
        reads[spec.epilogue[0]] = (added.op.name, "Bias")
    if spec.epilogue:
        relu_input = output
        output = _compute(spatial, [f"{n}{len(spec.epilogue) + 1}" for n in names],
                          spec.epilogue[-1], lambda s: te.max(relu_input[s], zero))  # fmt: skip
        reads[spec.epilogue[-1]] = (relu_input.op.name,)
    inputs = [x for x in (a, b, bias) if x is not None]
    func = te.create_prim_func([*inputs, output])

    def reference(*arrays: np.ndarray) -> np.ndarray:
        values = [x.astype(np.float64 if dtype == "float32" else np.int64) for x in arrays]
        x = values[0]
        if spec.kind == "window":
            x = np.pad(x, [(0, 0)] * (rank - windows) + [(spec.pad, spec.pad)] * windows)
        elif spec.producer:
            x = x * 2 + 1
        if spec.kind == "elementwise":
            y = x * 3 + values[1]
        elif spec.kind == "reduce":
            tail = tuple(range(rank, rank + len(reduce)))
            y = x.max(axis=tail) if spec.reducer == "max" else x.sum(axis=tail)
        elif spec.kind == "window":
            axes_ = tuple(range(rank - windows, rank))
            view = np.lib.stride_tricks.sliding_window_view(x, tuple(reduce), axis=axes_)
            tail = tuple(range(rank, rank + windows))
            y = view.max(axis=tail) if spec.reducer == "max" else view.sum(axis=tail)
        else:
            y = np.tensordot(x, values[1], axes=len(reduce))
        y = y + 1 if spec.consumer else y
        if len(spec.epilogue) == 2:
            y = y + values[-1]
        if spec.epilogue:
            y = np.maximum(y, 0)
        return y.astype(dtype)

    buffers = {"A": a_shape, spec.main: tuple(spatial)}
    if b_shape:
        buffers["B"] = b_shape
    if spec.kind == "window":
        buffers[spec.producer] = padded_shape
    elif spec.producer:
        buffers[spec.producer] = a_shape
    if spec.consumer:
        buffers[spec.consumer] = tuple(spatial)
    if bias is not None:
        buffers["Bias"] = (spatial[-1],)
    for name in spec.epilogue:
        buffers[name] = tuple(spatial)
    first_read = spec.producer or "A"
    reads[spec.main] = (first_read, "B") if b_shape else (first_read,)
    if spec.producer:
        reads[spec.producer] = ("A",)
    if spec.consumer:
        reads[spec.consumer] = (spec.main,)
    return Nest(func, reference, buffers, reads)


def _padded(a, idx: tuple, first: int, pad: int, zero):
    """`a` at `idx` shifted back by `pad` along the axes from `first` on; zero on the border."""
    from tvm import te

    inside = [x >= pad for x in idx[first:]] + [
        x < pad + extent for x, extent in zip(idx[first:], a.shape[first:], strict=True)
    ]
    shifted = (*idx[:first], *(x - pad for x in idx[first:]))
    return te.if_then_else(te.all(*inside), a[shifted], zero)


def _const(value: int, dtype: str):
    from tvm import tirx

    return tirx.const(value, dtype)


def producer_axis_names(count: int, spec: NestSpec) -> list[str]:
    used = {n for n, _ in spec.spatial + spec.reduce}
    pool = [n for n in ("p", "q", "s", "t", "u", "v") if n not in used]
    return pool[:count]


def _compute(shape, names: Sequence[str], name: str, body: Callable):
    """te.compute with the loop variables named `names` (which may be Python keywords)."""
    from tvm import te

    return te.compute(
        tuple(shape), lambda *idx: body(tuple(idx)), name=name, varargs_names=list(names)
    )
