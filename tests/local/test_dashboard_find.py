"""Finding runs in the dashboard's runs list: search by name, id, model,
environment or tag; filters by each of them, by kind, status and date; and
each run's environments and tags shown in its row. Over journals
(``serve --runs-dir``) and over the local platform's database alike.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_helpers import HOSTILE, OfflinePages, fresh
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.commands.demo_data import eval_episodes
from primeruns.local import LocalPlatform
from primeruns.local.dashboard.find import RunQuery
from primeruns.local.dashboard.views import RunRow


def _listed(client: httpx.Client | OfflinePages, query: str = "") -> list[str]:
    page = client.get(f"/{query}")
    assert page.status_code == 200, page.text[:300]
    return re.findall(r'<tr class="run" data-run-id="([^"]+)"', page.text)


def _offline(runs: Path, **kwargs: Any) -> str:
    run = pr.init(mode="offline", runs_dir=runs, **kwargs)
    if run.kind == "eval":
        run.log_episodes([fresh(eval_episodes()[0])])
    run.finish(**({"status": "failed", "error": "boom"} if kwargs.get("name") == "bad" else {}))
    assert run.journal_path is not None
    return run.journal_path.name


@pytest.fixture
def journals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    runs = point_at(monkeypatch, tmp_path, None)
    ids = {
        "math": _offline(
            runs, name="math", environments=["gsm8k"], model="qwen-8b", tags=["sweep", "lr-3"]
        ),
        "code": _offline(
            runs, name="code", environments=["humaneval"], model="llama-70b", tags=["sweep"]
        ),
        "bad": _offline(runs, name="bad", environments=["gsm8k"], model="llama-70b"),
        "train": _offline(
            runs, name="train", kind="train", model="qwen-8b", team_id="team-a", tags=["rl"]
        ),
    }
    return runs, ids


def test_the_runs_list_finds_runs_by_each_field_over_journals(
    journals: tuple[Path, dict[str, str]],
) -> None:
    runs, ids = journals
    with OfflinePages(runs) as client:

        def found(query: str) -> set[str]:
            names = {v: k for k, v in ids.items()}
            return {names[i] for i in _listed(client, query)}

        assert found("") == set(ids)
        assert found("?q=MATH") == {"math"}  # any case
        assert found("?q=llama") == {"code", "bad"}  # the model
        assert found("?q=humaneval") == {"code"}  # an environment
        assert found("?q=lr-3") == {"math"}  # a tag
        assert found(f"?q={ids['bad'][-8:]}") == {"bad"}  # the id (its random part)
        assert found("?model=qwen-8b") == {"math", "train"}
        assert found("?environment=gsm8k") == {"math", "bad"}
        assert found("?tag=sweep") == {"math", "code"}
        assert found("?kind=train") == {"train"}
        assert found("?status=FAILED") == {"bad"}
        assert found("?environment=gsm8k&model=llama-70b") == {"bad"}  # filters combine
        today = time.strftime("%Y-%m-%d", time.gmtime())
        assert found(f"?since={today}&until={today}") == set(ids)
        assert found("?until=2000-01-01") == set()
        none = client.get("/?tag=nope")
        assert "no runs match these filters" in none.text
        assert '<option value="nope" selected>' in none.text  # the filter asked for stays shown

        page = client.get("/")
        row = r'<tr class="run" data-run-id="([^"]+)">(.*?)</tr>'
        rows = dict(re.findall(row, page.text, re.S))
        math = rows[ids["math"]]
        assert '<span class="environment">gsm8k</span>' in math
        assert '<span class="tag">sweep</span>' in math and '<span class="tag">lr-3</span>' in math
        for field, value in (("environment", "humaneval"), ("tag", "rl"), ("model", "qwen-8b")):
            assert f'<option value="{value}">' in page.text, (field, value)


def test_the_runs_list_shows_and_finds_environments_by_name_on_the_platform(
    local_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform stores an evaluation's environments by hub id: the list names them."""
    url = local_platform.url
    runs = point_at(monkeypatch, tmp_path, url)
    made = {}
    for name, env, tags in (("a", "gsm8k", ["x", HOSTILE]), ("b", "math500", [])):
        run = pr.init(
            name=name, environments=[env], model="m", tags=tags,
            api_key=API_KEY, base_url=url, runs_dir=runs,
        )  # fmt: skip
        run.finish(timeout=60)
        made[name] = run.id
    client = httpx.Client(base_url=url, timeout=30)
    assert _listed(client, "?environment=gsm8k") == [made["a"]]
    assert _listed(client, "?q=math500") == [made["b"]]
    assert _listed(client, "?tag=x") == [made["a"]]
    page = client.get("/").text
    assert '<span class="environment">gsm8k</span>' in page
    assert HOSTILE not in page and "&lt;script&gt;window.__pwned" in page  # a tag is escaped
    client.close()


def test_a_date_window_takes_whole_utc_days_and_leaves_out_undated_runs() -> None:
    def row(created: float | None) -> RunRow:
        return RunRow("r", "eval", "n", "m", "COMPLETED", None, created, None)

    day = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    window = RunQuery(since="2023-11-14", until="2023-11-14")
    assert window.matches(row(day))
    assert not window.matches(row(day + 2 * 3600))  # 2023-11-15 00:13 UTC
    assert not window.matches(row(None))
    assert RunQuery(since="not a date").matches(row(None))  # an unreadable bound is no bound
