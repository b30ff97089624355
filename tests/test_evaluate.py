"""`schedlang eval-model`: a model scored against the built-in proposer, end to end with the tiny
random-weight model (schedlang.testing.tiny_model), in process and behind a loopback
OpenAI-compatible
server; every figure of the report checked against the arms' databases; an interrupted run
resumed; `--compare`; bad inputs.

Kept cheap: 32³ matmul and 16×16 softmax, 3 trials per arm, 64-token replies; the server run
shares the built-in arm of the first run (same work folder), so it tunes only its model arm.
"""

from __future__ import annotations

import json
import threading
from contextlib import closing
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("llguidance")

from typer.testing import CliRunner  # noqa: E402

from schedlang.cli import app  # noqa: E402
from schedlang.llm import eval_arms, eval_figures, evaluate  # noqa: E402
from schedlang.store.db import Database  # noqa: E402
from schedlang.store.records import Record  # noqa: E402
from schedlang.testing.tiny_model import build_tiny_model, make_server  # noqa: E402

TRIALS = 3
SHAPES = ["-D", "matmul.M=32", "-D", "matmul.N=32", "-D", "matmul.K=32", "-D", "rows=16"]
SHAPES += ["-D", "cols=16"]
REPLIES = ["--max-new-tokens", "64", "--answer-tokens", "64"]  # no reasoning: answers at once
ARM_KEYS = {
    "trials", "budget", "ok", "ok_rate", "best", "best_record", "reached_builtin_best",
    "wall_s", "wall_s_per_trial", "error",
}  # fmt: skip
MODEL_KEYS = {
    "replies", "answers", "no_answer", "repeats", "parsed", "parse_rate", "clean", "clean_rate",
    "repairs", "rounds", "tokens", "tokens_per_trial", "model_s", "model_s_per_trial",
}  # fmt: skip


def invoke(*args):
    return CliRunner().invoke(app, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(1)  # a tiny model runs several times faster on one thread
    return build_tiny_model(tmp_path_factory.mktemp("tiny-eval"))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("eval")


def _interrupt_softmax_model_arm(monkeypatch) -> None:
    """Stop the run (as Ctrl-C would) after the first trial of the model arm on softmax."""
    import schedlang.tuning.tune

    tune_steps = schedlang.tuning.tune.tune_steps

    def interrupted(op, target, db, **options):
        steps = tune_steps(op, target, db, **options)
        with closing(steps):
            while True:
                try:
                    state = next(steps)
                except StopIteration as finished:
                    return finished.value
                yield state
                if op.name == "softmax" and "model" in Path(db.path).name:
                    raise KeyboardInterrupt

    monkeypatch.setattr(schedlang.tuning.tune, "tune_steps", interrupted)


@pytest.fixture(scope="module")
def local_run(tiny_dir, work):
    """The run over matmul and softmax, interrupted once and rerun: (first, second, report)."""
    args = ["eval-model", "--model", tiny_dir, "--ops", "matmul,softmax", *SHAPES, *REPLIES]
    args += ["--trials", TRIALS, "--db", work / "main.db", "-o", work / "local.json"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        _interrupt_softmax_model_arm(monkeypatch)
        first = invoke(*args)
        partial = json.loads((work / "local.json").read_text())
    second = invoke(*args)
    assert second.exit_code == 0, second.output
    return first, partial, second, json.loads((work / "local.json").read_text())


def _records(path: str, op: dict, target_key: str) -> list[Record]:
    with Database(path, read_only=True) as db:
        return [r for r in db.records(op["op_key"], target_key) if not r.extra.get("baseline")]


def test_the_report_holds_every_figure_and_agrees_with_the_databases(local_run, work):
    *_, report = local_run
    target_key = json.dumps(report["settings"]["target"], sort_keys=True, separators=(",", ":"))
    assert [op["op"] for op in report["ops"]] == ["matmul", "softmax"]
    assert report["ops"][0]["defines"] == {"M": "32", "N": "32", "K": "32"}
    assert report["complete"] and set(report["total"]) == {"model", "builtin"}
    main_best = []
    for op in report["ops"]:
        assert op["baseline"]["gflops"] > 0  # measured once, by the model arm
        builtin_best = None
        for kind in ("builtin", "model"):
            figures = op[kind]
            assert ARM_KEYS | (MODEL_KEYS if kind == "model" else set()) <= set(figures)
            records = _records(report["arms"][kind]["db"], op, target_key)
            assert figures["trials"] == len(records) == TRIALS  # every answer parsed: all trials
            assert figures["ok"] == sum(r.is_ok for r in records)
            ok = [r for r in records if r.is_ok]
            fastest = min(ok, key=lambda r: r.median_s)  # the tiny ops always have one
            [point] = figures["best"]  # 3 trials: no figure after 8 or 16
            assert point["after"] == TRIALS and point["record"] == fastest.id
            assert point["latency_s"] == fastest.median_s and point["gflops"] == fastest.gflops
            assert figures["wall_s"] > 0
            assert figures["wall_s_per_trial"] == pytest.approx(figures["wall_s"] / TRIALS, 1e-3)
            builtin_best = builtin_best or fastest.median_s
            within = [r.is_ok and r.median_s <= builtin_best * 1.05 for r in records]
            reached = within.index(True) + 1 if any(within) else None
            assert figures["reached_builtin_best"] == reached
            main_best.append(fastest.median_s)
        model = op["model"]
        # Per-statement decoding: every answer parses and checks clean.
        assert model["parsed"] == model["clean"] == model["answers"] >= 1
        assert model["parse_rate"] == model["clean_rate"] == 1.0
        records = _records(report["arms"]["model"]["db"], op, target_key)
        answers = {(r.extra["run_id"], r.template) if r.template else r.id for r in records}
        assert model["answers"] == len(answers)
        replied = sum(r.extra["reply"]["tokens"] for r in records if not r.template)
        assert model["tokens"] >= replied > 0
        assert model["tokens_per_trial"] == pytest.approx(model["tokens"] / TRIALS, 1e-3)
        assert model["repairs"]["asked"] == 0  # per-statement answers are never repaired
        assert model["repairs"]["resampled"] == sum(
            len(r.extra["steps"]["rejected"]) for r in records if not r.template
        )
        assert all(r.extra["eval"]["arm"] == report["arms"]["model"]["id"] for r in records)
    # Every record went to the tuning database too, and `best` reads it from there.
    with Database(work / "main.db", read_only=True) as db:
        for op in report["ops"]:
            for kind in ("builtin", "model"):
                for record in _records(report["arms"][kind]["db"], op, target_key):
                    assert db.get(record.op_key, record.target_key, record.schedule) is not None
        assert db.best(report["ops"][0]["op_key"], target_key)[0].median_s <= min(main_best[:2])
    matmul = ["examples/matmul.py", "-D", "M=32", "-D", "N=32", "-D", "K=32"]
    best = invoke("best", *matmul, "--db", work / "main.db")
    assert best.exit_code == 0 and "GFLOP/s" in best.stdout


def test_the_settings_that_repeat_a_run_are_recorded(local_run, tiny_dir):
    *_, report = local_run
    settings = report["settings"]
    assert settings["seed"] == 0 and settings["trials"] == TRIALS
    assert (
        settings["model"]["model"] == str(tiny_dir) and settings["model"]["decoding"] == "stepwise"
    )
    arm = settings["arm"]
    assert arm["sampling"] == {
        "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 64, "answer_tokens": 64, "think": True,
    }  # fmt: skip
    assert arm["grammar"]["decoding"] == "stepwise" and arm["grammar"]["limits"]["statements"] == 8
    assert arm["prompts"] == eval_arms.prompt_digest()
    assert Path(report["arms"]["model"]["db"]).stem == report["arms"]["model"]["id"]
    table = (Path(report["arms"]["model"]["db"]).parent.parent / "local.md").read_text()
    assert table.count("| matmul (M=32 N=32 K=32) |") == 2 and "| **total** | model |" in table


def test_an_interrupted_run_resumes_where_it_stopped(local_run, tiny_dir, work):
    first, partial, second, report = local_run
    assert first.exit_code == 130
    # The report is written after each op: the interrupted run left matmul's.
    assert not partial["complete"] and [op["op"] for op in partial["ops"]] == ["matmul"]
    assert "nothing to do" in second.stderr and "resuming after 1" in second.stderr
    softmax = report["ops"][1]
    with Database(report["arms"]["model"]["db"], read_only=True) as db:
        runs = [r for r in db.runs(softmax["op_key"]) if r["proposer"] == "eval:model"]
    assert len(runs) == 2 and softmax["model"]["trials"] == TRIALS
    # A run with nothing left to do measures nothing.
    args = ["eval-model", "--model", tiny_dir, "--ops", "matmul,softmax", *SHAPES, *REPLIES]
    args += ["--trials", TRIALS, "--db", work / "main.db", "--work", work / "local.runs"]
    again = invoke(*args, "-o", work / "again.json")
    assert again.exit_code == 0, again.output
    assert again.stderr.count("nothing to do") == 4 and "[model" not in again.stderr
    assert json.loads((work / "again.json").read_text())["ops"] == report["ops"]


@pytest.fixture(scope="module")
def http_report(tiny_dir, work, local_run):
    server = make_server(str(tiny_dir))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        result = invoke(
            "eval-model", "--endpoint", url, "--model-name", "tiny", "--ops", "softmax",
            "-D", "rows=16", "-D", "cols=16", *REPLIES, "--trials", TRIALS,
            "--db", work / "main.db", "--work", work / "local.runs", "-o", work / "http.json",
        )  # fmt: skip
    finally:
        server.shutdown()
    assert result.exit_code == 0, result.output
    assert server.received and all(body["model"] == "tiny" for body in server.received)
    return result, json.loads((work / "http.json").read_text())


def test_a_model_behind_a_server_is_scored_the_same_way(http_report, local_run):
    result, report = http_report
    *_, local = local_run
    assert report["settings"]["model"]["endpoint"].startswith("http://127.0.0.1:")
    # The built-in arm is the first run's: shared through the work folder, not tuned again.
    assert report["arms"]["builtin"] == local["arms"]["builtin"]
    assert report["ops"][0]["builtin"] == local["ops"][1]["builtin"]
    assert "builtin: 3 trials in builtin-seed0.db, nothing to do" in result.stderr
    assert report["arms"]["model"]["id"] != local["arms"]["model"]["id"]
    model = report["ops"][0]["model"]
    assert set(model) >= MODEL_KEYS | ARM_KEYS
    assert model["trials"] == TRIALS and model["parse_rate"] == 1.0 and model["tokens"] > 0


def test_compare_says_which_run_wins_per_op(http_report, work):
    result = invoke("eval-model", "--compare", work / "local.json", work / "http.json")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    softmax = next(line for line in lines if line.startswith("| softmax"))
    assert softmax.split(" | ")[3] in ("A", "B", "tie")
    matmul = next(line for line in lines if line.startswith("| matmul"))
    assert matmul.split(" | ")[2:4] == ["—", "—"]  # only in A
    assert "A wins" in result.stdout and "tied" in result.stdout
    bad = invoke("eval-model", "--compare", work / "local.md", work / "http.json")
    assert bad.exit_code == 1 and "is not JSON" in bad.stderr


def test_bad_inputs_are_clear_errors(tiny_dir, tmp_path):
    unknown = invoke(
        "eval-model", "--model", tiny_dir, "--ops", "matmull", "-o", tmp_path / "x.json"
    )
    assert unknown.exit_code == 1
    assert "unknown op `matmull`" in unknown.stderr and "did you mean `matmul`?" in unknown.stderr
    missing = invoke(
        "eval-model", "--model", tmp_path / "no-such-model", "--ops", "softmax",
        "--db", tmp_path / "x.db", "-o", tmp_path / "x.json",
    )  # fmt: skip
    assert missing.exit_code == 1 and "no-such-model" in missing.stderr
    assert "Traceback" not in missing.output
    shape = invoke("eval-model", "--model", tiny_dir, "--ops", "softmax", "-D", "M=32")
    assert shape.exit_code == 1 and "no op of the suite has a parameter `M`" in shape.stderr
    nameless = invoke("eval-model", "--endpoint", "http://127.0.0.1:1/v1", "--ops", "softmax")
    assert nameless.exit_code == 1 and "--model-name" in nameless.stderr
    from importlib.util import find_spec

    if find_spec("xgboost") is None:  # MetaSchedule's cost model
        args = ["--ops", "softmax", "--db", tmp_path / "x.db", "-o", tmp_path / "x.json"]
        ms = invoke("eval-model", "--model", tiny_dir, *args, "--metaschedule")
        assert ms.exit_code == 1 and "MetaSchedule arm needs xgboost" in ms.stderr
    assert not (tmp_path / "x.json").exists()


# --- the figures' rules, on records made up here -------------------------------------------------


def _record(number: int, median_s: float | None, status: str = "ok") -> Record:
    return Record(
        op_key="00", op_name="op", target_key="t", target={}, schedule=f"# {number}\n",
        knobs={}, template=None, status=status, reason="", latencies_s=(),
        median_s=median_s, gflops=1 / median_s if median_s else None, proposer="builtin",
        seed=0, created_at=float(number), schedlang_version="0", tvm_version="0", id=number,
    )  # fmt: skip


def test_checkpoints_and_the_trial_that_reaches_a_latency():
    assert eval_figures.checkpoints(32) == [8, 16, 32]
    assert eval_figures.checkpoints(16) == [8, 16]
    assert eval_figures.checkpoints(3) == [3]
    trials = [_record(1, 4.0), _record(2, None, "wrong"), _record(3, 2.05), _record(4, 1.0)]
    assert eval_figures.trials_to_reach(trials, 2.0) == 3  # within 5 %
    assert eval_figures.trials_to_reach(trials, 0.5) is None
    assert eval_figures.trials_to_reach(trials, None) is None


def test_compare_calls_a_tie_within_the_noise():
    def report(latency: float | None) -> dict:
        point = {"after": 4, "gflops": 1 / latency if latency else None, "latency_s": latency}
        model = {"best": [point], "ok": 4, "trials": 4}
        return {"ops": [{"op": "mm", "op_key": "00", "shape": "", "model": model}]}

    assert evaluate.compare(report(1.0), report(1.03))[0].winner == "tie"
    assert evaluate.compare(report(1.0), report(2.0))[0].winner == "A"
    assert evaluate.compare(report(None), report(2.0))[0].winner == "B"


@pytest.mark.parametrize(
    "name, table",
    [("eval.json", "eval.md"), ("results", "results.md"), ("eval.md", "eval.md.md")],
)
def test_eval_model_o_writes_its_json_to_out_as_named_and_the_table_beside_it(
    tmp_path, monkeypatch, name, table
):
    """`-o OUT` puts the JSON in OUT itself, as the help says, and the table never on top of it."""
    monkeypatch.setattr(evaluate, "markdown", lambda data: "| table |\n")
    data = {"model": "m", "ops": []}
    written = evaluate.write_report(data, tmp_path / name)
    assert written == (tmp_path / name, tmp_path / table)
    assert json.loads((tmp_path / name).read_text()) == data
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({name, table})


def test_eval_model_help_says_where_o_writes():
    result = CliRunner().invoke(app, ["eval-model", "--help"], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    assert "written to OUT as named" in text and "OUT.json" not in text.replace("OUT.json →", "")
