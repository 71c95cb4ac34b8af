"""Whether a journal's owner still writes it, as listings tell (``ls``,
``show``, ``gc``, the dashboard): the lock file names the owner, but is
anyone's to write, and a copy of a journal holds no flock; what a listing
reads of that file while its owner writes it; and how it names an owner in
another PID namespace."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primeruns.exceptions import JournalLockedError
from primeruns.journal import EntryKind, Journal, list_journals
from primeruns.journal.lock import LOCK_NAME, OwnerInfo, OwnerLock, owner_alive, read_owner

_NS = os.stat("/proc/self/ns/pid").st_ino


def _journal(runs: Path) -> Path:
    with Journal.create(runs) as journal:
        journal.append(EntryKind.METRICS, [b'{"step": 1}'])
        return journal.path


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _naming(pid: int, **more: Any) -> dict[str, Any]:
    """A lock file's record naming process ``pid`` of this host as it runs."""
    record = {"pid": pid, "host": socket.gethostname(), "started": 0.0}
    return {**record, "proc_start": _start_ticks(pid), "pid_ns": _NS, **more}


def test_a_lock_file_naming_a_live_process_that_is_not_the_writer_reads_dead(
    tmp_path: Path,
) -> None:
    """A lock file planted (or left) naming a live process of this host
    with its start time, the user's shell say, on a journal nobody holds:
    before, ls and the dashboard said "running" for as long as that process
    lived, gc kept the journal for good, and the crashed-run hint left it
    out. Where the journal is its original, its flock says."""
    runs = tmp_path / "runs"
    path = _journal(runs)
    (path / LOCK_NAME).write_text(json.dumps(_naming(os.getppid())))
    assert owner_alive(read_owner(path), path) is False
    (row,) = list_journals(runs)
    assert row.owner_alive is False
    assert [info.path for info in list_journals(runs, skip_live=True)] == [path]
    # Its writer, holding the lock, is alive (the file names it).
    with Journal.open(path, owner=True):
        assert owner_alive(read_owner(path), path) is True
        (row,) = list_journals(runs)
        assert row.owner_alive is True


def test_a_copy_of_a_live_journal_on_this_host_reads_alive_though_it_holds_no_flock(
    tmp_path: Path,
) -> None:
    """A runs directory copied mid-run (rsync, ``cp -a``) to another path of
    the same machine: the copy's flock is nobody's, yet its producer writes
    the original on; read "crashed", a sync or a requeue closed it out."""
    runs = tmp_path / "runs"
    path = _journal(runs)
    with Journal.open(path, owner=True):  # its producer, writing on
        copy = tmp_path / "login" / path.name
        shutil.copytree(path, copy)
        assert owner_alive(read_owner(copy), copy) is True
        (row,) = list_journals(copy.parent)
        assert row.owner_alive is True


def test_a_copy_of_a_journal_written_in_another_pid_namespace_reads_its_originals_flock(
    tmp_path: Path,
) -> None:
    """A journal written in another container of this host (its lock file
    names pid 1 of its PID namespace) copied to another path of the host:
    the copy's own flock told "crashed" while the writer logged on; the
    original's flock tells."""
    runs = tmp_path / "runs"
    path = _journal(runs)
    container = json.dumps({**_naming(1), "pid_ns": _NS + 1})
    copy = tmp_path / "login" / path.name
    held = OwnerLock(path)  # that writer: one kernel, so one flock
    try:
        (path / LOCK_NAME).write_text(container)
        shutil.copytree(path, copy)
        assert owner_alive(read_owner(copy), copy) is True
        (row,) = list_journals(copy.parent)
        assert row.owner_alive is True
    finally:
        held.release()
    assert read_owner(copy) is not None  # the copy's file names it still
    assert owner_alive(read_owner(copy), copy) is False  # its writer gone


def _every_state_read(
    monkeypatch: pytest.MonkeyPatch, path: Path
) -> Callable[[], list[OwnerInfo | None]]:
    """What a listing reads of ``path``'s lock file after each write or cut
    of it (a listing may look at any moment between two of them)."""
    seen: list[OwnerInfo | None] = []
    for name in ("pwrite", "ftruncate", "write"):
        real = getattr(os, name)

        def then_read(*args: Any, real: Any = real) -> Any:
            result = real(*args)
            seen.append(read_owner(path))
            return result

        monkeypatch.setattr(os, name, then_read)
    return lambda: seen


def test_a_new_owner_writing_its_record_never_leaves_the_lock_file_empty_or_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay or requeue taking a crashed journal whose lock file names
    its dead writer (a longer record: an uplink, a command): the file was
    cut to nothing, then written, and a listing between read "no owner"."""
    path = _journal(tmp_path / "runs")
    dead = {"pid": 2**22 - 1, "host": "h" * 200, "started": 1.0, "proc_start": 7}
    before = {**dead, "helper_pid": 2**22 - 2, "helper_start": 9, "command": "sync"}
    (path / LOCK_NAME).write_text(json.dumps(before))
    states = _every_state_read(monkeypatch, path)
    lock = OwnerLock(path)
    monkeypatch.undo()
    try:
        assert states() and None not in states()
        assert {info.pid for info in states() if info is not None} <= {dead["pid"], os.getpid()}
        # The shorter record leaves nothing of the longer one behind.
        assert json.loads((path / LOCK_NAME).read_bytes()) == lock.owner.to_json()
        assert (path / LOCK_NAME).read_bytes() == json.dumps(lock.owner.to_json()).encode()
    finally:
        lock.release()


def test_an_uplink_named_again_with_a_shorter_record_is_never_read_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer names its uplink again when it starts a new one: the new
    record, shorter, was written over the old and then cut, and a listing
    between read the new one with the old one's end (not JSON): no owner."""
    path = _journal(tmp_path / "runs")
    lock = OwnerLock(path)
    try:
        lock.add_helper(os.getpid())
        longer = (path / LOCK_NAME).read_bytes()
        states = _every_state_read(monkeypatch, path)
        lock.add_helper(1)
        monkeypatch.undo()
        written = (path / LOCK_NAME).read_bytes()
        assert len(written) < len(longer)  # what this case is about
        assert states() and None not in states()
        assert json.loads(written)["helper_pid"] == 1
        assert written == json.dumps(json.loads(written)).encode()  # no tail, no padding
    finally:
        lock.release()


def test_an_owner_in_another_pid_namespace_is_never_described_by_a_pid_of_this_one(
    tmp_path: Path,
) -> None:
    """Its pid (1, mostly) names another process here, or none: told "pid 1
    on <this host>", a user killed the wrong process."""
    host = socket.gethostname()
    there = OwnerInfo(1, host, 0.0, 1, pid_ns=_NS + 1)
    assert "another PID namespace" in there.describe()
    assert f"pid 1 on {host}" not in there.describe()
    uplink = OwnerInfo(1, host, 0.0, 1, helper_pid=7, producer_done=True, pid_ns=_NS + 1)
    assert "another PID namespace" in uplink.describe()
    assert "pid 7 on" not in uplink.describe() and "pid 1 on" not in uplink.describe()
    # One of this namespace, or of a file naming none, is described by its pid as ever.
    assert OwnerInfo(1, host, 0.0, 1, pid_ns=_NS).describe() == f"pid 1 on {host}"
    assert OwnerInfo(1, host, 0.0, 1).describe() == f"pid 1 on {host}"

    path = _journal(tmp_path / "runs")
    held = OwnerLock(path)
    try:
        (path / LOCK_NAME).write_text(json.dumps({**_naming(1), "pid_ns": _NS + 1}))
        with pytest.raises(JournalLockedError) as refused:
            OwnerLock(path)
        assert "another PID namespace" in str(refused.value)
        assert f"pid 1 on {host}" not in str(refused.value)
    finally:
        held.release()
