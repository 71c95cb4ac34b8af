"""Whether a journal's writer lives is told by its owner lock (the flock),
not by the pid its lock file names: the file is anyone's to write."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from primeruns.journal import EntryKind, Journal, list_journals
from primeruns.journal import lock as lock_module
from primeruns.journal.lock import LOCK_NAME, OwnerLock, owner_alive, read_owner


def _proc_start(pid: int) -> int:
    start = lock_module._proc_start(pid)
    assert start is not None
    return start


def _dead_journal(runs: Path) -> Path:
    """A journal whose writer is gone (closed: its lock file names nobody)."""
    with Journal.create(runs) as journal:
        journal.append(EntryKind.METRICS, [b'{"step": 1}'])
        return journal.path


def _filled(key: str, value: object) -> object:
    """A planted field's value: a pid or a start time of this process or pid 1."""
    if value == "this test's":
        return os.getpid() if key.endswith("pid") else _proc_start(os.getpid())
    return _proc_start(1) if value == "pid 1's" else value


def _plant(directory: Path, **owner: object) -> None:
    """A lock file naming ``owner``, written as anyone on the disk could."""
    (directory / LOCK_NAME).write_text(json.dumps({"started": 0.0, **owner}))


@pytest.mark.parametrize(
    "owner",
    [
        # A live pid that is not the writer, its start time right (as a copy
        # of this boot's pid 1 has it, or one planted from /proc) or absent.
        pytest.param({"pid": 1, "proc_start": "pid 1's"}, id="pid-1-with-its-start-time"),
        pytest.param({"pid": "this test's", "proc_start": None}, id="live-pid-no-start-time"),
        pytest.param({"pid": "this test's", "proc_start": "this test's"}, id="this-process"),
        pytest.param({"pid": "this test's", "proc_start": 1}, id="live-pid-wrong-start-time"),
        pytest.param(
            {"pid": "this test's", "helper_pid": 1, "helper_start": "pid 1's"},
            id="its-uplink-named-as-pid-1",
        ),
        # Another host's writer, on a local disk: a copy of its journal.
        pytest.param({"pid": 1, "host": "another-host"}, id="another-host"),
    ],
)
def test_a_lock_file_naming_a_live_process_that_holds_no_lock_reads_dead(
    owner: dict[str, object], tmp_path: Path
) -> None:
    """Before, a live pid was proof enough (or any other host's name was):
    the journal read "running" for ever, so ``gc`` kept it and a requeue or a
    replay waited for a writer that was gone."""
    path = _dead_journal(tmp_path / "runs")
    filled = {key: _filled(key, value) for key, value in owner.items()}
    _plant(path, **{"host": socket.gethostname(), **filled})
    info = read_owner(path)
    assert info is not None and info.pid == filled["pid"]
    assert owner_alive(info, path) is False
    (row,) = list_journals(tmp_path / "runs")
    assert row.owner_alive is False
    assert list_journals(tmp_path / "runs", skip_live=True) != []


def test_the_writer_holding_its_lock_reads_alive_whatever_the_file_says(tmp_path: Path) -> None:
    path = _dead_journal(tmp_path / "runs")
    held = OwnerLock(path)  # this process writes it now
    try:
        assert owner_alive(read_owner(path), path) is True
        (row,) = list_journals(tmp_path / "runs")
        assert row.owner_alive is True
    finally:
        held.release()
    assert owner_alive(read_owner(path), path) is False


def test_another_hosts_writer_on_a_network_filesystem_cannot_be_told_dead_from_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its flock may not show on this host: alive is the safe answer for gc."""
    path = _dead_journal(tmp_path / "runs")
    _plant(path, pid=1, host="another-host")
    monkeypatch.setattr(lock_module, "network_fs_type", lambda _path: "nfs")
    assert owner_alive(read_owner(path), path) is True
    _plant(path, pid=1, host=socket.gethostname())  # this host's pid 1 holds nothing
    assert owner_alive(read_owner(path), path) is False
