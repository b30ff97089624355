"""What the tuning database holds: a `Record` per measured (or rejected) schedule, its `Status`,
the key of its op, and how a record is written to and read back from a row.

A row keeps the JSON fields (`target`, `knobs`, `latencies_s`, `extra`) as canonical JSON text.
Reading a row back is defensive: SQLite stores whatever it is given, so a damaged field a record
can do without is replaced and reported (`record_from_row`), and one it cannot do without raises.
`export_json` and `export_csv` write records out (`schedlang history --format`).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import IO, Any

JSON_FIELDS = ("target", "knobs", "latencies_s", "extra")
# Fields a record can be read without, and what it gets instead when one of them is damaged (text
# where a number belongs: SQLite stores whatever it is given). The others (op_key, target_key,
# schedule, status) say what the record is: without them it cannot be read at all.
_NUMBER_FIELDS: dict[str, float | None] = {"median_s": None, "gflops": None, "created_at": 0.0}
_TEXT_FIELDS: dict[str, str | None] = {
    "op_name": "?",
    "reason": "",
    "proposer": "?",
    "schedlang_version": "?",
}
_TEXT_FIELDS |= {"tvm_version": "?", "template": None}


class Status(StrEnum):
    OK = "ok"
    WRONG = "wrong"  # ran, but the result differs from the reference
    CRASH = "crash"
    TIMEOUT = "timeout"
    BUILD_ERROR = "build_error"
    CHECK_ERROR = "check_error"  # the schedule has diagnostics
    RUN_ERROR = "run_error"


@dataclass(frozen=True)
class Record:
    """One measured (or rejected) schedule of one op on one target."""

    op_key: str
    op_name: str
    target_key: str  # canonical JSON of the TVM target dict, `Target.key`
    target: dict
    schedule: str  # the concrete DSL text, canonically printed
    knobs: dict[str, int]
    template: str | None  # the template DSL the schedule was instantiated from
    status: Status
    reason: str  # one line; "" when ok
    latencies_s: tuple[float, ...]
    median_s: float | None
    gflops: float | None
    proposer: str  # "builtin", "human", "template", "model:<name>"
    seed: int | None
    created_at: float
    schedlang_version: str
    tvm_version: str
    extra: dict = field(default_factory=dict)  # JSON: raw model text, diagnostics, run id, ...
    id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "latencies_s", tuple(float(t) for t in self.latencies_s))

    @property
    def is_ok(self) -> bool:
        return self.status is Status.OK

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["latencies_s"] = list(self.latencies_s)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def op_key(func: Any) -> str:
    """A structural hash of a PrimFunc, as 16 hex digits.

    Equal computations give equal keys however they were built; buffer and variable names do not
    count (structural equality ignores them), nor does the symbol name the function is called by.
    """
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(func.without_attr('global_symbol')) & (2**64 - 1):016x}"


def current_versions() -> tuple[str, str]:
    """(schedlang version, TVM version), for `Record.schedlang_version` and `tvm_version`."""
    import tvm

    from schedlang import __version__

    return __version__, tvm.__version__


def record_columns() -> tuple[str, ...]:
    """The columns of the records table, in the order of `Record`'s fields."""
    return tuple(f.name for f in fields(Record))


def row_of(record: Record) -> dict[str, Any]:
    """The record as a row of the records table, without its id: JSON fields as text."""
    data = record.to_json()
    del data["id"]
    for name in JSON_FIELDS:
        data[name] = dumps(data[name])
    return data


def export_json(records: Iterable[Record], fp: IO[str]) -> None:
    json.dump([record.to_json() for record in records], fp, indent=2)
    fp.write("\n")


def export_csv(records: Iterable[Record], fp: IO[str]) -> None:
    """One row per record; latencies `;`-joined, dicts as JSON, None as an empty cell."""
    writer = csv.writer(fp)
    writer.writerow(record_columns())
    for record in records:
        row = []
        for name, value in record.to_json().items():
            if name == "latencies_s":
                value = ";".join(repr(t) for t in value)
            elif isinstance(value, dict):
                value = dumps(value)
            row.append("" if value is None else value)
        writer.writerow(row)


def record_from_row(data: dict[str, Any], problems: list[str] | None = None) -> Record:
    """A row as a Record. A damaged field it can do without is replaced (`_NUMBER_FIELDS`,
    `_TEXT_FIELDS`, {} or () for the JSON ones) and described in `problems`; one it cannot do
    without raises ValueError or TypeError."""
    problems = [] if problems is None else problems
    for name in ("op_key", "target_key", "schedule", "status"):
        if not isinstance(data.get(name), str):
            raise ValueError(f"{name} is {_shown(data.get(name))}, not text")
    for name, default in _NUMBER_FIELDS.items():
        value = data.get(name)
        if not (value is None and default is None) and not _is_number(value):
            problems.append(f"{name} is {_shown(value)}, not a number")
            data[name] = default
    for name, text_default in _TEXT_FIELDS.items():
        value = data.get(name)
        if not (value is None and text_default is None) and not isinstance(value, str):
            problems.append(f"{name} is {_shown(value)}, not text")
            data[name] = text_default
    if data.get("seed") is not None and not _is_int(data["seed"]):
        problems.append(f"seed is {_shown(data['seed'])}, not an integer")
        data["seed"] = None
    for name in JSON_FIELDS:
        value, data[name] = data.get(name), {} if name != "latencies_s" else ()
        try:
            decoded = json.loads(value) if isinstance(value, str) else None
        except (ValueError, RecursionError):
            decoded = None
        if _json_field_ok(name, decoded):
            data[name] = decoded
        else:
            problems.append(f"{name} is {_shown(value)}, not {_JSON_KINDS[name]}")
    return Record.from_json(data)


_JSON_KINDS = {
    "target": "a JSON object",
    "knobs": "a JSON object of integers",
    "latencies_s": "a JSON list of numbers",
    "extra": "a JSON object",
}


def _json_field_ok(name: str, value: Any) -> bool:
    if name == "latencies_s":
        return isinstance(value, list) and all(_is_number(t) for t in value)
    if name == "knobs":
        return isinstance(value, dict) and all(_is_int(v) for v in value.values())
    return isinstance(value, dict)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    kind = {str: "text", bytes: "binary data", type(None): "missing"}.get(type(value), "")
    return f"{text} ({kind})" if kind and value is not None else kind or text


def dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces (a row's JSON fields, a run's settings)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
