"""One kernel verified and timed on a device leased from a TVM RPC tracker: `schedlang run
--rpc-tracker`.

    outcome = run_on_board(op, executable, target, remote, repeat=5)

The kernel is built here for the board's target and linked by its cross compiler
(schedlang.run.cross); the op's reference is computed here; then the remote runner that tuning
uses (schedlang.run.remote) leases a device, uploads the library, runs it once, checks its outputs
here and times it with the board's time evaluator: one candidate, one lease.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang.run.cross import export_for

if TYPE_CHECKING:
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
    import numpy as np

    from schedlang.core.ops import random_inputs
    from schedlang.run.measure import expected_outputs, output_indices
    from schedlang.run.remote import RemoteRunner
    from schedlang.run.sandbox import MeasureJob

    own = runner is None
    # One schedule's timing is shown, not ranked: an emulated board's, marked, is no error.
    runner = runner or RemoteRunner(
        replace(remote, emulated_ok=True), target, run_timeout_s, env={}
    )
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
