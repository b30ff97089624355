"""The commands on whole models (Relax): tune-model, build-model."""

from __future__ import annotations

from typing import Annotated

import typer

from schedlang.cli.app import command, emit_json, set_output, warn
from schedlang.cli.inputs import open_db, runnable_target_arg, target_arg
from schedlang.cli.options import (
    BuildTimeoutOpt,
    CostModelOpt,
    DbOpt,
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
from schedlang.cli.tune import say_how_to_go_on, tune_with_progress
from schedlang.core.diagnostics import SchedlangError, warning
from schedlang.core.units import format_seconds


def load_model_arg(spec: str, defines: list[str] | None):
    from schedlang.core.ops import parse_defines, split_op_spec
    from schedlang.models.model_file import load_model

    path, name = split_op_spec(spec)
    return load_model(path, parse_defines(defines or []), name=name)


@command("tune-model")
@expands_options
def tune_model_command(
    model_file: ModelArg,
    where: TargetArgs,
    trials: Annotated[
        int,
        typer.Option(
            "--trials", min=1, help="Candidates in all, shared by the gradient task scheduler."
        ),
    ] = 64,
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
) -> None:
    """Tune every distinct PrimFunc of a model, the trials going where the model's time is."""
    from schedlang.models.tune_model import model_tasks, plan_tasks, tune_model
    from schedlang.tuning.tune import Settings

    model = load_model_arg(model_file, where.define)
    tgt = target_arg(where.target, where.arch)
    tasks = model_tasks(model, tgt, fuse=fuse, winograd=winograd)
    plans, proposers = plan_tasks(tasks, tgt)
    if not warm_start:
        for proposer in proposers.values():
            proposer.transfers = 0
    _print_plans(model.name, tgt, tasks, plans, trials)
    settings = Settings(
        seed=seed,
        build_timeout_s=build_timeout,
        run_timeout_s=run_timeout,
        repeat=repeat,
        min_repeat_ms=min_repeat_ms,
        cost_model=cost_model,
    )
    tuned_tasks = [task for task in tasks if plans[task.key].templates]
    scheduler = None
    with open_db(db_path) as db:
        _keep_model(db, model, tgt, tasks)
        try:
            for turn in tune_model(
                tuned_tasks, tgt, db, settings, trials=trials, proposers=proposers,
                tune_task=tune_with_progress,
            ):  # fmt: skip
                scheduler = turn.scheduler
                _print_turn(turn)
        except KeyboardInterrupt:
            spent = scheduler.measured if scheduler else 0
            typer.echo(
                f"interrupted after {spent} of {trials} trials; every candidate measured so far "
                f"is kept in {db.path}",
                err=True,
            )
            say_how_to_go_on()
            raise typer.Exit(130) from None
    states = scheduler.states if scheduler else []
    if states:
        _print_summary(scheduler)
    if not any(state.latency_s is not None for state in states):
        typer.echo(
            f"error: no function of {model_file} got a verified schedule ({len(states)} of "
            f"{len(tasks)} tried); `--verbose` lists every reason",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(f"build it with: schedlang build-model {model_file} --target {where.target}")


def _keep_model(db, model, tgt, tasks) -> None:
    """The model and its tasks in the database, for `schedlang report`'s chart of its time."""
    from schedlang.models.graph import model_key

    described = [{"key": t.key, "name": t.name, "calls": t.calls, "flops": t.flops} for t in tasks]
    db.add_model(model_key(model.mod), model.name, tgt.key, described)


def _keep_timings(db_path: str | None, model, tgt, comparison) -> None:
    """`--compare`'s latencies in the database (for `schedlang report`), when it can be written;
    a database that cannot be is a warning: the comparison is printed all the same."""
    from pathlib import Path

    from schedlang.models.graph import model_key
    from schedlang.store.db import default_db_path

    if not Path(db_path or default_db_path()).is_file():
        return  # built without a database: none is started for this
    timings = [
        {"label": row.label, "median_s": row.median_s, "skipped": row.skipped}
        for row in comparison.rows
    ]
    try:
        with open_db(db_path) as db:
            db.add_model_timings(model_key(model.mod), tgt.key, timings)
    except SchedlangError as err:
        warn(warning(f"the latencies are not kept in the database: {err.message}").render())


def _print_plans(name, tgt, tasks, plans, trials: int) -> None:
    """Each task: calls, flops, kind and templates; then the tasks no template covers."""
    from schedlang.core.opinfo import format_flops

    typer.echo(
        f"model {name}: {len(tasks)} task{'s' * (len(tasks) != 1)} on {tgt.kind}, "
        f"{trials} trials in all"
    )
    width = max(len(task.name) for task in tasks)
    for task in tasks:
        found = plans[task.key]
        flops = format_flops(task.flops) if task.flops is not None else "? FLOP"
        what = ", ".join(found.templates) if found.templates else "no template"
        what += " (each on one thread first)" if found.serial else ""
        typer.echo(f"  {task.name:<{width}}  {task.calls} x {flops:>10}  {found.kind:<9}  {what}")
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


def _print_summary(scheduler) -> None:
    """Per task: its trials, best latency and share of the estimated model latency."""
    states, spent = scheduler.states, scheduler.measured
    total, unmeasured = scheduler.estimate_s()
    typer.echo(
        f"{spent} trials measured; by task (the model ~ {format_seconds(total)}, "
        "its tasks' best times their calls):"
    )
    width = max(len(state.task.name) for state in states)
    for state in sorted(states, key=lambda s: -(s.time_s or 0)):
        if state.time_s is None:
            what = state.error or "nothing verified"
        else:
            share = f"{state.time_s / total:6.1%}" if total else "   -  "
            what = f"{format_seconds(state.latency_s):>10} x {state.task.calls}  {share}"
        trials = f"{state.trials:>4} trial{'s' * (state.trials != 1)}"
        typer.echo(f"  {state.task.name:<{width}}  {trials:<11} {what}")
    if unmeasured:
        typer.echo(f"  ({unmeasured} task{'s' * (unmeasured != 1)} without a verified time)")


@command("build-model")
@expands_options
def build_model_command(
    model_file: ModelArg,
    where: TargetArgs,
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
) -> None:
    """Build a Relax model with the database's best schedules; print what each function got."""
    import warnings

    from schedlang.run.measure import set_runtime_threads

    set_output(json_output=as_json)
    runs = compare or profile
    tgt = (runnable_target_arg if runs else target_arg)(where.target, where.arch)
    set_runtime_threads(tgt.cores if not tgt.is_gpu else None)
    from schedlang.models.graph import StaleRecordWarning, build_model
    from schedlang.run.build import export

    model = load_model_arg(model_file, where.define)
    with open_db(db_path, read_only=True, missing_ok=True) as db, warnings.catch_warnings():
        warnings.simplefilter("ignore", StaleRecordWarning)  # printed from the report below
        executable, applied = build_model(
            model.mod, tgt, db, fuse=fuse, winograd=winograd, fallback=fallback
        )
    document = {"model": model.name, "target": tgt.kind, "functions": _applied_json(applied)}
    if not as_json:
        _print_applied(model, tgt, applied)
    if verify and not compare:  # --compare verifies, against the default build too
        document["verified"] = _verify(model, tgt, executable, as_json)
    if output:
        document["library"] = str(export(executable, output))
        if not as_json:
            typer.echo(f"wrote {document['library']}")
    if profile:
        document["profile"] = _profile(executable, applied, model, tgt, repeat, as_json)
    if compare:
        from schedlang.models.compare import compare_builds

        comparison = compare_builds(model, tgt, executable, repeat)
        document["compare"] = comparison.as_json()
        _keep_timings(db_path, model, tgt, comparison)
        if not as_json:
            _print_comparison(comparison)
    if as_json:
        problems = [warning(p).to_json() for item in applied for p in item.warnings]
        emit_json({"ok": True, "diagnostics": problems, **document})


def _verify(model, tgt, executable, as_json: bool) -> str | None:
    """What the build's outputs agreed with, or None where it cannot run here (said once); a
    disagreement is a SchedlangError (exit 1, nothing written)."""
    from schedlang.models.compare import verify_build
    from schedlang.run.verify import runs_here

    if not runs_here(tgt):
        if not as_json:
            warn(f"warning: not verified: this machine cannot run kernels for {tgt.describe()}")
        return None
    checked = verify_build(model, tgt, executable)
    if not as_json:
        typer.echo(f"outputs agree with {checked}")
    return checked


def _applied_json(applied) -> list[dict]:
    return [{"function": a.function, "scheduled": a.summary(), "how": a.how} for a in applied]


def _print_applied(model, tgt, applied) -> None:
    width = max((len(a.function) for a in applied), default=0)
    typer.echo(f"model {model.name} on {tgt.kind}:")
    for item in applied:
        typer.echo(f"  {item.function:<{width}}  {item.summary()}")
        for problem in item.warnings:
            warn(warning(problem).render())
    tuned = sum(item.record is not None for item in applied)
    typer.echo(f"{tuned} of {len(applied)} functions scheduled from the database")


def _profile(executable, applied, model, tgt, repeat: int, as_json: bool) -> dict:
    """The profile as JSON; printed too unless `as_json`. A profiler that fails is one line."""
    from schedlang.models.function_times import profile_model

    try:
        profile = profile_model(executable, applied, model.inputs, tgt, repeat)
    except SchedlangError as err:
        warn(warning(err.message).render())
        return {"error": err.message}
    if not as_json:
        _print_profile(profile)
    return profile.as_json()


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
