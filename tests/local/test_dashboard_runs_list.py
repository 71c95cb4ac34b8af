"""The offline dashboard's runs list with many runs: paged, searched over all of
them, derived again only for journals that changed, and held within its bounds.

What a user depends on: ``serve --runs-dir`` over thousands of past runs
answers a reload quickly (a page of the newest runs, not all of them), a
search still finds any run, a run that changes shows its change on the next
reload, and a long session opening many runs does not hold more memory than
its caches are allowed.
"""

from __future__ import annotations

import gc
import json
import re
import tracemalloc
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import OfflinePages

from primeruns.journal import EntryKind, Journal
from primeruns.local.dashboard import journal_source, routes
from primeruns.local.dashboard.journal_source import JournalSource


def _run(runs: Path, name: str, *, config: dict[str, Any] | None = None, n: int = 1) -> Path:
    """A finished offline evaluation's journal named ``name`` (ids sort by name)."""
    spec = {"kind": "eval", "mode": "offline", "name": f"run {name}", "config": config or {}}
    meta = {"spec": spec, "journal.created_at": 1_700_000_000 + int(name[-3:])}
    with Journal.create(runs, local_id=name, meta=meta) as journal:
        for i in range(n):
            journal.append(EntryKind.EPISODE, [json.dumps({"id": f"{name}-{i}"}).encode()])
        journal.append(EntryKind.FINISH, [b'{"status": "completed"}'])
        return journal.path


def _listed(text: str) -> list[str]:
    return re.findall(r'<tr class="run" data-run-id="([^"]+)"', text)


def test_the_runs_list_shows_a_page_of_the_newest_and_searches_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    names = [f"20250101-000000-{i:03d}" for i in range(5)]
    for name in names:
        _run(runs, name)
    monkeypatch.setattr(routes, "RUNS_PAGE_SIZE", 2)
    with OfflinePages(runs) as pages:
        first, last = pages.get("/"), pages.get("/?page=3")
        found = pages.get(f"/?q={urllib.parse.quote(f'run {names[0]}')}")
        beyond = pages.get("/?page=9")
    newest = names[::-1]
    assert _listed(first.text) == newest[:2] and "page 1 of 3" in first.text
    assert "5 of 5 runs" in first.text and 'href="?page=2"' in first.text
    assert _listed(last.text) == newest[4:] and "page 3 of 3" in last.text
    assert _listed(found.text) == [names[0]]  # the oldest, on no first page: found all the same
    assert _listed(beyond.text) == newest[4:]  # past the end: the last page


def test_a_reload_derives_again_only_the_runs_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    paths = [_run(runs, f"20250101-000000-{i:03d}") for i in range(4)]
    source = JournalSource(runs)
    before = {row.id: row.counts for row in source.runs()}
    derived: list[Path] = []
    real = journal_source.describe

    def spy(info: Any, *args: Any) -> Any:
        derived.append(info.path)
        return real(info, *args)

    monkeypatch.setattr(journal_source, "describe", spy)
    with Journal.open(paths[2], owner=True) as journal:  # it changes: one more episode
        journal.append(EntryKind.EPISODE, [b'{"id": "late"}'])
    after = {row.id: row.counts for row in source.runs()}
    assert derived == [paths[2]]
    assert after[paths[2].name] == {"episodes": before[paths[2].name]["episodes"] + 1}
    assert {k: v for k, v in after.items() if k != paths[2].name} == {
        k: v for k, v in before.items() if k != paths[2].name
    }


def test_a_long_session_opening_many_runs_stays_within_the_caches_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run's listing holds its meta (a 250 KB config here): the listing's
    memo kept every run's for the life of the process, so the memory a
    session held grew with the runs it listed and opened."""
    runs = tmp_path / "runs"
    big = {"notes": "x" * 250_000}
    names = [f"20250101-000000-{i:03d}" for i in range(32)]
    for name in names:
        _run(runs, name, config=big, n=3)
    cap = 1 << 20
    monkeypatch.setattr(journal_source, "CACHE_BYTES", cap)
    monkeypatch.setattr("primeruns.journal.memo.MEMO_BYTES", cap)
    monkeypatch.setattr("primeruns.local.dashboard.run_rows.ROWS_BYTES", cap)
    tracemalloc.start()
    try:
        source = JournalSource(runs)
        gc.collect()
        baseline = tracemalloc.get_traced_memory()[0]
        held = []
        for name in names:  # a session: the list, then each run in turn
            assert len(source.runs()) == len(names)
            detail = source.run(name)
            assert detail is not None and detail.row.name == f"run {name}"
            del detail
            gc.collect()
            held.append(tracemalloc.get_traced_memory()[0] - baseline)
    finally:
        tracemalloc.stop()
    # Memo, rows and indexes at most a cap each, and what a page holds meanwhile.
    assert max(held) < 4 * cap, [round(h / 1e6, 1) for h in held]
