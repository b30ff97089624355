"""tune-model and build-model on a decoder LLM (schedlang.models.decoder.sources.open_model
says which models are), and the options only a decoder takes: `--lengths`, `--max-length`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from schedlang.cli.app import emit_json, set_output, warn
from schedlang.cli.progress import TuneProgress
from schedlang.core.diagnostics import SchedlangError
from schedlang.workflows.events import run_steps

LengthsOpt = Annotated[
    str | None,
    typer.Option(
        "--lengths",
        help="The lengths a model's symbolic functions (a decoder's kernels) are measured at, "
        "e.g. 1,16,128,512 (default: those up to the maximum length, and the maximum itself "
        "when below 512).",
    ),
]
MaxLengthOpt = Annotated[
    int | None,
    typer.Option(
        "--max-length",
        help="A decoder: its KV cache's length (default: the model's maximum, at most 2048).",
    ),
]
DECODER_TRIALS = 8  # per kernel and length: tune-model's --trials on a decoder
NAME_WIDTH = 18  # a function's name in tune-model's tables (longer ones cut: cut_names)


def parse_lengths(text: str | None) -> tuple[int, ...] | None:
    """`--lengths 1,16,128` as integers; one error line for a value that is not positive."""
    if text is None:
        return None
    lengths = []
    for word in text.split(","):
        word = word.strip()
        if not word.isdigit() or int(word) < 1:
            raise SchedlangError(
                f"--lengths: `{word}` is not a positive integer (expected e.g. 1,16,128,512)"
            )
        lengths.append(int(word))
    return tuple(lengths)


def tune_decoder_command(
    decoder: Any, target: Any, db_path: str | None, *, lengths: tuple[int, ...] | None, **how: Any
) -> None:
    """tune-model on a decoder: each kernel's template and times as it is tuned, then the
    symbolic variables with the lengths measured, and the kernels left unscheduled with why."""
    from schedlang.workflows.decoder_model import tune_decoder_steps

    steps = tune_decoder_steps(
        decoder.source, target, db_path, name=decoder.name, lengths=lengths, **how
    )
    table = _KernelTable()
    result = run_steps(steps, TuneProgress(then=table))
    typer.echo(f"tuned {len(result.kernels)} kernels in {result.wall_s:.1f} s")
    for name in result.scheduled_before:
        typer.echo(f"not tuned: {name}, written scheduled (fixed block sizes)")
    for variable, measured in sorted(result.variables.items()):
        typer.echo(f"symbolic variable {variable}: measured at {', '.join(map(str, measured))}")
    for kernel in result.kernels:
        if not kernel.schedule.strip():
            why = kernel.notes[0] if kernel.notes else "no template applies"
            warn(f"unscheduled: {kernel.name}: {why}")
    for line in cut_legend(table.cut):
        typer.echo(line)
    scheduled = len(result.kernels) - len(result.unscheduled)
    typer.echo(f"{scheduled} of {len(result.kernels)} kernels scheduled")
    if not scheduled:
        typer.echo("error: no kernel of the decoder got a schedule", err=True)
        raise typer.Exit(1)


class _KernelTable:
    """A row per kernel as its choice comes, under a header the plan gives: at 80 columns."""

    def __init__(self) -> None:
        self.cut: dict[str, str] = {}

    def __call__(self, event: Any) -> None:
        from schedlang.workflows.events import DecoderPlanned, KernelTuned

        if isinstance(event, DecoderPlanned):
            typer.echo(
                f"decoder {event.model} on {event.target}: {event.kernels} kernels, a cache of "
                f"{event.max_length} tokens"
            )
            trials = f"{event.trials} trial{'s' * (event.trials != 1)}"
            at = ", ".join(map(str, event.lengths))
            typer.echo(f"lengths measured: {at} tokens; {trials} per kernel and length")
            head = f"  {'kernel':<{NAME_WIDTH}}  {'symbolic':<8}  {'template':<11}  "
            typer.echo(head + "us at each length (or static)")
        elif isinstance(event, KernelTuned):
            self._row(event.choice)

    def _row(self, choice: Any) -> None:
        self.cut.update(cut_names([choice.name], NAME_WIDTH))
        variables = ",".join(choice.variables) or "-"
        family = choice.family or "none"
        times = " ".join(micro(t) for t in choice.times_s)
        times += "" if choice.variables else " (static)"
        name = self.cut[choice.name]
        typer.echo(f"  {name:<{NAME_WIDTH}}  {variables:<8}  {family[:11]:<11}  {times}")


def micro(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    value = seconds * 1e6
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def build_decoder_command(
    decoder: Any,
    target: Any,
    db_path: str | None,
    *,
    spec: str,
    max_length: int | None,
    as_json: bool,
    show_built: Callable[[str, str, Any], None],
) -> None:
    """build-model on a decoder: built with the database's schedules, what each function got
    shown by `show_built` (build-model's own table)."""
    from schedlang.workflows.decoder_model import build_decoder_steps
    from schedlang.workflows.events import BuildStep, Note

    set_output(json_output=as_json)

    def show(event: Any) -> None:
        if isinstance(event, Note):
            (warn if event.warning else typer.echo)(event.text)
        elif isinstance(event, BuildStep) and not as_json:
            show_built(decoder.name, target.kind, event.detail)

    steps = build_decoder_steps(
        decoder.source, target, db_path, name=decoder.name, max_length=max_length
    )
    result = run_steps(steps, show)
    if as_json:
        emit_json({"ok": True, "diagnostics": [], **result.as_json()})
        return
    db = f" --db {db_path}" if db_path else ""
    length = f" --max-length {max_length}" if max_length else ""
    typer.echo(f"generate with it: schedlang generate {spec}{length}{db}")


def refuse_for_decoder(given: dict[str, bool]) -> None:
    """What build-model does only for a fixed-shape model, asked of a decoder: one error line."""
    asked = [option for option, value in given.items() if value]
    if asked:
        raise SchedlangError(
            f"{', '.join(asked)}: not for a decoder (yet): `schedlang generate MODEL --db DB` "
            "builds it with the same schedules, runs it and prints its tokens/s"
        )


def for_decoder(**given: object) -> None:
    """An option only a decoder takes, given for a fixed-shape model: one error line."""
    asked = [f"--{name.replace('_', '-')}" for name, value in given.items() if value is not None]
    if asked:
        raise SchedlangError(
            f"{', '.join(asked)}: for a decoder LLM only (a checkpoint folder, or a model "
            "function returning a transformers causal LM alone)"
        )


# --- names cut to fit a table at 80 columns (tune-model's tables too) ---------------------------


def cut_names(names: list[str], width: int) -> dict[str, str]:
    """Each name as a table shows it: as it is up to `width` characters, else its head and its
    tail (where fused names differ: their numbers) around `~`; `cut_legend` lists the full ones."""
    cut = {}
    for name in names:
        if len(name) <= width:
            cut[name] = name
        else:
            tail = (width - 1) // 2
            cut[name] = f"{name[: width - 1 - tail]}~{name[-tail:]}"
    return cut


def cut_legend(cut: dict[str, str]) -> list[str]:
    """A line per name the table cut: `short = full name`."""
    return [f"  {short} = {name}" for name, short in cut.items() if short != name]
