"""A shipping process gives back what its batches freed and the journal pages
it read (``ship.resident``): a long run's resident memory follows what the
uplink holds, not how much it has shipped."""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mapped import resident_bytes

from primeruns.journal import EntryKind, Journal, txn
from primeruns.libc import libc as c_library
from primeruns.ship import resident

MIB = 1 << 20


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("trim", pad))
        return 1


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> FakeLibc:
    fake = FakeLibc()
    monkeypatch.setattr(resident, "_libc", fake)
    monkeypatch.setattr(resident, "_dirty", False)
    monkeypatch.setattr(resident, "_last", 0.0)
    return fake


def _trims(libc: FakeLibc) -> int:
    return sum(1 for call in libc.calls if call[0] == "trim")


class Clock:
    """``resident``'s clock and its timer, moved by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        self.due: list[tuple[float, Callable[[], None]]] = []
        monkeypatch.setattr(resident, "_clock", lambda: self.now, raising=False)
        monkeypatch.setattr(resident, "_start_timer", self._start, raising=False)
        monkeypatch.setattr(resident, "_pending", False, raising=False)

    def _start(self, delay: float, then: Callable[[], None]) -> None:
        self.due.append((self.now + delay, then))

    def advance(self, seconds: float) -> None:
        self.now = round(self.now + seconds, 6)
        for at, then in [d for d in self.due if d[0] <= self.now]:
            self.due.remove((at, then))
            then()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


def test_a_sink_that_runs_out_of_work_gives_back_what_its_batches_left(
    libc: FakeLibc, clock: Clock
) -> None:
    resident.idle()
    assert _trims(libc) == 0  # nothing freed since: nothing to ask
    resident.after_batch()  # the first batch in a while: given back at once
    resident.after_batch()  # within the second: left for later
    assert _trims(libc) == 1
    resident.idle()  # caught up: the second batch's memory goes back once the second is over
    resident.idle()
    clock.advance(1.0)
    assert _trims(libc) == 2
    clock.advance(5.0)
    resident.idle()  # nothing freed since
    assert _trims(libc) == 2
    resident.after_batch()
    resident.idle()  # a second after the last release: at once
    assert _trims(libc) == 3


def test_sinks_catching_up_after_every_batch_give_back_once_a_second(
    libc: FakeLibc, clock: Clock
) -> None:
    # A live training loop: each sink sends a small batch and catches up,
    # several times a second. Each release made the next batch fault its heap
    # and the journal's pages in again, so they come once a second, and what
    # the last batch left still goes back when its second is over.
    for _ in range(30):  # three seconds of it
        for _sink in range(3):
            resident.after_batch()
            resident.idle()
        clock.advance(0.1)
    # At 0 s, by the first batch; at 1 s and 2 s, each by the timer the
    # first catch-up after a release set; at 3 s, the last batches' by the
    # timer, with the loop over.
    assert _trims(libc) == 4
    assert clock.due == []


def test_a_process_that_did_not_enable_it_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # The user's own process (threads mode) keeps its memory as it is. (Its
    # state set first: another test of this worker may have enabled it.)
    monkeypatch.setattr(resident, "_libc", None)
    monkeypatch.setattr(resident, "_dirty", False)
    resident.after_batch()
    resident.idle()
    assert resident._dirty is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_batches_in_quick_succession_leave_a_bounded_part_of_the_journal_resident(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 100,000-step sync held 17 MB of its 31 MB journal (1 MB at 2,000
    # steps): each batch's bookkeeping touched a few pages, scattered over
    # the file, and the map was dropped at most once a second, by which
    # time dozens of batches had touched half of it. Now it is dropped after
    # any transaction once 2 MiB piled up.
    with Journal.create(tmp_path / "runs") as journal:
        for _ in range(48):
            journal.append(EntryKind.EPISODE, [os.urandom(64 << 10).hex().encode()] * 8)
        path = journal.path
    data = path / "data.mdb"
    assert data.stat().st_size > 20 * MIB
    libc = c_library()
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    monkeypatch.setattr(resident, "_libc", libc)
    monkeypatch.setattr(resident, "_dirty", False)
    monkeypatch.setattr(resident, "_last", 0.0)
    monkeypatch.setattr(resident, "_file_base", None, raising=False)
    # What enable() sets, undone after the test.
    hook = getattr(resident, "_after_transaction", None)
    monkeypatch.setattr(txn, "after_transaction", hook, raising=False)
    # Long reads drop the map on their own (tests/journal/test_resident_pages.py):
    # here only what a shipping process does after its batches.
    monkeypatch.setattr(txn, "REMAP_AFTER_BYTES", 1 << 40)
    peak = 0
    with Journal.open(path, owner=False) as journal:
        for batch in range(48):  # far quicker than a second
            # A batch's reads, a few entries apart from the last batch's.
            for seq in range(1 + batch * 8, 385, 96):
                assert journal.get(seq) is not None
            resident.after_batch()
            peak = max(peak, resident_bytes(data))
    assert peak <= 3 * MIB, f"{peak / MIB:.1f} MiB of the journal resident after a batch"


_BIG_AFTER_BIG = """
from primeruns.ship import resident

def rss_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

assert resident.enable()
batch = b"1" * (30 << 20)  # a Prime Traces batch's body
del batch
before = rss_kb()
batch = b"2" * (20 << 20)  # the next one
kept = [bytes(100) for _ in range(10_000)]  # what the process goes on holding
del batch
print((rss_kb() - before) // 1024)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_a_large_batch_freed_leaves_the_process_at_once() -> None:
    # glibc maps a large block of its own and unmaps it when freed, but raises
    # that threshold to the size of each one freed: the next batch then came
    # from the heap, stayed there under what was allocated after it, and a
    # long sync's resident memory grew with its largest batch. A process that
    # ships keeps the threshold fixed.
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _BIG_AFTER_BIG], capture_output=True, text=True, check=True
    )
    assert int(done.stdout) < 5, f"{done.stdout.strip()} MB of a freed batch kept"
