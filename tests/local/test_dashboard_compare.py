"""Comparing runs without a browser: the task-by-task diff of two evaluations
(flipped tasks first), the overlay of training curves (a run keeps its colour
on every chart), the compare page over offline journals, and the charting
script served from its installed package.

The browser tests (``test_dashboard_browser.py``) drive the same pages as a user.
"""

from __future__ import annotations

import asyncio
import gc
import html
import json
import re
import weakref
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_helpers import OfflinePages, fresh, offline_train
from starlette.applications import Starlette

import primeruns as pr
from primeruns.commands.demo_data import eval_episodes
from primeruns.local.dashboard import vendor
from primeruns.local.dashboard.charts import MAX_DRAWN, overlay
from primeruns.local.dashboard.compare import MAX_COMPARED, diff
from primeruns.local.dashboard.routes import dashboard_routes
from primeruns.local.dashboard.views import RunDetail, RunRow, SampleRow


def _rows(*facts: tuple[str | None, float]) -> list[SampleRow]:
    return [SampleRow(i, None, reward, None, task) for i, (task, reward) in enumerate(facts)]


def test_two_evaluations_diff_task_by_task_with_the_flipped_tasks_first() -> None:
    a = _rows(("t1", 1.0), ("t2", 0.0), ("t3", 1.0), ("t4", 0.0), (None, 1.0))
    a += _rows(*[("t6", 1.0)] + [("t6", 0.0)] * 3)
    b = _rows(("t1", 0.0), ("t2", 1.0), ("t3", 0.5), ("t5", 1.0))
    b += _rows(*[("t6", 1.0)] * 3 + [("t6", 0.0)])
    result = diff(a, b)
    by_task = {t.task: t for t in result.tasks}
    changes = {t.task: t.change for t in result.tasks}
    assert changes == {
        "t1": "broken",
        "t2": "fixed",
        "t3": "same",
        "t4": "only in A",
        "t5": "only in B",
        "t6": "fixed",
    }
    # Flipped first, the largest move first (t6 moved from 1/4 to 3/4 correct).
    assert [t.task for t in result.tasks][:3] in (["t1", "t2", "t6"], ["t2", "t1", "t6"])
    assert result.tasks[2].shift == 0.5
    assert (result.flipped, result.count("fixed"), result.count("broken")) == (3, 2, 1)
    assert result.untasked == (1, 0)
    t6 = by_task["t6"]
    assert t6.a is not None and t6.b is not None
    assert (t6.a.correct, t6.a.scored, t6.b.correct, t6.b.scored) == (1, 4, 3, 4)
    assert by_task["t3"].reward_shift == -0.5


def test_overlaid_curves_draw_a_line_per_run_each_in_the_same_colour_on_every_chart() -> None:
    charts = overlay(
        [
            ("a", [{"step": 0, "loss": 1.0, "reward": 0.1}, {"step": 1, "loss": 0.5}]),
            ("b", [{"step": 0, "loss": 2.0}]),
            ("c", [{"step": 3, "reward": 0.7}]),
        ]
    )
    drawn = {c.name: json.loads(c.data) for c in charts}
    assert [(s["label"], s["slot"]) for s in drawn["loss"]["series"]] == [("a", 0), ("b", 1)]
    assert [(s["label"], s["slot"]) for s in drawn["reward"]["series"]] == [("a", 0), ("c", 2)]
    assert drawn["loss"]["series"][0]["step"] == [0, 1]
    assert drawn["loss"]["series"][0]["value"] == [1.0, 0.5]


def _scored(episode: dict[str, Any], score: float) -> dict[str, Any]:
    for trace in episode["traces"]:
        for reward in trace["rewards"].values():
            reward["score"] = score
    return episode


def _offline_eval(runs: Path, name: str, scores: dict[str, float]) -> pr.Run:
    """The demo's evaluation, each task's rewards replaced by ``scores`` where given."""
    run = pr.init(name=name, environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    episodes = [fresh(e) for e in eval_episodes()]
    for episode in episodes:
        task = episode["task"]["data"]["id"]
        if task in scores:
            _scored(episode, scores[task])
    run.log_episodes(episodes)
    run.finish()
    return run


def test_the_compare_page_overlays_training_runs_and_diffs_two_evaluations(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    tasks = sorted({e["task"]["data"]["id"] for e in eval_episodes()})
    first = _offline_eval(runs, "eval-a", {tasks[0]: 1.0, tasks[1]: 0.0})
    second = _offline_eval(runs, "eval-b", {tasks[0]: 0.0, tasks[1]: 1.0})
    train_a = offline_train(runs, 3, name="train-a")
    train_b = offline_train(runs, 5, name="train-b")
    ids = [train_a.id, first.id, train_b.id, second.id]
    with OfflinePages(runs) as pages:
        index = pages.get("/")
        assert index.status_code == 200
        boxes = re.findall(r'<input type="checkbox" name="run" value="([^"]+)"', index.text)
        assert sorted(boxes) == sorted(ids)
        assert 'action="/dashboard/compare"' in index.text

        page = pages.get("/dashboard/compare?" + "&".join(f"run={i}" for i in ids))
    assert page.status_code == 200, page.text[:500]
    curves = [json.loads(html.unescape(m)) for m in re.findall(r'data-curve="([^"]*)"', page.text)]
    assert {c["name"] for c in curves} == {"loss", "reward"}
    for curve in curves:
        assert [s["label"] for s in curve["series"]] == ["train-a", "train-b"]
        assert [len(s["step"]) for s in curve["series"]] == [3, 5]
        assert all(s["time"] is not None for s in curve["series"])  # the wall-time axis
    assert page.text.count('class="eval-summary"') == 2
    rows = re.findall(r'<tr class="task-row change-([a-z-]+)" data-task="([^"]+)"', page.text)
    assert len(rows) == len(tasks)
    flipped = [(change, task) for change, task in rows if change in ("fixed", "broken")]
    assert flipped[:2] in (
        [("broken", tasks[0]), ("fixed", tasks[1])],
        [("fixed", tasks[1]), ("broken", tasks[0])],
    )
    assert [change for change, _ in rows[:2]] != ["same", "same"]  # flipped first
    assert re.search(r'class="flipped-count">2<', page.text)


def test_the_compare_page_says_what_it_cannot_show(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    only = _offline_eval(runs, "lonely", {})
    with OfflinePages(runs) as pages:
        page = pages.get(f"/dashboard/compare?run={only.id}&run=no-such-run&run={only.id}")
        empty = pages.get("/dashboard/compare")
    assert page.status_code == 200
    assert page.text.count('class="eval-summary"') == 1  # asked twice, shown once
    assert "no-such-run" in page.text and "tick a second evaluation" in page.text
    assert empty.status_code == 200 and "compare selected" in empty.text


def test_the_charting_script_is_served_from_its_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with OfflinePages(tmp_path) as pages:
        script = pages.get("/_dashboard/vendor/uplot.js")
        style = pages.get("/_dashboard/vendor/uplot.css")
        other = pages.get("/_dashboard/vendor/..%2Fpyproject.toml")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        assert script.text.startswith("/*! https://github.com/leeoniya/uPlot")
        assert style.status_code == 200 and ".uplot" in style.text
        assert other.status_code == 404
        monkeypatch.setattr(vendor, "package_dir", lambda: None)
        missing = pages.get("/_dashboard/vendor/uplot.js")
        # A release of the package whose script is not the uPlot measured and
        # reviewed (another version, or tampered with) is not served.
        other_release = tmp_path / "site" / "youplot"
        (other_release / "vendor").mkdir(parents=True)
        (other_release / "vendor" / "uplot.iife.min.js").write_text("alert(document.cookie)")
        monkeypatch.setattr(vendor, "package_dir", lambda: other_release)
        tampered = pages.get("/_dashboard/vendor/uplot.js")
    assert missing.status_code == 503 and "prime-runs[local]" in missing.text
    assert tampered.status_code == 503 and "alert" not in tampered.text
    assert "not uPlot 1.6.31" in tampered.text


class _Rows(list[dict[str, Any]]):
    """A run's metric rows, which a weak reference can watch."""


class _LongRuns:
    """A source of training runs, each with many metric rows, that notes how
    many runs' rows are still held whenever the next run is read."""

    def __init__(self, rows_each: int) -> None:
        self.rows_each = rows_each
        self.given: list[weakref.ref[_Rows]] = []
        self.held_at_each_read: list[int] = []

    def run(self, run_id: str) -> RunDetail:
        gc.collect()
        self.held_at_each_read.append(sum(ref() is not None for ref in self.given))
        rows = _Rows({"step": s, "loss": 1.0 / (s + 1)} for s in range(self.rows_each))
        self.given.append(weakref.ref(rows))
        row = RunRow(run_id, "train", run_id, None, "COMPLETED", None, float(len(self.given)), None)
        return RunDetail(row, {}, None, {}, metrics=rows)


def test_the_compare_page_holds_one_runs_metric_rows_at_a_time() -> None:
    """Ten runs' rows held at once until the page was drawn: ten long
    training runs compared took 590 MB on the platform. Each run's rows are
    reduced to the points its lines draw before the next run is read."""
    source = _LongRuns(rows_each=5_000)
    app = Starlette(routes=dashboard_routes())
    app.state.dashboard_source = source
    ids = [f"run-{i}" for i in range(MAX_COMPARED)]

    async def fetch() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get("/dashboard/compare?" + "&".join(f"run={i}" for i in ids))

    page = asyncio.run(fetch())
    assert page.status_code == 200, page.text[:500]
    assert source.held_at_each_read == [0] * MAX_COMPARED
    curve = json.loads(html.unescape(re.findall(r'data-curve="([^"]*)"', page.text)[0]))
    assert [s["label"] for s in curve["series"]] == ids
    assert all(0 < len(s["step"]) <= MAX_DRAWN + 1 for s in curve["series"])
