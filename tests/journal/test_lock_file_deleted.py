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
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import procs
import pytest
from sdk_helpers import wait_for

from primeruns.cli import main
from primeruns.exceptions import JournalLockedError
from primeruns.journal import EntryKind, Journal
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


def test_an_unexpected_error_making_it_again_ends_no_later_sync_or_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The background sync looks at the lock file after each second of
    writes (``OwnerLock.restore``). An exception no one foresaw there (a bug)
    ended its thread: the spool and LMDB went unsynced, and a lock file
    deleted later was never made again, for the rest of the run. It is
    logged once, and the next writes are synced and the file made again."""
    real = OwnerLock.restore
    raised: list[int] = []

    def restore(self: OwnerLock) -> bool:
        if len(raised) < 2:
            raised.append(1)
            raise RuntimeError("a bug in restore")
        return real(self)

    synced_by: list[str] = []
    real_sync = os.fdatasync

    def fdatasync(fd: int) -> None:
        real_sync(fd)
        synced_by.append(threading.current_thread().name)

    monkeypatch.setattr(OwnerLock, "restore", restore)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    journal = Journal.create(tmp_path, local_id="run")
    try:
        with caplog.at_level(logging.WARNING, logger="primeruns.journal"):
            for n in range(2):
                journal.append(EntryKind.EPISODE, [b'{"n":%d}' % n])
                wait_for(lambda n=n: len(raised) > n, timeout=20, what="a pass's restore")
            (journal.path / LOCK_NAME).unlink()
            synced_by.clear()
            journal.append(EntryKind.EPISODE, [b'{"n":2}'])
            _named_again(journal.path, timeout=20)
            assert "primeruns-journal-run" in synced_by  # the spool, synced after the write
        warned = [r for r in caplog.records if "could not restore owner.lock" in r.getMessage()]
        assert len(warned) == 1 and "a bug in restore" in warned[0].getMessage()
        assert lock_held(journal.path)
    finally:
        journal.close()


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


# The uplink's side of a shared lock (``OwnerLock.inherit``), in a process of
# its own: each line on its stdin makes it look at the lock file once.
_PARTNER = r"""
import os, sys
from pathlib import Path
from primeruns.journal.lock import OwnerLock

lock = OwnerLock.inherit(Path(sys.argv[1]), int(sys.argv[2]))
print("ready", flush=True)
for _ in sys.stdin:
    print(lock.restore(), flush=True)
"""


def _partner(held: OwnerLock) -> subprocess.Popen[str]:
    """A process sharing ``held`` as an uplink does, once it says it is ready."""
    fd = held.share()
    partner = procs.start(
        [sys.executable, "-c", _PARTNER, str(held.path.parent), str(fd)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(fd,),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert partner.stdout is not None and partner.stdout.readline().strip() == "ready"
    held.add_helper(partner.pid)  # named as its producer names its uplink
    return partner


def _ask(partner: subprocess.Popen[str]) -> str:
    """What ``partner``'s ``restore`` answers now."""
    assert partner.stdin is not None and partner.stdout is not None
    partner.stdin.write("\n")
    partner.stdin.flush()
    return str(partner.stdout.readline().strip())


def _let_go(partner: subprocess.Popen[str]) -> None:
    """``partner`` closes its lock with its process, as an uplink done."""
    assert partner.stdin is not None
    partner.stdin.close()
    partner.wait(timeout=60)


def _made_again_by(partner: subprocess.Popen[str], directory: Path) -> None:
    """Delete the lock file; ``partner`` makes it again, and holds it alone."""
    (directory / LOCK_NAME).unlink()
    assert _ask(partner) == "True"


def _held_within(directory: Path, timeout: float = 60.0) -> bool:
    """Whether the lock file at ``directory`` is held at some look until ``timeout``."""
    deadline = time.monotonic() + timeout
    while not lock_held(directory):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("ending", ["killed", "let go"])
def test_the_partner_that_outlives_the_one_that_made_the_file_again_holds_it(
    tmp_path: Path, ending: str
) -> None:
    # The producer and its uplink share the unnamed file; the uplink makes it
    # again first. The producer, still writing, holds only the unnamed one:
    # once the uplink is gone (SIGKILLed, or done), the file at the path is
    # its own, not free for a requeued job, a replay or gc while it writes.
    held = OwnerLock(tmp_path)
    try:
        partner = _partner(held)
        _made_again_by(partner, tmp_path)  # the uplink holds the new file
        assert held.restore() is False  # held by its partner: left to it meanwhile
        with pytest.raises(JournalLockedError):
            OwnerLock(tmp_path)
        if ending == "killed":
            procs.kill_job(partner)
            partner.wait(timeout=60)
        else:
            _let_go(partner)
        assert _held_within(tmp_path), "the file at the path was left free under a live holder"
        with pytest.raises(JournalLockedError):  # no take-over of a run still written
            OwnerLock(tmp_path)
        owner = read_owner(tmp_path)
        assert owner is not None and owner.pid == os.getpid()
        assert owner.file == held.owner.file
    finally:
        held.release()
    assert not lock_held(tmp_path)
    OwnerLock(tmp_path).release()  # let go as ever


def test_a_link_or_pipe_planted_where_the_lock_file_was_is_left(tmp_path: Path) -> None:
    # The background sync asks at each write: an error out of it ended its
    # thread (no more syncs, moves or reserve); a link is never followed.
    held = OwnerLock(tmp_path)
    try:
        path = tmp_path / LOCK_NAME
        path.unlink()
        path.symlink_to(tmp_path / "elsewhere")
        assert held.restore() is False
        assert path.is_symlink() and not (tmp_path / "elsewhere").exists()
        path.unlink()
        os.mkfifo(path)
        assert held.restore() is False
        assert not lock_held(tmp_path)  # a pipe is nobody's lock file, ours neither
        path.unlink()
        assert held.restore() is True  # a plain file again, at the next look
        assert lock_held(tmp_path)
    finally:
        held.release()


def test_an_uplink_shipping_on_after_its_producer_holds_the_file_it_made_again(
    tmp_path: Path,
) -> None:
    # The producer makes the file again first, then finishes (or is killed)
    # while its uplink still ships: the uplink holds the file from then on,
    # and the run reads as shipping, not as a crashed run free to take over.
    held = OwnerLock(tmp_path)
    partner = _partner(held)
    try:
        (tmp_path / LOCK_NAME).unlink()
        assert held.restore() is True
        assert _ask(partner) == "False"  # its producer's, left to it
    finally:
        held.release()  # the producer is done: the file is its uplink's
    assert _held_within(tmp_path), "the file at the path was left free under its uplink"
    with pytest.raises(JournalLockedError):
        OwnerLock(tmp_path)
    owner = read_owner(tmp_path)
    assert owner is not None and owner.producer_done and owner.helper_pid == partner.pid
    _let_go(partner)
    assert not lock_held(tmp_path)
    OwnerLock(tmp_path).release()


def test_a_child_forked_while_its_parent_waits_for_the_file_keeps_no_copy(
    tmp_path: Path,
) -> None:
    # A training loop's fork (a data loader's worker) while this process waits
    # for its partner's file: a copy in the child would hold the flock the
    # parent's thread takes, past the parent's death (a dead run read alive).
    held = OwnerLock(tmp_path)
    partner = _partner(held)
    try:
        _made_again_by(partner, tmp_path)
        assert held.restore() is False
        waiting = held._waiting
        assert waiting is not None  # its thread waits for the partner's flock
        assert not procs.held_in_forked_child(waiting, tmp_path / LOCK_NAME)
    finally:
        _let_go(partner)
        held.release()


def test_a_descriptor_shared_before_the_file_is_made_again_holds_the_new_one(
    tmp_path: Path,
) -> None:
    # ``share`` gives the producer's descriptor to the uplink's spawn, which
    # passes it a moment later: a restore in between closed it, and the
    # uplink got no lock (or the file opened next under that number).
    held = OwnerLock(tmp_path)
    try:
        fd = held.share()
        (tmp_path / LOCK_NAME).unlink()
        assert held.restore() is True
        found = os.fstat(fd)
        owner = read_owner(tmp_path)
        assert owner is not None and owner.file == (found.st_dev, found.st_ino)
        partner = _partner(held)  # spawned with that number, as the uplink is
    finally:
        held.release()
    assert lock_held(tmp_path)  # its uplink holds the very file
    _let_go(partner)
    assert not lock_held(tmp_path)
