"""Ranks on several nodes, offline (issue #29): two ranks on node A and two on
node B log a training run attached by id with no route to the platform; their
journals are copied to a login node and ``primeruns sync``ed from there.

Every record lands once, the run is closed once, by the primary (rank 0),
after the other ranks' records landed, and each step's metrics row on the
platform holds the keys of all four ranks: the rows two nodes logged for one
step are merged where they are synced (README, "Ranks").
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import procs
import pyarrow.parquet as pq
import pytest
import rel_helpers as rh
from sdk_helpers import API_KEY, closed_after_every_record, point_at, wait_for

from primeruns.cli import main
from primeruns.local import LocalPlatform
from primeruns.local.objects import object_path

_STEPS = 11  # Parquet sample rows at steps 0 and 10
_PER_STEP = 2  # episodes a rank logs per step (rel_rank.episodes_of)
_NODES = {"node-a": [0, 1], "node-b": [2, 3]}
_SCRIPT = rh.HERE / "rel_node_rank.py"


def _create(lp: LocalPlatform) -> str:
    """The training run, created as a launcher does before it starts the ranks."""
    body = {"base_model": "m", "max_steps": 100, "environments": [], "team_id": "team"}
    made = httpx.post(
        f"{lp.url}/api/v1/rft/external-runs",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=10,
    )
    return str(made.json()["run"]["id"])


def _run_ranks(lp: LocalPlatform, tmp: Path, run_id: str) -> dict[int, tuple[Path, list[str]]]:
    """Every rank run to its end on its node: its journal and its episodes' ids."""
    started = []
    for host, ranks in _NODES.items():
        for rank in ranks:
            env = rh.isolated_env(tmp / host, {"RANK": str(rank)})
            args = [str(tmp / host / "runs"), lp.url, run_id, str(rank), str(_STEPS), host]
            proc = procs.start(
                [sys.executable, str(_SCRIPT), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            started.append((rank, proc))
    out = {}
    for rank, proc in started:
        said, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        lines = [line.partition(" ")[::2] for line in said.splitlines()]
        assert lines[-1] == ("finished", ""), said
        journal = Path(next(value for word, value in lines if word == "journal"))
        out[rank] = (journal, [value for word, value in lines if word == "episode"])
    return out


def _ranks_copied_to_login(
    lp: LocalPlatform,
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: Callable[[int, str], str] = lambda rank, name: name,
) -> tuple[str, dict[int, tuple[Path, list[str]]], Path]:
    """The ranks of a run created on the platform, run on offline nodes, their
    journals copied to a login node's folder (named by ``name``): the run's
    id, the ranks, the login node's folder."""
    point_at(monkeypatch, tmp, lp.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    run_id = _create(lp)
    ranks = _run_ranks(lp, tmp, run_id)
    login = tmp / "login"
    login.mkdir()
    for rank, (journal, _) in ranks.items():
        shutil.copytree(journal, login / name(rank, journal.name))
    return run_id, ranks, login


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``primeruns ARGV`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _metric_rows(lp: LocalPlatform, run_id: str) -> list[dict[str, Any]]:
    rows = httpx.get(
        f"{lp.url}/api/v1/rft/runs/{run_id}/metrics",
        params={"limit": 1000},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=10,
    ).json()["metrics"]
    return list(rows)


def test_ranks_on_two_offline_nodes_synced_from_a_login_node_keep_every_key(
    local_platform: LocalPlatform,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lp = local_platform
    run_id, ranks, login = _ranks_copied_to_login(lp, tmp_path, monkeypatch)

    code, out, err = cli(capsys, "ls", "--runs-dir", str(login), "--json")
    listed = json.loads(out)
    assert [row["run_of"] for row in listed].count(None) == 1  # one run, four journals
    assert listed[0]["local_id"] == ranks[0][0].name  # the primary heads it

    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(login), "--json")
    assert code == 0, out + err
    shipped = json.loads(out)
    # The primary last: its close-out closes the run, after the others' records landed.
    assert [r["local_id"] for r in shipped][-1] == ranks[0][0].name

    stored: dict[str, Any] = lp.run(run_id)
    assert stored["status"] == "COMPLETED"
    assert closed_after_every_record(lp.data_dir, run_id)
    episodes = [e for _, logged in ranks.values() for e in logged]
    assert len(episodes) == 4 * _STEPS * _PER_STEP
    traces = stored["traces"]
    assert traces["episodes"] == traces["distinct_episodes"] == len(episodes)
    ids_by_step: dict[int, list[int]] = {}
    for obj in stored["parquet_objects"]:
        table = pq.read_table(object_path(lp.data_dir / "objects", obj["key"]))
        ids_by_step.setdefault(obj["step"], []).extend(table.column("sample_id").to_pylist())
    assert sorted(ids_by_step) == [0, 10]
    assert all(len(ids) == len(set(ids)) == 4 * _PER_STEP for ids in ids_by_step.values())

    rows = _metric_rows(lp, run_id)
    assert sorted(row["step"] for row in rows) == list(range(_STEPS))
    wanted = {"lr", *(f"loss_r{rank}" for rank in range(4))}
    for row in rows:
        assert wanted <= set(row), row  # no rank's key lost, across the nodes
        assert not any("@" in key for key in row), row  # "lr": one value, kept once

    # Synced again: nothing new, nothing sent twice.
    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(login))
    assert code == 0, out + err
    again: dict[str, Any] = lp.run(run_id)
    assert again["traces"] == traces
    assert len(again["parquet_objects"]) == len(stored["parquet_objects"])


def test_ranks_named_on_the_command_line_close_the_run_after_every_ranks_records(
    local_platform: LocalPlatform,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``sync`` of the ranks' copies named one by one (a shell's glob, in any
    order, the primary first here) ships the primary last, as ``--all`` does:
    its close-out closes the run, after every rank's records landed."""
    lp = local_platform
    run_id, ranks, login = _ranks_copied_to_login(lp, tmp_path, monkeypatch)

    named = [str(login / ranks[rank][0].name) for rank in sorted(ranks)]  # rank 0 first
    code, out, err = cli(capsys, "sync", "--json", *named)
    assert code == 0, out + err
    assert all(r["closed_out"] for r in json.loads(out))

    stored: dict[str, Any] = lp.run(run_id)
    assert stored["status"] == "COMPLETED"
    assert closed_after_every_record(lp.data_dir, run_id)
    episodes = [e for _, logged in ranks.values() for e in logged]
    traces = stored["traces"]
    assert traces["episodes"] == traces["distinct_episodes"] == len(episodes)


def test_a_watching_sync_closes_the_run_after_every_ranks_records(
    local_platform: LocalPlatform,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``sync --watch`` over the ranks' copies ships the primary's last, as
    ``--all`` does, whatever the copies' names sort as (the primary's first
    here): its close-out closes the run after every rank's records landed."""
    lp = local_platform
    # rsync'd under names of the user's: the primary's sorts first.
    run_id, ranks, login = _ranks_copied_to_login(
        lp, tmp_path, monkeypatch, name=lambda rank, name: f"{'a' if rank == 0 else 'b'}-{name}"
    )
    episodes = [e for _, logged in ranks.values() for e in logged]
    argv = ["sync", "--watch", "--interval", "0.2", "--runs-dir", str(login)]
    watcher = procs.start(
        [sys.executable, "-m", "primeruns", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ),
    )
    try:

        def closed_with_everything() -> bool:
            stored = lp.run(run_id)
            return bool(
                stored["status"] == "COMPLETED"
                and stored["traces"]["episodes"] == len(episodes)
                and stored["train_metrics"]["steps"] == _STEPS
            )

        wait_for(closed_with_everything, timeout=120, what="the watcher to ship every rank")
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.wait(timeout=90)
    assert closed_after_every_record(lp.data_dir, run_id)
    traces = lp.run(run_id)["traces"]
    assert traces["episodes"] == traces["distinct_episodes"] == len(episodes)
