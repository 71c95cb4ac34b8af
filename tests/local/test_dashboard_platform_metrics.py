"""A training run's page on the platform reads its metric rows within the
bounds the offline index keeps: a run of many steps, or of thousands of
metric names, costs a bounded page (it read and kept every row: 450 MB and
11 s a page for 100,000 steps of 20 metrics, a chart per name however many)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from primeruns.local.dashboard.charts import curves
from primeruns.local.dashboard.platform_source import PlatformSource
from primeruns.local.storage import Database

#: The offline index's bounds (``metric_rows``): values kept, names charted.
MAX_VALUES = 300_000
MAX_NAMES = 100


def _training_run(db: Database, run_id: str, rows: list[dict[str, object]]) -> None:
    def insert(conn) -> None:  # type: ignore[no-untyped-def]
        now = time.time()
        conn.execute(
            "INSERT INTO train_runs (id, name, team_id, status, request, created_at, updated_at)"
            " VALUES (?, 'long', 't', 'RUNNING', '{}', ?, ?)",
            (run_id, now, now),
        )
        conn.executemany(
            "INSERT INTO train_metrics (run_id, step, body, received_at) VALUES (?, ?, ?, ?)",
            [(run_id, row["step"], json.dumps(row), now) for row in rows],
        )

    db.write_sync(insert)


def test_a_training_runs_metric_rows_are_read_within_bounds(tmp_path: Path) -> None:
    db = Database(tmp_path / "data")
    try:
        wide = [{"step": s, **{f"m{j}": s + j * 0.5 for j in range(50)}} for s in range(8_000)]
        _training_run(db, "rft_long", wide)
        many_names = [{"step": s, **{f"name-{i}": float(i) for i in range(10_000)}} for s in (0, 1)]
        _training_run(db, "rft_names", many_names)
        source = PlatformSource(db, tmp_path / "objects")
        detail, named = source.run("rft_long"), source.run("rft_names")
    finally:
        db.close()
    assert detail is not None and named is not None
    kept = sum(len(row) for row in detail.metrics)
    assert kept <= MAX_VALUES + MAX_NAMES + 1  # the bound, overshot by one row at most
    assert len(detail.metrics) < len(wide)
    assert f"metric rows past {MAX_VALUES} values are not charted" in detail.row.damage
    assert len(curves(named.metrics)) == MAX_NAMES
