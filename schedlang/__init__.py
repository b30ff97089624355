"""schedlang: a schedule language for Apache TVM.

    import schedlang
    scheduled = schedlang.apply(func, "tile i, j by 32x32; vectorize j.i", "llvm")

Importing the package is cheap; TVM is imported on first use of an API that needs it.
"""

import sys
from importlib import import_module
from types import ModuleType

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


# Three exports share their name with the module that defines them. Importing `schedlang.build`
# (as `apply` itself does) makes the import system set the package attribute `build` to the
# module, so these modules are made callable instead: `schedlang.build(...)` calls the function
# whatever was imported first, and `schedlang.build.compile_func` still reaches the module.
_CALLABLE_MODULES = {"build", "check", "lower"}


class CallableModule(ModuleType):
    """A module that, called, calls its function of the same name (`schedlang.build(...)`)."""

    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)


def make_callable(module_name: str) -> None:
    """Called at the end of schedlang.build, .check and .lower, on themselves."""
    sys.modules[module_name].__class__ = CallableModule


def __getattr__(name: str):
    if name in _CALLABLE_MODULES:
        return import_module(f"schedlang.{name}")
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'schedlang' has no attribute {name!r}")
