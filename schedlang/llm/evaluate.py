"""Score a model as a schedule writer: the model loop against the built-in proposer (and
MetaSchedule), each with the same trial budget per op, from one command.

    schedlang eval-model --model DIR --ops matmul,softmax -D matmul.M=256 --trials 32 -o eval.json
    schedlang eval-model --compare eval-a.json eval-b.json

Arms. Each op of the suite is tuned by each arm on its own: the model (`ModelProposer`), the
built-in proposer, and, with `metaschedule=True`, MetaSchedule. Every arm has a database of its
own in the work folder (`eval.runs/` beside `eval.json`), so that no arm sees or reuses another's
measurements (the model's prompts show only its own history) and a rerun resumes each arm where
it stopped: an arm with fewer trials than the budget tunes the rest, and what its database holds
is never measured again (tune's rule). Every record is then added to the tuning database as well,
so `schedlang best` and `compile --from-db` use the winner.

The model arm's file is named by a digest of everything that decides what the model writes (the
model, the decoding and its limits, the sampling, the prompt files, the hint, the seed): a rerun
with the same settings resumes, another setting is another arm. The built-in arm depends only on
the seed and is shared by every evaluation that uses the same work folder.

Figures, per op and arm, all read back from the arm's database (`figures`):

    trials      candidates measured (tune's count: an answer that does not parse is no trial),
                the first `budget` of them; ok: built, verified and timed
    answers     the model's distinct answers (a template's knob points are one answer); replies
                with no schedlang (no_answer) and repeats of an earlier answer come from the
                round log the arm keeps in its run's decisions
    parse, clean  answers (and replies with no answer) whose first version parses / checks clean
    best        the fastest ok trial after 8, 16 and the whole budget: GFLOP/s and latency
    reached     trials until one is within 5 % of the built-in proposer's best latency
    tokens      every token the model generated (reasoning, resampled statements, repairs and
                repeats included), per trial; model_s the seconds spent generating
    wall_s      the arm's wall time (model, builds and timing), summed over its runs
    repairs     repair rounds asked and those that checked clean (whole and free decoding);
                statements the checker rejected and resampled, and backtracks (per statement)
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from schedlang.core.diagnostics import SchedlangError, did_you_mean, one_of
from schedlang.core.ops import Op, load_op, parse_defines, split_op_spec
from schedlang.core.target import Target
from schedlang.core.units import format_seconds
from schedlang.llm.feedback import is_baseline
from schedlang.llm.spec import ModelSpec
from schedlang.propose.builtin import Context, Proposal, Proposer
from schedlang.store.db import Database, Record, current_versions, op_key

FORMAT = "schedlang-eval/1"
CHECKPOINTS = (8, 16)  # best-so-far figures after these many trials, and after the whole budget
REACH_TOLERANCE = 0.05  # "reached the built-in best": within the timing noise of this machine
ARMS = ("model", "builtin", "metaschedule")
Echo = Callable[[str], None]


# --- the suite -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SuiteOp:
    label: str  # "matmul": the example's name, or the op file's stem
    spec: str  # as given: an example's name or FILE.py[:NAME]
    defines: dict[str, str]
    op: Op

    @property
    def shape(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.defines.items())

    def to_json(self) -> dict:
        return {
            "op": self.label,
            "spec": self.spec,
            "defines": self.defines,
            "name": self.op.name,
            "op_key": op_key(self.op.func),
        }


def examples_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples"


def example_ops() -> list[str]:
    """The op files of examples/ by name: the default suite."""
    return sorted(path.stem for path in examples_dir().glob("*.py"))


def load_suite(specs: Sequence[str] = (), defines: Sequence[str] = ()) -> list[SuiteOp]:
    """The ops to score: examples by name (`matmul`) or op files (`FILE.py[:NAME]`), all the
    examples when `specs` is empty. `defines` are `NAME=VALUE` (every op with that parameter) or
    `OP.NAME=VALUE` (that op only)."""
    specs = [s.strip() for spec in specs for s in spec.split(",") if s.strip()]
    if not specs:
        specs = example_ops()
        if not specs:
            raise SchedlangError("no examples/ folder here", "give the ops: --ops FILE.py,…")
    located = [(spec, *_locate(spec)) for spec in specs]
    labels = [label for _, label, _, _ in located]
    if len(set(labels)) < len(labels):
        twice = sorted({label for label in labels if labels.count(label) > 1})
        raise SchedlangError(f"op {', '.join(twice)} given twice", "list each op once")
    shared, own = _split_defines(defines, labels)
    suite, used = [], set()
    for spec, label, path, name in located:
        params = load_op(path, name=name).params
        chosen = {k: v for k, v in shared.items() if k in params}
        used.update(chosen)
        chosen |= own.get(label, {})
        suite.append(SuiteOp(label, spec, chosen, load_op(path, chosen, name=name)))
    for key in shared.keys() - used:
        raise SchedlangError(
            f"-D {key}={shared[key]}: no op of the suite has a parameter `{key}`",
            "write -D OP.NAME=VALUE for one op, e.g. -D matmul.M=256",
        )
    return suite


def _locate(spec: str) -> tuple[str, str, str | None]:
    """(label, path, name) of an op given by example name or file."""
    path, name = split_op_spec(spec)
    if path.endswith(".py") or "/" in path:
        return (name or Path(path).stem), path, name
    examples = example_ops()
    if spec not in examples:
        raise SchedlangError(
            f"unknown op `{spec}`",
            did_you_mean(spec, examples),
            one_of(examples, "examples"),
            "or give an op file: --ops path/to/op.py",
        )
    return spec, str(examples_dir() / f"{spec}.py"), None


def _split_defines(
    items: Sequence[str], labels: Sequence[str]
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    shared: dict[str, str] = {}
    own: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        label, dot, name = key.strip().rpartition(".")
        if not dot:
            shared.update(parse_defines([item]))
            continue
        if label not in labels:
            raise SchedlangError(
                f"-D {item}: `{label}` is not an op of the suite",
                did_you_mean(label, labels),
                one_of(list(labels), "ops"),
            )
        own.setdefault(label, {}).update(parse_defines([f"{name}{sep}{value}"]))
    return shared, own


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
    from schedlang.llm.proposer import prompts_dir

    digest = hashlib.sha256()
    folder = prompts_dir()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".py"):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# --- arms ----------------------------------------------------------------------------------------


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
    where = {"endpoint": spec.endpoint} if spec.endpoint else {}
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


class _ArmProposer:
    """The arm's proposer, whose proposals carry the arm's id (`extra.eval`); a model arm's also
    logs each round (replies, those with no answer, proposals, tokens, seconds) in its run."""

    def __init__(self, inner: Proposer, arm: Arm, db: Database, run_id: int, meter=None):
        self.inner, self.arm, self.db, self.run_id, self.meter = inner, arm, db, run_id, meter
        self.name = inner.name

    def propose(self, context: Context, history, count: int) -> list[Proposal]:
        rounds = getattr(self.inner, "rounds", None)
        unanswered = len(getattr(self.inner, "unanswered", ()))
        tokens, seconds = (self.meter.tokens, self.meter.seconds) if self.meter else (0, 0.0)
        proposals = self.inner.propose(context, history, count)
        if rounds is not None and self.inner.rounds != rounds:
            entry = {
                "round": self.inner.rounds,
                "replies": min(count, self.inner.candidates_per_round),
                "no_answer": len(self.inner.unanswered) - unanswered,
                "proposals": len(proposals),
                "tokens": self.meter.tokens - tokens,
                "model_s": round(self.meter.seconds - seconds, 3),
            }
            self.db.log_decision(self.run_id, json.dumps(entry))
        tag = {"arm": self.arm.id, "kind": self.arm.kind}
        return [replace(p, extra={**p.extra, "eval": tag}) for p in proposals]


def _log(db: Database, run_id: int, **entry) -> None:
    db.log_decision(run_id, json.dumps(entry))


def _eval_runs(db: Database, key: str, target_key: str) -> list[tuple[dict, list[dict]]]:
    """The arm's runs for this op and target, each with its log (decoded)."""
    found = []
    for run in db.runs(key, target_key):
        if run["proposer"].startswith("eval:"):
            found.append((run, [json.loads(text) for text in db.decisions(run["id"])]))
    return found


def run_arm(
    arm: Arm,
    op: Op,
    target: Target,
    budget: int,
    seed: int,
    make_proposer: Callable[[int], Proposer],
    *,
    meter: MeteredBackend | None = None,
    baseline: bool = False,
    echo: Echo = lambda _: None,
) -> None:
    """Tune `op` with the arm's proposer until the arm has `budget` trials (none when it has).
    `make_proposer(rounds)`: the proposer, going on after `rounds` rounds already logged."""
    from schedlang.tuning.tune import Settings, tune

    arm.path.parent.mkdir(parents=True, exist_ok=True)
    with Database(arm.path) as db:
        key, target_key = op_key(op.func), target.key
        done = len(trial_records(db, key, target_key)[0])
        if done >= budget:
            echo(f"  {arm.kind}: {done} trials in {arm.path.name}, nothing to do")
            return
        runs = _eval_runs(db, key, target_key)
        rounds = sum(1 for _, log in runs for entry in log if "round" in entry)
        settings = {"arm": arm.id, "budget": budget, **arm.settings}
        run_id = db.start_run(key, target_key, seed, f"eval:{arm.kind}", settings)
        resumed = f", resuming after {done}" if done else ""
        echo(f"  {arm.kind}: {budget - done} trials{resumed} ({arm.path.name})")
        proposer = _ArmProposer(make_proposer(rounds), arm, db, run_id, meter)

        def progress(state) -> None:
            last = state.last
            figure = f"{last.gflops:.2f} GFLOP/s" if last.gflops else last.reason
            echo(f"  [{arm.kind} {done + state.done}/{budget}] {last.status}: {figure}")

        tune_settings = Settings(trials=budget - done, seed=seed, baseline=baseline)
        try:
            tune(op, target, db, settings=tune_settings, proposer=proposer, on_progress=progress)
        except SchedlangError as err:
            if not err.message.startswith("nothing to tune"):
                raise
            _log(db, run_id, error=err.message)
            echo(f"  {arm.kind}: {err.message}")
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


# --- figures, from an arm's database ------------------------------------------------------------


def _parses(text: str) -> bool:
    from schedlang.lang.syntax import parse

    try:
        parse(text, "<record>")
    except SchedlangError:
        return False
    return True


def _has_statements(text: str) -> bool:
    from schedlang.lang.syntax import parse

    try:
        return bool(parse(text, "<answer>").statements)
    except SchedlangError:
        return True  # it does not parse: review says so


def trial_records(
    db: Database, key: str, target_key: str, budget: int | None = None
) -> tuple[list[Record], list[Record]]:
    """(trials, unparsed): the arm's measured candidates in order, the first `budget` of them;
    and the answers recorded before the last of them that did not parse (tune keeps those as
    check_error records, but they are no trials)."""
    trials, unparsed = [], []
    for record in db.records(key, target_key):
        if is_baseline(record):
            continue
        (trials if _parses(record.schedule) else unparsed).append(record)
    trials = trials[:budget] if budget is not None else trials
    if trials:
        unparsed = [r for r in unparsed if (r.id or 0) < (trials[-1].id or 0)]
    return trials, unparsed


def first_answer(record: Record) -> str | None:
    """The model's answer before any repair, as the proposer reviewed it."""
    reply = record.extra.get("reply") or {}
    answer = reply.get("answer")
    return answer if answer is not None else reply.get("text")


def answer_counts(answers: Iterable[str | None], op: Op, target: Target) -> tuple[int, int, int]:
    """(answers, parsed, clean): how many answers parse and check clean on the op and target
    (templates at their knobs' first values, as the proposer reviews them). None, or an answer
    with no statement, counts as an answer that does not parse."""
    from schedlang.llm.proposer import review

    context = Context(op, target)
    total = parsed = clean = 0
    for answer in answers:
        total += 1
        if answer is None or not _has_statements(answer):  # nothing written is no schedule
            continue
        result = review(answer, context)
        parsed += result.parsed
        clean += result.ok
    return total, parsed, clean


def _best(records: Sequence[Record]) -> Record | None:
    ok = [r for r in records if r.is_ok and r.median_s]
    return min(ok, key=lambda r: r.median_s) if ok else None


def _point(after: int, record: Record | None) -> dict:
    return {
        "after": after,
        "gflops": record.gflops if record else None,
        "latency_s": record.median_s if record else None,
        "record": record.id if record else None,
    }


def checkpoints(budget: int) -> list[int]:
    return [n for n in CHECKPOINTS if n < budget] + [budget]


def trials_to_reach(trials: Sequence[Record], latency_s: float | None) -> int | None:
    """The 1-based trial at which a latency within REACH_TOLERANCE of `latency_s` was first
    measured; None if never."""
    if not latency_s:
        return None
    limit = latency_s * (1 + REACH_TOLERANCE)
    for number, record in enumerate(trials, 1):
        if record.is_ok and record.median_s and record.median_s <= limit:
            return number
    return None


def _rate(part: int | None, whole: int | None) -> float | None:
    return round(part / whole, 4) if part is not None and whole else None


def figures(
    db: Database,
    op: Op,
    target: Target,
    budget: int,
    kind: str,
    builtin_latency_s: float | None = None,
) -> dict:
    """Every figure of one arm on one op, from its database (see the module's docstring)."""
    key, target_key = op_key(op.func), target.key
    trials, unparsed = trial_records(db, key, target_key, budget)
    # Time and tokens were spent on every trial of the arm: more than the budget when a run
    # with a larger budget shares it.
    measured = max(len(trial_records(db, key, target_key)[0]), 1)
    runs = _eval_runs(db, key, target_key)
    rounds = [entry for _, log in runs for entry in log if "round" in entry]
    best = _best(trials)
    out: dict[str, Any] = {
        "trials": len(trials),
        "budget": budget,
        "ok": sum(r.is_ok for r in trials),
        "ok_rate": _rate(sum(r.is_ok for r in trials), len(trials)),
        "best": [_point(n, _best(trials[:n])) for n in checkpoints(budget)],
        "best_record": best.id if best else None,
        # The built-in arm's own: how soon it found (nearly) its best.
        "reached_builtin_best": trials_to_reach(
            trials, best.median_s if kind == "builtin" and best else builtin_latency_s
        ),
        "wall_s": round(_wall_s(db, runs, key, target_key), 3),
        "error": _last_error(runs) if len(trials) < budget else None,
    }
    out["wall_s_per_trial"] = _rate(out["wall_s"], measured) if trials else None
    if kind == "model":
        out |= _model_figures(trials, unparsed, rounds, op, target, measured)
    return out


def _model_figures(trials, unparsed, rounds, op: Op, target: Target, measured: int) -> dict:
    answers: dict[Any, Record] = {}  # one record per answer: a template's points share theirs
    for record in [*unparsed, *trials]:
        run = record.extra.get("run_id")
        answers.setdefault((run, record.template) if record.template else record.id, record)
    no_answer = sum(entry["no_answer"] for entry in rounds)
    texts = [first_answer(r) for r in answers.values()] + [None] * no_answer
    total, parsed, clean = answer_counts(texts, op, target)
    tokens = sum(entry["tokens"] for entry in rounds)
    model_s = sum(entry["model_s"] for entry in rounds)
    steps = [r.extra.get("steps") or {} for r in answers.values()]
    replies = sum(entry["replies"] for entry in rounds)
    proposals = sum(entry["proposals"] for entry in rounds)
    return {
        "replies": replies,
        "answers": len(answers),
        "no_answer": no_answer,
        "repeats": replies - no_answer - proposals,
        "parsed": parsed,
        "parse_rate": _rate(parsed, total),
        "clean": clean,
        "clean_rate": _rate(clean, total),
        "repairs": {
            "asked": sum("repair" in r.extra for r in answers.values()),
            "clean": sum(bool(r.extra.get("repaired")) for r in answers.values()),
            "resampled": sum(len(s.get("rejected") or ()) for s in steps),
            "backtracks": sum(int(s.get("backtracks") or 0) for s in steps),
        },
        "rounds": len(rounds),
        "tokens": tokens,
        "tokens_per_trial": _rate(tokens, measured) if trials else None,
        "model_s": round(model_s, 3),
        "model_s_per_trial": _rate(model_s, measured) if trials else None,
    }


def _wall_s(db: Database, runs, key: str, target_key: str) -> float:
    """The arm's runs, each from its start to its logged end (else its last record)."""
    created = sorted(r.created_at for r in db.records(key, target_key))
    starts = [run["started_at"] for run, _ in runs] + [math.inf]
    total = 0.0
    for (run, log), next_start in zip(runs, starts[1:], strict=True):
        ends = [entry["end"] for entry in log if "end" in entry]
        inside = [t for t in created if run["started_at"] <= t < next_start]
        end = ends[-1] if ends else max(inside, default=run["started_at"])
        total += max(end - run["started_at"], 0.0)
    return total


def _last_error(runs) -> str | None:
    errors = [entry["error"] for _, log in runs for entry in log if "error" in entry]
    return errors[-1] if errors else None


def total_figures(per_op: Sequence[dict], kind: str) -> dict:
    """One arm's figures over the suite: counts summed, rates over the sums, best figures as
    geometric means over the ops that have one."""
    arms = [figures for figures in per_op if figures is not None]
    trials = sum(a["trials"] for a in arms)
    out: dict[str, Any] = {
        "ops": len(arms),
        "trials": trials,
        "ok": sum(a["ok"] for a in arms),
        "ok_rate": _rate(sum(a["ok"] for a in arms), trials),
        "wall_s": round(sum(a["wall_s"] for a in arms), 3),
        "reached_builtin_best": sum(a["reached_builtin_best"] is not None for a in arms),
    }
    out["wall_s_per_trial"] = _rate(out["wall_s"], trials)
    out["best_geomean_gflops"] = {
        str(n): _geomean([p["gflops"] for a in arms for p in a["best"] if p["after"] == n])
        for n in sorted({p["after"] for a in arms for p in a["best"]})
    }
    if kind == "model":
        for name in ("replies", "answers", "no_answer", "repeats", "parsed", "clean", "tokens"):
            out[name] = sum(a[name] for a in arms)
        total = out["answers"] + out["no_answer"]
        out["parse_rate"] = _rate(out["parsed"], total)
        out["clean_rate"] = _rate(out["clean"], total)
        out["tokens_per_trial"] = _rate(out["tokens"], trials)
        out["model_s_per_trial"] = _rate(sum(a["model_s"] for a in arms), trials)
        out["repairs"] = {
            name: sum(a["repairs"][name] for a in arms)
            for name in ("asked", "clean", "resampled", "backtracks")
        }
    return out


def _geomean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v]
    if not present or len(present) < len(values):
        return None
    return round(math.exp(sum(math.log(v) for v in present) / len(present)), 4)


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


def _metaschedule_dir(arm: Arm, op: Op, target: Target) -> Path:
    digest = hashlib.sha256(target.key.encode()).hexdigest()[:8]
    return arm.path.with_suffix("") / f"{op_key(op.func)}-{digest}"


def _import_tensor_intrin() -> None:
    # The builder workers' initializer (not timed): TVM's build imports this (~35 s here) inside
    # the timed build otherwise, and every candidate times out.
    import tvm.s_tir.tensor_intrin  # noqa: F401


def run_metaschedule(
    arm: Arm, op: Op, target: Target, budget: int, seed: int, *, echo: Echo = lambda _: None
) -> None:
    """MetaSchedule (`tune_tir`: post-order-apply, evolutionary search, xgb cost model) for
    `budget` trials; it cannot resume, so an unfinished run starts again. Its best schedule is
    imported as schedlang and measured like any candidate (proposer "metaschedule")."""
    import shutil

    from tvm.s_tir import meta_schedule as ms

    folder = _metaschedule_dir(arm, op, target)
    if len(_metaschedule_trials(folder)) >= budget:
        echo(f"  metaschedule: {budget} trials in {folder.name}, nothing to do")
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    echo(f"  metaschedule: {budget} trials ({folder.name})")
    started = time.time()
    cores = target.cores if not target.is_gpu else 1
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
    (folder / "eval.json").write_text(json.dumps({"started": started, "end": time.time()}))
    _measure_metaschedule_best(arm, folder, op, target, seed, echo)


def _measure_metaschedule_best(arm, folder: Path, op: Op, target: Target, seed: int, echo) -> None:
    from schedlang.interop.metaschedule import import_metaschedule
    from schedlang.tuning.tune import Settings, tune

    try:
        imported = import_metaschedule(folder, op.func, target)
    except SchedlangError as err:
        echo(f"  metaschedule: its best schedule is not schedlang: {err.message}")
        return
    proposal = Proposal(imported.text, "metaschedule", "MetaSchedule's best")
    with Database(arm.path) as db:
        tune(op, target, db, settings=Settings(trials=1, seed=seed), templates=[proposal])


def _metaschedule_trials(folder: Path) -> list[float | None]:
    """Each trial's mean run time in order (None: it failed), from MetaSchedule's record file."""
    path = folder / "database_tuning_record.json"
    if not path.is_file():
        return []
    trials: list[float | None] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        run_secs = json.loads(line)[1][1] or []
        valid = [float(s) for s in run_secs if float(s) < 1e9]
        trials.append(sum(valid) / len(valid) if valid and len(valid) == len(run_secs) else None)
    return trials


def metaschedule_figures(
    arm: Arm, op: Op, target: Target, budget: int, builtin_latency_s: float | None
) -> dict:
    from schedlang.core.ops import flop_count

    folder = _metaschedule_dir(arm, op, target)
    latencies = _metaschedule_trials(folder)[:budget]
    flops = flop_count(op.func)

    def best_after(n: int) -> dict:
        measured = [t for t in latencies[:n] if t]
        fastest = min(measured, default=None)
        gflops = flops / fastest / 1e9 if fastest else None
        return {"after": n, "gflops": gflops, "latency_s": fastest, "record": None}

    reached = None
    for number, latency in enumerate(latencies, 1):
        if latency and builtin_latency_s and latency <= builtin_latency_s * (1 + REACH_TOLERANCE):
            reached = number
            break
    times = folder / "eval.json"
    wall = json.loads(times.read_text()) if times.is_file() else None
    ok = sum(t is not None for t in latencies)
    wall_s = round(wall["end"] - wall["started"], 3) if wall else 0.0
    return {
        "trials": len(latencies),
        "budget": budget,
        "ok": ok,
        "ok_rate": _rate(ok, len(latencies)),
        "best": [best_after(n) for n in checkpoints(budget)],
        "best_record": None,
        "reached_builtin_best": reached,
        "wall_s": wall_s,
        "wall_s_per_trial": _rate(wall_s, len(latencies)),
        "error": None,
        "timing": "MetaSchedule's runner: mean of 3 runs of at least 100 ms",
    }


# --- the evaluation ------------------------------------------------------------------------------


@dataclass
class Evaluation:
    """What one `schedlang eval-model` scores, and where it keeps it."""

    suite: list[SuiteOp]
    target: Target
    spec: ModelSpec
    trials: int = 32
    seed: int = 0
    out: Path = Path("eval.json")
    work: Path | None = None  # default: eval.runs/ beside `out`
    metaschedule: bool = False
    label: str | None = None
    arms: dict[str, Arm] = field(default_factory=dict)

    @property
    def work_dir(self) -> Path:
        return self.work or self.out.with_suffix(".runs")


def run_evaluation(evaluation: Evaluation, db: Database, echo: Echo = lambda _: None) -> dict:
    """Run every arm on every op (resuming what the work folder holds), add the records to `db`,
    and write the report (JSON and markdown) after each op; returns the report."""
    from schedlang.propose.builtin import BuiltinProposer

    work, seed, spec = evaluation.work_dir, evaluation.seed, evaluation.spec
    if evaluation.metaschedule:
        require_metaschedule()
    backend = spec.backend()
    if hasattr(backend, "expected_time"):
        echo(backend.expected_time())
    meter = MeteredBackend(backend)
    evaluation.arms = {
        "model": model_arm(spec, spec.proposer(meter, seed).settings(), seed, work),
        "builtin": builtin_arm(seed, work),
    }
    if evaluation.metaschedule:
        evaluation.arms["metaschedule"] = metaschedule_arm(seed, work)
    for number, item in enumerate(evaluation.suite, 1):
        shape = f" ({item.shape})" if item.shape else ""
        echo(f"[{number}/{len(evaluation.suite)}] {item.label}{shape} on {evaluation.target.kind}")
        common = (item.op, evaluation.target, evaluation.trials, seed)
        run_arm(evaluation.arms["builtin"], *common, lambda _: BuiltinProposer(), echo=echo)
        run_arm(
            evaluation.arms["model"],
            *common,
            lambda rounds: spec.proposer(meter, seed, rounds),
            meter=meter,
            baseline=True,  # the model is told each candidate's speedup over it
            echo=echo,
        )
        if evaluation.metaschedule:
            run_metaschedule(evaluation.arms["metaschedule"], *common, echo=echo)
        for arm in evaluation.arms.values():
            if arm.path.is_file():
                copy_records(arm, item.op, evaluation.target, db)
        write_report(report(evaluation, done=number), evaluation.out)
    return report(evaluation)


def report(evaluation: Evaluation, done: int | None = None) -> dict:
    """The report of the first `done` ops of the suite (all by default), from the arms' files."""
    target, trials, arms = evaluation.target, evaluation.trials, evaluation.arms
    suite = evaluation.suite[: len(evaluation.suite) if done is None else done]
    ops = []
    for item in suite:
        entry = item.to_json() | {"shape": item.shape}
        with Database(arms["builtin"].path, read_only=True) as db:
            entry["builtin"] = figures(db, item.op, target, trials, "builtin")
        builtin_latency = entry["builtin"]["best"][-1]["latency_s"]
        with Database(arms["model"].path, read_only=True) as db:
            entry["model"] = figures(db, item.op, target, trials, "model", builtin_latency)
            entry["baseline"] = _baseline(db, item.op, target)
        if "metaschedule" in arms:
            entry["metaschedule"] = metaschedule_figures(
                arms["metaschedule"], item.op, target, trials, builtin_latency
            )
        ops.append(entry)
    schedlang_version, tvm_version = current_versions()
    return {
        "format": FORMAT,
        "label": evaluation.label or default_label(evaluation.spec),
        "complete": len(suite) == len(evaluation.suite),
        "settings": {
            "model": asdict(evaluation.spec),
            "arm": arms["model"].settings,
            "trials": trials,
            "seed": evaluation.seed,
            "target": target.tvm_config,
            "metaschedule": evaluation.metaschedule,
            "checkpoints": list(CHECKPOINTS),
            "reach_tolerance": REACH_TOLERANCE,
            "versions": {"schedlang": schedlang_version, "tvm": tvm_version},
        },
        "arms": {kind: {"id": arm.id, "db": str(arm.path)} for kind, arm in arms.items()},
        "ops": ops,
        "total": {kind: total_figures([op[kind] for op in ops], kind) for kind in arms},
    }


def default_label(spec: ModelSpec) -> str:
    name = Path(spec.model).name if Path(spec.model).expanduser().is_dir() else spec.model
    return f"{name} ({spec.decoding})"


def _baseline(db: Database, op: Op, target: Target) -> dict | None:
    record = db.get(op_key(op.func), target.key, "")
    if record is None or not record.is_ok:
        return None
    return {"gflops": record.gflops, "latency_s": record.median_s, "record": record.id}


# --- the report as text --------------------------------------------------------------------------


def write_report(data: dict, out: Path) -> tuple[Path, Path]:
    """`out` (JSON) and the markdown table beside it (`.md`)."""
    markdown_path = out.with_suffix(".md")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        markdown_path.write_text(markdown(data), encoding="utf-8")
    except OSError as err:
        raise SchedlangError(f"cannot write {out}: {err.strerror or err}") from None
    return out, markdown_path


def _share(part: int | None, whole: int | None) -> str:
    if part is None or not whole:
        return "—"
    return f"{part}/{whole} ({100 * part / whole:.0f}%)"


def _best_cell(figures: dict, after: int, total: bool) -> str:
    if total:
        geomean = figures["best_geomean_gflops"].get(str(after))
        return f"geomean {geomean:.3g} GFLOP/s" if geomean else "—"
    point = next((p for p in figures["best"] if p["after"] == after), None)
    if point is None or point["gflops"] is None:
        return "—"
    return f"{point['gflops']:.3g} GFLOP/s, {format_seconds(point['latency_s'], '—')}"


def _cells(label: str, kind: str, figures: dict, budget: int, total: bool = False) -> list[str]:
    """One row of the table: an arm on one op, or (`total`) over the suite."""
    model = kind == "model"
    attempts = figures["answers"] + figures["no_answer"] if model else None
    reached = figures["reached_builtin_best"]
    if total:
        reached_text = f"{reached} of {figures['ops']} ops"
    else:
        reached_text = str(reached) if reached is not None else "not reached"
    repairs = figures.get("repairs")
    per_trial = figures.get("tokens_per_trial")
    return [
        label,
        kind,
        str(figures["trials"]) if total else f"{figures['trials']}/{budget}",
        _share(figures["parsed"], attempts) if model else "—",
        _share(figures["clean"], attempts) if model else "—",
        _share(figures["ok"], figures["trials"]),
        *[_best_cell(figures, n, total) for n in checkpoints(budget)],
        reached_text,
        f"{per_trial:.0f}" if per_trial else "—",
        f"{figures['wall_s_per_trial']:.2f} s" if figures["wall_s_per_trial"] else "—",
        (
            f"{repairs['asked']} asked, {repairs['clean']} clean; {repairs['resampled']} "
            f"resampled, {repairs['backtracks']} backtracks"
            if repairs
            else "—"
        ),
    ]


def markdown(data: dict) -> str:
    """The report as a markdown table: one row per op and arm, then the totals."""
    budget = data["settings"]["trials"]
    head = ["op", "arm", "trials", "parse", "check clean", "ok"]
    head += [f"best @{n}" for n in checkpoints(budget)]
    head += ["trials to built-in best", "tokens/trial", "wall/trial", "repairs"]
    lines = [
        f"**{data['label']}** on {data['settings']['target'].get('kind')}, "
        f"{budget} trials per op and arm, seed {data['settings']['seed']}"
        + ("" if data["complete"] else " (unfinished: a rerun resumes)"),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    rows = [
        _cells(f"{op['op']} ({op['shape']})" if op["shape"] else op["op"], kind, op[kind], budget)
        for op in data["ops"]
        for kind in ARMS
        if kind in op
    ]
    rows += [
        _cells("**total**", kind, figures, budget, total=True)
        for kind, figures in data["total"].items()
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


# --- comparing two runs --------------------------------------------------------------------------


def load_report(path: str | Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise SchedlangError(f"cannot read {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise SchedlangError(f"{path} is not JSON: {err.msg} (line {err.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SchedlangError(
            f"{path} is not an eval-model report", f'expected "format": "{FORMAT}"'
        )
    return data


@dataclass(frozen=True)
class Duel:
    op: str
    a: dict | None  # the model arm's figures in each report
    b: dict | None
    winner: str  # "A", "B", "tie" or "—" (not in both)
    ratio: float | None  # A's best latency over B's: above 1, B is faster


def compare(a: dict, b: dict) -> list[Duel]:
    """Per op (same op, shape and target in both), which model arm found the faster schedule
    within the budget; then the totals (ops won)."""
    index_b = {(op["op_key"], op["shape"]): op for op in b["ops"]}
    duels = []
    for op in a["ops"]:
        other = index_b.pop((op["op_key"], op["shape"]), None)
        label = f"{op['op']} ({op['shape']})" if op["shape"] else op["op"]
        duels.append(_duel(label, op["model"], other["model"] if other else None))
    for op in index_b.values():
        label = f"{op['op']} ({op['shape']})" if op["shape"] else op["op"]
        duels.append(_duel(label, None, op["model"]))
    return duels


def _duel(label: str, a: dict | None, b: dict | None) -> Duel:
    latency_a = a["best"][-1]["latency_s"] if a else None
    latency_b = b["best"][-1]["latency_s"] if b else None
    if a is None or b is None:
        return Duel(label, a, b, "—", None)
    if latency_a is None or latency_b is None:
        winner = "A" if latency_a else "B" if latency_b else "tie"
        return Duel(label, a, b, winner, None)
    ratio = latency_a / latency_b
    if abs(ratio - 1) <= REACH_TOLERANCE:
        winner = "tie"
    else:
        winner = "A" if ratio < 1 else "B"
    return Duel(label, a, b, winner, ratio)


def render_comparison(a: dict, b: dict, duels: Sequence[Duel]) -> str:
    """A markdown table: per op, each run's best within its budget, its ok and clean rates, the
    winner (ties: within the timing noise)."""
    notes = []
    if a["settings"]["target"] != b["settings"]["target"]:
        notes.append("the two runs are on different targets: their ops do not match")
    if a["settings"]["trials"] != b["settings"]["trials"]:
        notes.append(
            f"budgets differ: A {a['settings']['trials']} trials, B {b['settings']['trials']}"
        )
    head = ["op", f"A: {a['label']}", f"B: {b['label']}", "winner", "A/B latency"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(arm: dict | None) -> str:
        if arm is None:
            return "—"
        point = arm["best"][-1]
        best = (
            f"{point['gflops']:.3g} GFLOP/s, {format_seconds(point['latency_s'], '—')}"
            if point["gflops"]
            else "nothing ok"
        )
        return f"{best}; ok {_share(arm['ok'], arm['trials'])}"

    for duel in duels:
        ratio = f"{duel.ratio:.2f}" if duel.ratio is not None else "—"
        lines.append(f"| {duel.op} | {cell(duel.a)} | {cell(duel.b)} | {duel.winner} | {ratio} |")
    wins = {side: sum(d.winner == side for d in duels) for side in ("A", "B", "tie")}
    lines.append(
        f"\nA wins {wins['A']}, B wins {wins['B']}, {wins['tie']} tied "
        f"(within {REACH_TOLERANCE:.0%})."
    )
    return "\n".join([*(f"note: {n}" for n in notes), *lines]) + "\n"
