"""An evaluation's analysis asked again with the version it was answered with
(``fragments.js``, after a live page swapped news in) is a 204 while the
samples it reads are the same, without an analysis made or a template
rendered: the analysis of a 20,000-episode run cost 0.2-0.35 s of CPU each
time. A new sample, logged to a journal or posted to the platform, moves the
version; a version the route never gave renders, as a first visit does."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_helpers import OfflinePages, fresh
from local_helpers import Api
from sdk_helpers import point_at

import primeruns as pr
from primeruns.commands.demo_data import eval_episodes
from primeruns.local.dashboard import routes
from primeruns.local.dashboard.routes import FRAGMENT_HEADER, VERSION_HEADER

FRAGMENT = {FRAGMENT_HEADER: "1"}


@pytest.fixture
def analyses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The samples of each analysis the route makes, in order."""
    made: list[int] = []
    real = routes.analyse

    def analyse(rows: Any) -> Any:
        rows = list(rows)
        made.append(len(rows))
        return real(rows)

    monkeypatch.setattr(routes, "analyse", analyse)
    return made


def _version(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text[:500]
    version = answer.headers.get(VERSION_HEADER)
    assert version, answer.headers
    return version


def _asked_with(version: str) -> dict[str, str]:
    return {**FRAGMENT, VERSION_HEADER: version}


def test_a_journals_analysis_asked_with_its_version_is_a_204_until_an_episode_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, analyses: list[int]
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(name="live", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    assert run.journal_path is not None
    path = f"/dashboard/evaluations/{run.journal_path.name}/analysis"
    demo = eval_episodes()
    run.log_episodes([fresh(demo[i]) for i in range(3)])
    with OfflinePages(runs) as client:
        first = client.get(path, headers=FRAGMENT)
        version = _version(first)
        assert analyses == [3]
        again = client.get(path, headers=_asked_with(version))
        assert (again.status_code, again.content, analyses) == (204, b"", [3])
        # A run that has only moved on in time (its summary, status, owner) shows
        # the same section: still a 204 once the run finished.
        run.finish(summary={"avg_reward": 0.5})
        after_finish = client.get(path, headers=_asked_with(version))
        assert (after_finish.status_code, analyses) == (204, [3])
        # The page of its own shows the run's status too: finishing moved it.
        whole = client.get(path)
        assert client.get(path, headers={VERSION_HEADER: _version(whole)}).status_code == 204
        assert client.get(path, headers={VERSION_HEADER: version}).status_code == 200

    run = pr.init(name="more", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    assert run.journal_path is not None
    path = f"/dashboard/evaluations/{run.journal_path.name}/analysis"
    run.log_episodes([fresh(demo[i]) for i in range(3)])
    with OfflinePages(runs) as client:
        version = _version(client.get(path, headers=FRAGMENT))
        run.log_episodes([fresh(demo[3])])
        moved = client.get(path, headers=_asked_with(version))
        assert _version(moved) != version
        assert "4 samples" in moved.text
        # What the route renders for a poller with an old version is what a first visit gets.
        assert moved.content == OfflinePages(runs).get(path, headers=FRAGMENT).content
    run.finish()


@pytest.mark.parametrize("sent", ["", "garbage", "0" * 16, "the page's"])
def test_an_analysis_asked_with_a_version_it_never_gave_renders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, analyses: list[int], sent: str
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(name="e", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    assert run.journal_path is not None
    run.log_episodes([fresh(e) for e in eval_episodes()[:2]])
    run.finish()
    path = f"/dashboard/evaluations/{run.journal_path.name}/analysis"
    with OfflinePages(runs) as client:
        if sent == "the page's":  # the version of the evaluation's page, not of its analysis
            page = client.get(path.removesuffix("/analysis")).text
            found = re.search(r'data-version="([0-9a-f]+)"', page)
            assert found is not None
            sent = found.group(1)
        plain = client.get(path, headers=FRAGMENT)
        asked = client.get(path, headers={**FRAGMENT, VERSION_HEADER: sent})
    assert asked.status_code == 200
    assert asked.content == plain.content and "2 samples" in asked.text
    assert analyses == [2, 2]


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Api]:
    made = Api(tmp_path / "data")
    yield made
    made.db.close()


def test_a_platforms_analysis_asked_with_its_version_is_a_204_until_a_sample_is_posted(
    platform: Api, analyses: list[int]
) -> None:
    created = platform.post("/api/v1/evaluations/", json={"name": "e", "run_id": "r"})
    assert created.status_code == 201, created.text
    eval_id = created.json()["evaluation_id"]

    def post(path: str, body: dict[str, Any]) -> None:
        answer = platform.post(f"/api/v1/evaluations/{eval_id}{path}", json=body)
        assert answer.status_code == 200, answer.text

    def poll(version: str, query: str = "") -> httpx.Response:
        path = f"/dashboard/evaluations/{eval_id}/analysis{query}"
        return platform.get(path, headers=_asked_with(version))

    post("/samples", {"samples": [{"sample_id": "a", "reward": 1.0, "task": "t"}]})
    version = _version(poll(""))
    assert poll(version).status_code == 204
    assert analyses == [1]
    # Finalized with its metrics: its status and summary moved, its samples did not.
    post("/finalize", {"metrics": {"avg_reward": 1.0}})
    assert poll(version).status_code == 204
    assert analyses == [1]
    post("/samples", {"samples": [{"sample_id": "b", "reward": 0.0, "task": "t"}]})
    moved = poll(version)
    assert _version(moved) != version and "2 samples" in moved.text
    assert analyses == [1, 2]
    assert poll(_version(moved)).status_code == 204
    # Each query has its own answer (its links keep it): another one renders.
    assert poll(_version(moved), "?task=t").status_code == 200
