"""What a page takes from its address: numbers of any length, from anyone who
can send a link. A page past the end is an empty page, a sample or step no
source holds is a 404; never a 500."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from dashboard_helpers import errored_episodes
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.local import LocalPlatform

#: Past SQLite's integers; past Python's digits for ``int(text)``.
PAST_SQLITE = "9" * 30
PAST_PYTHON = "9" * 5000


def test_numbers_of_any_length_in_an_address_are_no_500(
    local_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page, a sample or a step past SQLite's integers raised OverflowError
    in the platform's query, and a sample number past Python's 4,300 digits
    raised in Starlette's conversion: each a 500."""
    url = local_platform.url
    runs = point_at(monkeypatch, tmp_path, url)
    common = {"model": "m", "api_key": API_KEY, "base_url": url, "runs_dir": runs}
    evaluation = pr.init(name="e", environments=["gsm8k"], traces_opt_out=True, **common)
    evaluation.log_episodes(errored_episodes()[:3])
    evaluation.finish(timeout=60)
    training = pr.init(name="t", kind="train", team_id="team-a", **common)
    training.log_metrics({"loss": 1.0}, step=0)
    training.finish(timeout=60)
    ev, tr = f"/dashboard/evaluations/{evaluation.id}", f"/dashboard/training/{training.id}"
    expected = {
        f"{ev}?page={PAST_SQLITE}": 200,
        f"{ev}?page={PAST_PYTHON}": 200,
        f"{ev}/samples/{PAST_SQLITE}": 404,
        f"{ev}/samples/{PAST_SQLITE}?sort=reward": 404,
        f"{ev}/samples/{PAST_PYTHON}": 404,
        f"{tr}/steps/{PAST_SQLITE}": 404,
        f"{tr}/steps/{PAST_PYTHON}": 404,
        f"{tr}/steps/0?page={PAST_SQLITE}": 404,
        f"/?page={PAST_SQLITE}": 200,
    }
    found = {path: httpx.get(url + path, timeout=30).status_code for path in expected}
    assert found == expected
