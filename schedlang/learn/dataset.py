"""A dataset of the tuning database: one JSON line per verified record, what a model learns to
write schedules from (`schedlang dataset DB -o data.jsonl`; docs/cli.md, "Learning from the
database", documents the fields).

Each line is a `Sample`: the op as `schedlang show` prints it and the target's facts (both kept by
the tuner in its run's settings), the schedule printed canonically, its knobs, latency and
GFLOP/s, its rank among its op's verified records on that target (1: the fastest) and the quality
token that rank gives (schedlang.llm.trained), the op's key and name, the target, the proposer and
seed, and the split it belongs to.

    samples, report = build_samples(db)
    samples = split_by_op(samples, test_fraction=0.1, seed=0)
    write_dataset(samples, Path("data.jsonl"))

What is left out: records that did not verify (or are the op's unscheduled build), schedules that
no longer parse, duplicates (the same op, target and schedule once its comments are gone: the
fastest is kept), and records whose run did not keep the op's text (tuned before it was kept):
`Report` counts each.

The split is by op: every record of a held-out op (its structural key: a shape is an op of its
own, and names do not count) is in `test`, so no held-out op or shape appears in `train`.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from schedlang.core.diagnostics import SchedlangError
from schedlang.llm.trained import quality_of
from schedlang.store.db import Database
from schedlang.store.records import Record

DATASET_SCHEMA = 1
SPLITS = ("train", "test")


@dataclass(frozen=True)
class Sample:
    """One verified record, as a model learns from it (one line of a dataset)."""

    op_key: str  # the op's structural hash: equal for equal computations, whatever the names
    op_name: str
    op: str  # the op as `schedlang show` prints it
    target: dict  # the TVM target dict
    target_facts: str  # what the model is told about the target (`Target.describe`)
    schedule: str  # canonically printed, without comments
    knobs: dict[str, int]
    latency_s: float  # median
    gflops: float
    rank: int  # among the op's verified records on this target; 1 is the fastest
    records: int  # how many there are
    relative: float  # the fastest one's latency over this one's: 1.0 for the fastest
    quality: str  # the rank as the token a model is conditioned on (schedlang.llm.trained)
    proposer: str
    seed: int | None
    record_id: int | None
    split: str = "train"
    schema: int = DATASET_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sample:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class Report:
    """What went into a dataset and what was left out, and why."""

    samples: int
    ops: int
    unverified: int  # not ok, no latency, or the op's unscheduled build
    unparsed: int  # a schedule that no longer parses
    duplicates: int
    no_op_text: int  # their run did not keep the op's text
    test_ops: int = 0
    test_samples: int = 0

    def lines(self) -> list[str]:
        left = [
            f"{self.unverified} not verified" if self.unverified else "",
            f"{self.duplicates} duplicates" if self.duplicates else "",
            f"{self.unparsed} no longer parse" if self.unparsed else "",
            f"{self.no_op_text} of runs that did not keep the op's text (tuned before schedlang "
            "kept it: tune the op again to include it)"
            if self.no_op_text
            else "",
        ]
        said = [f"{self.samples} samples of {self.ops} ops"]
        if self.test_ops:
            said.append(
                f"split by op: {self.test_ops} ops ({self.test_samples} samples) held out for test"
            )
        if any(left):
            said.append("left out: " + ", ".join(part for part in left if part))
        return said


def build_samples(db: Database) -> tuple[list[Sample], Report]:
    """Every verified record of `db` as a Sample (the module's docstring), ordered by op, target
    and rank; SchedlangError when there is none."""
    from schedlang.core.target import Target
    from schedlang.lang.printer import format_schedule
    from schedlang.lang.syntax import parse
    from schedlang.llm.feedback import is_baseline, without_comments

    records = db.records()
    texts = _op_texts(db)
    verified = [r for r in records if r.is_ok and r.median_s and not is_baseline(r)]
    kept: dict[tuple[str, str, str], Record] = {}
    schedules: dict[int, str] = {}
    unparsed = duplicates = no_op_text = 0
    for record in sorted(verified, key=lambda r: (r.median_s, r.id or 0)):
        if (record.op_key, record.target_key) not in texts["ops"]:
            no_op_text += 1
            continue
        try:
            schedule = format_schedule(parse(without_comments(record.schedule), "<record>"))
        except SchedlangError:
            unparsed += 1
            continue
        key = (record.op_key, record.target_key, schedule)
        if key in kept:  # the faster one came first
            duplicates += 1
            continue
        kept[key] = record
        schedules[id(record)] = schedule
    by_op: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for record in kept.values():
        by_op[(record.op_key, record.target_key)].append(record)
    samples = []
    facts: dict[str, str] = {}
    for (op, target_key), group in sorted(by_op.items()):
        if target_key not in facts:
            facts[target_key] = Target.from_json(texts["targets"][target_key]).describe()
        # Every record here is verified, with its latency (`verified` above).
        fastest = group[0].median_s or 0.0
        for rank, record in enumerate(group, 1):
            latency = record.median_s or 0.0
            relative = fastest / latency
            samples.append(
                Sample(
                    op_key=op,
                    op_name=record.op_name,
                    op=texts["ops"][(op, target_key)],
                    target=record.target,
                    target_facts=facts[target_key],
                    schedule=schedules[id(record)],
                    knobs=dict(record.knobs),
                    latency_s=latency,
                    gflops=record.gflops or 0.0,
                    rank=rank,
                    records=len(group),
                    relative=round(relative, 6),
                    quality=quality_of(relative, rank),
                    proposer=record.proposer,
                    seed=record.seed,
                    record_id=record.id,
                )
            )
    if not samples:
        raise SchedlangError(
            f"{db.path} holds no verified record a dataset can show a model "
            f"({len(records)} records, {len(verified)} verified)",
            *(["their runs did not keep the op's text: tune the ops again with this schedlang"]
              if no_op_text else ["`schedlang tune --db PATH` measures schedules"]),
        )  # fmt: skip
    ops = len({s.op_key for s in samples})
    report = Report(len(samples), ops, len(records) - len(verified), unparsed, duplicates,
                    no_op_text)  # fmt: skip
    return samples, report


def _op_texts(db: Database) -> dict[str, dict]:
    """From the runs' settings: the op's text per (op key, target key), and the target's facts
    per target key (the latest run's)."""
    ops: dict[tuple[str, str], str] = {}
    targets: dict[str, dict] = {}
    for run in db.runs():
        settings = run["settings"] if isinstance(run["settings"], dict) else {}
        op_text, facts = settings.get("op"), settings.get("target_facts")
        if isinstance(op_text, str) and isinstance(facts, dict):
            ops[(run["op_key"], run["target_key"])] = op_text
            targets[run["target_key"]] = facts
    return {"ops": ops, "targets": targets}


def split_by_op(samples: Sequence[Sample], test_fraction: float, seed: int) -> list[Sample]:
    """The samples with `split` set: the records of a `test_fraction` of the ops (at least one, and
    never all), drawn with `seed`, are `test`; the rest `train`. The same samples, fraction and
    seed give the same split."""
    if not 0 < test_fraction < 1:
        raise SchedlangError(f"--split must be between 0 and 1, not {test_fraction:g}")
    keys = sorted({sample.op_key for sample in samples})
    if len(keys) < 2:
        raise SchedlangError(
            f"the corpus is too small to split by op: it holds {len(keys)} op",
            "a split holds out whole ops: tune at least two ops (or shapes), or leave out --split",
        )
    random.Random(seed).shuffle(keys)
    held = set(keys[: min(max(1, math.floor(test_fraction * len(keys) + 0.5)), len(keys) - 1)])
    return [replace(s, split="test" if s.op_key in held else "train") for s in samples]


def write_dataset(samples: Iterable[Sample], path: Path) -> None:
    """One JSON line per sample, written whole or not at all (a temporary file, renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            for sample in samples:
                out.write(json.dumps(sample.to_json(), sort_keys=True) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_dataset(path: Path) -> list[Sample]:
    """The samples of a dataset file; SchedlangError at the first line that is not one (not JSON,
    another schema version, a field missing)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise SchedlangError(f"cannot read the dataset {path}: {err}") from None
    required = {f.name for f in fields(Sample) if f.name not in ("split", "schema")}
    samples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except ValueError as err:
            raise SchedlangError(f"{where}: not a JSON line ({err})", _MAKE) from None
        if not isinstance(data, dict):
            raise SchedlangError(f"{where}: not a JSON object", _MAKE)
        if data.get("schema") != DATASET_SCHEMA:
            raise SchedlangError(
                f"{where}: a dataset of schema {data.get('schema')!r}; this schedlang reads "
                f"schema {DATASET_SCHEMA}",
                _MAKE,
            )
        missing = sorted(required - set(data))
        if missing:
            raise SchedlangError(f"{where}: no {', '.join(missing)}", _MAKE)
        if data.get("split", "train") not in SPLITS:
            raise SchedlangError(f"{where}: split {data['split']!r} is not train or test", _MAKE)
        samples.append(Sample.from_json(data))
    if not samples:
        raise SchedlangError(f"the dataset {path} is empty", _MAKE)
    return samples


_MAKE = "make it again from the database: `schedlang dataset DB -o FILE`"
