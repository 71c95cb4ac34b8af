"""SIGKILL a writer at random points: every append that returned survives, densely."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import procs
import pytest

from primeruns.journal import EntryKind, Journal

_WRITER = """
import sys, zlib
from pathlib import Path
from primeruns.journal import EntryKind, Journal
path = Path(sys.argv[1])
j = Journal.open(path) if (path / "data.mdb").exists() else Journal.create(
    path.parent, local_id=path.name)
seq = j.last_seq()
while True:
    n = 1 + seq % 3
    payloads = [(b'{"s":%d,"pad":"' % (seq + i + 1)) + b"x" * ((seq * 37) % 5000) + b'"}'
                for i in range(n)]
    r = j.append(EntryKind.EPISODE if seq % 2 else EntryKind.METRICS, payloads)
    seq = r.first_seq + r.count - 1
    sys.stdout.write(f"{seq}\\n")
    sys.stdout.flush()
"""


def _expected(seq: int) -> bytes:
    return b'{"s":%d,"pad":"' % seq


def _kill_cycles(tmp_path: Path, cycles: int, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "run"
    confirmed = 0
    for _ in range(cycles):
        proc = procs.start(
            [sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        target = confirmed + rng.randint(1, 400)
        last = confirmed
        for line in proc.stdout:  # kill once the writer has confirmed enough appends
            last = int(line)
            if last >= target:
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for line in proc.stdout:  # lines printed between our read and the kill
            last = max(last, int(line))
        proc.stdout.close()
        confirmed = last
        with Journal.open(path, owner=False) as j:
            assert j.last_seq() >= confirmed
            # One read stops at its scan limit (50,000 entries): read to the end.
            entries, after = [], 0
            while True:
                got = j.read(after, max_entries=10**7, max_bytes=1 << 40)
                assert got.damaged == []
                entries += got.entries
                if got.next_after <= after:
                    break
                after = got.next_after
            assert [e.seq for e in entries] == list(range(1, j.last_seq() + 1))
            for e in entries:
                assert e.payload.startswith(_expected(e.seq))
                assert e.kind in (EntryKind.EPISODE, EntryKind.METRICS)
    assert confirmed > 0


def test_sigkill_loses_no_returned_append(tmp_path: Path) -> None:
    _kill_cycles(tmp_path, cycles=10, seed=1234)


@pytest.mark.slow
# Hundreds of cycles by design: longer than the suite's 300 s hang guard
# on a busy 2-core machine, so a guard of its own.
@pytest.mark.timeout(1800)
def test_sigkill_torture(tmp_path: Path) -> None:
    _kill_cycles(tmp_path, cycles=200, seed=int(time.time()))
