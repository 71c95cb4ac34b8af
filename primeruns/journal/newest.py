"""Entries of some kinds found from the log's end, newest first, by their headers.

The readers of a run's last summary or of its finish entry (the close-out of
a crash, ``show``, the offline dashboard) want one entry near the end, yet
found it by a scan of every header from the start: a crashed run that had
updated its summary each of 100,000 steps cost its close-out 200 ms, and
twice that in the dashboard's index. LMDB's keys are big-endian seqs
(``layout.KEY``), so a cursor walks the log backwards as cheaply as forwards,
and such a read costs the entries between the one it finds and the end.

The log read backwards is the log ``reading.Reader.read`` reads forwards, in
reverse: the same entries, by the same headers. The spool's entries come
after LMDB's, so they are looked at first, newest first, each look made as
the forward read makes it (the spool opened, then LMDB's end read, then the
spool taken past it unless a segment closed in between: see ``spool``);
LMDB's are then walked down from the last look's end, in bounded
transactions. An entry whose header
does not read is passed over (a damage scan reports it), as are chunk keys;
what an entry's body holds is for the caller's read of it to find.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import lmdb

from primeruns.exceptions import JournalCorruptError
from primeruns.journal import txn as txn_module
from primeruns.journal.frames import HEADER_SIZE, EntryKind, FrameError, peek_header
from primeruns.journal.layout import KEY, is_entry_key, key
from primeruns.journal.spool import SpoolView
from primeruns.journal.tail import stored_end
from primeruns.journal.txn import Transactions

__all__ = ["Found", "newest"]

#: (seq, kind, declared bytes) of one entry, read from its header.
Found = tuple[int, int, int]

# Looks at the spool while the mover keeps closing segments under it (as
# ``reading._LOOKS``); the last look takes what LMDB held.
_LOOKS = 100
# Entries one LMDB transaction looks at, and headers it hands out, before the
# walk goes on in another: a long walk never pins a writer's old pages for
# long, and a caller that wants one entry reads few past it.
_MAX_SCAN = 50_000
_BATCH = 16
# What a transaction's look down the tree is counted as read of the map
# (``reading._LOOK_PAGES_BYTES``).
_LOOK_PAGES_BYTES = 64 << 10
# One past the largest seq a key holds: a bound no key reaches.
_NO_KEY = 1 << 64


def newest(
    tx: Transactions, spool: SpoolView, kinds: Collection[EntryKind | int], after: int = 0
) -> Iterator[Found]:
    """(seq, kind, declared bytes) of each entry of ``kinds`` after ``after``
    whose header reads, newest first, read as they are asked for: the spool's
    first, then LMDB's down from where it ends. No lock is held between two
    yields. A damaged tree ends the walk (a damage scan reports it)."""
    wanted = frozenset(int(k) for k in kinds)
    bound: int | None = None  # the seqs yielded so far are at or past it
    while True:
        batch, in_lmdb, full = _spooled(tx, spool, wanted, after, bound)
        yield from batch
        if not full:
            break
        bound = batch[-1][0]
    # What the spool's last look did not hold is in LMDB, up to its end then.
    bound = in_lmdb + 1 if bound is None else min(bound, in_lmdb + 1)
    while bound > after + 1:
        found, bound = _walk_down(tx, wanted, after, bound)
        yield from found


def _spooled(
    tx: Transactions, spool: SpoolView, wanted: frozenset[int], after: int, below: int | None
) -> tuple[list[Found], int, bool]:
    """(the spool's entries of ``wanted`` past LMDB's end and ``after`` and
    below seq ``below``, newest first, at most ``_BATCH``; LMDB's end as the
    look saw it; whether it stopped at ``_BATCH``, short of LMDB's end)."""
    for look in range(_LOOKS):
        spool.refresh()  # before LMDB's read: see spool
        forgotten = spool.forgotten
        try:
            with tx.read() as txn:
                in_lmdb = stored_end(tx, txn)
        except JournalCorruptError:
            return [], 0, False  # a damaged tree: nothing past it is known to follow it
        found: list[Found] = []
        with spool.lock:
            if spool.forgotten != forgotten:
                if look + 1 < _LOOKS:
                    continue  # a segment closed meanwhile: moved into LMDB, look again
                return [], in_lmdb, False  # what LMDB held (``Reader.read`` does the same)
            for seq, kind, size, _, _ in spool.frames_newest_first(max(in_lmdb, after), below):
                if kind in wanted:
                    found.append((seq, kind, size - HEADER_SIZE))
                    if len(found) >= _BATCH:
                        return found, in_lmdb, True
        return found, in_lmdb, False
    raise AssertionError("unreachable")  # the last look returns


def _walk_down(
    tx: Transactions, wanted: frozenset[int], after: int, bound: int
) -> tuple[list[Found], int]:
    """One transaction's walk down LMDB's entries below seq ``bound`` and
    after ``after``: (those of ``wanted``, newest first; the bound the next
    walk starts below, ``after + 1`` once it reached ``after`` or the start)."""
    found: list[Found] = []
    touched = 0
    lowest = after + 1  # the walk's end unless a limit stops it first
    try:
        with tx.read(buffers=True) as txn:
            cur = txn.cursor(db=tx.dbs["entries"])
            # The greatest key below ``bound``'s (a chunk key of the entry
            # before it sorts between the two).
            more = cur.prev() if bound < _NO_KEY and cur.set_range(key(bound)) else cur.last()
            examined = 0
            while more:
                raw_key, value = cur.item()
                if is_entry_key(raw_key):  # an entry's first value (not a chunk's)
                    seq = KEY.unpack(raw_key)[0]
                    if seq <= after:
                        break
                    if examined and (
                        examined >= _MAX_SCAN
                        or len(found) >= _BATCH
                        or touched >= txn_module.REMAP_AFTER_BYTES
                    ):
                        lowest = seq + 1  # the next walk starts here (its chunks again)
                        break
                    examined += 1
                    try:
                        head = peek_header(value)
                    except FrameError:
                        pass  # damaged: passed over, as a forward read passes it
                    else:
                        if head.kind in wanted:
                            found.append((seq, head.kind, head.raw_len))
                touched += len(value)  # paged in, read or passed over
                more = cur.prev()
    except (lmdb.Error, JournalCorruptError):
        lowest = after + 1  # a damaged tree ends the walk (see ``newest``)
    tx.count_read(_LOOK_PAGES_BYTES + touched)
    return found, lowest
