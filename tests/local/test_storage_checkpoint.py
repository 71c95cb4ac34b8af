"""The local platform copies its WAL back into the database file from a
thread of its own (``local.checkpoint``): what a commit wrote reaches the
file without a request paying for the copy, the WAL does not grow without
bound if that thread is gone, and a closed database is one file again."""

from __future__ import annotations

import gc
import os
import shutil
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primeruns.local import checkpoint, storage
from primeruns.local.storage import Database

_HANG_GUARD_S = 30.0  # not a timing: only how long a broken test may hang
_NAME = "platform.sqlite3"


def _insert_runs(db: Database, first: int, count: int, size: int) -> None:
    """``count`` evaluations of ``size`` bytes of request each, one commit each."""
    for number in range(first, first + count):
        db.write_sync(
            lambda conn, number=number: conn.execute(
                "INSERT INTO evaluations (id, name, status, request, created_at, updated_at)"
                " VALUES (?, 'e', 'RUNNING', ?, 0, 0)",
                (f"eval_{number}", "x" * size),
            )
        )


def _rows_in_file_alone(data: Path, scratch: Path) -> int:
    """Rows of the database file itself, without its WAL: what was
    checkpointed; -1 when the copy caught a checkpoint writing the file (the
    round under way ends, and the caller looks again after it)."""
    scratch.mkdir(exist_ok=True)
    copy = scratch / _NAME
    shutil.copyfile(data / _NAME, copy)
    # immutable: the copy alone is read, no WAL or lock file made beside it.
    conn = sqlite3.connect(f"file:{copy}?immutable=1", uri=True)
    try:
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'evaluations'")
        if not tables.fetchone()[0]:
            return 0  # not even the schema copied yet
        return int(conn.execute("SELECT count(*) FROM evaluations").fetchone()[0])
    except sqlite3.DatabaseError:
        return -1
    finally:
        conn.close()


def test_commits_reach_the_database_file_without_the_writer_checkpointing(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    db = Database(data)
    try:
        # 2 MB in 40 commits: under the 1,000 pages at which SQLite's writer
        # copied the WAL itself, far under the backstop.
        _insert_runs(db, 0, 40, 50_000)
        checkpointer = db._checkpointer
        done = checkpointer.rounds
        # A round under way at the last commit may have begun before it:
        # the one that commit woke follows; wait round by round.
        while _rows_in_file_alone(data, tmp_path / "copy") < 40:
            now = checkpointer.wait_for_round(done, _HANG_GUARD_S)
            assert now > done, "no checkpoint came after the last commit"
            done = now
    finally:
        db.close()


def test_the_writer_still_checkpoints_if_the_thread_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "BACKSTOP_PAGES", 100)
    data = tmp_path / "data"
    db = Database(data)
    try:
        db._checkpointer.stop()
        _insert_runs(db, 0, 40, 50_000)  # ~500 pages of 4 KiB
        assert _rows_in_file_alone(data, tmp_path / "copy") > 0
        wal = (data / f"{_NAME}-wal").stat().st_size
        assert wal < 2 * 100 * 4096 + 200_000  # restarted from its start, not grown on
    finally:
        db.close()


def test_a_closed_database_is_one_file_holding_every_commit(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = Database(data)
    _insert_runs(db, 0, 30, 20_000)
    db.close()
    assert not (data / f"{_NAME}-wal").exists()
    assert _rows_in_file_alone(data, tmp_path / "copy") == 30
    again = Database(data)  # and it opens again with all of them
    try:
        count = again.read_sync(lambda c: c.execute("SELECT count(*) FROM evaluations").fetchone())
        assert count[0] == 30
    finally:
        again.close()


def test_a_database_dropped_unclosed_ends_its_thread_and_leaves_one_file(tmp_path: Path) -> None:
    """A Database nobody closed (a test's, say) goes with its last reference,
    as its one connection did: the thread does not outlive it holding a
    connection that keeps the WAL there for the process's lifetime."""
    data = tmp_path / "data"
    db = Database(data)
    _insert_runs(db, 0, 3, 1_000)
    thread = db._checkpointer._thread
    del db
    gc.collect()
    thread.join(_HANG_GUARD_S)
    assert not thread.is_alive()
    assert not (data / f"{_NAME}-wal").exists()
    assert _rows_in_file_alone(data, tmp_path / "copy") == 3


def _wal_restarts(wal: Path) -> int:
    """How many times the WAL was begun anew from its start: the checkpoint
    sequence number of its header (big-endian, bytes 12 to 16)."""
    try:
        with open(wal, "rb") as f:
            header = f.read(16)
    except FileNotFoundError:
        return 0
    return int.from_bytes(header[12:16], "big") if len(header) == 16 else 0


def test_the_wal_starts_over_though_a_commit_came_during_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint copies what was committed before it began; if a commit
    came meanwhile the WAL is not all copied, and only a WAL all copied is
    begun anew by the next commit. Under writes that never pause one always
    does: the thread alone never let the WAL start over, and it grew to the
    backstop (64 MiB), where the writer's own checkpoint copied what was left
    in some request's commit. The round is driven here by hand, a commit
    landing during its first copy, so no scheduling decides the outcome."""
    monkeypatch.setattr(storage, "BACKSTOP_PAGES", 1_000_000)  # the thread alone
    monkeypatch.setattr(checkpoint, "RESTART_PAGES", 50)
    handed: list[sqlite3.Connection] = []

    def not_started(
        target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()
    ) -> threading.Thread:
        handed.extend(args)  # the thread's connection, to run its round here
        idle = threading.Thread(target=lambda: None, name=name, daemon=True)
        idle.start()
        return idle

    monkeypatch.setattr(checkpoint, "start_daemon", not_started)
    data = tmp_path / "data"
    db = Database(data)
    wal = data / f"{_NAME}-wal"
    [conn] = handed
    first_copy = checkpoint._passive
    copies = 0

    reader = sqlite3.connect(data / _NAME, isolation_level=None)

    def copy_with_a_commit_meanwhile(c: sqlite3.Connection) -> tuple[bool, int]:
        nonlocal copies
        copies += 1
        if copies > 1:
            return first_copy(c)
        # A request commits while the first copy runs: that copy cannot take
        # it. (A read held open from before the commit keeps the copy to what
        # came before it, as a copy that began before the commit is.)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM evaluations").fetchone()
        _insert_runs(db, 1_000, 1, 50_000)
        try:
            return first_copy(c)
        finally:
            reader.execute("COMMIT")

    monkeypatch.setattr(checkpoint, "_passive", copy_with_a_commit_meanwhile)
    try:
        _insert_runs(db, 0, 20, 50_000)  # ~250 pages: past RESTART_PAGES
        before = _wal_restarts(wal)
        db._checkpointer._round(conn)
        _insert_runs(db, 2_000, 1, 1_000)  # the next commit
        assert _wal_restarts(wal) > before
    finally:
        reader.close()
        conn.close()
        db.close()


@pytest.mark.parametrize("name", [_NAME, f"{_NAME}-wal"])
def test_the_thread_opens_no_file_by_name_after_the_files_were_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The SQLite files are checked (never a link) when the Database opens;
    a connection the thread opened by name whenever it got to run would follow
    whatever stood at that name by then, and create a file that was gone."""
    deferred: list[threading.Thread] = []

    def start_later(
        target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()
    ) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        deferred.append(thread)
        return thread

    monkeypatch.setattr(checkpoint, "start_daemon", start_later)
    data = tmp_path / "data"
    db = Database(data)
    try:
        elsewhere = tmp_path / "elsewhere.sqlite3"
        os.replace(data / name, tmp_path / "moved")
        os.symlink(elsewhere, data / name)  # planted after the check
        [thread] = deferred
        thread.start()
        db.write_sync(lambda conn: conn.execute("SELECT 1"))
        db._checkpointer.wait_for_round(0, _HANG_GUARD_S)
        assert not elsewhere.exists()
    finally:
        db.close()


def test_a_checkpoint_failing_round_after_round_is_said_once_until_it_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk fails every round, and a busy server has one every 50 ms:
    the log says so once, and once more when checkpoints work again."""
    failing = True
    real = checkpoint._passive

    def passive(conn: sqlite3.Connection) -> tuple[bool, int]:
        if failing:
            raise sqlite3.OperationalError("database or disk is full")
        return real(conn)

    monkeypatch.setattr(checkpoint, "_passive", passive)
    caplog.set_level("WARNING", logger="primeruns.local")
    db = Database(tmp_path / "data")
    try:
        done = 0
        for number in range(4):  # four rounds, each woken by a commit and waited for
            _insert_runs(db, number, 1, 1_000)
            done = db._checkpointer.wait_for_round(done, _HANG_GUARD_S)
        failing = False
        _insert_runs(db, 10, 1, 1_000)
        db._checkpointer.wait_for_round(done, _HANG_GUARD_S)
    finally:
        db.close()
    said = [r.getMessage() for r in caplog.records if "WAL checkpoints" in r.getMessage()]
    assert said == [
        "WAL checkpoints fail (the writer's own go on): database or disk is full",
        "WAL checkpoints work again (after: database or disk is full)",
    ]
