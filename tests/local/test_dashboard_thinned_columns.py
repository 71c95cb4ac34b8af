"""A long run's rows past the first thinning are taken as columns, at the width the whole run needs.

The platform counts a run's rows before reading them, so its first thinning
picks the width the whole run will need (``MetricRows.expected_rows``), and
the rows after it are thinned a run of rows at a time, as columns, without a
row made for each (``MetricRows.extend``). Under the bound nothing changes:
the page charts what adding row by row charts. Past it the promises stay:
each metric's lowest and highest per bucket, its first and latest point, no
value that is not finite, a row without a step at its place. Random data,
the bound made small so a long run is quick to write.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from test_dashboard_platform_metrics import _training_run

from primeruns.journal import EntryKind, Journal
from primeruns.local.dashboard import metric_rows
from primeruns.local.dashboard.charts import metric_points
from primeruns.local.dashboard.journal_index import JournalIndex
from primeruns.local.dashboard.metric_rows import MetricRows
from primeruns.local.dashboard.platform_source import PlatformSource
from primeruns.local.storage import Database

BOUND = 2_000


@pytest.fixture(autouse=True)
def _small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metric_rows, "MAX_METRIC_VALUES", BOUND)
    monkeypatch.setattr(metric_rows, "BULK_ROWS", 64)


def _value(rnd: random.Random) -> Any:
    """Nearly always a float; sometimes what a row may hold besides."""
    roll = rnd.random()
    if roll < 0.9:
        return rnd.gauss(0.0, 1.0)
    return rnd.choice([rnd.randint(-5, 5), True, "text", None, math.nan, math.inf, 1e6, -1e6])


def _rows(
    rnd: random.Random, count: int, names: int, odd: bool, mixed: bool = False
) -> list[dict[str, Any]]:
    """``count`` rows of ``names`` metrics in random step order; with ``odd``,
    rows without a step, names missing from some rows and values of every
    kind; with ``mixed``, values of every kind under the same names in each
    row; else floats alone under the same names (a long run as it nearly
    always is)."""
    steps = rnd.sample(range(3 * count), count)
    rows = []
    for position, step in enumerate(steps):
        row: dict[str, Any] = {"step": step, "_timestamp": 1e9 + position}
        for j in range(names):
            if odd and rnd.random() < 0.2:
                continue
            row[f"m{j}"] = _value(rnd) if odd or mixed else rnd.gauss(0.0, 1.0)
        if odd and rnd.random() < 0.05:
            del row["step"]
        rows.append(row)
    return rows


def _stored(tmp_path: Path, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """``rows`` stored as a run's metric rows; what the platform's training
    page charts, and the step buckets' width it says it thinned at (0: none)."""
    db = Database(tmp_path / "data")
    try:
        _training_run(db, "rft_random", [{**row, "step": row.get("step")} for row in rows])
        # The row stored without a step has none in its body either.
        db.write_sync(
            lambda conn: conn.execute(
                "UPDATE train_metrics SET body = json_remove(body, '$.step') WHERE step IS NULL"
            )
        )
        detail = PlatformSource(db, tmp_path / "objects").run("rft_random")
    finally:
        db.close()
    assert detail is not None
    width = 0 if detail.thinned is None else int(detail.thinned.split(" per ")[1].split()[0])
    return detail.metrics, width


def _read_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` in the order the platform reads them: by step, rows without one first."""
    return [
        row
        for _, row in sorted(
            enumerate(rows), key=lambda at: (at[1].get("step") is not None, at[1].get("step", 0))
        )
    ]


def _added_one_by_one(rows: list[dict[str, Any]]) -> MetricRows:
    held = MetricRows()
    for row in _read_order(rows):
        held.add(json.loads(json.dumps(row)))
    return held


@pytest.mark.parametrize("seed", range(6))
def test_under_the_bound_the_page_charts_what_adding_row_by_row_charts(
    tmp_path: Path, seed: int
) -> None:
    rnd = random.Random(seed)
    rows = _rows(rnd, rnd.randint(20, 120), rnd.randint(1, 12), odd=seed % 2 == 0)
    one_by_one = _added_one_by_one(rows)
    assert not one_by_one.width  # under the bound: nothing thinned
    charted, width = _stored(tmp_path, rows)
    assert not width
    assert json.dumps(charted) == json.dumps(one_by_one.rows)


def _buckets(points: list[tuple[int, float, Any]], width: int) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for step, value, _ in points:
        out.setdefault(step // width, []).append(value)
    return out


def _assert_kept(offered: list[dict[str, Any]], held: MetricRows) -> None:
    """What ``held`` charts of ``offered`` (in read order) keeps every promise of thinning."""
    assert held.width, "not thinned: the run is not past the bound"
    assert sum(map(len, held.rows)) == held.values <= BOUND
    # A row without a step is placed by its position among the rows read.
    placed = [
        row if type(row.get("step")) is int else {**row, "step": position}
        for position, row in enumerate(offered)
    ]
    whole, kept = metric_points(placed), metric_points(held.rows)
    assert set(kept) == set(whole)
    for name, points in whole.items():
        shown = kept[name]
        assert set(shown) <= set(points), f"{name}: a point that was never offered"
        assert all(math.isfinite(value) for _, value, _ in shown)
        assert shown[0][:2] == points[0][:2] and shown[-1][:2] == points[-1][:2], name
        ranges = _buckets(shown, held.width)
        for bucket, values in _buckets(points, held.width).items():
            assert min(values) in ranges[bucket] and max(values) in ranges[bucket], (
                f"{name}: bucket {bucket}'s extremes"
            )


@pytest.mark.parametrize(("odd", "mixed"), [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("seed", range(3))
def test_past_the_bound_the_columns_keep_every_promise(
    tmp_path: Path, seed: int, odd: bool, mixed: bool
) -> None:
    rnd = random.Random(seed)
    rows = _rows(rnd, 3_000, 6, odd=odd, mixed=mixed)
    spike = rnd.randrange(len(rows))
    rows[spike]["m0"] = 1e9  # a spike and a dip, wherever they fall
    rows[(spike + 1_000) % len(rows)]["m1"] = -1e9
    held = MetricRows(expected_rows=len(rows))
    held.extend(json.loads(json.dumps(row)) for row in _read_order(rows))
    _assert_kept(_read_order(rows), held)
    values = {v for _, v, _ in metric_points(held.rows)["m0"]}
    assert 1e9 in values
    assert -1e9 in {v for _, v, _ in metric_points(held.rows)["m1"]}


def test_the_platforms_page_past_the_bound_keeps_every_promise(tmp_path: Path) -> None:
    rnd = random.Random(11)
    rows = _rows(rnd, 3_000, 6, odd=False)
    charted, width = _stored(tmp_path, rows)
    held = MetricRows(rows=charted, values=sum(map(len, charted)), width=width)
    _assert_kept(_read_order(rows), held)


def _thinning_work(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each thinning and each run of rows taken as columns looks at."""
    seen: list[int] = []
    extremes, add_thinned = metric_rows._extremes, MetricRows._add_thinned

    def counted_extremes(rows, width, names):  # type: ignore[no-untyped-def]
        seen.append(len(rows))
        return extremes(rows, width, names)

    def counted_add_thinned(self, records):  # type: ignore[no-untyped-def]
        seen.append(len(records))
        return add_thinned(self, records)

    monkeypatch.setattr(metric_rows, "_extremes", counted_extremes)
    monkeypatch.setattr(MetricRows, "_add_thinned", counted_add_thinned)
    return seen


def test_a_long_runs_rows_are_each_looked_at_about_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The width doubled at each thinning as the rows went on re-thinned
    every row held each time: 5.6 s of CPU for a 100,000-step run of 20
    metrics. Now the first thinning picks the whole run's width."""
    monkeypatch.setattr(metric_rows, "MAX_METRIC_VALUES", 20_000)
    monkeypatch.setattr(metric_rows, "BULK_ROWS", 256)
    rnd = random.Random(5)
    rows = _rows(rnd, 20_000, 20, odd=False)
    work = _thinning_work(monkeypatch)
    held = MetricRows(expected_rows=len(rows))
    held.extend(_read_order(rows))
    assert held.width and held.values <= 20_000
    # Row by row, thinned at a width doubled as the rows went on: 1.84 times.
    assert sum(work) <= 1.25 * len(rows), sum(work)


def test_the_offline_index_of_a_long_run_looks_at_each_row_about_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offline dashboard's index counts a journal's metric rows from
    their headers before reading them (a quarter of a second for 100,000),
    so its first thinning picks the whole run's width as the platform's
    does, and the rows after it are taken as columns. Row by row, with the
    width doubled as the rows went on, a 100,000-step run of 20 metrics took
    10-13 s of CPU to index, half of it thinning again."""
    rows = _read_order(_rows(random.Random(13), 3_000, 6, odd=False))
    with Journal.create(tmp_path / "runs") as journal:
        for at in range(0, len(rows), 500):
            journal.append(
                EntryKind.METRICS, [json.dumps(row).encode() for row in rows[at : at + 500]]
            )
        path = journal.path
    work = _thinning_work(monkeypatch)
    index = JournalIndex(training=True)
    with Journal.open(path, owner=False) as journal:
        index.update(journal)
    _assert_kept(rows, index.charted)
    assert sum(work) <= 1.25 * len(rows), sum(work)


@pytest.mark.parametrize("expected_rows", [0, 20_000])
def test_a_step_past_the_floats_is_thinned_without_an_overflow(
    monkeypatch: pytest.MonkeyPatch, expected_rows: int
) -> None:
    """A journal is untrusted, and ``json`` reads a 400-digit step as an
    int: the widths were compared with the span of steps times a float
    (OverflowError, the offline page a 500), where they were compared as
    ints before the whole run's width was projected."""
    monkeypatch.setattr(metric_rows, "MAX_METRIC_VALUES", 50)
    rnd = random.Random(31)
    held = MetricRows(expected_rows=expected_rows)
    for step in range(2_123):
        row: dict[str, Any] = {"step": 10**400 if step == 460 else step}
        row.update({f"m{j}": rnd.gauss(0.0, 1.0) for j in range(4) if rnd.random() < 0.8})
        held.add(row)
    assert held.width and held.values <= 50
    charted = metric_points(held.rows).values()
    assert max(step for points in charted for step, _, _ in points) == 2_122
