"""Entries a shipper read that its sink has not used yet, kept for the next batch.

A sink may build a batch from a prefix of what it was given: the training
sample table makes one Parquet object of one step's episodes out of up to
512 entries read. Read again from that batch's end, the rest was copied,
decompressed and parsed once more for every object: a step of 64 episodes
paid for 512, and a run logging one episode per step paid 512 times over,
so shipping a long run cost far more than its records. Here what a read
returned past the batch is kept, in order, with how far that read scanned,
and the next read starts where it stopped.

What is kept stays true: an entry never changes once written, and
compaction removes only entries every sink acknowledged, never one past a
sink's own offset. A read from anywhere but where the kept entries follow on
(a batch refused whole and sent again smaller reads from where it began)
drops them and reads afresh. At most ``KEEP_BYTES`` of payloads are kept
between batches: a batch may be tens of megabytes, and the shipping
process's memory must not double for it.

While batches take a prefix, the shipper of a sink that asks so
(``reads_ahead_of_batch``: the training sample table's) reads only about
twice what the last one took (``next_want``), not the sink's
``max_entries``: asked for 512 entries a batch, a training sample sink
taking one step's single episode kept the other 511 (4.6 MB of gsm8k
episodes, up to 16 MB of longer ones) for the whole of a sync, where a
2,000-step run's sync, which has only 200, held none of that. A batch that
takes every entry of such a read might have gone on past them: it is not
sent, and the shipper reads again in full, so a batch is what it would have
been with the sink's ``max_entries`` read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import Protocol

from ..journal import Entry, EntryKind, ReadResult

__all__ = ["KEEP_BYTES", "ReadAhead", "Source", "next_want"]

KEEP_BYTES = 16 << 20
MIN_WANT = 16  # entries read for a batch at the least (a step of a few episodes)


def next_want(used: int, want: int) -> int:
    """Entries to read for the next batch, after one that took ``used`` of
    the ``want`` read for it (a prefix): room for a batch twice its size and
    the entry after it (where the sink sees its batch end), shrinking by half
    a batch at most, so steps of uneven size seldom make a read too short."""
    return max(MIN_WANT, 2 * used + 1, want // 2)


class Source(Protocol):
    """Where entries are read from: the journal, or the reads its shippers
    share (``ship.sharedreads``)."""

    def read(
        self, after: int, *, kinds: Collection[EntryKind], max_entries: int, max_bytes: int
    ) -> ReadResult: ...


class ReadAhead:
    """One sink's entries read ahead of its batches (used by its shipper's thread only)."""

    def __init__(self, journal: Source, kinds: Collection[EntryKind]) -> None:
        self._journal = journal
        self._kinds = kinds
        # Every entry of the kinds in (_after, _upto] that is readable is in
        # _entries, in order (a damaged one was reported by the read that met
        # it); _bytes is the sum of their payloads.
        self._after = -1
        self._upto = -1
        self._entries: deque[Entry] = deque()
        self._bytes = 0

    def read(self, after: int, *, max_entries: int, max_bytes: int) -> ReadResult:
        """What ``Journal.read(after, ...)`` of the sink's kinds returns, reading
        only past what is kept. ``next_after`` may stop short of the
        journal's scan when what is kept is more than this read may take."""
        if not self._after <= after <= self._upto:
            self._forget(after)
        else:
            self.consumed(after)
        damaged = []
        if len(self._entries) < max_entries and self._bytes < max_bytes:
            more = self._journal.read(
                self._upto,
                kinds=self._kinds,
                max_entries=max_entries - len(self._entries),
                max_bytes=max_bytes - self._bytes,
            )
            self._entries.extend(more.entries)
            self._bytes += sum(len(e.payload) for e in more.entries)
            self._upto = max(self._upto, more.next_after)
            damaged = more.damaged
        taken: list[Entry] = []
        total = 0
        for entry in self._entries:
            size = len(entry.payload)
            if len(taken) >= max_entries or (taken and total + size > max_bytes):
                # Everything before this entry is of other kinds, or damaged
                # and reported: a batch of ``taken`` may be acknowledged to here.
                return ReadResult(taken, entry.seq - 1, damaged)
            taken.append(entry)
            total += size
        return ReadResult(taken, self._upto, damaged)

    def consumed(self, upto: int) -> None:
        """Entries up to ``upto`` are dealt with (a batch took them, or the
        shipper waits before taking any): forget them, and keep at most
        ``KEEP_BYTES`` of what follows."""
        if upto < self._after:
            return
        if upto >= self._upto:
            self._forget(upto)
            return
        entries = self._entries
        while entries and entries[0].seq <= upto:
            self._bytes -= len(entries.popleft().payload)
        self._after = upto
        while self._bytes > KEEP_BYTES and len(entries) > 1:
            self._bytes -= len(entries.pop().payload)
            self._upto = entries[-1].seq  # what follows is read again, when it is wanted

    def forget(self) -> None:
        """Keep nothing: the next read reads afresh from the journal (and
        meets again whatever damage a read that was dropped reported)."""
        self._forget(-1)

    def _forget(self, after: int) -> None:
        self._after = self._upto = after
        self._entries.clear()
        self._bytes = 0
