"""A run longer than the charts' bound is charted whole, first step to last.

Past ``MAX_METRIC_VALUES`` values the rows were left out: a 3-day run of 20
metrics charted its first 15,000 steps and never its latest, the part a user
looks at. Now what is held is thinned (each metric's lowest and highest per
step bucket, its first and latest point) and stays within the bound. The
bound is made small here so a long run is quick to write.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from sdk_helpers import point_at
from test_dashboard_platform_metrics import _training_run

import primeruns as pr
from primeruns.local.dashboard import metric_rows
from primeruns.local.dashboard.charts import metric_points
from primeruns.local.dashboard.journal_source import JournalSource
from primeruns.local.dashboard.metric_rows import MetricRows
from primeruns.local.dashboard.platform_source import PlatformSource
from primeruns.local.storage import Database

BOUND = 600


@pytest.fixture(autouse=True)
def _small_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metric_rows, "MAX_METRIC_VALUES", BOUND)


def _loss(step: int) -> float:
    return 1.0 / (1 + step)


def test_a_run_past_the_bound_charts_its_last_step_within_the_bound() -> None:
    rows = MetricRows()
    most = 0
    for step in range(5_000):
        record: dict[str, object] = {"step": step, "loss": _loss(step), "_timestamp": 1e9 + step}
        if step % 100 == 0:
            record["eval/score"] = step / 100.0  # an evaluation every 100 steps
        rows.add(record)
        most = max(most, rows.values)
    assert most <= BOUND and sum(len(r) for r in rows.rows) == rows.values
    points = metric_points(rows.rows)
    assert points["loss"][0][:2] == (0, 1.0)
    assert points["loss"][-1][:2] == (4_999, _loss(4_999))
    # Each kept value keeps its row's time, so the time axis stays on.
    assert all(when is not None for _, _, when in points["loss"])
    # The sparse metric is thinned on its own, not dropped with the dense one's rows.
    evals = points["eval/score"]
    assert evals[-1][:2] == (4_900, 49.0) and len(evals) >= 25
    assert rows.cut is not None and f"{rows.values} of {rows.offered}" in rows.cut


def test_a_spike_and_a_dip_survive_thinning_and_a_nan_stands_for_nothing() -> None:
    rows = MetricRows()
    for step in range(3_000):
        value = 1e6 if step == 1_234 else -1e6 if step == 2_345 else float(step % 7)
        rows.add({"step": step, "x": value})
        rows.add({"step": step, "x": math.nan})  # a NaN is never a bucket's extreme
        rows.add({"step": step, "x": 10**400})  # nor a number past the floats
    values = [v for _, v, _ in metric_points(rows.rows)["x"]]
    assert 1e6 in values and -1e6 in values and rows.values <= BOUND
    assert metric_points(rows.rows)["x"][-1][0] == 2_999


def test_rows_without_a_step_keep_their_place_when_thinned() -> None:
    rows = MetricRows()
    for position in range(2_000):
        rows.add({"loss": _loss(position)})
    assert rows.values <= BOUND
    points = metric_points(rows.rows)["loss"]
    assert points[0][:2] == (0, 1.0) and points[-1][:2] == (1_999, _loss(1_999))


def test_the_platforms_training_page_charts_the_whole_run(tmp_path: Path) -> None:
    db = Database(tmp_path / "data")
    try:
        run_id = "rft_long"

        _training_run(
            db,
            run_id,
            [{"step": s, "loss": _loss(s), "kl": s * 0.5} for s in range(3_000)],
        )
        detail = PlatformSource(db, tmp_path / "objects").run(run_id)
    finally:
        db.close()
    assert detail is not None
    assert sum(len(r) for r in detail.metrics) <= BOUND
    points = metric_points(detail.metrics)
    assert points["loss"][-1][:2] == (2_999, _loss(2_999))
    assert points["kl"][-1][:2] == (2_999, 1_499.5)
    assert detail.thinned is not None and "curves thinned" in detail.thinned
    assert not any("not charted" in what for what in detail.row.damage)


def test_a_live_thinned_runs_new_steps_are_added_to_what_is_held(tmp_path: Path) -> None:
    db = Database(tmp_path / "data")

    def steps(run_id: str, first: int, stop: int):  # type: ignore[no-untyped-def]
        def insert(conn) -> None:  # type: ignore[no-untyped-def]
            now = time.time() + first  # each batch arrives later
            if first == 0:
                conn.execute(
                    "INSERT INTO train_runs (id, name, team_id, status, request, created_at,"
                    " updated_at) VALUES (?, 'live', 't', 'RUNNING', '{}', ?, ?)",
                    (run_id, now, now),
                )
            conn.executemany(
                "INSERT INTO train_metrics (run_id, step, body, received_at) VALUES (?, ?, ?, ?)",
                [
                    (run_id, s, json.dumps({"step": s, "loss": _loss(s)}), now)
                    for s in range(first, stop)
                ],
            )

        return insert

    try:
        db.write_sync(steps("rft_live", 0, 2_000))
        source = PlatformSource(db, tmp_path / "objects")
        before = source.run("rft_live")
        db.write_sync(steps("rft_live", 2_000, 3_000))
        after = source.run("rft_live")
    finally:
        db.close()
    assert before is not None and after is not None
    assert metric_points(before.metrics)["loss"][-1][0] == 1_999
    points = metric_points(after.metrics)["loss"]
    assert points[0][:2] == (0, 1.0) and points[-1][:2] == (2_999, _loss(2_999))
    assert sum(len(r) for r in after.metrics) <= BOUND


def test_the_offline_training_page_charts_the_whole_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(name="long", kind="train", model="m", team_id="t", mode="offline", runs_dir=runs)
    assert run.journal_path is not None
    for step in range(1_000):
        run.log_metrics({"loss": _loss(step)}, step=step)
    run.finish()
    detail = JournalSource(runs).run(run.journal_path.name)
    assert detail is not None
    assert sum(len(r) for r in detail.metrics) <= BOUND
    assert metric_points(detail.metrics)["loss"][-1][:2] == (999, _loss(999))
    assert detail.thinned is not None and "curves thinned" in detail.thinned
