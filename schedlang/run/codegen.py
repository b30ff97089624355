"""A PrimFunc → TVM's build of it: an executable, its library, its generated code.

Below both `build` (which verifies what it builds, schedlang.run.verify) and `measure` (which
builds the unscheduled function as a reference), so neither imports the other.
"""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm import tirx

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.core.target import Target


def compile_func(func: tirx.PrimFunc, target: Target) -> tvm.runtime.Executable:
    try:
        return tvm.compile(tvm.IRModule({"main": func}), target=target.to_tvm())
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
