"""`schedlang eval-model`: score a model's schedules against the built-in proposer's."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from schedlang.cli.app import command, warn
from schedlang.cli.inputs import runnable_target_arg
from schedlang.cli.options import (
    ArchOpt,
    DbOpt,
    ExamplesOpt,
    ModelDbOpt,
    ModelMaxLengthOpt,
    ModelRuntimeOpt,
    SeedOpt,
    TargetOpt,
    TemperatureOpt,
    TopPOpt,
    expands_options,
    model_spec,
    option,
)
from schedlang.core.diagnostics import SchedlangError


@dataclass(frozen=True)
class ModelChoice:
    """The model scored: run here, or served by an OpenAI-compatible server."""

    model: str | None = option(
        None, "--model", help="A hub id or a folder of weights, run here (--model-runtime)."
    )
    endpoint: str | None = option(None, "--endpoint", help="An OpenAI-compatible server's URL.")
    model_name: str | None = option(
        None, "--model-name", help="--endpoint: the name the server serves."
    )
    runtime: ModelRuntimeOpt = "transformers"
    model_db: ModelDbOpt = None
    model_max_length: ModelMaxLengthOpt = None

    def served_name(self) -> str:
        """The model's name in its ModelSpec; a SchedlangError when the options do not say."""
        if self.endpoint and not (self.model_name or self.model):
            raise SchedlangError("--endpoint needs --model-name NAME: the model the server serves")
        if not self.endpoint and self.model_name:
            raise SchedlangError("--model-name goes with --endpoint URL; a local model is --model")
        if not self.endpoint and self.model is None:
            raise SchedlangError(
                "which model? give --model DIR|ID (run here) or --endpoint URL --model-name NAME"
            )
        served = (self.model_name or self.model) if self.endpoint else self.model
        return served  # type: ignore[return-value]


@dataclass(frozen=True)
class AskingOptions:
    """How the model is asked and its replies decoded (as `tune --proposer model`)."""

    decoding: str = option(
        "stepwise", "--decoding", help="stepwise, whole or none (see `tune --help`)."
    )
    temperature: TemperatureOpt = 0.6
    top_p: TopPOpt = 0.95
    max_new_tokens: int | None = option(None, "--max-new-tokens", min=16, help="Tokens per reply.")
    answer_tokens: int | None = option(
        None, "--answer-tokens", min=16, help="Of those, the answer's."
    )
    candidates_per_round: int = option(
        4, "--candidates-per-round", min=1, help="Answers asked per round."
    )
    hint: str | None = option(None, "--hint", help="Advice for the model.")
    examples: ExamplesOpt = "both"


@dataclass(frozen=True)
class RunOptions:
    """The other arms, and where the records and the report go."""

    metaschedule: bool = option(
        False,
        "--metaschedule/--no-metaschedule",
        help="Also tune with MetaSchedule (needs xgboost; minutes per op to start).",
    )
    db_path: DbOpt = None
    out: str = option(
        "eval.json",
        "--out",
        "-o",
        help="The report (JSON), written to OUT as named; its table beside it (OUT.json → "
        "OUT.md, any other name with .md added).",
    )
    work: str | None = option(
        None, "--work", help="Each arm's database (default: beside --out, OUT.runs/)."
    )
    label: str | None = option(None, "--label", help="The run's name in tables.")


@command("eval-model")
@expands_options
def eval_model_command(
    which: ModelChoice,
    ops: Annotated[
        list[str] | None,
        typer.Option(
            "--ops", help="Example names or op files, comma-separated (default: every example)."
        ),
    ] = None,
    define: Annotated[
        list[str] | None,
        typer.Option(
            "--define",
            "-D",
            help="A shape parameter of every op that has it (-D N=512) or of one (-D matmul.M=64).",
        ),
    ] = None,
    target: TargetOpt = "llvm",
    arch: ArchOpt = None,
    trials: Annotated[int, typer.Option("--trials", min=1, help="Trials per op and arm.")] = 32,
    seed: SeedOpt = 0,
    *,
    asking: AskingOptions,
    run: RunOptions,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option(
            "--compare", help="Compare two reports per op (A.json B.json).", metavar="A B"
        ),
    ] = None,
) -> None:
    """Score a model: per op, the model loop, the built-in proposer (and MetaSchedule) with the
    same trial budget; figures (JSON) to OUT as named (-o, eval.json by default), a table beside
    it (.md); records to the database."""
    from schedlang.llm import evaluate
    from schedlang.workflows.evaluation import evaluate_model

    if compare:
        first, second = (evaluate.load_report(path) for path in compare)
        table = evaluate.render_comparison(first, second, evaluate.compare(first, second))
        typer.echo(table, nl=False)
        return
    name = which.served_name()
    from schedlang.llm.proposer import DECODINGS

    if asking.decoding not in DECODINGS:
        raise SchedlangError(
            f"unknown decoding `{asking.decoding}`", f"one of: {', '.join(DECODINGS)}"
        )
    suite = evaluate.load_suite(ops or [], define or [])
    tgt = runnable_target_arg(target, arch)
    spec = model_spec(which, asking, model=name)
    evaluation = evaluate.Evaluation(
        suite,
        tgt,
        spec,
        trials=trials,
        seed=seed,
        out=Path(run.out),
        work=Path(run.work) if run.work else None,
        metaschedule=run.metaschedule,
        label=run.label,
    )
    result = evaluate_model(evaluation, run.db_path, events=_echo)
    typer.echo(result.markdown, nl=False)
    typer.echo(f"wrote {run.out} and {result.table}", err=True)


def _echo(event) -> None:
    """eval-model's progress: every line to stderr, warnings rendered."""
    (warn if event.warning else partial(typer.echo, err=True))(event.text)
