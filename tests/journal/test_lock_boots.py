"""A copy of a live journal at the very host name and path its writer used
(two containers named "localhost", or a requeued job's reused pod name, both
keeping runs at /scratch/runs) is told from the original by the lock file its
owner's record names, and by the boot it names, never read "crashed"; the
original itself, its writer gone, still reads dead, after a restart too."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from primeruns.journal import EntryKind, Journal, list_journals
from primeruns.journal.lock import LOCK_NAME, OwnerLock, owner_alive, read_owner
from primeruns.journal.origin import ORIGIN_FILE, Origin, boot_id

_NS = os.stat("/proc/self/ns/pid").st_ino


def _journal(runs: Path) -> Path:
    with Journal.create(runs) as journal:
        journal.append(EntryKind.METRICS, [b'{"step": 1}'])
        return journal.path


def _record(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((path / LOCK_NAME).read_text())
    return record


def _as_if_written_at(copy: Path) -> None:
    """Make ``copy``'s origin name its own path: the copy lies where the
    original lay on its writer's machine (another container's filesystem)."""
    origin = Origin.read_beside(copy)
    assert origin is not None
    moved = {**origin.to_json(), "path": str(copy.absolute())}
    (copy / ORIGIN_FILE).write_text(json.dumps(moved))


def test_a_copy_at_its_writers_own_path_and_host_name_reads_alive_while_the_original_is_written(
    tmp_path: Path,
) -> None:
    """Its writer in another container (another PID namespace) holds the
    original's flock; the copy's flock is nobody's. Before, the copy's host
    name and path made it the original, its free flock said "dead": ls and
    the dashboard called the live run crashed."""
    path = _journal(tmp_path / "runs")
    held = OwnerLock(path)  # the writer, in its container
    try:
        record = _record(path)
        (path / LOCK_NAME).write_text(json.dumps({**record, "pid": 1, "pid_ns": _NS + 1}))
        copy = tmp_path / "scratch" / "runs" / path.name
        shutil.copytree(path, copy)
        _as_if_written_at(copy)
        assert owner_alive(read_owner(copy), copy) is True
        (row,) = list_journals(copy.parent)
        assert row.owner_alive is True
        assert list_journals(copy.parent, skip_live=True) == []
        origin = Origin.read_beside(copy)
        assert origin is not None and not origin.is_original(copy)
        assert origin.producer_state() == "unknown"  # its flock is not the writer's
    finally:
        held.release()
    assert record.get("boot") == boot_id() and record.get("file")  # a writer names both
    # The original, its writer gone (its record kept, as a killed writer's is):
    (path / LOCK_NAME).write_text(json.dumps({**record, "pid": 1, "pid_ns": _NS + 1}))
    assert owner_alive(read_owner(path), path) is False
    # ... and after this machine restarted (another boot named, the same file).
    (path / LOCK_NAME).write_text(json.dumps({**record, "boot": "the boot before a restart"}))
    assert owner_alive(read_owner(path), path) is False
    (row,) = list_journals(path.parent)
    assert row.owner_alive is False


def test_a_copy_from_another_machine_of_this_host_name_is_not_judged_by_a_pid_of_this_one(
    tmp_path: Path,
) -> None:
    """Two machines named alike, both writing in their first PID namespace
    (whose inode is the same number on every Linux): the pid the copy's
    record names is the other machine's. Before, gone here (or of another
    start time), it read dead: the live run's copy "crashed"."""
    path = _journal(tmp_path / "runs")
    held = OwnerLock(path)
    record = _record(path)
    held.release()
    other = {
        **record,
        "pid": os.getpid(),
        "proc_start": 1,  # not this process's start: that pid here is another process
        "pid_ns": _NS,
        "boot": "the other machine's boot",
    }
    copy = tmp_path / "login" / path.name
    shutil.copytree(path, copy)
    (copy / LOCK_NAME).write_text(json.dumps(other))
    origin = Origin.read_beside(copy)
    assert origin is not None  # written on that machine: in its boot
    (copy / ORIGIN_FILE).write_text(json.dumps({**origin.to_json(), "boot": other["boot"]}))
    assert owner_alive(read_owner(copy), copy) is True
    (row,) = list_journals(copy.parent)
    assert row.owner_alive is True
    assert "another machine of that name" in read_owner(copy).describe()  # type: ignore[union-attr]


def test_a_copy_taken_before_its_journal_was_re_made_reads_dead_once_its_writer_is(
    tmp_path: Path,
) -> None:
    """A scratch wipe deleted a live run's folder and the producer re-made it
    at its path (``rehome``): the same journal, in a new folder its origin
    names. A copy taken before the wipe names the old folder; its writer, in
    another container of this host, is judged by the original's flock
    (``Origin.producer_state``), which the re-made journal's lock file
    holds. Taken for another folder lying at the original's path, the copy
    read alive for good once its writer was gone (listed running, never
    closed as crashed by sync)."""
    from primeruns.journal.rehome import rehome

    old = Journal.create(tmp_path / "runs")
    old.append(EntryKind.METRICS, [b'{"step": 1}'])
    copy = tmp_path / "login" / old.path.name
    shutil.copytree(old.path, copy)
    record: dict[str, Any] = json.loads((copy / LOCK_NAME).read_text())
    # Its writer, as the copy names it, runs in another container of this host.
    (copy / LOCK_NAME).write_text(json.dumps({**record, "pid": 1, "pid_ns": _NS + 1}))
    shutil.rmtree(old.path)
    new = rehome(old)
    try:
        origin = Origin.read_beside(copy)
        assert origin is not None
        assert origin.producer_state() == "alive"  # the re-made journal's lock is held
        assert owner_alive(read_owner(copy), copy) is True
    finally:
        new.close()
        old.close()
    assert origin.producer_state() == "dead"
    assert owner_alive(read_owner(copy), copy) is False
