"""The mover: spooled and staged entries, compressed and moved into LMDB in order.

Appends go to the spool (``spool``) uncompressed; the mover absorbs them in
batches, compressed with the GIL released, in transactions of its own.

Journals of format 3 may also hold staged entries, below every spooled one:

Appending compresses small records inline (~2 µs with their dictionary), but
a record of ``DEFER_MIN`` bytes or more (a 9 KB episode: ~25 µs of zstd, more
than the rest of a log call) goes uncompressed into the "staging" table, and
a background thread compresses it (with the GIL released) and moves it into
"entries", in order. Once anything is staged, every append is staged, so
every staged seq is above every seq in "entries" and both read as one log.
At most ``STAGED_RAW_MAX`` records wait uncompressed: past that the producer
compresses inline again, which bounds the raw bytes the file ever holds.

they move first (a spooled entry put into "entries" above a staged one
would leave the staged one unable to follow).

One process moves them: the appender, until it hands that to its uplink
(``Journal.hand_over_moving``), so that the producer spends none of its time on them.
Absorbing is idempotent (a transaction writes only past LMDB's end as it
finds it), so two movers for a moment (a hand-over) cost nothing.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from pathlib import Path

import lmdb
import zstandard

from primeruns.exceptions import JournalError, JournalFullError
from primeruns.journal.dicts import Dictionaries
from primeruns.journal.frames import (
    FrameError,
    decode_frame,
    encode_frames_off_gil,
    peek_header,
    worth_compressing,
)
from primeruns.journal.layout import put_entry, seq_of
from primeruns.journal.reading import Reader
from primeruns.journal.spool import SpoolView, list_segments
from primeruns.journal.tail import stored_end
from primeruns.journal.txn import Transactions
from primeruns.threads import start_daemon

log = logging.getLogger("primeruns.journal")

DEFER_MIN = 2_048
STAGED_RAW_MAX = 32
_MOVE_BATCH = 64
_ABSORB_BATCH = 512
_ABSORB_BYTES = 8 << 20
# A full journal is tried again after this: room comes back through
# compaction or a disk the user cleared, and nothing announces the latter.
_FULL_RETRY_S = 1.0


class Mover:
    """Moves spooled and staged entries into "entries", from a thread of this
    process while ``here``."""

    def __init__(
        self, tx: Transactions, dicts: Dictionaries, path: Path, spool: SpoolView, reader: Reader
    ) -> None:
        self._tx = tx
        self._spool = spool
        self._dicts = dicts
        self._reader = reader
        self._path = path
        # Entries in "staging" (under the transaction lock). Never lowered on
        # a guess: while it may be too low, a small append would go to
        # "entries" above staged seqs, and the staged ones could never move.
        self.staged = self.recount(assume=STAGED_RAW_MAX)
        self.here = False  # whether this process moves them
        self._closed = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def recount(self, *, assume: int) -> int:
        """Entries in "staging" now; where that cannot be read (a full reader
        table, an I/O error), ``assume``: a count too high only stages more."""
        if "staging" not in self._tx.dbs:
            return 0
        try:
            with self._tx.read() as txn:
                return int(txn.stat(self._tx.dbs["staging"])["entries"])
        except (lmdb.Error, JournalError):
            return max(assume, 1)

    def start(self) -> None:
        """Move staged entries from a thread of this process from now on."""
        if self._closed:
            return  # the journal is closing: nothing may start on its store
        self.here = True
        self._stop.clear()
        self._thread = start_daemon(self._loop, f"primeruns-journal-zstd-{self._path.name}")
        if self.staged or list_segments(self._path):
            # A first look: an earlier process (or an uplink that died) left
            # entries. A new journal has none: its first appends are moved at
            # the background sync's first tick, not while its producer logs.
            self._wake.set()

    def stop(self, *, final: bool = False) -> None:
        """Stop moving here (the thread ends once its batch is in); ``final``:
        for good (the journal closes), so a racing ``start`` does nothing."""
        self._closed = self._closed or final
        self.here = False
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def wake(self) -> None:
        self._wake.set()

    def drain(self, within: float, *, retire: bool) -> None:
        """Move what is left (at close: a journal at rest has nothing staged
        or spooled); ``retire``: no appender is left, so the newest spool
        segment goes too once LMDB holds it."""
        deadline = time.monotonic() + within
        with contextlib.suppress(JournalError, lmdb.Error, FrameError, ValueError):
            while time.monotonic() < deadline and self.step():
                pass
            if retire:
                with self._tx.read() as txn:
                    end = stored_end(self._tx, txn)
                self._spool.absorbed(end, newest_too=True)

    def step(self) -> bool:
        """One batch: staged entries first (they come first in the log), then
        spooled ones; False when there was nothing to move."""
        return self.move_some() or self.absorb_some()

    def _loop(self) -> None:
        # Never lets an error out: a spooled entry is intact and readable
        # where it is; it only takes more room until it moves. Woken once a
        # second while appends come here (the background sync's tick; never
        # by an append itself: see ``maintenance``), by the producer's
        # wake-ups in its uplink, and by stop; cleared before it looks, so a
        # wake-up during a batch is not lost.
        retry: float | None = None
        while not self._stop.is_set():
            self._wake.wait(retry)
            self._wake.clear()
            retry = None
            try:
                while not self._stop.is_set() and self.step():
                    pass
                if not self._stop.is_set() and self._dicts.due():
                    self._train()
            except JournalFullError:
                # No room to move into until something is acknowledged and
                # compacted (or the user frees the disk): try again later.
                retry = _FULL_RETRY_S
                continue
            except (JournalError, lmdb.Error, FrameError, ValueError) as exc:
                log.warning("journal %s: background compression stopped: %s", self._path, exc)
                return

    def _train(self) -> None:
        """A dictionary for each kind with enough records (here, where they
        are compressed: in the uplink once the producer handed moving over)."""
        with contextlib.suppress(JournalError, lmdb.Error):
            self._dicts.train(self._reader.read, self._reader.floor)

    def absorb_some(self) -> bool:
        """Compress the oldest spooled entries past LMDB's end and commit them
        to "entries" in one transaction; False when there were none."""
        tx, spool = self._tx, self._spool
        spool.refresh()  # before LMDB's read (see spool)
        with tx.read() as txn:
            end = stored_end(tx, txn)
            if "staging" in tx.dbs and txn.stat(tx.dbs["staging"])["entries"]:
                return False  # staged entries come first: move_some moves them
        batch: list[tuple[int, int, bytes]] = []
        total = 0
        with spool.lock:
            for seq, kind, size, seg, index in spool.frames(end):
                if batch and (len(batch) >= _ABSORB_BATCH or total + size > _ABSORB_BYTES):
                    break
                try:
                    batch.append((seq, kind, spool.read(seg, index)))
                except JournalError as exc:
                    # Left out: readers report the gap it leaves as missing.
                    log.warning("journal %s: entry %d: %s", self._path, seq, exc)
                total += size
        if not batch:
            spool.absorbed(end, newest_too=False)
            return False
        self._dicts.refresh()  # another mover may have trained one (a hand-over)
        final = [frame for _, _, frame in batch]
        todo: dict[int, list[int]] = {}
        payloads: dict[int, bytes] = {}
        for index, (seq, kind, frame) in enumerate(batch):
            try:
                payloads[index] = decode_frame(frame, seq=seq)[1]
            except FrameError:
                continue  # moved as it is: the damage is reported where it is read
            if worth_compressing(len(payloads[index]), self._dicts.for_kind(kind)[1] is not None):
                todo.setdefault(kind, []).append(index)
        for kind, indexes in todo.items():
            dict_id, zdict = self._dicts.for_kind(kind)
            try:
                packed = encode_frames_off_gil(
                    kind,
                    [payloads[i] for i in indexes],
                    [batch[i][0] for i in indexes],
                    dict_id,
                    zdict,
                )
            except (ValueError, zstandard.ZstdError) as exc:
                # Stored uncompressed, as spooled: room, not a record, is lost.
                log.warning("journal %s: compression failed: %s", self._path, exc)
                continue
            for i, frame in zip(indexes, packed, strict=True):
                final[i] = frame
        entries = tx.dbs["entries"]

        def put(txn: lmdb.Transaction) -> bool:
            if stored_end(tx, txn) != end:
                return False  # moved meanwhile (another mover, a hand-over): read again
            for (seq, _, _), frame in zip(batch, final, strict=True):
                put_entry(txn, seq, frame, entries)
            return True

        with tx.lock:
            stored = tx.write(put, control=False)
        if not stored:
            # Another mover committed first, perhaps less than this batch:
            # only what LMDB holds may be let go, and the next step reads it.
            return True
        spool.absorbed(batch[-1][0], newest_too=False)
        for kind, count in collections.Counter(kind for _, kind, _ in batch).items():
            self._dicts.seen(kind, count)
        return True

    def move_some(self) -> bool:
        """Compress the oldest staged entries and move them into "entries", in
        order, in one transaction; False when nothing is staged."""
        staging = self._tx.dbs.get("staging")
        if staging is None:
            return False
        batch: list[tuple[bytes, bytes]] = []
        with self._tx.read() as txn:
            for key, value in txn.cursor(db=staging):
                batch.append((bytes(key), bytes(value)))
                if len(batch) >= _MOVE_BATCH:
                    break
        self._dicts.refresh()  # another mover may have trained one (a hand-over)
        if not batch:
            with self._tx.lock:
                # Another process may have compacted staged entries away.
                self.staged = self.recount(assume=self.staged)
            return False
        # Uncompressed ones are compressed here, off the GIL, outside the lock.
        todo: dict[int, list[int]] = {}
        payloads: dict[int, bytes] = {}
        for index, (key, value) in enumerate(batch):
            try:
                head = peek_header(value)
                if head.flags == 0 and head.raw_len >= DEFER_MIN:
                    payloads[index] = decode_frame(value, seq=seq_of(key))[1]
                    todo.setdefault(head.kind, []).append(index)
            except FrameError:
                pass  # moved as it is: the damage is reported where it is read
        final = [value for _, value in batch]
        for kind, indexes in todo.items():
            dict_id, zdict = self._dicts.for_kind(kind)
            seqs = [seq_of(batch[i][0]) for i in indexes]
            packed = encode_frames_off_gil(
                kind, [payloads[i] for i in indexes], seqs, dict_id, zdict
            )
            for i, frame in zip(indexes, packed, strict=True):
                final[i] = frame
        entries = self._tx.dbs["entries"]

        def put(txn: lmdb.Transaction) -> int:
            moved = 0  # (a transaction retried after growth starts over)
            for (key, old), frame in zip(batch, final, strict=True):
                current = txn.get(key, db=staging)
                if current is None:
                    continue  # compacted away meanwhile
                if current != old:
                    break  # not what was read: leave the rest for the next round
                put_entry(txn, seq_of(key), frame, entries)
                txn.delete(key, db=staging)
                moved += 1
            return moved

        with self._tx.lock:
            self.staged -= self._tx.write(put, control=False)
        return True
