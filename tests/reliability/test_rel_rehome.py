"""The journal notices it was deleted or moved under its live run (issue #28).

A tmp cleaner, a scratch wipe or ``rm -rf`` of a state directory takes the
runs directory of a long job. Before, every later ``log_*`` call returned
normally and 20-63 episodes and 20-21 metric rows reached no sink and no
counter (5 of 6 trials), and runs closed as crashed. Now the producer says
so once, re-creates the journal at its path with the run's identity,
registration, records and offsets, and a new uplink ships it: every record
whose call returned lands exactly once, and the run's journal is on disk
again for ``show`` and ``replay``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import one_run_oracle as oracle
import pytest
import rel_helpers as rh
import rel_torture as rt
import workloads
from sdk_helpers import platform_metric_steps

import primeruns as pr
from primeruns.journal import EntryKind
from primeruns.local import LocalPlatform


def _log(run: pr.Run, episodes: list[dict[str, Any]]) -> list[str]:
    for i in range(0, len(episodes), 5):
        run.log_episodes(episodes[i : i + 5])  # never raises
    return [e["id"] for e in episodes]


def _log_until_said(
    run: pr.Run, spare: list[dict[str, Any]], caplog: pytest.LogCaptureFixture, what: str
) -> list[str]:
    """Log one spare episode at a time until the run said ``what`` (a move is
    looked for once a second, at an append); bounded."""
    logged: list[str] = []
    for episode in spare:
        if what in caplog.text:
            break
        run.log_episodes([episode])
        logged.append(episode["id"])
        time.sleep(0.05)  # polls a condition, bounded by ``spare``: not a timed assertion
    return logged


def _append_until_recreated(run: pr.Run) -> None:
    """Append (summary updates) until the run noticed its directory gone and
    re-created it (a deletion is looked for every 50 ms); bounded."""
    assert run.journal_path is not None
    for i in range(200):
        if run.journal_path.exists():
            return
        run.update_summary({"probe": i})
        time.sleep(0.01)  # polls a condition, bounded: not a timed assertion


@pytest.mark.parametrize("how", ["deleted", "moved"])
def test_a_runs_dir_deleted_or_moved_mid_run_loses_nothing_and_says_so(
    shared_platform: LocalPlatform,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    lp = shared_platform
    episodes = workloads.gsm8k(150)
    spare = episodes[90:]
    runs = tmp_path / "runs"
    with rt.sdk_env(lp.url, tmp_path / "home"), caplog.at_level(logging.WARNING, "primeruns"):
        run = rt.eval_run(lp.url, runs)
        registered = run.id
        acked = _log(run, episodes[:30])
        if how == "deleted":
            shutil.rmtree(runs)
        else:
            runs.rename(tmp_path / "elsewhere")
        if how == "moved":
            acked += _log_until_said(run, spare, caplog, "was moved")
        acked += _log(run, episodes[30:60])
        acked += _log(run, episodes[60:90])
        run.finish(timeout=60)
    assert run.status is pr.RunStatus.COMPLETED
    assert run.id == registered  # the same platform run: its identity kept
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    lost = run.dropped_records
    assert len(set(stored)) + lost == len(acked), (len(stored), lost, run.errors)
    assert set(stored) <= set(acked) and max(stored.values()) == 1
    assert lost == 0
    said = [r.getMessage() for r in caplog.records if f"was {how}" in r.getMessage()]
    assert len(said) == 1, caplog.text  # once, loudly
    assert run.journal_path is not None and run.journal_path.exists()  # on disk again
    journaled = {r["id"] for r in rh.journal_records(run.journal_path, EntryKind.EPISODE)}
    assert journaled == set(acked)


def test_a_training_runs_dir_deleted_twice_keeps_every_episode_and_metric_row(
    shared_platform: LocalPlatform, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Episodes and metric rows, one step at a time, the directory wiped
    twice (a cleaner that comes back): each time the run says so and goes on."""
    lp = shared_platform
    episodes = workloads.agentic(90)
    runs = tmp_path / "runs"
    with rt.sdk_env(lp.url, tmp_path / "home"), caplog.at_level(logging.WARNING, "primeruns"):
        run = pr.init(kind="train", model="m", team_id="team", base_url=lp.url, runs_dir=runs)
        for step in range(30):
            run.log_episodes(episodes[step * 3 : step * 3 + 3])
            run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
            if step in (9, 19):
                shutil.rmtree(runs, ignore_errors=True)  # the second: gone if never re-created
                _append_until_recreated(run)
        run.finish(timeout=60)
    assert run.id.startswith("rft_")  # the platform's run: its registration kept
    assert run.status is pr.RunStatus.COMPLETED and run.dropped_records == 0
    assert "not shipped" not in caplog.text  # every sink shipped all it was given
    assert run.journal_path is not None
    journaled = [r["id"] for r in rh.journal_records(run.journal_path, EntryKind.EPISODE)]
    assert journaled == [e["id"] for e in episodes]  # all of them, once, in order
    steps = platform_metric_steps(lp.data_dir, run.id)
    assert set(steps) == set(range(30)) and max(steps.values()) == 1
    said = [r.getMessage() for r in caplog.records if "was deleted" in r.getMessage()]
    assert len(said) == 2, caplog.text


def test_spool_files_deleted_under_the_run_lose_nothing(
    shared_platform: LocalPlatform, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cleaner that deletes files, not the directory: the spool segment
    being written loses its name. The run says so and ships everything."""
    lp = shared_platform
    episodes = workloads.gsm8k(60)
    with rt.sdk_env(lp.url, tmp_path / "home"), caplog.at_level(logging.WARNING, "primeruns"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        acked = _log(run, episodes[:30])
        assert run.journal_path is not None
        for segment in run.journal_path.glob("spool-*"):
            segment.unlink()
        acked += _log(run, episodes[30:])
        run.finish(timeout=60)
    assert run.status is pr.RunStatus.COMPLETED
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == set(acked) and max(stored.values()) == 1
    assert "was deleted" in caplog.text


@pytest.mark.parametrize(
    "refusal",
    [PermissionError(13, "Read-only file system (injected)"), ValueError("a bug (injected)")],
    ids=["read-only disk", "unexpected error"],
)
def test_a_move_that_fails_other_than_a_journal_error_ships_on_from_threads(
    shared_platform: LocalPlatform,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    refusal: Exception,
) -> None:
    """The uplink process is stopped for the move; a re-creation that fails
    with anything but a JournalError (a read-only or full disk's OSError, a
    bug) left the supervisor's ``_moving`` set, so the dead uplink was never
    started again or replaced: the error reached the log call (a ValueError
    was counted as a bad record instead), nothing shipped, and flush() gave
    up. Now the run ships on from threads over this process's handles."""
    from primeruns import rehoming

    def refused(old: object) -> object:
        raise refusal

    monkeypatch.setattr(rehoming, "rehome", refused)
    lp = shared_platform
    episodes = workloads.gsm8k(150)
    runs = tmp_path / "runs"
    with rt.sdk_env(lp.url, tmp_path / "home"), caplog.at_level(logging.WARNING, "primeruns"):
        run = rt.eval_run(lp.url, runs)
        acked = _log(run, episodes[:30])
        assert run.flush(timeout=60)
        shutil.rmtree(runs)
        acked += _log_until_said(run, episodes[90:], caplog, "could not re-create")
        acked += _log(run, episodes[30:60])
        supervisor = run._supervisor
        assert supervisor is not None
        moving, alive = supervisor._moving, supervisor.uplink.alive()
        flushed = run.flush(timeout=60)
        run.finish(timeout=60)
    assert not moving and alive, (moving, alive)
    assert flushed
    assert run.status is pr.RunStatus.COMPLETED and not run.failed_records, run.failed_records
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == set(acked) and max(stored.values()) == 1


def test_an_offline_runs_dir_deleted_mid_run_is_re_created_for_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Offline the journal is all there is: it is re-created with every record,
    for ``primeruns replay`` to ship later."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    episodes = workloads.gsm8k(40)
    runs = tmp_path / "runs"
    with caplog.at_level(logging.WARNING, "primeruns"):
        run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
        acked = _log(run, episodes[:20])
        shutil.rmtree(runs)
        acked += _log(run, episodes[20:])
        run.finish()
    assert run.status is pr.RunStatus.COMPLETED and run.dropped_records == 0
    assert "was deleted" in caplog.text
    assert run.journal_path is not None
    journaled = [r["id"] for r in rh.journal_records(run.journal_path, EntryKind.EPISODE)]
    assert journaled == acked
    assert rh.journal_records(run.journal_path, EntryKind.FINISH)


def test_a_relative_runs_dir_stays_where_it_was_when_the_process_changes_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``runs_dir="runs"`` names a folder of the directory the run started
    in. A process that changes directory afterwards (a harness running each
    task in its own folder) has not moved the journal: the run keeps writing
    where it began, says nothing of a move, and makes no journal in the new
    directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    start, later = tmp_path / "start", tmp_path / "later"
    start.mkdir()
    later.mkdir()
    monkeypatch.chdir(start)
    episodes = workloads.gsm8k(4)
    with caplog.at_level(logging.WARNING, "primeruns"):
        run = pr.init(environments=["gsm8k"], mode="offline", runs_dir="runs")
        acked = _log(run, episodes[:2])
        monkeypatch.chdir(later)
        acked += _log(run, episodes[2:])
        run.finish()
    assert run.status is pr.RunStatus.COMPLETED and run.dropped_records == 0
    assert "moved" not in caplog.text and "re-creat" not in caplog.text
    assert not (later / "runs").exists()
    (journal,) = [p for p in (start / "runs").iterdir() if not p.name.startswith(".")]
    assert [r["id"] for r in rh.journal_records(journal, EntryKind.EPISODE)] == acked
    assert rh.journal_records(journal, EntryKind.FINISH)


def _platform_rows(data_dir: Path, run_id: str) -> dict[int, dict[str, Any]]:
    """The run's metrics row of each step, as the platform keeps it."""
    uri = f"file:{data_dir / 'platform.sqlite3'}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        rows = conn.execute("SELECT body FROM train_metrics WHERE run_id = ?", (run_id,))
        bodies = [b for b in (json.loads(body) for (body,) in rows) if "step" in b]
    finally:
        conn.close()
    by_step = {int(b["step"]): b for b in bodies}
    assert len(by_step) == len(bodies), "two rows for one step"
    return by_step


def _rank(runs: Path, url: str, rank: int, run_id: str | None) -> pr.Run:
    os.environ["RANK"] = str(rank)  # the launcher's (restored by sdk_env)
    return pr.init(kind="train", id=run_id, model="m", team_id="team", base_url=url, runs_dir=runs)


def test_ranks_keep_each_others_keys_of_a_step_when_the_runs_dir_is_deleted(
    shared_platform: LocalPlatform, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two ranks merge their rows of a step in the runs directory's step
    table; the directory (journals and table) is wiped between their rows.
    Rank 1's row of the step, sent after, still carries rank 0's keys: the
    table made anew starts from what the platform holds, not empty."""
    lp = shared_platform
    runs = tmp_path / "runs"
    with rt.sdk_env(lp.url, tmp_path / "home"), caplog.at_level(logging.WARNING, "primeruns"):
        first = _rank(runs, lp.url, 0, None)
        second = _rank(runs, lp.url, 1, first.id)
        for step in range(3):
            first.log_metrics({"loss_r0": 1.0 + step, "lr": 0.1}, step=step)
        assert first.flush(timeout=60)
        second.log_metrics({"loss_r1": 2.0}, step=0)
        assert second.flush(timeout=60)
        shutil.rmtree(runs)
        _append_until_recreated(second)
        for step in range(1, 3):
            second.log_metrics({"loss_r1": 2.0 + step, "lr": 0.1}, step=step)
        assert second.flush(timeout=60)
        first.log_metrics({"loss_r0": 9.0}, step=3)
        second.log_metrics({"loss_r1": 9.0}, step=3)
        second.finish(timeout=60)
        first.finish(timeout=60)
    assert first.status is pr.RunStatus.COMPLETED and first.dropped_records == 0
    rows = _platform_rows(lp.data_dir, first.id)
    assert set(rows) == {0, 1, 2, 3}
    for step, row in rows.items():
        assert {"loss_r0", "loss_r1"} <= set(row), (step, row)
    assert all(rows[step]["lr"] == 0.1 for step in range(3))
    assert "cannot be used" not in caplog.text  # the table was made anew, not given up


@pytest.mark.parametrize("after", [2, 5])
def test_four_rank_processes_keep_every_key_of_each_step_through_a_wipe(
    shared_platform: LocalPlatform, tmp_path: Path, after: int
) -> None:
    """Four rank processes (``rel_rank.py``) log a training run; its runs
    directory is wiped (``rm -rf``: journals and the step table) once each
    said ``after`` lines, while they log and ship. Every step's row holds
    every rank's key. Before: 16 of 16 trials lost one (a table made anew
    empty); then 5 of 16 (an uplink whose table went mid-transaction gave it
    up and sent its rows as logged)."""
    lp = shared_platform
    run_id = oracle.create(lp, "train")
    ranks = oracle._start(lp, tmp_path, run_id, "train")
    for rank in ranks:
        rank.read_until(None, lines=after)
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)  # as rm -rf: on past what others make
    for rank in ranks:
        rank.read_until("logged")
    for rank in ranks[1:]:
        rank.release()
        rank.wait_finished()
    ranks[0].release()
    ranks[0].wait_finished()
    oracle.check_metrics(lp, run_id, {f"loss_r{r.rank}": r.steps for r in ranks})


def _second_rank_logs_after_a_wipe(
    lp: LocalPlatform, tmp_path: Path, first_rows: list[tuple[dict[str, Any], int | None]]
) -> tuple[pr.Run, pr.Run]:
    """Rank 0 logs ``first_rows`` and they land; the runs directory is wiped;
    then rank 1 logs step 0 (which rank 0 logged ``loss_r0`` for), and both finish."""
    runs = tmp_path / "runs"
    with rt.sdk_env(lp.url, tmp_path / "home"):
        first = _rank(runs, lp.url, 0, None)
        second = _rank(runs, lp.url, 1, first.id)
        for values, step in first_rows:
            first.log_metrics(values, step=step)
        assert first.flush(timeout=60)
        shutil.rmtree(runs)
        _append_until_recreated(second)
        second.log_metrics({"loss_r1": 2.0}, step=0)
        second.finish(timeout=30)
        first.finish(timeout=30)
    return first, second


@pytest.mark.parametrize("logged", ["the largest step", "a page of rows without a step first"])
def test_the_runs_rows_a_table_made_anew_reads_are_read_whatever_steps_they_have(
    shared_platform: LocalPlatform, tmp_path: Path, logged: str
) -> None:
    """A table made anew reads the run's rows a page at a time by step. A
    run that logged step 2**63 - 1 (SQLite's largest integer, the local
    platform's): asking for the steps after it was a 500 each time, so the
    rank's rows never shipped (retried until the close-out left them). A
    run with a page's worth of rows logged without a step (the local
    platform lists them first): the first page held no step, so nothing was
    read, and rank 0's key of step 0 was lost."""
    rows: list[tuple[dict[str, Any], int | None]] = [({"loss_r0": 1.0}, 0)]
    if logged == "a page of rows without a step first":
        rows += [({"tokens": float(i)}, None) for i in range(1000)]
    if logged == "the largest step":
        rows.append(({"loss_r0": 1.0}, (1 << 63) - 1))
    first, second = _second_rank_logs_after_a_wipe(shared_platform, tmp_path, rows)
    assert second.status is pr.RunStatus.COMPLETED and not second.errors, second.errors
    row = _platform_rows(shared_platform.data_dir, first.id)[0]
    assert {"loss_r0", "loss_r1"} <= set(row), row


def _refused_after_the_new_journal_was_made(*args: Any, **kwargs: Any) -> None:
    raise OSError(28, "No space left on device (injected)")


@pytest.mark.parametrize("where", ["creating it", "carrying entries over"])
def test_a_move_that_fails_after_the_old_journal_was_quiesced_keeps_every_record(
    shared_platform: LocalPlatform,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """The re-creation stops the old handle's mover and background sync
    first (they act by name at the path); one that failed after that (a full
    disk's ENOSPC as the new journal is made or filled) left them stopped
    while threads shipped on over that handle: nothing moved its spool into
    LMDB, so nothing shipped was compacted, and under an 8 MiB budget most
    of 2,900 records logged after it were dropped. And a journal that failed
    while its entries were carried over stayed at the path, the run's
    registration without its offsets, for a replay to send it all again.
    Now the old handle goes on as before the move, and the half-made journal
    is gone."""
    from primeruns.journal import rehome as rehome_mod

    lp = shared_platform
    episodes = workloads.gsm8k(3000)
    runs = tmp_path / "runs"
    with rt.sdk_env(lp.url, tmp_path / "home"), caplog.at_level(logging.WARNING, "primeruns"):
        os.environ["PRIME_RUNS_MAX_JOURNAL_BYTES"] = str(8 << 20)  # (sdk_env restores it)
        run = rt.eval_run(lp.url, runs)
        acked = _log(run, episodes[:30])
        if where == "creating it":
            monkeypatch.setattr(
                rehome_mod.Journal, "create", _refused_after_the_new_journal_was_made
            )
        else:
            monkeypatch.setattr(
                rehome_mod, "_copy_entries", _refused_after_the_new_journal_was_made
            )
        assert run.flush(timeout=60)
        shutil.rmtree(runs)
        acked += _log_until_said(run, episodes[2900:], caplog, "could not re-create")
        for i in range(30, 2900, 100):
            acked += _log(run, episodes[i : i + 100])
            run.flush(timeout=60)  # shipped, and so compactable
        flushed = run.flush(timeout=60)
        run.finish(timeout=60)
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert flushed
    assert run.dropped_records == 0
    assert run.status is pr.RunStatus.COMPLETED and not run.failed_records, run.failed_records
    assert stored == Counter(acked)  # (the workload's ids repeat past its problems)
    assert run.journal_path is not None and not run.journal_path.exists()
