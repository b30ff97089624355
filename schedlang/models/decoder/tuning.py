"""Tuning a decoder's kernels, whose extents are symbolic: the token count `n` of a prefill, the
cached length `past` (the machinery, shared with any model's symbolic functions, is
schedlang.models.lengths'; here is what a length means for a decoder's kernel).

    report = tune_decoder(source, db, lengths=(1, 16, 128, 512), trials=8)
    for kernel in report.kernels: print(kernel.summary())
    model = load_tuned(source, db)          # decoder.load with the database's schedules

A kernel with a symbolic extent is measured on copies of it specialized at representative
lengths and gets one schedule for every length, chosen by the sum of its relative times
(schedlang.models.lengths says how).

Why one schedule (a weighted sum) rather than kernels specialized by length with a dispatch: the
coarse dispatch is there already, by entry point: `decode` runs its own copies of the kernels
with n = 1 (static GEMVs, tuned as they are), `prefill` the symbolic ones. Within a prefill, a
dispatch would build each kernel several times (LLVM's time is most of a decoder's build) and
needs the Relax call to branch on `n`; a schedule that holds at every length keeps one
function per kernel, and the times at each length say what it costs.

A static kernel (decode's GEMVs, the LM head, decode's RMSNorm) is tuned as a model's task is.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tvm
from tvm import tirx

from schedlang.core.target import Target, as_target
from schedlang.models.graph import extract_tasks, is_scheduled
from schedlang.models.lengths import (  # noqa: F401  (the decoder's names for them too)
    DEFAULT_LENGTHS,
    LENGTH_ATTR,
    KernelChoice,
    LengthTuner,
    check_lengths,
    default_lengths,
    fallback_length,
    measured_lengths,
    odd_length,
    specialize,
    symbolic_times,
    symbolic_vars,
)
from schedlang.store.db import Database
from schedlang.tuning.tune import Settings, Workers

PROPOSER = "decoder-lengths"  # the proposer of the record a symbolic kernel's choice is


def length_values(func: tirx.PrimFunc, length: int) -> dict[str, int]:
    """The values of `func`'s symbolic extents at `length`: a kernel with a token count (a var
    of a buffer's shape) runs `length` tokens from an empty cache (other vars 0); one with a
    cached length only (decode's attention, rotary) runs one token after `length - 1` cached."""
    variables = symbolic_vars(func)
    scalars = {p.name for p in func.params if not isinstance(p.ty, tvm.tirx.BufferType)}
    tokens = [name for name in variables if name not in scalars]
    if tokens:
        return {name: length if name in tokens else 0 for name in variables}
    return {name: length - 1 for name in variables}


def measured_function(func: tirx.PrimFunc, values: Mapping[str, int], cache: int) -> tirx.PrimFunc:
    """`func` specialized at `values`, as the tuner measures it; its loops and blocks are
    `func`'s, so a schedule of one is a schedule of the other. Two changes make the tuner's
    verification meaningful: a buffer the function writes in place without reading it (the KV
    cache of `cache` positions, written at [past, past + n)) is given past + n positions (the
    verifier fills an output nothing reads with NaN and wants every element written); and the
    token ids a gather reads rows by are clamped at 0 (the tuner's random integers are in
    [-4, 4]: a negative id would read outside the table)."""
    from schedlang.core.opinfo import read_buffers

    specialized = specialize(func, values) if values else func
    written = sum(values.values()) if values else cache
    read = read_buffers(specialized)
    text = specialized.script()
    changed = _clamped_gathers(text, specialized)
    for param in specialized.params if written < cache else ():
        if not isinstance(param.ty, tvm.tirx.BufferType) or param.name in read:
            continue
        dims = [int(d) if isinstance(d, tirx.IntImm) else None for d in param.shape]
        # Only the axis stored at the cached length (cache[.., past + i, ..]): another of the
        # same extent (head_dim = max_length), or another output's, keeps its size.
        positions = _position_axes(func, param.name)
        if not any(dims[axis] == cache for axis in positions):
            continue
        shape = ", ".join(
            str(written if axis in positions and d == cache else d) for axis, d in enumerate(dims)
        )
        old = ", ".join(map(str, dims))
        changed = changed.replace(
            f"{param.name}: T.Buffer(({old}),", f"{param.name}: T.Buffer(({shape}),", 1
        )
    if changed == text:
        return specialized
    return tvm.script.from_source(changed)


def _position_axes(func: tirx.PrimFunc, name: str) -> set[int]:
    """The axes of buffer `name` that `func` stores to at an index holding one of its scalar
    parameters (the cached length: `cache[vc, vg, past + vi, vd] = ...`)."""
    scalars = [p.name for p in func.params if not isinstance(p.ty, tvm.tirx.BufferType)]
    axes: set[int] = set()
    for line in func.script().splitlines():
        target = line.split(" = ")[0].strip() if " = " in line else ""
        if not target.startswith(f"{name}[") or not target.endswith("]"):
            continue
        for axis, index in enumerate(target[len(name) + 1 : -1].split(",")):
            if any(re.search(rf"\b{scalar}\b", index) for scalar in scalars):
                axes.add(axis)
    return axes


def _clamped_gathers(text: str, func: tirx.PrimFunc) -> str:
    """`text` (func's TVMScript) with each integer buffer read inside another buffer's index in
    a store clamped at 0: `table[T.max(ids[v_i], 0), v_c]`."""
    integer = [
        p.name
        for p in func.params
        if isinstance(p.ty, tvm.tirx.BufferType) and "int" in str(p.dtype)
    ]
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines):
        if " = " not in line or "T." in line.split(" = ")[0]:
            continue  # only stores: `out[...] = table[ids[v_i], v_c]`
        for name in integer:
            line = re.sub(rf"\[{name}(\[[^\[\]]*\])", rf"[T.max({name}\1, 0)", line)
        lines[number] = line
    return "".join(lines)


@dataclass
class DecoderTuning:
    """A decoder's tuning: each kernel's choice, the lengths, and its wall time."""

    kernels: list[KernelChoice] = field(default_factory=list)
    lengths: tuple[int, ...] = ()
    variables: dict[str, tuple[int, ...]] = field(default_factory=dict)
    wall_s: float = 0.0
    # Functions the module holds written scheduled (`tirx.is_scheduled`: prefill's fused
    # attention), which the tuner leaves as they are.
    scheduled_before: list[str] = field(default_factory=list)

    @property
    def unscheduled(self) -> list[str]:
        return [k.name for k in self.kernels if not k.schedule.strip()]


def tune_kernels(
    mod: tvm.IRModule,
    *args: Any,
    on_kernel: Callable[[KernelChoice], None] | None = None,
    **how: Any,
) -> DecoderTuning:
    """Every kernel of the decoder module `mod` tuned (`settings.trials` candidates per kernel
    and length), each one's choice recorded in `db`: `kernel_choices`, each to `on_kernel`."""
    steps = kernel_choices(mod, *args, **how)
    while True:
        try:
            choice = next(steps)
        except StopIteration as finished:
            return finished.value
        if on_kernel is not None:
            on_kernel(choice)


def kernel_choices(
    mod: tvm.IRModule,
    max_length: int,
    target: Target | str,
    db: Database,
    *,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    settings: Settings | None = None,
) -> Generator[KernelChoice, None, DecoderTuning]:
    """`tune_kernels` step by step: each kernel's choice as it is made, then the tuning."""
    target = as_target(target)
    settings = settings or Settings()
    lengths = check_lengths(lengths, max_length)
    started = time.perf_counter()
    result = DecoderTuning(lengths=lengths, scheduled_before=scheduled_before(mod))
    tasks = extract_tasks(mod, target)
    with tempfile.TemporaryDirectory(prefix="schedlang-decoder-") as work_dir:
        workers = Workers(target, settings, Path(work_dir) / "workers.log")
        try:
            for task in tasks:
                tuner = LengthTuner(
                    task, target, db, settings, workers, max_length, length_values,
                    lambda func, values: measured_function(func, values, max_length), PROPOSER,
                )  # fmt: skip
                choice = tuner.run(lengths) if symbolic_vars(task.op.func) else tuner.static()
                result.kernels.append(choice)
                result.variables = measured_lengths(result.kernels)
                yield choice
        finally:
            workers.close()
    result.wall_s = time.perf_counter() - started
    return result


def scheduled_before(mod: tvm.IRModule) -> list[str]:
    """The PrimFuncs of `mod` that come scheduled (no task of the tuner's), by name."""
    return sorted(
        gv.name_hint
        for gv, func in mod.functions.items()
        if isinstance(func, tirx.PrimFunc) and is_scheduled(func)
    )


# --- the entry points ----------------------------------------------------------------------------


def tune_decoder(
    source: Any,
    db: Database,
    *,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    trials: int = 8,
    max_length: int | None = None,
    target: Target | str = "llvm",
    settings: Settings | None = None,
    on_kernel: Callable[[KernelChoice], None] | None = None,
) -> DecoderTuning:
    """Tune every kernel of the decoder of `source` (what `decoder.load` takes) with a cache of
    `max_length` tokens: `trials` candidates per kernel and length, the choices in `db`."""
    from schedlang.models.decoder import check_length

    check_length("trials", trials)
    mod, max_length = decoder_module(source, max_length)
    settings = replace(settings or Settings(), trials=trials)
    return tune_kernels(
        mod, max_length, target, db, lengths=lengths, settings=settings, on_kernel=on_kernel
    )


def decoder_module(source: Any, max_length: int | None = None) -> tuple[tvm.IRModule, int]:
    """The Relax module of `source`'s decoder and its cache's length (default: the model's
    maximum position, at most 2,048)."""
    from schedlang.models.decoder import DEFAULT_MAX_LENGTH, check_length
    from schedlang.models.decoder.build import export
    from schedlang.models.decoder.weights import read_source

    config, _ = read_source(source)
    if max_length is None:
        max_length = min(config.max_position_embeddings, DEFAULT_MAX_LENGTH)
    check_length("max_length", max_length)
    mod, _ = export(config, max_length)
    return mod, max_length


def load_tuned(
    source: Any,
    db: Database,
    max_length: int | None = None,
    target: Target | str = "llvm",
) -> tuple[Any, list[Any]]:
    """The decoder of `source` built with `db`'s schedules (`ApplySchedlangDatabase`, as a
    model's build): (the Decoder, what each kernel got)."""
    from schedlang.models.decoder import load
    from schedlang.models.graph import ApplySchedlangDatabase

    target = as_target(target)
    schedule = ApplySchedlangDatabase(db, target)
    model = load(source, max_length, target, schedule=schedule)
    return model, list(schedule.applied)
