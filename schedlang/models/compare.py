"""A tuned build of a model against `tvm.compile`'s and the frameworks it comes from: the outputs
checked, then all timed with one thread count."""

from __future__ import annotations

import os
import platform
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import tvm

from schedlang.core.diagnostics import SchedlangError
from schedlang.models.baselines import (
    Runner,
    Timing,
    baseline_runners,
    framework_threads,
    interleave,
)
from schedlang.models.graph import build_default, run_model, timer
from schedlang.models.model_file import inputs_at, symbolic_lengths
from schedlang.run.outcome import compare_outputs


@dataclass(frozen=True)
class BuildComparison:
    """`repeat` timed runs of each row, in seconds, timed in turns: the tuned build first, then
    any other builds compared, the default build and the frameworks (baselines); `threads` each
    (None on a GPU)."""

    repeat: int
    checked_against: str  # what the tuned build's outputs were compared with
    threads: int | None
    rows: tuple[Timing, ...]
    reference_kind: str = "numpy"

    @property
    def tuned_s(self) -> float:
        return _timed(self.rows[0])

    @property
    def default_s(self) -> float:
        return _timed(next(row for row in self.rows if row.label == "default (tvm.compile)"))

    def as_json(self) -> dict[str, Any]:
        return {
            "repeat": self.repeat,
            "threads": self.threads,
            "cpu": cpu_name(),
            "checked_against": self.checked_against,
            "rows": [row.as_json(self.tuned_s) for row in self.rows],
        }


def _timed(row: Timing) -> float:
    """A build's median run time: the builds are always timed (only a framework is skipped)."""
    if row.median_s is None:
        raise SchedlangError(f"{row.label}: no run was timed")
    return row.median_s


def compare_builds(
    model,
    tgt,
    executable,
    repeat: int,
    threads: int | None = None,
    others: Sequence[tuple[str, Any]] = (),
) -> BuildComparison:
    """Verify the tuned `executable` against the default build (and the model's reference, if it
    has one), then time it, `others` (label, executable: builds checked by the caller), the
    default build and the model's frameworks side by side: `repeat` rounds, each one repeat of
    every row in turn (baselines.interleave). A SchedlangError when the outputs disagree.
    `threads`: the frameworks' thread count, by default TVM's (TVM_NUM_THREADS)."""
    threads = threads or (None if tgt.is_gpu else runtime_threads())
    default = build_default(model.mod, tgt)
    checked = verify_build(model, tgt, executable, default=default, against_default=True)
    builds = [("tuned", executable), *others, ("default (tvm.compile)", default)]
    with framework_threads(model, threads), tempfile.TemporaryDirectory() as folder:
        runners = [Runner(label, timer(exe, model.inputs, tgt)) for label, exe in builds]
        runners += baseline_runners(model, threads, folder)
        rows = interleave(runners, repeat)
    return BuildComparison(
        repeat=repeat,
        checked_against=checked,
        threads=threads,
        rows=tuple(rows),
        reference_kind=model.reference_kind,
    )


def verify_build(model, tgt, executable, *, default=None, against_default: bool = False) -> str:
    """Run the tuned `executable` on the model's inputs and compare its outputs with the model's
    reference, and with `tvm.compile`'s build when the model has no reference or
    `against_default` asks; what they were compared with, or a SchedlangError saying how they
    differ (a tuned model is never shipped unchecked). A model with symbolic lengths is checked
    at a second length too (`second_lengths`), one whose tails a power-of-two split leaves."""
    checked = _verify_inputs(model, tgt, executable, model.inputs, default, against_default)
    second = second_lengths(model)
    if not second:
        return checked
    _verify_inputs(model, tgt, executable, inputs_at(model, second), default, against_default)
    at = ", ".join(f"{name} = {value}" for name, value in second.items())
    return f"{checked}, at the example's lengths and at {at}"


def second_lengths(model) -> dict[str, int]:
    """Values of the model's symbolic lengths other than its example's (13, or the largest odd
    value below it its bounds allow); {} for a static model."""
    bounds = symbolic_lengths(model.mod)
    if not bounds:
        return {}
    example = {}
    for param, array in zip(model.mod["main"].params, model.inputs, strict=True):
        dims = getattr(getattr(param.ty, "shape", None), "values", None) or []
        example.update(
            {
                d.name: size
                for d, size in zip(dims, array.shape, strict=True)
                if isinstance(d, tvm.tirx.Var)
            }
        )
    values = {}
    for name, (lower, upper) in bounds.items():
        choices = [v for v in (13, 11, 7, 5, 3, 2, 1) if lower <= v <= (upper or v)]
        values[name] = next((v for v in choices if v != example.get(name)), choices[0])
    return values


def _verify_inputs(model, tgt, executable, inputs, default, against_default) -> str:
    outputs = run_model(executable, inputs, tgt)
    expected = model.expected_outputs(inputs)
    checked = []
    if expected is None or against_default:
        default = default if default is not None else build_default(model.mod, tgt)
        ok, reason = compare_outputs(outputs, run_model(default, inputs, tgt))
        if not ok:
            raise SchedlangError(f"the tuned build and the default build disagree: {reason}")
        checked.append("the default build")
    if expected is not None:
        ok, reason = compare_outputs(outputs, expected)
        if not ok:
            raise SchedlangError(
                f"the tuned build differs from the model's reference ({model.reference_kind}): "
                f"{reason}"
            )
        checked.append(f"the reference ({model.reference_kind})")
    return " and ".join(checked)


def verify_on_board(model, tgt, executable, remote) -> str:
    """Run the `executable` (built for `tgt`, another machine's) on a device leased under
    `remote.key` (schedlang.run.leased.run_model_on_board) and compare its outputs there with the
    model's reference, computed here: what they were compared with, and where, or a
    SchedlangError saying how they differ or why the board could not run it."""
    from schedlang.run.leased import run_model_on_board
    from schedlang.store.records import Status

    expected = model.expected_outputs()
    if expected is None:
        raise SchedlangError(
            f"the model {model.name} has no reference to check the board's outputs against",
            "a PyTorch or ONNX model has its framework's; give an IRModule's model a reference",
        )
    outcome = run_model_on_board(executable, model.inputs, expected, tgt, remote)
    if outcome.status is Status.WRONG:
        raise SchedlangError(
            f"the build differs on the board from the model's reference ({model.reference_kind}): "
            f"{outcome.reason}"
        )
    if outcome.status is not Status.OK:
        raise SchedlangError(
            f"the build did not run on the board: {outcome.status}: {outcome.reason}"
        )
    emulated = ", an emulator" if outcome.extra.get("emulated") else ""
    device = f"device {outcome.extra.get('device')} under key `{remote.key}`{emulated}"
    return f"the reference ({model.reference_kind}), run on {device}"


def runtime_threads() -> int:
    """The threads TVM's runtime starts with: TVM_NUM_THREADS (set_runtime_threads sets it)."""
    value = os.environ.get("TVM_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else max(1, (os.cpu_count() or 2) // 2)


@cache
def cpu_name() -> str | None:
    """The CPU's model name (Linux's /proc/cpuinfo, else what `platform` knows), or None."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None
