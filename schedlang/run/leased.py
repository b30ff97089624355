"""One kernel verified and timed on a device leased from a TVM RPC tracker: `schedlang run
--rpc-tracker`.

    outcome = run_on_board(op, executable, target, remote, repeat=5)

The kernel is built here for the board's target and linked by its cross compiler
(schedlang.run.cross); the op's reference is computed here; then the remote runner that tuning
uses (schedlang.run.remote) leases a device, uploads the library, runs it once, checks its outputs
here and times it with the board's time evaluator: one candidate, one lease.

    outcome = run_model_on_board(executable, inputs, expected, target, remote)

A whole model (a Relax VM executable, schedlang.models) goes the same way: exported for the board,
leased, uploaded, its `main` run there by the VM on `inputs`, its outputs checked here against
`expected` (the model's reference), then timed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang.run.cross import export_for

if TYPE_CHECKING:
    import numpy as np
    import tvm

    from schedlang.core.ops import Op
    from schedlang.core.target import Target
    from schedlang.run.outcome import Outcome
    from schedlang.run.remote import RemoteRunner, RemoteSettings


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
    from schedlang.core.ops import random_inputs
    from schedlang.run.measure import expected_outputs, output_indices

    args = random_inputs(op)
    job = _Job(
        f"{op.name}.so",
        args,
        expected_outputs(op, [a.copy() for a in args]),
        outputs=output_indices(op),
        names=[buffer.name for buffer in op.outputs],
    )
    return _run(job, executable, target, remote, repeat, min_repeat_ms, run_timeout_s, runner)


def run_model_on_board(
    executable: tvm.runtime.Executable,
    inputs: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    target: Target,
    remote: RemoteSettings,
    *,
    runner: RemoteRunner | None = None,
    repeat: int = 0,
    run_timeout_s: float = 120.0,
) -> Outcome:
    """A whole model's build (a Relax VM executable for `target`) run on a device leased under
    `remote.key`: `main` on `inputs`, its outputs (a tuple's items, in order) checked here against
    `expected`, then timed `repeat` times (0: verify only). As `run_on_board` otherwise."""
    job = _Job("model.so", list(inputs), list(expected), outputs=[], whole_model=True)
    return _run(job, executable, target, remote, repeat, 0, run_timeout_s, runner)


@dataclass(frozen=True)
class _Job:
    """What a MeasureJob is made of, before its files are written."""

    library: str  # the library's file name
    args: list
    expected: list
    outputs: list[int]
    names: list[str] | None = None
    whole_model: bool = False


def _run(
    job: _Job,
    executable: tvm.runtime.Executable,
    target: Target,
    remote: RemoteSettings,
    repeat: int,
    min_repeat_ms: int,
    run_timeout_s: float,
    runner: RemoteRunner | None,
) -> Outcome:
    import numpy as np

    from schedlang.run.remote import RemoteRunner
    from schedlang.run.sandbox import MeasureJob

    own = runner is None
    # One build's timing is shown, not ranked: an emulated board's, marked, is no error.
    runner = runner or RemoteRunner(
        replace(remote, emulated_ok=True), target, run_timeout_s, env={}
    )
    try:
        with tempfile.TemporaryDirectory(prefix="schedlang-board-") as work:
            work_dir = Path(work)
            np.savez(work_dir / "args.npz", *job.args)
            np.savez(work_dir / "expected.npz", *job.expected)
            library = export_for(executable, work_dir / job.library, target, remote.cc)
            measurement = MeasureJob(
                lib_path=str(library),
                args_path=str(work_dir / "args.npz"),
                expected_path=str(work_dir / "expected.npz"),
                outputs=job.outputs,
                device="cpu" if target.kind == "llvm" else target.kind,
                repeat=repeat,
                min_repeat_ms=min_repeat_ms,
                names=job.names,
                whole_model=job.whole_model,
            )
            return runner.run(measurement)
    finally:
        if own:
            runner.close()
