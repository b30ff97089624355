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
    schedule, its latency and rank (docs/cli.md, "Learning from the database")."""
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


@command("train")
def train_command(
    source: Annotated[
        str, typer.Argument(help="A tuning database, or a dataset (`schedlang dataset`).")
    ],
    out: Annotated[str, typer.Option("--out", "-o", help="The model's folder.")],
    base: Annotated[
        str | None,
        typer.Option("--base", help="LoRA on this causal LM (a folder) instead of from scratch."),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps in all.")] = 300,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Pairs per step.")] = 8,
    learning_rate: Annotated[
        float | None,
        typer.Option("--lr", help="Peak learning rate (default 2e-3 from scratch, 2e-4 LoRA)."),
    ] = None,
    seed: SeedOpt = 0,
    checkpoint_every: Annotated[
        int, typer.Option("--checkpoint-every", min=1, help="Steps between checkpoints.")
    ] = 100,
    resume: Annotated[
        bool, typer.Option("--resume", help="Go on from the folder's checkpoint.")
    ] = False,
    hidden_size: Annotated[
        int, typer.Option("--hidden-size", min=8, help="From scratch: the model's width.")
    ] = 128,
    layers: Annotated[int, typer.Option("--layers", min=1, help="From scratch: its layers.")] = 4,
    quiet: QuietOpt = False,
) -> None:
    """Train a model that writes schedules: a small Qwen2 from scratch, or LoRA on --base; the
    folder works with `--proposer model --model DIR` and `eval-model --model DIR`."""
    from schedlang.cli.app import set_output
    from schedlang.learn.train import TrainSettings, train

    set_output(quiet=quiet)
    settings = TrainSettings(
        steps=steps, batch=batch, learning_rate=learning_rate, seed=seed,
        checkpoint_every=checkpoint_every, base=base, hidden_size=hidden_size, layers=layers,
    )  # fmt: skip
    with _loss_bar(quiet) as progress:
        result = train(Path(source), Path(out), settings, resume=resume, progress=progress)
    losses = result.losses
    info(
        f"{result.steps} steps on {result.samples} samples in {result.seconds:.0f} s: loss "
        f"{losses[0]:.3f} -> {sum(losses[-10:]) / len(losses[-10:]):.3f} (the last 10 steps)"
        + (f"; {result.skipped} pairs longer than the limit left out" if result.skipped else "")
    )
    info(f"wrote {out}: use it with --proposer model --model {out}")


def _loss_bar(quiet: bool):
    """A progress bar with the loss, on stderr; a callback for `train`."""
    import contextlib

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    if quiet:
        return contextlib.nullcontext(None)
    bar = Progress(
        TextColumn("training"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(),
        console=Console(stderr=True), transient=False,
    )  # fmt: skip
    task = bar.add_task("train", total=None, loss="-")

    @contextlib.contextmanager
    def running():
        with bar:
            yield lambda step, steps, loss: bar.update(
                task, completed=step, total=steps, loss=f"{loss:.3f}"
            )

    return running()
