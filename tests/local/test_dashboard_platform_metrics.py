"""What the dashboard reads of the platform's database costs what a page
shows: a training run's metric rows are read within the bounds the offline
index keeps, and kept between polls while they hold (they were read and kept
whole: 450 MB and 11 s a page for 100,000 steps of 20 metrics, a chart per
name however many); the runs list counts samples without reading them."""

from __future__ import annotations

import asyncio
import html
import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from primeruns.local.dashboard import platform_source
from primeruns.local.dashboard.charts import curves
from primeruns.local.dashboard.platform_source import PlatformSource
from primeruns.local.dashboard.routes import dashboard_routes
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


def _a_new_step(db: Database) -> None:
    """Step 50 of run ``rft_live`` arrives, after every row before it."""

    def new_step(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO train_metrics (run_id, step, body, received_at)"
            " VALUES ('rft_live', 50, '{\"step\": 50, \"loss\": 0.5}', ?)",
            (time.time() + 1,),
        )

    db.write_sync(new_step)


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
    assert detail.thinned is not None and "curves thinned" in detail.thinned
    assert len(curves(named.metrics)) == MAX_NAMES


def test_the_rows_one_page_charts_are_not_changed_by_the_next_pages_read(
    tmp_path: Path,
) -> None:
    """Pages are served from several threads at once, and a live run's new
    steps are added to the rows kept: added in place, two pages reading the
    same new step at once each added it (its point charted twice), and a
    page was drawn from rows another thinned under it. Each read adds to
    its own copy of what is kept."""
    db = Database(tmp_path / "data")
    try:
        _training_run(db, "rft_live", [{"step": s, "loss": 1.0 / (s + 1)} for s in range(50)])
        source = PlatformSource(db, tmp_path / "objects")
        assert source.run("rft_live") is not None
        held = source._charted_rows["rft_live"][1]
        rows, values = list(held.rows), held.values

        _a_new_step(db)
        grown = source.run("rft_live")
        assert grown is not None and grown.metrics[-1] == {"step": 50, "loss": 0.5}
        assert held.rows == rows and held.values == values  # the first page's, untouched
    finally:
        db.close()


def test_a_training_runs_rows_are_read_again_only_once_they_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live page polls every 2 s: each poll read every metric row again
    (1.8 s a poll for 100,000 steps, the database held from the API's
    writes). They are kept while the run's rows stay as they were; a new
    step is read on the next page, alone (all of them were read again: a
    live run of 100,000 steps is thinned, not cut, so each poll read every
    row), and a step sent again with other values has them all read again."""
    parsed: list[str] = []
    real_body = platform_source._metric_body

    def counting(text: str | None) -> dict[str, Any]:
        if text and '"loss"' in text:
            parsed.append(text)
        return real_body(text)

    monkeypatch.setattr(platform_source, "_metric_body", counting)
    db = Database(tmp_path / "data")
    try:
        _training_run(db, "rft_live", [{"step": s, "loss": 1.0 / (s + 1)} for s in range(50)])
        source = PlatformSource(db, tmp_path / "objects")
        first = source.run("rft_live")
        assert first is not None and len(parsed) == 50
        parsed.clear()
        again = source.run("rft_live")
        assert again is not None and again.metrics == first.metrics
        assert parsed == []  # nothing changed: nothing read

        _a_new_step(db)
        grown = source.run("rft_live")
        assert grown is not None and grown.metrics[-1] == {"step": 50, "loss": 0.5}
        assert grown.metrics[:-1] == first.metrics
        assert parsed == ['{"step": 50, "loss": 0.5}']  # the new row alone
        parsed.clear()

        def replaced(conn: sqlite3.Connection) -> None:
            conn.execute(
                'UPDATE train_metrics SET body = \'{"step": 0, "loss": 9.0}\', received_at = ?'
                " WHERE run_id = 'rft_live' AND step = 0",
                (time.time() + 2,),
            )

        db.write_sync(replaced)
        fixed = source.run("rft_live")
        assert fixed is not None and fixed.metrics[0] == {"step": 0, "loss": 9.0}
        assert len(parsed) == 51  # read again whole
    finally:
        db.close()


def test_the_runs_list_counts_samples_without_reading_them(tmp_path: Path) -> None:
    """The runs list (loaded, and polled every 2 s while a run is live) counted
    each evaluation's samples with a pass over every sample stored: 0.3 s for
    900,000 samples, growing with them. Each evaluation keeps its count."""
    db = Database(tmp_path / "data")
    statements: list[str] = []
    try:

        def fill(conn: sqlite3.Connection) -> None:
            now = time.time()
            conn.executemany(
                "INSERT INTO evaluations (id, name, status, request, created_at, updated_at)"
                " VALUES (?, ?, 'COMPLETED', '{}', ?, ?)",
                [(f"eval_{i}", f"e{i}", now, now) for i in range(3)],
            )
            conn.executemany(
                "INSERT INTO eval_samples (eval_id, sample_id, body) VALUES (?, ?, '{}')",
                [(f"eval_{j % 3}", str(j)) for j in range(10)],
            )

        db.write_sync(fill)
        rows = _runs_listed(db, tmp_path, statements)
    finally:
        db.close()
    assert {r.id: r.counts["samples"] for r in rows} == {"eval_0": 4, "eval_1": 3, "eval_2": 3}
    assert [s for s in statements if "eval_samples" in s] == []


def _runs_listed(db: Database, tmp_path: Path, statements: list[str]) -> list[Any]:
    """The dashboard's runs list read from ``db``, each SQL statement it ran
    appended to ``statements``."""
    source = PlatformSource(db, tmp_path / "objects")
    db.read_sync(lambda conn: conn.set_trace_callback(statements.append))
    try:
        return source.runs()
    finally:
        db.read_sync(lambda conn: conn.set_trace_callback(None))


def _upsert_metric(conn: sqlite3.Connection, run_id: str, step: int | None) -> None:
    """A metric row as the API stores it: a step sent again replaces its row."""
    conn.execute(
        "INSERT INTO train_metrics (run_id, step, body, received_at) VALUES (?, ?, '{}', 0)"
        " ON CONFLICT (run_id, step) DO UPDATE SET body = excluded.body",
        (run_id, step),
    )


def test_the_runs_list_counts_metric_steps_without_reading_them(tmp_path: Path) -> None:
    """The runs list counted each training run's distinct steps with a pass
    over every metric row stored (2,000,000 rows: 0.55-0.9 s a load or poll).
    Each run keeps its count; a data folder from before is counted once."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    with sqlite3.connect(data / "platform.sqlite3") as old:  # a folder from before the count
        old.executescript(
            "CREATE TABLE train_runs (id TEXT PRIMARY KEY, name TEXT, team_id TEXT NOT NULL,"
            " status TEXT NOT NULL, error_message TEXT, request TEXT NOT NULL,"
            " created_at REAL NOT NULL, updated_at REAL NOT NULL, completed_at REAL);"
            "CREATE TABLE train_metrics (row INTEGER PRIMARY KEY, run_id TEXT NOT NULL,"
            " step INTEGER, body TEXT NOT NULL, received_at REAL NOT NULL);"
            "CREATE UNIQUE INDEX train_metrics_step ON train_metrics (run_id, step);"
            "INSERT INTO train_runs VALUES"
            " ('rft_old', 'o', 't', 'COMPLETED', NULL, '{}', 0, 0, NULL);"
        )
        for step in (0, 1, 1, None):
            _upsert_metric(old, "rft_old", step)
    statements: list[str] = []
    db = Database(data)
    try:
        _training_run(db, "rft_new", [{"step": 0}])

        def more(conn: sqlite3.Connection) -> None:
            for step in (0, 1, 2, 2, None, None):
                _upsert_metric(conn, "rft_new", step)

        db.write_sync(more)
        rows = _runs_listed(db, tmp_path, statements)
    finally:
        db.close()
    assert {r.id: r.counts["metric steps"] for r in rows} == {"rft_old": 2, "rft_new": 3}
    assert [s for s in statements if "train_metrics" in s] == []


def test_the_runs_seen_only_through_traces_are_listed_from_an_index(tmp_path: Path) -> None:
    """The runs list (and ``/_local/runs``) finds the runs known only from
    their traces with a pass that read every trace's row for its run's kind
    and name (200,000 traces: 0.8 s a load or poll); an index holds them."""
    db = Database(tmp_path / "data")
    statements: list[str] = []
    try:
        _runs_listed(db, tmp_path, statements)
        (listing,) = [s for s in statements if "FROM traces" in s]
        explain = "EXPLAIN QUERY PLAN " + listing
        plan = db.read_sync(lambda conn: [tuple(r) for r in conn.execute(explain)])
    finally:
        db.close()
    assert any("COVERING INDEX" in step[-1] for step in plan), plan


#: Metric bodies as a client or a hand-edited database may hold them, each
#: with the step its row is stored under: what stdlib ``json`` takes and
#: orjson refuses (NaN, Infinity, a number past the floats, a lone
#: surrogate), an integer past 64 bits (orjson reads it as a float), and a
#: row without one of the run's metrics.
_HOSTILE_BODIES = [
    (0, '{"step": 0, "loss": NaN, "acc": 0.5}'),
    (1, '{"step": 1, "loss": Infinity}'),
    (2, '{"step": 2, "loss": 1e999}'),
    (3, '{"step": 3, "loss": 1' + "0" * 400 + "}"),
    (4, '{"step": 18446744073709551616, "loss": 0.25}'),
    (5, '{"step": 5, "loss": 12345678901234567890123}'),
    (6, '{"step": 6, "acc": 0.75}'),
    (7, '{"step": 7, "loss": 0.5, "\\ud800": 1.0}'),
]


def _stored(db: Database, run_id: str, bodies: list[tuple[int, str]]) -> None:
    """A training run whose metric rows hold ``bodies`` as written, each under its step."""

    def insert(conn: sqlite3.Connection) -> None:
        now = time.time()
        conn.execute(
            "INSERT INTO train_runs (id, name, team_id, status, request, created_at, updated_at)"
            " VALUES (?, 'hostile', 't', 'RUNNING', '{}', ?, ?)",
            (run_id, now, now),
        )
        conn.executemany(
            "INSERT INTO train_metrics (run_id, step, body, received_at) VALUES (?, ?, ?, ?)",
            [(run_id, step, body, now) for step, body in bodies],
        )

    db.write_sync(insert)


def test_a_metric_body_nested_past_what_json_reads_is_left_out(tmp_path: Path) -> None:
    """A metric body nested 100,000 levels deep (the API refuses one; a
    database written by hand may hold it) raised RecursionError out of the
    run's read: its page, and any compare page with it, was a 500. It is
    read as an empty row; the run's other rows chart."""
    deep = '{"step": 1, "loss": 0.5, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    db = Database(tmp_path / "data")
    try:
        _stored(db, "rft_deep", [(0, '{"step": 0, "loss": 1.0}'), (1, deep)])
        detail = PlatformSource(db, tmp_path / "objects").run("rft_deep")
    finally:
        db.close()
    assert detail is not None
    (loss,) = curves(detail.metrics)
    assert (loss.name, loss.points, loss.last_value) == ("loss", 1, 1.0)


def test_hostile_metric_bodies_chart_as_stdlib_json_reads_them(tmp_path: Path) -> None:
    """Metric bodies are parsed by orjson (the compare page reads ten runs'
    hundreds of thousands of rows), and by ``json`` where orjson refuses
    one or reads a step past 64 bits as a float: each row charts as
    ``json`` reads it. A non-finite or overlong value is left out, the
    row's other values draw; a step past 64 bits keeps its place."""
    db = Database(tmp_path / "data")
    try:
        _stored(db, "rft_hostile", _HOSTILE_BODIES)
        detail = PlatformSource(db, tmp_path / "objects").run("rft_hostile")
    finally:
        db.close()
    assert detail is not None
    drawn = {c.name: json.loads(c.data)["series"][0] for c in curves(detail.metrics)}
    assert (drawn["loss"]["step"], drawn["loss"]["value"]) == (
        [5, 7, 2**64],
        [float(12345678901234567890123), 0.5, 0.25],
    )
    assert (drawn["acc"]["step"], drawn["acc"]["value"]) == ([0, 6], [0.5, 0.75])
    # A name that is not valid Unicode is charted repaired (the page is UTF-8).
    assert "\ud800" not in drawn and drawn["\ufffd"]["step"] == [7]


def test_the_compare_page_over_hostile_metric_bodies_is_a_page_not_a_500(
    tmp_path: Path,
) -> None:
    """The compare page over runs holding the bodies above (a metric named
    with a lone surrogate made it a 500: UnicodeEncodeError), and one
    nested past what ``json`` reads, draws what can be drawn."""
    deep = '{"step": 1, "loss": 0.5, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    db = Database(tmp_path / "data")
    try:
        _stored(db, "rft_hostile", _HOSTILE_BODIES)
        _stored(db, "rft_deep", [(0, '{"step": 0, "loss": 1.0}'), (1, deep)])
        app = Starlette(routes=dashboard_routes())
        app.state.dashboard_source = PlatformSource(db, tmp_path / "objects")

        async def fetch() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
                return await c.get("/dashboard/compare?run=rft_hostile&run=rft_deep")

        page = asyncio.run(fetch())
    finally:
        db.close()
    assert page.status_code == 200, page.text[:500]
    drawn = {
        c["name"]: c["series"]
        for c in (
            json.loads(html.unescape(m)) for m in re.findall(r'data-curve="([^"]*)"', page.text)
        )
    }
    assert [len(s["step"]) for s in drawn["loss"]] == [3, 1]
    assert [len(s["step"]) for s in drawn["acc"]] == [2]
    assert [len(s["step"]) for s in drawn["\ufffd"]] == [1]
