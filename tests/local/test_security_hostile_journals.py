"""The offline dashboard over a hostile journal: bounded memory, pages that render.

A journal of ~2 MB on disk declares gigabytes once decoded (zstd bombs, deep
nesting, objects of hundreds of thousands of keys: ``hostile_journal``). The
security review measured the offline dashboard at 2.94 GB peak over such a
journal; every page must now render (no 500, no run shown as unreadable)
within a fixed memory bound, with what was left out marked on the page.
The pages are rendered in a child process, whose peak RSS is the measure:
a memory bound is behaviour, not timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_journal import EPISODES, write_hostile_journal

HERE = Path(__file__).parent
#: The bound the issue sets for the hostile journal's pages.
MAX_RSS_MB = 200


@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("hostile-runs")
    runs.chmod(0o700)
    write_hostile_journal(runs)
    return runs


@pytest.fixture(scope="module")
def hostile_training(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("hostile-training")
    runs.chmod(0o700)
    write_hostile_journal(runs, kind="train")
    return runs


def _render(runs: Path, *paths: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(HERE / "dashboard_pages_rss.py"), str(runs), *paths],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_hostile_journals_pages_render_within_200_mb(hostile_runs: Path) -> None:
    run = "/dashboard/evaluations/hostile"
    paths = [
        "/",
        run,
        f"{run}?page=2",
        f"{run}/analysis",  # every episode's row
        f"{run}?sort=reward",
        f"{run}/samples/0",  # a 128 MiB string
        f"{run}/samples/1",  # 200,000 levels of nesting
        f"{run}/samples/2",  # 300,000 keys
        "/dashboard/compare?run=hostile",  # its analysis beside nothing
    ]
    result = _render(hostile_runs, *paths)
    pages = {p["path"]: p for p in result["pages"]}  # type: ignore[attr-defined]
    assert [pages[p]["status"] for p in paths] == [200] * len(paths), pages
    assert pages[f"{run}/samples/0"]["clipped"], "what was left out is marked on the page"
    assert result["maxrss_mb"] < MAX_RSS_MB, result


def test_a_hostile_training_runs_pages_render_within_200_mb(hostile_training: Path) -> None:
    """A training run's index decodes each episode once (for its step): one at a time."""
    run = "/dashboard/training/hostile"
    compare = "/dashboard/compare?run=hostile"  # its curves, as the compare page draws them
    paths = ["/", run, f"{run}/steps/0", f"{run}/steps/0?page=2", compare]
    result = _render(hostile_training, *paths)
    pages = {p["path"]: p for p in result["pages"]}  # type: ignore[attr-defined]
    assert [pages[p]["status"] for p in paths] == [200] * len(paths), pages
    assert pages[run]["clipped"], "the episodes not read are named on the run's page"
    assert result["maxrss_mb"] < MAX_RSS_MB, result


def test_a_hostile_journals_samples_are_all_listed(hostile_runs: Path) -> None:
    """Every episode has its row; one a page cannot decode says why, none is dropped."""
    from primeruns.local.dashboard.journal_source import JournalSource

    rows, total = JournalSource(hostile_runs).samples("hostile", 0, 50)
    assert total == EPISODES and len(rows) == 50
    bomb, deep, keys = rows[0], rows[1], rows[2]
    assert bomb.error is not None and "declares" in bomb.error and "[clipped:" in bomb.error
    assert deep.error is not None and "not shown" in deep.error
    assert keys.sample_id == "hostile-2"  # decoded within bounds, then clipped
