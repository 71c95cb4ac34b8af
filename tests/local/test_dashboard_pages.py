"""The dashboard's pages over HTTP, without a browser: every value escaped, the
runs list's filters and order, and the offline mode reading a runs directory
(a damaged journal among healthy ones, read-only).

The browser tests (``test_dashboard_browser.py``) look at the same pages as a
user does; these pin what must hold of the markup itself.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_helpers import (
    HOSTILE,
    hostile_episode,
    offline_eval,
    offline_train,
    serve_runs_dir,
)
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.local import LocalPlatform
from primeruns.local.dashboard.routes import PAGE_SIZE, VERSION_HEADER

ESCAPED = "&lt;script&gt;window.__pwned = 1&lt;/script&gt;"


def _online(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, **kwargs: Any) -> pr.Run:
    runs = point_at(monkeypatch, tmp_path, url)
    return pr.init(model=HOSTILE, api_key=API_KEY, base_url=url, runs_dir=runs, **kwargs)


def _assert_escaped(page: httpx.Response) -> None:
    assert page.status_code == 200, page.text[:500]
    assert HOSTILE not in page.text and "<script>window" not in page.text
    assert ESCAPED in page.text


def test_every_value_a_page_shows_is_escaped(
    local_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = local_platform.url
    ev = _online(
        tmp_path,
        monkeypatch,
        url,
        name=HOSTILE,
        environments=["gsm8k"],
        config=pr.ConfigSource(text=f"title = '{HOSTILE}'"),
    )
    ev.log_episodes([hostile_episode()])
    ev.finish(summary={HOSTILE: 1.0}, status="failed", error=HOSTILE, timeout=60)
    tr = _online(tmp_path, monkeypatch, url, name=HOSTILE, kind="train", team_id="team-a")
    tr.log_metrics({HOSTILE: 1.0, "loss": 0.5}, step=0)
    tr.finish(timeout=60)
    assert ev.url is not None and tr.url is not None

    runs = httpx.get(f"{url}/", timeout=10)
    _assert_escaped(runs)
    assert runs.text.count(ESCAPED) >= 5  # two names, two models, the failed run's error
    evaluation = httpx.get(ev.url, timeout=10)
    _assert_escaped(evaluation)
    assert f"title = &#39;{ESCAPED}" in evaluation.text  # the config source, as stored
    episode = httpx.get(f"{ev.url}/samples/0", timeout=10)
    _assert_escaped(episode)
    assert f"assistant says {ESCAPED}" in episode.text
    training = httpx.get(tr.url, timeout=10)
    _assert_escaped(training)
    # The chart's data (the metric's name included) is an escaped attribute:
    # data for curves.js, which puts names on the page as text.
    assert any(ESCAPED in data for data in re.findall(r'data-curve="([^"]*)"', training.text))
    compare = httpx.get(f"{url}/dashboard/compare", params=[("run", ev.id), ("run", tr.id)])
    _assert_escaped(compare)


def test_runs_list_filters_by_kind_and_status_newest_first(
    local_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = local_platform.url
    names = ["first-eval", "failed-eval", "a-train"]
    made = []
    for name in names:
        extra: dict[str, Any] = (
            {"kind": "train", "team_id": "team-a"}
            if "train" in name
            else {"environments": ["gsm8k"]}
        )
        run = _online(tmp_path, monkeypatch, url, name=name, **extra)
        failed = name == "failed-eval"
        run.finish(status="failed" if failed else "completed", error="boom" if failed else None)
        made.append(run)

    def listed(query: str) -> list[str]:
        page = httpx.get(f"{url}/{query}", timeout=10)
        assert page.status_code == 200
        return re.findall(r'<tr class="run" data-run-id="([^"]+)"', page.text)

    ids = [r.id for r in made]
    assert listed("") == ids[::-1]  # newest first
    assert listed("?kind=train") == [ids[2]]
    assert listed("?kind=eval") == [ids[1], ids[0]]
    assert listed("?status=FAILED") == [ids[1]]
    failed_row = httpx.get(f"{url}/?status=FAILED", timeout=10).text
    assert "boom" in failed_row and f'href="/dashboard/evaluations/{ids[1]}"' in failed_row


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name == "data.mdb"
    }


@pytest.fixture
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, pr.Run, pr.Run]:
    """Two healthy offline runs, and two damaged journals beside them: one with
    an interior page zeroed, one whose data file is not LMDB at all."""
    runs = point_at(monkeypatch, tmp_path, None)
    ev = offline_eval(runs, 7)
    tr = offline_train(runs, 5)
    assert ev.journal_path is not None
    zeroed = runs / "zzzz-zeroed"
    shutil.copytree(ev.journal_path, zeroed)
    raw = bytearray((zeroed / "data.mdb").read_bytes())
    raw[2 * 4096 : 3 * 4096] = bytes(4096)
    (zeroed / "data.mdb").write_bytes(bytes(raw))
    garbage = runs / "zzzz-garbage"
    garbage.mkdir()
    (garbage / "data.mdb").write_bytes(b"not a journal" * 1000)
    return runs, ev, tr


def test_offline_runs_dir_shows_healthy_runs_beside_damaged_ones_read_only(
    runs_dir: tuple[Path, pr.Run, pr.Run], tmp_path: Path
) -> None:
    """``primeruns serve --runs-dir``: the runs of a directory of journals, each
    page as on the platform, a damaged journal listed as damaged, nothing written."""
    runs, ev, tr = runs_dir
    assert ev.journal_path is not None and tr.journal_path is not None
    before = _digest(runs)
    proc, url = serve_runs_dir(runs)
    client = httpx.Client(base_url=url, timeout=30)
    listing = client.get("/")
    assert listing.status_code == 200
    rows = dict(re.findall(r'<tr class="run" data-run-id="([^"]+)">(.*?)</tr>', listing.text, re.S))
    assert {ev.journal_path.name, tr.journal_path.name, "zzzz-garbage"} <= set(rows)
    assert "DAMAGED" in rows["zzzz-garbage"]
    assert "COMPLETED" in rows[ev.journal_path.name]

    evaluation = client.get(f"/dashboard/evaluations/{ev.journal_path.name}")
    assert evaluation.status_code == 200
    assert evaluation.text.count('<tr class="sample">') == 7
    episode = client.get(f"/dashboard/evaluations/{ev.journal_path.name}/samples/6")
    assert episode.status_code == 200 and 'class="message role-assistant"' in episode.text

    training = client.get(f"/dashboard/training/{tr.journal_path.name}")
    assert training.status_code == 200
    for metric in ("loss", "reward"):
        figure = re.search(rf'data-metric="{metric}" data-curve="([^"]*)"', training.text)
        assert figure is not None
        (line,) = json.loads(html.unescape(figure.group(1)))["series"]
        assert line["step"] == [0, 1, 2, 3, 4]  # a point per step
    assert 'class="max-steps">10<' in training.text
    # A poll with the version the page shows gets a 204; another version, the page.
    version = re.search(r'data-version="([0-9a-f]+)"', training.text)
    assert version is not None
    path = f"/dashboard/training/{tr.journal_path.name}"
    assert client.get(path, headers={VERSION_HEADER: version.group(1)}).status_code == 204
    assert client.get(path, headers={VERSION_HEADER: "0" * 16}).status_code == 200
    step = client.get(f"/dashboard/training/{tr.journal_path.name}/steps/0")
    assert step.status_code == 200 and step.text.count('<tr class="step-row">') == 3

    # The damaged journals' pages answer (what is intact, or not found), never a 500.
    for damaged in ("zzzz-zeroed", "zzzz-garbage"):
        for path in (
            f"/dashboard/evaluations/{damaged}",
            f"/dashboard/training/{damaged}",
            f"/dashboard/evaluations/{damaged}/samples/0",
        ):
            assert client.get(path).status_code in (200, 404), path
    assert client.get("/").status_code == 200  # and the server is still up
    # The platform's API is not there: this mode only shows journals.
    assert client.get("/api/v1/evaluations/").status_code == 404
    client.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert _digest(runs) == before  # read-only: no journal was written to


def test_serve_runs_dir_refuses_a_missing_directory(tmp_path: Path) -> None:
    missing = subprocess.run(
        [sys.executable, "-m", "primeruns.local", "--runs-dir", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "nope" in missing.stderr


def test_an_evaluations_samples_are_paged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = offline_eval(runs, PAGE_SIZE + 5)
    assert run.journal_path is not None
    _, url = serve_runs_dir(runs)
    page_url = f"{url}/dashboard/evaluations/{run.journal_path.name}"

    def numbers(page: httpx.Response) -> list[int]:
        assert page.status_code == 200
        found = re.findall(r'<tr class="sample">\s*<td><a [^>]*>(\d+)</a>', page.text)
        return [int(n) for n in found]

    first = httpx.get(page_url, timeout=30)
    assert numbers(first) == list(range(PAGE_SIZE))
    assert 'rel="next" href="?page=2#samples"' in first.text and 'rel="prev"' not in first.text
    second = httpx.get(f"{page_url}?page=2", timeout=30)
    assert numbers(second) == list(range(PAGE_SIZE, PAGE_SIZE + 5))
    assert 'rel="prev" href="?#samples"' in second.text and 'rel="next"' not in second.text
    last = httpx.get(f"{page_url}/samples/{PAGE_SIZE + 4}", timeout=30)
    assert last.status_code == 200 and f"sample {PAGE_SIZE + 4}" in last.text
    assert httpx.get(f"{page_url}/samples/{PAGE_SIZE + 5}", timeout=30).status_code == 404
