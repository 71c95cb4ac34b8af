"""Appending entries: the producer's one write on a ``log_*`` call.

An append frames its records under the append lock, where each one's
sequence number is known (the checksum covers it), and writes them to the
spool in one ``write()`` (``spool``): once it returns they survive the
process's death, and every reader sees them. Compressing them and moving them
into LMDB is the mover's work, off this thread (``mover``): the background
sync's tick wakes it a second after writes, while they come, and near the
byte budget the room count wakes it too (``capacity``). At the byte budget or
on a full disk the records are dropped and counted, never raised; where the
journal holds what a full disk refuses (an online run's: ``hold_when_full``),
they wait in memory, in order, until it has room again (``overflow``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence

import lmdb

from primeruns.exceptions import (
    FINISHED_WHILE_LOGGING,
    JournalError,
    JournalFullError,
    JournalMovedError,
    RunFinishedError,
)
from primeruns.journal.capacity import Capacity
from primeruns.journal.frames import HEADER_SIZE, EntryKind, encode_frames_off_gil, spool_frame
from primeruns.journal.layout import put_entry
from primeruns.journal.overflow import DISK_FULL, RETRY_S, Held, Overflow, Watch
from primeruns.journal.spool import SpoolWriter
from primeruns.journal.tail import OwnTail, read_end, stored_end
from primeruns.journal.txn import Transactions, release_reserve
from primeruns.journal.types import AppendResult

# At the finish, how often a wait for records held for a full disk looks
# whether anything may still free room for them (``settle_held``).
_ROOM_LOOK_S = 0.5

# The most payload bytes of held appends stored in one LMDB transaction
# (``_put_held``): compressed under the append lock, a few milliseconds.
_PUT_HELD_BYTES = 1 << 20


class Appender:
    def __init__(
        self,
        tx: Transactions,
        tail: OwnTail,
        capacity: Capacity,
        spool: SpoolWriter,
    ) -> None:
        self._tx = tx
        self._tail = tail
        self._capacity = capacity
        self._spool = spool
        # Not the transaction lock: the mover holds that through its LMDB
        # commits, and an append must never wait behind one.
        self.lock = threading.Lock()
        # Set by a final append (a run's finish entry): the close-out ships
        # up to it, so a record after it would be left behind, with the run
        # closed as if complete. Another thread's log call that was already
        # past its check when the finish came is refused here instead.
        self._finished = False
        # Set when the journal was re-created elsewhere (``journal.rehome``):
        # an append that reached this handle late is refused, and made again
        # on the new journal by its caller.
        self.moved = False
        # The seq appends follow at least (``Journal._appends_after``): past
        # the log's end, seqs lost to damage that stored state still names.
        self.after = 0
        # Set from an append's write until ``last`` says what it wrote: still
        # set at the next append, the one before was cut in between (``_settle``).
        self._unsettled = False
        # Set by ``put_frames`` until LMDB, which holds its frames, is synced:
        # before then no spool segment may be opened past them (``_write``).
        self._frames_unsynced = False
        # Appends a full disk refused, held until it has room (None: dropped,
        # as at the budget; ``hold_when_full``). ``_holding`` says whether any
        # is held: the one test an append pays for it.
        self._overflow: Overflow | None = None
        self._holding = False
        self.held_lost = 0  # records held, then let go (counted lost: ``DISK_FULL``)
        # Told (outside the lock) of each held append stored: (kind, last seq).
        self.on_stored: Callable[[int, int], None] | None = None

    def hold_when_full(self, limit: int) -> None:
        """Hold what a full disk refuses, up to ``limit`` payload bytes (``overflow``)."""
        with self.lock:
            if self._overflow is None:
                self._overflow = Overflow(
                    self.lock, self.store_held, self._told, self._tx.path.name, limit=limit
                )

    def append(
        self,
        kind: EntryKind,
        payloads: Sequence[bytes],
        *,
        essential: bool = False,
        final: bool = False,
    ) -> AppendResult:
        if not payloads:
            return AppendResult(None, 0, 0)
        size = sum(map(len, payloads)) + HEADER_SIZE * len(payloads)
        counted = False  # refused by the room count, not by the disk's write
        # No ``try`` inside the lock's block: a KeyboardInterrupt raised at
        # such a line (a signal's handler) left the lock held for good.
        try:
            with self.lock:
                if self._unsettled:
                    self._settle()
                if self.moved:
                    raise JournalMovedError(f"journal {self._tx.path} was re-created")
                if self._finished:
                    raise RunFinishedError(FINISHED_WHILE_LOGGING)
                if self._holding:
                    if not final:  # after those held, never before them
                        return self._hold(int(kind), payloads, essential, size)
                    # The run's finish, which nothing may follow: what its
                    # wait for room did not store is lost (``let_go_held``).
                    self._let_go_held()
                if not essential and not self._capacity.room_for(size):
                    self._tx.tight = counted = True
                    raise JournalFullError("journal byte budget reached")
                self._unsettled = True
                # The kind as given: its frame packs it alike, and int() of
                # an IntEnum member cost ~0.15 us of every call (Python 3.11).
                first, frames = self._write(kind, payloads, essential)
                # Under the lock that chose ``first``: the next append's seq
                # follows this one's, whichever thread it comes from.
                last = self._tail.last = first + len(frames) - 1
                self._finished = final
                self._unsettled = False
        except JournalFullError:
            kept = self._refused(int(kind), payloads, essential, final, size, counted)
            if kept is not None:
                return kept
            self._count_drops(len(payloads))
            return AppendResult(None, 0, len(payloads))
        # The mover is not woken here but by the background sync's tick (see
        # ``maintenance``), or by the room count near the budget (``capacity``).
        self._tail.notify()
        return AppendResult(first, last - first + 1, 0)

    def _refused(
        self,
        kind: int,
        payloads: Sequence[bytes],
        essential: bool,
        final: bool,
        size: int,
        counted: bool,
    ) -> AppendResult | None:
        """An append refused for room: held where the disk refused it (the
        room count near a full disk, or the spool's write: ENOSPC, EDQUOT),
        a run's spec or finish put into LMDB; None where it is dropped (the
        byte budget's refusals, a journal that holds nothing)."""
        if self._overflow is None or (counted and not self._capacity.disk_short()):
            return None
        try:
            with self.lock:
                if self._unsettled:
                    self._settle()  # (``_write`` wrote nothing of it)
                if self.moved:
                    raise JournalMovedError(f"journal {self._tx.path} was re-created")
                if self._finished:
                    raise RunFinishedError(FINISHED_WHILE_LOGGING)
                if not essential:
                    return self._hold(kind, payloads, essential, size)
                first, count = self._put_essential(kind, payloads)
                self._tail.last = first + count - 1
                self._finished = final
        except JournalFullError:
            return None
        self._tail.notify()
        return AppendResult(first, count, 0)

    # -- appends held for a full disk (``overflow``) ------------------------------------

    def _hold(
        self, kind: int, payloads: Sequence[bytes], essential: bool, size: int
    ) -> AppendResult:
        """Hold a refused append (under the lock); JournalFullError past the bound."""
        overflow = self._overflow
        assert overflow is not None
        if not overflow.hold(Held(kind, tuple(payloads), essential, size)):
            raise JournalFullError("the records held for a full disk reached their bound")
        if not self._holding:
            # The segment written so far gets a successor (``_open_successor``).
            self._spool.start_segment()
        self._holding = True
        return AppendResult(None, 0, 0, len(payloads))

    def _put_essential(self, kind: int, payloads: Sequence[bytes]) -> tuple[int, int]:
        """A run's spec or finish the spool cannot take on a full disk (the
        reserve file spent too), put straight into LMDB's free pages: records
        held meanwhile (``store_held``) take the disk's blocks into the data
        file, where compaction frees pages but no spool segment finds room.
        (first seq, count); JournalFullError where LMDB cannot take it either."""
        first = max(self._tail.last, self.after) + 1
        seqs = list(range(first, first + len(payloads)))
        frames = list(zip(seqs, encode_frames_off_gil(kind, list(payloads), seqs), strict=True))
        try:
            stored = self._put_locked(frames, lambda: None, essential=True)
        except (JournalError, lmdb.Error):
            stored = False
        if not stored:
            raise JournalFullError(f"journal {self._tx.path}: no room for an essential entry")
        return first, len(payloads)

    def store_held(self) -> list[tuple[int, int]]:
        """Store held appends, oldest first, as far as room allows (under the
        lock, from the overflow's thread): straight into LMDB, compressed
        (``_put_held``), never through the spool, which the disk refused.
        (kind, last seq) of each stored."""
        overflow = self._overflow
        stored: list[tuple[int, int]] = []
        most = _PUT_HELD_BYTES
        while overflow is not None and overflow.items and not (self.moved or self._finished):
            if self._unsettled:
                self._settle()
            if self._stored_end() != self._tail.last:
                break  # what was spooled is not all in LMDB yet: they go after it
            put = self._put_held(overflow, most)
            if put:
                stored.extend(put)
            elif most:
                # A smaller batch may fit (each try is compressed first): at
                # last the oldest alone.
                most = most // 4 if most > _PUT_HELD_BYTES // 16 else 0
            else:
                break
        self._holding = overflow is not None and bool(overflow.items)
        if not (self.moved or self._finished):
            self._open_successor()
        return stored

    def _put_held(self, overflow: Overflow, most: int) -> list[tuple[int, int]]:
        """Store the oldest held appends (up to ``most`` payload bytes, at
        least the oldest) in LMDB in one transaction, compressed here with
        the GIL released: on a disk the journal's data file filled,
        compaction frees pages inside that file, which no spool segment can
        use, and raw in the spool they took several times the room. After
        every spooled entry (``put_frames``'s path). What it stored (none:
        it did not fit)."""
        first = max(self._tail.last, self.after) + 1
        count = total = 0
        for held in overflow.items:
            if count and total + held.nbytes > most:
                break
            count, total = count + 1, total + held.nbytes
        batch = list(itertools.islice(overflow.items, count))
        try:
            if not self._put_locked(_framed(batch, first), lambda: None, held=True):
                return []
        except (JournalError, lmdb.Error, ValueError):
            return []
        for _ in range(count):
            overflow.popleft()
        ends = itertools.accumulate(len(held.payloads) for held in batch)
        return [(held.kind, first + n - 1) for held, n in zip(batch, ends, strict=True)]

    def _open_successor(self) -> None:
        """While appends are held, keep a segment open past the log's end
        (empty): the one written before the disk filled then has a
        successor, so the mover deletes it once LMDB holds it, and its
        blocks come back. As the newest it was kept, its blocks taken for
        good (most of a small disk's). A put closes it (``put_frames``), and
        the next round opens one after the put's entries."""
        if not self._spool.opens_next():
            return
        first = max(self._tail.last, self.after) + 1
        with contextlib.suppress(JournalError):
            if self._frames_unsynced:
                self._sync_frames()  # as before any segment opened past put frames
            if first > self._stored_end():
                self._spool.open_next(first)

    def _told(self, stored: list[tuple[int, int]]) -> None:
        """Held appends were stored (outside the lock): wake readers, tell the run."""
        self._tail.notify()
        tell = self.on_stored
        if tell is not None:
            for kind, last in stored:
                with contextlib.suppress(Exception):  # the run's bookkeeping, never the journal's
                    tell(kind, last)

    def _let_go_held(self) -> int:
        """Forget what is held (under the lock), counted as lost: ``DISK_FULL``."""
        overflow = self._overflow
        if overflow is None:
            return 0
        count = overflow.let_go()
        self._holding = False
        if count:
            self.held_lost += count
            tx = self._tx
            with tx.lock:
                try:
                    tx.write(lambda txn: tx.add_loss(txn, "journal", count, DISK_FULL))
                except JournalError:
                    tx.pending_drops += count  # folded by the next write, without its reason
        return count

    def watch_held(self) -> Watch | None:
        """The appends held now, and those stored but not told yet, for a
        flush to wait for (``Overflow.watch``); None where none is. (Not
        ``_holding`` alone: it is cleared once the last held append is
        stored, before the run is told its seq.)"""
        with self.lock:
            overflow = self._overflow
            return None if overflow is None else overflow.watch()

    def wait_watched(self, watch: Watch, within: float) -> bool:
        """Wait up to ``within`` for the appends ``watch`` names to be stored
        (and told: ``on_stored``), letting none go; whether they are. Ends it."""
        overflow = self._overflow
        assert overflow is not None  # (a watch comes from it; never unset)
        return overflow.wait_watched(watch, within)

    def settle_held(self, within: float, room_may_come: Callable[[], bool] | None = None) -> int:
        """Wait up to ``within`` for the held appends to be stored, then let
        the rest go (counted lost); how many records were let go.
        ``room_may_come``: whether anything may still free room (the uplink
        shipping, whose acknowledgements compaction follows); once it says
        no, the wait ends after one more try of the held appends."""
        overflow = self._overflow
        if overflow is None or not self._holding:
            return 0
        deadline = time.monotonic() + within
        while not overflow.wait_empty(min(_ROOM_LOOK_S, deadline - time.monotonic())):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if room_may_come is not None and not room_may_come():
                # The last acknowledgement's compaction may have freed room
                # just now: the held appends' thread tries again within this.
                overflow.wait_empty(min(left, 2 * RETRY_S))
                break
        with self.lock:
            return self._let_go_held()

    def hand_over_held(self, other: Appender) -> None:
        """The journal was re-created (``rehome``): what this one held is held
        by ``other``, in order, before anything appended there after."""
        overflow = self._overflow
        if overflow is None:
            return
        other.hold_when_full(overflow.limit)
        other.on_stored = self.on_stored
        other.held_lost += self.held_lost  # the run's count, wherever it goes on
        with self.lock:
            items = list(overflow.items)
            overflow.let_go()
            self._holding = False
        overflow.stop()
        if not items:
            return
        with other.lock:
            assert other._overflow is not None
            for held in items:
                other._overflow.hold(held)
            other._holding = bool(other._overflow.items)

    def stop_holding(self) -> None:
        """The journal closes: the overflow's thread ends, and what it held is lost."""
        overflow = self._overflow
        if overflow is None:
            return
        overflow.stop()
        with self.lock:
            self._let_go_held()

    def _write(
        self, kind: int, payloads: Sequence[bytes], essential: bool
    ) -> tuple[int, list[bytes]]:
        """Frame the payloads after the log's end and spool them (under the
        append lock): (the first seq, the frames)."""
        for attempt in (1, 2):
            first = max(self._tail.last, self.after) + 1
            if first > self._tail.last + 1:
                self._spool.start_segment()
            if len(payloads) == 1:  # a log_metrics row, an episode: no comprehension's frame
                frames = [spool_frame(kind, payloads[0], first)]
            else:
                frames = [spool_frame(kind, p, seq) for seq, p in enumerate(payloads, first)]
            # Asked once: whether a full segment goes on depends on its sync
            # ahead, which may end between two looks (``SpoolWriter._goes_on``).
            opens = self._spool.opens_next()
            if self._frames_unsynced and opens:
                self._sync_frames()
            try:
                if opens and first <= self._stored_end():
                    raise JournalError(
                        f"journal {self._tx.path}: entries past {first - 1} exist already "
                        "(the log's end was misread); this append is refused"
                    )
                try:
                    self._spool.write(first, frames)
                except JournalFullError:
                    # The run's spec and finish may use the reserve file's room.
                    if not (essential and release_reserve(self._tx.path)):
                        raise
                    self._spool.write(first, frames)
                return first, frames
            except JournalFullError:
                raise
            except JournalError:
                # Read the end again: where it moved (what hid part of the log,
                # a segment that could not be opened, is gone), go on after it.
                end = read_end(self._tx, self._tail.spool)[0]
                if attempt == 2 or end <= self._tail.last:
                    raise
                self._tail.last = end
        raise AssertionError("unreachable")

    def put_frames(self, frames: Sequence[tuple[int, bytes]], absorb: Callable[[], None]) -> bool:
        """Store ``frames`` (``(seq, frame)``, consecutive seqs from the log's
        next) in LMDB as they are, in one transaction: a sync journal's
        import of its copy's entries, verified and decoded there, whose
        frames (compressed by the copy's mover) would otherwise be
        decompressed and compressed again here. ``absorb`` moves what is
        spooled into LMDB first (the frames go past it). False, nothing
        stored, where they do not follow the log's end or do not fit the
        journal's budget or its map (the caller appends their payloads
        instead, which says why)."""
        if not frames:
            return True
        with self.lock:
            if self._unsettled:
                self._settle()
            # Held appends (a full disk's) come first: these are appended after them.
            if self._holding or not self._put_locked(frames, absorb):
                return False
        self._tail.notify()
        return True

    def _put_locked(
        self,
        frames: Sequence[tuple[int, bytes]],
        absorb: Callable[[], None],
        *,
        held: bool = False,
        essential: bool = False,
    ) -> bool:
        """``put_frames`` under the append lock (``_put_held`` too: ``held``;
        ``_put_essential``: ``essential``, without the room count)."""
        first = frames[0][0]
        entries = self._tx.dbs["entries"]
        if self.moved or self._finished:
            return False
        end = self._tail.last
        if first != max(end, self.after) + 1:
            return False
        if any(seq != first + i for i, (seq, _) in enumerate(frames)):
            return False
        if not essential and not self._capacity.room_for(
            sum(len(frame) for _, frame in frames), held=held
        ):
            # The append of their payloads meets the budget as every
            # append does: the reserve for the run's spec and finish
            # (essential) kept, the others dropped and counted.
            return False
        absorb()

        def put(txn: lmdb.Transaction) -> bool:
            if stored_end(self._tx, txn) != end:
                return False  # something spooled is not in LMDB yet
            for seq, frame in frames:
                put_entry(txn, seq, frame, entries)
            return True

        try:
            with self._tx.lock:
                if not self._tx.write(put, control=essential):
                    return False
        except JournalFullError:
            return False
        self._spool.stored_past()
        # The open segment's seqs end before the frames': the next
        # append opens a segment of its own.
        self._spool.start_segment()
        self._tail.last = frames[-1][0]
        self._frames_unsynced = True
        return True

    def _sync_frames(self) -> None:
        """Sync LMDB, which holds frames ``put_frames`` stored past the
        spool, before a spool segment is opened past them. A segment's name
        is on the disk once made, and its appends within a second (the
        background syncs the spool before LMDB): a power cut before LMDB's
        sync then kept the segment and lost the frames, a hole readers report
        as missing entries, which no later import brings (it goes on after
        the log's end, past them)."""
        try:
            with self._tx.lock:
                self._tx.store.sync()
        except lmdb.Error as exc:
            raise JournalError(f"journal {self._tx.path}: sync failed ({exc})") from None
        self._frames_unsynced = False

    def _settle(self) -> None:
        """The append before was cut between its write and setting ``last``:
        an exception a signal's handler raised in its thread (Ctrl-C's
        KeyboardInterrupt in the main thread) as a call returned. Its frames
        may be in the spool while ``last`` says they are not, and the next
        append would write their seqs again after them: every entry from
        there on would fail its checksum. The spool's writer knows what it
        wrote whole (``SpoolWriter.settle``, from its own file: a parse of
        the readers' view here could itself be cut, and they share it)."""
        last = self._spool.settle()
        if last > self._tail.last:
            self._tail.last = last
        self._unsettled = False

    def _stored_end(self) -> int:
        """LMDB's end (0 if unreadable), read where an append opens a segment
        (once per ``SEGMENT_MAX`` bytes): a check that this process's end is
        not behind the log's."""
        try:
            with self._tx.read() as txn:
                return stored_end(self._tx, txn)
        except (JournalError, lmdb.Error):
            return 0

    def _count_drops(self, count: int) -> None:
        """Count dropped records in the journal now (a write of its own: no
        append writes LMDB); where even that fails, the next write folds them."""
        tx = self._tx
        with tx.lock:
            tx.pending_drops += count
            with contextlib.suppress(JournalError):
                tx.write(lambda txn: None)

    def sync(self) -> None:
        """Flush what was spooled to disk, outside the append lock."""
        with self.lock:
            fd = self._spool.sync_handle()
        if fd is None:
            return
        try:
            os.fdatasync(fd)
        except OSError:
            self._spool.mark_dirty()  # tried again at the next sync
        finally:
            os.close(fd)

    def unlinked(self) -> bool:
        """Whether the segment being written lost its directory (deleted)."""
        return self._spool.unlinked()

    def leave_if_cut_short(self) -> bool:
        """If the segment being written was truncated, write the next
        entries into a segment of their own (True then).

        Appended to it, they would follow a cut that may fall inside an
        append, where no reader finds them: every record logged after the
        cut, the run's finish entry included, was counted failed and the run
        closed as crashed. Written from the next seq on in a new segment, only
        what the cut itself took and no mover had copied yet is lost, and
        reported as damage."""
        with self.lock:
            if not self._spool.cut_short():
                return False
            self._spool.start_segment()
            return True

    def close(self) -> None:
        with self.lock:
            self._spool.close()
        self._spool.stop()


def _framed(batch: Sequence[Held], first: int) -> list[tuple[int, bytes]]:
    """``(seq, frame)`` of the held appends' entries from seq ``first``,
    compressed (no dictionary: the mover's may be another process's), a run
    of one kind at a time with the GIL released (``encode_frames_off_gil``)."""
    frames: list[tuple[int, bytes]] = []
    seq = first
    for kind, group in itertools.groupby(batch, key=lambda held: held.kind):
        payloads = [payload for held in group for payload in held.payloads]
        seqs = list(range(seq, seq + len(payloads)))
        frames.extend(zip(seqs, encode_frames_off_gil(kind, payloads, seqs), strict=True))
        seq += len(payloads)
    return frames
