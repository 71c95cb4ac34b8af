"""An evaluation as an analysis: the reward histogram, pass@k up to the
rollouts per task, a row per task, samples sorted and filtered by reward,
correctness, task and error, and episode pages with previous/next (in the
list they were opened from) and the ground truth the record holds. The same
figures from a journal (``serve --runs-dir``) as from the platform's database,
and the rows held for them bounded.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_helpers import OfflinePages, fresh
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.commands.demo_data import eval_episodes
from primeruns.local import LocalPlatform
from primeruns.local.dashboard import routes
from primeruns.local.dashboard.analysis import analyse, pass_at_k
from primeruns.local.dashboard.journal_source import JournalSource
from primeruns.local.dashboard.routes import FRAGMENT_HEADER
from primeruns.local.dashboard.views import SampleRow, Source
from primeruns.projection import record_to_samples


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of all k-subsets of n samples (c correct) holding a correct one."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample() -> None:
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert math.isclose(pass_at_k(n, c, k), _brute_pass_at_k(n, c, k)), (n, c, k)


def test_analysis_of_rows_by_task() -> None:
    def row(i: int, task: str | None, reward: float | None, error: str | None = None) -> SampleRow:
        return SampleRow(i, f"s{i}", reward, error, task)

    rows = [
        row(0, "a", 1.0),
        row(1, "a", 0.0),
        row(2, "a", 0.5),
        row(3, "b", 0.0, "timeout"),
        row(4, "b", None, "crashed"),  # no reward: not scored, not in pass@k
        row(5, None, 0.25),  # no task: in the histogram only
    ]
    result = analyse(rows)
    assert (result.samples, result.scored, result.correct, result.errors) == (6, 5, 3, 2)
    assert result.untasked == 1
    assert [(t.task, t.samples, t.scored, t.correct, t.errors) for t in result.tasks] == [
        ("a", 3, 3, 2, 0),
        ("b", 2, 1, 0, 2),
    ]
    assert sum(b.count for b in result.histogram) == 5
    assert result.histogram[0].low == 0.0 and result.histogram[-1].high == 1.0
    assert result.histogram[-1].count == 1  # the highest reward is in the last bin
    # k up to the most scored samples of a task (3, task a); each over the tasks that have k.
    assert [(p.k, p.tasks) for p in result.pass_at] == [(1, 2), (2, 1), (3, 1)]
    assert math.isclose(result.pass_at[0].value, (2 / 3 + 0.0) / 2)
    assert math.isclose(result.pass_at[2].value, 1.0)


def _episodes() -> list[dict[str, Any]]:
    """The demo's 30 gsm8k episodes (8 tasks, 2 to 4 rollouts each), one with an error."""
    episodes = [fresh(e) for e in eval_episodes()]
    episodes[5]["traces"][0]["errors"] = [{"type": "ToolTimeout", "message": "tool hung"}]
    return episodes


def _expected(episodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [record_to_samples(e, {})[0] for e in episodes]


def _rows(page: str) -> list[dict[str, str]]:
    """The samples table's rows: index, task, reward, correct, error."""
    found = re.findall(
        r'<tr class="sample">\s*<td><a href="([^"]*)">(\d+)</a></td>'
        r'\s*<td class="task">([^<]*)</td>'
        r'\s*<td class="id">[^<]*</td>\s*<td class="reward">([^<]*)</td>'
        r'\s*<td class="correct">([^<]*)</td>\s*<td class="error">([^<]*)</td>',
        page,
    )
    keys = ("href", "index", "task", "reward", "correct", "error")
    return [dict(zip(keys, row, strict=True)) for row in found]


def _section(page: str) -> str:
    found = re.search(r'<section class="analysis">.*?</section>', page, re.S)
    assert found is not None, page[:2000]
    return found.group(0)


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, list[Any]]:
    runs = point_at(monkeypatch, tmp_path, None)
    episodes = _episodes()
    run = pr.init(name="analysed", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    run.log_episodes(episodes)
    run.finish()
    assert run.journal_path is not None
    return runs, run.journal_path.name, _expected(episodes)


def test_an_evaluations_page_shows_its_reward_histogram_pass_at_k_and_tasks(
    offline: tuple[Path, str, list[dict[str, Any]]],
) -> None:
    runs, run_id, samples = offline
    by_task: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        by_task[s["task"]["id"]].append(s["reward"])
    path = f"/dashboard/evaluations/{run_id}"
    with OfflinePages(runs) as client:
        page = client.get(path).text
        analysis = client.get(f"{path}/analysis").text
        fragment = client.get(f"{path}/analysis", headers={FRAGMENT_HEADER: "1"}).text
    # The evaluation's page loads its analysis after first paint (a link without scripts).
    assert f'data-fragment="{path}/analysis"' in page and f'href="{path}/analysis"' in page
    section = _section(analysis)
    assert fragment == section  # the section alone, for fragments.js to put in
    counts = [int(n) for n in re.findall(r'<td class="count">(\d+)</td>', section)]
    assert sum(counts) == len(samples)
    assert counts[0] == sum(1 for s in samples if s["reward"] == 0.0)  # the lowest bin
    assert counts[-1] == sum(1 for s in samples if s["reward"] == 1.0)  # the highest
    most = max(len(r) for r in by_task.values())
    shown = dict(
        re.findall(
            r'<tr class="pass-at" data-k="(\d+)"><td>\d+</td><td class="value">([^<]*)</td>',
            section,
        )
    )
    assert sorted(int(k) for k in shown) == list(range(1, most + 1))
    for k in (1, most):
        over = [r for r in by_task.values() if len(r) >= k]
        want = sum(_brute_pass_at_k(len(r), sum(x > 0 for x in r), k) for r in over) / len(over)
        assert shown[str(k)] == f"{want:.4g}", k
    tasks = re.findall(rf'<tr class="task"><td><a href="{path}\?task=([^"#]+)#samples">', section)
    assert tasks == sorted(by_task)
    assert '<strong class="error-count">1</strong>' in section


def test_an_evaluations_samples_sort_and_filter_by_reward_correctness_task_and_error(
    offline: tuple[Path, str, list[dict[str, Any]]],
) -> None:
    runs, run_id, samples = offline
    path = f"/dashboard/evaluations/{run_id}"
    task = samples[0]["task"]["id"]
    with OfflinePages(runs) as client:

        def rows(query: str) -> list[dict[str, str]]:
            answer = client.get(f"{path}?{query}")
            assert answer.status_code == 200
            return _rows(answer.text)

        assert [int(r["index"]) for r in rows("")] == list(range(len(samples)))
        wrong = rows("correct=no")
        assert [int(r["index"]) for r in wrong] == [
            i for i, s in enumerate(samples) if s["reward"] == 0.0
        ]
        assert {r["correct"] for r in wrong} == {"no"}
        assert {r["task"] for r in rows(f"task={task}")} == {task}
        assert len(rows(f"task={task}")) == sum(1 for s in samples if s["task"]["id"] == task)
        failed = rows("error=yes")
        assert [r["index"] for r in failed] == ["5"] and "tool hung" in failed[0]["error"]
        assert [r["index"] for r in rows("error=hung")] == ["5"]  # text the error holds
        assert len(rows("error=no")) == len(samples) - 1
        assert {r["reward"] for r in rows("min=0.5")} == {"1"}
        by_reward = [float(r["reward"]) for r in rows("sort=reward&order=desc")]
        assert by_reward == sorted(by_reward, reverse=True)
        by_task = [r["task"] for r in rows("sort=task")]
        assert by_task == sorted(by_task)
        # The order links: a column sorted ascending links to descending.
        page = client.get(f"{path}?sort=reward").text
        assert 'class="sort sorted-asc" href="?sort=reward&amp;order=desc#samples"' in page


def test_an_episode_has_previous_next_in_its_list_and_its_ground_truth(
    offline: tuple[Path, str, list[dict[str, Any]]],
) -> None:
    runs, run_id, samples = offline
    path = f"/dashboard/evaluations/{run_id}"
    with OfflinePages(runs) as client:
        first = client.get(f"{path}/samples/0").text
        assert 'rel="prev"' not in first
        assert f'rel="next" href="{path}/samples/1"' in first
        answer = re.search(r'<pre class="answer">([^<]*)</pre>', first)
        assert answer is not None and answer.group(1) == samples[0]["answer"]
        last = client.get(f"{path}/samples/{len(samples) - 1}").text
        assert 'rel="next"' not in last
        # Opened from the list of wrong answers: its neighbours are wrong answers.
        wrong = [i for i, s in enumerate(samples) if s["reward"] == 0.0]
        middle = client.get(f"{path}/samples/{wrong[1]}?correct=no").text
        assert f'rel="prev" href="{path}/samples/{wrong[0]}?correct=no"' in middle
        assert f'rel="next" href="{path}/samples/{wrong[2]}?correct=no"' in middle
        links = re.findall(r'<a href="([^"]+)">\d+</a>', client.get(f"{path}?correct=no").text)
        assert links[0] == f"{path}/samples/{wrong[0]}?correct=no"  # the table passes it on


def test_the_figures_from_a_journal_are_the_platforms(
    local_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = local_platform.url
    runs = point_at(monkeypatch, tmp_path, url)
    run = pr.init(
        name="both", environments=["gsm8k"], model="m", api_key=API_KEY, base_url=url,
        runs_dir=runs, traces_opt_out=True,
    )  # fmt: skip
    run.log_episodes(_episodes())
    run.finish(timeout=60)
    assert run.url is not None and run.journal_path is not None
    offline_path = f"/dashboard/evaluations/{run.journal_path.name}"

    def without_links(page: str) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if k != "href"} for r in _rows(page)]

    with OfflinePages(runs) as client:
        for query in ("", "?correct=no&sort=reward", "?sort=task&order=desc"):
            online = httpx.get(run.url + query, timeout=30).text
            offline = client.get(offline_path + query).text
            assert without_links(online) == without_links(offline), query
            online = httpx.get(f"{run.url}/analysis{query}", timeout=30).text
            offline = client.get(f"{offline_path}/analysis{query}").text
            online_path = run.url.removeprefix(url)  # the links name each run's own page
            assert _section(online).replace(online_path, "") == _section(offline).replace(
                offline_path, ""
            ), query


def test_the_rows_held_for_the_analysis_are_bounded(
    offline: tuple[Path, str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs, run_id, samples = offline
    source = JournalSource(runs)
    held, total = source.sample_facts(run_id, 7)
    assert len(held) == 7 and total == len(samples)
    monkeypatch.setattr(routes, "MAX_FACTS", 10)
    path = f"/dashboard/evaluations/{run_id}"
    with OfflinePages(runs) as client:
        analysis = client.get(f"{path}/analysis").text
        sorted_page = client.get(f"{path}?sort=reward").text
        page = client.get(path).text
    assert f"(the first 10 of {len(samples)})" in _section(analysis)
    assert len(_rows(sorted_page)) == 10  # a sorted table is of the rows held
    assert len(_rows(page)) == len(samples)  # the table in its order reads its page


class _CountingSource:
    """A source that counts the rows of every sample it is asked for."""

    def __init__(self, inner: Source) -> None:
        self.inner = inner
        self.fact_reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sample_facts(self, run_id: str, limit: int) -> tuple[list[SampleRow], int]:
        self.fact_reads += 1
        return self.inner.sample_facts(run_id, limit)


def test_an_evaluations_page_in_its_order_reads_its_page_not_every_sample(
    offline: tuple[Path, str, list[dict[str, Any]]],
) -> None:
    """A first visit costs what it shows (issue #32): the samples of its page.
    Every sample's row is read only for the analysis, a sort or a filter, or an
    episode's neighbours in a filtered list."""
    runs, run_id, samples = offline
    path = f"/dashboard/evaluations/{run_id}"
    with OfflinePages(runs) as client:
        counting = _CountingSource(client.app.state.dashboard_source)
        client.app.state.dashboard_source = counting
        for cheap in (path, f"{path}?page=2", f"{path}/samples/1"):
            assert client.get(cheap).status_code == 200, cheap
        assert counting.fact_reads == 0
        middle = client.get(f"{path}/samples/1").text
        assert f'rel="prev" href="{path}/samples/0"' in middle
        assert f'rel="next" href="{path}/samples/2"' in middle
        last = client.get(f"{path}/samples/{len(samples) - 1}").text
        assert 'rel="next"' not in last
        assert counting.fact_reads == 0
        for asked in (f"{path}/analysis", f"{path}?sort=reward", f"{path}/samples/1?correct=no"):
            before = counting.fact_reads
            assert client.get(asked).status_code == 200, asked
            assert counting.fact_reads == before + 1, asked
