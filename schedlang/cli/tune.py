"""`schedlang tune`: search an op's schedule templates, measuring candidates into the database."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Annotated

import typer

from schedlang.cli.app import OUTPUT, command, emit_json, info, print_schedule, set_output
from schedlang.cli.inputs import (
    display_name,
    load_op_arg,
    open_db,
    read_text,
    runnable_target_arg,
    target_arg,
)
from schedlang.cli.options import (
    BuildTimeoutOpt,
    CostModelOpt,
    DbOpt,
    ExamplesOpt,
    JsonOpt,
    MinRepeatMsOpt,
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
)
from schedlang.core.diagnostics import SchedlangError
from schedlang.core.units import format_seconds


@dataclass(frozen=True)
class SearchOptions:
    """What `tune` searches, how long it may take, and where its results go."""

    trials: Annotated[int, typer.Option("--trials", min=1, help="Candidates to measure.")] = 32
    template: Annotated[
        list[str] | None,
        typer.Option("--template", help="A .sched template (repeatable); as TEMPLATE..."),
    ] = None
    proposer: Annotated[
        str, typer.Option("--proposer", help="builtin, or model (see `schedlang tune --help`).")
    ] = "builtin"
    seed: SeedOpt = 0
    warm_start: WarmStartOpt = True
    db_path: DbOpt = None
    build_timeout: BuildTimeoutOpt = 120.0
    run_timeout: RunTimeoutOpt = 60.0
    repeat: RepeatOpt = 5
    min_repeat_ms: MinRepeatMsOpt = 100
    plot: Annotated[str | None, typer.Option("--plot", help="Write a tuning curve (PNG) here.")] = (
        None
    )
    show_templates: Annotated[
        bool, typer.Option("--show-templates", help="Print the templates being searched.")
    ] = False


@dataclass(frozen=True)
class ModelOptions:
    """`--proposer model`: the model, how it is asked, and how its replies are decoded."""

    model: Annotated[
        str, typer.Option("--model", help="--proposer model: a hub id or a folder of weights.")
    ] = "WeiboAI/VibeThinker-1.5B"
    endpoint: Annotated[
        str | None,
        typer.Option("--endpoint", help="--proposer model: an OpenAI-compatible server's URL."),
    ] = None
    hint: Annotated[
        str | None,
        typer.Option(
            "--hint",
            help="Advice for the model; for the built-in proposer, templates it names go first.",
        ),
    ] = None
    candidates_per_round: Annotated[
        int, typer.Option("--candidates-per-round", min=1, help="--proposer model: answers asked.")
    ] = 4
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-new-tokens",
            min=16,
            help="--proposer model: tokens per reply, reasoning included (default: 8192 on a "
            "GPU or a server, 768 for a local model on a CPU).",
        ),
    ] = None
    answer_tokens: Annotated[
        int | None,
        typer.Option(
            "--answer-tokens",
            min=16,
            help="--proposer model: of --max-new-tokens, those for the answer (the rest is for "
            "reasoning; default 1024 on a GPU or a server, 256 on a CPU).",
        ),
    ] = None
    decoding: Annotated[
        str,
        typer.Option(
            "--decoding",
            help="--proposer model: stepwise (each statement constrained by the checker's "
            "state, then checked), whole (one grammar for the whole answer), or none.",
        ),
    ] = "stepwise"
    log_prompts: Annotated[
        str | None,
        typer.Option("--log-prompts", help="--proposer model: write every prompt and reply here."),
    ] = None
    temperature: TemperatureOpt = 0.6
    top_p: TopPOpt = 0.95
    examples: ExamplesOpt = "both"


@dataclass(frozen=True)
class RpcOptions:
    """`--rpc-tracker`: measure on devices leased from a TVM RPC tracker."""

    rpc_tracker: RpcTrackerOpt = None
    rpc_key: RpcKeyOpt = None
    rpc_devices: Annotated[
        int | None,
        typer.Option("--rpc-devices", help="--rpc-tracker: devices measuring at once (all free)."),
    ] = None
    rpc_cc: Annotated[
        str | None,
        typer.Option("--rpc-cc", help="--rpc-tracker: cross compiler, e.g. aarch64-linux-gnu-g++."),
    ] = None
    rpc_timeout: Annotated[
        float, typer.Option("--rpc-timeout", help="--rpc-tracker: seconds to wait for a device.")
    ] = 60.0
    rpc_emulated_ok: Annotated[
        bool,
        typer.Option(
            "--rpc-emulated-ok", help="--rpc-tracker: record an emulated board's timings (marked)."
        ),
    ] = False

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
    from schedlang.propose.interface import Proposal
    from schedlang.tuning.tune import Settings

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
    proposer = _proposer(search, model_options, templates)
    if search.show_templates:
        _show_templates(op, tgt, templates)
    if search.plot:
        from schedlang.tuning.plot import require_matplotlib

        require_matplotlib()  # before tuning, not after
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
    )
    if remote is not None:
        info(f"measuring on devices `{remote.key}` of the RPC tracker {remote.tracker}")
    with open_db(search.db_path) as db:
        _tune_and_report(op, tgt, db, settings, templates, proposer, search, model_options.hint)


def _proposer(search: SearchOptions, model_options: ModelOptions, templates: list):
    """The proposer `--proposer` names; for a local model, how long it will take, on stderr."""
    from schedlang.llm.spec import make_proposer

    chosen = make_proposer(
        search.proposer,
        templates,
        model=model_spec(model_options),
        seed=search.seed,
        log_prompts=model_options.log_prompts,
    )
    if not search.warm_start and hasattr(chosen, "transfers"):
        chosen.transfers = 0  # the built-in proposer, cold
    if search.proposer == "model" and not model_options.endpoint:
        limits, backend = chosen.limits, chosen.backend  # a ModelProposer
        info(backend.expected_time(limits.statements, limits.step_tokens))
    return chosen


def _show_templates(op, tgt, templates: list) -> None:
    """`--show-templates`: the templates searched (on stderr with --json)."""
    from schedlang.propose.builtin import BuiltinProposer
    from schedlang.propose.interface import Context

    for proposal in templates or BuiltinProposer().templates(Context(op, tgt)):
        header = "" if proposal.text.lstrip().startswith("#") else f"# {proposal.note}\n"
        typer.echo(header + proposal.text, err=OUTPUT.json)


def _tune_and_report(op, tgt, db, settings, templates, proposer, search, hint) -> None:
    """Tune with a progress bar, then print the summary (or the JSON document); exit 1 when
    nothing verified, 130 on Ctrl-C."""
    from schedlang.tuning.summary import finished_summary

    started = time.time()
    try:
        result = tune_with_progress(
            op, tgt, db, settings=settings, templates=templates, proposer=proposer, hint=hint
        )
    except KeyboardInterrupt:
        _interrupted(op, tgt, db, started, search.trials, search.plot, settings.remote)
        raise typer.Exit(130) from None
    summary, failure = finished_summary(op, tgt, db, result, search.trials, plot=search.plot)
    if search.plot:
        _write_plot(op, tgt, db, result.records, result.baseline, search.plot, settings.remote)
    if OUTPUT.json:
        emit_json(summary)
    else:
        if OUTPUT.verbose:
            for line in db.decisions(result.run_id):
                typer.echo(f"  decision: {line}", err=True)
        _print_tune_summary(op, tgt, db, result)
        if search.plot:
            info(f"wrote {search.plot}")
    if failure:
        if not OUTPUT.json:
            typer.echo(f"error: {failure}", err=True)
        raise typer.Exit(1)


def _interrupted(op, tgt, db, started: float, trials: int, plot: str | None, remote) -> None:
    """Ctrl-C during `tune`: say what was kept, draw what there is, and how to go on."""
    from schedlang.tuning.summary import interrupted_run

    run = interrupted_run(op, tgt, db, started)
    records, kept = run.records, run.kept
    summary = run.summary(op, tgt, db, trials, plot=plot)
    if plot and records:
        _write_plot(op, tgt, db, records, run.baseline, plot, remote, note=" (interrupted)")
    if OUTPUT.json:
        emit_json(summary)
    measured = f"{len(records)} candidate{'s' * (len(records) != 1)} measured in this run"
    typer.echo(
        f"interrupted: {measured}; {kept} record{'s' * (kept != 1)} of {op.name} on {tgt.kind} "
        f"kept in {db.path}",
        err=True,
    )
    if plot and records:
        typer.echo(f"wrote the partial tuning curve to {plot}", err=True)
    say_how_to_go_on()


def say_how_to_go_on() -> None:
    """After Ctrl-C: the same command goes on where it stopped."""
    typer.echo(
        "rerun the same command to go on: measured candidates are read back from the database, "
        "not measured again",
        err=True,
    )


def _write_plot(op, tgt, db, records, baseline, plot: str, remote, *, note: str = "") -> None:
    """The tuning curve with its baselines (schedlang.tuning.plot.baselines); a baseline that
    cannot be measured is left out with a note."""
    from schedlang.tuning.plot import baselines, tuning_curve

    lines = baselines(op, tgt, db, baseline, local=remote is None, note=info)
    tuning_curve(records, plot, title=f"{op.name} on {tgt.kind}{note}", baselines=lines)


def tune_with_progress(
    op, tgt, db, *, settings, templates=(), proposer=None, hint=None, workers=None
):
    """`tune` with a progress bar (a line per candidate when stderr is not a terminal)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]tuning {task.fields[op]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best {task.fields[best]}  failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    )
    from rich.console import Console

    # On stderr, so that stdout holds only the result (`tune --json > summary.json`).
    terminal = sys.stderr.isatty()
    console = Console(stderr=True)
    with Progress(*columns, console=console, disable=not terminal or OUTPUT.quiet) as bar:
        task = bar.add_task("tune", total=settings.trials, op=op.name, best="-", failed=0)

        def update(progress) -> None:
            best = f"{progress.best.gflops:.1f} GFLOP/s" if progress.best else "-"
            bar.update(task, completed=progress.done, best=best, failed=progress.failures)
            if OUTPUT.quiet or progress.last is None:
                return
            if not terminal or OUTPUT.verbose:  # --verbose: a line per candidate on a terminal too
                last = progress.last
                figure = f"{last.gflops:.2f} GFLOP/s" if last.gflops else last.reason
                typer.echo(f"[{progress.done}/{progress.total}] {last.status}: {figure}", err=True)

        from schedlang.tuning.tune import tune

        return tune(
            op,
            tgt,
            db,
            settings=settings,
            templates=templates,
            proposer=proposer,
            hint=hint,
            on_progress=update,
            workers=workers,
        )


def _print_tune_summary(op, tgt, db, result) -> None:
    from rich.console import Console
    from rich.table import Table

    from schedlang.store.records import op_key

    best = next(iter(db.best(op_key(op.func), tgt.key)), None)
    if OUTPUT.quiet:  # the result alone: the best schedule
        if best is not None:
            print_schedule(best.schedule.rstrip())
        return
    ok = [r for r in result.records if r.is_ok]
    table = Table(
        title=f"{op.name} on {tgt.kind}: {len(result.records)} measured, "
        f"{len(ok)} ok, {result.reused} reused, {result.wall_s:.0f} s"
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

    from schedlang.propose import builtin

    describe = getattr(builtin, "describe_templates", None)
    if describe is None:
        raise SchedlangError(
            "this version of the built-in proposer cannot list its templates "
            "(schedlang.propose.builtin.describe_templates is missing)"
        )
    templates = describe()
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
