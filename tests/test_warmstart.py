"""The warm start: the best records of similar ops (schedlang.store.similar), moved onto a new op's
templates (schedlang.propose.warmstart) and proposed first by the built-in proposer, each checked;
in `tune` and in `tune_model`, where a task starts from the tasks like it measured before it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from schedlang.core.ops import Op, load_op
from schedlang.core.target import resolve_target
from schedlang.lang.syntax import parse
from schedlang.models.graph import Task
from schedlang.models.tune_model import tune_model
from schedlang.propose import builtin
from schedlang.propose.builtin import BuiltinProposer
from schedlang.propose.interface import Context
from schedlang.propose.warmstart import Transferred, nearest, nest_of, transfer
from schedlang.store.db import Database
from schedlang.store.records import Record, Status, op_key
from schedlang.store.similar import nest_distance, similar_records
from schedlang.tuning.tune import Settings, tune

CONV = Path(__file__).resolve().parent.parent / "examples" / "conv2d.py"
CPU, OTHER_CPU = '{"kind":"llvm"}', '{"kind":"llvm","mcpu":"znver4"}'


def nest(*extents: int, kind: str = "conv", loops: str = "SSSSRRR") -> dict:
    return {"kind": kind, "loops": loops, "extents": list(extents)}


def record(key: str, gflops: float, **changes) -> Record:
    """A verified conv_acc record of op `key` (its median from its GFLOP/s, at 1 GFLOP)."""
    made = Record(
        op_key=key, op_name=f"conv_{key}", target_key=CPU, target={"kind": "llvm"},
        schedule=f"# {key} {gflops}\n", knobs={"KT": 8, "HT": 4, "U": 16},
        template="# the template\n", status=Status.OK, reason="", latencies_s=(1 / gflops,),
        median_s=1 / gflops, gflops=gflops, proposer="builtin", seed=0, created_at=0.0,
        schedlang_version="0", tvm_version="0",
        extra={"family": "conv_acc", "nest": nest(1, 64, 56, 56, 64, 3, 3)},
    )  # fmt: skip
    return dataclasses.replace(made, **changes)


@pytest.fixture
def db(tmp_path: Path):
    with Database(tmp_path / "tune.db") as database:
        yield database


@pytest.fixture(scope="module")
def target():
    # The recipes' own templates: at these small shapes the one-thread forms would come first.
    return dataclasses.replace(resolve_target("llvm"), serial_work=0)


@pytest.fixture(scope="module")
def convs() -> dict[str, Op]:
    """Two small convolutions at neighbouring shapes, and one twice as wide."""
    shapes = {
        "a": {"C": "8", "K": "16", "H": "8", "W": "16"},
        "b": {"C": "16", "K": "16", "H": "8", "W": "8"},
        "wide": {"C": "8", "K": "32", "H": "8", "W": "16"},
    }
    return {name: load_op(str(CONV), shape) for name, shape in shapes.items()}


# --- similar records -----------------------------------------------------------------------------


def test_the_distance_is_on_log_extents_and_only_between_nests_alike() -> None:
    assert nest_distance(nest(1, 64, 56, 56, 64, 3, 3), nest(1, 128, 28, 28, 128, 3, 3)) == 2.0
    assert nest_distance(nest(1, 64, 56, 56, 64, 3, 3), nest(1, 64, 56, 56, 64, 1, 1)) == (
        pytest.approx(math.sqrt(2) * math.log2(3))
    )
    assert nest_distance(nest(1, 2), nest(1, 2, kind="matmul")) is None
    assert nest_distance(nest(4, 8, loops="SR"), nest(4, 8, loops="SS")) is None
    assert nest_distance(nest(4, 8, loops="SR"), {"kind": "conv", "loops": "SR"}) is None
    assert nest_distance(nest(4, 0, loops="SR"), nest(4, 8, loops="SR")) is None


def test_similar_records_are_the_nearest_ops_best_on_the_same_target_of_the_same_kind(db) -> None:
    here, near = nest(1, 64, 56, 56, 64, 3, 3), nest(1, 64, 28, 28, 64, 3, 3)

    def add(key: str, gflops: float, family: str = "conv_acc", **nest_or_not) -> None:
        extra = {"family": family, **nest_or_not}
        db.add(record(key, gflops, schedule=f"{key} {gflops} {family}", extra=extra))

    add("self", 99.0, nest=here)
    add("near", 10.0, nest=near)
    add("near", 20.0, nest=near)
    add("far", 50.0, nest=nest(1, 512, 7, 7, 512, 3, 3))
    db.add(record("other_cpu", 80.0, target_key=OTHER_CPU))
    add("matmul", 80.0, nest=nest(1, 64, 56, 56, 64, 3, 3, kind="matmul"))
    db.add(record("wrong", 99.0, status=Status.WRONG))
    add("no_nest", 80.0)
    add("odd", 80.0, family="conv_direct", nest=here)
    found = similar_records(db, CPU, here, exclude_op_key="self", families={"conv_acc"})
    assert [(s.record.op_key, s.record.gflops) for s in found] == [("near", 20.0), ("far", 50.0)]
    assert found[0].distance == pytest.approx(math.sqrt(2))
    # Without a family asked for, each op's fastest record of any family; `n` at most.
    found = similar_records(db, CPU, here, exclude_op_key="self", n=2)
    assert [s.record.op_key for s in found] == ["odd", "near"]
    assert similar_records(db, CPU, {"kind": "conv"}, exclude_op_key="self") == []


def test_a_record_whose_extra_is_not_json_is_left_out(db) -> None:
    import sqlite3

    here = nest(1, 64, 56, 56, 64, 3, 3)
    db.add(record("near", 10.0, extra={"family": "conv_acc", "nest": here}))
    damaged = db.add(record("damaged", 50.0, extra={"family": "conv_acc", "nest": here}))
    with sqlite3.connect(db.path) as conn:
        conn.execute("UPDATE records SET extra = 'not json {' WHERE id = ?", (damaged,))
    found = similar_records(db, CPU, here, exclude_op_key="self")
    assert [s.record.op_key for s in found] == ["near"]


# --- moving a record onto a new op's template ----------------------------------------------------


def test_knob_values_carry_over_where_offered_and_map_to_the_nearest_otherwise(
    convs, target
) -> None:
    templates = BuiltinProposer().templates(Context(convs["a"], target))
    acc = next(t for t in templates if t.extra["family"] == "conv_acc")
    space = {p.name.text: list(p.choices) for p in parse(acc.text).params}
    kept = {name: values[-1] for name, values in space.items()}
    moved = transfer(record("x", 1.0, id=7, knobs=kept), templates)
    assert isinstance(moved, Transferred) and moved.changes == ()
    assert moved.proposal.knobs == kept and moved.proposal.template == acc.text
    assert moved.proposal.extra["transferred_from"] == 7
    assert not parse(moved.proposal.text).is_template
    # KT = 64 is not offered at this shape (16 output channels): the nearest offered value.
    name = next(iter(space))
    moved = transfer(record("x", 1.0, id=7, knobs={**kept, name: 4096, "gone": 3}), templates)
    assert isinstance(moved, Transferred)
    assert moved.proposal.knobs[name] == nearest(4096, space[name]) == max(space[name])
    assert moved.changes[0].startswith(f"{name} 4096 -> {max(space[name])} (offered: ")
    assert nearest(7, [4, 8, 2]) == 8 and nearest(3, [4, 2]) == 4 and nearest(0, [1, 2]) == 1


def test_a_record_that_cannot_be_moved_says_why(convs, target) -> None:
    templates = BuiltinProposer().templates(Context(convs["a"], target))
    assert transfer(record("x", 1.0, extra={"family": "matmul_panels"}), templates) == (
        "the op has no `matmul_panels` template"
    )
    why = transfer(record("x", 1.0, knobs={"TI": 8}), templates)
    assert isinstance(why, str)
    assert why.startswith("its knobs (TI) are not those of the op's `conv_acc` template")


def test_the_nest_is_the_heaviest_blocks_loops(convs, target) -> None:
    assert nest_of(convs["a"], "conv") == nest(1, 16, 8, 16, 8, 3, 3)
    [template, *_] = BuiltinProposer().templates(Context(convs["a"], target))
    assert template.extra["nest"] == nest(1, 16, 8, 16, 8, 3, 3)


# --- the proposer --------------------------------------------------------------------------------


def test_a_new_op_starts_from_the_nearest_ops_best_points_first(convs, target, db) -> None:
    proposer = BuiltinProposer()
    templates = {k: proposer.templates(Context(convs[k], target)) for k in ("a", "wide")}
    for key, gflops in (("wide", 5.0), ("a", 9.0)):
        template = templates[key][1]  # not the first template: the warm start's goes first
        space = {p.name.text: list(p.choices) for p in parse(template.text).params}
        point = {name: values[-1] for name, values in space.items()}
        db.add(record(
            op_key(convs[key].func), gflops, template=template.text, knobs=point,
            extra=template.extra, target_key=target.key,
        ))  # fmt: skip
    logged: list[str] = []
    context = Context(convs["b"], target, db=db, log=logged.append)
    proposals = BuiltinProposer().propose(context, [], count=8)
    transferred = [p for p in proposals if p.template]
    first, handed = transferred[0], proposals[len(transferred)]
    assert proposals[: len(transferred)] == transferred  # the points first, then the templates
    # Nearest first: b (16 -> 16, 8 x 8) is nearer a (8 -> 16, 8 x 16) than the wide one.
    assert first.extra["transferred_from"] == 2 and first.knobs
    assert first.template == handed.text and handed.extra["family"] == first.extra["family"]
    assert "a point of it is transferred" in handed.extra["why"]
    # The recipe's first template is handed out beside the transferred points' template, though
    # that one alone has points enough for two batches.
    lead = BuiltinProposer().templates(Context(convs["b"], target))[0]
    assert lead.text != handed.text and lead.text in [p.text for p in proposals if not p.template]
    assert logged[0].startswith(f"builtin proposer: proposed {first.extra['family']} {{")
    assert "transferred from #2 (conv_" in logged[0]
    # Once a template point of the op is measured, or with the warm start off: no transfer.
    measured = [record("b", 1.0, template=first.template, knobs=first.knobs)]
    assert not any(p.template for p in BuiltinProposer().propose(context, measured, count=8))
    assert not any(p.template for p in BuiltinProposer(transfers=0).propose(context, [], count=8))
    # At most `transfers` points.
    assert len([p for p in BuiltinProposer(1).propose(context, [], count=8) if p.template]) == 1


def test_a_transferred_point_failing_its_check_is_dropped_with_the_reason(
    convs, target, db, monkeypatch
) -> None:
    template = BuiltinProposer().templates(Context(convs["a"], target))[0]
    db.add(record(
        op_key(convs["a"].func), 5.0, template=template.text, extra=template.extra,
        target_key=target.key,
    ))  # fmt: skip
    broken = transfer(record("x", 1.0, id=1, extra=template.extra), [template])
    assert isinstance(broken, Transferred)
    text = "block conv2d:\n  split q by 4\n"
    broken = dataclasses.replace(broken, proposal=dataclasses.replace(broken.proposal, text=text))
    monkeypatch.setattr(builtin, "transfer", lambda record, templates: broken)
    logged: list[str] = []
    proposer = BuiltinProposer()
    proposals = proposer.propose(Context(convs["b"], target, db=db, log=logged.append), [], count=8)
    assert not any(p.template for p in proposals)  # nothing transferred: the templates only
    assert proposer.decisions[0].startswith("dropped the point transferred from #1 (conv_")
    assert "line 2: " in proposer.decisions[0] and "`q`" in proposer.decisions[0]
    assert logged == [f"builtin proposer: {proposer.decisions[0]}"]


# --- tune and tune-model -------------------------------------------------------------------------


class InstantMeasurer:
    """The tuner's Measurer without building or running: a latency from the candidate's text."""

    def __init__(self, op, target, settings, work_dir, *, workers=None):
        self.flops = 1_000_000

    def measure(self, candidates, repeat=None):
        from schedlang.run.outcome import Outcome

        for candidate in candidates:
            latency = 1e-3 * (1 + sum(map(ord, candidate.text)) % 97 / 97)
            yield candidate, Outcome(Status.OK, latencies_s=(latency, latency))

    def close(self) -> None:
        pass


def test_tune_measures_the_transferred_points_first_as_points_of_their_template(
    convs, target, db, monkeypatch
) -> None:
    import schedlang.tuning.tune as tune_module

    monkeypatch.setattr(tune_module, "Measurer", InstantMeasurer)
    first = tune(convs["a"], target, db, settings=Settings(trials=8, batch=8))
    second = tune(convs["b"], target, db, settings=Settings(trials=8, batch=8))
    head = second.records[0]
    assert head.extra["transferred_from"] == first.best.id
    assert head.template and head.knobs and head.extra["family"] == first.best.extra["family"]
    assert not any("transferred_from" in r.extra for r in first.records)
    log = db.decisions(second.run_id)
    assert any(line.startswith("schedule: ") and "transferred from" in line for line in log)
    # The point is one of its template's: never drawn again by the template's search.
    assert len({r.schedule for r in second.records}) == len(second.records)


def test_a_model_task_starts_from_the_best_of_a_task_like_it_measured_before(
    convs, target, db, monkeypatch
) -> None:
    import schedlang.tuning.tune as tune_module

    monkeypatch.setattr(tune_module, "Measurer", InstantMeasurer)
    tasks = [
        Task(name, convs[name], op_key(convs[name].func), (name,), 1, 10_000 - n)
        for n, name in enumerate(("a", "b"))
    ]
    turns = list(tune_model(tasks, target, db, Settings(batch=4), trials=8))
    assert [t.state.task.name for t in turns] == ["a", "b"]
    # The first task's fastest template point (its unscheduled build has no template to move).
    best_a = min(turns[0].result.records, key=lambda r: r.median_s)
    assert turns[1].result.records[0].extra["transferred_from"] == best_a.id
    assert "transferred_from" not in turns[0].result.records[0].extra


def test_no_warm_start_makes_the_built_in_proposer_start_cold() -> None:
    from schedlang.workflows import proposer_named

    assert proposer_named("builtin").transfers == BuiltinProposer.TRANSFERS
    assert proposer_named("builtin", warm_start=False).transfers == 0
    assert BuiltinProposer(0).again().transfers == 0


def test_tune_model_says_where_a_round_started_warm(capsys) -> None:
    from types import SimpleNamespace

    from schedlang.cli.model import _print_turn

    moved = record("b", 2.0, id=9, extra={"transferred_from": 4})
    result = SimpleNamespace(records=[moved, record("b", 1.0, id=10)], best=moved)
    scheduler = SimpleNamespace(estimate_s=lambda: (1e-3, 0))
    state = SimpleNamespace(task=SimpleNamespace(name="conv_b"))
    _print_turn(SimpleNamespace(state=state, error=None, result=result, scheduler=scheduler))
    assert "(warm start from #4: the best)" in capsys.readouterr().out
