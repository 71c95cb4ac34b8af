"""Appending entries: the producer's one write on a ``log_*`` call.

An append frames its records under the transaction lock, where each one's
sequence number is known (the checksum covers it), and commits them in one
transaction; once it returns they survive the process's death. Large records
go uncompressed into the staging table (``staging``), small ones are
compressed inline. At the byte budget or on a full disk the records are
dropped and counted, never raised.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import lmdb

from primeruns.exceptions import JournalFullError
from primeruns.journal.capacity import Capacity
from primeruns.journal.dicts import Dictionaries
from primeruns.journal.frames import HEADER_SIZE, EntryKind, encode_frame
from primeruns.journal.layout import key, put_entry, put_new
from primeruns.journal.staging import DEFER_MIN, STAGED_RAW_MAX, Mover
from primeruns.journal.tail import OwnTail
from primeruns.journal.txn import Transactions
from primeruns.journal.types import AppendResult


class Appender:
    def __init__(
        self,
        tx: Transactions,
        tail: OwnTail,
        capacity: Capacity,
        dicts: Dictionaries,
        mover: Mover,
    ) -> None:
        self._tx = tx
        self._tail = tail
        self._capacity = capacity
        self._dicts = dicts
        self._mover = mover
        self._lock: threading.RLock = tx.lock

    def append(
        self, kind: EntryKind, payloads: Sequence[bytes], *, essential: bool = False
    ) -> AppendResult:
        if not payloads:
            return AppendResult(None, 0, 0)
        tx, mover = self._tx, self._mover
        dict_id, zdict = self._dicts.for_kind(int(kind))
        raw = [False] * len(payloads)  # which go uncompressed: decided in put
        frames: list[bytes] = []
        staged = [False]  # set by put: where this append went
        has_staging = "staging" in tx.dbs
        db = tx.dbs["entries"]

        def put(txn: lmdb.Transaction) -> int:
            first = self._tail.last + 1
            staged_now = mover.staged
            if not mover.here and has_staging:
                # Another process moves them: count what it left, in this txn.
                staged_now = int(txn.stat(tx.dbs["staging"])["entries"])
            defer = has_staging and staged_now < STAGED_RAW_MAX
            raw[:] = [defer and len(p) >= DEFER_MIN for p in payloads]
            # Framed here, under the lock, where each entry's seq is known (its
            # checksum covers it). Cheap: the costly compression is deferred.
            frames[:] = [
                encode_frame(int(kind), bytes(p), dict_id, zdict, compress=not later, seq=seq)
                for seq, p, later in zip(
                    range(first, first + len(payloads)), payloads, raw, strict=True
                )
            ]
            staged[0] = bool(any(raw) or staged_now)
            if staged[0]:
                staging = tx.dbs["staging"]
                for i, frame in enumerate(frames):
                    put_new(txn, key(first + i), frame, staging)
                return first
            for i, frame in enumerate(frames):
                put_entry(txn, first + i, frame, db)
            return first

        try:
            with self._lock:
                # Frames are built in put; raw payloads bound their size.
                if not essential and not self._capacity.room_for(
                    sum(len(p) + HEADER_SIZE for p in payloads)
                ):
                    tx.tight = True
                    raise JournalFullError("journal byte budget reached")
                first = tx.write(put, control=essential)
                if staged[0]:
                    mover.staged += len(payloads)
                # Under the lock that chose ``first``: the next append's seq
                # follows this one's, whichever thread it comes from.
                last = self._tail.last = first + len(frames) - 1
        except JournalFullError:
            with self._lock:
                tx.pending_drops += len(payloads)
            return AppendResult(None, 0, len(payloads))
        self._dicts.appended(int(kind), len(payloads))
        if mover.staged and mover.here:
            mover.wake()
        self._tail.notify()
        return AppendResult(first, last - first + 1, 0)
