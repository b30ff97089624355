"""What a tuning run did, as data: the `tune --json` document (docs/cli.md), and the run that
Ctrl-C stopped, read back from the database."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schedlang.core.diagnostics import error
from schedlang.store.db import Database
from schedlang.store.records import Record, op_key

if TYPE_CHECKING:  # the tuner imports TVM
    from schedlang.tuning.tune import TuneResult


def tune_summary(op, tgt, db: Database, records: list[Record], trials: int, *, plot: str | None):
    """The `tune --json` document (docs/cli.md), less what only a finished run knows."""
    best = next(iter(db.best(op_key(op.func), tgt.key)), None)
    return {
        "ok": True,
        "interrupted": False,
        "stopped": None,
        "refused": None,
        "op": op.name,
        "target": tgt.kind,
        "db": str(db.path),
        "run_id": None,
        "trials": trials,
        "measured": len(records),
        "verified": sum(r.is_ok for r in records),
        "failed": sum(not r.is_ok for r in records),
        "reused": None,
        "wall_s": None,
        "baseline": None,
        "best": best.to_json() if best is not None else None,
        "records": [
            {
                "id": r.id,
                "status": r.status.value,
                "gflops": r.gflops,
                "median_s": r.median_s,
                "knobs": r.knobs,
                "proposer": r.proposer,
                "reason": r.reason,
            }
            for r in records
        ],
        "plot": plot,
        "diagnostics": [],
    }


def finished_summary(
    op, tgt, db: Database, result: TuneResult, trials: int, *, plot: str | None
) -> tuple[dict, str | None]:
    """The `tune --json` document of a finished run, and why it failed as a whole (None when it
    did not)."""
    summary = tune_summary(op, tgt, db, result.records, trials, plot=plot)
    summary.update(run_id=result.run_id, reused=result.reused, wall_s=round(result.wall_s, 3))
    summary["baseline"] = baseline_json(result.baseline)
    summary["stopped"] = result.stop.reason if result.stop is not None else None
    summary["refused"] = sum(result.refused.values())
    failure = nothing_verified(result, summary)
    if failure:
        summary.update(ok=False, diagnostics=[error(failure).to_json()])
    return summary, failure


def nothing_verified(result: TuneResult, summary: dict) -> str | None:
    """Why a tuning run failed as a whole: after it, the database holds no verified schedule for
    the op and target (every candidate it measured failed, or it found only failures there)."""
    if summary["best"] is not None:
        return None
    statuses = Counter(str(r.status) for r in result.records)
    kinds = ", ".join(f"{n} {status}" for status, n in statuses.most_common())
    measured = f"{len(result.records)} measured" + (f" ({kinds})" if kinds else "")
    also = f"; {result.reused} found in the database had failed before" if result.reused else ""
    if refused := sum(result.refused.values()):  # the screen's: never built, so never measured
        common = sorted(result.refused.items(), key=lambda item: -item[1])[:3]
        reasons = "; ".join(f"{why} ({n})" for why, n in common)
        also += f"; {refused} refused by the checker before building: {reasons}"
    return (
        f"no candidate verified: {measured}{also}, and the database holds no verified schedule "
        "for this op and target; `--verbose` lists every reason, and "
        "`schedlang check OP SCHEDULE` shows a schedule's problems"
    )


def baseline_json(record: Record | None) -> dict | None:
    if record is None:
        return None
    return {
        "status": record.status.value,
        "gflops": record.gflops,
        "median_s": record.median_s,
        "reason": record.reason,
    }


@dataclass
class InterruptedRun:
    """The run Ctrl-C stopped, as the database holds it."""

    started: float  # time.time() when the command started the run
    run_id: int | None
    records: list[Record]  # measured in this run, in order; not the baseline
    baseline: Record | None
    kept: int  # records of the op on the target in the database, from every run

    def summary(self, op, tgt, db: Database, trials: int, *, plot: str | None) -> dict:
        """The `tune --json` document of the interrupted run (a plot only if it has records)."""
        summary = tune_summary(
            op, tgt, db, self.records, trials, plot=plot if self.records else None
        )
        summary.update(
            ok=False,
            interrupted=True,
            run_id=self.run_id,
            wall_s=round(time.time() - self.started, 3),
            baseline=baseline_json(self.baseline),
        )
        return summary


def interrupted_run(op, tgt, db: Database, started: float) -> InterruptedRun:
    """Rebuild the run begun at `started` (the last one since) from the database."""
    key = op_key(op.func)
    runs = [run for run in db.runs(key, tgt.key) if run["started_at"] >= started - 1]
    run_id = runs[-1]["id"] if runs else None
    records, baseline = [], None
    for record in db.records(key, tgt.key):
        if run_id is None or record.extra.get("run_id") != run_id:
            continue
        if record.extra.get("baseline"):
            baseline = record
        else:
            records.append(record)
    return InterruptedRun(started, run_id, records, baseline, db.count(key, tgt.key))
