"""Appending entries: the producer's one write on a ``log_*`` call.

An append frames its records under the append lock, where each one's
sequence number is known (the checksum covers it), and writes them to the
spool in one ``write()`` (``spool``): once it returns they survive the
process's death, and every reader sees them. Compressing them and moving them
into LMDB is the mover's work, off this thread (``mover``): the background
sync's tick wakes it a second after writes, while they come, and near the
byte budget the room count wakes it too (``capacity``). At the byte budget or
on a full disk the records are dropped and counted, never raised.
"""

from __future__ import annotations

import contextlib
import os
import threading
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
from primeruns.journal.frames import HEADER_SIZE, EntryKind, encode_frame
from primeruns.journal.layout import put_entry
from primeruns.journal.spool import SpoolWriter
from primeruns.journal.tail import OwnTail, read_end, stored_end
from primeruns.journal.txn import Transactions, release_reserve
from primeruns.journal.types import AppendResult


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
        k = int(kind)
        try:
            with self.lock:
                if self._unsettled:
                    self._settle()
                if self.moved:
                    raise JournalMovedError(f"journal {self._tx.path} was re-created")
                if self._finished:
                    raise RunFinishedError(FINISHED_WHILE_LOGGING)
                if not essential and not self._capacity.room_for(size):
                    self._tx.tight = True
                    raise JournalFullError("journal byte budget reached")
                self._unsettled = True
                first, frames = self._write(k, payloads, essential)
                # Under the lock that chose ``first``: the next append's seq
                # follows this one's, whichever thread it comes from.
                last = self._tail.last = first + len(frames) - 1
                self._finished = final
                self._unsettled = False
        except JournalFullError:
            self._count_drops(len(payloads))
            return AppendResult(None, 0, len(payloads))
        # The mover is not woken here but by the background sync's tick (see
        # ``maintenance``), or by the room count near the budget (``capacity``).
        self._tail.notify()
        return AppendResult(first, last - first + 1, 0)

    def _write(
        self, kind: int, payloads: Sequence[bytes], essential: bool
    ) -> tuple[int, list[bytes]]:
        """Frame the payloads after the log's end and spool them (under the
        append lock): (the first seq, the frames)."""
        for attempt in (1, 2):
            first = max(self._tail.last, self.after) + 1
            if first > self._tail.last + 1:
                self._spool.start_segment()
            frames = [
                encode_frame(kind, p, compress=False, seq=seq)
                for seq, p in enumerate(payloads, first)
            ]
            if self._frames_unsynced and self._spool.opens_next():
                self._sync_frames()
            try:
                if self._spool.opens_next() and first <= self._stored_end():
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
        first = frames[0][0]
        entries = self._tx.dbs["entries"]
        with self.lock:
            if self._unsettled:
                self._settle()
            if self.moved or self._finished:
                return False
            end = self._tail.last
            if first != max(end, self.after) + 1:
                return False
            if any(seq != first + i for i, (seq, _) in enumerate(frames)):
                return False
            if not self._capacity.room_for(sum(len(frame) for _, frame in frames)):
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
                    if not self._tx.write(put, control=False):
                        return False
            except JournalFullError:
                return False
            self._spool.stored_past()
            # The open segment's seqs end before the frames': the next
            # append opens a segment of its own.
            self._spool.start_segment()
            self._tail.last = frames[-1][0]
            self._frames_unsynced = True
        self._tail.notify()
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
