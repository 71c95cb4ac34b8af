"""The spool: where a producer's appends land, one ``write()`` each.

A write transaction costs ~10 µs of LMDB's own and waits for LMDB's writer
lock, which the uplink holds while it records an in-flight batch or an
acknowledgement: a metrics row paid 4x ``json.dumps`` and a training step's
p99 several milliseconds for it. An append therefore writes its frames (raw,
each checksummed under its seq) to the end of a spool file, which the page
cache keeps across the process's death once ``write()`` returns, exactly as it
keeps an uncommitted-to-disk LMDB page; the mover (``mover``) absorbs them
into LMDB in batches, compressed, from another thread or from the uplink.

Readers see one log: LMDB's entries, then the spool's frames above them
(``SpoolView``). A segment file holds dense seqs from the one in its name,
``spool-<first seq>``; the appender starts a new one past ``SEGMENT_MAX``, so
a segment that has a successor is complete, and the mover deletes it once
LMDB holds all of it. Seqs a segment has at or past its successor's first are
not its own (a failed write that could not be undone moves on to a new
segment), and a frame cut short at a segment's end is one whose ``write()``
never returned: neither is part of the log.

Damage inside a segment (a header that cannot be an append's or a frame's)
ends what a reader takes of it. In a segment with a successor, what it cut
off is the gap before the successor's first seq, reported and counted as
missing (by its name, where the successor holds no whole append: its first
cut short by a death, ``named_after``). The newest segment has no successor
to tell it, so what it held from the damage on is counted from what comes
after it (``lost_at_end``: the whole appends found by their magic, the first
of each run placed by the seq its first entry's checksum covers, as is the
append cut short at the end where its first entry is whole; damaged ones by
their own headers, and a run with none, zeros too, as one call's, all that
is known of it), and the segment is kept until a successor comes,
so the damage is met, and counted, by every sink of any later process. An
append cut short at its end is still a call that never returned, and is not
counted; but one whose header runs past the end with whole appends after it
is damage in its length (the next append is written only once the one before
it is whole). Nor is a tail of zeros to the end, where nothing can be found
or placed: a power cut's (the file's size reached the disk, its last bytes
did not), reported as damage as before, counted as a torn tail is, not per
sink.

A read may also come back short of the size ``fstat`` gave, for a moment:
on FUSE and network file systems the size an append is writing can be seen
before its bytes can be read. That is a tail not there yet, parsed again at
the next look, never damage; and until a look reads it whole, nothing goes
past it (``frames``) nor deletes its segment (``absorbed``), even once it has
a successor. Taken as damage, it had the mover commit the successor's
entries past the rest of the segment, then delete it: the power-cut tests
found holes of up to a segment in LMDB so, with no power cut at all.

Why readers stay consistent while the mover absorbs and deletes: a view opens
the segments it lists before it reads LMDB, and an open file stays readable
after its name is deleted; a segment that is gone from the listing was
deleted after its frames were committed to LMDB, so the LMDB read that
follows sees them. Within one process, though, the views are one: a thread
(the mover, once it deleted a segment) may close a segment between another
thread's LMDB read and its look at the spool, and the entries that segment
held are then in neither as that reader saw them. ``forgotten`` counts the
segments a view closed; a reader that sees it move between the two looks
does not trust its look at the spool.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from primeruns.ascii_digits import decimal_or_none
from primeruns.exceptions import JournalError, JournalFullError
from primeruns.journal import checksum
from primeruns.journal.frames import (
    FRAME_VERSION,
    HEADER_SIZE,
    MAX_ENTRY_BYTES,
    FrameError,
    peek_header,
)
from primeruns.journal.fullness import disk_cause, note_too_large
from primeruns.journal.spoolsync import SegmentSyncer
from primeruns.journal.types import Damage
from primeruns.logs import get_logger

log = get_logger("primeruns.journal")

PREFIX = "spool-"
# Each append is written as this header and its frames: its magic, format
# version, entry count and the frames' total bytes. A reader takes an append
# only once all of it is there, so a call is in the log whole or not at all,
# as it was when each append was one LMDB transaction.
APPEND = struct.Struct("<2sHIQ")
# The most buffers one ``writev`` takes (POSIX's IOV_MAX on Linux): an
# append of more frames is joined and written with ``write``.
_IOV_MAX = 1024
# A frame's header up to its raw length (``frames``): version, kind, flags,
# dictionary id, raw length.
_FRAME_START = struct.Struct("<BBBBI")
_MAGIC = b"PS"
# The bytes every append starts with, its magic and version: what the scans
# past damage look for. The magic alone is two bytes, which text holds now
# and then and a crafted segment every two bytes: each was a look of its own
# (a segment of them took 2.2 s per process that opened the journal), though
# none but these can start an append.
_START = APPEND.pack(_MAGIC, 1, 0, 0)[:4]
SEGMENT_MAX = 4 << 20
# How far past ``SEGMENT_MAX`` a segment may go on while the sync of it
# asked for when it filled runs (all of it again: 4 MiB; ``SpoolWriter._goes_on``).
_GO_ON_SHARE = 1
# The bytes of a segment between two syncs ahead (see ``spoolsync``).
_AHEAD_STEP = 512 << 10
_READ_CHUNK = 1 << 20
_FIRST_LOOK = 256  # ``_next_magic``'s first read
_WINDOW = 64 << 10  # what one read of a scan past damage takes (``_Window``)
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_SEQ = struct.Struct(">Q")  # an entry's checksum covers its seq, so packed
# The highest seq a segment's name may say came before it (``named_after``):
# a read looks for the LMDB key (a u64) one past it.
_MAX_NAMED = (1 << 63) - 1


def _full(path: Path, exc: OSError) -> str:
    note_too_large(path, exc)
    return f"journal {path}: {disk_cause(path)} ({exc})"


def segment_name(first_seq: int) -> str:
    return f"{PREFIX}{first_seq:020d}"


def list_segments(path: Path) -> list[tuple[int, str]]:
    """(first seq, file name) of each spool segment in ``path``, in order."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    out = []
    for name in names:
        digits = name[len(PREFIX) :]
        if name.startswith(PREFIX) and len(digits) == 20:
            first = decimal_or_none(digits, 20)
            if first is not None:
                out.append((first, name))
    out.sort()
    return out


def spool_bytes(path: Path) -> int:
    """Bytes of the spool segments in ``path``."""
    total = 0
    for _, name in list_segments(path):
        with contextlib.suppress(OSError):
            total += (path / name).stat().st_size
    return total


#: An append from its ``write()`` until it is noted (``SpoolWriter.settle``):
#: (fd, the segment's size before it, its bytes, its last seq, the writer's
#: byte count before it). A plain tuple: a named one cost 0.4 µs an append.
_Pending = tuple[int, int, int, int, int]


class SpoolWriter:
    """The appender's end of the spool (called under the journal's lock)."""

    def __init__(
        self, path: Path, view: SpoolView, *, fsync: bool, written: threading.Event
    ) -> None:
        self._path = path
        self._view = view
        self._fsync = fsync
        self._fd: int | None = None
        self._size = 0  # bytes in the current segment
        # Bytes of it this writer's own syncs found on disk (``durability="fsync"``:
        # each append's), so a switch syncs only what one of them failed to.
        self._on_disk = 0
        # An append's own sync failed and none has succeeded since: warned
        # once (a disk failing every sync warned at every log call).
        self._sync_failing = False
        self.dirty = False  # written since the last sync
        self._written_event = written  # wakes the background sync
        # The last seq of each append and the bytes this process had written
        # by then: what is still to absorb, in bytes, for the budget.
        self._mark_seqs: list[int] = []
        self._mark_bytes: list[int] = []
        self._base = 0  # bytes written up to the last mark found absorbed
        self._written = 0
        # Syncs ahead and closes let-go segments off the log call (``spoolsync``).
        self._syncer = SegmentSyncer(path)
        self._segment = 0  # the open segment's number, for ``SegmentSyncer.synced``
        self._ahead_at = _next_sync_ahead(0)  # the segment's size at which a sync ahead is asked
        # The segment's size when it filled (0: not full yet), and whether
        # the next write goes on in it, as ``opens_next`` last decided for
        # (segment, size): the ``write`` after it keeps to that while the
        # syncer's thread moves on between them.
        self._filled = 0
        self._go_on: tuple[tuple[int, int], bool] | None = None
        # The last seq of the appends written whole; and, from the ``write()``
        # of one until it is noted, that append (see ``settle``).
        self.last_seq = 0
        self._pending: _Pending | None = None

    def unlinked(self) -> bool:
        """Whether the open segment lost its last name (its directory deleted
        under the run): one fstat."""
        fd = self._fd
        if fd is None:
            return False
        try:
            return os.fstat(fd).st_nlink == 0
        except OSError:
            return False

    def cut_short(self) -> bool:
        """Whether the open segment is shorter than what was written to it
        (truncated by something else: a ``cp`` or ``rsync --inplace`` onto
        it): one fstat. Under the append lock, as every write is."""
        fd, written = self._fd, self._size
        if fd is None:
            return False
        try:
            return os.fstat(fd).st_size < written
        except OSError:
            return False

    def opens_next(self) -> bool:
        """Whether the next write starts a segment (decided afresh: the
        appender asks before each append, and that write keeps to it)."""
        if self._fd is None:
            return True
        if self._size < SEGMENT_MAX:
            return False
        self._go_on = None
        return not self._goes_on()

    def _goes_on(self) -> bool:
        """Whether the next write goes on in the full segment, not in a
        successor: while the sync asked for when it filled has not ended,
        up to twice ``SEGMENT_MAX``.

        A training step logs its episodes and then a metrics row a moment
        later: where the episodes filled the segment, the row's call found
        the sync of it running and made one itself at the switch (1-13 ms,
        the loop's slowest calls). Written here, the row asks for a sync of
        all of it, which the loop's work between steps sees done. Only that
        first sync is waited for so: once it has ended, the next write
        switches and waits for the one asked since (``_sync_full_segment``),
        so a burst makes two syncs a segment, as when the switch made its
        own; going on after each sync kept the thread syncing back to back.

        Capped at an eighth past full (512 KiB), a burst whose first sync
        outlasted the eighth's writes (~70 ms of the backlog benchmark's
        loop, on a disk other work kept busy) made an inline ``fdatasync``
        at the switch, which ended after the first sync (2 of ~40 switches
        in four of its 20,000-episode runs: 11 and 71 ms). Going on, that
        switch waits for one sync, of what was written while the first ran;
        only a first sync that outlasts 4 MiB of writes meets the cap. A
        cap still: a disk whose sync hangs holds up the loop at 8 MiB
        rather than growing one file for good."""
        key = (self._segment, self._size)
        if self._go_on is None or self._go_on[0] != key:
            goes_on = (
                not self._fsync
                and self._filled > 0
                and self._size < SEGMENT_MAX + SEGMENT_MAX // _GO_ON_SHARE
                and self._syncer.tried(self._segment) < self._filled
            )
            self._go_on = (key, goes_on)
        return self._go_on[1]

    def write(self, first_seq: int, frames: list[bytes]) -> None:
        """Write the frames of seqs ``first_seq``... in one ``writev()``.

        Raises JournalFullError on a full disk, JournalError on another
        failure; either way nothing of them is left in the spool.
        """
        length = sum(map(len, frames))
        parts = [APPEND.pack(_MAGIC, 1, len(frames), length), *frames]
        nbytes = APPEND.size + length
        if self._fd is None:
            self._open(first_seq)
        elif self._size >= SEGMENT_MAX and not self._goes_on():
            self._sync_full_segment()
            try:
                self._open(first_seq)
            except JournalError:
                if self._fd is None or (self._path / segment_name(first_seq)).exists():
                    # The successor exists now (readers cut this segment at
                    # its first seq, a mover may delete this one): never go
                    # on here; the next write opens it again.
                    self.close()
                    raise
                # The directory is gone (deleted under a live run): the open
                # segment outlives its name, so go on in it.
        fd = self._fd
        assert fd is not None
        last = first_seq + len(frames) - 1
        self._pending = (fd, self._size, nbytes, last, self._written)
        done = 0
        try:
            # The header and the frames as they are, in one system call:
            # joined first, each byte of an episode was copied once more.
            if len(parts) <= _IOV_MAX:
                done = os.writev(fd, parts)
            if done < nbytes:  # a short write (a signal, the disk filling), or many frames
                data = b"".join(parts)
                while done < nbytes:
                    done += os.write(fd, data[done:])
        except OSError as exc:
            self._undo(done)
            self._pending = None
            if exc.errno == errno.EFBIG and self._size and self._fd == fd:
                # The segment met the file size limit (``ulimit -f`` below
                # ``SEGMENT_MAX``), which binds each file alone: the append
                # goes to a segment of its own. Left here, every later
                # append met the same limit and was dropped.
                note_too_large(self._path, exc)
                self.start_segment()
                self.write(first_seq, frames)
                return
            if exc.errno in _FULL:
                raise JournalFullError(_full(self._path, exc)) from None
            raise JournalError(f"write to journal {self._path} failed: {exc}") from None
        # Written: part of the log from here on, whatever the sync does.
        self.last_seq = last
        size = self._size = self._size + done
        if size >= self._ahead_at and not self._fsync:
            # Every ``_AHEAD_STEP``, and all of it at each write once full: a
            # switch that finds that sync done (after a pause of the loop)
            # has none to wait for.
            if size >= SEGMENT_MAX and not self._filled:
                self._filled = size
            self._ahead_at = _next_sync_ahead(size)
            self._syncer.sync(fd, self._segment, size)
        written = self._written = self._written + done
        self._mark_seqs.append(last)
        self._mark_bytes.append(written)
        self.dirty = True  # (``mark_dirty``, inline: every log call)
        if not self._written_event.is_set():
            self._written_event.set()
        self._pending = None
        if self._fsync:
            try:
                os.fdatasync(fd)
                self.dirty = False
                self._on_disk = size
                self._sync_failing = False
            except OSError as exc:
                # In the page cache, so it survives the process; the background
                # sync tries again, and the switch to a successor syncs it
                # first (``_sync_full_segment``). Raising would have the call
                # count records as dropped that every reader sees.
                if not self._sync_failing:
                    log.warning(
                        "journal %s: sync failed (%s); retrying in the background", self._path, exc
                    )
                self._sync_failing = True

    def settle(self) -> int:
        """The last seq written whole, once an append cut between its
        ``write()`` and its bookkeeping (an exception raised asynchronously:
        ``Appender._settle``) is settled from the segment's size: noted if
        all of it is there, taken back if part. Idempotent, so a cut of
        this too is settled the next time."""
        if self._pending is None:
            return self.last_seq
        fd, start, nbytes, last, written = self._pending
        try:
            size = os.fstat(fd).st_size if fd == self._fd else -1
        except OSError:
            size = -1
        end = start + nbytes
        if size == end:  # all of it: noted as write() notes it (absolute values)
            self.last_seq = max(self.last_seq, last)
            self._size = end
            self._written = written + nbytes
            if not self._mark_seqs or self._mark_seqs[-1] < last:
                self._mark_seqs.append(last)
                self._mark_bytes.append(self._written)
            if self._fsync and self._fd is not None:
                with contextlib.suppress(OSError):
                    os.fdatasync(self._fd)
            self.mark_dirty()
        elif size > start:  # part of it, not part of the log: taken back
            self._size = start
            self._undo(size - start)
        self._pending = None
        return self.last_seq

    def _sync_full_segment(self) -> None:
        """Sync the segment this process leaves before writing its successor
        (once per ``SEGMENT_MAX``): the kernel writes pages back in any order,
        and a power cut after the successor's reached the disk and before
        this one's would leave a hole in the log, not a lost tail. (With
        "fsync" each append was synced already, unless its sync failed: then
        the successor's first append, synced, reached the disk before it.)"""
        if self._fd is None:
            return
        if max(self._on_disk, self._syncer.synced(self._segment)) >= self._size:
            return  # synced ahead, or append by append, all of it
        if self._syncer.tried(self._segment) >= self._filled and self._syncer.await_sync(
            self._segment, self._size
        ):
            return  # the sync asked for by the last write, done (``_goes_on``)
        # Made here: none asked covers all of it, the first is still running
        # (past the cap), or the one that covered it failed (tried again
        # here, as before segments went on; a transient error would leave
        # a hole); one still waiting would sync it again.
        self._syncer.drop(self._segment)
        try:
            os.fdatasync(self._fd)
            self._on_disk = self._size
        except OSError as exc:
            log.warning("journal %s: sync failed (%s)", self._path, exc)

    def _open(self, first_seq: int) -> None:
        name = segment_name(first_seq)
        target = self._path / name
        if any(first > first_seq for first, _ in list_segments(self._path)):
            # A later segment exists: this process misread the log's end (a
            # segment it could not open); appending here would hide entries.
            raise JournalError(
                f"journal {self._path}: the spool holds entries past {first_seq - 1}; "
                "not appending until the log's end is read again"
            )
        try:
            fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            try:
                readable = os.dup(fd)
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            if exc.errno in _FULL:
                raise JournalFullError(_full(self._path, exc)) from None
            raise JournalError(f"cannot write journal {self._path}: {exc}") from None
        self.close()
        try:
            self._size = os.fstat(fd).st_size
        except OSError:
            self._size = 0
        if self._size:
            # An append cut short at this seq (its write never returned) is
            # not part of the log, and would shift every offset after it; a
            # whole one is, and this process misread the log's end.
            if _holds_an_append(fd, self._size):
                os.close(fd)
                os.close(readable)
                raise JournalError(
                    f"journal {self._path}: spool segment {name} already holds entries"
                )
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                self._size = 0
        self._fd = fd
        self._on_disk = 0
        self._segment += 1
        self._filled = 0
        self._ahead_at = _next_sync_ahead(self._size)
        # This process's readers read it through its own descriptor, so they
        # see it even if the directory is deleted under the run.
        self._syncer.close_later(self._view.adopt(first_seq, name, readable))
        if self._fsync:
            _sync_directory(self._path)  # the new name must survive a power loss too

    def _undo(self, written: int) -> None:
        """Take back a partial write; where that fails, go on in a new segment
        (readers ignore a segment's seqs from its successor's first on)."""
        if not written or self._fd is None:
            return
        try:
            os.ftruncate(self._fd, self._size)
        except OSError:
            # The next write opens a segment named by its own seq: this one
            # synced first, as at any switch (an append whose own sync
            # failed would be behind the successor's on disk: a hole).
            self.start_segment()

    def pending_bytes(self, absorbed_upto: int) -> int:
        """Bytes this process wrote for seqs past ``absorbed_upto``."""
        index = bisect_right(self._mark_seqs, absorbed_upto)
        if index:
            self._base = self._mark_bytes[index - 1]
            del self._mark_seqs[:index], self._mark_bytes[:index]
        return self._written - self._base

    def sync_handle(self) -> int | None:
        """A duplicate of the segment's descriptor to sync (None if nothing
        was written since the last): taken under the append lock, synced and
        closed outside it, so an append never waits behind a disk flush."""
        if self._fd is None or not self.dirty:
            return None
        self.dirty = False
        try:
            return os.dup(self._fd)
        except OSError:
            self.mark_dirty()
            return None

    def mark_dirty(self) -> None:
        """Written, not yet synced: the background sync is due."""
        self.dirty = True
        if not self._written_event.is_set():  # (no lock taken on the hot path)
            self._written_event.set()

    def open_next(self, first_seq: int) -> None:
        """Open the next segment, named ``first_seq``, before anything is
        written to it (``Appender._open_successor``); JournalError if it
        cannot be made."""
        if self._fd is None:
            self._open(first_seq)

    def start_segment(self) -> None:
        """The next write opens a segment of its own, named by its first
        seq: a segment holds dense seqs, and the next does not follow this
        one's (seqs skipped, ``Journal._appends_after``). This one is synced
        first, as at a switch."""
        self._sync_full_segment()
        self.close()

    def stored_past(self) -> None:
        """Entries were committed to LMDB past the spool (``Appender.put_frames``):
        see ``SpoolView.stored_past``."""
        self._view.stored_past()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def start_syncing(self) -> None:
        """Start the syncer's thread now, off the log calls (``spoolsync``)."""
        self._syncer.start()

    def stop(self) -> None:
        """The journal closes: the syncer's thread ends (not under the append
        lock: it may be in the middle of a sync)."""
        self._syncer.stop()


def _next_sync_ahead(size: int) -> int:
    """The size of the segment at which the next sync ahead is asked for:
    ``_AHEAD_STEP`` further on, or where it is full if that comes first;
    once full, at the next write (which goes on in it while the first sync
    of it runs: ``SpoolWriter._goes_on``)."""
    return size if size >= SEGMENT_MAX else min(size + _AHEAD_STEP, SEGMENT_MAX)


def _sync_directory(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _holds_an_append(fd: int, size: int) -> bool:
    """Whether the segment open as ``fd`` starts with a whole append."""
    try:
        magic, _, _, length = APPEND.unpack(os.pread(fd, APPEND.size, 0))
    except (OSError, struct.error):
        return False
    return bool(magic == _MAGIC and size >= APPEND.size + int(length))


class _NotReadableYet(Exception):
    """A read came back short of the size ``fstat`` gave (see the module doc)."""


class _Window:
    """A segment's bytes as one scan past damage reads them: a read takes
    ``_WINDOW`` bytes, and the looks within them read none. A look at each
    candidate append read its header, its first frame, the bytes to the
    next candidate, each a read of its own: a segment of false appends was
    read 16 times over, a read per 14 of its bytes."""

    def __init__(self, fd: int, budget: _Budget | None = None) -> None:
        self.fd = fd
        self._at = 0
        self._buf = b""
        self._budget = budget  # charged what each read takes

    def pread(self, size: int, offset: int) -> bytes:
        """As ``os.pread`` (short at the file's end)."""
        rel = offset - self._at
        if rel >= 0 and rel + size <= len(self._buf):
            return self._buf[rel : rel + size]
        self._buf, self._at = os.pread(self.fd, max(size, _WINDOW), offset), offset
        if self._budget is not None:
            self._budget.read(len(self._buf))
        return self._buf[:size]


def _read(src: int | _Window, size: int, offset: int) -> bytes:
    """``size`` bytes at ``offset`` of a descriptor, or through a scan's window."""
    return src.pread(size, offset) if isinstance(src, _Window) else os.pread(src, size, offset)


def _pread_whole(src: int | _Window, size: int, offset: int) -> bytes:
    data = _read(src, size, offset)
    if len(data) < size:
        raise _NotReadableYet
    return data


def _unread_before(seg: _Segment, successor: int) -> bool:
    """Whether ``seg`` may hold entries before its successor's first that
    could not be read yet: its last look read short (see the module doc). A
    tail torn for good (a power cut) reads whole, and holds none."""
    return seg.unread and seg.end < successor - 1


def _frames_in(
    fd: int | _Window,
    start: int,
    end: int,
    *,
    most: int | None = None,
    budget: _Budget | None = None,
) -> list[tuple[int, int, int]]:
    """(offset, kind, bytes) of each frame of the append body at
    ``start..end``, by their headers (read in chunks; payloads are skipped).
    Raises ValueError (FrameError) where the frames do not fill it exactly,
    or (``most``) there are more than ``most`` of them, _NotReadableYet
    where the body cannot all be read yet.

    With ``budget`` (a scan past damage, where a header may be anyone's)
    the first read is small and each next one twice as large, and each
    header is charged to it: a false append's claimed length costs what is
    looked at, not up to 1 MiB read."""
    out: list[tuple[int, int, int]] = []
    pos, buf, at = start, b"", start
    chunk = _READ_CHUNK if budget is None else _FIRST_LOOK
    most_read = _READ_CHUNK if budget is None else _WINDOW  # (a scan's: from its window)
    while pos < end:
        rel = pos - at
        if rel + HEADER_SIZE > len(buf):
            buf, at, rel = _pread_whole(fd, min(end - pos, chunk), pos), pos, 0
            chunk = min(2 * chunk, most_read)
        if budget is not None:
            budget.charge()
        head = peek_header(buf[rel : rel + HEADER_SIZE])
        if head.version != FRAME_VERSION or head.flags or head.raw_len > MAX_ENTRY_BYTES:
            raise ValueError("not a spooled entry's header")
        size = HEADER_SIZE + head.raw_len
        if pos + size > end:
            raise ValueError("an entry runs past the end of its append")
        if most is not None and len(out) == most:
            raise ValueError(f"an append of {most} entries holds more")
        out.append((pos, head.kind, size))
        pos += size
    return out


class _Budget:
    """The frame headers a scan past damage may look at: twice what its
    bytes can hold, and some. The whole appends it finds hold no more than
    its bytes; a false one (a magic in a payload) fails in a header or two.
    Only a crafted segment comes near it: false appends whose frames chain
    over each other's, each walked again from its own start to its end (a
    4 MiB segment of them: hours). Once it is spent, no append is taken
    whole: what is left is counted as damage is, by headers and runs."""

    def __init__(self, nbytes: int) -> None:
        self.left = 2 * (nbytes // HEADER_SIZE) + 4096
        # And the bytes its window may read: four times its own. Frames
        # far apart, each a read of the window's, walked from each of
        # many false appends, were read 11,000 times over (4 MiB: 40 GB).
        self._reads = 4 * nbytes + 4 * _WINDOW

    def read(self, nbytes: int) -> None:
        """The window read ``nbytes``: once too many are, no frame is walked."""
        self._reads -= nbytes
        if self._reads < 0:
            self.left = 0

    def charge(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise ValueError("past the scan's budget")


def _append_at(
    fd: int | _Window, pos: int, size: int, budget: _Budget | None = None
) -> tuple[int, int, int, int] | None:
    """(entries, end, first frame's offset, its bytes) of a well-formed append
    at ``pos`` of a segment of ``size`` bytes; ``end`` is -1 for one cut short
    at the segment's end (its call never returned). None where none starts,
    or its frames are not looked at, ``budget`` spent."""
    try:
        magic, version, count, length = APPEND.unpack(_pread_whole(fd, APPEND.size, pos))
    except (OSError, struct.error, _NotReadableYet):
        return None
    if (
        magic != _MAGIC
        or version != 1
        or not count
        or not count * HEADER_SIZE <= length <= count * (HEADER_SIZE + MAX_ENTRY_BYTES)
    ):
        return None
    body = pos + APPEND.size
    if body + length > size:
        return count, -1, body, 0
    if budget is not None and budget.left <= 0:
        return None
    try:
        # No more than ``count`` frames: one more says it is not this append.
        frames = _frames_in(fd, body, body + length, most=count, budget=budget)
    except (OSError, ValueError, _NotReadableYet):
        return None
    if len(frames) != count:
        return None
    return count, body + length, frames[0][0], frames[0][2]


def _next_magic(fd: int | _Window, pos: int, size: int) -> int:
    """Where the next append's start (its magic and version: ``_START``) is,
    at or after ``pos`` (``size``: nowhere).

    Read a small chunk first, then twice as much each time: bytes past
    damage may hold it every few bytes (a crafted segment: 200 KB of it
    read 10 GB in 1 MiB reads, one per start), so what a call reads is
    bounded by twice the distance to the start it finds."""
    chunk_size = _FIRST_LOOK
    while pos < size:
        try:
            chunk = _read(fd, min(chunk_size, size - pos), pos)
        except OSError:
            return size
        if len(chunk) < len(_START):
            return size
        at = chunk.find(_START)
        if at >= 0:
            return pos + at
        pos += len(chunk) - (len(_START) - 1)  # a start across two chunks is found
        chunk_size = min(2 * chunk_size, _READ_CHUNK)
    return size


def _whole_append_in(fd: int, pos: int, size: int) -> bool:
    """Whether a whole append starts at or after ``pos`` in a segment of
    ``size`` bytes. Past the header of an append cut short (one being
    written, or whose call a death interrupted) none can: the next append is
    written only once it is whole. One found there says the header's length
    is damaged, and the appends after it were written whole.

    A crafted segment that would have it look at more frame headers than
    its bytes hold (``_Budget``) has none found past that: its tail is
    taken as one being written, as it was before any look past it."""
    budget = _Budget(size - pos)
    return _whole_append_from(_Window(fd, budget), pos, size, budget) < size


def _whole_append_from(src: _Window, pos: int, size: int, budget: _Budget) -> int:
    """Where the first whole append at or after ``pos`` starts (``size``:
    none is, or none is found with what is left of ``budget``)."""
    pos = _next_magic(src, pos, size)
    while pos + APPEND.size <= size and budget.left > 0:
        found = _append_at(src, pos, size, budget)
        if found is not None and found[1] >= 0:
            return pos
        pos = _next_magic(src, pos + 1, size)
    return size


def _unchanged(seg: _Segment, head: bytes, size: int) -> bool:
    """Whether the tail ``_parse`` looked at is still there as it was: an
    appender that undid a partial write (truncated back, ``SpoolWriter._undo``)
    may have written whole appends where it was since (looked at again)."""
    try:
        same = (
            os.fstat(seg.fd).st_size == size and os.pread(seg.fd, APPEND.size, seg.parsed) == head
        )
    except OSError:
        same = False
    if not same:
        seg.tail_checked = -1
    return same


def _all_zero(fd: int | _Window, pos: int, size: int) -> bool:
    """Whether the bytes from ``pos`` to ``size`` are all zero (a tail never
    written: a power cut's, where the file's size reached the disk and its
    bytes did not)."""
    while pos < size:
        try:
            chunk = _read(fd, min(_READ_CHUNK, size - pos), pos)
        except OSError:
            return False
        if not chunk:
            return False
        if chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True


def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ (0xEDB88320 if c & 1 else 0)
        table.append(c)
    return table


# zlib's CRC-32 table, and each entry's index by its top byte (all 256 differ):
# what undoes a byte of it (``_forced``).
_CRC_TABLE = _crc_table()
_CRC_BY_TOP = {entry >> 24: index for index, entry in enumerate(_CRC_TABLE)}


def _forced(crc: int, target: int) -> bytes:
    """The one 4 bytes whose CRC-32 continuing ``crc`` is ``target``.

    CRC-32 over 4 bytes is a bijection for a given start: each byte's step
    takes the table entry its top byte names, so the steps can be undone
    from the end (which entries), then done from the start (which bytes)."""
    state, picked = target ^ 0xFFFFFFFF, []
    for _ in range(4):
        index = _CRC_BY_TOP[state >> 24]
        picked.append(index)
        state = ((state ^ _CRC_TABLE[index]) << 8) & 0xFFFFFFFF
    state, out = crc ^ 0xFFFFFFFF, bytearray()
    for index in reversed(picked):
        out.append((state ^ index) & 0xFF)
        state = _CRC_TABLE[index] ^ (state >> 8)
    return bytes(out)


def _seq_by_checksum(fd: int | _Window, offset: int, nbytes: int, lo: int, hi: int) -> int | None:
    """The seq in ``lo..hi`` under which the entry frame at ``offset`` checks
    out (an entry's checksum covers its seq), None if none does.

    Not by trying each: the seq is the checksum's last 8 bytes (big-endian),
    and for given top 4 bytes just one bottom 4 gives the frame's checksum
    (``_forced``). Tried one by one, a range as wide as the damage before a
    frame was searched for each whole append past it whose first entry is
    damaged too: a segment of damaged runs and such appends took time
    quadratic in its size (128 KB: 0.4 s; 4 MiB: minutes)."""
    hi = min(hi, (1 << 64) - 1)  # (a crafted segment name: no seq is past it)
    if lo > hi:
        return None
    try:
        frame = _pread_whole(fd, nbytes, offset)
        head = peek_header(frame)
    except (OSError, FrameError, _NotReadableYet):
        return None
    crc = checksum.crc32(frame[HEADER_SIZE:], checksum.crc32(frame[:8]))
    for top in range(lo >> 32, (hi >> 32) + 1):  # (one, but where lo..hi crosses 2**32)
        high = top.to_bytes(4, "big")
        seq = top << 32 | int.from_bytes(_forced(checksum.crc32(high, crc), head.crc), "big")
        if lo <= seq <= hi:
            return seq
    return None


def _said_by(fd: int | _Window, pos: int, size: int) -> tuple[int, int] | None:
    """(entries, end) a damaged append at ``pos`` says it has, where its
    count and length fit each other and the segment (its magic aside)."""
    try:
        _, _, count, length = APPEND.unpack(_pread_whole(fd, APPEND.size, pos))
    except (OSError, struct.error, _NotReadableYet):
        return None
    end = pos + APPEND.size + length
    fits = count > 0 and count * HEADER_SIZE <= length <= count * (HEADER_SIZE + MAX_ENTRY_BYTES)
    return (count, end) if fits and end <= size else None


def _first_seq_of(src: _Window, body: int, size: int, lo: int, hi: int) -> int | None:
    """The seq in ``lo..hi`` of the first entry of an append cut short, its
    body at ``body`` of a segment of ``size`` bytes, where that entry is whole
    and checks out under one (``_seq_by_checksum``)."""
    try:
        head = peek_header(_pread_whole(src, HEADER_SIZE, body))
    except (OSError, FrameError, _NotReadableYet):
        return None
    nbytes = HEADER_SIZE + head.raw_len
    if head.version != FRAME_VERSION or head.flags or body + nbytes > size:
        return None
    return _seq_by_checksum(src, body, nbytes, lo, hi)


class _Held(NamedTuple):
    """Where ``_held_from`` got to that later bytes cannot change: the byte
    after a whole append (or the damage), and what it had found before it."""

    pos: int
    last: int
    seq: int | None
    whole: int
    unsure: int
    skipped: int
    skipped_bytes: int


def _held_from(
    fd: int, start: int, size: int, first: int, resume: _Held | None = None
) -> tuple[int, int, _Held]:
    """(entries, bytes) a segment of ``size`` bytes held from byte ``start``,
    where damage ended its parse at seq ``first``, and where to ``resume``
    once it has grown (a producer appending still: the bytes before the last
    whole append are not looked at again).

    The whole appends after the damage are found by their magic, and the
    first of each run of them by the seq its first entry checks out under
    (an entry's checksum covers its seq): every seq up to the last one is
    held. Damaged appends past it count what their headers say, where that
    fits, else one each (whole bytes of a call that returned). An append
    cut short at the end never returned: not counted; but where its first
    entry is whole it is placed as a whole one is, and every seq before it
    is held."""
    if resume is None:
        resume = _Held(start, first - 1, None, start, 0, 0, 0)
    # ``last``: the last seq known held; ``seq``: the seq of the append at
    # ``pos``, while known; ``whole``: where the bytes after ``last`` begin;
    # ``unsure``: entries of damaged appends after ``last``; ``skipped``:
    # those of the whole ones among them no seq was found for, in
    # ``skipped_bytes``.
    pos, last, seq, whole, unsure, skipped, skipped_bytes = resume
    known = True  # an append starts at ``pos``
    end = size
    budget = _Budget(size - pos)
    src = _Window(fd, budget)
    ahead = -1  # the first whole append past the last looked for (``size``: none)
    while pos + APPEND.size <= size:
        found = None if pos == start else _append_at(src, pos, size, budget)
        if found is not None and found[1] < 0 and ahead <= pos:
            # (looked for once past each one found: ``pos`` only grows)
            ahead = _whole_append_from(src, pos + 1, size, budget)
        if found is not None and found[1] < 0 and ahead < size:
            # One runs past the end, yet whole appends follow it: damage in
            # its length, as the parse finds it (the next append is written
            # only once the one before it is whole), not the end's. Taken
            # for a death's, it ended the count: not one after it counted.
            found = None
        if found is not None and found[1] < 0:
            end = pos  # cut short at the end: its call never returned, not counted
            if seq is None:
                # Damage before it that no whole append placed. Its first
                # entry, where whole, says by its checksum the seq it was to
                # have: every one before it was a call's that returned. Else
                # what that damage held is counted as its headers say, and a
                # run with none (zeros where pages never reached the disk:
                # one append's header or many, nothing tells) as one call's.
                low = last + 1 + skipped
                top = low + (pos - whole - skipped_bytes) // HEADER_SIZE
                placed = _first_seq_of(src, found[2], size, low, top)
                if placed is not None:
                    last, unsure = placed - 1, 0
            break
        if found is not None:
            count, stop, offset, nbytes = found
            if seq is None:
                # Past the whole appends skipped, each of the bytes' other
                # entries takes a frame header at least: the range stays as
                # wide as the damage, however many are skipped.
                low = last + 1 + skipped
                top = low + (pos - whole - skipped_bytes) // HEADER_SIZE
                seq = _seq_by_checksum(src, offset, nbytes, low, top)
            if seq is not None:
                last, seq, unsure, skipped, skipped_bytes = seq + count - 1, seq + count, 0, 0, 0
                whole = stop
            else:  # whole, but its first entry is damaged
                unsure, skipped, skipped_bytes = (
                    unsure + count,
                    skipped + count,
                    skipped_bytes + stop - pos,
                )
            pos, known = stop, True
            resume = _Held(pos, last, seq, whole, unsure, skipped, skipped_bytes)
            continue
        seq = None
        said = _said_by(src, pos, size) if known else None
        if said is not None:
            unsure += said[0]
            land = said[1]  # where its length says the next one starts, if one does
            if land == size or _append_at(src, land, size, budget) or _said_by(src, land, size):
                pos = land  # (the next start is not looked for: where there is
                continue  # none, each of a chain of them looked to the end)
        onward = _next_magic(src, pos + 1, size)
        if said is None and known and not (onward == size and _all_zero(src, pos, size)):
            unsure += 1  # (zeros to the end: a tail never written, as a torn one)
        pos, known = onward, False
    return last - first + 1 + unsure, end - start, resume


@dataclass(frozen=True)
class TornTail:
    """A segment's end that is part of an append: ``bytes`` of it after
    entry ``after``, of an append of ``entries`` entries (0: unreadable)."""

    name: str
    after: int
    bytes: int
    entries: int


@dataclass
class _Segment:
    first: int
    name: str
    fd: int
    parsed: int = 0  # bytes parsed into frames
    offsets: list[int] = field(default_factory=list)  # frame i (seq first+i) starts here
    kinds: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # whole frame bytes
    broken: Damage | None = None  # a header that cannot be a frame: parsing stops there
    tail: int = 0  # bytes past the last whole append (an append cut short, or being written)
    tail_entries: int = 0  # the entries that append's header says it holds (0: unreadable)
    own: bool = False  # this process appends to it: kept until absorbed, listed or not
    unread: bool = False  # the last look read less than fstat said is there (module doc)
    broken_at: int = -1  # the byte where damage ended the parse (-1: none found there)
    tail_checked: int = -1  # the size at which the tail was looked at (``_whole_append_in``)
    lost: Damage | None = None  # ``lost_at_end``'s report, as of the size in ``lost_size``
    lost_size: int = -1
    held: _Held | None = None  # where ``lost_at_end``'s look may go on from

    @property
    def end(self) -> int:
        """The last seq parsed (first - 1 when none)."""
        return self.first + len(self.offsets) - 1


class SpoolView:
    """The spool's frames as this process sees them (a cache of their headers)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._segments: dict[int, _Segment] = {}
        # Held while a segment's file is read, so that no thread closes it
        # under another (a reused descriptor would read another file).
        self.lock = threading.RLock()
        # Segments that could not be opened (not gone: absorbed ones are).
        self.problems: list[Damage] = []
        # Segments closed so far (see the module doc): read, then compared
        # under ``lock``, by a reader that looked at LMDB in between.
        self.forgotten = 0

    def refresh(self) -> None:
        """Open the segments listed now (before any LMDB read that the spool
        continues: see the module doc) and parse what was appended to them."""
        with self.lock:
            self._refresh()

    def _refresh(self) -> None:
        self.problems = []  # as of this look: a segment may open next time
        listed = list_segments(self._path)
        names = {first for first, _ in listed}
        own = [f for f, seg in self._segments.items() if seg.own]
        newest_own = max(own) if own else None
        for first in [f for f in self._segments if f not in names]:
            # Deleted once absorbed: LMDB has it. Only the segment being
            # written is kept unlisted (the directory deleted under the run).
            if not self._segments[first].own or (names and first != newest_own):
                self._forget(first)
        for first, name in listed:
            if first not in self._segments:
                try:
                    fd = os.open(self._path / name, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
                except FileNotFoundError:
                    continue  # deleted since the listing: absorbed
                except OSError as exc:
                    self.problems.append(Damage(first, f"spool segment {name} unreadable: {exc}"))
                    continue
                seg = self._segments[first] = _Segment(first, name, fd)
                try:
                    regular = stat.S_ISREG(os.fstat(fd).st_mode)
                except OSError:
                    regular = False
                if not regular:
                    seg.broken = Damage(first, f"spool segment {name} is not a regular file")
        for seg in self._segments.values():
            self._parse(seg)

    def let_go(self) -> None:
        """Close the segments a mover elsewhere absorbed and deleted, without
        parsing anything (the appender's background thread: a parse of what
        it wrote would compete with its appends for nothing)."""
        with self.lock:
            listed = {first for first, _ in list_segments(self._path)}
            if not listed:
                return  # none left, or the directory is gone: keep what is open
            newest = max(self._segments, default=None)
            for first in [f for f in self._segments if f not in listed and f != newest]:
                self._forget(first)

    def adopt(self, first: int, name: str, fd: int) -> list[int]:
        """The appender opened segment ``first``: read it through ``fd``.

        Returns the descriptors of this appender's earlier segments deleted
        since (absorbed), let go here, for the caller to close: they would
        hold the files' blocks for good, and the close that frees them takes
        milliseconds a log call should not wait for."""
        let_go: list[int] = []
        with self.lock:
            old = self._segments.get(first)
            if old is not None:
                self._forget(first)
            if self._path.is_dir():
                for f, seg in list(self._segments.items()):
                    if seg.own and not (self._path / seg.name).exists():
                        let_go.append(self._forget(f, close=False))
            self._segments[first] = _Segment(first, name, fd, own=True)
        return let_go

    def _parse(self, seg: _Segment) -> None:
        """Index the appends written to ``seg`` since the last look: an append
        is taken whole or not at all (one still being written, or cut short
        by a death, is not part of the log)."""
        if seg.broken is not None:
            return
        seg.unread = False
        # One read takes in the headers of several appends and their frames:
        # a read for each header, and one of each append's body for its
        # frames' headers, were 18 us of a 9 KB episode's parse (a read of
        # the frame itself is 5), in every process that reads the spool.
        src = _Window(seg.fd)
        try:
            size = os.fstat(seg.fd).st_size
            seg.tail, seg.tail_entries = size - seg.parsed, 0
            while seg.parsed + APPEND.size <= size:
                head = _pread_whole(src, APPEND.size, seg.parsed)
                magic, version, count, length = APPEND.unpack(head)
                if (
                    magic != _MAGIC
                    or version != 1
                    or not count
                    or not count * HEADER_SIZE <= length <= count * (HEADER_SIZE + MAX_ENTRY_BYTES)
                ):
                    raise ValueError("not the start of an append")
                body = seg.parsed + APPEND.size
                if body + length > size:
                    seg.tail_entries = count
                    if seg.tail_checked != size:
                        # Looked at once per size: a tail is being written,
                        # or cut short, or damage in its header's length.
                        seg.tail_checked = size
                        if _whole_append_in(seg.fd, seg.parsed + 1, size) and _unchanged(
                            seg, head, size
                        ):
                            raise ValueError(
                                "an append's header says it runs past the segment's end, "
                                "yet whole appends follow it"
                            )
                    return  # still being written, or cut short by a death
                if seg.end + count > _MAX_NAMED:  # (a crafted name: no LMDB key holds them)
                    raise ValueError("an append's seqs run past the last a key may hold")
                if count == 1:
                    # Most appends are one record: its frame's header alone,
                    # where it fills the append as a spooled entry's does
                    # (anything else takes ``_frames_in``'s look, and its word).
                    version, kind, flags, _, raw_len = _FRAME_START.unpack(
                        _pread_whole(src, _FRAME_START.size, body)
                    )
                    if version == FRAME_VERSION and not flags and HEADER_SIZE + raw_len == length:
                        seg.offsets.append(body)
                        seg.kinds.append(kind)
                        seg.lengths.append(length)
                        seg.parsed = body + length
                        seg.tail = size - seg.parsed
                        continue
                frames = _frames_in(src, body, body + length)
                if len(frames) != count:
                    raise ValueError(f"an append of {count} entries holds {len(frames)}")
                for offset, kind, frame_size in frames:
                    seg.offsets.append(offset)
                    seg.kinds.append(kind)
                    seg.lengths.append(frame_size)
                seg.parsed = body + length
                seg.tail = size - seg.parsed
        except _NotReadableYet:
            seg.unread = True  # a tail being written: the next look parses it (module doc)
        except (OSError, ValueError, struct.error) as exc:
            seq = seg.end + 1
            seg.broken = Damage(seq, f"spool segment {seg.name} at entry {seq}: {exc}")
            seg.broken_at = seg.parsed

    def stored_past(self) -> None:
        """Entries were committed to LMDB past the spool, not through it
        (``Appender.put_frames``): a reader of this process that looked at
        LMDB before does not trust its look at the spool, as after a segment
        closed (``forgotten``). It found the segment opened after them,
        named past them, and reported them missing: a shipper passed them."""
        with self.lock:
            self.forgotten += 1

    def _forget(self, first: int, *, close: bool = True) -> int:
        """Let go of segment ``first``; its descriptor, closed unless not ``close``."""
        seg = self._segments.pop(first)
        self.forgotten += 1
        if close:
            with contextlib.suppress(OSError):
                os.close(seg.fd)
        return seg.fd

    def _ordered(self) -> list[_Segment]:
        return [self._segments[f] for f in sorted(self._segments)]

    def frames(self, after: int) -> Iterator[tuple[int, int, int, _Segment, int]]:
        """(seq, kind, frame bytes, segment, index) of each spooled frame past
        ``after``, ascending; a segment's seqs stop short of its successor's.
        They stop at a segment whose last appends cannot be read yet (see
        the module doc): never past entries the next look may find.
        Iterate it, and read what it yields, under ``lock``."""
        segments = self._ordered()
        for i, seg in enumerate(segments):
            stop = segments[i + 1].first if i + 1 < len(segments) else None
            start = max(0, after + 1 - seg.first)
            for index in range(start, len(seg.offsets)):
                seq = seg.first + index
                if stop is not None and seq >= stop:
                    break
                yield seq, seg.kinds[index], seg.lengths[index], seg, index
            if stop is not None and _unread_before(seg, stop) and after < stop - 1:
                return

    def frames_newest_first(
        self, after: int, below: int | None = None
    ) -> Iterator[tuple[int, int, int, _Segment, int]]:
        """``frames(after)`` newest first, those below seq ``below`` only
        (None: all): a reader of the last entries looks at the newest
        segment's last frames, not at every frame spooled. Iterate it, and
        read what it yields, under ``lock``."""
        segments = self._ordered()
        last = len(segments)  # where ``frames`` stops: past an unread tail
        for i, seg in enumerate(segments[:-1]):
            stop = segments[i + 1].first
            if _unread_before(seg, stop) and after < stop - 1:
                last = i + 1
                break
        for i in range(last - 1, -1, -1):
            seg = segments[i]
            end = len(seg.offsets)
            if i + 1 < len(segments):
                end = min(end, segments[i + 1].first - seg.first)
            if below is not None:
                end = min(end, below - seg.first)
            for index in range(end - 1, max(0, after + 1 - seg.first) - 1, -1):
                yield seg.first + index, seg.kinds[index], seg.lengths[index], seg, index

    def end(self) -> int:
        """The highest seq spooled (0 when none). A segment named past the
        last seq a key may hold (a crafted name) holds none of the log's: its
        appends are damage (``_parse``), and its name ends nothing."""
        with self.lock:
            segments = [seg for seg in self._ordered() if seg.first <= _MAX_NAMED]
            ends = [seg.end for seg in segments]
        best = 0
        for i, end in enumerate(ends):
            last = end if i + 1 == len(segments) else min(end, segments[i + 1].first - 1)
            best = max(best, last)
        return best

    def damage(self) -> list[Damage]:
        with self.lock:
            found = [seg.broken for seg in self._ordered() if seg.broken is not None]
            lost = self.lost_at_end()
            if lost is not None:  # the newest segment's, with the entries it cost
                found[-1] = lost
            return [*self.problems, *found]

    def lost_at_end(self) -> Damage | None:
        """What damage in the newest segment cost: the entries it held from
        the damage on, none of which a reader takes, and no successor's
        first seq tells (see the module doc); None where it has none."""
        with self.lock:
            newest = self._segments.get(max(self._segments, default=-1))
            if newest is None or newest.broken is None or newest.broken_at < 0:
                return None
            try:
                size = os.fstat(newest.fd).st_size
            except OSError:
                return newest.broken
            if newest.lost is None or newest.lost_size != size:
                # Counted again only if it grew (a producer appending still),
                # from its last whole append: each read of a growing segment
                # looked at all of it again, quadratic in its appends.
                first = newest.end + 1
                resume = newest.held if size > newest.lost_size else None
                entries, nbytes, newest.held = _held_from(
                    newest.fd, newest.broken_at, size, first, resume
                )
                what = f"{newest.broken.what} ({entries} entries in {nbytes} bytes from there on)"
                newest.lost, newest.lost_size = Damage(first, what, entries), size
            # None where it held nothing a call returned with (zeros never written).
            return newest.lost if newest.lost.entries else None

    def named_after(self, end: int) -> int:
        """The last seq a segment's name says came before it, past ``end``
        (where a read that took every frame ended): a segment that holds no
        whole append (its first cut short by a death, or none written yet)
        still names its first seq, and a segment before it that damage cut
        short held every seq below it. ``end`` where none does, or while a
        segment's last appends cannot be read yet (see the module doc)."""
        with self.lock:
            segments = self._ordered()
            best = end
            for i, seg in enumerate(segments):
                if i + 1 < len(segments) and _unread_before(seg, segments[i + 1].first):
                    return end
                if seg.first <= _MAX_NAMED:  # (a crafted name: no key holds it)
                    best = max(best, seg.first - 1)
            return best

    def lost_after(self, end: int) -> Damage | None:
        """``lost_at_end``'s entries past ``end``, the log's end as a reader
        found it, if they follow it: the mover may have moved some of them
        into LMDB before the damage (none: all of them were)."""
        lost = self.lost_at_end()
        if lost is None or lost.seq is None or not lost.seq <= end + 1 < lost.seq + lost.entries:
            return None
        if lost.seq == end + 1:
            return lost
        return replace(lost, seq=end + 1, entries=lost.seq + lost.entries - end - 1)

    def torn_tails(self) -> list[TornTail]:
        """Each segment's bytes past its last whole append, as last parsed
        (see ``torn`` for when they are damage)."""
        with self.lock:
            return [
                TornTail(seg.name, seg.end, seg.tail, seg.tail_entries)
                for seg in self._ordered()
                if seg.tail and seg.broken is None
            ]

    def read_run(self, seg: _Segment, start: int, stop: int) -> list[memoryview] | None:
        """The stored frames ``start``..``stop - 1`` of ``seg``, read in one
        ``pread`` (views into one buffer): the mover's batch of 512 frames,
        read a frame at a time, was a system call and a copy of each. None
        where the span cannot be read whole: ``read`` of each frame then
        says which is unreadable, and why."""
        begin = seg.offsets[start]
        size = seg.offsets[stop - 1] + seg.lengths[stop - 1] - begin
        try:
            data = os.pread(seg.fd, size, begin)
        except OSError:
            return None
        if len(data) != size:
            return None
        view = memoryview(data)
        return [
            view[off - begin : off - begin + length]
            for off, length in zip(seg.offsets[start:stop], seg.lengths[start:stop], strict=True)
        ]

    def read(self, seg: _Segment, index: int) -> bytes:
        """The stored frame ``index`` of ``seg``; JournalError if unreadable."""
        try:
            data = os.pread(seg.fd, seg.lengths[index], seg.offsets[index])
        except OSError as exc:
            raise JournalError(f"spool segment {seg.name} unreadable: {exc}") from None
        if len(data) != seg.lengths[index]:
            raise JournalError(f"spool segment {seg.name} was cut short")
        return data

    def absorbed(
        self, upto: int, *, newest_too: bool, sync: Callable[[], bool] | None = None
    ) -> None:
        """Delete each segment LMDB holds all of (``upto``): one that has a
        successor (complete), and with ``newest_too`` (no appender is left)
        the newest as well, once nothing is being written to it.

        ``sync`` (LMDB's) is called before the first delete: a delete may
        reach the disk before a commit that was never synced, and a power cut
        between the two would lose the segment's entries from both. Where it
        returns False, nothing is deleted."""
        with self.lock:
            self._absorbed(upto, newest_too, sync)

    def _absorbed(self, upto: int, newest_too: bool, sync: Callable[[], bool] | None) -> None:
        segments = self._ordered()
        done = []
        for i, seg in enumerate(segments):
            newest = i + 1 == len(segments)
            if newest and not newest_too:
                continue
            # Parsed again first: what was parsed may predate the segment's
            # last appends (its successor was made since, by this process).
            self._parse(seg)
            if newest and seg.broken_at >= 0 and self.lost_after(upto) is not None:
                # Its damage cost entries LMDB does not hold, counted from
                # it: kept (module doc). Not where it cost none, or LMDB
                # holds them all (moved before the damage): nothing to count.
                continue
            if not newest and _unread_before(seg, segments[i + 1].first):
                continue  # kept until the rest of it is read, and moved
            stop = seg.end if newest else min(seg.end, segments[i + 1].first - 1)
            if stop <= upto:
                done.append(seg)
        if done and sync is not None and not sync():
            return
        for seg in done:
            with contextlib.suppress(OSError):
                os.unlink(self._path / seg.name)
            self._forget(seg.first)

    def close(self) -> None:
        with self.lock:
            for first in list(self._segments):
                self._forget(first)
