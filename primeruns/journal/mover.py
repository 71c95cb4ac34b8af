"""The mover: spooled entries, compressed and moved into LMDB in order.

Appends go to the spool (``spool``) uncompressed, in one ``write()`` each, so
that a ``log_*`` call spends nothing on zstd or on LMDB's writer lock. The
mover absorbs them in batches: it compresses a batch with the GIL released
(``frames.encode_frames_off_gil``) and commits it to "entries" in a
transaction of its own, then lets go of the spool segments LMDB now holds.

One process moves them: the appender, until it hands that to its uplink
(``Journal.hand_over_moving``), so that the producer spends none of its time on them.
Absorbing is idempotent (a transaction writes only past LMDB's end as it
finds it), so two movers for a moment (a hand-over) cost nothing.

In the uplink a producer's wake-ups only *nudge* it: a move starts at most
once every ``NUDGE_EVERY_S``, taking every nudge of that second at once.
Shipping does not wait for it (readers see the spool and LMDB as one log),
and each move has a cost of its own whatever it moves (the spool listed and
read, a write transaction, LMDB synced before a segment goes, the room
counted again): nudged at each wake-up of a training loop (ten a second),
the mover was a sixth of its uplink's CPU. What must not wait still wakes
it at once (``wake``): the background sync's tick, the room count near the
byte budget, the first look at a spool an earlier process left, and a
producer's flush or finish (``Journal.wake_all(hurry=True)``). Nor are
nudges held unless the journal's last room count left half its budget
(``Capacity.ample``): the entries the mover leaves spooled count against
the producer's room, and only entries LMDB holds are compacted away, so a
run under a small budget paced by flushes dropped records while its
shipped entries waited in the spool.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import lmdb
import zstandard

from primeruns.exceptions import JournalError, JournalFullError
from primeruns.journal.dicts import Dictionaries
from primeruns.journal.frames import (
    FrameError,
    encode_frames_off_gil,
    spooled_payload,
    worth_compressing,
)
from primeruns.journal.layout import put_entry
from primeruns.journal.reading import Reader
from primeruns.journal.spool import SpoolView, _Segment, list_segments
from primeruns.journal.tail import stored_end
from primeruns.journal.txn import Transactions
from primeruns.logs import get_logger
from primeruns.threads import start_daemon

log = get_logger("primeruns.journal")

_ABSORB_BATCH = 512
_ABSORB_BYTES = 8 << 20
# A full journal is tried again after this: room comes back through
# compaction or a disk the user cleared, and nothing announces the latter.
_FULL_RETRY_S = 1.0
#: A move starts at most this often when only nudged (see the module doc).
NUDGE_EVERY_S = 1.0


class Mover:
    """Moves spooled entries into "entries", from a thread of this process
    while ``here``."""

    def __init__(
        self, tx: Transactions, dicts: Dictionaries, path: Path, spool: SpoolView, reader: Reader
    ) -> None:
        self._tx = tx
        self._spool = spool
        self._dicts = dicts
        self._reader = reader
        self._path = path
        self.here = False  # whether this process moves them
        # Called after a wake-up moved entries or found LMDB full (see
        # ``Journal``: compaction of what was acknowledged while spooled).
        self.after_moving: Callable[[], None] = lambda: None
        self._closed = False
        self._wake = threading.Event()
        # Whether the last wake-up was a ``wake`` (else nudges only), and
        # when the last move began (``_hold_nudges``).
        self._urgent = False
        self._moved_at = float("-inf")
        self._clock = time.monotonic
        # Whether nudges may wait now (the journal's: while its room is ample).
        self.holds_nudges: Callable[[], bool] = lambda: True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Move spooled entries from a thread of this process from now on."""
        if self._closed:
            return  # the journal is closing: nothing may start on its store
        self.here = True
        self._stop.clear()
        self._thread = start_daemon(self._loop, f"primeruns-journal-zstd-{self._path.name}")
        if list_segments(self._path):
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

    def reopen(self) -> None:
        """After a final ``stop`` that did not close the journal after all
        (``Journal.resume``): ``start`` starts it again."""
        self._closed = False

    def wake(self) -> None:
        """Move now."""
        self._urgent = True
        self._wake.set()

    def nudge(self) -> None:
        """Entries may have been spooled: move them, now if the last move
        began ``NUDGE_EVERY_S`` ago, else once it has (module doc)."""
        self._wake.set()

    def _hold_nudges(self) -> None:
        """Woken by nudges alone: wait until the last move is
        ``NUDGE_EVERY_S`` old, unless a ``wake`` or the stop comes first."""
        while True:
            self._wake.clear()  # before the look: a wake from now on ends the wait
            if self._urgent or self._stop.is_set() or not self.holds_nudges():
                return
            left = self._moved_at + NUDGE_EVERY_S - self._clock()
            if left <= 0:
                return
            self._wake.wait(left)

    def drain(self, within: float, *, retire: bool) -> None:
        """Move what is left (at close: a journal at rest has nothing
        spooled); ``retire``: no appender is left, so the newest spool
        segment goes too once LMDB holds it."""
        deadline = time.monotonic() + within
        with contextlib.suppress(JournalError, lmdb.Error, FrameError, ValueError):
            while time.monotonic() < deadline and self.step():
                pass
            if retire:
                with self._tx.read() as txn:
                    end = stored_end(self._tx, txn)
                self._spool.absorbed(end, newest_too=True, sync=self._sync_store)

    def _sync_store(self) -> bool:
        """LMDB to disk before a spool segment it absorbed is deleted (see
        ``SpoolView.absorbed``): False if that failed (the segment stays, and
        goes at a later step)."""
        try:
            self._tx.store.sync()
        except lmdb.Error as exc:
            log.warning("journal %s: sync failed (%s)", self._path, exc)
            return False
        return True

    def _loop(self) -> None:
        # Never lets an error out: a spooled entry is intact and readable
        # where it is; it only takes more room until it moves. Woken by the
        # background sync's tick, a second after writes, while they come
        # (never by an append's own call: see ``maintenance``); near the byte
        # budget by the room count (``capacity``), so a burst is not refused
        # for its raw size; nudged by the producer's wake-ups in its uplink
        # (at most one move a ``NUDGE_EVERY_S``); and by stop. Cleared
        # before it looks, so a wake-up during a batch is not lost.
        retry: float | None = None
        while not self._stop.is_set():
            self._wake.wait(retry)
            self._hold_nudges()
            self._urgent = False
            self._wake.clear()
            self._moved_at = self._clock()
            retry = None
            moved = False
            try:
                while not self._stop.is_set() and self.step():
                    moved = True
                    # Trained as soon as a kind has enough records, between
                    # batches: a burst (a backlog, a fast evaluation) spools
                    # thousands of entries before the first look, and a
                    # dictionary trained only once all had moved served none.
                    if self._dicts.due():
                        self._train()
                if moved:
                    self._after_moving()
            except JournalFullError:
                # No room to move into until something is acknowledged and
                # compacted (or the user frees the disk): try again later.
                retry = _FULL_RETRY_S
                self._after_moving()
                continue
            except (JournalError, lmdb.Error, FrameError, ValueError) as exc:
                log.warning("journal %s: background compression stopped: %s", self._path, exc)
                return

    def _after_moving(self) -> None:
        with contextlib.suppress(JournalError, lmdb.Error, OSError, ValueError):
            self.after_moving()

    def _train(self) -> None:
        """A dictionary for each kind with enough records (here, where they
        are compressed: in the uplink once the producer handed moving over)."""
        with contextlib.suppress(JournalError, lmdb.Error):
            self._dicts.train(self._reader.read, self._reader.floor)

    def _read_batch(self, end: int) -> list[tuple[int, int, bytes | memoryview]]:
        """(seq, kind, frame) of the oldest spooled entries past ``end``, up to
        a batch: each segment's run of them read at once (``read_run``), or a
        frame at a time where that fails, so the unreadable one is named."""
        spool = self._spool
        picked: list[tuple[int, int, _Segment, int]] = []
        total = 0
        batch: list[tuple[int, int, bytes | memoryview]] = []
        with spool.lock:
            for seq, kind, size, seg, index in spool.frames(end):
                if picked and (len(picked) >= _ABSORB_BATCH or total + size > _ABSORB_BYTES):
                    break
                picked.append((seq, kind, seg, index))
                total += size
            start = 0
            while start < len(picked):
                seg, first = picked[start][2], picked[start][3]
                stop = start + 1
                while (
                    stop < len(picked)
                    and picked[stop][2] is seg
                    and picked[stop][3] == first + stop - start
                ):
                    stop += 1
                run = spool.read_run(seg, first, first + stop - start)
                for i in range(start, stop):
                    seq, kind, _, index = picked[i]
                    if run is not None:
                        batch.append((seq, kind, run[i - start]))
                        continue
                    try:
                        batch.append((seq, kind, spool.read(seg, index)))
                    except JournalError as exc:
                        # Left out: readers report the gap it leaves as missing.
                        log.warning("journal %s: entry %d: %s", self._path, seq, exc)
                start = stop
        return batch

    def step(self) -> bool:
        """Compress the oldest spooled entries past LMDB's end and commit them
        to "entries" in one transaction; False when there were none."""
        tx, spool = self._tx, self._spool
        spool.refresh()  # before LMDB's read (see spool)
        with tx.read() as txn:
            end = stored_end(tx, txn)
        batch = self._read_batch(end)
        if not batch:
            spool.absorbed(end, newest_too=False, sync=self._sync_store)
            return False
        self._dicts.refresh()  # another mover may have trained one (a hand-over)
        final: list[bytes | memoryview] = [frame for _, _, frame in batch]
        todo: dict[int, list[int]] = {}
        payloads: dict[int, bytes | memoryview] = {}
        by_kind: dict[int, list[bytes | memoryview]] = {}
        for index, (seq, kind, frame) in enumerate(batch):
            try:
                payloads[index] = spooled_payload(frame, seq)
            except FrameError:
                continue  # moved as it is: the damage is reported where it is read
            by_kind.setdefault(kind, []).append(payloads[index])
        self._dicts.train_on(by_kind)
        # Whether each kind has a dictionary, looked up once a batch, not per entry.
        with_dict = {kind: self._dicts.for_kind(kind)[1] is not None for kind in by_kind}
        for index, (_, kind, _) in enumerate(batch):
            if index in payloads and worth_compressing(len(payloads[index]), with_dict[kind]):
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
        spool.absorbed(batch[-1][0], newest_too=False, sync=self._sync_store)
        for kind, count in collections.Counter(kind for _, kind, _ in batch).items():
            self._dicts.seen(kind, count)
        return True
