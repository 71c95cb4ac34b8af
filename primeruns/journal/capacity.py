"""The byte budget: room for new entries, and compaction of what every sink shipped.

Entries stop short of the budget (or of what the disk can still hold) so that
the cursor, acknowledgement and meta writes that shipping needs, and which
free space through compaction, always still fit. At the budget an append
drops its records and counts them; while space is short, every
acknowledgement compacts away the entries every sink has acknowledged, oldest
first, so the budget bounds the backlog, not the run's whole history. With no
sinks named (an offline run, a reader) nothing is ever compacted.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from typing import Any

import lmdb

from primeruns.exceptions import JournalError
from primeruns.journal.frames import EntryKind, FrameError, peek_header
from primeruns.journal.fullness import file_size_limit, note_limit
from primeruns.journal.layout import CHUNK_KEY, KEY, kept_kind, key, seq_of
from primeruns.journal.mover import Mover
from primeruns.journal.reading import Reader
from primeruns.journal.tail import K_FLOOR, as_floor, stored_end
from primeruns.journal.txn import Transactions

# The largest in-flight body recorded, for the appender's control reserve
# (the uplink records batches in another process).
K_INFLIGHT_PEAK = "journal.inflight_peak"
# Per entry kind, how many entries compaction removed: with what is still
# there, what the run logged in all (the CLI's counts of episodes, metrics).
K_COMPACTED_KINDS = "journal.compacted_kinds"
_COMPACT_CHUNK = 10_000


class Capacity:
    def __init__(self, tx: Transactions, reader: Reader, mover: Mover) -> None:
        self._tx = tx
        self._reader = reader
        self._mover = mover
        # LMDB's meta pages are read under the store's lock, as in every
        # transaction: py-lmdb's ``env.stat`` / ``env.info`` fail (EINVAL)
        # while another thread remaps (``Store.drop_resident_pages``).
        with tx.lock:
            self._psize = int(tx.store.env.stat()["psize"])
        self._headroom = 0  # bytes known to fit without counting again (room_for)
        self.inflight_peak = 0  # largest in-flight body recorded (room_for's reserve)
        self.sinks: frozenset[str] = frozenset()  # whose acks compaction needs
        # Whether the last exact count left half the budget or more: the
        # mover holds a producer's nudges only then (``mover``), since what
        # it leaves spooled meanwhile counts against the producer's room.
        self.ample = False
        # Every entry up to it was compacted away but the lifecycle's (a
        # compaction's next pass starts past it).
        self._swept = 0
        # The summary entry a pass kept, at or before ``_swept``: removed by
        # the pass that meets a later one (0: none known).
        self._summary = 0
        # Bytes this process spooled that LMDB does not hold yet, given LMDB's
        # end (the appender's; 0 elsewhere): they take room once absorbed.
        self.spooled: Callable[[int], int] = lambda end: 0

    def room_for(self, nbytes: int, *, held: bool = False) -> bool:
        """Whether ``nbytes`` of new entries fit the budget minus the control reserve.

        Called under the appender's lock. The exact count is costly (~3 µs),
        so it is only taken once the room known from the last count is used up.
        ``held``: for appends held for a full disk (``overflow``), whose
        reserve for in-flight bodies is at most half the room (counted each
        time, nothing cached): at eight of the largest body, a small disk's
        whole room, none was ever stored once a large batch had shipped.
        """
        need = nbytes + nbytes // 8 + 4 * self._psize  # page and branch overhead
        if need <= self._headroom and not held:
            self._headroom -= need
            return True
        env = self._tx.store.env
        budget = self._disk_budget()
        reserve = min(64 << 20, max(256 << 10, budget // 16))
        # Each sink rewrites its in-flight body copy-on-write (old and new
        # pages live at once): keep room for several of the largest seen,
        # wherever they were recorded (a live run's uplink records them).
        spooled = 0
        with contextlib.suppress(JournalError, lmdb.Error, ValueError, TypeError):
            with self._tx.read() as txn:
                spooled = self.spooled(stored_end(self._tx, txn))
                peak = int(self._tx.meta_or(txn, K_INFLIGHT_PEAK, 0) or 0)
            self.inflight_peak = max(self.inflight_peak, peak)
        inflight = 8 * self.inflight_peak
        reserve = max(reserve, min(inflight, budget // 2) if held else inflight)
        with self._tx.lock:  # see __init__
            used = (int(env.info()["last_pgno"]) + 1) * self._psize  # the file's high-water mark
        if spooled and 4 * spooled > budget - reserve - used and self._mover.here:
            # The mover is woken once a second, not by appends (see
            # maintenance), and a burst counts raw here until it is absorbed:
            # once it takes a quarter of the room left, the mover is woken
            # too, else a burst is refused at a budget its compressed form is
            # far from. Not before: a thread woken in the middle of a burst
            # of calls slows every one of them (far from the budget, never).
            self._mover.wake()
        used += spooled
        if used + need > budget - reserve:
            # Near the budget: count pages in use (LMDB reuses freed pages).
            with self._tx.read() as txn:
                pages = 2
                for st in [env.stat(), *(txn.stat(db) for db in self._tx.dbs.values())]:
                    pages += int(st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"])
            used = pages * self._psize + spooled
        room = budget - reserve - used
        self.ample = room >= budget // 2
        if room < budget // 4:
            self._tx.tight = True  # compact at the next acknowledgement, before drops begin
        if need > room:
            return False
        if not held:
            # Count again after a quarter of the room is used (or 4 MiB at most).
            self._headroom = min((room - need) // 4, 4 << 20)
        return True

    def _disk_budget(self) -> int:
        """The byte budget, lowered to what the disk can still hold.

        Without this, entries fill a small disk to the last byte and then the
        cursor, ack and in-flight writes that shipping needs fail with ENOSPC
        or EIO. Counting the disk's free space keeps the control reserve
        available on a full disk too. So does the process's file size limit
        (``ulimit -f``), which LMDB's data file cannot pass whatever the disk
        holds: filled to it, no cursor or acknowledgement could be written,
        nothing was compacted, and what a full disk holds was held until the
        finish dropped it.
        """
        store = self._tx.store
        budget = store.max_bytes
        try:
            stat = os.statvfs(self._tx.path)
        except OSError:
            pass
        else:
            budget = min(budget, store.file_size() + int(stat.f_bavail) * int(stat.f_frsize))
        limit = file_size_limit()
        if limit is not None and limit < budget:
            note_limit(self._tx.path)  # what the warnings name as the cause
            budget = limit
        return budget

    def disk_short(self) -> bool:
        """Whether the disk, not the byte budget, is what refused an append:
        it holds less than the budget allows (``overflow`` holds such
        records; the budget's are dropped). One ``statvfs``, after a refusal."""
        return self._disk_budget() < self._tx.store.max_bytes

    def record_batch(self, nbytes: int) -> bool:
        """An in-flight body of ``nbytes`` is being recorded: whether it is
        the largest yet (then its size is stored with it, for the appender)."""
        grew = nbytes > self.inflight_peak
        self.inflight_peak = max(self.inflight_peak, nbytes)
        return grew

    def acknowledged(self, offsets: Callable[[], Mapping[str, int]], last_seq: int) -> None:
        """After an acknowledgement: compact once space is short (``offsets``
        reads every sink's acknowledged offset)."""
        if self.sinks:
            # The appender, which notices a short budget, may be another
            # process: count the room here (one exact count per batch).
            with self._tx.lock, contextlib.suppress(JournalError, lmdb.Error, OSError):
                self._headroom = 0  # counted afresh: the appender's use is not seen here
                self.room_for(0)
        if self._tx.tight and self.sinks:
            self._tx.tight = False
            with contextlib.suppress(JournalError):
                acked = offsets()
                self.compact({name: acked.get(name, 0) for name in self.sinks}, last_seq)

    def compact(self, acked: Mapping[str, int], last_seq: int) -> int:
        """Delete entries acknowledged by every sink in ``acked`` (sink: offset),
        keeping the run's spec, finish and last summary up to there (a summary
        a later one supersedes goes); returns how many."""
        if not acked:
            return 0
        upto = min(min(acked.values()), last_seq)
        # Never past what LMDB holds: an entry shipped from the spool before
        # it was absorbed is absorbed later, and counted, like any other.
        with contextlib.suppress(JournalError, lmdb.Error):
            with self._tx.read() as txn:
                upto = min(upto, stored_end(self._tx, txn))
        if upto <= self._reader.floor:
            return 0
        tx = self._tx
        removed = 0
        db = tx.dbs["entries"]
        # The summary a pass keeps (before it, after it): set again before
        # each pass, so a pass retried (the map grown) starts as it did.
        summary_kept = [self._summary, self._summary]
        while True:

            def chunk(txn: lmdb.Transaction) -> tuple[int, bool, int]:
                removed_kinds: Counter[int] = Counter()
                cur = txn.cursor(db=db)
                n = keys = 0
                # From where the last pass stopped, not the first key: the
                # lifecycle entries it kept (a summary per step, for a run
                # that updates it each step) are not walked again at every
                # compaction. A pass stops right after a deletion, so it
                # goes on at an entry's head or at the rest of a removed
                # entry's chunks, never inside a kept entry.
                more = cur.set_range(key(self._swept + 1))
                end = key(upto + 1)  # every key of an entry up to ``upto`` sorts before it
                kept = -1  # the seq of a lifecycle entry passed over (and its chunks)
                last = 0  # the seq of the last key deleted
                summary = summary_kept[0]
                # ``delete`` says True at the end too, its key then empty
                # (LMDB has no empty key): that ends the pass, as a ``next``
                # there would go back to the first key.
                while more and keys < _COMPACT_CHUNK and b"" < bytes(cur.key()) < end:
                    if len(cur.key()) not in (KEY.size, CHUNK_KEY.size):
                        # No entry's key (damage the reader reports): passed
                        # over, as a stop it kept every entry after it.
                        more = cur.next()
                        continue
                    seq = seq_of(cur.key())
                    if len(cur.key()) == KEY.size and kept_kind(cur.value()):
                        kept = seq
                        if _is_summary(cur.value()) and self._reader.reads_in(
                            txn, seq, cur.value()
                        ):
                            # A later summary: the one kept before it is
                            # superseded (no sink ships a summary; the
                            # close-out reads the last one alone). Only by
                            # one that reads: the close-out passes over a
                            # damaged one to the summary before it.
                            if 0 < summary < seq and (gone := _delete_entry(txn, db, summary)):
                                n += 1
                                keys += gone
                                removed_kinds[int(EntryKind.SUMMARY)] += 1
                                cur.set_key(key(seq))  # back on this one, wherever LMDB left it
                            summary = max(summary, seq)
                    if seq == kept:
                        more = cur.next()
                        continue
                    if len(cur.key()) == KEY.size:  # entries, not their chunks
                        n += 1
                        _count_kind(removed_kinds, cur.value())
                    keys += 1
                    last = seq
                    more = cur.delete()
                full = keys >= _COMPACT_CHUNK
                # Where the next pass starts (kept in memory: a process that
                # compacts anew walks the kept entries once): at the entry
                # whose key it deleted last, so at the rest of its chunks or
                # past them, never inside a kept entry, whatever key follows.
                swept = last - 1 if full else upto
                summary_kept[1] = summary
                if removed_kinds:
                    tx.put_meta(txn, K_COMPACTED_KINDS, _merged(tx, txn, removed_kinds))
                floor = as_floor(tx.meta_or(txn, K_FLOOR, 0))
                if upto > floor:
                    tx.put_meta(txn, K_FLOOR, upto)
                return n, full, swept

            summary_kept[:] = [self._summary, self._summary]
            with tx.lock:
                n, full, swept = tx.write(chunk)
            self._swept = max(self._swept, swept)
            self._summary = summary_kept[1]  # once the pass committed
            removed += n
            if not full:
                break
        self._reader.floor = max(self._reader.floor, upto)
        with tx.lock:
            self._headroom = 0  # count the room again: pages were freed
        return removed

    def name_sinks(self, names: Collection[str]) -> None:
        self.sinks = frozenset(names)

    def drop_sink(self, name: str) -> None:
        self.sinks = self.sinks - {name}


def _is_summary(value: bytes | memoryview) -> bool:
    try:
        return peek_header(value).kind == EntryKind.SUMMARY
    except FrameError:
        return False


def _delete_entry(txn: lmdb.Transaction, db: Any, seq: int) -> int:
    """Delete the entry ``seq`` and its chunks; how many keys went (0: it was
    not there: removed by another process's pass, so not counted again)."""
    cur = txn.cursor(db=db)
    if not cur.set_key(key(seq)):
        return 0
    keys = 0
    while True:
        keys += 1
        if not cur.delete():
            break
        raw_key = cur.key()
        if not (raw_key and len(raw_key) == CHUNK_KEY.size and seq_of(raw_key) == seq):
            break
    return keys


def _count_kind(counts: Counter[int], value: bytes | memoryview) -> None:
    with contextlib.suppress(FrameError):
        counts[peek_header(value).kind] += 1


def _merged(tx: Transactions, txn: lmdb.Transaction, removed: Counter[int]) -> dict[str, int]:
    """The compacted counts so far plus ``removed``; an unreadable or malformed
    old value starts afresh (the counts are for display, never for shipping)."""
    try:
        old = compacted_kinds(tx.meta_or(txn, K_COMPACTED_KINDS, {}))
    except JournalError:
        old = Counter()
    return {str(kind): count for kind, count in (old + removed).items()}


def compacted_kinds(value: object) -> Counter[int]:
    """From the value of ``K_COMPACTED_KINDS``, the entries compaction removed, per kind."""
    out: Counter[int] = Counter()
    if isinstance(value, dict):
        for kind, count in value.items():
            with contextlib.suppress(TypeError, ValueError):
                out[int(kind)] += max(0, int(count))
    return out
