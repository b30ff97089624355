"""`schedlang dataset` and `schedlang train`: the database as a dataset, a model trained on it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from schedlang.cli.app import command, info
from schedlang.cli.options import QuietOpt, SeedOpt


@command("dataset")
def dataset_command(
    db_path: Annotated[str, typer.Argument(help="The tuning database.", metavar="DB")],
    out: Annotated[str, typer.Option("--out", "-o", help="The dataset (JSON lines).")],
    split: Annotated[
        float | None,
        typer.Option(
            "--split",
            help="Hold out this fraction of the ops (every record of each) as `test`.",
        ),
    ] = None,
    seed: SeedOpt = 0,
    quiet: QuietOpt = False,
) -> None:
    """Write one JSON line per verified record of the database: the op, the target's facts, the
    schedule, its latency and rank (docs/llm.md, "Learning from the database")."""
    from schedlang.cli.app import set_output
    from schedlang.cli.inputs import open_db
    from schedlang.learn.dataset import build_samples, split_by_op, write_dataset

    set_output(quiet=quiet)
    with open_db(db_path, read_only=True) as db:
        samples, report = build_samples(db)
    if split is not None:
        samples = split_by_op(samples, split, seed)
        test = [s for s in samples if s.split == "test"]
        from dataclasses import replace

        report = replace(report, test_ops=len({s.op_key for s in test}), test_samples=len(test))
    write_dataset(samples, Path(out))
    for line in report.lines():
        info(line)
    info(f"wrote {out}")
