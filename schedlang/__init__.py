"""schedlang: a schedule language for Apache TVM.

    import schedlang
    scheduled = schedlang.apply(func, "tile i, j by 32x32; vectorize j.i", "llvm")

Importing the package is cheap; TVM is imported on first use of an API that needs it. The
package is a stack of layers, one subpackage each: `LAYERS` below is the one list of them, lowest
first, that tests/test_layers.py enforces and docs/architecture.md draws.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# A module imports its own layer and those before it here, never one after (tests/test_layers.py).
LAYERS = (
    "core", "store", "lang", "checker", "run", "interop", "propose", "tuning", "llm", "learn",
    "models", "report", "workflows", "cli", "testing",
)  # fmt: skip

_EXPORTS = {
    "op": "schedlang.core.ops",
    "load_op": "schedlang.core.ops",
    "model": "schedlang.models.model_file",
    "load_model": "schedlang.models.model_file",
    "ApplySchedlangDatabase": "schedlang.models.graph",
    # The workflows (docs/api.md); the Relax-level build is schedlang.models.graph.build_model.
    "tune_op": "schedlang.workflows.op_tuning",
    "tune_model": "schedlang.workflows.model_tuning",
    "build_model": "schedlang.workflows.model_build",
    "evaluate_model": "schedlang.workflows.evaluation",
    "parse": "schedlang.lang.syntax",
    "check": "schedlang.checker.check",
    "lower": "schedlang.checker.pipeline",
    "apply": "schedlang.run.build",
    "build": "schedlang.run.build",
    "SchedulePass": "schedlang.run.build",
    "resolve_target": "schedlang.core.target",
    "Diagnostic": "schedlang.core.diagnostics",
    "DiagnosticError": "schedlang.core.diagnostics",
    "SchedlangError": "schedlang.core.diagnostics",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:  # the lazy exports: each its own type
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'schedlang' has no attribute {name!r}")
