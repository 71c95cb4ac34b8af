"""Each dashboard view tells the truth (issue #31's table): a journal's
training run shows only the sample tables the platform would store, a run's
config is the user's and not the SDK's bookkeeping, a tool call's arguments
read as the JSON they are, and samples are numbered from 0 as steps are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_helpers import OfflinePages, offline_eval, offline_train
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.local import LocalPlatform
from primeruns.local.dashboard.episodes import message_of
from primeruns.sinks.train_samples import DEFAULT_INTERVAL


def test_an_offline_training_run_shows_only_the_sample_tables_the_platform_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = offline_train(runs, DEFAULT_INTERVAL + 2)  # steps 0..11: tables of 0 and 10 ship
    assert run.journal_path is not None
    path = f"/dashboard/training/{run.journal_path.name}"
    with OfflinePages(runs) as client:
        page = client.get(path)
        assert page.status_code == 200
        listed = re.findall(r'<tr class="step"><td><a [^>]*>(\d+)</a>', page.text)
        assert listed == ["0", str(DEFAULT_INTERVAL)]
        assert f"every {DEFAULT_INTERVAL}th step" in page.text
        assert client.get(f"{path}/steps/{DEFAULT_INTERVAL}").status_code == 200
        assert client.get(f"{path}/steps/3").status_code == 404  # never shipped, never shown


def _online_eval(url: str, runs: Path, **kwargs: Any) -> pr.Run:
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=url, runs_dir=runs, **kwargs
    )
    run.finish(timeout=60)
    assert run.url is not None
    return run


def test_a_runs_config_is_the_users_without_the_sdks_client_token(
    local_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    bare = _online_eval(local_platform.url, runs, name="no-config")
    given = _online_eval(local_platform.url, runs, name="with-config", config={"lr": 0.5})
    assert bare.url is not None and given.url is not None

    def config(url: str) -> str:
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200
        found = re.search(r"<section><h2>config</h2>.*?</section>", page.text, re.S)
        assert found is not None
        return found.group(0)

    assert "no config was stored" in config(bare.url)
    shown = config(given.url)
    assert "client_token" not in shown and "prime_runs" not in shown
    assert "&#34;lr&#34;: 0.5" in shown


def test_tool_call_arguments_show_as_the_json_they_hold() -> None:
    arguments = {"path": "notes/a.txt", "lines": [1, 2]}
    message = message_of(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call-1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps(arguments)},
                },
                {"id": "call-2", "function": {"name": "echo", "arguments": "not json {"}},
            ],
        }
    )
    assert "\\" not in message.text  # no escaped quote anywhere
    first, second = message.text.split("\n[tool call] ")
    assert first.startswith("[tool call] read_file ")
    assert json.loads(first.removeprefix("[tool call] read_file ")) == arguments
    assert second == "echo not json {"


def test_samples_are_numbered_from_0_as_steps_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = offline_eval(runs, 3)
    assert run.journal_path is not None
    path = f"/dashboard/evaluations/{run.journal_path.name}"
    with OfflinePages(runs) as client:
        page = client.get(path)
        numbers = re.findall(r'<tr class="sample">\s*<td><a href="([^"]+)">(\d+)</a>', page.text)
        assert numbers == [(f"{path}/samples/{i}", str(i)) for i in range(3)]
        first = client.get(f"{path}/samples/0")
        assert first.status_code == 200 and "sample 0" in first.text
        assert client.get(f"{path}/samples/2").status_code == 200
        assert client.get(f"{path}/samples/3").status_code == 404
