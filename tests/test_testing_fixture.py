"""``primeruns.testing`` used as a user would: their pipeline, unchanged, runs
against the ``prime_platform`` fixture and the test reads back what landed;
or a test answers the platform itself through ``use_transport``."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest.mock import ANY

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
    home = Path(os.environ["HOME"])
    assert home.is_relative_to(tmp_path_factory.getbasetemp())
    assert os.environ["PRIME_API_BASE_URL"] == os.environ["PRIME_TRACES_URL"]
    assert os.environ["PRIME_TRACES_URL"] == prime_platform.url
    assert "PRIME_RUNS_MODE" not in os.environ and "PRIME_TEAM_ID" not in os.environ


# -- a transport of the test's own -----------------------------------------------------


class FakePlatform:
    """What a user writes to answer an evaluation's requests themselves: it
    keeps what was sent and answers as docs/TESTING.md says the platform does."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.traces: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self.status = ""

    def handle(self, request: httpx.Request) -> httpx.Response:
        method, path = request.method, request.url.path
        self.requests.append(f"{method} {path}")
        if path == "/api/v1/environmentshub/resolve":
            return httpx.Response(200, json={"data": {"id": "env-1"}})
        if (method, path) == ("POST", "/api/v1/evaluations/"):
            return httpx.Response(201, json={"evaluation_id": "eval-1"})
        if (method, path) == ("POST", "/api/v1/traces"):
            # Multipart: a "metadata" part, then the "traces" part, gzipped
            # JSON lines (one episode or trace a line).
            boundary = request.headers["Content-Type"].split("boundary=")[1].encode()
            for part in request.read().split(b"--" + boundary):
                head, _, data = part.partition(b"\r\n\r\n")
                if b'name="traces"' in head:
                    lines = gzip.decompress(data.removesuffix(b"\r\n")).splitlines()
                    self.traces += [json.loads(line) for line in lines]
            digest = request.headers["Idempotency-Key"].removeprefix("sha256:")
            return httpx.Response(200, json={"status": "committed", "upload_id": digest})
        if (method, path) == ("POST", "/api/v1/evaluations/eval-1/samples"):
            rows = json.loads(request.read())["samples"]
            self.samples += rows
            return httpx.Response(200, json={"evaluation_id": "eval-1", "inserted": len(rows)})
        if (method, path) == ("PUT", "/api/v1/evaluations/eval-1"):  # the summary
            self.summary = json.loads(request.read())["metrics"]
            return httpx.Response(200, json={"evaluation_id": "eval-1"})
        if (method, path) == ("POST", "/api/v1/evaluations/eval-1/finalize"):
            self.status = "COMPLETED"
            return httpx.Response(200, json={"evaluation_id": "eval-1", "status": self.status})
        return httpx.Response(404, json={"detail": f"not faked: {method} {path}"})


def test_a_mock_transport_of_the_test_answers_every_request_of_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("PRIME_RUNS_MODE", "PRIME_TRACES_OPT_OUT", "PRIME_TEAM_ID", "PRIME_RUNS_UPLINK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PRIME_API_KEY", "a-key-of-the-test")
    monkeypatch.setenv("PRIME_RUNS_DIR", str(tmp_path / "runs"))
    fake = FakePlatform()
    episodes = workloads.gsm8k(3)
    with use_transport(httpx.MockTransport(fake.handle)):
        run = evaluate(episodes)
    assert run.errors == [] and run.failed_records == {}, fake.requests
    assert run.id == "eval-1" and fake.status == "COMPLETED"
    assert [row["sample_id"] for row in fake.samples] == [e["id"] for e in episodes]
    assert {t["run"]["id"] for t in fake.traces} == {"eval-1"}
    assert fake.summary == pr.metrics.from_episodes(episodes) | {"prime_runs": ANY}
    assert "PRIME_RUNS_UPLINK" not in os.environ  # as it was before the block


# -- opting in, as a project's conftest.py does ---------------------------------------

_USER_TESTS = """
import sys

import primeruns as pr

def test_that_does_not_ask_for_it():
    assert "primeruns.local" not in sys.modules  # nothing of the platform loaded

def test_that_asks_for_it(prime_platform):
    run = pr.init(environments=["gsm8k"], model="m")
    run.finish()
    assert prime_platform.run(run.id)["status"] == "COMPLETED"
"""


def test_the_readme_conftest_recipe_loads_the_fixture_and_starts_nothing_unasked(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text('pytest_plugins = ["primeruns.testing"]\n')
    (project / "test_pipeline.py").write_text(_USER_TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
