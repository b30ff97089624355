"""Reading the best records of an op back, and saying why there are none."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from schedlang.core.diagnostics import SchedlangError
from schedlang.store.db import Database
from schedlang.store.records import Record, op_key

if TYPE_CHECKING:  # numpy and TVM: not at import
    from schedlang.core.ops import Op
    from schedlang.core.target import Target


def best_records_of(db: Database, op: Op, tgt: Target, n: int = 1) -> list[Record]:
    """The `n` fastest verified records of `op` on `tgt`; when there is none, a SchedlangError
    that says what the database does hold for an op of that name: the same op on other targets,
    or other shapes (`-D`) of it on this one."""
    key = op_key(op.func)
    records = db.best(key, tgt.key, n=n)
    if records:
        return records
    shape = ", ".join(f"{name}={value}" for name, value in op.params.items())
    this = f"{op.name} ({shape})" if shape else op.name
    other_targets, other_shapes = {}, 0
    for version, target_key, count in db.versions_of(op.name):
        if version == key:
            other_targets[_target_kind(target_key)] = count
        elif target_key == tgt.key:
            other_shapes += count
    notes = []
    if other_shapes:
        defines = " ".join(f"-D {name}={value}" for name, value in op.params.items())
        notes.append(
            f"the database has {other_shapes} verified record{'s' * (other_shapes != 1)} of "
            f"`{op.name}` on {tgt.kind} for another shape (or another definition of the op): "
            f"records are per shape; tune this one with "
            f"`schedlang tune {op.path or op.name}{' ' + defines if defines else ''}`"
        )
    if other_targets:
        where = ", ".join(f"{kind} ({count})" for kind, count in sorted(other_targets.items()))
        notes.append(
            f"it has verified records of this op for other targets: {where}; records are "
            "never shared across targets: give --target, or tune for this one"
        )
    if not notes:
        notes.append("run `schedlang tune` first")
    raise SchedlangError(
        f"no verified schedule for {this} on {tgt.kind} in the tuning database ({db.path})",
        *notes,
    )


def _target_kind(target_key: str) -> str:
    try:
        return str(json.loads(target_key).get("kind", target_key))
    except (ValueError, AttributeError):
        return target_key
