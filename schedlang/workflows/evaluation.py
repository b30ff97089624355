"""Evaluating a model as a proposer: the workflow behind `schedlang eval-model`.

    from schedlang.workflows import evaluate_model

    result = evaluate_model(Evaluation(suite, target, spec, trials=8), db)
    print(result.markdown)

Per op, the model loop and the built-in proposer (and MetaSchedule when asked) tune with the same
budget, each arm in its own database (schedlang.llm.evaluate); every line of its progress is a Note.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang.workflows.database import DatabaseArg, database
from schedlang.workflows.events import Events, Note, ignore

if TYPE_CHECKING:
    from schedlang.llm.evaluate import Evaluation


@dataclass(frozen=True)
class EvalResult:
    """An evaluation's report, its table, and the files both were written to."""

    report: dict
    markdown: str
    out: Path  # the report, JSON
    table: Path  # the table, markdown, beside it


def evaluate_model(
    evaluation: Evaluation, db: DatabaseArg = None, *, events: Events = ignore
) -> EvalResult:
    """Run every arm of `evaluation` on every op (going on from what its work folder holds), add
    the records to `db` (open, or its path; None: the default database), and write the report
    after each op."""
    from schedlang.llm import evaluate
    from schedlang.workflows.decoder_model import proposer_decoder

    with database(db, events=events) as opened:
        report = evaluate.run_evaluation(
            evaluation, opened, lambda text: events(Note(text)), build=proposer_decoder
        )
    return EvalResult(
        report,
        evaluate.markdown(report),
        evaluation.out,
        evaluate.table_path(evaluation.out),
    )
