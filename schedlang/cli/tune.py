"""`schedlang tune`: search an op's schedule templates, measuring candidates into the database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from schedlang.cli.app import OUTPUT, command, emit_json, info, print_schedule, set_output
from schedlang.cli.inputs import (
    display_name,
    load_op_arg,
    read_text,
    runnable_target_arg,
    target_arg,
)
from schedlang.cli.options import (
    BuildTimeoutOpt,
    CostModelOpt,
    DbOpt,
    EarlyStopOpt,
    ExamplesOpt,
    JsonOpt,
    MinRepeatMsOpt,
    ModelDbOpt,
    ModelMaxLengthOpt,
    ModelRuntimeOpt,
    RepeatOpt,
    RpcKeyOpt,
    RpcTrackerOpt,
    RunTimeoutOpt,
    SeedOpt,
    TargetArgs,
    TemperatureOpt,
    TopPOpt,
    Verbosity,
    WarmStartOpt,
    expands_options,
    model_spec,
    option,
)
from schedlang.cli.progress import TuneProgress
from schedlang.core.units import format_seconds
from schedlang.workflows.events import run_steps


@dataclass(frozen=True)
class SearchOptions:
    """What `tune` searches, how long it may take, and where its results go."""

    trials: int = option(32, "--trials", min=1, help="Candidates to measure.")
    early_stop: EarlyStopOpt = True
    template: list[str] | None = option(
        None, "--template", help="A .sched template (repeatable); as TEMPLATE..."
    )
    proposer: str = option(
        "builtin", "--proposer", help="builtin, or model (see `schedlang tune --help`)."
    )
    seed: SeedOpt = 0
    warm_start: WarmStartOpt = True
    db_path: DbOpt = None
    build_timeout: BuildTimeoutOpt = 120.0
    run_timeout: RunTimeoutOpt = 60.0
    repeat: RepeatOpt = 5
    min_repeat_ms: MinRepeatMsOpt = 100
    plot: str | None = option(None, "--plot", help="Write a tuning curve (PNG) here.")
    show_templates: bool = option(
        False, "--show-templates", help="Print the templates being searched."
    )


@dataclass(frozen=True)
class ModelOptions:
    """`--proposer model`: the model, how it is asked, and how its replies are decoded."""

    model: str = option(
        "WeiboAI/VibeThinker-1.5B",
        "--model",
        help="--proposer model: a hub id or a folder of weights.",
    )
    endpoint: str | None = option(
        None, "--endpoint", help="--proposer model: an OpenAI-compatible server's URL."
    )
    hint: str | None = option(
        None,
        "--hint",
        help="Advice for the model; for the built-in proposer, templates it names go first.",
    )
    candidates_per_round: int = option(
        4, "--candidates-per-round", min=1, help="--proposer model: answers asked."
    )
    max_new_tokens: int | None = option(
        None,
        "--max-new-tokens",
        min=16,
        help="--proposer model: tokens per reply, reasoning included (default: 8192 on a "
        "GPU or a server, 768 for a local model on a CPU).",
    )
    answer_tokens: int | None = option(
        None,
        "--answer-tokens",
        min=16,
        help="--proposer model: of --max-new-tokens, those for the answer (the rest is for "
        "reasoning; default 1024 on a GPU or a server, 256 on a CPU).",
    )
    decoding: str = option(
        "stepwise",
        "--decoding",
        help="--proposer model: stepwise (each statement constrained by the checker's "
        "state, then checked), whole (one grammar for the whole answer), or none.",
    )
    log_prompts: str | None = option(
        None, "--log-prompts", help="--proposer model: write every prompt and reply here."
    )
    temperature: TemperatureOpt = 0.6
    top_p: TopPOpt = 0.95
    examples: ExamplesOpt = "both"
    runtime: ModelRuntimeOpt = "transformers"
    model_db: ModelDbOpt = None
    model_max_length: ModelMaxLengthOpt = None


@dataclass(frozen=True)
class RpcOptions:
    """`--rpc-tracker`: measure on devices leased from a TVM RPC tracker."""

    rpc_tracker: RpcTrackerOpt = None
    rpc_key: RpcKeyOpt = None
    rpc_devices: int | None = option(
        None, "--rpc-devices", help="--rpc-tracker: devices measuring at once (all free)."
    )
    rpc_cc: str | None = option(
        None, "--rpc-cc", help="--rpc-tracker: cross compiler, e.g. aarch64-linux-gnu-g++."
    )
    rpc_timeout: float = option(
        60.0, "--rpc-timeout", help="--rpc-tracker: seconds to wait for a device."
    )
    rpc_emulated_ok: bool = option(
        False,
        "--rpc-emulated-ok",
        help="--rpc-tracker: record an emulated board's timings (marked).",
    )

    def settings(self):
        """schedlang.run.remote's settings, None without --rpc-tracker."""
        from schedlang.run.remote import remote_settings

        return remote_settings(
            self.rpc_tracker,
            self.rpc_key,
            self.rpc_devices,
            self.rpc_cc,
            self.rpc_timeout,
            emulated_ok=self.rpc_emulated_ok,
        )


@command("tune")
@expands_options
def tune_command(
    op_file: Annotated[
        str | None,
        typer.Argument(help="An op file (FILE.py or FILE.py:NAME).", metavar="OP"),
    ] = None,
    template_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Templates (or schedules) to search instead of the built-in proposer's.",
            metavar="TEMPLATE",
        ),
    ] = None,
    *,
    where: TargetArgs,
    search: SearchOptions,
    model_options: ModelOptions,
    rpc: RpcOptions,
    cost_model: CostModelOpt = "off",
    list_templates: Annotated[
        bool,
        typer.Option(
            "--list-templates",
            help="List the op shapes the built-in proposer has templates for (no OP needed).",
        ),
    ] = False,
    as_json: JsonOpt = False,
    talk: Verbosity,
) -> None:
    """Tune an op: search schedule templates by measuring candidates; results go to the database.

    Ctrl-C stops it: what was measured stays in the database (and in the --plot curve), and the
    same command run again goes on from there."""
    from schedlang.workflows.op_tuning import Proposal, Settings, expected_time, proposer_named

    set_output(json_output=as_json, quiet=talk.quiet, verbose=talk.verbose)
    if list_templates:
        _list_templates()
        return
    if op_file is None:
        raise typer.BadParameter("missing: give the op to tune", param_hint="'OP'")
    remote = rpc.settings()
    op = load_op_arg(op_file, where.define)
    tgt = (target_arg if remote else runnable_target_arg)(where.target, where.arch)
    templates = [
        Proposal(read_text(path), "template", note=display_name(path))
        for path in [*(template_args or []), *(search.template or [])]
    ]
    proposer = proposer_named(
        search.proposer,
        templates,
        model=model_spec(model_options),
        seed=search.seed,
        log_prompts=model_options.log_prompts,
        warm_start=search.warm_start,
    )
    if (waiting := expected_time(proposer)) is not None:
        info(waiting)
    if search.show_templates:
        _show_templates(op, tgt, templates)
    settings = Settings(
        trials=search.trials,
        seed=search.seed,
        build_timeout_s=search.build_timeout,
        run_timeout_s=search.run_timeout,
        repeat=search.repeat,
        min_repeat_ms=search.min_repeat_ms,
        remote=remote,
        # The model is told each candidate's speedup over the unscheduled build.
        baseline=search.proposer == "model",
        cost_model=cost_model,
        early_stop=search.early_stop,
    )
    if remote is not None:
        info(f"measuring on devices `{remote.key}` of the RPC tracker {remote.tracker}")
    _tune_and_report(op, tgt, settings, templates, proposer, search, model_options.hint)


def _show_templates(op, tgt, templates: list) -> None:
    """`--show-templates`: the templates searched (on stderr with --json)."""
    from schedlang.workflows.queries import templates_for

    for proposal in templates or templates_for(op, tgt):
        header = "" if proposal.text.lstrip().startswith("#") else f"# {proposal.note}\n"
        typer.echo(header + proposal.text, err=OUTPUT.json)


def _tune_and_report(op, tgt, settings, templates, proposer, search, hint) -> None:
    """Tune with a progress bar, then print the summary (or the JSON document); exit 1 when
    nothing verified, 130 on Ctrl-C."""
    from schedlang.workflows.op_tuning import TuneInterrupted, tune_op_steps

    try:
        steps = tune_op_steps(
            op, tgt, search.db_path, settings=settings, templates=templates, proposer=proposer,
            hint=hint, plot=search.plot,
        )  # fmt: skip
        result = run_steps(steps, TuneProgress())
    except TuneInterrupted as stopped:
        _interrupted(op.name, tgt.kind, stopped)
        raise typer.Exit(130) from None
    if OUTPUT.json:
        emit_json(result.summary)
    else:
        if OUTPUT.verbose:
            for line in result.decisions:
                typer.echo(f"  decision: {line}", err=True)
        _print_tune_summary(result)
        say_why_it_stopped(result.run.stop)
        if search.plot:
            info(f"wrote {search.plot}")
    if result.failure:
        if not OUTPUT.json:
            typer.echo(f"error: {result.failure}", err=True)
        raise typer.Exit(1)


def _interrupted(name: str, kind: str, stopped) -> None:
    """Ctrl-C during `tune`: say what was kept, where the curve went, and how to go on."""
    for note in stopped.notes:
        info(note.text)
    if OUTPUT.json:
        emit_json(stopped.summary)
    count, kept = stopped.measured, stopped.kept
    measured = f"{count} candidate{'s' * (count != 1)} measured in this run"
    typer.echo(
        f"interrupted: {measured}; {kept} record{'s' * (kept != 1)} of {name} on {kind} "
        f"kept in {stopped.db_path}",
        err=True,
    )
    if stopped.plot:
        typer.echo(f"wrote the partial tuning curve to {stopped.plot}", err=True)
    say_how_to_go_on()


def say_why_it_stopped(stop) -> None:
    """After a run that stopped before its --trials (issue 48): why, and how to go on."""
    if stop is not None and not OUTPUT.quiet:
        typer.echo(f"stopped: {stop.reason}; --no-early-stop spends every --trials")


def say_how_to_go_on() -> None:
    """After Ctrl-C: the same command goes on where it stopped."""
    typer.echo(
        "rerun the same command to go on: measured candidates are read back from the database, "
        "not measured again",
        err=True,
    )


def _print_tune_summary(result) -> None:
    from rich.console import Console
    from rich.table import Table

    best = result.best
    if OUTPUT.quiet:  # the result alone: the best schedule
        if best is not None:
            print_schedule(best.schedule.rstrip())
        return
    ok = [r for r in result.records if r.is_ok]
    table = Table(
        title=f"{result.op} on {result.target}: {len(result.records)} measured, "
        f"{len(ok)} ok, {result.run.reused} reused, {result.run.wall_s:.0f} s"
    )
    for column in ("#", "GFLOP/s", "median", "status", "knobs"):
        table.add_column(column)
    top = sorted(ok, key=lambda r: r.median_s or 1e9)[:5]
    for index, record in enumerate(top, 1):
        knobs = " ".join(f"{k}={v}" for k, v in record.knobs.items())
        table.add_row(
            str(index),
            f"{record.gflops:.2f}",
            format_seconds(record.median_s),
            str(record.status),
            knobs,
        )
    Console(soft_wrap=True).print(table)
    failed = [r for r in result.records if not r.is_ok]
    for record in failed if OUTPUT.verbose else failed[:5]:
        typer.echo(f"  {record.status}: {record.reason}")
    if len(failed) > 5 and not OUTPUT.verbose:
        typer.echo(f"  … and {len(failed) - 5} more failures (--verbose lists them)")
    if best is not None:
        typer.echo(f"best ({best.gflops:.2f} GFLOP/s, {format_seconds(best.median_s)}):")
        print_schedule(best.schedule.rstrip())


def _list_templates() -> None:
    """`tune --list-templates`: the kinds of template the built-in proposer writes, per target, in
    the order it tries them, with the op shapes each matches and its knobs."""
    import textwrap
    from dataclasses import asdict

    from schedlang.workflows.queries import template_catalog

    templates = template_catalog()
    if OUTPUT.json:
        emit_json({"ok": True, "templates": [asdict(t) for t in templates], "diagnostics": []})
        return
    headings = {"cpu": "CPU (--target llvm)", "gpu": "GPU (--target cuda)"}
    for kind in dict.fromkeys(t.target for t in templates):
        typer.echo(f"{headings.get(kind, kind)}, in the order they are tried:")
        for t in (t for t in templates if t.target == kind):
            space = f"up to {t.space} knob points{' per block' if t.per_block else ''}"
            typer.echo(f"  {t.name}  ({space})")
            for label, text in (("matches: ", t.matches), ("knobs:   ", t.knobs)):
                typer.echo(
                    textwrap.fill(
                        text,
                        width=100,
                        initial_indent=f"    {label}",
                        subsequent_indent=" " * (4 + len(label)),
                        break_on_hyphens=False,
                    )
                )
        typer.echo("")
    typer.echo("`schedlang tune OP --show-templates` prints the ones written for an op.")
