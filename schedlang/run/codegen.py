"""A PrimFunc → TVM's build of it: an executable, its library, its generated code.

Below both `build` (which verifies what it builds, schedlang.run.verify) and `measure` (which
builds the unscheduled function as a reference), so neither imports the other.

A build can take LLVM seconds to minutes. A front end that shows it (`schedlang compile` and
`run` show a spinner) says how with `watching_builds`, and every build inside runs inside the
context manager it gives; the library says nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import tvm
from tvm import tirx

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.core.target import Target

BuildWatcher = Callable[[Target], AbstractContextManager]
_WATCHERS: list[BuildWatcher] = []


@contextmanager
def watching_builds(watcher: BuildWatcher) -> Iterator[None]:
    """Within it, each build (`compile_func`) runs inside `watcher(target)`."""
    _WATCHERS.append(watcher)
    try:
        yield
    finally:
        _WATCHERS.remove(watcher)


def compile_func(func: tirx.PrimFunc | tvm.IRModule, target: Target) -> tvm.runtime.Executable:
    """`func` built as `main`, or a module of several (a prepacked kernel: run.packing) built
    whole."""
    module = func if isinstance(func, tvm.IRModule) else tvm.IRModule({"main": func})
    try:
        with ExitStack() as watched:
            for watcher in list(_WATCHERS):
                watched.enter_context(watcher(target))
            return tvm.compile(module, target=target.to_tvm())
    except Exception as exc:  # TVM raises several types; the user needs its reason either way
        raise SchedlangError(f"TVM could not build the function: {error_line(exc)}") from None


def export(executable: tvm.runtime.Executable, path: str | Path) -> Path:
    """A shared library that `tvm.runtime.load_module` loads."""
    path = Path(path)
    try:
        executable.export_library(str(path))
    except Exception as exc:
        raise SchedlangError(f"cannot export the library to {path}: {error_line(exc)}") from None
    return path


def source(executable: tvm.runtime.Executable, target: Target) -> str:
    """The generated code: CUDA C for GPU targets, assembly for CPUs."""
    module = executable.mod
    if target.is_gpu:
        return "\n".join(m.inspect_source() for m in module.imports)
    return module.inspect_source("asm")
