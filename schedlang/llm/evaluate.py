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

This module holds the suite, the evaluation and its report (JSON, markdown, two compared); the
arms and how each is run are schedlang.llm.eval_arms, the figures schedlang.llm.eval_figures.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang.core.diagnostics import SchedlangError, did_you_mean, one_of
from schedlang.core.ops import Op, load_op, parse_defines, split_op_spec
from schedlang.core.target import Target
from schedlang.core.units import format_seconds
from schedlang.llm.eval_arms import (
    Arm,
    MeteredBackend,
    arm_steps,
    builtin_arm,
    copy_records,
    metaschedule_arm,
    metaschedule_steps,
    model_arm,
    require_metaschedule,
)
from schedlang.llm.eval_figures import (
    CHECKPOINTS,
    REACH_TOLERANCE,
    checkpoints,
    figures,
    metaschedule_figures,
    total_figures,
)
from schedlang.llm.spec import ModelSpec
from schedlang.store.db import Database
from schedlang.store.records import current_versions, op_key

if TYPE_CHECKING:
    from schedlang.llm.compiled import BuildStepModel

FORMAT = "schedlang-eval/1"
ARMS = ("model", "builtin", "metaschedule")


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
    suite: list[SuiteOp] = []
    used: set[str] = set()
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


def evaluation_steps(
    evaluation: Evaluation, db: Database, build: BuildStepModel | None = None
) -> Generator[str, None, dict]:
    """Run every arm on every op (resuming what the work folder holds), add the records to `db`,
    and write the report (JSON and markdown) after each op: a line of progress at each step,
    then the report (the generator's return value). `build`: what builds the model on
    schedlang's runtime (ModelSpec.backend)."""
    from schedlang.propose.builtin import BuiltinProposer

    work, seed, spec = evaluation.work_dir, evaluation.seed, evaluation.spec
    if evaluation.metaschedule:
        require_metaschedule()
    backend = spec.backend(build)
    if hasattr(backend, "expected_time"):
        yield backend.expected_time()
    meter = MeteredBackend(backend)
    evaluation.arms = {
        "model": model_arm(spec, spec.proposer(meter, seed).settings(), seed, work),
        "builtin": builtin_arm(seed, work),
    }
    if evaluation.metaschedule:
        evaluation.arms["metaschedule"] = metaschedule_arm(seed, work)
    for number, item in enumerate(evaluation.suite, 1):
        shape = f" ({item.shape})" if item.shape else ""
        yield f"[{number}/{len(evaluation.suite)}] {item.label}{shape} on {evaluation.target.kind}"
        common = (item.op, evaluation.target, evaluation.trials, seed)
        # Cold, as the model starts: the arms compare what each proposer makes of one op alone.
        yield from arm_steps(evaluation.arms["builtin"], *common, lambda _: BuiltinProposer(0))
        yield from arm_steps(
            evaluation.arms["model"],
            *common,
            lambda rounds: spec.proposer(meter, seed, rounds),
            meter=meter,
            baseline=True,  # the model is told each candidate's speedup over it
        )
        if evaluation.metaschedule:
            yield from metaschedule_steps(evaluation.arms["metaschedule"], *common)
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
                arms["metaschedule"].path, item.op, target, trials, builtin_latency
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


def table_path(out: Path) -> Path:
    """Where the markdown table of a report written to `out` goes: `eval.json` → `eval.md`;
    any other name gets `.md` added (`results` → `results.md`, `eval.md` → `eval.md.md`), so
    that the table never replaces the report."""
    return out.with_suffix(".md") if out.suffix == ".json" else out.with_name(out.name + ".md")


def write_report(data: dict, out: Path) -> tuple[Path, Path]:
    """The report (JSON) to `out` exactly, and its markdown table beside it (`table_path`)."""
    markdown_path = table_path(out)
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
    winner = "tie" if abs(ratio - 1) <= REACH_TOLERANCE else "A" if ratio < 1 else "B"
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
