"""Options and arguments that several commands take, each declared once.

An alias (`TargetOpt`, `DbOpt`, …) is one option with its flags and help; a group (a dataclass
whose fields are aliases, e.g. `ScheduleArgs`) is options that go together. A command takes a
group as one parameter and `@expands_options` spreads its fields into the command line, in the
place of that parameter, so `--help` lists them as if written out.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])


def complete_target(incomplete: str) -> list[str]:
    # Shell completion: commands, options and targets complete from here; a file argument offers
    # no words, and the shell's script (`--install-completion`) then completes it as a file.
    from schedlang.core.presets import PRESETS

    return [kind for kind in ("llvm", "cuda", *PRESETS) if kind.startswith(incomplete)]


QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="Errors only on stderr: no progress, no notes.")
]
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v", help="More detail (each candidate, the tuner's decisions, tracebacks)."
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout (see docs/cli.md).")
]


OpArg = Annotated[
    str,
    typer.Argument(
        help="An op file (FILE.py or FILE.py:NAME).",
        metavar="OP",
    ),
]
TargetOpt = Annotated[
    str,
    typer.Option(
        "--target",
        "-t",
        help="llvm (this CPU), cuda, a JSON target dict or file.",
        autocompletion=complete_target,
    ),
]
ArchOpt = Annotated[str | None, typer.Option("--arch", help="GPU architecture, e.g. sm_90.")]
DefineOpt = Annotated[
    list[str] | None, typer.Option("--define", "-D", help="A shape parameter: -D N=512.")
]
KnobOpt = Annotated[list[str] | None, typer.Option("--knob", "-k", help="A knob value: -k TI=32.")]
# Every command that takes a schedule takes it the same way: `OP [SCHEDULE]`, `-s TEXT` inline,
# `--schedule FILE` as an alias of the positional (issue 15, item 7).
ScheduleArg = Annotated[
    str | None,
    typer.Argument(
        help="The .sched file; - for stdin.",
        metavar="SCHEDULE",
    ),
]
ScheduleOpt = Annotated[
    str | None,
    typer.Option(
        "--schedule",
        help="The .sched file, as an option (the same as the SCHEDULE argument).",
    ),
]
TextOpt = Annotated[str | None, typer.Option("-s", "--text", help="A schedule given inline.")]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Treat warnings (e.g. guards TVM adds) as errors.")
]


DbOpt = Annotated[
    str | None,
    typer.Option("--db", help="The tuning database (default: $SCHEDLANG_DB or the user cache)."),
]
RpcTrackerOpt = Annotated[
    str | None,
    typer.Option("--rpc-tracker", help="Measure on devices leased from this TVM RPC tracker."),
]
RpcKeyOpt = Annotated[
    str | None, typer.Option("--rpc-key", help="--rpc-tracker: the devices' key, e.g. rasp4.")
]


ModelArg = Annotated[str, typer.Argument(help="A model file (FILE.py or FILE.py:NAME).")]
FuseOpt = Annotated[
    bool, typer.Option("--fuse/--no-fuse", help="Fuse operators as tvm.compile does (default).")
]
WinogradOpt = Annotated[
    bool,
    typer.Option(
        "--winograd/--no-winograd",
        help="On CPUs, compute 3x3 convolutions with constant weights by Winograd F(4x4, 3x3) "
        "(default); a function of its own to tune.",
    ),
]


MsDbOpt = Annotated[
    str | None,
    typer.Option("--ms-db", help="A MetaSchedule database folder (JSONDatabase work_dir)."),
]


SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of every random decision.")]
CostModelOpt = Annotated[
    str,
    typer.Option(
        "--cost-model",
        help="off, lightgbm or auto (LightGBM when installed): rank knob points by a model "
        "trained on the measured ones before building them.",
    ),
]
EarlyStopOpt = Annotated[
    bool,
    typer.Option(
        "--early-stop/--no-early-stop",
        help="Stop once the best (a model's estimate) has gained under 1% over the last 64 "
        "trials, and say so; --no-early-stop spends every --trials.",
    ),
]
ExamplesOpt = Annotated[
    str,
    typer.Option(
        "--examples",
        help="A model's prompt shows: the best verified schedules of similar ops in the database, "
        "moved to the op's names (retrieved), the fixed examples (static), or both.",
    ),
]
WarmStartOpt = Annotated[
    bool,
    typer.Option(
        "--warm-start/--no-warm-start",
        help="The built-in proposer starts a new op from the best records of similar ops on the "
        "same target (default).",
    ),
]
BuildTimeoutOpt = Annotated[float, typer.Option("--build-timeout", help="Seconds.")]
RunTimeoutOpt = Annotated[float, typer.Option("--run-timeout", help="Seconds.")]
RepeatOpt = Annotated[
    int, typer.Option("--repeat", min=1, help="Timed repeats of each candidate; the median counts.")
]
MinRepeatMsOpt = Annotated[
    int,
    typer.Option("--min-repeat-ms", min=0, help="Each repeat runs the kernel at least this long."),
]
TemperatureOpt = Annotated[float, typer.Option("--temperature", min=0.0)]
TopPOpt = Annotated[float, typer.Option("--top-p", min=0.0, max=1.0)]
ModelRuntimeOpt = Annotated[
    str,
    typer.Option(
        "--model-runtime",
        help="A model run here runs on transformers (default), or on schedlang's own build of "
        "it (schedlang: a Qwen2 or Llama checkpoint folder, built at start).",
    ),
]
ModelMaxLengthOpt = Annotated[
    int | None,
    typer.Option(
        "--model-max-length",
        min=1,
        help="--model-runtime schedlang: the KV cache's length, prompt and reply (default: the "
        "model's maximum, at most 4096; --model-db's records apply where tuned at this length).",
    ),
]
ModelDbOpt = Annotated[
    str | None,
    typer.Option(
        "--model-db",
        help="--model-runtime schedlang: build the model with this tuning database's schedules "
        "(`schedlang tune-model CHECKPOINT --db DB`); without it, unscheduled.",
    ),
]


@dataclasses.dataclass(frozen=True)
class ScheduleArgs:
    """An op, its schedule and the target: how check, compile, run and export take them."""

    op_file: OpArg
    schedule_file: ScheduleArg = None
    text: TextOpt = None
    schedule_option: ScheduleOpt = None
    target: TargetOpt = "llvm"
    arch: ArchOpt = None
    define: DefineOpt = None
    knob: KnobOpt = None


@dataclasses.dataclass(frozen=True)
class TargetArgs:
    """The target and the op's shape parameters: how best, tune, tune-model and build-model
    take them."""

    target: TargetOpt = "llvm"
    arch: ArchOpt = None
    define: DefineOpt = None


@dataclasses.dataclass(frozen=True)
class Verbosity:
    """--quiet and --verbose, on top of the global ones (schedlang.cli.app.set_output)."""

    quiet: QuietOpt = False
    verbose: VerboseOpt = False


def option(default: Any, *flags: str, help: str, **extra: Any) -> Any:
    """A field of an options group declared on one line: its default, flags and help; its type
    is the field's annotation (`@expands_options` puts the two together for typer)."""
    return dataclasses.field(
        default=default, metadata={"option": typer.Option(*flags, help=help, **extra)}
    )


def expands_options(function: F) -> F:
    """Spread each parameter of `function` annotated with an options group (a dataclass) into
    the group's fields, for typer; the call gets the group built from them. A group parameter has
    no default (its fields have theirs): first, or after a `*`."""
    signature = inspect.signature(function, eval_str=True)
    groups: dict[str, tuple[type, list[str]]] = {}
    parameters: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        group = parameter.annotation
        if not (isinstance(group, type) and dataclasses.is_dataclass(group)):
            parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            continue
        hints = typing.get_type_hints(group, include_extras=True)
        fields = dataclasses.fields(group)
        groups[parameter.name] = (group, [field.name for field in fields])
        for field in fields:
            default = field.default
            if default is dataclasses.MISSING:
                default = inspect.Parameter.empty
            kind = inspect.Parameter.KEYWORD_ONLY
            annotation = hints[field.name]
            if "option" in field.metadata:  # declared with `option`
                annotation = Annotated[annotation, field.metadata["option"]]
            parameters.append(
                inspect.Parameter(field.name, kind, default=default, annotation=annotation)
            )

    @functools.wraps(function)
    def call(**kwargs: Any) -> Any:
        for name, (group, names) in groups.items():
            kwargs[name] = group(**{field: kwargs.pop(field) for field in names})
        return function(**kwargs)

    call.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in parameters}
    return call  # type: ignore[return-value]


def model_spec(*groups: Any, model: str | None = None):
    """The ModelSpec (schedlang.llm.spec) that a command's option groups describe: each of its
    fields from the option of that name; `model` for the one a server serves."""
    from schedlang.llm.spec import ModelSpec

    given = {
        field.name: getattr(group, field.name)
        for field in dataclasses.fields(ModelSpec)
        for group in groups
        if hasattr(group, field.name)
    }
    return ModelSpec(**{**given, **({"model": model} if model is not None else {})})
