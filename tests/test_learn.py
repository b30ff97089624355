"""Learning from the database (issue 29): the dataset (its schema, its split by op), the retrieved
examples in a model's prompt, and training (the loss falls, a run resumes where it stopped, the
folder proposes check-clean schedules), with one clear error for each bad input."""

# ruff: noqa: F811 (the fixtures of test_warmstart, imported, are parameters here)
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from test_warmstart import InstantMeasurer, convs, db, record, target  # noqa: F401
from typer.testing import CliRunner

from schedlang.cli import app
from schedlang.core.diagnostics import SchedlangError
from schedlang.core.opinfo import schedule_names
from schedlang.lang.syntax import parse
from schedlang.learn.dataset import (
    DATASET_SCHEMA,
    Sample,
    build_samples,
    read_dataset,
    split_by_op,
    write_dataset,
)
from schedlang.llm.messages import build_messages
from schedlang.llm.proposer import ModelProposer, review
from schedlang.llm.retrieval import _first_point, retrieve_examples
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Context
from schedlang.propose.warmstart import rename_schedule
from schedlang.store.db import Database
from schedlang.store.records import op_key
from schedlang.tuning.tune import Settings, tune

GOLDEN_FIELDS = [
    "gflops", "knobs", "latency_s", "op", "op_key", "op_name", "proposer", "quality", "rank",
    "record_id", "records", "relative", "schedule", "schema", "seed", "split", "target",
    "target_facts",
]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, convs, target) -> Path:
    """Three small convolutions tuned for 8 trials each, measured instantly (a latency from the
    schedule's text)."""
    import schedlang.tuning.tune as tune_module

    path = tmp_path_factory.mktemp("corpus") / "tune.db"
    saved, tune_module.Measurer = tune_module.Measurer, InstantMeasurer
    try:
        with Database(path) as database:
            for op in convs.values():
                tune(op, target, database, settings=Settings(trials=8, batch=8))
    finally:
        tune_module.Measurer = saved
    return path


# --- the dataset -----------------------------------------------------------------------------


def test_a_dataset_line_holds_the_op_the_target_the_schedule_and_its_rank(corpus, convs) -> None:
    with Database(corpus, read_only=True) as database:
        samples, report = build_samples(database)
    assert report.ops == 3 and report.samples == len(samples) and report.no_op_text == 0
    line = samples[0].to_json()
    assert sorted(line) == GOLDEN_FIELDS and line["schema"] == DATASET_SCHEMA == 1
    first = samples[0]
    assert first.op.startswith("op conv2d (") and "block conv2d" in first.op
    assert first.target_facts.startswith("CPU (llvm")
    assert first.rank == 1 and first.quality == "best" and first.relative == 1.0
    assert not first.schedule.startswith("#")  # printed canonically, without comments
    for key in {s.op_key for s in samples}:
        ranks = [s.rank for s in samples if s.op_key == key]
        assert ranks == list(range(1, len(ranks) + 1))
        latencies = [s.latency_s for s in samples if s.op_key == key]
        assert latencies == sorted(latencies)
    # Duplicates dropped: one line per op and schedule.
    assert len({(s.op_key, s.schedule) for s in samples}) == len(samples)


def test_the_split_holds_out_whole_ops_and_is_the_same_for_the_same_seed(corpus) -> None:
    with Database(corpus, read_only=True) as database:
        samples, _ = build_samples(database)
    split = split_by_op(samples, 0.34, seed=3)
    train = {s.op_key for s in split if s.split == "train"}
    test = {s.op_key for s in split if s.split == "test"}
    assert train and test and not train & test  # no held-out op (or shape) in training
    assert split == split_by_op(samples, 0.34, seed=3)
    with pytest.raises(SchedlangError, match="too small to split by op"):
        split_by_op([s for s in samples if s.op_key == samples[0].op_key], 0.5, 0)


def test_the_dataset_command_writes_lines_that_read_back(corpus, tmp_path) -> None:
    out = tmp_path / "data.jsonl"
    result = CliRunner().invoke(app, ["dataset", str(corpus), "-o", str(out), "--split", "0.34"])
    assert result.exit_code == 0, result.output
    assert "held out for test" in result.output
    samples = read_dataset(out)
    assert {s.split for s in samples} == {"train", "test"}
    assert all(isinstance(s, Sample) for s in samples)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not a JSON line"),
        ('{"schema": 99}', "a dataset of schema 99; this schedlang reads schema 1"),
        ('{"schema": 1, "op": "x"}', "no gflops, knobs"),
    ],
)
def test_a_bad_dataset_line_is_one_clear_error(tmp_path, line, message) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(line + "\n")
    result = CliRunner().invoke(app, ["train", str(path), "-o", str(tmp_path / "m")])
    assert result.exit_code == 1 and f"data.jsonl:1: {message}" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "m").exists()


def test_an_empty_foreign_or_damaged_database_is_one_clear_error(tmp_path) -> None:
    empty = tmp_path / "empty.db"
    Database(empty).close()
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.close()
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\xff" * 2000)
    expected = {
        empty: "holds no verified record",
        foreign: "is not a schedlang database",
        damaged: "damaged",
    }
    for path, message in expected.items():
        out = tmp_path / f"{path.stem}.jsonl"
        result = CliRunner().invoke(app, ["dataset", str(path), "-o", str(out)])
        assert result.exit_code == 1 and message in result.output, result.output
        assert "Traceback" not in result.output and not out.exists()


def test_a_dataset_round_trips_through_its_file(tmp_path) -> None:
    sample = Sample(
        "k", "op", "op op", {"kind": "llvm"}, "CPU", "block C:\n  unroll k\n", {}, 1e-6, 2.0,
        1, 1, 1.0, "best", "builtin", 0, 1,
    )  # fmt: skip
    write_dataset([sample], tmp_path / "d.jsonl")
    assert read_dataset(tmp_path / "d.jsonl") == [sample]


# --- retrieval -------------------------------------------------------------------------------


def add_template_point(db, op, target, gflops: float):
    """A record of `op`'s second built-in template at each knob's last value (not the first
    template: the lead-template guard shows that one anyway); the template."""
    template = BuiltinProposer().templates(Context(op, target))[1]
    space = {p.name.text: list(p.choices) for p in parse(template.text).params}
    db.add(record(
        op_key(op.func), gflops, template=template.text, extra=template.extra,
        knobs={name: values[-1] for name, values in space.items()}, target_key=target.key,
    ))  # fmt: skip
    return template


def test_a_models_prompt_holds_a_similar_ops_best_schedule_in_its_own_names(
    convs,
    target,
    db,
) -> None:
    add_template_point(db, convs["a"], target, 9.0)
    context = Context(convs["b"], target, db=db)
    retrieved, lead = retrieve_examples(context, 2)
    assert retrieved.extra["transferred_from"] == 1 and review(retrieved.text, context).ok
    # The record's family is not the op's first template's: that template's first point is
    # shown beside it, so that one tuned op does not steer the model to its family for good.
    first = BuiltinProposer().templates(Context(convs["b"], target))[0]
    assert lead.template == first.text and review(lead.text, context).ok
    assert "recipe's first choice for this op" in lead.extra["example"]
    prompt = build_messages(context, retrieved=[retrieved], static_examples=False)[1]["content"]
    assert retrieved.text.strip() in prompt and "similar op (conv_" in prompt
    assert "Example (conv on a CPU)" not in prompt  # static ones left out
    both = build_messages(context, retrieved=[retrieved])[1]["content"]
    assert retrieved.text.strip() in both and "Example (conv on a CPU)" in both
    # The proposer asks with what `examples` says.
    backend = type("Backend", (), {"name": "fake"})()
    static = ModelProposer(backend, examples="static").messages(context, [])[1]["content"]
    assert retrieved.text.strip() not in static
    assert retrieved.text.strip() in ModelProposer(backend).messages(context, [])[1]["content"]


def test_a_schedule_a_model_wrote_is_retrieved_in_the_ops_own_names(convs, target, db) -> None:
    # A model's record: no template, no family; its op named everything otherwise (`_m` added).
    first = BuiltinProposer().templates(Context(convs["a"], target))[0]
    ours = schedule_names(convs["a"].func)
    theirs = {kind: [f"{name}_m" for name in names] for kind, names in ours.items()}
    text = rename_schedule(_first_point(first).text, ours, theirs)
    assert text != _first_point(first).text
    context = Context(convs["b"], target, db=db)
    nest = ModelProposer(type("Backend", (), {"name": "fake"})()).nest(context)
    assert nest == BuiltinProposer().templates(context)[0].extra["nest"]  # kept in its records
    db.add(record(
        op_key(convs["a"].func), 30.0, schedule=text, template=None, knobs={},
        proposer="model:tiny", target_key=target.key,
        extra={"names": theirs, "nest": {**nest, "extents": [2 * e for e in nest["extents"]]}},
    ))  # fmt: skip
    [moved] = retrieve_examples(context, 1)
    assert moved.extra["transferred_from"] == 1 and moved.proposer == "model:tiny"
    assert moved.text == _first_point(first).text and review(moved.text, context).ok
    assert "similar op (model:tiny, 30.00 GFLOP/s)" in moved.extra["example"]
    # Names that do not correspond (another count of loops) carry nothing over.
    db.add(record(
        op_key(convs["wide"].func), 40.0, schedule=text, template=None, knobs={},
        proposer="model:tiny", target_key=target.key,
        extra={"names": {**theirs, "loops": theirs["loops"][1:]}, "nest": nest},
    ))  # fmt: skip
    assert [p.extra["transferred_from"] for p in retrieve_examples(context, 1)] == [1]


def test_the_built_in_warm_start_proposes_a_schedule_a_model_wrote(convs, target, db) -> None:
    """A model's record of a similar op (no template) is one of the built-in proposer's first
    candidates, in the op's names, beside the template points, nearest first."""
    first = BuiltinProposer().templates(Context(convs["a"], target))[0]
    ours = schedule_names(convs["a"].func)
    theirs = {kind: [f"{name}_m" for name in names] for kind, names in ours.items()}
    context = Context(convs["b"], target, db=db)
    nest = BuiltinProposer().templates(context)[0].extra["nest"]
    db.add(record(
        op_key(convs["a"].func), 30.0, schedule=rename_schedule(_first_point(first).text, ours,
        theirs), template=None, knobs={}, proposer="model:tiny", target_key=target.key,
        extra={"names": theirs, "nest": nest},
    ))  # fmt: skip
    second = add_template_point(db, convs["wide"], target, 9.0)
    proposer = BuiltinProposer()
    proposals = proposer.propose(context, [], count=8)
    moved, point = proposals[0], proposals[1]
    # The model's (distance 0: the same nest) first, as the concrete schedule it is, renamed.
    assert moved.extra["transferred_from"] == 1 and moved.template is None
    assert moved.text == _first_point(first).text and moved.proposer == "builtin"
    assert "model:tiny's schedule, transferred from #1" in moved.note
    assert point.extra["transferred_from"] == 2 and point.extra["family"] == second.extra["family"]
    assert any("proposed the schedule: transferred from #1" in d for d in proposer.decisions)
    assert BuiltinProposer(transfers=1).propose(context, [], count=8)[0].template is None


def test_renaming_a_schedule_replaces_names_not_suffixes_keywords_or_threads() -> None:
    text = (
        "block C:\n  tile i, j by 32x32\n  fuse i.o, j.o\n  parallel i.o_j.o\n"
        "  cache_write C local\n  reverse_compute_at C_local i.o_j.o\n  split k by 4\n"
        "  unroll k.i\n  bind i.i threadIdx.x\n"
    )
    theirs = {"blocks": ["C"], "loops": ["i", "j", "k"], "buffers": ["A", "B", "C"]}
    ours = {"blocks": ["out"], "loops": ["x0", "o", "r"], "buffers": ["a", "b", "out"]}
    assert rename_schedule(text, theirs, ours) == (
        "block out:\n  tile x0, o by 32x32\n  fuse x0.o, o.o\n  parallel x0.o_o.o\n"
        "  cache_write out local\n  reverse_compute_at out_local x0.o_o.o\n  split r by 4\n"
        "  unroll r.i\n  bind x0.i threadIdx.x\n"
    )
    assert rename_schedule(text, theirs, theirs) == text
    with pytest.raises(SchedlangError, match="different loops: 3 and 2"):
        rename_schedule(text, theirs, {**ours, "loops": ["x", "y"]})
    with pytest.raises(SchedlangError, match="`C` would need two names"):
        rename_schedule(text, theirs, {**ours, "buffers": ["a", "b", "c"]})


def test_a_similar_record_that_does_not_apply_is_dropped_and_logged(
    convs,
    target,
    db,
    caplog,
) -> None:
    # Knobs the op's template of that family does not have: it cannot be moved.
    db.add(record(op_key(convs["a"].func), 9.0, target_key=target.key, knobs={"ZZ": 3}))
    with caplog.at_level("INFO", logger="schedlang.llm.retrieval"):
        assert retrieve_examples(Context(convs["b"], target, db=db), 2) == []
    assert "retrieval: did not transfer #1 (conv_" in caplog.text


# --- training --------------------------------------------------------------------------------


TINY = ["--steps", "12", "--batch", "4", "--hidden-size", "32", "--layers", "1", "--lr", "1e-2"]


def test_training_lowers_the_loss_and_the_model_proposes_clean_schedules(
    corpus,
    convs,
    target,
    tmp_path,
) -> None:
    from schedlang.llm.spec import ModelSpec
    from schedlang.llm.trained import trained_info

    out = tmp_path / "model"
    result = CliRunner().invoke(app, ["train", str(corpus), "-o", str(out), *TINY, "-q"])
    assert result.exit_code == 0, result.output
    info = trained_info(out)
    assert info is not None and info["last_loss"] < info["first_loss"]
    spec = ModelSpec(str(out), candidates_per_round=2, max_new_tokens=200, answer_tokens=200)
    proposer = spec.proposer(spec.backend(), seed=0)
    assert proposer.trained and not proposer.backend.think
    context = Context(convs["b"], target)
    assert proposer.messages(context, [])[0]["content"].startswith("[quality: best]\n")
    proposals = proposer.propose(context, [], count=2)
    assert proposals and all(review(p.text, context).ok for p in proposals)


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(corpus, tmp_path) -> None:
    from schedlang.learn.train import TrainSettings, train

    settings = TrainSettings(steps=8, batch=4, hidden_size=32, layers=1, checkpoint_every=4)
    whole = train(corpus, tmp_path / "whole", settings)

    def stop(step: int, steps: int, loss: float) -> None:
        if step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(corpus, tmp_path / "cut", settings, progress=stop)
    with pytest.raises(SchedlangError, match="holds a training run already"):
        train(corpus, tmp_path / "cut", settings)
    resumed = train(corpus, tmp_path / "cut", settings, resume=True)
    assert resumed.losses == pytest.approx(whole.losses, rel=1e-5)
    again = train(corpus, tmp_path / "again", settings)
    assert again.losses == whole.losses  # the same seed, the same run


def test_lora_on_a_causal_lm_and_a_base_that_is_not_one(corpus, tmp_path) -> None:
    from schedlang.llm.trained import trained_info
    from schedlang.testing.tiny_model import build_tiny_model

    base = build_tiny_model(tmp_path / "base")
    out = tmp_path / "lora"
    args = ["train", str(corpus), "-o", str(out), "--base", str(base), "--steps", "3", "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    info = trained_info(out)
    assert info is not None and info["settings"]["base"] == str(base)
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    assert (out / "checkpoint" / "adapter_config.json").is_file()
    (tmp_path / "not-a-model").mkdir()
    args[args.index("--base") + 1] = str(tmp_path / "not-a-model")
    args[args.index("-o") + 1] = str(tmp_path / "bad")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "is not a causal language model" in result.output
    assert "Traceback" not in result.output


def test_a_one_block_ops_answer_is_written_as_stepwise_decoding_writes_it() -> None:
    from schedlang.learn.pairs import as_decoded

    op = "op matmul\nblock C  (reads A, B; writes C)\n  i  64  spatial\n"
    answer = as_decoded("block C:\n  split k by 8\n  unroll k.i\n", op)
    assert answer == "split k by 8\nunroll k.i\n"
    two = op + "block D  (reads C; writes D)\n"
    assert as_decoded("block C:\n  split k by 8\n", two) == "block C:\n  split k by 8\n"
    # Blocks a schedule makes (a cache's) get their header, as the decoder offers it, and so
    # does the default block when a statement comes back to it.
    cached = "block C:\n  cache_read B global at k\nblock B_global:\n  vectorize ax1\n"
    cached += "block C:\n  unroll k\n"
    assert as_decoded(cached, op) == (
        "cache_read B global at k\nblock B_global:\n  vectorize ax1\nblock C:\n  unroll k\n"
    )
    # Of several blocks, the only reduction one is the default (a conv after its padding).
    conv = "op conv\nblock pad  (reads x; writes pad)\n  h  30  spatial\nblock conv  (reads pad)\n"
    conv += "  h  28  spatial\n  rc  16  reduce\nflops: 1 MFLOP\n"
    assert as_decoded("block conv:\n  split h by 7\n  compute_at pad h.o\n", conv) == (
        "split h by 7\ncompute_at pad h.o\n"
    )
    # Two reductions (softmax): no default, every block named.
    softmax = conv.replace("  h  30  spatial", "  j  30  reduce")
    assert as_decoded("block conv:\n  split h by 7\n", softmax) == "block conv:\n  split h by 7\n"
