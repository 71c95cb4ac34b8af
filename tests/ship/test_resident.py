"""A shipping process gives back what its batches freed and the journal pages
it read (``ship.resident``): a long run's resident memory follows what the
uplink holds, not how much it has shipped."""

from __future__ import annotations

import platform
from typing import Any

import pytest

from primeruns.ship import resident


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("trim", pad))
        return 1

    def madvise(self, start: int, length: int, advice: int) -> int:
        self.calls.append(("madvise", start, length, advice))
        return 0


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> FakeLibc:
    fake = FakeLibc()
    monkeypatch.setattr(resident, "_libc", fake)
    monkeypatch.setattr(resident, "_dirty", False)
    monkeypatch.setattr(resident, "_last", 0.0)
    return fake


def _trims(libc: FakeLibc) -> int:
    return sum(1 for call in libc.calls if call[0] == "trim")


def test_a_sink_that_runs_out_of_work_gives_back_what_its_batches_left(libc: FakeLibc) -> None:
    resident.idle()
    assert _trims(libc) == 0  # nothing freed since: nothing to ask
    resident.after_batch()  # the first batch in a while: given back at once
    resident.after_batch()  # within the second: left for later
    assert _trims(libc) == 1
    resident.idle()  # caught up: the second batch's memory goes back too
    resident.idle()
    assert _trims(libc) == 2


def test_a_process_that_did_not_enable_it_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # The user's own process (threads mode) keeps its memory as it is. (Its
    # state set first: another test of this worker may have enabled it.)
    monkeypatch.setattr(resident, "_libc", None)
    monkeypatch.setattr(resident, "_dirty", False)
    resident.after_batch()
    resident.idle()
    assert resident._dirty is False


def test_only_the_journals_read_only_shared_maps_are_dropped() -> None:
    # Dropping a page of LMDB's read-only shared map loses nothing (it is the
    # file's); a writable or private map, or another file's, is not touched.
    maps = "\n".join(
        [
            "7f0000000000-7f0000400000 r--s 00000000 08:01 12 /runs/a/data.mdb",
            "7f0000400000-7f0000800000 rw-s 00000000 08:01 12 /runs/b/data.mdb",
            "7f0000800000-7f0000900000 r--p 00000000 08:01 13 /runs/c/data.mdb",
            "7f0000900000-7f0000a00000 r--s 00000000 08:01 14 /runs/a/lock.mdb",
            "7f0000a00000-7f0000b00000 rw-p 00000000 00:00 0 [heap]",
            "7f0000b00000-7f0000c00000 r--s 00000000 08:01 15 /runs/with space/data.mdb",
        ]
    )
    assert list(resident.journal_maps(maps)) == [
        (0x7F0000000000, 0x400000),
        (0x7F0000B00000, 0x100000),
    ]


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
