"""A measurement as a database record: made with the versions and GFLOP/s, saved (saying what
was lost when the database refuses), and a record's schedule read back."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import schedule_names
from schedlang.core.ops import Op
from schedlang.core.target import Target
from schedlang.lang import nodes
from schedlang.lang.syntax import parse
from schedlang.propose.interface import Proposal
from schedlang.run.outcome import Outcome
from schedlang.store.db import Database
from schedlang.store.records import Record, Status, current_versions, op_key
from schedlang.tuning.search import Candidate


def save_record(db: Database, record: Record) -> int:
    """db.add; if the database refuses (locked too long, deleted, damaged), the error also says
    which measurement it did not save, since the tuner stops there."""
    try:
        return db.add(record)
    except SchedlangError as err:
        result = f"{record.gflops:.2f} GFLOP/s" if record.gflops else str(record.status)
        schedule = "; ".join(line.strip() for line in record.schedule.splitlines() if line.strip())
        err.notes = (*err.notes, f"not saved: the candidate just measured ({result}): {schedule}")
        raise


def measured_record(
    op, target, candidate: Candidate, outcome: Outcome, flops: int, seed: int, run_id: int
) -> Record:
    extra = {**candidate.extra, **outcome.extra, "run_id": run_id}
    extra["names"] = schedule_names(op.func)  # what the schedule names: see schedlang.models.graph
    if outcome.diagnostics:
        extra["diagnostics"] = outcome.diagnostics
    return _new_record(
        op, target, candidate.text, candidate.proposer, seed, outcome.status, outcome.reason, extra,
        knobs=candidate.knobs, template=candidate.template, latencies=outcome.latencies_s,
        flops=flops,
    )  # fmt: skip


def unparsed_record(
    op, target, proposal: Proposal, diagnostics: str, seed: int, run_id: int
) -> Record:
    """The record of a proposal that does not parse; it keeps its run id, as a measured one
    does."""
    reason = diagnostics.splitlines()[0] if diagnostics else "does not parse"
    extra = {**proposal.extra, "diagnostics": diagnostics, "run_id": run_id}
    return _new_record(
        op, target, proposal.text, proposal.proposer, seed, Status.CHECK_ERROR, reason, extra
    )


def _new_record(
    op: Op,
    target: Target,
    schedule: str,
    proposer: str,
    seed: int,
    status: Status,
    reason: str,
    extra: dict,
    *,
    knobs: dict[str, int] | None = None,
    template: str | None = None,
    latencies: Sequence[float] = (),
    flops: int = 0,
) -> Record:
    """A record made now, with the versions of schedlang and TVM; GFLOP/s from the median."""
    median = float(np.median(latencies)) if latencies else None
    schedlang_version, tvm_version = current_versions()
    return Record(
        op_key=op_key(op.func),
        op_name=op.name,
        target_key=target.key,
        target=target.tvm_config,
        schedule=schedule,
        knobs=knobs or {},
        template=template,
        status=status,
        reason=reason,
        latencies_s=tuple(latencies),
        median_s=median,
        gflops=flops / median / 1e9 if median else None,
        proposer=proposer,
        seed=seed,
        created_at=time.time(),
        schedlang_version=schedlang_version,
        tvm_version=tvm_version,
        extra=extra,
    )


def record_schedule(record: Record) -> nodes.Schedule:
    """A record's schedule, parsed; diagnostics name the record (`<db #12>`)."""
    return parse(record.schedule, f"<db #{record.id}>")
