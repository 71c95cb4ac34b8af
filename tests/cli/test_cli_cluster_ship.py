"""The cluster workflow: every ship from the command line goes through the
login node's sync journal, so that no journal or copy of it ships twice.

The same oracle as ``test_cli_cluster``: the platform holds one run, every
record the producer logged exactly once in every sink (Prime Traces, the
evaluation sample table, the training Parquet sample table, the metrics).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import procs
import pytest
import workloads
from cli_helpers import cli, flip_entry_bytes, offline_copy, write_entry_corrupt
from sdk_helpers import API_KEY, point_at
from test_cli_cluster import EVAL_EPISODES, KINDS, Producer, _copy, _landed, _status, login

import primeruns as pr
from primeruns import ranks
from primeruns.journal import EntryKind, Journal
from primeruns.settings import default_sync_root
from primeruns.ship import backlog, lifecycle
from primeruns.ship.workfolders import PREFIXES

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


def _synced_whole(lp: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """An evaluation's copy, synced to its end and its run closed: the copy."""
    producer = Producer(tmp_path / "node", "eval", lp.url, "node-7")
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0 and _status(lp) == "COMPLETED", out + err
    return copy


def test_a_copy_synced_again_once_its_sync_journal_was_deleted_says_why_nothing_is_sent(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy synced to its end, its run closed; the user deletes its sync
    journal by hand and syncs the copy again. Its record says the run was
    closed with all of it shipped, so nothing is sent, but the sync said
    "done: nothing was left to ship (0 bytes); run closed out as already
    closed (its sync journal was pruned)": nothing pruned it, and nothing
    was closed out. It says the sync journal is gone and nothing is sent."""
    lp = local_platform
    copy = _synced_whole(lp, tmp_path, login, capsys)
    sync = default_sync_root() / copy.name
    shutil.rmtree(sync)  # the user cleans up
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    said = " ".join(out.split())
    assert f"nothing sent: its sync journal ({sync}) is gone" in said, out
    assert "nothing is sent again" in said, out
    assert "pruned" not in said and "0 bytes" not in said, out
    assert _landed(lp, "eval", "all")() is not None


def test_a_sync_journal_deleted_with_records_left_says_how_to_sync_the_copy_anew(
    local_platform: Any,
    tmp_path: Path,
    login: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Prime Traces is down: a copy's sync closes its run with the traces
    left; the user deletes the sync journal by hand. A sync of the copy is
    refused (which records the platform holds went with it), and offered
    only a restore from a backup. It also names the way on with the copy
    still here, which loses nothing: its record deleted, the copy, an
    offline run's bound to no run, ships into a new run, every record once."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "node-7")
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    monkeypatch.setenv("PRIME_RUNS_STALL_S", "2")  # a sink down gives up in 2 s
    lp.set_faults(retryable_rate=1.0, statuses=[503], routes=["/api/v1/traces"])
    try:
        code, out, err = cli(capsys, "sync", "--timeout", "5", str(copy))
    finally:
        lp.set_faults(retryable_rate=0.0, statuses=[503, 502, 429], routes=[])
    assert code != 0 and "still pending traces" in out, out + err
    [first] = lp.runs()
    shutil.rmtree(default_sync_root() / copy.name)
    code, out, err = cli(capsys, "sync", str(copy))
    said = " ".join((out + err).split())
    record = default_sync_root() / ".shipped" / f"{copy.name}.json"
    assert code != 0 and "records left to ship (traces:" in said, said
    assert f"delete {record} and run `primeruns sync` of it" in said, said
    assert "into a new platform run if the journal is bound to none" in said, said
    record.unlink()
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    [again] = [run for run in lp.runs() if run["id"] != first["id"]]
    stored = lp.run(again["id"])
    traces, samples = stored["traces"], stored["samples"]
    assert traces["episodes"] == traces["distinct_episodes"] == EVAL_EPISODES, stored
    assert samples["rows"] == samples["distinct"] == EVAL_EPISODES, stored


def test_a_sync_pass_over_a_copy_that_brought_nothing_leaves_its_record_as_it_is(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each sync pass wrote the record of a copy's sync journal twice (it
    ships, then what it left) though the copy brought nothing and the run
    was closed: a ``sync --watch`` over thousands of copies rewrote
    thousands of files every pass. A pass with nothing to ship writes none."""
    lp = local_platform
    copy = _synced_whole(lp, tmp_path, login, capsys)
    record = default_sync_root() / ".shipped" / f"{copy.name}.json"
    written = os.stat(record)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    again = os.stat(record)
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    said = json.loads(record.read_text())
    assert (said["closed"], said["left"]) == (True, {}), said


def _closed_then_cut_short(
    copy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[list[str], tuple[int, str, str]]:
    """A sync of ``copy`` that ships every record and closes the run, then is
    interrupted before it records so (its record says it was shipping): the
    path of every finalize sent from now on (the list grows), and what the
    sync said."""
    finalizes: list[str] = []
    send = lifecycle.Lifecycle._send

    def counted(self: Any, method: str, path: str, body: Any, **kwargs: Any) -> Any:
        if path.endswith("/finalize"):
            finalizes.append(path)
        return send(self, method, path, body, **kwargs)

    monkeypatch.setattr(lifecycle.Lifecycle, "_send", counted)
    remember = backlog._remember

    def cut_short(journal: Any, report: Any, root: Any, *, shipped: Any = None) -> None:
        if shipped:  # the pass is over, its run closed: the sync is killed here
            raise KeyboardInterrupt
        remember(journal, report, root, shipped=shipped)

    with monkeypatch.context() as patched:
        patched.setattr(backlog, "_remember", cut_short)
        said = cli(capsys, "sync", str(copy))
    return finalizes, said


def test_a_copy_synced_anew_into_a_new_run_never_adopts_the_run_its_gone_sync_journal_closed(
    local_platform: Any,
    tmp_path: Path,
    login: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An offline evaluation's copy, synced whole and its run closed, the sync
    cut short before it recorded so; its sync journal deleted by hand. The
    refusal offers to delete the record and sync it anew into a new run, and
    the user does; that sync's create is answered 504 (never passed on). Its
    lookup by the run's token (the journal's local id) found the first run,
    closed, and adopted it: every record shipped into it a second time and it
    was finalized twice. It now makes the new run it said, each record once."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "node-7")
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    finalizes, (code, out, err) = _closed_then_cut_short(copy, monkeypatch, capsys)
    [first] = lp.runs()
    assert code != 0 and finalizes == [f"/evaluations/{first['id']}/finalize"], out + err
    shutil.rmtree(default_sync_root() / copy.name)  # deleted by hand
    code, out, err = cli(capsys, "sync", str(copy))
    said = " ".join((out + err).split())
    record = default_sync_root() / ".shipped" / f"{copy.name}.json"
    assert code != 0 and f"delete {record} and run `primeruns sync` of it" in said, said
    record.unlink()  # followed as offered
    lp.set_faults(retryable_rate=1.0, max_faults=1, statuses=[504], routes=["/api/v1/evaluations/"])
    try:
        code, out, err = cli(capsys, "sync", str(copy))
    finally:
        lp.set_faults(retryable_rate=0.0, statuses=[503, 502, 429], routes=[])
    assert code == 0, out + err
    assert lp.run(first["id"])["samples"]["rows"] == EVAL_EPISODES, lp.run(first["id"])
    [again] = [run for run in lp.runs() if run["id"] != first["id"]]
    samples = lp.run(again["id"])["samples"]
    assert samples["rows"] == samples["distinct"] == EVAL_EPISODES, samples
    assert finalizes == [f"/evaluations/{r}/finalize" for r in (first["id"], again["id"])]


# argv: runs dir, base url, the evaluation's id. An offline evaluation
# attached to a run its launcher registered: it logs 12 episodes and finishes.
_ATTACHED_EVAL = """
import sys
import workloads
import primeruns as pr
runs, url, run_id = sys.argv[1:4]
run = pr.init(id=run_id, model="m", api_key="test-key-0123456789", base_url=url,
              runs_dir=runs, mode="offline")
run.log_episodes(workloads.gsm8k(12))
run.finish(timeout=30)
print(run.journal_path, flush=True)
"""


def test_a_sync_journal_gone_after_it_closed_an_attached_run_is_not_synced_anew_into_it(
    local_platform: Any,
    tmp_path: Path,
    login: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An offline evaluation attached by id to a run its launcher made: a
    sync of its copy ships every record and closes the run, and is cut short
    before it records so (its record says it was shipping). The sync journal
    deleted by hand, a sync is refused. What the refusal offers must not close
    the run a second time (an evaluation's finalize is sent once): it offered
    to delete the record and sync the copy anew, into the same run, whose new
    sync journal finalized it again."""
    lp = local_platform
    created = httpx.post(  # the launcher registers the run
        f"{lp.url}/api/v1/evaluations/",
        json={"name": "attached", "environments": [{"id": "gsm8k"}]},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    run_id = created.json()["evaluation_id"]
    made = subprocess.run(
        [sys.executable, "-c", _ATTACHED_EVAL, str(tmp_path / "node"), lp.url, run_id],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    copy = _copy(Path(made.stdout.strip()), login)
    finalizes, (code, out, err) = _closed_then_cut_short(copy, monkeypatch, capsys)
    assert code != 0 and finalizes == [f"/evaluations/{run_id}/finalize"], out + err
    assert _status(lp) == "COMPLETED"
    shutil.rmtree(default_sync_root() / copy.name)  # deleted by hand
    code, out, err = cli(capsys, "sync", str(copy))
    said = " ".join((out + err).split())
    record = default_sync_root() / ".shipped" / f"{copy.name}.json"
    assert code != 0 and f"Restore {default_sync_root() / copy.name}" in said, said
    if f"delete {record} and run `primeruns sync` of it" in said:
        record.unlink()  # followed as offered
        code, out, err = cli(capsys, "sync", str(copy))
    assert finalizes == [f"/evaluations/{run_id}/finalize"], out + err


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


#: Damage a page took on the way (its checksum fails), and a frame written
#: corrupt (its checksum holds; only decompressing it finds the damage, which
#: the look for a final copy's damage, made from checksums, leaves to the import).
DAMAGE: dict[str, Callable[[Path, int], None]] = {
    "flipped": flip_entry_bytes,
    "written-corrupt": write_entry_corrupt,
}


#: Each kind's entry 4 damaged on the way, or written corrupt (a training
#: run's entry 4 is too small to be compressed: nothing to write corrupt).
DAMAGED_AT_4 = [*((kind, "flipped") for kind in KINDS), ("eval", "written-corrupt")]


@pytest.mark.parametrize(("kind", "damage"), DAMAGED_AT_4)
@pytest.mark.parametrize("original", ["elsewhere", "damaged here"])
def test_a_damaged_copy_ships_its_intact_entries_and_reports_the_damage_once(
    local_platform: Any,
    tmp_path: Path,
    login: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    damage: str,
    original: str,
) -> None:
    """Entry 4 is to be had intact nowhere here: the copy's original is on
    another node (its job ended), or on this one damaged the same way. It is
    lost, counted once however often the copy comes again damaged so."""
    lp = local_platform
    damaged = DAMAGE[damage]
    here = original == "damaged here"
    producer = Producer(tmp_path / "node", kind, lp.url, "-" if here else "node-7")
    producer.log_the_rest()
    producer.finish()
    if here:
        damaged(producer.journal, 4)  # every copy takes it so
    ended = [] if here else ["--job-ended"]

    def damaged_copy() -> Path:
        copy = _copy(producer.journal, login)
        if not here:
            damaged(copy, 4)  # a page damaged on the way
        return copy

    code, out, err = cli(capsys, "sync", *ended, "--json", str(damaged_copy()))
    [first] = json.loads(out)
    assert code == 4 and first["damage"] and "entry 4" in first["damage"][0], out + err
    lost = {sink: loss["count"] for sink, loss in first["losses"].items()}
    assert lost and set(lost.values()) == {1}, out + err  # what entry 4 was, per sink
    held = _held(lp)
    assert _status(lp) == "COMPLETED"
    for _ in range(2):  # copied again, as rsync would, damaged the same way
        code, out, err = cli(capsys, "sync", *ended, "--json", str(damaged_copy()))
        [again] = json.loads(out)
        assert code == 0 and not again["damage"], out + err
        assert {sink: loss["count"] for sink, loss in again["losses"].items()} == lost
        assert _held(lp) == held, "shipped again"
    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(login))
    assert code == 0, out + err
    assert _held(lp) == held and _status(lp) == "COMPLETED"


@pytest.mark.parametrize(("kind", "damage"), DAMAGED_AT_4)
@pytest.mark.parametrize("then", ["the original", "a fresh copy"])
def test_a_copy_damaged_at_an_entry_its_original_here_holds_intact_is_not_final(
    local_platform: Any,
    tmp_path: Path,
    login: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    damage: str,
    then: str,
) -> None:
    """A bit flipped in transfer: the copy holds entry 4 damaged, while its
    original on this host (its producer gone) holds it intact. It was
    counted lost for every sink and the run closed, though the user had
    the record right there. As for an entry the copy lacks, the copy is
    not final: nothing is counted lost, the run is left open naming the
    original, and the original or a fresh copy, synced after, delivers
    every record exactly once."""
    lp = local_platform
    producer = Producer(tmp_path / "node", kind, lp.url, "-")
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    DAMAGE[damage](copy, 4)
    code, out, err = cli(capsys, "sync", "--json", str(copy))
    [report] = json.loads(out)
    assert not report["losses"], out + err
    why = report["left_open"] or ""
    assert "entry 4" in why and str(producer.journal) in why, out + err
    assert _status(lp) == "RUNNING", out + err
    later = producer.journal if then == "the original" else _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", "--json", str(later))
    [report] = json.loads(out)
    assert code == 0 and not report["losses"] and not report["damage"], out + err
    assert _landed(lp, kind, "all")() is not None
    assert _status(lp) == "COMPLETED"


def _requeued_by_run_id(lp: Any, tmp_path: Path, login: Path) -> tuple[str, Path]:
    """A training job killed offline on its node, its journal copied beside
    the requeued job twice, and the requeued job run to its end attached by
    id: (the run id, the killed job's journal on its node)."""
    run_id, journal, _ = _requeue(lp, tmp_path, login)
    return run_id, journal


def _requeue(
    lp: Any, tmp_path: Path, login: Path, copied: Callable[[Path], object] = lambda _: None
) -> tuple[str, Path, str]:
    """As ``_requeued_by_run_id``, with what the requeued job wrote to stderr;
    ``copied`` is called with the first copy before the requeued job starts."""
    created = httpx.post(  # the launcher registers the run
        f"{lp.url}/api/v1/rft/external-runs",
        json={"base_model": "m", "max_steps": 30, "environments": [], "team_id": "team-a"},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    run_id = created.json()["run"]["id"]
    script = str(Path(__file__).resolve().parents[1] / "train_producer.py")
    first = procs.start(  # the first allocation's node has no route: offline
        [sys.executable, script, str(tmp_path / "node-a"), lp.url, run_id, "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PRIME_RUNS_MODE="offline"),
    )
    assert first.stdout is not None
    while first.stdout.readline().split() != ["step", "14"]:
        pass
    first.kill()  # preempted
    first.wait(timeout=30)
    # The runs dir's own folders (.steps, .primary, .summaries) are not runs.
    [journal] = [p for p in (tmp_path / "node-a").iterdir() if not p.name.startswith(".")]
    # Its journal copied beside the requeued job twice (two rsyncs, two names).
    shutil.copytree(journal, login / journal.name)
    shutil.copytree(journal, login / f"{journal.name}.again")
    copied(login / journal.name)
    # The requeued job resumes where the killed one's journal ends.
    with Journal.open(journal, owner=False) as node_journal:
        read = node_journal.read(0, max_entries=10**6, max_bytes=1 << 34)
    kinds = [entry.kind for entry in read.entries]
    episodes, metrics = kinds.count(EntryKind.EPISODE), kinds.count(EntryKind.METRICS)
    assert episodes % 8 == 0 and episodes >= 15 * 8 and metrics >= 15
    start = [str(episodes // 8), str(metrics)]
    done = subprocess.run(
        [sys.executable, script, str(login), lp.url, run_id, *start],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return run_id, journal, done.stderr


def test_a_job_requeued_by_its_run_id_ships_its_predecessor_and_a_copy_of_it_once(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lp = local_platform
    run_id, journal = _requeued_by_run_id(lp, tmp_path, login)
    stored = lp.run(run_id)
    assert stored["status"] == "COMPLETED"
    assert stored["traces"]["episodes"] == stored["traces"]["distinct_episodes"] == 240
    assert stored["train_metrics"] == {"rows": 30, "steps": 30}
    assert sorted(o["step"] for o in stored["parquet_objects"]) == [0, 10, 20]
    # Syncing either copy, or the node's journal, afterwards ships nothing twice.
    for path in (login / journal.name, login / f"{journal.name}.again", journal):
        code, out, err = cli(capsys, "sync", "--job-ended", str(path))
        assert code == 0, out + err
    stored = lp.run(run_id)
    assert stored["traces"]["episodes"] == stored["traces"]["distinct_episodes"] == 240
    assert sorted(o["step"] for o in stored["parquet_objects"]) == [0, 10, 20]


def test_a_requeued_job_does_not_call_the_predecessor_it_shipped_unshipped(
    local_platform: Any, tmp_path: Path, login: Path
) -> None:
    """Found by an adversarial review: the requeued job shipped its
    predecessor's copies through their sync journal, then its finish()
    warned that the run was closed while each copy "had not shipped
    everything (not shipped: its processes are gone)" and told the user to
    replay it: a copy is never written, so its own state never says shipped."""
    lp = local_platform
    run_id, _, stderr = _requeue(lp, tmp_path, login)
    stored = lp.run(run_id)
    assert stored["traces"]["episodes"] == stored["traces"]["distinct_episodes"] == 240
    assert stored["status"] == "COMPLETED"
    assert "had not shipped everything" not in stderr, stderr[-2000:]


def test_a_deleted_sync_journal_a_requeued_job_shipped_through_is_not_shipped_twice(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The requeued job shipped its predecessor through a sync journal and
    closed the run; the user deletes that sync journal, then syncs a copy of
    the predecessor: its record says all of it was shipped into the run it
    closed, so nothing is sent again (the sync was refused while the
    record did not say the run was closed), never shipped twice."""
    lp = local_platform
    run_id, journal = _requeued_by_run_id(lp, tmp_path, login)
    stored = lp.run(run_id)
    shutil.rmtree(default_sync_root() / journal.name)  # the user cleans up too much
    code, out, err = cli(capsys, "sync", "--job-ended", str(login / journal.name))
    assert code == 0 and "nothing is sent again" in out, out + err
    again = lp.run(run_id)
    assert again["traces"] == stored["traces"]
    assert sorted(o["step"] for o in again["parquet_objects"]) == [0, 10, 20], "shipped twice"


# A sync killed (the OOM killer, a batch system's time limit) while it copies
# the copy's files into its snapshot, or while it makes the sync journal.
_KILLED_IN = """
import os, signal, sys
from primeruns.cli import main
from primeruns.ship import mirror
name = sys.argv[2]
done = getattr(mirror, name)
def killed(*args):
    done(*args)
    os.kill(os.getpid(), signal.SIGKILL)
setattr(mirror, name, killed)
main(["sync", sys.argv[1]])
"""


def test_a_sync_killed_midway_leaves_no_copy_of_the_journal_behind(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an adversarial review: each sync killed while it read a copy
    left a whole private copy of the journal in the sync root for good (in a
    home folder, whose quota is small on a cluster). The next sync removes
    what killed ones left, and ships every record once."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "node-7")
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    for where in ("_copy_file", "_hand_over_shipping"):
        killed = subprocess.run(
            [sys.executable, "-c", _KILLED_IN, str(copy), where], env=dict(os.environ), timeout=120
        )
        assert killed.returncode == -signal.SIGKILL
    root = default_sync_root()
    left = {p.name.split("-")[0] for p in root.iterdir() if p.name.startswith(PREFIXES)}
    assert left == {".creating", ".snapshot"}  # what the last killed sync left
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert [p for p in root.iterdir() if p.name.startswith(PREFIXES)] == []
    assert _landed(lp, "eval", "all")() is not None
    assert _status(lp) == "COMPLETED"


def test_gc_deletes_what_a_sync_killed_midway_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user short of space in the home folder after a sync was killed,
    who syncs nothing again, frees it with ``gc``."""
    copy = offline_copy(tmp_path, monkeypatch)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_IN, str(copy), "_copy_file"], env=dict(os.environ)
    )
    assert killed.returncode == -signal.SIGKILL
    root = default_sync_root()
    assert [p for p in root.iterdir() if p.name.startswith(PREFIXES)]
    code, out, err = cli(capsys, "gc", "--runs-dir", str(copy.parent))
    assert code == 0 and "1 working folder(s) that killed syncs left" in out, out + err
    assert [p for p in root.iterdir() if p.name.startswith(PREFIXES)] == []


def test_a_damaged_copy_of_an_ended_job_ships_past_its_damage_after_a_mid_run_sync(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an adversarial review: once a copy taken mid-run had made the
    sync journal, every later copy damaged at an entry stopped its import
    there, even once the job had ended (``--job-ended``) and no copy would
    ever bring that entry: the records after it were neither shipped nor
    counted lost, and the run was left open for good ("copy it again").
    Synced first, the same copy ships past the damage (``adopt_repaired``)."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "node-7")
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0 and _held(lp) == {"episodes": 6, "samples": 6}, out + err
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    flip_entry_bytes(copy, 10)  # an episode the mid-run copy did not hold, damaged for good
    code, out, err = cli(capsys, "sync", "--job-ended", "--json", str(copy))
    [first] = json.loads(out)
    assert code == 4 and first["damage"] and "entry 10" in first["damage"][0], out + err
    lost = {sink: loss["count"] for sink, loss in first["losses"].items()}
    assert lost == {"traces": 1, "eval_samples": 1}, out + err
    assert _held(lp) == {"episodes": 11, "samples": 11}
    assert _status(lp) == "COMPLETED"
    copy = _copy(producer.journal, login)  # copied again, damaged the same way
    flip_entry_bytes(copy, 10)
    code, out, err = cli(capsys, "sync", "--job-ended", "--json", str(copy))
    [again] = json.loads(out)
    assert code == 0 and not again["damage"], out + err
    assert {sink: loss["count"] for sink, loss in again["losses"].items()} == lost
    assert _held(lp) == {"episodes": 11, "samples": 11}


def test_an_ended_job_whose_copy_is_damaged_at_its_last_entry_is_closed_after_a_mid_run_sync(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an adversarial review: once a copy taken mid-run had made the
    sync journal, a final copy damaged at its last entry (its finish) left
    the run open for good, even with ``--job-ended`` ("copy it again": every
    copy of it is so). Synced first, the same copy closes it as crashed."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "node-7")
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0 and _status(lp) == "RUNNING", out + err
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    with Journal.open(copy, owner=False) as read:
        last = read.last_seq()
    flip_entry_bytes(copy, last)  # the finish entry
    code, out, err = cli(capsys, "sync", "--job-ended", "--json", str(copy))
    [report] = json.loads(out)
    assert code == 4 and f"entry {last}" in report["damage"][0], out + err
    assert _status(lp) == "FAILED" and report["status"] == "crashed", out + err
    assert _held(lp) == {"episodes": 12, "samples": 12}
    assert not report["losses"], out + err


def _flip_last_entry(journal: Path) -> int:
    """Damage the last entry of a killed producer's journal where it sits:
    its spool (appends are spooled raw) or, moved already, its data file."""
    with Journal.open(journal, owner=False) as read:
        last = read.last_seq()
        [entry] = read.read(last - 1, max_entries=1).entries
    assert entry.seq == last and entry.kind is EntryKind.EPISODE
    for segment in sorted(journal.glob("spool-*")):
        data = bytearray(segment.read_bytes())
        at = data.find(entry.payload)
        if at >= 0:
            data[at + len(entry.payload) // 2] ^= 0xFF
            segment.write_bytes(bytes(data))
            return last
    flip_entry_bytes(journal, last)
    return last


@pytest.mark.parametrize("mid_run_sync", [False, True], ids=["first", "after_a_mid_run_sync"])
def test_a_final_copy_damaged_at_its_last_record_counts_it_lost(
    local_platform: Any,
    tmp_path: Path,
    login: Path,
    capsys: pytest.CaptureFixture[str],
    mid_run_sync: bool,
) -> None:
    """A job killed while it wrote its last episode: its last entry is
    damaged for good, in its journal and so in every copy (its producer
    gone). Once a mid-run copy had made the sync journal, it was reported
    as damage but no sink counted it lost (past the sync journal's end,
    where no sink reads), as the sinks count a damaged entry followed by
    others, or the same copy synced first."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "-")
    if mid_run_sync:
        code, out, err = cli(capsys, "sync", str(_copy(producer.journal, login)))
        assert code == 0 and _held(lp) == {"episodes": 6, "samples": 6}, out + err
    producer.log_the_rest()
    producer.kill()
    last = _flip_last_entry(producer.journal)  # the twelfth episode
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", "--json", str(copy))
    [report] = json.loads(out)
    assert code == 4 and f"entry {last}" in report["damage"][0], out + err
    lost = {sink: loss["count"] for sink, loss in report["losses"].items()}
    assert lost == {"traces": 1, "eval_samples": 1}, out + err
    assert all(f"entry {last}" in str(loss["reasons"]) for loss in report["losses"].values())
    assert _held(lp) == {"episodes": 11, "samples": 11}
    copy = _copy(producer.journal, login)  # copied again, damaged the same way
    code, out, err = cli(capsys, "sync", "--json", str(copy))
    [again] = json.loads(out)
    assert {sink: loss["count"] for sink, loss in again["losses"].items()} == lost, out + err
    assert _held(lp) == {"episodes": 11, "samples": 11}


# Seeded so that the gateway keeps the one confirm from the platform.
CONFIRM, SEED = "/api/v1/rft/samples/confirm", 4


def test_a_sample_objects_confirm_answered_silently_by_a_gateway_is_not_taken_as_stored(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A silent confirm is asked again (confirm is idempotent), so a gateway
    that swallowed the first lets the second through here. (Two swallowed in
    a row, before the platform was ever seen naming a key, are still taken,
    as the contract allows a silent answer.)"""
    lp = local_platform
    producer = Producer(tmp_path / "node", "train", lp.url, "node-7")
    copy = _copy(producer.journal, login)  # its first half: one sample object, step 0
    # A gateway answers every confirm 200 "{}", letting about half through.
    lp.set_faults(bogus_rate=1.0, bogus_bodies=["{}"], routes=[CONFIRM], seed=SEED)
    _, out, err = cli(capsys, "sync", "--json", str(copy))
    [report] = json.loads(out)
    [run] = lp.runs()
    stored = sorted(o["step"] for o in lp.run(run["id"])["parquet_objects"])
    lost = report["losses"].get("train_samples", {}).get("count", 0)
    assert stored == [0] or lost, (stored, out + err)


# A sync held at its first request to the platform: the copy is being shipped.
_HELD_IN = """
import sys
import httpx
from primeruns.cli import main
send = httpx.Client.send
def held(*args, **kwargs):
    if sys.stdin is not None:
        print("holding", flush=True)
        sys.stdin.readline()
        sys.stdin = None
    return send(*args, **kwargs)
httpx.Client.send = held
sys.exit(main(["sync", sys.argv[1]]))
"""


@contextlib.contextmanager
def _sync_held(copy: Path) -> Iterator[subprocess.Popen[str]]:
    """``primeruns sync COPY`` held at its first request to the platform
    while the body runs, then let go; it must end well."""
    sync = subprocess.Popen(
        [sys.executable, "-c", _HELD_IN, str(copy)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        assert sync.stdout is not None
        assert "holding\n" in iter(sync.stdout.readline, ""), "the sync ended"
        yield sync
    finally:
        out, err = sync.communicate("\n", timeout=120)
    assert sync.returncode == 0, out + err


def test_a_second_sync_of_a_copy_being_shipped_names_the_sync_that_ships_it(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an adversarial review: a second ``sync`` (a cron job beside a
    ``sync --watch``, a user's own) of a copy another sync was shipping said
    only that the journal was "owned by pid N", a pid the user could not tell
    from a producer's; it names the ``primeruns sync`` that ships it."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "node-7")
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    with _sync_held(copy) as first:
        code, out, err = cli(capsys, "sync", str(copy))
        assert code == 3, out + err
        assert f"`primeruns sync` (pid {first.pid} on " in err, err
    assert _landed(lp, "eval", "all")() is not None
    assert _status(lp) == "COMPLETED"


def test_a_requeued_job_names_the_sync_shipping_its_predecessors_copy(
    local_platform: Any, tmp_path: Path, login: Path
) -> None:
    """Found by an adversarial review: while a ``sync`` on the login node
    shipped a copy of the killed job's journal, the requeued job's finish()
    called that copy "not shipped: its processes are gone" and told the user
    to replay it. It names the sync that ships it; every record lands once."""
    lp = local_platform
    held: list[int] = []
    with contextlib.ExitStack() as stack:

        def copied(copy: Path) -> None:
            held.append(stack.enter_context(_sync_held(copy)).pid)

        run_id, _, stderr = _requeue(lp, tmp_path, login, copied)
        assert "its processes are gone" not in stderr, stderr[-2000:]
        assert f"`primeruns sync` (pid {held[0]} on " in stderr, stderr[-2000:]
    stored = lp.run(run_id)
    assert stored["traces"]["episodes"] == stored["traces"]["distinct_episodes"] == 240
    assert sorted(o["step"] for o in stored["parquet_objects"]) == [0, 10, 20]


def test_a_copy_a_sync_ships_is_not_called_shipped_for_what_it_never_imported(
    local_platform: Any, tmp_path: Path, login: Path
) -> None:
    """Found by an adversarial review: a journal whose sync journal a live
    ``sync`` held was called "being shipped" by that sync (and the replay
    advice dropped) even where the sync ships an older copy of it, which
    holds none of the records logged after that copy was taken."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "node-7")
    half = _copy(producer.journal, login)  # taken mid-run
    producer.log_the_rest()
    producer.finish()
    with _sync_held(half):
        assert ranks._left_in(producer.journal) == "not shipped: its processes are gone"
    # (A sync of a whole copy is "being shipped by" it: the requeue test above.)


@pytest.mark.parametrize("mid_run_sync", [False, True], ids=["first", "after_a_mid_run_sync"])
def test_a_copy_missing_entries_its_original_here_holds_is_not_final(
    local_platform: Any,
    tmp_path: Path,
    login: Path,
    capsys: pytest.CaptureFixture[str],
    mid_run_sync: bool,
) -> None:
    """Found by an adversarial review: a journal copied file by file while
    its producer wrote (``data.mdb`` first; a spool segment moved into the
    original's and deleted meanwhile; the segments left copied after the
    producer was killed) misses entries in its middle and ends where its
    original does. Its producer gone from this machine, it was taken for a
    final copy: the entries it lacks were counted lost, the run closed as
    crashed, and a whole copy synced after brought none of them (the sync
    journal had gone past them), though the original held every one. It is
    left open as behind its original, and the whole copy ships them."""
    lp = local_platform
    producer = procs.start(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "moved_producer.py"),
            str(tmp_path / "node"),
            lp.url,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        cwd=Path(__file__).parents[1],
    )
    assert producer.stdin is not None and producer.stdout is not None
    original = Path(producer.stdout.readline().split(" ", 1)[1].strip())
    assert producer.stdout.readline().strip() == "moved"
    if mid_run_sync:
        code, out, err = cli(capsys, "sync", str(_copy(original, login)))
        assert code == 0 and _held(lp) == {"episodes": 100, "samples": 100}, out + err
    torn = login / original.name
    shutil.rmtree(torn, ignore_errors=True)
    torn.mkdir(mode=0o700, parents=True)
    shutil.copy2(original / "data.mdb", torn / "data.mdb")  # rsync's order: data.mdb first
    producer.stdin.write("go\n")
    producer.stdin.flush()
    assert producer.stdout.readline().strip() == "spooled"
    producer.stdin.write("die\n")
    producer.stdin.flush()
    assert producer.wait(timeout=60) == -signal.SIGKILL
    producer.stdin.close()
    producer.stdout.close()
    for name in sorted(p.name for p in original.iterdir() if p.is_file()):
        if not (torn / name).exists():
            shutil.copy2(original / name, torn / name)  # the spool segments left, and the rest
    with Journal.open(torn, owner=False) as read:
        assert read.read(101, max_entries=1).entries[0].seq > 102, "no entries missing"
    code, out, err = cli(capsys, "sync", "--json", str(torn))
    [report] = json.loads(out)
    assert not report["losses"], out + err
    assert _status(lp) == "RUNNING", out + err
    code, out, err = cli(capsys, "sync", str(_copy(original, login)))
    assert code == 0, out + err
    assert _held(lp) == {"episodes": 700, "samples": 700}
    assert _status(lp) == "FAILED"  # killed: closed as crashed


def test_ls_and_show_of_a_copy_count_what_its_sync_journal_counted_lost(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an adversarial review: ``ls`` and ``show`` of a copy said
    how its sync journal shipped it (its platform run, what is pending, that
    it is shipped and closed) but only the losses the copy's producer
    counted: a record its sync counted lost (here its damaged last episode;
    as well one the platform rejected) was in no count, and ``show`` said
    every episode acknowledged. They count the sync journal's losses too."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "-")
    producer.log_the_rest()
    producer.kill()
    last = _flip_last_entry(producer.journal)  # killed as it wrote it: lost for good
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", "--json", str(copy))
    [report] = json.loads(out)
    lost = {sink: loss["count"] for sink, loss in report["losses"].items()}
    assert lost == {"traces": 1, "eval_samples": 1}, out + err
    code, out, err = cli(capsys, "ls", "--runs-dir", str(login), "--json")
    assert code == 0, out + err
    [row] = json.loads(out)
    assert {sink: loss["count"] for sink, loss in row["losses"].items()} == lost, out
    assert all(f"entry {last}" in str(loss["reasons"]) for loss in row["losses"].values())
    code, out, err = cli(capsys, "show", "--json", str(copy))
    assert code == 4, out + err  # the copy is damaged
    shown = json.loads(out)
    assert {sink: loss["count"] for sink, loss in shown["losses"].items()} == lost, out
    code, out, err = cli(capsys, "show", str(copy))
    assert "lost 1 for traces" in out and "lost 1 for eval_samples" in out, out


def _synced_halfway_then_copied_whole(
    lp: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> Path:
    """A copy taken halfway synced with ``--job-ended`` (which closed the
    run), then the journal copied again whole over it: that copy."""
    producer = Producer(tmp_path / "node", "eval", lp.url, "node-a")
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(copy), "--job-ended")
    assert code == 0, out + err
    assert _landed(lp, "eval", "half")() is not None
    producer.log_the_rest()
    producer.finish()
    return _copy(producer.journal, login)


def test_gc_keeps_a_copy_holding_entries_its_closed_sync_journal_never_imported(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy taken halfway was synced with ``--job-ended`` (the job had
    ended, but the copy was taken before it did), which closed the run; the
    copy taken again holds the rest. gc deleted that copy and pruned its sync
    journal, recorded as shipped: the rest could then be synced from nowhere,
    and nothing counted it. Kept, its next sync ships the rest, every record
    once."""
    lp = local_platform
    copy = _synced_halfway_then_copied_whole(lp, tmp_path, login, capsys)
    code, out, err = cli(capsys, "gc", "--runs-dir", str(login), "--older-than", "0", "-v")
    assert code == 0, out + err
    assert copy.exists() and (default_sync_root() / copy.name / "data.mdb").exists(), out
    assert "not imported" in out, out
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert _landed(lp, "eval", "all")() is not None, out + err


def test_gc_of_another_runs_directory_keeps_a_sync_journal_a_copy_holds_entries_beyond(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sync root is one for every runs directory. A copy taken halfway
    was synced with ``--job-ended`` and copied again whole; gc of another
    runs directory pruned its sync journal, which it judged by the journals
    of that directory alone, leaving a record that the run shipped: the
    rest was refused by the next sync (it would ship the first half twice)
    and counted nowhere. Kept, the next sync ships the rest, every record once."""
    lp = local_platform
    copy = _synced_halfway_then_copied_whole(lp, tmp_path, login, capsys)
    other = tmp_path / "other-project"
    other.mkdir()
    code, out, err = cli(capsys, "gc", "--runs-dir", str(other), "--older-than", "0", "-v")
    assert code == 0, out + err
    assert (default_sync_root() / copy.name / "data.mdb").exists(), out
    assert f"of {copy} not imported yet" in out, out
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert _landed(lp, "eval", "all")() is not None, out + err
