"""What a listing reads of a journal's lock file while its owner writes it,
and how it names an owner in another PID namespace."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primeruns.exceptions import JournalLockedError
from primeruns.journal import EntryKind, Journal
from primeruns.journal.lock import LOCK_NAME, OwnerInfo, OwnerLock, read_owner

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
