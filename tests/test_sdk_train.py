"""Training runs end to end: metrics rows, the step-keyed Parquet sample table,
Prime Traces, and restarts, against the local platform over loopback HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import module_platform
import procs
import pyarrow.parquet as pq
import pytest
import workloads
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.local.objects import object_path
from primeruns.ship import ledger

# The runs of these tests are told apart by id: one server serves them all.
_server, local_platform = module_platform.fixtures(train_teams=["team-a"])

VENDOR_COLUMNS = {
    "run_id": "string",
    "step": "int64",
    "tag": "string",
    "problem_id": "int64",
    "sample_id": "int64",
    "prompt": "string",
    "completion": "string",
    "trajectory": "string",
    "answer": "string",
    "env_name": "string",
    "task": "string",
    "info": "string",
    "reward": "double",
    "advantage": "double",
    "metrics": "string",
    "timing": "string",
    "num_input_tokens": "int64",
    "num_output_tokens": "int64",
    "created_at": "timestamp[us, tz=UTC]",
}


def _by_step(per_step: int) -> dict[int, list[dict[str, Any]]]:
    return workloads.agentic_by_step(per_step)


def _train(lp: Any, runs: Path, steps: dict[int, list[dict[str, Any]]], **kw: Any) -> pr.Run:
    run = pr.init(
        kind="train",
        model="Qwen/Qwen3-8B",
        environments=["swe-lite"],
        team_id="team-a",
        training=pr.TrainingSpec(max_steps=30, batch_size=8),
        api_key=API_KEY,
        base_url=lp.url,
        runs_dir=runs,
        **kw,
    )
    for step in sorted(steps):
        run.log_episodes(steps[step])
        run.log_metrics({"loss": 1.0 / (step + 1), "reward": 0.1 * step}, step=step)
    run.finish(timeout=180)
    return run


def _check_run(lp: Any, run: pr.Run, steps: dict[int, list[dict[str, Any]]]) -> None:
    stored = lp.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert stored["train_metrics"] == {"rows": 30, "steps": 30}
    episodes = sum(len(v) for v in steps.values())
    assert stored["traces"]["episodes"] == stored["traces"]["distinct_episodes"] == episodes
    objects = sorted(stored["parquet_objects"], key=lambda o: o["step"])
    assert [(o["step"], o["rows"]) for o in objects] == [(0, 8), (10, 8), (20, 8)]
    for obj in objects:
        table = pq.read_table(object_path(lp.data_dir / "objects", obj["key"]))
        assert {f.name: str(f.type) for f in table.schema} == VENDOR_COLUMNS
        assert set(table.column("step").to_pylist()) == {obj["step"]}
        assert table.column("run_id").to_pylist() == [run.id] * 8
        assert table.column("sample_id").to_pylist() == list(range(8))


def test_training_run_lands_metrics_samples_and_traces(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    steps = _by_step(8)
    run = _train(lp, runs, steps)
    assert run.status is pr.RunStatus.COMPLETED
    assert run.dropped_records == 0 and run.failed_records == {}
    _check_run(lp, run, steps)


def test_training_run_under_faults_gives_the_same_result(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = local_platform
    lp.set_faults(retryable_rate=0.3, ambiguous_rate=0.1, seed=11)
    runs = point_at(monkeypatch, tmp_path, lp.url)
    steps = _by_step(8)
    run = _train(lp, runs, steps)
    lp.set_faults(retryable_rate=0.0, ambiguous_rate=0.0)
    assert run.dropped_records == 0 and run.failed_records == {}
    _check_run(lp, run, steps)


def test_team_outside_the_allowlist_is_forbidden_at_init(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    with pytest.raises(pr.ForbiddenError):
        pr.init(
            kind="train",
            model="m",
            team_id="team-b",
            api_key=API_KEY,
            base_url=lp.url,
            runs_dir=runs,
        )
    with pytest.raises(pr.ConfigurationError, match="team"):
        pr.init(kind="train", model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs)


def test_run_killed_at_step_15_and_restarted_with_its_id_lands_exactly_once(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import subprocess
    import sys

    import httpx

    lp = local_platform
    lp.set_faults(latency_ms=20)
    runs = point_at(monkeypatch, tmp_path, lp.url)
    created = httpx.post(  # the launcher registers the run
        f"{lp.url}/api/v1/rft/external-runs",
        json={"base_model": "m", "max_steps": 30, "environments": [], "team_id": "team-a"},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    run_id = created.json()["run"]["id"]
    script = Path(__file__).resolve().parent / "train_producer.py"
    proc = procs.start(
        [sys.executable, str(script), str(runs), lp.url, run_id, "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert proc.stdout is not None
    last = -1
    while last < 15:
        line = proc.stdout.readline()
        assert line.startswith("step "), line
        last = int(line.split()[1])
    procs.kill_job(proc)  # the job dies, uplink and all
    rest = proc.stdout.read()  # through the buffered reader: communicate() would
    proc.stdout.close()  # read the raw pipe and skip what readline() buffered
    proc.wait(timeout=30)
    for line in rest.splitlines():
        if line.startswith("step "):
            last = int(line.split()[1])
    # The requeued job (same run id) resumes where the killed one's journal
    # ends: the kill may land between a step's two calls, or between a call's
    # return and its print, and a record logged twice is the producer's duplicate.
    import json

    from primeruns.journal import EntryKind, Journal, list_journals

    (first,) = list_journals(runs)
    journal = Journal.open(first.path, owner=False)
    try:
        episodes = journal.read(0, kinds={EntryKind.EPISODE}, max_entries=10**6, max_bytes=1 << 34)
        metrics = journal.read(0, kinds={EntryKind.METRICS}, max_entries=10**6, max_bytes=1 << 34)
    finally:
        journal.close()
    assert len(episodes.entries) % 8 == 0  # one call per step: all of a step or none
    next_episodes = len(episodes.entries) // 8
    next_metrics = max((json.loads(e.payload)["step"] for e in metrics.entries), default=-1) + 1
    assert min(next_episodes, next_metrics) >= 16
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            str(runs),
            lp.url,
            run_id,
            str(next_episodes),
            str(next_metrics),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    stored = lp.run(run_id)
    assert stored["status"] == "COMPLETED"
    assert stored["train_metrics"] == {"rows": 30, "steps": 30}, done.stderr[-3000:]
    assert stored["traces"]["episodes"] == stored["traces"]["distinct_episodes"] == 240
    objects = sorted((o["step"], o["rows"]) for o in stored["parquet_objects"])
    assert objects == [(0, 8), (10, 8), (20, 8)]
    journals = list_journals(runs)
    assert len(journals) == 2
    # The requeued process took over its predecessor's journal and shipped it
    # (told apart by path: two journals made in the same second sort by the
    # random part of their ids).
    assert {j.path: bool(j.meta.get("continued_by")) for j in journals} == {
        j.path: j.path == first.path for j in journals
    }


def test_a_paused_sink_resumes_after_its_pause_and_ships_its_backlog(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sdk_helpers import wait_for

    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    monkeypatch.setenv("PRIME_RUNS_PAUSE_S", "2")
    run = pr.init(
        kind="train",
        model="m",
        team_id="team-a",
        api_key=API_KEY,
        base_url=lp.url,
        runs_dir=runs,
    )
    lp.set_faults(retryable_rate=1.0)
    for step in range(5):
        run.log_metrics({"loss": float(step)}, step=step)
    journal = run._recorder.journal
    assert journal is not None

    def paused() -> bool:
        return ledger.read_standing(journal, "train_metrics").paused

    wait_for(paused, timeout=60, what="the metrics sink to pause")
    assert not run.flush(timeout=5)  # paused: flush says so at once, it does not hang
    lp.set_faults(retryable_rate=0.0)
    # Nobody calls flush or finish: the paused sink resumes on its own.
    wait_for(lambda: lp.run(run.id)["train_metrics"]["rows"] == 5, timeout=60, what="the backlog")
    run.finish(timeout=60)
    assert lp.run(run.id)["status"] == "COMPLETED"


def test_a_step_beyond_64_bits_holds_back_no_metrics_row_after_it(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 2**63 was journaled; the uplink's step table raised OverflowError
    on it at each attempt, and no metrics row logged after it ever shipped
    (flush timed out, finish left them in the journal)."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    run = pr.init(
        kind="train", model="m", team_id="team-a", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    run.log_metrics({"loss": 0.5}, step=1)
    run.log_metrics({"loss": 1.0}, step=2**63)  # never raises
    run.log_metrics({"loss": 0.25}, step=2)
    assert run.flush(timeout=120)
    run.finish(timeout=120)
    assert lp.run(run.id)["train_metrics"] == {"rows": 2, "steps": 2}
    assert run.failed_records == {"encode": 1}
    assert "step" in run.errors[0] and "2**63 - 1" in run.errors[0]


def test_internal_rft_root_attaches_with_the_key_as_x_api_key(
    make_local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    lp = make_local_platform(api_key=API_KEY, train_teams=["team-a"])
    runs = point_at(monkeypatch, tmp_path, lp.url)
    created = httpx.post(  # a hosted run's launcher registers it on the public API
        f"{lp.url}/api/v1/rft/external-runs",
        json={"base_model": "m", "max_steps": 2, "environments": [], "team_id": "team-a"},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    run_id = created.json()["run"]["id"]
    run = pr.init(
        kind="train",
        id=run_id,
        api_key=API_KEY,
        base_url=f"{lp.url}/api/internal/rft",  # what $PRIME_API_BASE holds
        runs_dir=runs,
        traces_opt_out=True,
    )
    assert run.attached and run.id == run_id
    run.log_metrics({"loss": 0.5}, step=0)
    run.log_metrics({"loss": 0.25}, step=1)
    run.finish(timeout=60)
    assert run.failed_records == {} and run.errors == []
    stored = lp.run(run_id)
    assert stored["train_metrics"] == {"rows": 2, "steps": 2}
    assert stored["status"] == "COMPLETED"


def test_the_training_reads_of_the_prime_cli_answer_from_what_was_stored(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`prime train list/get/rollouts/progress/distributions/logs/checkpoints`
    read these routes; each answers from the run the SDK stored (tools/compat/
    prime_cli.py drives the real CLI against them in CI)."""
    import httpx

    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    steps = _by_step(8)
    run = _train(lp, runs, steps)
    api = f"{lp.url}/api/v1/rft"
    with httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as client:

        def get(path: str, **params: Any) -> Any:
            response = client.get(f"{api}{path}", params=params)
            assert response.status_code == 200, (path, response.text)
            return response.json()

        listed = get("/runs", page=1, limit=1000)
        mine = [r for r in listed["runs"] if r["id"] == run.id]
        assert len(mine) == 1 and mine[0]["status"] == "COMPLETED" and mine[0]["userId"]
        assert listed["total"] >= 1 and listed["page"] == 1
        assert get(f"/runs/{run.id}")["run"]["userId"] == mine[0]["userId"]
        progress = get(f"/runs/{run.id}/progress")
        assert progress["latestStep"] == 29
        assert progress["stepsWithSamples"] == progress["stepsWithDistributions"] == [0, 10, 20]
        page = get(f"/runs/{run.id}/samples", step=10, page=2, limit=5)
        assert (page["total"], page["total_pages"]) == (8, 2)
        assert [s["sample_id"] for s in page["samples"]] == [5, 6, 7]
        assert {s["step"] for s in page["samples"]} == {10}
        rewards = get(f"/runs/{run.id}/distributions", type="rewards", step=10)
        assert rewards["step"] == 10 and sum(b["count"] for b in rewards["bins"]) == 8
        latest = get(f"/runs/{run.id}/distributions")
        assert latest["step"] == 20 and sum(b["count"] for b in latest["bins"]) == 8
        assert get(f"/runs/{run.id}/samples", step=3)["samples"] == []  # off the cadence
        assert get(f"/runs/{run.id}/logs") == {"logs": ""}
        assert get(f"/runs/{run.id}/checkpoints") == {"checkpoints": []}
        assert client.get(f"{api}/runs/rft_unknown/progress").status_code == 404
