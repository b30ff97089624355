"""A tuned build of a model against `tvm.compile`'s: the outputs checked, then both timed."""

from __future__ import annotations

from dataclasses import dataclass

from schedlang.core.diagnostics import SchedlangError
from schedlang.models.graph import build_default, median, run_model, time_model, time_reference
from schedlang.run.outcome import compare_outputs


@dataclass(frozen=True)
class BuildComparison:
    """Medians of `repeat` timed runs, in seconds; reference_s None when the model has no
    reference, which runs on `reference_kind` (numpy, PyTorch, onnxruntime)."""

    repeat: int
    checked_against: str  # what the tuned build's outputs were compared with
    tuned_s: float
    default_s: float
    reference_s: float | None
    reference_kind: str = "numpy"


def compare_builds(model, tgt, executable, repeat: int) -> BuildComparison:
    """Verify the tuned `executable` against the default build (and the model's reference, if it
    has one), then time both; a SchedlangError when the outputs disagree."""
    default = build_default(model.mod, tgt)
    reference = time_reference(
        model, repeat
    )  # first: TVM's pool threads spin for a while after a run
    outputs = run_model(executable, model.inputs, tgt)
    ok, reason = compare_outputs(outputs, run_model(default, model.inputs, tgt))
    if not ok:
        raise SchedlangError(f"the tuned build and the default build disagree: {reason}")
    expected = model.expected_outputs()
    if expected is not None:
        ok, reason = compare_outputs(outputs, expected)
        if not ok:
            raise SchedlangError(f"the tuned build differs from the model's reference: {reason}")
    return BuildComparison(
        repeat=repeat,
        checked_against="the default build and the reference" if expected else "the default build",
        tuned_s=median(time_model(executable, model.inputs, tgt, repeat=repeat)),
        default_s=median(time_model(default, model.inputs, tgt, repeat=repeat)),
        reference_s=median(reference) if reference is not None else None,
        reference_kind=model.reference_kind,
    )
