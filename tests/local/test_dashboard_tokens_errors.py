"""An evaluation's token usage and its errors by category (issue #31): totals
and a column per sample, sortable; a table of error categories whose links
filter the samples; the same from a journal as from the platform, and from a
platform's samples stored before it kept their rows.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_helpers import OfflinePages, errored_episodes, fresh
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.commands.demo_data import eval_episodes
from primeruns.journal import EntryKind, Journal
from primeruns.local import LocalPlatform
from primeruns.local.dashboard.rows import error_category, record_row, sample_row, token_counts
from primeruns.projection import record_to_samples


def test_an_errors_category_is_its_type_else_its_first_line() -> None:
    assert error_category("ToolTimeout: tool hung") == "ToolTimeout"
    assert error_category("vf.errors.ParseError: bad") == "vf.errors.ParseError"
    assert error_category("connection reset by peer") == "connection reset by peer"
    assert error_category("Traceback (most recent call last):\n  File") == (
        "Traceback (most recent call last):"
    )
    assert error_category("x" * 500) == "x" * 79 + "…"
    assert error_category(None) is None and error_category("") is None


def test_tokens_are_the_episodes_counts_else_the_rows_usage() -> None:
    episode = {"num_input_tokens": 120, "num_output_tokens": 30}
    usage = {"prompt_tokens": 56, "cached_input_tokens": 64, "completion_tokens": 31}
    assert token_counts(episode, usage) == (120, 30)
    assert token_counts({}, usage) == (120, 31)  # cached input tokens are input too
    assert token_counts({"num_input_tokens": True}, {"prompt_tokens": -1}) == (None, None)
    assert token_counts({"num_output_tokens": 1 << 60}, {}) == (None, None)


def test_a_row_read_off_the_record_is_its_projections_row() -> None:
    """The offline analysis reads each episode's row off its record, without
    projecting it: the same row as the projection's, or None (then projected)."""
    episodes = errored_episodes()
    weighted = fresh(eval_episodes()[1])
    weighted["traces"][0]["rewards"] = {"a": {"score": 0.5, "weight": 2.0}, "b": None}
    nameless = fresh(eval_episodes()[2])
    nameless["traces"][0]["task"]["data"].pop("id")
    odd_error = fresh(eval_episodes()[3])
    odd_error["traces"][0]["errors"] = [{"detail": [1, None]}, "RuntimeError: late"]
    for record in [*episodes, weighted, nameless, odd_error]:
        expected = sample_row(4, record_to_samples(record, {}, finite=True)[0])
        assert record_row(4, record) == expected
    uncounted = fresh(eval_episodes()[0])
    del uncounted["num_input_tokens"], uncounted["num_output_tokens"]
    v0_row = record_to_samples(fresh(eval_episodes()[0]), {})[0]
    for other in (uncounted, v0_row, {"traces": []}, {"traces": ["x"]}, {"traces": {}}):
        assert record_row(0, other) is None  # left to the projection


def _analysis(page: str) -> str:
    found = re.search(r'<section class="analysis">.*?</section>', page, re.S)
    assert found is not None, page[:2000]
    return found.group(0)


def _table(page: str) -> list[dict[str, str]]:
    """The samples table: index, error, tokens in, tokens out."""
    found = re.findall(
        r'<tr class="sample">\s*<td><a href="[^"]*">(\d+)</a></td>.*?'
        r'<td class="error">([^<]*)</td>\s*<td class="input-tokens">([^<]*)</td>'
        r'\s*<td class="output-tokens">([^<]*)</td>',
        page,
        re.S,
    )
    return [dict(zip(("index", "error", "in", "out"), r, strict=True)) for r in found]


def _check_pages(get: Any, path: str, episodes: list[dict[str, Any]]) -> None:
    """What a user reads on the analysis and the samples table, against the records."""
    section = _analysis(get(f"{path}/analysis"))
    read = sum(e["num_input_tokens"] for e in episodes)
    written = sum(e["num_output_tokens"] for e in episodes)
    assert f'<tr class="tokens-input"><th>input</th><td class="total">{read}</td>' in section
    assert f'<tr class="tokens-output"><th>output</th><td class="total">{written}</td>' in section
    most = max(e["num_output_tokens"] for e in episodes)
    assert f'<tr class="tokens-most"><th>most output</th><td class="total">{most}</td>' in section
    # The categories, the most frequent first, each linking to its samples.
    categories = re.findall(
        r'<tr class="error-category"><td><a href="([^"]+)">([^<]+)</a></td>'
        r'<td class="category-count">(\d+)</td>',
        section,
    )
    assert [(name, int(n)) for _, name, n in categories] == [
        ("ToolTimeout", 2),
        ("ParseError", 1),
        ("SandboxError", 1),
    ]
    link = categories[0][0].replace("&amp;", "&")
    assert link == f"{path}?category=ToolTimeout#samples"
    shown = _table(get(link.removesuffix("#samples")))
    assert [int(r["index"]) for r in shown] == [3, 7]
    assert [r["error"] for r in shown] == [
        "ToolTimeout: tool hung after 30 s",
        "ToolTimeout: tool hung after 60 s",
    ]
    assert [int(r["index"]) for r in _table(get(f"{path}?category=SandboxError"))] == [12]
    assert '<datalist id="error-categories"><option value="ToolTimeout">' in section
    # Each sample's tokens, and the table sorted by them.
    rows = _table(get(path))
    assert [(int(r["in"]), int(r["out"])) for r in rows] == [
        (e["num_input_tokens"], e["num_output_tokens"]) for e in episodes
    ]
    longest = _table(get(f"{path}?sort=output_tokens&order=desc"))
    assert [int(r["out"]) for r in longest] == sorted(
        (e["num_output_tokens"] for e in episodes), reverse=True
    )
    fewest = _table(get(f"{path}?sort=input_tokens"))
    assert [int(r["in"]) for r in fewest] == sorted(e["num_input_tokens"] for e in episodes)


def test_an_offline_evaluations_tokens_and_error_categories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    episodes = errored_episodes()
    run = pr.init(name="tokens", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    run.log_episodes(episodes)
    run.finish()
    assert run.journal_path is not None
    with OfflinePages(runs) as client:

        def get(path: str) -> str:
            answer = client.get(path)
            assert answer.status_code == 200, path
            return answer.text

        _check_pages(get, f"/dashboard/evaluations/{run.journal_path.name}", episodes)
        episode = get(f"/dashboard/evaluations/{run.journal_path.name}/samples/12")
    expected = f"{episodes[12]['num_input_tokens']} / {episodes[12]['num_output_tokens']}"
    assert f'<td class="tokens">{expected}</td>' in episode
    assert '<td class="error">SandboxError: the sandbox did not start</td>' in episode


def test_the_platforms_tokens_and_error_categories_also_for_samples_stored_before(
    local_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Online, each sample's row is stored with it; samples stored before the
    platform kept those rows are read from their bodies, to the same pages."""
    url = local_platform.url
    runs = point_at(monkeypatch, tmp_path, url)
    run = pr.init(
        name="tokens", environments=["gsm8k"], model="m", api_key=API_KEY, base_url=url,
        runs_dir=runs, traces_opt_out=True,
    )  # fmt: skip
    episodes = errored_episodes()
    run.log_episodes(episodes)
    run.finish(timeout=60)
    assert run.url is not None
    path = run.url.removeprefix(url)
    pages: dict[str, str] = {}

    def get(asked: str) -> str:
        answer = httpx.get(url + asked, timeout=30)
        assert answer.status_code == 200, asked
        pages[asked] = answer.text
        return answer.text

    _check_pages(get, path, episodes)
    database = local_platform.data_dir / "platform.sqlite3"
    with sqlite3.connect(database) as conn:
        stored = conn.execute(
            "SELECT count(*) FROM eval_sample_rows WHERE eval_id = ?", (run.id,)
        ).fetchone()[0]
        assert stored == len(episodes)
        conn.execute("DELETE FROM eval_sample_rows WHERE eval_id = ?", (run.id,))
    local_platform.stop()  # what the pages held goes with the process
    local_platform.start()
    for asked, page in list(pages.items()):
        assert httpx.get(url + asked, timeout=30).text == page, asked


def test_a_reward_past_the_floats_leaves_the_evaluations_pages_up(tmp_path: Path) -> None:
    """JSON as Python reads it takes integers of any length: one episode of a
    journal scored ``10**400`` made the analysis, a sort by reward, a filter
    and a comparison 500s (OverflowError summing its rewards). The episode's
    row says it is not projected; the pages, and the other episodes, stand."""
    episodes = [fresh(e) for e in eval_episodes()[:3]]
    episodes[1]["traces"][0]["rewards"] = {"a": {"score": 10**400, "weight": 1.0}}
    spec = {"kind": "eval", "name": "huge", "model": "m", "mode": "offline"}
    runs = tmp_path / "runs"
    with Journal.create(runs, local_id="huge", meta={"spec": spec}) as journal:
        journal.append(EntryKind.EPISODE, [json.dumps(e).encode() for e in episodes])
    with OfflinePages(runs) as pages:
        for path in (
            "/dashboard/evaluations/huge",
            "/dashboard/evaluations/huge/analysis",
            "/dashboard/evaluations/huge?sort=reward",
            "/dashboard/evaluations/huge?min=0",
            "/dashboard/compare?run=huge&run=huge",
        ):
            assert pages.get(path).status_code == 200, path
