"""The journal's LMDB file truncated under a live process.

A ``cp`` or ``rsync --inplace`` onto a run's ``data.mdb``, or a truncation
by hand, shrinks the file a live producer and its uplink have mapped. A
read of a page past the new end was a SIGBUS: the process died, the user's
loop with it, under ``on_error="warn"``. The store now sees the file shrink
before each transaction and reports the journal damaged, an error every
caller handles. (The children run in their own process: a SIGBUS would
take pytest down with it.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_TRUNCATED_UNDER_A_READER = """
import os, sys
from pathlib import Path
from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind, Journal
journal = Journal.create(Path(sys.argv[1]))
payloads = [b'{"id": "e%d", "pad": "%s"}' % (i, b"x" * 2000) for i in range(400)]
journal.append(EntryKind.EPISODE, payloads)
journal.set_meta("note", "x" * 50_000)
journal._mover.step()  # into LMDB: its file grows past a few pages
data = journal.path / "data.mdb"
assert data.stat().st_size > 64 * 1024, data.stat().st_size
os.truncate(data, 8192)
for what, call in [
    ("meta", lambda: journal.get_meta("note")),
    ("read", lambda: journal.read(0, max_entries=1000)),
    ("write", lambda: journal.set_meta("after", 1)),
]:
    try:
        call()
    except JournalError as exc:
        print(what, "refused:", exc, flush=True)
    else:
        print(what, "passed", flush=True)
print("alive", flush=True)
"""


def test_a_journal_file_truncated_under_its_process_is_an_error_not_a_sigbus(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _TRUNCATED_UNDER_A_READER, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "alive" in done.stdout
    assert "meta refused" in done.stdout and "truncated" in done.stdout


_READ_AT_EXIT = """
import atexit, os, sys, tempfile
from pathlib import Path
from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind, Journal

def at_exit():  # as a run's close-out at exit: after weakref's exit hook
    taken = [tempfile.TemporaryFile() for _ in range(4)]  # descriptors freed are reused
    try:
        journal.set_meta("at_exit", 1)
        print("read at exit:", journal.get_meta("at_exit"), flush=True)
    except JournalError as exc:
        print("refused at exit:", exc, flush=True)

atexit.register(at_exit)
journal = Journal.create(Path(sys.argv[1]))
journal.append(EntryKind.EPISODE, [b'{"id": "e1"}'])
journal.set_meta("note", "x" * 50_000)
"""


def test_a_journal_still_in_use_at_the_interpreters_exit_is_not_read_as_truncated(
    tmp_path: Path,
) -> None:
    # The descriptor kept to watch the file was closed by weakref's exit
    # hook, before the run's own close-out at exit; its number, reused by
    # another file, read as the journal truncated.
    done = subprocess.run(
        [sys.executable, "-c", _READ_AT_EXIT, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    assert "read at exit: 1" in done.stdout, done.stdout
