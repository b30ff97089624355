"""The commands on whole models (Relax): tune-model, build-model."""

from __future__ import annotations

import textwrap
from typing import Annotated

import typer

from schedlang.cli.app import command, emit_json, set_output, warn
from schedlang.cli.decoder import (
    DECODER_TRIALS,
    NAME_WIDTH,
    LengthsOpt,
    MaxLengthOpt,
    build_decoder_command,
    cut_legend,
    cut_names,
    for_decoder,
    parse_lengths,
    refuse_for_decoder,
    tune_decoder_command,
)
from schedlang.cli.inputs import runnable_target_arg, target_arg
from schedlang.cli.options import (
    BuildTimeoutOpt,
    CostModelOpt,
    DbOpt,
    EarlyStopOpt,
    FuseOpt,
    JsonOpt,
    MinRepeatMsOpt,
    ModelArg,
    RepeatOpt,
    RunTimeoutOpt,
    SeedOpt,
    TargetArgs,
    WarmStartOpt,
    WinogradOpt,
    expands_options,
)
from schedlang.cli.progress import TuneProgress
from schedlang.cli.tune import RpcOptions, say_how_to_go_on, say_why_it_stopped
from schedlang.core.diagnostics import SchedlangError, warning
from schedlang.core.units import format_seconds
from schedlang.workflows.events import run_steps


def load_model_arg(spec: str, defines: list[str] | None):
    """The Model of a model file, or a DecoderSource (a checkpoint folder, or a model function
    returning a transformers causal LM alone: schedlang.models.decoder.sources says the rule)."""
    from schedlang.core.ops import parse_defines, split_op_spec
    from schedlang.models.decoder.sources import open_model

    path, name = split_op_spec(spec)
    return open_model(path, parse_defines(defines or []), name=name)


@command("tune-model")
@expands_options
def tune_model_command(
    model_file: ModelArg,
    where: TargetArgs,
    rpc: RpcOptions,
    trials: Annotated[
        int | None,
        typer.Option(
            "--trials",
            min=1,
            help="Candidates in all, shared by the gradient task scheduler (default 64); a "
            "decoder: per kernel and length (default 8).",
        ),
    ] = None,
    early_stop: EarlyStopOpt = True,
    seed: SeedOpt = 0,
    db_path: DbOpt = None,
    fuse: FuseOpt = True,
    winograd: WinogradOpt = True,
    build_timeout: BuildTimeoutOpt = 120.0,
    run_timeout: RunTimeoutOpt = 60.0,
    repeat: RepeatOpt = 3,  # models.tune_model.REPEAT
    min_repeat_ms: MinRepeatMsOpt = 40,  # models.tune_model.MIN_REPEAT_MS
    cost_model: CostModelOpt = "off",
    warm_start: WarmStartOpt = True,
    lengths: LengthsOpt = None,
    max_length: MaxLengthOpt = None,
) -> None:
    """Tune every distinct PrimFunc of a model, the trials going where the model's time is; a
    decoder LLM's kernels at several lengths (docs/llm-tuning.md)."""
    from schedlang.models.decoder.sources import DecoderSource
    from schedlang.workflows.model_tuning import ModelTuneInterrupted, Settings, tune_model_steps

    measured_at = parse_lengths(lengths)  # a bad value refused before the model file runs
    model = load_model_arg(model_file, where.define)
    tgt = target_arg(where.target, where.arch)
    settings = Settings(
        seed=seed, build_timeout_s=build_timeout, run_timeout_s=run_timeout, repeat=repeat,
        min_repeat_ms=min_repeat_ms, cost_model=cost_model, early_stop=early_stop,
        remote=rpc.settings(),  # --rpc-tracker: each task measured on a board
    )  # fmt: skip
    if isinstance(model, DecoderSource):  # --- a decoder LLM: cli/decoder.py
        tune_decoder_command(
            model, tgt, db_path, lengths=measured_at, trials=trials or DECODER_TRIALS,
            max_length=max_length, settings=settings,
        )  # fmt: skip
        spec = " ".join([model_file, *(f"-D {d}" for d in where.define or [])])
        length = f" --max-length {max_length}" if max_length else ""
        typer.echo(f"build it with: schedlang build-model {spec}{length} --target {where.target}")
        return
    _refuse_options(model, model_file, measured_at, max_length)
    trials = trials or 64
    try:
        steps = tune_model_steps(
            model, tgt, db_path, trials=trials, settings=settings, fuse=fuse, winograd=winograd,
            warm_start=warm_start, lengths=measured_at,
        )  # fmt: skip
        result = run_steps(steps, TuneProgress(then=_show_model_event))
    except ModelTuneInterrupted as stopped:
        typer.echo(
            f"interrupted after {stopped.spent} of {stopped.trials} trials; every candidate "
            f"measured so far is kept in {stopped.db_path}",
            err=True,
        )
        say_how_to_go_on()
        raise typer.Exit(130) from None
    if result.states:
        _print_summary(result)
    _print_symbolic(result)
    say_why_it_stopped(result.stop)
    if not result.verified:
        typer.echo(
            f"error: no function of {model_file} got a verified schedule ({len(result.states)} "
            f"of {len(result.tasks)} tried); `--verbose` lists every reason",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(f"build it with: schedlang build-model {model_file} --target {where.target}")


def _refuse_options(model, model_file: str, lengths, max_length: int | None) -> None:
    """--max-length (a decoder's), or --lengths for a model without symbolic shapes: one line."""
    from schedlang.models.model_file import symbolic_lengths

    for_decoder(max_length=max_length)
    if lengths is not None and not symbolic_lengths(model.mod):
        raise SchedlangError(
            f"--lengths: {model_file} has no symbolic dimension to measure at lengths",
            "declare one: the model function returns (module, example_inputs, dynamic_shapes)",
        )


def _show_model_event(event) -> None:
    """A model's plans before its rounds, then each round as it ends."""
    from schedlang.workflows.events import KernelTuned, ModelPlanned, RoundDone

    if isinstance(event, ModelPlanned):
        _print_plans(event)
    elif isinstance(event, RoundDone):
        _print_turn(event.turn)
    elif isinstance(event, KernelTuned):
        _print_symbolic_task(event.choice)


def _print_plans(planned) -> None:
    """Each task: calls, flops, kind and templates; then the tasks no template covers."""
    from schedlang.core.opinfo import format_flops

    tasks, plans = planned.tasks, planned.plans
    typer.echo(
        f"model {planned.model}: {len(tasks)} task{'s' * (len(tasks) != 1)} on "
        f"{planned.target}, {planned.trials} trials in all"
    )
    cut = cut_names([task.name for task in tasks], NAME_WIDTH)  # 80 columns: names cut
    width = max(len(short) for short in cut.values())
    for task in tasks:
        found = plans[task.key]
        flops = format_flops(task.flops) if task.flops is not None else "? FLOP"
        what = ", ".join(found.templates) if found.templates else "no template"
        what += " (each on one thread first)" if found.serial else ""
        row = f"  {cut[task.name]:<{width}}  {task.calls} x {flops:>10}  {found.kind:<9}  "
        typer.echo(row + f"\n{' ' * len(row)}".join(textwrap.wrap(what, max(80 - len(row), 20))))
    for line in cut_legend(cut):
        typer.echo(line)
    uncovered = [task for task in tasks if not plans[task.key].templates]
    for task in uncovered:
        typer.echo(f"not tuned: {task.name}: {plans[task.key].why_none}", err=True)
    generic = [task.name for task in tasks if plans[task.key].generic_only]
    counts = [f"{len(tasks) - len(uncovered)} of {len(tasks)} tasks have templates"]
    if generic:
        counts.append(f"{len(generic)} only the generic one ({', '.join(generic)})")
    if uncovered:
        counts.append(f"{len(uncovered)} none")
    typer.echo("; ".join(counts))
    if planned.variables:
        at = ", ".join(map(str, planned.lengths))
        typer.echo(
            f"symbolic {', '.join(planned.variables)}: tuned at lengths {at}, one schedule "
            "for every length"
        )


def _print_symbolic_task(choice) -> None:
    """A function with symbolic extents: its template and its times at each length."""
    from schedlang.cli.decoder import micro

    name = cut_names([choice.name], NAME_WIDTH)[choice.name]
    times = " ".join(micro(t) for t in choice.times_s)
    if not choice.schedule.strip():
        why = choice.notes[0] if choice.notes else "no template applies"
        typer.echo(f"{name}: not tuned at lengths: {why}", err=True)
        return
    typer.echo(f"{name}: {choice.family} at every length, {times} us")


def _print_symbolic(result) -> None:
    """The symbolic variables and the lengths measured; the functions tuned at them."""
    if not result.variables:
        return
    for variable, measured in result.variables.items():
        typer.echo(f"symbolic variable {variable}: measured at {', '.join(map(str, measured))}")
    scheduled = sum(bool(choice.schedule.strip()) for choice in result.choices)
    typer.echo(
        f"{scheduled} of {len(result.choices)} symbolic functions got one schedule for every length"
    )


def _print_turn(turn) -> None:
    state, scheduler = turn.state, turn.scheduler
    name = state.task.name
    if turn.error is not None:
        typer.echo(f"{name}: not tuned: {turn.error.message}", err=True)
        return
    result = turn.result
    if result is None:
        typer.echo(f"{name}: every candidate of its templates is measured")
        return
    ok = sum(record.is_ok for record in result.records)
    best = (
        f"best {format_seconds(result.best.median_s)} ({result.best.gflops:.2f} GFLOP/s)"
        if result.best
        else "nothing verified"
    )
    total, unmeasured = scheduler.estimate_s()
    estimate = f"model ~ {format_seconds(total)}" if total else "model ~ ?"
    if unmeasured:
        estimate += f" ({unmeasured} task{'s' * (unmeasured != 1)} not yet timed)"
    moved = [r for r in result.records if "transferred_from" in getattr(r, "extra", {})]
    if moved:  # the warm start: points moved from similar tasks' best records
        sources = ", ".join(f"#{r.extra['transferred_from']}" for r in moved)
        won = result.best is not None and any(r.id == result.best.id for r in moved)
        best += f" (warm start from {sources}{': the best' if won else ''})"
    typer.echo(f"{name}: {len(result.records)} measured, {ok} ok, {best}; {estimate}")


def _print_summary(result) -> None:
    """Per task: its trials, best latency and share of the estimated model latency."""
    states, spent = result.states, result.trials
    total, unmeasured = result.estimate_s, result.unmeasured
    typer.echo(
        f"{spent} trials measured; by task (the model ~ {format_seconds(total)}: "
        "best times x calls):"
    )
    cut = cut_names([state.task.name for state in states], NAME_WIDTH)
    width = max(len(short) for short in cut.values())
    for state in sorted(states, key=lambda s: -(s.time_s or 0)):
        if state.time_s is None:
            what = state.error or "nothing verified"
        else:
            share = f"{state.time_s / total:6.1%}" if total else "   -  "
            what = f"{format_seconds(state.latency_s):>10} x {state.task.calls}  {share}"
        trials = f"{state.trials:>4} trial{'s' * (state.trials != 1)}"
        typer.echo(f"  {cut[state.task.name]:<{width}}  {trials:<11} {what}")
    if unmeasured:
        typer.echo(f"  ({unmeasured} task{'s' * (unmeasured != 1)} without a verified time)")


@command("build-model")
@expands_options
def build_model_command(
    model_file: ModelArg,
    where: TargetArgs,
    rpc: RpcOptions,
    db_path: DbOpt = None,
    output: Annotated[str | None, typer.Option("-o", help="Library to write (.so).")] = None,
    fuse: FuseOpt = True,
    winograd: WinogradOpt = True,
    fallback: Annotated[
        str,
        typer.Option(
            "--fallback",
            help="For functions without a record: auto (dlight on GPUs, none on CPUs), dlight "
            "or none.",
        ),
    ] = "auto",
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Verify, then time against tvm.compile's build and the model's frameworks.",
        ),
    ] = False,
    profile: Annotated[
        bool, typer.Option("--profile", help="Time each function of the build, call by call.")
    ] = False,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Timed repeats.")] = 5,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify",
            help="Run the build once and check its outputs against the model's reference (or "
            "tvm.compile's build) before anything is written; skipped where the target cannot "
            "run here.",
        ),
    ] = True,
    as_json: JsonOpt = False,
    max_length: MaxLengthOpt = None,
) -> None:
    """Build a Relax model with the database's best schedules; print what each function got; a
    decoder LLM with its kernels' schedules."""
    from schedlang.models.decoder.sources import DecoderSource
    from schedlang.workflows.model_build import build_model_steps

    set_output(json_output=as_json)
    remote = rpc.settings()  # --rpc-tracker: verified on a board instead of here
    runs = compare or profile
    tgt = (runnable_target_arg if runs else target_arg)(where.target, where.arch)
    model = load_model_arg(model_file, where.define)
    if isinstance(model, DecoderSource):  # --- a decoder LLM: cli/decoder.py
        refuse_for_decoder({"-o": bool(output), "--compare": compare, "--profile": profile})
        build_decoder_command(
            model, tgt, db_path, max_length=max_length, as_json=as_json,
            spec=" ".join([model_file, *(f"-D {d}" for d in where.define or [])]),
            show_built=_print_applied,
        )  # fmt: skip
        return
    for_decoder(max_length=max_length)
    shown = _BuildSteps(model.name, tgt.kind, as_json)
    steps = build_model_steps(
        model, tgt, db_path, output=output, fuse=fuse, winograd=winograd, fallback=fallback,
        verify=verify, compare=compare, profile=profile, repeat=repeat, remote=remote,
    )  # fmt: skip
    result = run_steps(steps, shown)
    if as_json:
        problems = [warning(p).to_json() for item in result.applied for p in item.warnings]
        emit_json({"ok": True, "diagnostics": problems, **result.as_json()})


class _BuildSteps:
    """build-model's steps printed as the workflow reports them (nothing but warnings with
    --json: the document comes at the end)."""

    def __init__(self, model: str, kind: str, as_json: bool):
        self.model, self.kind, self.as_json = model, kind, as_json

    def __call__(self, event) -> None:
        from schedlang.workflows.events import BuildStep, Note

        if isinstance(event, Note):
            (warn if event.warning else typer.echo)(event.text)
            return
        if not isinstance(event, BuildStep) or self.as_json:
            return
        if event.step == "built":
            _print_applied(self.model, self.kind, event.detail)
        elif event.step == "verified":
            typer.echo(f"outputs agree with {event.detail}")
        elif event.step == "not verified":
            warn(f"warning: not verified: {event.detail}")
        elif event.step == "wrote":
            typer.echo(f"wrote {event.detail}")
        elif event.step == "profiled":
            _print_profile(event.detail)
        elif event.step == "compared":
            _print_comparison(event.detail)


def _print_applied(model: str, kind: str, applied) -> None:
    width = max((len(a.function) for a in applied), default=0)
    typer.echo(f"model {model} on {kind}:")
    for item in applied:
        typer.echo(f"  {item.function:<{width}}  {item.summary()}")
        for problem in item.warnings:
            warn(warning(problem).render())
    tuned = sum(item.record is not None for item in applied)
    typer.echo(f"{tuned} of {len(applied)} functions scheduled from the database")


def _print_profile(profile) -> None:
    width = max([len("function"), *(len(row.function) for row in profile.rows)])
    typer.echo(f"profile, medians of {profile.repeat} runs of main:")
    typer.echo(f"  {'function':<{width}}  calls   per call      total   share  scheduled")
    for row in profile.rows:
        typer.echo(
            f"  {row.function:<{width}}  {row.calls:>5}  {format_seconds(row.per_call_s):>9}  "
            f"{format_seconds(row.total_s):>9}  {row.share:>6.1%}  {row.scheduled}"
        )
    typer.echo(f"  {'total':<{width}}  {'':>5}  {'':>9}  {format_seconds(profile.total_s):>9}")
    builtins = format_seconds(profile.builtins_s)
    typer.echo(f"  (and in the VM's builtins, allocation and checks: {builtins})")


def _print_comparison(comparison) -> None:
    threads = (
        f"{comparison.threads} thread{'s' * (comparison.threads != 1)} each"
        if comparison.threads
        else "the frameworks on the CPU, with their own threads"
    )
    typer.echo(
        f"outputs agree with {comparison.checked_against}; medians of {comparison.repeat} "
        f"timed runs ({threads}), min - max:"
    )
    width = max(len(row.label) for row in comparison.rows)
    tuned_s = comparison.tuned_s
    for row in comparison.rows:
        if row.skipped is not None:
            typer.echo(f"  {row.label:<{width}}  skipped: {row.skipped}")
            continue
        spread = f"{format_seconds(min(row.latencies))} - {format_seconds(max(row.latencies))}"
        factor = f"  ({row.median_s / tuned_s:.2f}x tuned)" if row is not comparison.rows[0] else ""
        median = format_seconds(row.median_s)
        typer.echo(f"  {row.label:<{width}} {median:>10}  {spread:>23}{factor}")
