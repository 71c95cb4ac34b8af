"""Every recipe of docs/TESTING.md, proven as written there: how a user tests
their own code that logs runs, without a network.

``evaluate`` and ``train`` stand for the user's code: they call ``pr.init``
the way a pipeline does and know nothing of tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import procs
import pyarrow.parquet as pq
import pytest
import workloads
from sdk_helpers import held_uplink_starts, point_at, wait_for

import primeruns as pr
from primeruns.local import LocalPlatform


def evaluate(episodes: list[dict[str, Any]], **init: Any) -> pr.Run:
    run = pr.init(name="gsm8k-nightly", environments=["gsm8k"], model="m", **init)
    run.log_episodes(episodes)
    run.finish(summary=pr.metrics.from_episodes(episodes))
    return run


def train(steps: int, **init: Any) -> pr.Run:
    run = pr.init(kind="train", model="m", team_id="my-team", **init)
    for step in range(steps):
        run.log_metrics({"loss": 1.0 / (step + 1), "grad_norm": float("nan")}, step=step)
    run.finish()
    return run


def primeruns_cli(*args: str) -> str:
    """``primeruns ARGS`` (as ``python -m primeruns``): its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "primeruns", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No PRIME_* setting of this machine (a real key above all) reaches a test."""
    return point_at(monkeypatch, tmp_path, None)


# -- offline: journal only, read back with the CLI ------------------------------


def test_an_offline_run_is_read_back_with_primeruns_export_and_show(runs: Path) -> None:
    episodes = workloads.gsm8k(5)
    run = evaluate(episodes, mode="offline", runs_dir=runs)
    assert run.mode == "offline" and run.url is None and run.errors == []
    assert run.journal_path is not None

    exported = primeruns_cli("export", str(run.journal_path))
    assert [json.loads(line) for line in exported.splitlines()] == episodes

    shown = json.loads(primeruns_cli("show", run.id, "--runs-dir", str(runs), "--json"))
    assert shown["mode"] == "offline" and shown["counts"]["episodes"] == 5
    assert shown["finish"]["status"] == "completed"
    assert shown["summary"] == pr.metrics.from_episodes(episodes)


def test_an_offline_training_runs_metric_rows_are_exported_as_logged(
    runs: Path, tmp_path: Path
) -> None:
    run = train(3, mode="offline", runs_dir=runs)
    assert run.journal_path is not None
    exported = primeruns_cli("export", str(run.journal_path), "--kind", "metrics")
    rows = [json.loads(line) for line in exported.splitlines()]
    assert [(row["step"], row["loss"]) for row in rows] == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    assert all("grad_norm" not in row and "_timestamp" in row for row in rows)

    table = tmp_path / "metrics.parquet"
    primeruns_cli("export", str(run.journal_path), "--kind", "metrics", "-o", str(table))
    assert pq.read_table(table).to_pylist() == rows
    shown = json.loads(primeruns_cli("show", str(run.journal_path), "--json"))
    assert shown["metrics"]["loss"] == {
        "points": 3,
        "steps": [0, 2],  # the first and the last
        "min": 1 / 3,
        "max": 1.0,
        "last": 1 / 3,
    }


def test_export_reads_a_run_that_is_still_live(runs: Path) -> None:
    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
    run.log_episodes(workloads.gsm8k(2))
    assert run.journal_path is not None
    assert len(primeruns_cli("export", str(run.journal_path)).splitlines()) == 2
    run.finish()


def test_the_environment_makes_code_that_does_not_pass_mode_run_offline(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_API_KEY", "a-real-looking-key")  # as on a developer's machine
    monkeypatch.setenv("PRIME_RUNS_MODE", "offline")
    monkeypatch.setenv("PRIME_RUNS_DIR", str(runs))
    run = evaluate(workloads.gsm8k(2))
    assert run.mode == "offline" and run.url is None
    assert run.journal_path is not None and run.journal_path.parent == runs
    # An explicit mode= in the code is not overridden by the environment.
    assert evaluate(workloads.gsm8k(1), mode="disabled").mode == "disabled"


def test_offline_with_on_error_raise_makes_a_record_the_platform_would_refuse_raise(
    runs: Path,
) -> None:
    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs, on_error="raise")
    with pytest.raises(TypeError, match="not an episode"):
        run.log_episodes([{"id": "e1", "prompt": "no traces list"}])
    run.finish()


# -- disabled: nothing written ----------------------------------------------------


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_disabled_run_accepts_every_call_and_writes_nothing(
    how: str, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    init: dict[str, Any] = {"runs_dir": runs}
    if how == "argument":
        init["mode"] = "disabled"
    else:
        monkeypatch.setenv("PRIME_RUNS_MODE", "disabled")
    episodes = workloads.gsm8k(3)
    run = evaluate(episodes, **init)
    assert run.mode == "disabled" and run.journal_path is None and not runs.exists()
    assert run.status is pr.RunStatus.COMPLETED
    assert run.summary == pr.metrics.from_episodes(episodes)  # the handle still has it
    run = train(2, **init)
    assert run.journal_path is None and not runs.exists()


def test_a_disabled_run_does_not_check_records(runs: Path) -> None:
    run = pr.init(environments=["gsm8k"], mode="disabled", on_error="raise")
    run.log_episodes([{"id": "e1", "prompt": "no traces list"}])  # not looked at
    run.finish()


# -- end to end: the local platform -------------------------------------------------


@pytest.fixture
def platform(
    tmp_path: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalPlatform]:
    with LocalPlatform(tmp_path / "platform") as local:
        monkeypatch.setenv("PRIME_API_KEY", "any-key")
        monkeypatch.setenv("PRIME_API_BASE_URL", local.url)
        monkeypatch.setenv("PRIME_TRACES_URL", local.url)
        monkeypatch.setenv("PRIME_RUNS_DIR", str(runs))
        yield local


def test_against_the_local_platform_a_run_lands_once_and_is_read_back_from_it(
    platform: LocalPlatform,
) -> None:
    episodes = workloads.gsm8k(20)
    run = evaluate(episodes)
    assert run.mode == "online" and run.url is not None
    assert run.url.startswith(platform.url)  # its page on the local dashboard
    assert run.failed_records == {} and run.errors == []
    stored = platform.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert stored["samples"]["rows"] == stored["samples"]["distinct"] == 20
    assert stored["traces"]["episodes"] == stored["traces"]["distinct_episodes"] == 20
    summary = {k: v for k, v in stored["summary"].items() if k != "prime_runs"}  # the SDK's own
    assert summary == pr.metrics.from_episodes(episodes)


def test_a_flaky_local_platform_rehearses_retries_and_still_stores_each_record_once(
    platform: LocalPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_RUNS_RETRY_BASE_S", "0.02")  # short back-off for a test
    platform.set_faults(retryable_rate=0.3, ambiguous_rate=0.1, seed=7)
    run = train(10)
    stored = platform.run(run.id)
    assert platform.set_faults(retryable_rate=0.0, ambiguous_rate=0.0)["injected"] > 0
    assert stored["status"] == "COMPLETED"
    assert stored["train_metrics"] == {"rows": 10, "steps": 10}


def test_primeruns_serve_and_environment_variables_need_no_change_to_the_code(
    tmp_path: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = procs.start(
        [
            sys.executable,
            "-m",
            "primeruns",
            "serve",
            "--data",
            str(tmp_path / "data"),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert server.stdout is not None
    line = server.stdout.readline()  # "primeruns serve: listening on http://127.0.0.1:PORT"
    url = line.rsplit(" ", 1)[-1].strip()
    assert url.startswith("http://127.0.0.1:"), line
    for name, value in {
        "PRIME_API_KEY": "any-key",
        "PRIME_API_BASE_URL": url,
        "PRIME_TRACES_URL": url,
        "PRIME_RUNS_DIR": str(runs),
    }.items():
        monkeypatch.setenv(name, value)
    run = evaluate(workloads.gsm8k(4))
    stored = httpx.get(f"{url}/_local/runs/{run.id}", timeout=10).json()
    assert stored["status"] == "COMPLETED" and stored["samples"]["rows"] == 4
    server.terminate()
    assert server.wait(timeout=30) == 0


# -- what an HTTP mock in the test process sees -----------------------------------------

_REGISTRATION = {"POST /api/v1/environmentshub/resolve", "POST /api/v1/evaluations/"}
_UPLOADS = ("/traces", "/samples", "/finalize")


def _uploads(seen: list[str]) -> set[str]:
    """Which of an evaluation's uploads (its traces, its sample rows, its
    close-out) passed through this process."""
    return {kind for kind in _UPLOADS if any(s.endswith(kind) for s in seen)}


def test_an_http_mock_in_the_test_process_sees_the_uploads_only_of_a_run_shipped_from_it(
    platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    handle = httpx.HTTPTransport.handle_request

    def spy(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        return handle(self, request)

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", spy)

    # An evaluation ships from threads of this process until its uplink
    # process has started (ship.startup), then from that process: once it
    # took over (waited for here), none of the run's uploads pass through
    # this process, nor its close-out.
    run = pr.init(name="gsm8k-nightly", environments=["gsm8k"], model="m")
    assert set(seen) >= _REGISTRATION
    assert run._supervisor is not None
    wait_for(run._supervisor.uplink.begun, timeout=60, what="the uplink process to take over")  # type: ignore[attr-defined]
    seen.clear()
    run.log_episodes(workloads.gsm8k(3))
    assert run.flush(timeout=60)
    run.finish()
    assert platform.run(run.id)["samples"]["rows"] == 3
    assert _uploads(seen) == set()

    seen.clear()
    # A run over before its uplink process started (held in its start-up
    # here; a test's small run often is) is shipped from this process,
    # while finish() waits: every upload passes through it.
    gate = held_uplink_starts(monkeypatch, tmp_path)
    try:
        run = pr.init(name="gsm8k-nightly", environments=["gsm8k"], model="m")
        run.log_episodes(workloads.gsm8k(3))
        run.finish(timeout=30)
    finally:
        gate.touch()
    assert platform.run(run.id)["samples"]["rows"] == 3
    assert set(seen) >= _REGISTRATION
    assert _uploads(seen) == set(_UPLOADS)

    # Shipping from threads of this process: every upload passes through it.
    seen.clear()
    monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")
    run = evaluate(workloads.gsm8k(3))
    assert platform.run(run.id)["samples"]["rows"] == 3
    assert _uploads(seen) == set(_UPLOADS)
