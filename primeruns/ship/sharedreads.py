"""Entries read from the journal once for all the shippers that take them.

Every episode of an evaluation goes to two sinks, Prime Traces and the
sample table (of a training run: Prime Traces and the training sample
table), and each sink's shipper read it for itself: copied out of LMDB or
the spool, its checksum verified and its frame decompressed twice. Here
the shipper ahead reads for both: what it reads is kept, in order, in a
*window* of the entries of every kind those sinks take, and the shipper
behind takes its entries from there.

The window always holds every entry of its kinds in its span ``(lo, hi]``
and nothing damaged: a read that met damage is not kept (damage is told
to each sink by its own read, of its own kinds: a damaged entry of a kind
a sink does not take is none of its business), and the window starts
afresh past it. A read from outside the window (a sink that fell further
behind than the window keeps, or reads again from where a batch began) is
the sink's own read of the journal, as before. What is kept is what some
shipper has not read past yet, bounded by ``KEEP_BYTES`` of payloads: the
oldest are kept, which the sink behind needs first, and what does not fit
it reads for itself (a backlog's batch of Prime Traces is 30 MB). Entries never
change once written, and compaction removes only entries every sink
acknowledged, so what the window holds stays true. Shared by the
shippers' threads of one journal; the journal is read outside its lock.

A training run's window keeps less (``TRAINING_KEEP_BYTES``). Its sample
table's sink takes one step's episodes a batch (an object, and a request,
each), so in a backlog (``primeruns sync`` of an offline run) Prime Traces,
which takes whole batches, runs far ahead of it, and the window stayed full
for the sink behind for as long as it took to catch up: 16 MB more resident
through a 20,000-step sync (115 MB against a 2,000-step sync's 103), while
what it spared (one decompression of 9 KB per episode) is a few tens of
milliseconds of a 20-second sync.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Collection

from ..journal import Entry, EntryKind, Journal, ReadResult

__all__ = ["KEEP_BYTES", "TRAINING_KEEP_BYTES", "SharedReads"]

KEEP_BYTES = 16 << 20
#: A training run's: about 220 gsm8k episodes past what its sample sink read ahead.
TRAINING_KEEP_BYTES = 2 << 20


class SharedReads:
    """The entries of ``kinds`` read once for the shippers of one journal."""

    def __init__(
        self, journal: Journal, kinds: Collection[EntryKind], keep_bytes: int = KEEP_BYTES
    ) -> None:
        self._journal = journal
        self.kinds = frozenset(kinds)
        self._keep_bytes = keep_bytes
        self._lock = threading.Condition()
        # A reader is reading the journal past the window: the others wait
        # for what it reads rather than reading it too.
        self._extending = False
        # Every entry of self.kinds in (_lo, _hi], none damaged; their seqs
        # in _seqs (for a bisect), their payloads' size in _bytes. _lo is
        # None while there is no window: the next read starts one.
        self._lo: int | None = None
        self._hi = -1
        self._entries: list[Entry] = []
        self._seqs: list[int] = []
        self._bytes = 0
        # Each reader's latest ``after``: what it has read up to (kept by
        # its own read-ahead, or dealt with). The window keeps nothing all
        # of them are past.
        self._read_upto: dict[str, int] = {}

    def reader(self, name: str) -> _Reader:
        """What one shipper reads through (``ReadAhead``'s source). Until its
        first read, the window keeps everything for it."""
        with self._lock:
            self._read_upto[name] = -1
        return _Reader(self, name)

    def leave(self, name: str) -> None:
        """Reader ``name`` reads no more for now (its sink is off or retired):
        nothing is kept for it. A later read of it counts it again."""
        with self._lock:
            self._read_upto.pop(name, None)
            self._trim()

    @property
    def kept(self) -> int:
        """How many entries the window holds now (for tests)."""
        with self._lock:
            return len(self._entries)

    def read(
        self,
        name: str,
        after: int,
        *,
        kinds: Collection[EntryKind],
        max_entries: int,
        max_bytes: int,
    ) -> ReadResult:
        """What ``Journal.read(after, kinds=kinds, ...)`` returns for reader
        ``name``, from the window where it can be. Like it, it may return
        fewer entries than the limits allow (entries of the window's other
        kinds count towards them); every entry of ``kinds`` up to
        ``next_after`` is returned or reported damaged."""
        with self._lock:
            self._read_upto[name] = after
            self._trim()
            while True:
                if self._lo is None or (not self._entries and after > self._hi):
                    self._lo = self._hi = after  # nothing kept: the window starts here
                if not self._lo <= after <= self._hi:
                    hi = None
                    break
                start = bisect.bisect_right(self._seqs, after)
                taken: list[Entry] = []
                stop = _take(self._entries[start:], kinds, taken, max_entries, max_bytes)
                if stop is not None:
                    return ReadResult(taken, stop - 1)
                if not self._extending:
                    self._extending = True
                    hi = self._hi
                    break
                # Another reader is reading past the window: what this one needs.
                self._lock.wait()
        if hi is None:  # outside the window: read for itself
            return self._journal.read(
                after, kinds=kinds, max_entries=max_entries, max_bytes=max_bytes
            )
        try:
            return self._extend(hi, kinds, taken, max_entries, max_bytes)
        finally:
            with self._lock:
                self._extending = False
                self._lock.notify_all()

    def _extend(
        self,
        hi: int,
        kinds: Collection[EntryKind],
        taken: list[Entry],
        max_entries: int,
        max_bytes: int,
    ) -> ReadResult:
        """A read that took the window to its end (``taken``) goes on in the
        journal past it, reading for every reader."""
        size = sum(len(e.payload) for e in taken)
        left_entries = max(1, max_entries - len(taken))
        left_bytes = max(1, max_bytes - size)
        more = self._journal.read(
            hi, kinds=self.kinds, max_entries=left_entries, max_bytes=left_bytes
        )
        if more.damaged:
            # Told by each reader's own read, of its own kinds: this one's now.
            with self._lock:
                if self._hi == hi:
                    self._restart(more.next_after)
            own = self._journal.read(
                hi, kinds=kinds, max_entries=left_entries, max_bytes=left_bytes
            )
            return ReadResult(taken + own.entries, own.next_after, own.damaged)
        with self._lock:
            if self._hi == hi:  # not started afresh meanwhile
                self._keep(more)
        stop = _take(more.entries, kinds, taken, max_entries, max_bytes)
        return ReadResult(taken, more.next_after if stop is None else stop - 1)

    def _keep(self, read: ReadResult) -> None:
        """Add what a read past the window's end found, the oldest first, as
        far as the bound allows (lock held): a reader behind needs the
        oldest first, and what is not kept it reads for itself."""
        for index, entry in enumerate(read.entries):
            if self._entries and self._bytes + len(entry.payload) > self._keep_bytes:
                if index:
                    # The window ends before it: every entry of its kinds up
                    # to the last one kept is in it.
                    self._hi = self._seqs[-1]
                return
            self._entries.append(entry)
            self._seqs.append(entry.seq)
            self._bytes += len(entry.payload)
        self._hi = read.next_after

    def _trim(self) -> None:
        """Let go of what every reader is past (called with the lock held)."""
        if not self._entries:
            return
        upto = min(self._read_upto.values(), default=self._hi)
        cut = bisect.bisect_right(self._seqs, upto)
        if cut:
            self._bytes -= sum(len(e.payload) for e in self._entries[:cut])
            # Every entry of the kinds past the last one let go is still here.
            self._lo = self._seqs[cut - 1]
            del self._entries[:cut]
            del self._seqs[:cut]

    def _restart(self, after: int) -> None:
        """No window until the next read, which starts one (lock held)."""
        self._lo = None
        self._hi = after
        self._entries.clear()
        self._seqs.clear()
        self._bytes = 0


def _take(
    entries: list[Entry],
    kinds: Collection[EntryKind],
    taken: list[Entry],
    max_entries: int,
    max_bytes: int,
) -> int | None:
    """Add to ``taken`` the entries of ``kinds`` a read takes from ``entries``
    within its limits (at least one in all); the seq of the first one it had
    to leave, or None when it took all it could."""
    total = sum(len(e.payload) for e in taken)
    for entry in entries:
        if entry.kind not in kinds:
            continue
        size = len(entry.payload)
        if len(taken) >= max_entries or (taken and total + size > max_bytes):
            return entry.seq
        taken.append(entry)
        total += size
    return None


class _Reader:
    """One shipper's view: ``Journal.read``'s signature, for ``ReadAhead``."""

    def __init__(self, shared: SharedReads, name: str) -> None:
        self._shared = shared
        self._name = name

    def read(
        self,
        after: int,
        *,
        kinds: Collection[EntryKind],
        max_entries: int,
        max_bytes: int,
    ) -> ReadResult:
        return self._shared.read(
            self._name, after, kinds=kinds, max_entries=max_entries, max_bytes=max_bytes
        )
