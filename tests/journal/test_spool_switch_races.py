"""Segment switches under races: several threads logging, the spool's sync
thread held up at random, the mover absorbing and deleting segments.

What a user depends on: every record whose call returned is read exactly
once, in order, whole; and no byte of a segment's successor is written
before every byte of that segment is on disk (a power cut leaves a lost
tail, never a hole).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdk_helpers import wait_for

from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind, Journal, spool
from primeruns.journal.spool import list_segments


class _DiskOrder:
    """Wraps ``fdatasync`` and the spool's writes: what of each segment file
    is known on disk (its size as a sync began, once that sync returned), and
    at each write to a segment, whether every segment before it is on disk
    whole. ``delay`` holds up the spool's sync thread (a slow disk)."""

    def __init__(self, path: Path, rng: random.Random) -> None:
        self.path = path
        self.rng = rng
        self.lock = threading.Lock()
        self.synced: dict[int, int] = {}  # inode -> bytes on disk
        self.holes: list[str] = []
        self.writes = 0
        self._fdatasync = os.fdatasync
        self._writev = os.writev
        self._write = os.write

    def fdatasync(self, fd: int) -> None:
        st = os.fstat(fd)
        if threading.current_thread().name.startswith("primeruns-spool-sync-"):
            with self.lock:
                pause = self.rng.choice([0.0, 0.0, 0.0001, 0.001, 0.003])
            time.sleep(pause)  # a slow disk: how long varies the interleavings
        self._fdatasync(fd)
        with self.lock:
            self.synced[st.st_ino] = max(self.synced.get(st.st_ino, 0), st.st_size)

    def _check(self, fd: int) -> None:
        try:
            ino = os.fstat(fd).st_ino
        except OSError:
            return
        segments = []
        for first, name in list_segments(self.path):
            try:
                st = os.stat(self.path / name)
            except FileNotFoundError:
                continue  # deleted by the mover meanwhile (LMDB synced first)
            segments.append((first, name, st.st_ino, st.st_size))
        mine = [s for s in segments if s[2] == ino]
        if not mine:
            return  # not a segment
        with self.lock:
            self.writes += 1
            for first, name, other, size in segments:
                if first < mine[0][0] and self.synced.get(other, 0) < size:
                    self.holes.append(
                        f"{mine[0][1]} written while {name} had "
                        f"{size - self.synced.get(other, 0)} bytes not on disk"
                    )

    def install(self, mp: pytest.MonkeyPatch) -> None:
        """Stand in for the disk: ``os``'s sync and writes, undone with ``mp``."""
        mp.setattr(os, "fdatasync", self.fdatasync)
        mp.setattr(os, "writev", self.writev)
        mp.setattr(os, "write", self.write)

    def writev(self, fd: int, buffers: list[bytes]) -> int:
        self._check(fd)
        return self._writev(fd, buffers)

    def write(self, fd: int, data: bytes) -> int:
        self._check(fd)
        return self._write(fd, data)


def _payload(rng: random.Random, thread: int, n: int) -> bytes:
    # Mostly rows and episodes; now and then one past a whole segment.
    size = rng.choice([40, 200, 900, 900, 2_500, 2_500, 1_500, 12_000])
    return json.dumps({"t": thread, "n": n, "pad": "x" * size}).encode()


@pytest.mark.parametrize("seed", range(6))
def test_threads_logging_across_switches_lose_reorder_and_repeat_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(spool, "SEGMENT_MAX", 8_000)
    monkeypatch.setattr(spool, "_AHEAD_STEP", 2_000)
    with Journal.create(tmp_path, local_id="run") as j:
        disk = _DiskOrder(j.path, random.Random(seed + 1000))
        disk.install(monkeypatch)
        returned: list[tuple[int, list[bytes]]] = []
        lock = threading.Lock()
        stop_moving = threading.Event()
        moved = [0]

        def producer(thread: int) -> None:
            r = random.Random(seed * 100 + thread)
            for n in range(120):
                payloads = [_payload(r, thread, n * 10 + k) for k in range(r.choice([1, 1, 1, 3]))]
                kind = EntryKind.METRICS if r.random() < 0.3 else EntryKind.EPISODE
                got = j.append(kind, payloads)
                assert got.first_seq is not None and got.count == len(payloads)
                with lock:
                    returned.append((got.first_seq, payloads))
                if r.random() < 0.2:
                    time.sleep(r.choice([0.0005, 0.002]))  # a step's work between calls

        def mover() -> None:
            while not stop_moving.is_set():
                if j._mover.step():
                    moved[0] += 1
                else:
                    time.sleep(0.001)

        j.hand_over_moving()  # the mover below moves, concurrently with the appends
        threads = [threading.Thread(target=producer, args=(t,)) for t in range(4)]
        mover_thread = threading.Thread(target=mover)
        mover_thread.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop_moving.set()
        mover_thread.join()
        monkeypatch.undo()
        assert disk.holes == []
        expected: dict[int, bytes] = {}
        for first, payloads in returned:
            for k, p in enumerate(payloads):
                assert first + k not in expected, "a seq given twice"
                expected[first + k] = p
        got = j.read(0, max_entries=10**6, max_bytes=1 << 40)
        assert got.damaged == []
        seqs = [e.seq for e in got.entries]
        assert seqs == sorted(expected), "lost, repeated or out of order"
        assert [e.payload for e in got.entries] == [expected[s] for s in seqs]
        assert moved[0] > 0 and len(list_segments(j.path)) >= 1


_KILLED_PRODUCER = textwrap.dedent(
    """
    import json, os, random, sys, threading
    from pathlib import Path
    from primeruns.journal import EntryKind, Journal, spool
    spool.SEGMENT_MAX = 8_000
    spool._AHEAD_STEP = 2_000
    seed = int(sys.argv[2])
    real = os.fdatasync
    def fdatasync(fd):
        if threading.current_thread().name.startswith("primeruns-spool-sync-"):
            import time
            time.sleep(random.random() * 0.003)  # a slow disk
        real(fd)
    os.fdatasync = fdatasync
    j = Journal.create(Path(sys.argv[1]), local_id="run")
    out = threading.Lock()
    os.write(1, b"%s\\n" % str(j.path).encode())
    def producer(t):
        r = random.Random(seed * 10 + t)
        n = 0
        while True:
            pad = "x" * r.choice([40, 900, 2500, 12000])
            payloads = [json.dumps({"t": t, "n": n + k, "pad": pad}).encode()
                        for k in range(r.choice([1, 1, 3]))]
            got = j.append(EntryKind.EPISODE, payloads)
            with out:
                os.write(1, b"%d %d %d\\n" % (t, n, got.first_seq))
            n += len(payloads)
    for t in range(3):
        threading.Thread(target=producer, args=(t,), daemon=True).start()
    threading.Event().wait()
    """
)


@pytest.mark.parametrize("seed", range(4))
def test_a_producer_killed_across_switches_keeps_every_call_that_returned(
    tmp_path: Path, seed: int
) -> None:
    """SIGKILL at a random point of threads logging across switches: the
    journal reopened holds every record whose call returned, once, in order."""
    rng = random.Random(seed)
    path = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_PRODUCER, str(path), str(seed)],
        stdout=subprocess.PIPE,
        env={**os.environ},
    )
    assert proc.stdout is not None
    journal = Path(proc.stdout.readline().decode().strip())
    lines: list[bytes] = []
    want = rng.randint(50, 600)
    while len(lines) < want:
        line = proc.stdout.readline()
        assert line, "the producer ended"
        lines.append(line)
    os.kill(proc.pid, signal.SIGKILL)
    lines.extend(proc.stdout.read().splitlines(keepends=True))
    proc.stdout.close()
    proc.wait()
    returned = [tuple(map(int, ln.split())) for ln in lines if ln.endswith(b"\n")]
    with Journal.open(journal) as j:
        got = j.read(0, max_entries=10**6, max_bytes=1 << 40)
        assert got.damaged == []
        seqs = [e.seq for e in got.entries]
        assert seqs == list(range(1, len(seqs) + 1))
        by_seq = {e.seq: json.loads(e.payload) for e in got.entries}
    for t, n, first in returned:
        assert by_seq[first]["t"] == t and by_seq[first]["n"] == n


class _FillingDisk(_DiskOrder):
    """``_DiskOrder`` whose disk fills: armed with n, at the first spool write
    to a segment at or past ``SEGMENT_MAX`` (a full one going on, or its
    switch), it and the n writes after it are cut short (part of their bytes
    written, then ENOSPC: the writer takes the part back)."""

    def __init__(self, path: Path, rng: random.Random) -> None:
        super().__init__(path, rng)
        self.armed: int | None = None
        self.refusing = 0
        self._cut = False
        # The sync thread's syncs end only while set (the loop's pauses), so
        # calls between two pauses meet a full segment's sync still running.
        self.gate = threading.Event()

    def fdatasync(self, fd: int) -> None:
        if threading.current_thread().name.startswith("primeruns-spool-sync-"):
            assert self.gate.wait(30)
        super().fdatasync(fd)

    def writev(self, fd: int, buffers: list[bytes]) -> int:
        self._check(fd)
        if self.armed is not None and os.fstat(fd).st_size >= spool.SEGMENT_MAX:
            self.refusing, self.armed = self.armed + 1, None
        if self.refusing:
            self.refusing -= 1
            data = b"".join(buffers)
            self._cut = True
            return self._write(fd, data[: self.rng.randrange(len(data))])
        return self._writev(fd, buffers)

    def write(self, fd: int, data: bytes) -> int:
        self._check(fd)
        if self._cut:
            self._cut = False
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._write(fd, data)


_STEPS = st.lists(
    st.one_of(
        *[
            st.tuples(
                st.just("log"), st.sampled_from([30, 300, 900, 2_500, 9_000]), st.integers(1, 3)
            )
        ]
        * 10,
        st.tuples(st.just("full"), st.integers(0, 3), st.just(0)),
        *[st.tuples(st.just("pause"), st.just(0), st.just(0))] * 2,
    ),
    min_size=30,
    max_size=150,
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=_STEPS, seed=st.integers(0, 1000))
def test_a_full_disk_anywhere_across_a_switch_loses_reorders_or_repeats_nothing(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int, int]], seed: int
) -> None:
    """The disk fills (a write cut short, then ENOSPC) at any point of a
    segment or its switch: what a call gave is journaled once the
    disk has room, after what came before it and before what came after."""
    tmp_path = tmp_path_factory.mktemp("full")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spool, "SEGMENT_MAX", 8_000)
        mp.setattr(spool, "_AHEAD_STEP", 2_000)
        with Journal.create(tmp_path, local_id="run") as j:
            j.hold_when_full()
            disk = _FillingDisk(j.path, random.Random(seed))
            disk.install(mp)
            given_ids: list[str] = []
            for op, size, count in steps:
                if op == "full":
                    disk.armed = size
                elif op == "pause":
                    disk.gate.set()  # the loop's work: the syncs ahead may end
                    time.sleep(0.003)
                    disk.gate.clear()
                else:
                    ids = [f"{len(given_ids) + k}" for k in range(count)]
                    got = j.append(
                        EntryKind.EPISODE,
                        [json.dumps({"id": i, "pad": "x" * size}).encode() for i in ids],
                    )
                    if got.dropped:
                        continue  # refused and counted: never in the log
                    given_ids.extend(ids)
            disk.armed, disk.refusing = None, 0
            disk.gate.set()
            assert j.settle_held(60.0) == 0
            assert disk.holes == []
            read = j.read(0, max_entries=10**6, max_bytes=1 << 40)
            assert read.damaged == []
            assert [e.seq for e in read.entries] == list(range(1, len(read.entries) + 1))
            assert [json.loads(e.payload)["id"] for e in read.entries] == given_ids


class _FailingSyncs(_DiskOrder):
    """``_DiskOrder`` whose disk fails the appender's sync (EIO) of an
    append that leaves its segment full, once per segment: the append the
    successor follows, with ``durability="fsync"``."""

    def __init__(self, path: Path, rng: random.Random) -> None:
        super().__init__(path, rng)
        self.failed: set[int] = set()

    def fdatasync(self, fd: int) -> None:
        st = os.fstat(fd)
        if (
            threading.current_thread().name == "MainThread"
            and st.st_size >= spool.SEGMENT_MAX
            and st.st_ino not in self.failed
        ):
            self.failed.add(st.st_ino)
            raise OSError(errno.EIO, "Input/output error")
        super().fdatasync(fd)


def test_an_fsync_append_whose_sync_failed_is_synced_before_its_successor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``durability="fsync"``: the sync of the append that fills a segment
    fails (EIO, or ENOSPC on a network file system). The call returns its
    records, with a warning; the switch to a successor syncs the full
    segment again before writing there. It took the segment as synced
    append by append, and the successor's synced appends reached the disk
    before the failed one's: a power cut left a hole, not a lost tail."""
    monkeypatch.setattr(spool, "SEGMENT_MAX", 8_000)
    with Journal.create(tmp_path, local_id="run", durability="fsync") as j:
        j.hand_over_moving()  # nothing absorbs or deletes segments here
        disk = _FailingSyncs(j.path, random.Random(0))
        disk.install(monkeypatch)
        payloads = [json.dumps({"n": n, "pad": "x" * 900}).encode() for n in range(40)]
        with caplog.at_level(logging.WARNING, logger="primeruns.journal"):
            for payload in payloads:
                assert j.append(EntryKind.EPISODE, [payload]).count == 1
        monkeypatch.undo()
        assert len(disk.failed) >= 3 and len(list_segments(j.path)) > len(disk.failed)
        assert disk.holes == []
        assert sum("sync failed" in r.getMessage() for r in caplog.records) == len(disk.failed)
        got = j.read(0, max_entries=100)
        assert [e.payload for e in got.entries] == payloads


class _FailingSyncAhead(_DiskOrder):
    """``_DiskOrder`` whose spool thread's first sync of each segment at or
    past ``SEGMENT_MAX`` (``past``: its second, the one the writes going on
    past full asked for) fails once (EIO: a transient error, or ENOSPC on a
    network file system); ``gate`` holds those syncs up until set (a slow
    disk, the loop's calls meanwhile)."""

    def __init__(self, path: Path, rng: random.Random, *, past: bool) -> None:
        super().__init__(path, rng)
        self.past = past
        self.full_syncs: dict[int, int] = {}  # inode -> its syncs at or past full
        self.failed: set[int] = set()
        self.gate = threading.Event()

    def fdatasync(self, fd: int) -> None:
        st = os.fstat(fd)
        if (
            threading.current_thread().name.startswith("primeruns-spool-sync-")
            and st.st_size >= spool.SEGMENT_MAX
        ):
            # What it puts on disk is what was written as it began: the
            # writes going on meanwhile are the next sync's.
            assert self.gate.wait(30)
            count = self.full_syncs[st.st_ino] = self.full_syncs.get(st.st_ino, 0) + 1
            if count == (2 if self.past else 1):
                self.failed.add(st.st_ino)
                raise OSError(errno.EIO, "Input/output error")
            self._fdatasync(fd)
            with self.lock:
                self.synced[st.st_ino] = max(self.synced.get(st.st_ino, 0), st.st_size)
            return
        super().fdatasync(fd)


@pytest.mark.parametrize("past", [False, True], ids=["at-full", "past-full"])
def test_a_sync_ahead_that_failed_is_not_taken_for_one_that_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, past: bool
) -> None:
    """The spool thread's sync of a full segment fails once (a transient EIO;
    a failing one was warned of). The switch to its successor syncs the
    segment itself before writing there, as it did before full segments
    went on: a failed sync is not one that put the bytes on disk, and a power
    cut after the successor's bytes reached the disk and before its
    predecessor's left a hole in the log, not a lost tail. ``past``: the
    sync that failed is the one the writes going on past full asked for,
    the switch waiting for it (``SegmentSyncer.await_sync``)."""
    monkeypatch.setattr(spool, "SEGMENT_MAX", 8_000)
    monkeypatch.setattr(spool, "_AHEAD_STEP", 1 << 30)  # no syncs ahead but at full
    with Journal.create(tmp_path, local_id="run") as j:
        j.hand_over_moving()  # nothing absorbs or deletes segments here
        assert j._appender is not None
        writer = j._appender._spool
        syncer = writer._syncer
        disk = _FailingSyncAhead(j.path, random.Random(0), past=past)
        disk.install(monkeypatch)

        def idle() -> bool:
            with syncer._cond:
                return getattr(syncer, "_busy", None) is None and syncer._wanted is None

        given: list[bytes] = []
        try:
            with caplog.at_level(logging.WARNING, logger="primeruns.journal"):
                for n in range(400):
                    if len(disk.failed) >= 2 and len(list_segments(j.path)) > len(disk.failed):
                        break  # (``past``: whether a call goes on past full is the host's timing)
                    segment, was_full = writer._segment, writer._size >= 8_000
                    payload = json.dumps({"n": n, "pad": "x" * 900}).encode()
                    assert j.append(EntryKind.EPISODE, [payload]).count == 1
                    given.append(payload)
                    full = writer._size >= 8_000 and writer._segment == segment
                    if full and (was_full or not past):
                        # The loop's work: the syncs asked for end (``past``:
                        # once a call went on past full) before the next call.
                        disk.gate.set()
                        wait_for(idle, timeout=15, what="the spool thread idle")
                        disk.gate.clear()
        finally:
            disk.gate.set()
        monkeypatch.undo()
        assert len(disk.failed) >= 2 and len(list_segments(j.path)) > len(disk.failed)
        assert disk.holes == []
        assert sum("sync failed" in r.getMessage() for r in caplog.records) >= len(disk.failed)
        got = j.read(0, max_entries=1000)
        assert [e.payload for e in got.entries] == given


class _TornAfterFailedSync(_DiskOrder):
    """``_DiskOrder`` whose disk fails the appender's sync of one append
    (EIO), then fills during the next: half of it written, the rest refused
    (ENOSPC), and the truncate that takes the half back fails too (EIO)."""

    def __init__(self, path: Path, rng: random.Random) -> None:
        super().__init__(path, rng)
        self.step = ""  # "" | "sync" | "torn": what the next append meets

    def fdatasync(self, fd: int) -> None:
        if self.step == "sync" and threading.current_thread().name == "MainThread":
            self.step = ""
            raise OSError(errno.EIO, "Input/output error")
        super().fdatasync(fd)

    def writev(self, fd: int, buffers: list[bytes]) -> int:
        if self.step != "torn":
            return super().writev(fd, buffers)
        data = b"".join(buffers)
        return self._write(fd, data[: len(data) // 2])

    def write(self, fd: int, data: bytes) -> int:
        if self.step == "torn":
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(fd, data)

    def ftruncate(self, fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")


def test_an_append_torn_where_its_undo_fails_syncs_its_segment_before_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append torn by a full disk is taken back by a truncate; where
    that fails, the next append goes to a segment of its own. The segment
    left was not synced first, as every other switch syncs it: under
    ``durability="fsync"`` an earlier append whose own sync had failed was
    still in the page cache alone while the next segment's appends, each
    synced, reached the disk (a power cut: a hole, not a lost tail)."""
    with Journal.create(tmp_path, local_id="run", durability="fsync") as j:
        j.hand_over_moving()  # nothing absorbs or deletes segments here
        disk = _TornAfterFailedSync(j.path, random.Random(0))
        disk.install(monkeypatch)
        payloads = [json.dumps({"n": n, "pad": "x" * 900}).encode() for n in range(4)]
        j.append(EntryKind.EPISODE, [payloads[0]])
        disk.step = "sync"
        j.append(EntryKind.EPISODE, [payloads[1]])
        disk.step = "torn"
        with monkeypatch.context() as torn:
            torn.setattr(os, "ftruncate", disk.ftruncate)
            with contextlib.suppress(JournalError):
                j.append(EntryKind.EPISODE, [payloads[2]])
        disk.step = ""
        j.append(EntryKind.EPISODE, [payloads[3]])
        monkeypatch.undo()
        assert len(list_segments(j.path)) == 2  # the torn append's segment left
        assert disk.holes == []
