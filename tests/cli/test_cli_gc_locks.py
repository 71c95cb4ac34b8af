"""``primeruns gc`` deletes the lock files under ``<runs dir>/.primary/``
(``ranks``: a run's first attacher and each launcher rank hold one) that no
live process holds, and never one a live process holds. Without it they grew
by one or more per run, forever."""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from sdk_helpers import point_at

from primeruns import ranks


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = point_at(monkeypatch, tmp_path, None)
    folder.mkdir(mode=0o700, exist_ok=True)
    yield folder
    _exit_of_this_process()


def _exit_of_this_process() -> None:
    """What this process's exit does to the locks it holds: lets them go."""
    ranks._after_fork_in_child()


def _locks(runs: Path) -> list[Path]:
    return sorted((runs / ".primary").glob("*.lock"))


def _held(path: Path) -> bool:
    """Whether a process holds the lock file at ``path`` (as an attacher finds it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _gc(capsys: pytest.CaptureFixture[str], runs: Path, *more: str) -> dict[str, Any]:
    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--json", *more)
    assert code == 0, out
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_gc_deletes_the_lock_files_no_live_process_holds_and_a_dry_run_names_them(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two past runs: one attached first here, one with a launcher rank too.
    assert ranks._first_to_attach(runs, "run-a", "20261201-000000-aaaaaaaa")
    assert ranks._first_to_attach(runs, "run-b", "20261201-000001-bbbbbbbb")
    assert ranks._first_to_attach(runs, ranks._rank_key("run-b", 1), "20261201-000001-bbbbbbbb")
    _exit_of_this_process()
    past = _locks(runs)
    assert len(past) == 3
    # A live run: its creator holds its lock.
    ranks.claim_created(runs, "run-live", "20261201-000002-cccccccc")
    (live,) = set(_locks(runs)) - set(past)

    dry = _gc(capsys, runs, "--dry-run")
    assert sorted(dry["primary_locks"]) == [str(p) for p in past]
    assert _locks(runs) == sorted([*past, live])  # a dry run deletes nothing
    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--dry-run")
    assert code == 0 and "would delete 3 lock file(s)" in out, out

    report = _gc(capsys, runs)
    assert sorted(report["primary_locks"]) == [str(p) for p in past]
    assert _locks(runs) == [live] and _held(live)  # the live run's, still held

    _exit_of_this_process()
    assert _gc(capsys, runs)["primary_locks"] == [str(live)]
    assert _locks(runs) == []
    # A run attached after gc takes its lock anew.
    assert ranks._first_to_attach(runs, "run-a", "20261201-000004-eeeeeeee")
    assert len(_locks(runs)) == 1


def test_an_attacher_whose_lock_file_gc_deleted_as_it_opened_it_takes_the_new_one(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attacher opened the run's lock file, and gc (finding it free)
    deleted it before the attacher locked it. Locked, that file is nobody's:
    a second attacher opening the path makes a new one and would be first
    too (two primaries closing the run). The attacher looks that the path
    still names the file it locked, and takes the one it names."""
    assert ranks._first_to_attach(runs, "run-a", "20261201-000000-aaaaaaaa")
    _exit_of_this_process()
    (path,) = _locks(runs)
    real = fcntl.flock
    deleted: list[Path] = []

    def gc_first(fd: int, how: int) -> None:
        if not deleted and how == fcntl.LOCK_EX | fcntl.LOCK_NB:
            deleted.append(path)
            path.unlink()  # gc, between the attacher's open and its lock
        real(fd, how)

    monkeypatch.setattr(fcntl, "flock", gc_first)
    assert ranks._first_to_attach(runs, "run-a", "20261201-000001-bbbbbbbb")
    monkeypatch.setattr(fcntl, "flock", real)
    assert deleted == [path]
    assert _locks(runs) == [path] and _held(path)  # a second attacher is not first


def test_an_attacher_that_finds_the_lock_held_by_gc_looking_at_it_is_still_first(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc takes a free lock file for a moment (that proves nobody holds it)
    before it deletes it. An attacher trying the lock just then found it
    held, and took itself for a later attacher: a run with no primary on
    this host, or a rank without its rank. It looks again once gc is done."""
    assert ranks._first_to_attach(runs, "run-a", "20261201-000000-aaaaaaaa")
    _exit_of_this_process()
    (path,) = _locks(runs)
    real = fcntl.flock
    refused = threading.Event()

    def watched(fd: int, how: int) -> None:
        try:
            real(fd, how)
        except OSError:
            if threading.current_thread() is attacher:
                refused.set()  # its try while gc holds the file
            raise

    # gc, mid-look: the folder's lock, then the file's.
    folder = os.open(runs / ".primary", os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(folder, fcntl.LOCK_EX)
    looked_at = os.open(path, os.O_RDONLY)
    fcntl.flock(looked_at, fcntl.LOCK_EX | fcntl.LOCK_NB)
    monkeypatch.setattr(fcntl, "flock", watched)
    first: list[bool] = []
    attacher = threading.Thread(
        target=lambda: first.append(
            ranks._first_to_attach(runs, "run-a", "20261201-000001-bbbbbbbb")
        )
    )
    try:
        attacher.start()
        assert refused.wait(timeout=60)
        path.unlink()  # found free: gc deletes it, then lets go
    finally:
        os.close(looked_at)
        os.close(folder)
    attacher.join(timeout=60)
    monkeypatch.setattr(fcntl, "flock", real)
    assert first == [True]
    assert _locks(runs) == [path] and _held(path)


def test_a_symbolic_link_among_lock_files_and_step_tables_is_left_and_stops_nothing(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runs directory is the user's own, but a link there is never
    followed: one named as a lock file or a step table made gc fail on it
    (ELOOP), the lock files after it kept, and with ``--json`` nothing said
    of why; or stop with a traceback's message after deleting journals."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept.lock").write_text("")
    sqlite3.connect(elsewhere / "kept.sqlite3").close()
    assert ranks._first_to_attach(runs, "run-z", "20261201-000000-aaaaaaaa")
    _exit_of_this_process()
    (free,) = _locks(runs)
    linked_lock = runs / ".primary" / ("0" * 32 + ".lock")
    linked_lock.symlink_to(elsewhere / "kept.lock")
    (runs / ".steps").mkdir(mode=0o700)
    linked_table = runs / ".steps" / ("0" * 32 + ".sqlite3")
    linked_table.symlink_to(elsewhere / "kept.sqlite3")

    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["primary_locks"] == [str(free)] and report["step_tables"] == []
    assert linked_lock.is_symlink() and linked_table.is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["kept.lock", "kept.sqlite3"]


def test_gc_deletes_the_run_index_markers_of_the_journals_it_deletes(
    capsys: pytest.CaptureFixture[str], runs: Path
) -> None:
    """Each journal ``init()`` makes leaves empty files in the runs
    directory's index by run (``run_index``): they go with their journal."""
    import primeruns as pr
    from primeruns import run_index

    for run_id in ("run-1", "run-2"):
        pr.init(mode="offline", id=run_id, runs_dir=runs, primary=False).finish()
    index = runs / run_index.FOLDER
    assert len([p for p in index.rglob("*") if p.is_file()]) == 4
    _gc(capsys, runs, "--older-than", "0", "--force")
    assert list(index.iterdir()) == []
