"""What a listing reads of a journal's lock file while its owner writes it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primeruns.journal import EntryKind, Journal
from primeruns.journal.lock import LOCK_NAME, OwnerInfo, OwnerLock, read_owner


def _journal(runs: Path) -> Path:
    with Journal.create(runs) as journal:
        journal.append(EntryKind.METRICS, [b'{"step": 1}'])
        return journal.path


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
