"""What a report shows beside the records (schema 3): each op's function, the models tuned and
their end-to-end latencies. Methods of schedlang.store.db.Database, kept here: they read and
write through its file (schedlang.store.connection: `_sql`, `_read`, `_follow_file`)."""

from __future__ import annotations

import json
import time

from schedlang.store.connection import DatabaseFile
from schedlang.store.records import dumps

__all__ = ["ReportTables"]


class ReportTables(DatabaseFile):
    """The `ops`, `models` and `model_timings` tables (Database's, through this base class)."""

    def add_op(self, op_key: str, op_name: str, script: str) -> None:
        """Keep an op's PrimFunc (TVMScript), so that a record's schedule can be lowered again
        without its op file (`schedlang report`); the first script kept for a key stays."""
        self._follow_file()
        with self._sql() as conn:
            conn.execute("INSERT OR IGNORE INTO ops VALUES (?, ?, ?)", (op_key, op_name, script))

    def op_script(self, op_key: str) -> str | None:
        """The TVMScript `add_op` kept for `op_key`; None if none (or the file predates it)."""
        if not self._has_table("ops"):
            return None
        _, rows = self._read("SELECT script FROM ops WHERE op_key = ?", (op_key,))
        return rows[0][0] if rows and isinstance(rows[0][0], str) else None

    def add_model(self, model_key: str, name: str, target_key: str, tasks: list[dict]) -> int:
        """A model tuned on a target (`tune-model`): its tasks, each {key, name, calls, flops}."""
        self._follow_file()
        with self._sql() as conn:
            cursor = conn.execute(
                "INSERT INTO models (model_key, name, target_key, tasks, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (model_key, name, target_key, dumps(tasks), time.time()),
            )
            return int(cursor.lastrowid)  # type: ignore[arg-type]

    def add_model_timings(self, model_key: str, target_key: str, timings: list[dict]) -> None:
        """A model's end-to-end latencies (`build-model --compare`): each {label, median_s} or
        {label, skipped}, the tuned build first."""
        self._follow_file()
        now = time.time()
        rows = [
            (model_key, target_key, t["label"], t.get("median_s"), t.get("skipped"), now)
            for t in timings
        ]
        with self._sql() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT INTO model_timings (model_key, target_key, label, median_s, skipped, "
                    "created_at) VALUES (?, ?, ?, ?, ?, ?)",
                    rows,
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def models(self) -> list[dict]:
        """The models `add_model` kept, newest first per (model_key, target_key), tasks decoded;
        each with its latest `timings` ({label: {median_s, skipped}}, the order they came in)."""
        if not self._has_table("models"):
            return []
        names, rows = self._read("SELECT * FROM models ORDER BY id DESC", ())
        models, seen = [], set()
        for row in rows:
            model = dict(zip(names, row, strict=True))
            if (model["model_key"], model["target_key"]) in seen:
                continue
            seen.add((model["model_key"], model["target_key"]))
            model["tasks"] = json.loads(model["tasks"])
            model["timings"] = self._model_timings(model["model_key"], model["target_key"])
            models.append(model)
        return models

    def _model_timings(self, model_key: str, target_key: str) -> dict[str, dict]:
        _, rows = self._read(
            "SELECT label, median_s, skipped FROM model_timings WHERE model_key = ? AND "
            "target_key = ? AND created_at = (SELECT max(created_at) FROM model_timings "
            "WHERE model_key = ? AND target_key = ?) ORDER BY id",
            (model_key, target_key, model_key, target_key),
        )
        return {label: {"median_s": median, "skipped": skipped} for label, median, skipped in rows}

    def _has_table(self, name: str) -> bool:
        """Whether the file has the table: one read only may predate it (an older schema)."""
        _, rows = self._read(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        )
        return bool(rows)
