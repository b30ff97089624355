"""Evaluating a model as a proposer: the workflow behind `schedlang eval-model`.

    from schedlang.workflows import evaluate_model

    result = evaluate_model(Evaluation(suite, target, spec, trials=8), db)
    print(result.markdown)

Per op, the model loop and the built-in proposer (and MetaSchedule when asked) tune with the same
budget, each arm in its own database (schedlang.llm.evaluate); every line of its progress is a Note.
`evaluate_model_steps` is the same evaluation, its events handed to the caller one by one.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang.workflows.database import DatabaseArg, database
from schedlang.workflows.events import Event, Note, Steps, as_events, run_to_end

if TYPE_CHECKING:
    from schedlang.llm.evaluate import Evaluation


@dataclass(frozen=True)
class EvalResult:
    """An evaluation's report, its table, and the files both were written to."""

    report: dict
    markdown: str
    out: Path  # the report, JSON
    table: Path  # the table, markdown, beside it


def evaluate_model_steps(evaluation: Evaluation, db: DatabaseArg = None) -> Steps[EvalResult]:
    """Run every arm of `evaluation` on every op (going on from what its work folder holds), add
    the records to `db` (open, or its path; None: the default database), and write the report
    after each op. Each line of progress (an op begun, an arm's candidate measured) is a Note."""
    return Steps(_evaluate(evaluation, db))


evaluate_model = run_to_end(evaluate_model_steps)


def _evaluate(evaluation: Evaluation, db: DatabaseArg) -> Generator[Event, None, EvalResult]:
    from schedlang.llm import evaluate
    from schedlang.workflows.decoder_model import proposer_decoder

    notes: list[Note] = []
    with database(db, events=notes.append) as opened:
        yield from notes
        report = yield from as_events(
            evaluate.evaluation_steps(evaluation, opened, proposer_decoder), Note
        )
    return EvalResult(
        report,
        evaluate.markdown(report),
        evaluation.out,
        evaluate.table_path(evaluation.out),
    )
