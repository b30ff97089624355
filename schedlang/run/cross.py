"""Building for another machine, and running one kernel on a board.

    cc = linker_for(target)                  # None: this machine's compiler links it
    export_for(executable, "a.so", target)   # linked by the cross compiler when there is one
    outcome = run_on_board(op, func, target, remote, repeat=5)

TVM's LLVM generates code for the target's `mtriple`; linking it into a shared library needs a
linker for that triple. When the triple is not this machine's (the vendor part does not matter:
`x86_64-pc-linux-gnu` and `x86_64-conda-linux-gnu` are the same machine), the linker is the one
the user named, else `<triple>-g++` on PATH (Debian's `g++-<triple>` package provides it), else
a `SchedlangError` naming the package. `schedlang compile -o`, `schedlang run --rpc-tracker` and
the tuner's remote runner (`schedlang.run.remote`) all ask here.

`run_on_board` is `schedlang run --rpc-tracker`: the kernel cross-built here, then verified against
the op's reference and timed on a device leased from a TVM RPC tracker, through the remote runner
that tuning uses (one candidate, one lease).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang.core.diagnostics import SchedlangError, error_line

if TYPE_CHECKING:
    import tvm

    from schedlang.core.ops import Op
    from schedlang.core.target import Target
    from schedlang.run.outcome import Outcome
    from schedlang.run.remote import RemoteRunner, RemoteSettings


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


def export_for(executable: tvm.runtime.Executable, path: str | Path, target: Target) -> Path:
    """A shared library of `executable` that `tvm.runtime.load_module` loads on the target's
    machine: linked by `linker_for(target)`."""
    from tvm.support import cc as compilers

    path, linker = Path(path), linker_for(target)
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


def run_on_board(
    op: Op,
    executable: tvm.runtime.Executable,
    target: Target,
    remote: RemoteSettings,
    *,
    repeat: int = 5,
    min_repeat_ms: int = 0,
    run_timeout_s: float = 60.0,
    runner: RemoteRunner | None = None,
) -> Outcome:
    """Verify, then time, `executable` (built for `target`) on a device leased under
    `remote.key`, against the op's reference computed here; `repeat` 0 verifies only. The
    Outcome's extra names the key and the device; a board lost twice gives its status.
    `runner`: a RemoteRunner to reuse (its worker imports TVM once), else one for this call."""
    import numpy as np

    from schedlang.core.ops import random_inputs
    from schedlang.run.measure import expected_outputs, output_indices
    from schedlang.run.remote import RemoteRunner
    from schedlang.run.sandbox import MeasureJob

    own = runner is None
    runner = runner or RemoteRunner(remote, target, run_timeout_s, env={})
    try:
        with tempfile.TemporaryDirectory(prefix="schedlang-board-") as work:
            work_dir = Path(work)
            args = random_inputs(op)
            np.savez(work_dir / "args.npz", *args)
            np.savez(work_dir / "expected.npz", *expected_outputs(op, [a.copy() for a in args]))
            library = export_for(executable, work_dir / f"{op.name}.so", target)
            job = MeasureJob(
                lib_path=str(library),
                args_path=str(work_dir / "args.npz"),
                expected_path=str(work_dir / "expected.npz"),
                outputs=output_indices(op),
                device="cpu" if target.kind == "llvm" else target.kind,
                repeat=repeat,
                min_repeat_ms=min_repeat_ms,
                names=[buffer.name for buffer in op.outputs],
            )
            return runner.run(job)
    finally:
        if own:
            runner.close()
