"""A journal's writer in another PID namespace of this host (another
container of a pod: one host name, one runs directory, not one set of pids)
is told alive by its owner flock, not by the pid its lock file names."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

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


# A writer in another PID namespace whose lock file names none (an older
# version's): it holds the journal's flock, then lists the runs directory
# itself once told to (a line on its standard input), where its pid (1) is its own.
_OLDER_WRITER = """
import json, sys
from pathlib import Path
from primeruns.journal import list_journals
from primeruns.journal.lock import LOCK_NAME, OwnerLock
runs, path = Path(sys.argv[1]), Path(sys.argv[2])
held = OwnerLock(path)
named = json.loads((path / LOCK_NAME).read_text())
del named["pid_ns"]
(path / LOCK_NAME).write_text(json.dumps(named))
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps({i.path.name: i.owner_alive for i in list_journals(runs)}), flush=True)
held.release()
"""


def test_a_listing_in_one_pid_namespace_does_not_tell_another_that_a_live_run_there_is_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock file naming no PID namespace (an older version's) is judged by
    its pid in the listing's own namespace: ``ls`` in one container of a pod
    calls the run of another container crashed (as ever), but ``ls`` in the
    writer's own container finds its pid alive. The runs directory's index
    kept that owner as dead for good (``lock.dead_for_good`` took a file
    naming no namespace as one of its own), and ``ls`` in the writer's
    container, reading the index, listed its own live run as not running."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(
            ["unshare", "-Urpf", "--mount-proc", "true"], capture_output=True, check=False
        ).returncode
    ):
        if os.environ.get("CI"):  # CI's machine has them: a skip there would hide a failure
            pytest.fail("needs unshare and unprivileged PID namespaces, which CI has")
        pytest.skip("no unprivileged PID namespaces here")
    from primeruns.journal import summary_index

    monkeypatch.setattr(summary_index, "RACY_NS", 0)  # the lock file is settled as written
    runs = tmp_path / "runs"
    journals = [_journal(runs) for _ in range(summary_index.stale_most(0) + 1)]
    with subprocess.Popen(
        ["unshare", "-Urpf", "--mount-proc", sys.executable, "-c", _OLDER_WRITER,
         str(runs), str(journals[0])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as writer:  # fmt: skip
        try:
            assert writer.stdout is not None and writer.stdin is not None
            assert writer.stdout.readline() == "ready\n"
            list_journals(runs)  # here its pid 1 is another process: judged so, as ever
            list_journals(runs)
            writer.stdin.write("list\n")
            writer.stdin.flush()
            there = json.loads(writer.stdout.readline())
        finally:
            writer.kill()
    assert there[journals[0].name] is True  # its own writer, alive where it runs
