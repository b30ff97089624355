"""schedlang: a schedule language for Apache TVM.

    import schedlang
    scheduled = schedlang.apply(func, "tile i, j by 32x32; vectorize j.i", "llvm")

Importing the package is cheap; TVM is imported on first use of an API that needs it. The layers,
lowest first, are subpackages (docs/architecture.md draws them): core, store, lang, checker, run,
interop, propose, tuning, llm, models, cli; testing holds the stand-ins tests and trials use.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "op": "schedlang.core.ops",
    "load_op": "schedlang.core.ops",
    "model": "schedlang.models.graph",
    "load_model": "schedlang.models.graph",
    "build_model": "schedlang.models.graph",
    "ApplySchedlangDatabase": "schedlang.models.graph",
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
