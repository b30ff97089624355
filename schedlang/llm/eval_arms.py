"""The arms of an evaluation (schedlang.llm.evaluate): what each is (its settings, its database in
the work folder) and how it tunes an op (`arm_steps`, `metaschedule_steps`: a line of progress at
each step) with the same trial budget as the others, resuming where an earlier run stopped.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from schedlang.core.diagnostics import SchedlangError
from schedlang.core.ops import Op
from schedlang.core.target import Target
from schedlang.llm.eval_figures import (
    eval_runs,
    metaschedule_dir,
    metaschedule_trials,
    trial_records,
)
from schedlang.llm.spec import ModelSpec
from schedlang.propose.interface import Context, Proposal, Proposer
from schedlang.run.sandbox import environment
from schedlang.store.db import Database
from schedlang.store.records import op_key

Echo = Callable[[str], None]


# --- the model -----------------------------------------------------------------------------------


class MeteredBackend:
    """A backend that counts what it generates: every call of the model loop goes through
    `complete` or `continue_batch`; anything else is the wrapped backend's."""

    def __init__(self, backend):
        self.backend = backend
        self.tokens = 0
        self.seconds = 0.0

    def complete(self, messages, count, grammar=None, seed=None):
        started = time.perf_counter()
        replies = self.backend.complete(messages, count, grammar, seed=seed)
        self.seconds += time.perf_counter() - started
        self.tokens += sum(reply.tokens for reply in replies)
        return replies

    def continue_batch(self, rows, seed=None):
        started = time.perf_counter()
        samples = self.backend.continue_batch(rows, seed=seed)
        self.seconds += time.perf_counter() - started
        self.tokens += sum(sample.tokens for sample in samples)
        return samples

    def __getattr__(self, name: str):
        return getattr(self.backend, name)


def prompt_digest() -> str:
    """A digest of the prompt files (prompts/): another prompt variant, another digest."""
    from schedlang.llm.messages import prompts_dir

    digest = hashlib.sha256()
    folder = prompts_dir()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".py"):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# --- the arms -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    kind: str  # model, builtin or metaschedule
    id: str  # its database's file stem
    settings: dict  # everything that decides what it proposes
    path: Path


def _digest(settings: dict) -> str:
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def model_arm(spec: ModelSpec, proposer_settings: dict, seed: int, work: Path) -> Arm:
    where: dict[str, Any] = {"endpoint": spec.endpoint} if spec.endpoint else {}
    if spec.runtime != "transformers":  # as before runtimes were named: the same digests
        where |= {"runtime": spec.runtime, "model_db": spec.model_db}
        where["model_max_length"] = spec.model_max_length
    settings = {
        "model": spec.model,
        **where,
        "decoding": spec.decoding,
        "candidates_per_round": spec.candidates_per_round,
        "hint": spec.hint,
        "seed": seed,
        "prompts": prompt_digest(),
        **proposer_settings,  # sampling (resolved for the device), grammar, want
    }
    arm_id = f"model-{_digest(settings)}"
    return Arm("model", arm_id, settings, work / f"{arm_id}.db")


def builtin_arm(seed: int, work: Path) -> Arm:
    return Arm("builtin", f"builtin-seed{seed}", {"seed": seed}, work / f"builtin-seed{seed}.db")


@runtime_checkable
class _AsksInRounds(Protocol):
    """A proposer that asks a model in rounds (schedlang.llm.proposer.ModelProposer)."""

    rounds: int
    candidates_per_round: int
    unanswered: list[Any]  # the replies with no schedlang in them


class _ArmProposer:
    """The arm's proposer, whose proposals carry the arm's id (`extra.eval`); a model arm's also
    logs each round (replies, those with no answer, proposals, tokens, seconds) in its run."""

    def __init__(self, inner: Proposer, arm: Arm, db: Database, run_id: int, meter=None):
        self.inner, self.arm, self.db, self.run_id, self.meter = inner, arm, db, run_id, meter
        self.name = inner.name

    def propose(self, context: Context, history, count: int) -> list[Proposal]:
        inner = self.inner
        rounds = inner.rounds if isinstance(inner, _AsksInRounds) else None
        unanswered = len(inner.unanswered) if isinstance(inner, _AsksInRounds) else 0
        tokens, seconds = (self.meter.tokens, self.meter.seconds) if self.meter else (0, 0.0)
        proposals = inner.propose(context, history, count)
        if isinstance(inner, _AsksInRounds) and inner.rounds != rounds:
            entry = {
                "round": inner.rounds,
                "replies": min(count, inner.candidates_per_round),
                "no_answer": len(inner.unanswered) - unanswered,
                "proposals": len(proposals),
                "tokens": self.meter.tokens - tokens,
                "model_s": round(self.meter.seconds - seconds, 3),
            }
            self.db.log_decision(self.run_id, json.dumps(entry))
        tag = {"arm": self.arm.id, "kind": self.arm.kind}
        return [replace(p, extra={**p.extra, "eval": tag}) for p in proposals]


def _log(db: Database, run_id: int, **entry) -> None:
    db.log_decision(run_id, json.dumps(entry))


def arm_steps(
    arm: Arm,
    op: Op,
    target: Target,
    budget: int,
    seed: int,
    make_proposer: Callable[[int], Proposer],
    *,
    meter: MeteredBackend | None = None,
    baseline: bool = False,
) -> Iterator[str]:
    """Tune `op` with the arm's proposer until the arm has `budget` trials (none when it has),
    a line of progress at each step (one per candidate measured). `make_proposer(rounds)`: the
    proposer, going on after `rounds` rounds already logged."""
    from schedlang.tuning.tune import NothingToTune, Settings, tune_steps

    arm.path.parent.mkdir(parents=True, exist_ok=True)
    with Database(arm.path) as db:
        key, target_key = op_key(op.func), target.key
        done = len(trial_records(db, key, target_key)[0])
        if done >= budget:
            yield f"  {arm.kind}: {done} trials in {arm.path.name}, nothing to do"
            return
        runs = eval_runs(db, key, target_key)
        rounds = sum(1 for _, log in runs for entry in log if "round" in entry)
        settings = {"arm": arm.id, "budget": budget, **arm.settings}
        run_id = db.start_run(key, target_key, seed, f"eval:{arm.kind}", settings)
        resumed = f", resuming after {done}" if done else ""
        yield f"  {arm.kind}: {budget - done} trials{resumed} ({arm.path.name})"
        proposer = _ArmProposer(make_proposer(rounds), arm, db, run_id, meter)
        tune_settings = Settings(trials=budget - done, seed=seed, baseline=baseline)
        try:
            steps = tune_steps(op, target, db, settings=tune_settings, proposer=proposer)
            with closing(steps):  # the workers stopped and the claims released, however it ends
                for state in steps:
                    if (last := state.last) is None:
                        continue  # set before each step: a candidate was measured
                    figure = f"{last.gflops:.2f} GFLOP/s" if last.gflops else last.reason
                    yield f"  [{arm.kind} {done + state.done}/{budget}] {last.status}: {figure}"
        except NothingToTune as err:
            _log(db, run_id, error=err.message)
            yield f"  {arm.kind}: {err.message}"
        finally:
            _log(db, run_id, end=time.time())


def copy_records(arm: Arm, op: Op, target: Target, into: Database) -> int:
    """Add the arm's records of `op` to the tuning database (a schedule it holds is kept as it
    is); how many were new."""
    added = 0
    with Database(arm.path) as db:
        for record in db.records(op_key(op.func), target.key):
            source = {"db": str(arm.path), "id": record.id}
            extra = {**record.extra, "eval": {**record.extra.get("eval", {}), "source": source}}
            if into.get(record.op_key, record.target_key, record.schedule) is None:
                into.add(replace(record, id=None, extra=extra))
                added += 1
    return added


# --- MetaSchedule (optional) ---------------------------------------------------------------------


def require_metaschedule() -> None:
    from importlib.util import find_spec

    missing = [name for name in ("xgboost", "cloudpickle") if find_spec(name) is None]
    if missing:
        raise SchedlangError(
            f"the MetaSchedule arm needs {' and '.join(missing)}, which is not installed",
            "pip install 'schedlang[metaschedule]' (xgboost-cpu is the lighter xgboost), or "
            "leave out --metaschedule",
        )


def metaschedule_arm(seed: int, work: Path) -> Arm:
    """MetaSchedule's tuning runs (`tune_tir`, its JSON database per op) in a folder; its best
    schedule, imported as schedlang and measured, in the arm's database."""
    arm_id = f"metaschedule-seed{seed}"
    return Arm("metaschedule", arm_id, {"seed": seed}, work / f"{arm_id}.db")


def _import_tensor_intrin() -> None:
    # The builder workers' initializer (not timed): TVM's build imports this (~35 s here) inside
    # the timed build otherwise, and every candidate times out.
    import tvm.s_tir.tensor_intrin  # noqa: F401


def run_metaschedule(
    arm: Arm, op: Op, target: Target, budget: int, seed: int, *, echo: Echo = lambda _: None
) -> None:
    """`metaschedule_steps` run to its end, each line to `echo`."""
    for line in metaschedule_steps(arm, op, target, budget, seed):
        echo(line)


def metaschedule_steps(arm: Arm, op: Op, target: Target, budget: int, seed: int) -> Iterator[str]:
    """MetaSchedule (`tune_tir`: post-order-apply, evolutionary search, xgb cost model) for
    `budget` trials, a line of progress at each step; it cannot resume, so an unfinished run
    starts again. Its best schedule is imported as schedlang and measured like any candidate
    (proposer "metaschedule")."""
    import shutil

    from tvm.s_tir import meta_schedule as ms

    folder = metaschedule_dir(arm.path, op, target)
    if len(metaschedule_trials(folder)) >= budget:
        yield f"  metaschedule: {budget} trials in {folder.name}, nothing to do"
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    yield f"  metaschedule: {budget} trials ({folder.name})"
    started = time.time()
    cores = target.cores if not target.is_gpu else 1
    # Its runner's processes time with the threads they inherit: as many as schedlang's runner
    # uses (TVM's runtime alone takes half the cores; a caller may have set one).
    with environment({"TVM_NUM_THREADS": str(cores)}):
        _tune_tir(ms, op, target, folder, budget, seed, cores)
    (folder / "eval.json").write_text(json.dumps({"started": started, "end": time.time()}))
    failure = _measure_metaschedule_best(arm, folder, op, target, seed)
    if failure:
        yield failure


def _tune_tir(ms, op: Op, target: Target, folder: Path, budget: int, seed: int, cores: int):
    ms.tune_tir(
        mod=op.func,
        target=target.to_tvm(),
        work_dir=str(folder),
        max_trials_global=budget,
        num_trials_per_iter=min(64, budget),
        builder=ms.builder.LocalBuilder(
            max_workers=cores, timeout_sec=120, initializer=_import_tensor_intrin
        ),
        runner=ms.runner.LocalRunner(
            timeout_sec=60,
            evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=100),
        ),
        cost_model="xgb",
        num_tuning_cores=cores,
        seed=seed,
    )


def _measure_metaschedule_best(arm, folder: Path, op: Op, target: Target, seed: int) -> str | None:
    """MetaSchedule's best schedule measured into the arm's database; None, or the line saying
    why it could not be."""
    from schedlang.interop.database import import_metaschedule
    from schedlang.tuning.tune import Settings, tune

    try:
        imported = import_metaschedule(folder, op.func, target)
    except SchedlangError as err:
        return f"  metaschedule: its best schedule is not schedlang: {err.message}"
    proposal = Proposal(imported.text, "metaschedule", "MetaSchedule's best")
    with Database(arm.path) as db:
        tune(op, target, db, settings=Settings(trials=1, seed=seed), templates=[proposal])
    return None
