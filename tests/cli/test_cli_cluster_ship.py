"""The cluster workflow: every ship from the command line goes through the
login node's sync journal, so that no journal or copy of it ships twice.

The same oracle as ``test_cli_cluster``: the platform holds one run, every
record the producer logged exactly once in every sink (Prime Traces, the
evaluation sample table, the training Parquet sample table, the metrics).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import workloads
from cli_helpers import cli, flip_entry_bytes
from sdk_helpers import API_KEY, point_at
from test_cli_cluster import EVAL_EPISODES, KINDS, Producer, _copy, _landed, _status, login

import primeruns as pr
from primeruns.settings import default_sync_root

__all__ = ["login"]  # the fixture, shared with test_cli_cluster


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["sync", "replay"])
def test_the_original_then_an_older_copy_of_it_ship_once(
    local_platform: Any,
    tmp_path: Path,
    login: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    command: str,
) -> None:
    lp = local_platform
    producer = Producer(tmp_path / "node", kind, lp.url, "-")
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)  # taken before anything shipped
    code, out, err = cli(capsys, command, str(producer.journal))
    assert code == 0, out + err
    assert _landed(lp, kind, "all")() is not None
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert _landed(lp, kind, "all")() is not None, "the copy shipped again"
    assert _status(lp) == "COMPLETED"


@pytest.mark.parametrize("kind", KINDS)
def test_a_deleted_sync_journal_is_refused_rather_than_shipping_twice(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    lp = local_platform
    producer = Producer(tmp_path / "node", kind, lp.url, "node-7")
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert _landed(lp, kind, "half")() is not None
    shutil.rmtree(default_sync_root() / copy.name)  # the user cleans up too much
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code != 0, out + err
    record = default_sync_root() / ".shipped" / f"{copy.name}.json"
    assert "would ship them twice" in out + err and str(record) in out + err, out + err
    assert _landed(lp, kind, "half")() is not None, "shipped twice"
    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(login))
    assert code != 0 and str(record) in out + err, out + err
    assert _landed(lp, kind, "half")() is not None, "shipped twice"


def test_replay_all_names_each_journal_it_skips_and_why(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    common = {"model": "m", "base_url": local_platform.url, "runs_dir": runs}
    offline = pr.init(environments=["gsm8k"], mode="offline", **common)
    offline.log_episodes(workloads.gsm8k(2))
    offline.finish()
    live = pr.init(environments=["gsm8k"], mode="offline", **common)  # still being written
    try:
        live.log_episodes(workloads.gsm8k(2))
        assert offline.journal_path is not None and live.journal_path is not None
        code, out, err = cli(capsys, "replay", "--all", "--runs-dir", str(runs))
        assert code == 0, out + err
        lines = {line.split(":", 1)[0]: line for line in err.splitlines()}
        assert "primeruns sync" in lines[offline.journal_path.name], err
        assert "still being written" in lines[live.journal_path.name], err
        code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(runs))
        assert code == 0, out + err
        lines = {line.split(":", 1)[0]: line for line in err.splitlines()}
        assert "still being written" in lines[live.journal_path.name], err
    finally:
        live.finish()
    assert len(local_platform.runs()) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_gc_prunes_sync_journals_of_closed_runs_and_their_copies_never_ship_twice(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    lp = local_platform
    producer = Producer(tmp_path / "node", kind, lp.url, "node-7")
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(copy))  # mid-run: left open
    assert code == 0, out + err
    code, out, err = cli(capsys, "gc", "--older-than", "0", "--runs-dir", str(login))
    assert code == 0, out + err
    assert (default_sync_root() / copy.name).is_dir(), "pruned while its run is open"
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(login))
    assert code == 0, out + err
    assert _landed(lp, kind, "all")() is not None and _status(lp) == "COMPLETED"
    copy = _copy(producer.journal, login)  # the copy is refreshed after gc, as rsync would
    code, out, err = cli(capsys, "gc", "--older-than", "0", "--runs-dir", str(tmp_path / "none"))
    assert code == 0, out + err
    assert not (default_sync_root() / copy.name).exists(), out + err
    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(login))
    assert code == 0, out + err
    assert "no offline runs or copies to sync" in out, out + err
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0 and "its sync journal was pruned" in out, out + err
    assert _landed(lp, kind, "all")() is not None and _status(lp) == "COMPLETED"


def _held(lp: Any) -> dict[str, int]:
    """What the platform's one run holds, per sink, each record once."""
    [run] = lp.runs()
    stored = lp.run(run["id"])
    traces = stored["traces"]
    assert traces["episodes"] == traces["distinct_episodes"], "an episode stored twice"
    held = {"episodes": traces["episodes"]}
    if run["kind"] == "eval":
        samples = stored["samples"]
        assert samples["rows"] == samples["distinct"], "a sample row stored twice"
        held["samples"] = samples["rows"]
    else:
        metrics = stored["train_metrics"]
        assert metrics["rows"] == metrics["steps"], "a metrics row stored twice"
        steps = [o["step"] for o in stored["parquet_objects"]]
        assert len(steps) == len(set(steps)), "a step's samples stored twice"
        held.update(metrics=metrics["rows"], parquet=len(steps))
    return held


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_copy_ships_its_intact_entries_and_reports_the_damage_once(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    lp = local_platform
    producer = Producer(tmp_path / "node", kind, lp.url, "-")
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    flip_entry_bytes(copy, 4)  # a page damaged on the way
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 4 and "damaged: 1 problem" in out and "entry 4" in out + err, out + err
    held = _held(lp)
    assert _status(lp) == "COMPLETED"
    assert 0 < held["episodes"] < (EVAL_EPISODES if kind == "eval" else 40)
    for _ in range(2):  # copied again, as rsync would, damaged the same way
        copy = _copy(producer.journal, login)
        flip_entry_bytes(copy, 4)
        code, out, err = cli(capsys, "sync", str(copy))
        assert code == 0 and "damaged" not in out + err, out + err
        assert _held(lp) == held, "shipped again"
    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(login))
    assert code == 0, out + err
    assert _held(lp) == held and _status(lp) == "COMPLETED"
