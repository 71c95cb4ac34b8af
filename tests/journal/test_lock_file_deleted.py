"""A tmp cleaner deletes a live run's ``owner.lock`` alone (systemd-tmpfiles,
a cron ``find -delete`` of old files on scratch): its holder makes it again.

The flock lives on with the unnamed file, but nobody can ask it: the run read
"crashed" in ``ls`` and ``show``, ``gc --force`` offered to delete it, and
``replay`` or a requeued job could take over a journal still written. Its
producer (or uplink) notices within a second of its next write, and locks
a new file at the path (an idle run wakes for nothing, so it reads "crashed"
until then, as before).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import procs
import pytest

from primeruns.cli import main
from primeruns.exceptions import JournalLockedError
from primeruns.journal import Journal
from primeruns.journal.lock import LOCK_NAME, OwnerLock, lock_held, read_owner

_TESTS = Path(procs.__file__).resolve().parent

# An offline producer that logs one episode per line on its stdin.
_PRODUCER = r"""
import sys
sys.path.insert(0, sys.argv[2])
import workloads
import primeruns as pr

run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=sys.argv[1])
episodes = workloads.gsm8k(20)
run.log_episodes(episodes[:1])
print(run.journal_path, flush=True)
for i, _ in enumerate(sys.stdin, 1):
    run.log_episodes(episodes[i : i + 1])
    print("logged", flush=True)
"""


def _named_again(journal: Path, timeout: float = 60.0) -> None:
    """Until the lock file is there again with its owner's record (written
    once its flock is taken), or fail."""
    deadline = time.monotonic() + timeout
    while read_owner(journal) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{journal / LOCK_NAME} was never made again")
        time.sleep(0.05)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any] | list[Any]:
    """``primeruns ARGV --json``, in-process: its document."""
    capsys.readouterr()
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    found: dict[str, Any] | list[Any] = json.loads(out)
    return found


def _listed(capsys: pytest.CaptureFixture[str], runs: Path) -> dict[str, Any]:
    (row,) = _cli(capsys, "ls", "--runs-dir", str(runs))
    return dict(row)


def _collectible(capsys: pytest.CaptureFixture[str], runs: Path) -> list[str]:
    done = _cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "--force", "--dry-run")
    assert isinstance(done, dict)
    return [row["local_id"] for row in done["deleted"]]


def test_a_live_run_whose_lock_file_was_deleted_reads_alive_and_dead_once_killed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    proc = procs.start(
        [sys.executable, "-c", _PRODUCER, str(runs), str(_TESTS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    journal = Path(proc.stdout.readline().strip())
    assert _listed(capsys, runs)["outcome"] == "running"

    (journal / LOCK_NAME).unlink()
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "logged"
    _named_again(journal)
    assert _listed(capsys, runs)["outcome"] == "running"
    assert _collectible(capsys, runs) == []
    with pytest.raises(JournalLockedError):  # no replay, no requeue takes it over
        Journal.open(journal)

    procs.kill_job(proc)
    proc.wait(timeout=60)
    row = _listed(capsys, runs)
    assert row["outcome"] == "crashed"
    assert _collectible(capsys, runs) == [journal.name]
    Journal.open(journal).close()  # a requeued job takes the run over, as after any kill


def test_an_owner_makes_its_lock_file_again_at_its_next_write(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, local_id="run")
    try:
        (journal.path / LOCK_NAME).unlink()
        journal.set_meta("a", 1)  # an uplink's acknowledgement, written as this is
        _named_again(journal.path)
        owner = read_owner(journal.path)
        assert owner is not None and owner.pid == os.getpid()
        assert lock_held(journal.path)
    finally:
        journal.close()
    assert not lock_held(journal.path)
    Journal.open(journal.path).close()  # let go as ever


def test_a_lock_file_another_process_made_and_holds_is_left_to_it(tmp_path: Path) -> None:
    held = OwnerLock(tmp_path)
    try:
        (tmp_path / LOCK_NAME).unlink()
        taker = OwnerLock(tmp_path)  # a take-over in the gap, as a replay's
        try:
            assert held.restore() is False
            owner = read_owner(tmp_path)
            assert owner is not None and owner.file == taker.owner.file
        finally:
            taker.release()
        # Let go, the file is free: its old holder locks it and names itself there.
        assert held.restore() is True
        assert lock_held(tmp_path)
        owner = read_owner(tmp_path)
        assert owner is not None and owner.file == held.owner.file
        assert held.restore() is False  # named: one fstat, nothing done
    finally:
        held.release()
    assert not lock_held(tmp_path)
