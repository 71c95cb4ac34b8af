"""``primeruns replay``: a SIGKILLed producer's run lands complete and exactly
once, closed as FAILED with a crash reason; a live owner is refused by pid and
host; a second replay is harmless; a damaged journal ships what is intact."""

from __future__ import annotations

import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import procs
import pytest
import workloads
from cli_helpers import cli, cli_subprocess, flip_entry_bytes, landed_once
from sdk_helpers import API_KEY, kill_producer, point_at

import primeruns as pr
from primeruns.journal import EntryKind, Journal


def _journaled(path: Path) -> tuple[list[str], list[int], bool]:
    with Journal.open(path, owner=False) as journal:
        eps = journal.read(0, kinds={EntryKind.EPISODE}, max_entries=10**6, max_bytes=1 << 34)
        mets = journal.read(0, kinds={EntryKind.METRICS}, max_entries=10**6, max_bytes=1 << 34)
        finished = journal.read(0, kinds={EntryKind.FINISH}, max_entries=1).entries
    ids = [json.loads(e.payload)["id"] for e in eps.entries]
    return ids, [json.loads(e.payload)["step"] for e in mets.entries], bool(finished)


@pytest.mark.parametrize("seed", range(3))
def test_replay_after_sigkill_lands_every_logged_record_once_as_failed(
    seed: int,
    make_local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lp = make_local_platform(latency_ms=5)
    runs = point_at(monkeypatch, tmp_path, lp.url)
    rng = random.Random(seed)
    kind = "train" if seed % 2 else "eval"
    n = 30 if kind == "train" else 120
    # Killed in the first half of the workload; a producer that still raced to
    # its finish entry must then end COMPLETED instead (its finish is journaled).
    path, acked = kill_producer([str(runs), kind, str(n), lp.url], rng.randrange(1, n // 2))
    ids, steps, finished = _journaled(path)
    logged = [line.split(" ", 1)[1] for line in acked if line.startswith("episode ")]
    assert logged and set(logged) <= set(ids)

    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    code, out, err = cli(capsys, "replay", "--runs-dir", str(runs), path.name)
    assert code == 0, out + err
    with Journal.open(path, owner=False) as journal:
        run_id = journal.get_meta("platform")["run_id"]
    stored = lp.run(run_id)
    if finished:
        assert stored["status"] == "COMPLETED"
    else:
        assert stored["status"] == "FAILED"
        assert "crash" in (stored["error_message"] or "")
    assert landed_once(stored, len(ids))
    if kind == "eval":
        assert stored["samples"]["rows"] == stored["samples"]["distinct"] == len(ids)
    else:
        metrics = stored["train_metrics"]
        assert metrics["rows"] == metrics["steps"] == len(set(steps))

    # Twice is harmless: exit 0, nothing duplicated, status kept.
    code, out, err = cli(capsys, "replay", str(path))
    assert code == 0, out + err
    again = lp.run(run_id)
    assert again["status"] == stored["status"] and landed_once(again, len(ids))
    assert again["samples"] == stored["samples"]
    assert again["train_metrics"] == stored["train_metrics"]


_OWNER = """
import sys
import primeruns as pr
run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=sys.argv[1])
run.log_metrics({"x": 1.0})
print(run.journal_path, flush=True)
sys.stdin.readline()
"""


def test_replay_refuses_a_live_owner_naming_pid_and_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    owner = procs.start(
        [sys.executable, "-c", _OWNER, str(runs)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert owner.stdout is not None
        path = Path(owner.stdout.readline().strip())
        code, out, err = cli(capsys, "replay", str(path))
        assert code == 3
        assert f"pid {owner.pid}" in err and socket.gethostname() in err
        code, out, _ = cli(capsys, "replay", "--dry-run", str(path))
        assert code == 3 and f"pid {owner.pid}" in out
        code, out, _ = cli(capsys, "ls", "--runs-dir", str(runs), "--json")
        assert json.loads(out)[0]["state"] == "running"  # ls needs no lock
        code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "--force")
        assert code == 0 and path.exists()  # gc never deletes a live run
    finally:
        owner.kill()
        owner.communicate()


def test_replay_of_a_damaged_journal_ships_the_intact_entries_and_reports_the_rest(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = pr.init(
        environments=["gsm8k"],
        model="m",
        mode="offline",
        api_key=API_KEY,
        base_url=local_platform.url,
        runs_dir=runs,
    )
    for episode in workloads.gsm8k(10):
        run.log_episodes([episode])
    run.finish()
    assert run.journal_path is not None
    flip_entry_bytes(run.journal_path, 5)  # entry 1 is run_open: 5 is the 4th episode

    env = dict(os.environ, PRIME_API_KEY=API_KEY)
    done = cli_subprocess("sync", "--runs-dir", str(runs), env=env)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "damaged" in done.stdout and "entry 5" in done.stdout
    assert API_KEY not in done.stdout + done.stderr
    [listed] = local_platform.runs()
    stored = local_platform.run(listed["id"])
    # The 9 intact episodes land once; the damaged one too only if the rebuild
    # finds an intact copy of it. flip_entry_bytes corrupts every copy of its
    # value in data.mdb (stale ones in freed pages too), and the finish left
    # nothing in the spool (all moved into LMDB), so 9 is expected.
    landed = stored["traces"]["distinct_episodes"]
    assert landed in (9, 10) and landed_once(stored, landed)
    assert stored["samples"]["rows"] == stored["samples"]["distinct"] == landed
    assert stored["status"] == "COMPLETED"

    # show and export report the damage too, and still give what is intact.
    # sync rebuilt a private snapshot of the journal into its sync journal
    # (the damaged file kept there) and left the journal as it was.
    assert not list(run.journal_path.glob("data.mdb.damaged-*"))
    assert list(
        (tmp_path / "home" / ".local" / "state" / "prime-runs" / "synced").glob(
            f"{run.journal_path.name}/data.mdb.damaged-*"
        )
    )
    shown = cli_subprocess("show", str(run.journal_path), env=env)
    exported = cli_subprocess("export", str(run.journal_path), env=env)
    assert len(exported.stdout.splitlines()) == landed
    if landed == 9:
        assert shown.returncode == 4 and "entry 5" in shown.stdout
        assert exported.returncode == 4 and "entry 5" in exported.stderr


def test_replay_of_something_that_is_not_a_run_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "replay", "--runs-dir", str(tmp_path), "no-such-run")
    assert code == 2 and "no run 'no-such-run'" in err and "Traceback" not in err
    code, _, err = cli(capsys, "replay", str(tmp_path))
    assert code == 2 and "not a prime-runs journal" in err


def _zero_a_page_that_aborts_lmdb(path: Path) -> int:
    """Zero the first interior page of ``path`` whose loss makes LMDB abort a
    reader (as the probe's child finds); returns it."""
    from primeruns.journal.probe import probe

    # At rest first, as a journal waiting for replay is: its owner's close
    # moves what the killed job left in the spool into the compressed,
    # chunked tree (the one with interior pages to damage).
    Journal.open(path, owner=True).close()
    data = path / "data.mdb"
    raw = data.read_bytes()
    for page in range(2, len(raw) // 4096):
        damaged = bytearray(raw)
        damaged[page * 4096 : (page + 1) * 4096] = bytes(4096)
        data.write_bytes(bytes(damaged))
        if "killed the reader" in (probe(path) or ""):
            return page
    raise AssertionError("no single page aborts LMDB in this journal")


def test_replay_all_ships_the_healthy_runs_beside_a_damaged_one(
    make_local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, a damaged page aborted ``replay --all`` in LMDB's C code at the
    first damaged journal: the healthy crashed run beside it stayed RUNNING."""
    lp = make_local_platform()
    runs = point_at(monkeypatch, tmp_path, lp.url)
    damaged, _ = kill_producer([str(runs), "eval", "120", lp.url], 60)
    healthy, _ = kill_producer([str(runs), "eval", "120", lp.url], 60)
    ids, _, _ = _journaled(healthy)
    _zero_a_page_that_aborts_lmdb(damaged)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    code, out, err = cli(capsys, "replay", "--runs-dir", str(runs), "--all")
    assert "Traceback" not in err
    assert code == 4, out + err  # damage is reported in the exit code
    with Journal.open(healthy, owner=False) as journal:
        run_id = journal.get_meta("platform")["run_id"]
    stored = lp.run(run_id)
    assert stored["status"] in ("FAILED", "COMPLETED")
    assert landed_once(stored, len(ids))
    # The damaged one is salvaged, reported and shipped as far as it is intact.
    assert damaged.name in out and "tree damaged" in out and "intact entries were shipped" in out


def _sample_rows(lp: Any, eval_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{lp.url}/api/v1/evaluations/{eval_id}/samples",
        params={"page": 1, "limit": 100},
        headers=lp.auth_headers,
        timeout=30,
    )
    answer.raise_for_status()
    rows: list[dict[str, Any]] = answer.json()["samples"]
    return rows


def test_replayed_sample_rows_carry_the_platform_run_id_as_live_rows_do(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A pipeline names its run in each episode as ``run.id`` (as verifiers
    does): live, that is the platform's id; offline, the journal's local id,
    which the platform never knew. The sample table's ``native_wrapper`` must
    name the platform's run either way, as the traces service's copy does."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    monkeypatch.setenv("PRIME_API_BASE_URL", lp.url)

    def evaluate(**init: Any) -> pr.Run:
        run = pr.init(environments=["gsm8k"], model="m", runs_dir=runs, **init)
        episodes = workloads.gsm8k(3)
        for episode in episodes:
            episode["run"] = {**episode["run"], "id": run.id}  # the id the pipeline sees
        run.log_episodes(episodes)
        run.finish()
        return run

    live = evaluate()
    offline = evaluate(mode="offline")
    assert offline.journal_path is not None
    code, out, err = cli(capsys, "replay", str(offline.journal_path))
    assert code == 0, out + err
    [replayed_id] = [r["id"] for r in lp.runs() if r["id"] != live.id]

    for eval_id in (live.id, replayed_id):
        rows = _sample_rows(lp, eval_id)
        assert len(rows) == 3
        assert {row["info"]["native_wrapper"]["run"]["id"] for row in rows} == {eval_id}
        assert {row["info"]["native_wrapper"]["run"]["type"] for row in rows} == {"eval"}


def test_replay_all_closes_a_run_its_rank_0_created_after_the_other_ranks_records(
    make_local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Rank 0 created the run (``init()`` without ``id=``) and handed its id
    to the other ranks, which attached to it; the platform was down when
    they finished. ``replay --all`` ships rank 0's journal after the others
    (its close-out closes the run): every rank's rows land before the close,
    each step's row with every rank's key."""
    lp = make_local_platform()
    runs = point_at(monkeypatch, tmp_path, lp.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    # Journals named in the order made, as a launch makes them (rank 0 first).
    names = iter(f"20260101-000000-{n:08x}" for n in range(100))
    monkeypatch.setattr(
        "primeruns.journal.journal.default_local_id", lambda runs_dir=None: next(names)
    )
    common: dict[str, Any] = {"model": "m", "base_url": lp.url, "runs_dir": runs, "team_id": "t"}
    creator = pr.init(kind="train", **common)
    ranks = [creator]
    for rank in (1, 2):  # as torchrun starts them: RANK is the launcher's
        monkeypatch.setenv("RANK", str(rank))
        ranks.append(pr.init(kind="train", id=creator.id, **common))
    monkeypatch.delenv("RANK")
    lp.set_faults(statuses=[503], retryable_rate=1.0)  # the platform goes down
    for step in range(4):
        for n, run in enumerate(ranks):
            run.log_metrics({f"loss_r{n}": 1.0, "lr": 0.1}, step=step)
    for run in reversed(ranks):
        run.finish(timeout=1)
    assert lp.run(creator.id)["status"] == "RUNNING"  # its close failed too
    lp.set_faults(retryable_rate=0.0)

    code, out, err = cli(capsys, "replay", "--all", "--runs-dir", str(runs))
    assert code == 0, out + err
    stored = lp.run(creator.id)
    assert stored["status"] == "COMPLETED"
    assert stored["train_metrics"] == {"rows": 4, "steps": 4}
    conn = sqlite3.connect(f"file:{lp.data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        (closed,) = conn.execute(
            "SELECT completed_at FROM train_runs WHERE id = ?", (creator.id,)
        ).fetchone()
        rows = conn.execute(
            "SELECT body, received_at FROM train_metrics WHERE run_id = ?", (creator.id,)
        ).fetchall()
    finally:
        conn.close()
    assert all(at <= closed for _, at in rows), "a rank's row landed after the run closed"
    for body, _ in rows:
        assert {"lr", "loss_r0", "loss_r1", "loss_r2"} <= set(json.loads(body)), body
