"""The dashboard's :class:`~.views.Source` over the local platform's SQLite database.

Reads what the API stored, as it stored it: evaluations and their v0 sample
rows, training runs with their metric rows and confirmed Parquet objects, and
runs seen only through Prime Traces uploads. Counts are grouped queries so the
runs list costs a handful of statements, not a few per run.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from ..inspect import run_list, run_report
from ..objects import object_path
from ..storage import Database
from ..traces_extract import as_object
from .episodes import sample_row
from .views import MissingExtra, RunDetail, RunRow, SampleRow, StepTable, config_text

#: A count per run id.
Counts = dict[str, int]


def _json(text: str | None) -> dict[str, Any]:
    try:
        return as_object(json.loads(text or "{}"))
    except ValueError:
        return {}


def _stored_row(r: sqlite3.Row, kind: str, model_key: str, **counts: Counts) -> RunRow:
    """A registered run (an evaluation or a training run) with its counts by name."""
    return RunRow(
        id=r["id"],
        kind=kind,
        name=r["name"],
        model=_json(r["request"]).get(model_key),
        status=r["status"],
        error=r["error_message"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        counts={name: per_run.get(r["id"], 0) for name, per_run in counts.items()},
    )


class PlatformSource:
    """Reads ``db`` (the running platform's one connection) and its object files."""

    def __init__(self, db: Database, objects_dir: Path) -> None:
        self._db = db
        self._objects_dir = objects_dir

    def runs(self) -> list[RunRow]:
        return self._db.read_sync(self._runs)

    def _runs(self, conn: sqlite3.Connection, only: str | None = None) -> list[RunRow]:
        """Every run (or the run ``only``: a live page asks for one every few seconds)."""
        args: tuple[str, ...] = () if only is None else (only,)

        def per_run(table: str, column: str, what: str = "count(*)", where: str = "1") -> Counts:
            one = "" if only is None else f" AND {column} = ?"
            sql = f"SELECT {column}, {what} FROM {table} WHERE {where}{one} GROUP BY {column}"
            return {r[0]: int(r[1]) for r in conn.execute(sql, args) if r[0] is not None}

        samples = per_run("eval_samples", "eval_id")
        episodes = per_run("episodes", "run_id")
        steps = per_run("train_metrics", "run_id", "count(DISTINCT step)")
        objects = per_run("objects", "run_id", where="confirmed_at IS NOT NULL")
        one = "" if only is None else " WHERE id = ?"
        rows = [
            _stored_row(r, "eval", "model_name", samples=samples, episodes=episodes)
            for r in conn.execute(f"SELECT * FROM evaluations{one}", args)
        ]
        rows += [
            _stored_row(
                r,
                "train",
                "base_model",
                **{"metric steps": steps, "sample tables": objects, "episodes": episodes},
            )
            for r in conn.execute(f"SELECT * FROM train_runs{one}", args)
        ]
        if only is not None and rows:
            return rows
        known = {row.id for row in rows}
        for seen in run_list(conn):
            if seen["id"] not in known and only in (None, seen["id"]):
                rows.append(
                    RunRow(
                        id=seen["id"],
                        kind=seen["kind"],
                        name=seen["name"],
                        model=None,
                        status=seen["status"],
                        error=None,
                        created_at=None,
                        updated_at=None,
                        counts={"episodes": episodes.get(seen["id"], 0)},
                    )
                )
        return rows

    def run(self, run_id: str) -> RunDetail | None:
        return self._db.read_sync(lambda conn: self._run(conn, run_id))

    def _run(self, conn: sqlite3.Connection, run_id: str) -> RunDetail | None:
        row = next(iter(self._runs(conn, run_id)), None)
        if row is None:
            return None
        ev = conn.execute("SELECT * FROM evaluations WHERE id = ?", (run_id,)).fetchone()
        if ev is not None:
            config = _json(ev["metadata"])
            return RunDetail(row, _json(ev["metrics"]), config_text(config), config)
        tr = conn.execute("SELECT * FROM train_runs WHERE id = ?", (run_id,)).fetchone()
        if tr is None:
            report = run_report(conn, run_id) or {}
            return RunDetail(row, report.get("summary") or {}, None, report.get("config") or {})
        request = _json(tr["request"])
        config = as_object(request.get("run_config"))
        metrics = [
            _json(r["body"])
            for r in conn.execute(
                "SELECT body FROM train_metrics WHERE run_id = ? ORDER BY step, row", (run_id,)
            )
        ]
        tables = [
            StepTable(step=r["step"], rows=r["rows"] or 0, key=r["key"])
            for r in conn.execute(
                "SELECT step, key, rows FROM objects WHERE run_id = ? AND confirmed_at IS NOT NULL"
                " ORDER BY step, confirmed_at",
                (run_id,),
            )
        ]
        max_steps = request.get("max_steps")
        return RunDetail(
            row,
            {},
            config_text(config),
            config,
            max_steps=max_steps if isinstance(max_steps, int) else None,
            metrics=metrics,
            step_tables=tables,
        )

    def samples(self, run_id: str, offset: int, limit: int) -> tuple[list[SampleRow], int]:
        def read(conn: sqlite3.Connection) -> tuple[list[SampleRow], int]:
            total = conn.execute(
                "SELECT count(*) FROM eval_samples WHERE eval_id = ?", (run_id,)
            ).fetchone()[0]
            bodies = conn.execute(
                "SELECT body FROM eval_samples WHERE eval_id = ? ORDER BY row LIMIT ? OFFSET ?",
                (run_id, limit, offset),
            ).fetchall()
            rows = [sample_row(offset + i + 1, _json(b["body"])) for i, b in enumerate(bodies)]
            return rows, int(total)

        return self._db.read_sync(read)

    def sample(self, run_id: str, index: int) -> dict[str, Any] | None:
        if index < 1:
            return None
        found = self._db.read_sync(
            lambda conn: conn.execute(
                "SELECT body FROM eval_samples WHERE eval_id = ? ORDER BY row LIMIT 1 OFFSET ?",
                (run_id, index - 1),
            ).fetchone()
        )
        return None if found is None else _json(found["body"])

    def step_rows(
        self, run_id: str, step: int, offset: int = 0, limit: int | None = None
    ) -> tuple[list[dict[str, Any]], int] | None:
        keys = self._db.read_sync(
            lambda conn: [
                r["key"]
                for r in conn.execute(
                    "SELECT key FROM objects WHERE run_id = ? AND step = ?"
                    " AND confirmed_at IS NOT NULL ORDER BY confirmed_at",
                    (run_id, step),
                )
            ]
        )
        if not keys:
            return None
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise MissingExtra(
                "reading a step's Parquet table needs pyarrow: pip install 'prime-runs[train]'"
            ) from None

        rows: list[dict[str, Any]] = []
        for key in keys:
            rows += pq.read_table(object_path(self._objects_dir, key)).to_pylist()
        return rows[offset : None if limit is None else offset + limit], len(rows)
