"""What a user runs the model with today, timed beside the tuned build (`build-model --compare`).

A PyTorch model runs eager (the module under `torch.no_grad()`), under `torch.compile` (inductor,
compiled on the warm-up call, which is not timed), and exported to ONNX (`torch.onnx.export`,
into a temporary file) in onnxruntime. An .onnx model runs in onnxruntime. A model with a numpy
reference runs that. Every framework gets the thread count TVM runs with (`torch.set_num_threads`,
onnxruntime's `intra_op_num_threads`); numpy's BLAS keeps its own.

A baseline that cannot run here (a package missing, no C compiler for inductor, an export that
fails) is a row with the reason, never an error: the comparison goes on without it.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schedlang.core.diagnostics import error_line
from schedlang.models import frontends
from schedlang.run.outcome import compare_outputs

MIN_REPEAT_S = 0.1  # each timed repeat runs this long at least, as TVM's time evaluator does


@dataclass(frozen=True)
class Timing:
    """Seconds per run of one build or framework, one figure per repeat; `skipped` says why
    there are none."""

    label: str
    latencies: tuple[float, ...] = ()
    skipped: str | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.latencies) if self.latencies else None

    def as_json(self, tuned_s: float | None) -> dict[str, Any]:
        if self.skipped is not None:
            return {"label": self.label, "skipped": self.skipped}
        median = self.median_s
        return {
            "label": self.label,
            "median_s": median,
            "min_s": min(self.latencies),
            "max_s": max(self.latencies),
            "latencies_s": list(self.latencies),
            "x_tuned": median / tuned_s if tuned_s and median is not None else None,
        }


@dataclass(frozen=True)
class Runner:
    """One row of a comparison, ready to time: `once()` times one repeat (at least
    MIN_REPEAT_S of calls) and returns the seconds per call; or `skipped` says why it cannot."""

    label: str
    once: Callable[[], float] | None = None
    skipped: str | None = None


def call_runner(label: str, run: Callable[..., Any], inputs: Sequence[np.ndarray]) -> Runner:
    """A Runner of `run(*inputs)`: called once to warm up, which also sets how many calls fill
    MIN_REPEAT_S; each repeat is their mean."""
    arrays = [a.copy() for a in inputs]
    start = time.perf_counter()
    run(*arrays)
    number = max(1, math.ceil(MIN_REPEAT_S / max(time.perf_counter() - start, 1e-9)))

    def once() -> float:
        start = time.perf_counter()
        for _ in range(number):
            run(*arrays)
        return (time.perf_counter() - start) / number

    return Runner(label, once)


# Between two rows' repeats: TVM's pool threads spin a while after a parallel run, and would
# take a core from the row timed next.
PAUSE_S = 0.02


def interleave(runners: Sequence[Runner], repeat: int) -> list[Timing]:
    """`repeat` rounds, each one repeat of every runner in turn: the rows are timed side by side,
    so a slow spell of the machine (seen here: 18 ms against 20 ms for the same build a few
    minutes apart) falls on all of them, not on one."""
    latencies: list[list[float]] = [[] for _ in runners]
    for _ in range(repeat):
        for runner, figures in zip(runners, latencies, strict=True):
            if runner.once is not None:
                time.sleep(PAUSE_S)
                figures.append(runner.once())
    return [
        Timing(runner.label, tuple(figures))
        if runner.once is not None
        else Timing(runner.label, skipped=runner.skipped)
        for runner, figures in zip(runners, latencies, strict=True)
    ]


def baseline_runners(model: Any, threads: int | None, folder: str) -> list[Runner]:
    """The frameworks `model` (a graph.Model) runs in, ready to time, `threads` each (None:
    theirs; PyTorch's are set by `framework_threads`, around the timing too). `folder` holds an
    exported ONNX file while its session is made."""
    module = torch_module(model)
    rows = []
    if model.reference is not None and model.reference_kind == "numpy":
        rows.append(call_runner("numpy", model.reference, model.inputs))
    if module is not None:
        rows.append(call_runner("PyTorch eager", model.reference, model.inputs))
        rows.append(_torch_compiled(module, model.inputs))
    if str(model.path or "").endswith(".onnx"):
        rows.append(_onnxruntime(Path(model.path), model.inputs, threads))
    elif module is not None:
        expected = model.expected_outputs()
        rows.append(_exported_to_onnxruntime(module, model.inputs, threads, folder, expected))
    return rows


def torch_module(model: Any) -> Any:
    """The model's torch.nn.Module when its reference is one; else None."""
    return getattr(model.reference, "module", None) if model.reference_kind == "PyTorch" else None


def framework_threads(model: Any, threads: int | None) -> contextlib.AbstractContextManager:
    """PyTorch's intra-op threads set to `threads` while it lasts, for a PyTorch model (onnxruntime
    takes its count per session)."""
    if torch_module(model) is None or not threads:
        return contextlib.nullcontext()
    import torch

    return _set_while(torch.get_num_threads, torch.set_num_threads, threads)


@contextlib.contextmanager
def _set_while(get: Callable[[], Any], put: Callable[[Any], None], value: Any) -> Iterator[None]:
    """A setting `put` to `value` while it lasts, and put back to what `get` said before."""
    before = get()
    put(value)
    try:
        yield
    finally:
        put(before)


def _torch_compiled(module: Any, inputs: Sequence[np.ndarray]) -> Runner:
    import torch

    label = "torch.compile"
    try:
        with frontends.quiet():
            compiled = frontends.TorchReference(torch.compile(module))
            compiled(*(a.copy() for a in inputs))  # inductor compiles here, not in the timing
    except Exception as exc:  # inductor's failures are many (no C compiler, an operator)
        return Runner(label, skipped=f"torch.compile failed: {frontends.first_line(exc)}")
    return call_runner(label, compiled, inputs)


def _exported_to_onnxruntime(
    module: Any,
    inputs: Sequence[np.ndarray],
    threads: int | None,
    folder: str,
    expected: Sequence[np.ndarray] | None = None,
) -> Runner:
    import torch

    label = "onnxruntime"
    missing = _missing("onnxruntime")
    if missing:
        return Runner(label, skipped=missing)
    path = Path(folder) / "model.onnx"
    example = tuple(torch.from_numpy(a.copy()) for a in inputs)
    # The TorchScript exporter first (what the earlier figures used); where it fails (a
    # transformer layer's attention: `is_causal` traced as a tensor), torch.export's exporter,
    # which needs onnxscript (the onnx extra).
    failures = []
    for dynamo in (False, True):
        if dynamo and _missing("onnxscript"):
            failures.append("the torch.export exporter needs onnxscript (the onnx extra)")
            break
        try:
            with torch.no_grad(), frontends.quiet(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporters' warnings are about their trace
                with _mha_fastpath_off():
                    # verbose=False: the torch.export exporter prints its steps otherwise
                    torch.onnx.export(module, example, str(path), dynamo=dynamo, verbose=False)
            break
        except Exception as exc:  # the exporter's own errors: an operator it has no symbol for
            failures.append(frontends.first_line(exc))
            path.unlink(missing_ok=True)
    if not path.exists():
        return Runner(label, skipped=f"torch.onnx.export failed: {'; then '.join(failures)}")
    label = "onnxruntime (exported" + (", torch.export)" if failures else ")")
    return _onnxruntime(path, inputs, threads, label, expected)


def _mha_fastpath_off() -> contextlib.AbstractContextManager:
    """PyTorch's fused fast path of `nn.TransformerEncoderLayer` and `nn.MultiheadAttention` off
    while exporting: in eval mode the layer runs as one `aten::_transformer_encoder_layer_fwd`,
    which has no ONNX symbol; without it the tracer sees the same math as plain operators."""
    import torch

    mha = getattr(torch.backends, "mha", None)
    if mha is None:
        return contextlib.nullcontext()
    return _set_while(mha.get_fastpath_enabled, mha.set_fastpath_enabled, False)


def _onnxruntime(
    path: Path,
    inputs: Sequence[np.ndarray],
    threads: int | None,
    label: str = "onnxruntime",
    expected: Sequence[np.ndarray] | None = None,
) -> Runner:
    missing = _missing("onnxruntime")
    if missing:
        return Runner(label, skipped=missing)
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    try:
        session = onnxruntime.InferenceSession(
            str(path), options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime refuses the graph: an operator or opset it lacks
        return Runner(label, skipped=f"onnxruntime cannot load it: {error_line(exc, first=True)}")
    names = [i.name for i in session.get_inputs()]

    def run(*arrays: np.ndarray) -> Any:
        return session.run(None, dict(zip(names, arrays, strict=True)))

    if expected is not None:  # an exported graph computing something else is no baseline
        ok, reason = compare_outputs(list(run(*inputs)), list(expected))
        if not ok:
            return Runner(label, skipped=f"its outputs differ from the model's: {reason}")
    return call_runner(label, run, inputs)


def _missing(package: str) -> str | None:
    """Why `package` cannot be used: not installed; None when it can be imported."""
    import importlib.util

    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # ValueError: blocked (None in sys.modules)
        found = False
    if not found:
        return f"{package} is not installed (pip install {package})"
    return None
