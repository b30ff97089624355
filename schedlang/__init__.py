"""schedlang: a schedule language for Apache TVM.

    import schedlang
    scheduled = schedlang.apply(func, "tile i, j by 32x32; vectorize j.i", "llvm")

Importing the package is cheap; TVM is imported on first use of an API that needs it.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "op": "schedlang.ops",
    "load_op": "schedlang.ops",
    "model": "schedlang.graph",
    "load_model": "schedlang.graph",
    "build_model": "schedlang.graph",
    "ApplySchedlangDatabase": "schedlang.graph",
    "parse": "schedlang.syntax",
    "check": "schedlang.check",
    "lower": "schedlang.lower",
    "apply": "schedlang.build",
    "build": "schedlang.build",
    "SchedulePass": "schedlang.build",
    "resolve_target": "schedlang.target",
    "Diagnostic": "schedlang.diagnostics",
    "DiagnosticError": "schedlang.diagnostics",
    "SchedlangError": "schedlang.diagnostics",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'schedlang' has no attribute {name!r}")
