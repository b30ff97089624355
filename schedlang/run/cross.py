"""Building for another machine: the compiler that links its libraries.

    cc = linker_for(target)                  # None: this machine's compiler links it
    export_for(executable, "a.so", target)   # linked by the cross compiler when there is one

TVM's LLVM generates code for the target's `mtriple`; linking it into a shared library needs a
linker for that triple. When the triple is not this machine's (the vendor part does not matter:
`x86_64-pc-linux-gnu` and `x86_64-conda-linux-gnu` are the same machine), the linker is the one
the user named, else `<triple>-g++` on PATH (Debian's `g++-<triple>` package provides it), else
a `SchedlangError` naming the package. `schedlang compile -o`, `schedlang run --rpc-tracker`
(schedlang.run.leased) and the tuner's remote runner (schedlang.run.remote) all ask here.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang.core.diagnostics import SchedlangError, error_line

if TYPE_CHECKING:
    import tvm

    from schedlang.core.target import Target


def target_triple(target: Target) -> str | None:
    """The LLVM triple the target's host code is built for; None means this machine's."""
    tvm_target = target.to_tvm()
    llvm = tvm_target if tvm_target.kind.name == "llvm" else tvm_target.host
    if llvm is None or llvm.kind.name != "llvm":
        return None
    triple = llvm.attrs.get("mtriple")
    return str(triple) if triple else None


def _platform(triple: str) -> tuple[str, str, str]:
    """(arch, os, abi) of a triple; the vendor (`pc`, `unknown`, `conda`) does not matter."""
    parts = triple.lower().split("-")
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(parts[0], parts[0])
    systems = ("linux", "android", "darwin", "macos", "ios", "windows", "freebsd", "none")
    for index, part in enumerate(parts[1:], 1):
        system = next((s for s in systems if part.startswith(s)), None)
        if system:
            abi = parts[index + 1] if index + 1 < len(parts) else ""
            return arch, system, abi
    return arch, parts[-1] if len(parts) > 1 else "", ""


def is_foreign(target: Target) -> bool:
    """Whether the target's code runs on another kind of machine than this one."""
    from tvm.target import codegen

    triple = target_triple(target)
    return triple is not None and _platform(triple) != _platform(
        str(codegen.llvm_get_system_triple())
    )


def linker_for(target: Target, cc: str | None = None, option: str | None = None) -> str | None:
    """The compiler that links libraries for `target`: `cc` if given (`option` names where it
    came from), else None (the default compiler) when the target runs on this machine's kind of
    CPU, else `<triple>-g++`; a SchedlangError naming the package when that is not installed."""
    from tvm.target import codegen

    if cc is not None:
        if shutil.which(cc) is None:
            given = f" ({option})" if option else ""
            raise SchedlangError(
                f"cross compiler `{cc}`{given} is not on PATH", "install it, or give its full path"
            )
        return cc
    if not is_foreign(target):
        return None
    triple, host = target_triple(target), str(codegen.llvm_get_system_triple())
    guess = f"{triple}-g++"
    if shutil.which(guess):
        return guess
    package = f"g++-{triple}"
    name_it = f"name one with {option}, e.g. {option} {guess}; " if option else ""
    raise SchedlangError(
        f"the target's triple {triple} is not this machine's ({host}): linking its libraries "
        f"needs a cross compiler, `{guess}`, which is not installed",
        f"{name_it}on Debian/Ubuntu: apt install {package}",
    )


def export_for(
    executable: tvm.runtime.Executable, path: str | Path, target: Target, cc: str | None = None
) -> Path:
    """A shared library of `executable` that `tvm.runtime.load_module` loads on the target's
    machine: linked by `linker_for(target, cc)` (`cc`: the one the user named, --rpc-cc)."""
    from tvm.support import cc as compilers

    path, linker = Path(path), linker_for(target, cc, option="--rpc-cc" if cc else None)
    try:
        if linker is None:
            executable.export_library(str(path))
        else:
            triple = compilers.get_target_by_dump_machine(linker)
            fcompile = compilers.cross_compiler(linker, get_target_triple=triple)
            executable.export_library(str(path), fcompile=fcompile)
    except Exception as exc:
        raise SchedlangError(f"cannot export the library to {path}: {error_line(exc)}") from None
    return path
