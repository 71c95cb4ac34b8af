"""``primeruns.testing`` used as a user would: their pipeline, unchanged, runs
against the ``prime_platform`` fixture and the test reads back what landed;
or a test answers the platform itself through ``use_transport``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import workloads

import primeruns as pr
from primeruns.testing import PrimePlatform, prime_platform, use_transport

__all__ = ["prime_platform"]  # the fixture, imported as a user's conftest.py does


# -- the user's code: it calls pr.init() and knows nothing of tests ----------------


def evaluate(episodes: list[dict[str, Any]]) -> pr.Run:
    run = pr.init(name="gsm8k-nightly", environments=["gsm8k"], model="m")
    run.log_episodes(episodes)
    run.finish(summary=pr.metrics.from_episodes(episodes))
    return run


def train(steps: int) -> pr.Run:
    run = pr.init(kind="train", model="m", team_id="my-team")
    for step in range(steps):
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    run.finish()
    return run


# -- the fixture ---------------------------------------------------------------------


def test_a_pipeline_run_against_prime_platform_lands_and_is_read_back(
    prime_platform: PrimePlatform,
) -> None:
    episodes = workloads.gsm8k(4)
    run = evaluate(episodes)
    assert run.mode == "online" and run.errors == [] and run.failed_records == {}
    assert run.url is not None and run.url.startswith(prime_platform.url)
    assert run.journal_path is not None
    assert run.journal_path.parent == prime_platform.runs_dir

    stored = prime_platform.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert [r["id"] for r in prime_platform.runs()] == [run.id]
    rows = prime_platform.samples(run.id)
    assert [row["sample_id"] for row in rows] == [e["id"] for e in episodes]
    landed = prime_platform.episodes(run.id)
    assert [e["id"] for e in landed] == [e["id"] for e in episodes]
    assert {e["run"]["id"] for e in landed} == {run.id}
    assert landed[0]["traces"][0]["rewards"] == episodes[0]["traces"][0]["rewards"]

    run = train(3)
    assert prime_platform.run(run.id)["status"] == "COMPLETED"
    metrics = prime_platform.metrics(run.id)
    assert [(m["step"], m["loss"]) for m in metrics] == [(0, 1.0), (1, 0.5), (2, 1 / 3)]


def test_prime_platform_keeps_the_machines_settings_out(
    prime_platform: PrimePlatform, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import os
    from pathlib import Path

    home = Path(os.environ["HOME"])
    assert home.is_relative_to(tmp_path_factory.getbasetemp())
    assert os.environ["PRIME_API_BASE_URL"] == os.environ["PRIME_TRACES_URL"]
    assert os.environ["PRIME_TRACES_URL"] == prime_platform.url
    assert "PRIME_RUNS_MODE" not in os.environ and "PRIME_TEAM_ID" not in os.environ
