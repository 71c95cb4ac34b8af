"""A journal's writer in another PID namespace of this host (another
container of a pod: one host name, one runs directory, not one set of pids)
is told alive by its owner flock, not by the pid its lock file names."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from primeruns.journal import EntryKind, Journal, list_journals
from primeruns.journal.lock import LOCK_NAME, OwnerLock, owner_alive, read_owner


def _journal(runs: Path) -> Path:
    with Journal.create(runs) as journal:
        journal.append(EntryKind.METRICS, [b'{"step": 1}'])
        return journal.path


def test_a_writer_in_another_pid_namespace_of_this_host_reads_alive_while_it_holds_its_lock(
    tmp_path: Path,
) -> None:
    """That writer names its own pid (1, mostly), which here is another
    process or none. Before, such a pid, gone or of another start time here,
    read dead: ls and the dashboard called the live run crashed, and a
    requeue counted it among the journals to take over (a snapshot of it
    shipped beside its own uplink), not among the run's live writers."""
    ns = os.stat("/proc/self/ns/pid").st_ino
    runs = tmp_path / "runs"
    path = _journal(runs)
    held = OwnerLock(path)  # that writer: one kernel, so one flock
    # What its lock file says: its pid, in a namespace not ours.
    other = {"host": socket.gethostname(), "started": 0.0, "pid": 1, "proc_start": 1}
    try:
        written = json.loads((path / LOCK_NAME).read_text())
        (path / LOCK_NAME).write_text(json.dumps({**other, "pid_ns": ns + 1}))
        (row,) = list_journals(runs)
        assert row.owner_alive is True
        assert list_journals(runs, skip_live=True) == []
        assert owner_alive(read_owner(path), path) is True
        assert written.get("pid_ns") == ns  # a writer names its namespace
    finally:
        held.release()
    (path / LOCK_NAME).write_text(json.dumps({**other, "pid_ns": ns + 1}))
    (row,) = list_journals(runs)
    assert row.owner_alive is False  # its writer gone (a restarted container's requeue takes it)
    # Where no journal's lock can be asked (a copy's), alive: the safe answer.
    assert owner_alive(read_owner(path)) is True
    # A file naming no namespace (an older version's) is judged by its pid, as before.
    (path / LOCK_NAME).write_text(json.dumps(other))
    assert owner_alive(read_owner(path), path) is False
