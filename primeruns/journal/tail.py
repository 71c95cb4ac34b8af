"""The log's end: the last sequence number written, and waiting for a new one.

Two views, chosen when the journal is opened. ``OwnTail`` is the appender's:
its appends set the end under the transaction lock, and wake waiters as they
commit, so nobody polls. ``SharedTail`` is the view of a process that shares
the journal with an appender elsewhere (a live run's uplink): the end is read
again from LMDB, and the uplink's wake-ups from its producer (``wake_all``)
make waiters read it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import lmdb

from primeruns.exceptions import JournalCorruptError
from primeruns.journal.layout import KEY, MAX_SEQ, seq_of
from primeruns.journal.spool import SpoolView
from primeruns.journal.txn import Transactions
from primeruns.journal.types import Damage
from primeruns.threads import bounded

K_FLOOR = "journal.compacted_upto"


def as_floor(value: Any) -> int:
    """A compaction floor (or any seq: a cursor's) as read back (0 for a
    value that is no seq): a journal is untrusted input, and a negative or float floor had every
    read's key fail to pack (``show`` and ``export`` ended in a traceback)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEQ:
        return value
    return 0


def stored_end(tx: Transactions, txn: lmdb.Transaction) -> int:
    """The highest seq LMDB holds or compacted away, in ``txn`` (the spool's
    entries follow it)."""
    last = 0
    cur = txn.cursor(db=tx.dbs["entries"])
    more = cur.last()
    # A key shorter than an entry's is none of the log's (a hand-made
    # journal, a damaged tree), and sorts after every entry's when its first
    # byte is not 0: taken for the end, it said LMDB held nothing, and a read
    # from the end (``newest``: the close-out's finish) found nothing. One
    # past ``MAX_SEQ`` is none either: an end there had every read fail.
    while more and (len(cur.key()) < KEY.size or seq_of(cur.key()) > MAX_SEQ):
        more = cur.prev()
    if more:
        last = seq_of(cur.key())
    try:
        floor = as_floor(tx.meta_or(txn, K_FLOOR, 0))
    except JournalCorruptError:
        floor = 0
    return max(last, floor)


def read_end(tx: Transactions, spool: SpoolView) -> tuple[int, int]:
    """(the highest seq written: stored, compacted away or spooled; the
    compaction floor).

    An unreadable end is recorded as structural damage and read as (0, 0).
    """
    spool.refresh()  # before LMDB's read (see spool)
    try:
        with tx.read() as txn:
            end = stored_end(tx, txn)
            floor = as_floor(tx.meta_or(txn, K_FLOOR, 0))
    except (lmdb.Error, JournalCorruptError) as exc:
        tx.problems.append(Damage(None, f"cannot find the last entry: {exc}"))
        return 0, 0
    return max(end, spool.end()), floor


class OwnTail:
    """The end of a log this process appends to."""

    def __init__(self, tx: Transactions, last: int, spool: SpoolView) -> None:
        self._tx = tx
        self.spool = spool
        self.last = last  # set under the append lock by the appender
        self._appended = threading.Condition(threading.Lock())
        self._waiting = 0  # threads in wait (an online producer has none)
        self._wake_gen = 0
        self._closed = False

    def current(self) -> int:
        """The highest sequence number written (compaction does not lower it)."""
        return self.last

    def readable_end(self) -> int:
        """The highest seq a read may have returned: an append's entries are
        in the spool, where a thread beside the appender reads them, a moment
        before the append sets ``last``."""
        return max(self.current(), self.spool.end())

    def notify(self) -> None:
        """An append was written (``last`` is set): wake the waiters.

        Without the lock when nobody waits: a waiter counts itself before it
        looks at ``last``, and ``last`` is set before this looks at the count,
        so either it sees the new end or this sees it waiting."""
        if not self._waiting:
            return
        with self._appended:
            self._appended.notify_all()

    def wait(
        self,
        after_seq: int,
        timeout: float | None,
        until: Callable[[], bool] | None = None,
    ) -> bool:
        """Block until the end passes ``after_seq``: True then; False on
        timeout (None: none), ``wake_all``, close, or once ``until()`` holds.

        ``until`` is looked at under the condition, so whoever makes it true
        and then calls ``wake_all`` always ends the wait, however the two race.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._appended:
            self._waiting += 1
            try:
                gen = self._wake_gen
                while self.last <= after_seq and self._wake_gen == gen and not self._closed:
                    if self._arrived(after_seq) or (until is not None and until()):
                        break
                    if deadline is None:
                        self._appended.wait()
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._appended.wait(bounded(left))
            finally:
                self._waiting -= 1
        return self.current() > after_seq if not self._closed else False

    def _arrived(self, after_seq: int) -> bool:
        return False  # this process's appends notify; nothing to read again

    def wake_all(self) -> None:
        with self._appended:
            self._wake_gen += 1
            self._appended.notify_all()

    def close(self) -> None:
        with self._appended:
            self._closed = True
            self._appended.notify_all()


class SharedTail(OwnTail):
    """The end of a log another process appends to (read again on each look)."""

    def current(self) -> int:
        self.last = max(self.last, read_end(self._tx, self.spool)[0])
        return self.last

    def _arrived(self, after_seq: int) -> bool:
        # Read under the condition: a wake-up that came before the wait still counts.
        return self.current() > after_seq
