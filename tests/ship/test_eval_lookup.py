"""The lookup of an evaluation whose create's answer was lost
(``primeruns.ship.eval_lookup``), over loopback against the local platform,
where the newest evaluations of the team carry large configs."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import workloads

import primeruns as pr
from primeruns.local import LocalPlatform

_KEY = "lookup-key-0123456789"


def _big_evaluations(lp: LocalPlatform, team: str, count: int, config_bytes: int) -> None:
    """``count`` evaluations of ``team`` on gsm8k, each with ``config_bytes``
    of metadata (other runs of the team, made before this one)."""
    config = {"prompt_template": "x" * config_bytes}
    with httpx.Client(base_url=lp.url, headers={"Authorization": f"Bearer {_KEY}"}) as client:
        for index in range(count):
            body = {
                "name": f"other-{index}",
                "dataset": "gsm8k",
                "team_id": team,
                "environments": [{"id": "env-other"}],
                "metadata": {**config, "prime_runs": {"client_token": f"other-{index}"}},
            }
            client.post("/api/v1/evaluations/", json=body).raise_for_status()


def test_a_lost_create_is_found_among_evaluations_whose_page_is_past_the_answer_bound(
    local_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A page of 50 evaluations of ~350 KB of config each is ~17 MB, past the
    # 16 MiB an answer is read to: the lookup was refused on every try, and
    # the run, its create not to be sent again while one may exist, never
    # registered (its episodes never shipped, finish timed out).
    lp = local_platform
    for name in list(os.environ):
        if name.startswith("PRIME_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PRIME_TRACES_URL", lp.url)
    monkeypatch.setenv("PRIME_RUNS_RETRY_BASE_S", "0.02")
    team = "team-big-configs"
    # Made first: the lookup pages from the newest, so the run's own is
    # found only on the first page, which must be read for it.
    _big_evaluations(lp, team, 55, 350_000)
    # The create commits, then its answer is lost: init() cannot tell.
    before = lp.set_faults(ambiguous_rate=1.0, routes=["/api/v1/evaluations/"], max_faults=1)
    try:
        run = pr.init(
            kind="eval",
            name="lookup-past-the-bound",
            environments=["gsm8k"],
            model="m",
            team_id=team,
            api_key=_KEY,
            base_url=lp.url,
            runs_dir=tmp_path / "runs",
        )
        episodes = workloads.gsm8k(5)
        run.log_episodes(episodes)
        run.finish(timeout=40)
    finally:
        after = lp.set_faults(ambiguous_rate=0.0, routes=[], max_faults=0)
    assert after["injected"] - before["injected"] == 1  # the create's answer was lost
    ours = [r for r in lp.runs() if r["name"] == "lookup-past-the-bound"]
    assert len(ours) == 1, ours  # the create that landed, adopted: not made twice
    assert run.id == ours[0]["id"]
    stored = lp.run(ours[0]["id"])
    assert stored["status"] == "COMPLETED"
    assert stored["samples"]["rows"] == stored["samples"]["distinct"] == 5
    assert run.failed_records == {}
