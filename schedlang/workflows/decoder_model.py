"""A decoder LLM tuned and built: the workflows behind `tune-model` and `build-model` when the
model is a decoder (schedlang.models.decoder.sources.open_model says when).

    from schedlang.workflows.decoder_model import build_decoder, tune_decoder

    tuning = tune_decoder("checkpoint/", target, "decoder.db", lengths=(1, 16), trials=4)
    for kernel in tuning.kernels:
        print(kernel.summary())
    built = build_decoder("checkpoint/", target, "decoder.db")
    built.decoder.generate([1, 2, 3], new_tokens=8)

Tuning reports a DecoderPlanned event, then a KernelTuned event per kernel as its schedule is
chosen (schedlang.models.decoder.tuning); the build a BuildStep "built" with what each function
got. `tune_decoder_steps` and `build_decoder_steps` hand the events to the caller one by one.
`proposer_decoder` is what `--proposer model --model-runtime schedlang` runs the model on.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from schedlang.tuning.settings import Settings
from schedlang.workflows.database import DatabaseArg, database
from schedlang.workflows.events import (
    BuildStep,
    DecoderPlanned,
    Event,
    Events,
    KernelTuned,
    Steps,
    as_events,
    ignore,
    run_steps,
)

if TYPE_CHECKING:
    from schedlang.core.target import Target
    from schedlang.models.decoder.session import Decoder
    from schedlang.models.decoder.tuning import DecoderTuning
    from schedlang.models.graph import Applied


def tune_decoder(
    source: Any, target: Target, db: DatabaseArg = None, *, events: Events = ignore, **how: Any
) -> DecoderTuning:
    """`tune_decoder_steps` run to its end, each event to `events`."""
    steps = tune_decoder_steps(source, target, db, **how)
    return run_steps(steps, events)


def tune_decoder_steps(
    source: Any,
    target: Target,
    db: DatabaseArg = None,
    *,
    name: str = "decoder",
    lengths: Sequence[int] | None = None,
    trials: int = 8,
    max_length: int | None = None,
    settings: Settings | None = None,
) -> Steps[DecoderTuning]:
    """Every kernel of the decoder of `source` (what `decoder.load` takes) tuned: `trials`
    candidates per kernel and length, at `lengths` (default: `default_lengths` of the cache's
    length, `max_length` or the model's maximum), the choices in `db` (open, or its path)."""
    return Steps(_tune(source, target, db, name, lengths, trials, max_length, settings))


def _tune(
    source: Any,
    target: Target,
    db: DatabaseArg,
    name: str,
    lengths: Sequence[int] | None,
    trials: int,
    max_length: int | None,
    settings: Settings | None,
) -> Generator[Event, None, DecoderTuning]:
    from schedlang.models.decoder import check_length
    from schedlang.models.decoder.tuning import (
        check_lengths,
        decoder_module,
        default_lengths,
        kernel_choices,
    )
    from schedlang.models.graph import extract_tasks

    check_length("trials", trials)
    mod, max_length = decoder_module(source, max_length)
    lengths = check_lengths(default_lengths(max_length) if lengths is None else lengths, max_length)
    kernels = len(extract_tasks(mod, target))
    yield DecoderPlanned(name, target.kind, kernels, max_length, lengths, trials)
    notes: list[Event] = []
    with database(db, events=notes.append) as opened:
        yield from notes
        steps = kernel_choices(
            mod, max_length, target, opened, lengths=lengths,
            settings=replace(settings or Settings(), trials=trials),
        )  # fmt: skip
        return (yield from as_events(steps, KernelTuned))


@dataclass(frozen=True)
class DecoderBuildResult:
    """A decoder built with a database's schedules: the Decoder, ready to generate."""

    model: str
    decoder: Any  # models.decoder.Decoder
    applied: list[Applied]  # what each PrimFunc got, in module order
    target: str  # the target's kind

    def as_json(self) -> dict:
        """The `build-model --json` document of a decoder, less its head and diagnostics."""
        functions = [{"function": a.function, "scheduled": a.summary(), "how": a.how}
                     for a in self.applied]  # fmt: skip
        config = self.decoder.config
        return {"model": self.model, "target": self.target, "decoder": config.architecture,
                "max_length": self.decoder.max_length, "functions": functions}  # fmt: skip


def build_decoder(
    source: Any, target: Target, db: DatabaseArg = None, *, events: Events = ignore, **how: Any
) -> DecoderBuildResult:
    """`build_decoder_steps` run to its end, each event to `events`."""
    return run_steps(build_decoder_steps(source, target, db, **how), events)


def build_decoder_steps(
    source: Any,
    target: Target,
    db: DatabaseArg = None,
    *,
    name: str = "decoder",
    max_length: int | None = None,
) -> Steps[DecoderBuildResult]:
    """The decoder of `source` built with `db`'s schedules (`load_tuned`; a kernel without a
    record keeps TVM's default), its weights loaded. `db`: open, or its path (None: the default
    one; read only, and a missing file reads as empty, with a Note)."""
    return Steps(_build(source, target, db, name, max_length))


def _build(
    source: Any, target: Target, db: DatabaseArg, name: str, max_length: int | None
) -> Generator[Event, None, DecoderBuildResult]:
    from schedlang.models.decoder.tuning import load_tuned

    notes: list[Event] = []
    with database(db, read_only=True, missing_ok=True, events=notes.append) as opened:
        yield from notes
        decoder, applied = load_tuned(source, opened, max_length, target)
    yield BuildStep("built", applied)
    return DecoderBuildResult(name, decoder, applied, target.kind)


def proposer_decoder(folder: str, db: str | None, max_length: int) -> Decoder:
    """What `--proposer model --model-runtime schedlang` runs (schedlang.llm.compiled, which
    sits below models and is handed this): the checkpoint's decoder for this CPU with a cache of
    `max_length` tokens, built with the schedules of the tuning database at `db` (read only; a
    missing file is an error) or unscheduled without one. A record applies where it was tuned at
    the same length (`tune-model --max-length`)."""
    from schedlang.models.decoder import load
    from schedlang.models.decoder.tuning import load_tuned

    if db is None:
        return load(folder, max_length)
    with database(db, read_only=True) as opened:
        decoder, _ = load_tuned(folder, opened, max_length)
    return decoder
