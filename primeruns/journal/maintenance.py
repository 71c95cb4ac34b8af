"""Keeping a journal well: the background sync, the reserve file, and the
full scan for damage.

Durability for "process" mode: a sync at most a second after anything was
written (``env.sync`` is safe alongside transactions), and no wake-up at all
while nothing is: the thread waits for the journal's ``written`` event.
With "fsync" each append syncs itself, and this syncs again within a second
one whose sync failed (an idle run's last record was synced only at close).

The owner lock's file is looked at in each such second too (one ``fstat``):
a tmp cleaner that deleted ``owner.lock`` alone left a live run reading
"crashed", and open to a take-over, for good; now until its holder's next
write (the producer's append, the uplink's acknowledgement), when it makes
the file again (``OwnerLock.restore``). Not on a timer while nothing is
written: an idle run wakes nothing (``tools/bench/idle_wakeups.py``).

Each such second also wakes the mover, where it runs in this process (offline,
or shipping from threads). An append does not wake it (only near the byte
budget does the room count, see ``capacity``): a thread woken in the middle
of a burst of ``log_*`` calls waits for the GIL, and the producer, which lets
the GIL go at each call's ``write()``, wakes that waiter every time without
handing the GIL over (each release by the producer is followed by its own
re-take): woken by the appends, the mover made a tight loop of
``log_metrics`` calls cost 4x ``json.dumps`` of the row instead of 1.7x.
Dictionary training is not here but in the mover's thread (``mover``): it
belongs where entries are compressed, which is not the producer once its
uplink moves.
"""

from __future__ import annotations

import threading
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import lmdb

from primeruns.exceptions import JournalCorruptError
from primeruns.journal.frames import FrameError, decode_frame
from primeruns.journal.reading import Reader
from primeruns.journal.torn import torn_damage
from primeruns.journal.txn import MAX_VALUE_BYTES, Transactions, ensure_reserve
from primeruns.journal.types import Damage
from primeruns.logs import get_logger
from primeruns.threads import start_daemon

log = get_logger("primeruns.journal")

SYNC_INTERVAL = 1.0
# A full scan reads the journal this much at a time: ``primeruns sync`` of a
# finished copy scans every entry before it ships, and reads of 10,000
# entries (up to 64 MB) held 61 MB at once over a 40 MB journal of episodes
# (20 MB now). A read's own cost is small next to its entries'.
SCAN_ENTRIES = 1_000
SCAN_BYTES = 8 << 20


class Background:
    """The thread that syncs, lets go of absorbed spool segments and restores the reserve."""

    def __init__(
        self,
        tx: Transactions,
        reader: Reader,
        *,
        durability: str,
        sync_spool: Callable[[], None] | None = None,
        tick: Callable[[], None] | None = None,
        first_written: Callable[[], None] | None = None,
        keep_lock: Callable[[], object] | None = None,
    ) -> None:
        self._tx = tx
        self._keep_lock = keep_lock
        # Called here once, at the first write: what a log call would
        # otherwise start itself later (the spool's syncer thread).
        self._first_written = first_written
        self._reader = reader
        self._durability = durability
        self._sync_spool = sync_spool
        self._tick = tick
        self._stop = threading.Event()
        # Exceptions a pass did not expect, per step (``_guarded``).
        self.failures: Counter[str] = Counter()
        ensure_reserve(tx.path)
        self._thread = start_daemon(self._loop, f"primeruns-journal-{tx.path.name}")

    def _loop(self) -> None:
        tx = self._tx
        first_written = self._first_written
        while not self._stop.is_set():
            tx.written.wait()
            if first_written is not None and not self._stop.is_set():
                self._guarded("start the spool's sync thread", first_written)
                first_written = None
            # A second's writes share one sync; close syncs what is left.
            if self._stop.wait(SYNC_INTERVAL):
                break
            tx.written.clear()  # before syncing: a write during it is synced next time
            # The mover's wake first: a slow disk does not hold it back.
            self._guarded("wake the mover", self._tick)
            if self._sync_spool is not None:
                # With "fsync" too: an append whose own sync failed is synced
                # again here (nothing else is due: each append clears it).
                self._guarded("sync the spool", self._sync_spool)
                # Lets go of this appender's segments a mover elsewhere deleted.
                self._guarded("let go of deleted segments", self._reader.spool.let_go)
            if self._durability == "process":
                self._guarded("sync the journal", self._sync_store)
            # The reserve back in place once the disk has room again.
            self._guarded("restore the reserve file", lambda: ensure_reserve(tx.path))
            self._guarded("restore owner.lock", self._keep_lock)  # (module doc)

    def _guarded(self, what: str, step: Callable[[], object] | None) -> None:
        """Run one step of a pass; an exception it did not expect (a bug, or
        an error no one foresaw) is logged, the first of each step's, and
        counted, and the thread goes on. Let out, it ended the thread: no
        sync, no reserve, no ``owner.lock`` made again for the rest of the
        run. Each step is tried again at the next pass (after the next write)."""
        if step is None:
            return
        try:
            step()
        except Exception as exc:
            self.failures[what] += 1
            if self.failures[what] == 1:
                log.warning(
                    "journal %s: the background sync could not %s (%s: %s); going on",
                    self._tx.path,
                    what,
                    type(exc).__name__,
                    exc,
                    exc_info=True,
                )

    def _sync_store(self) -> None:
        tx = self._tx
        if tx.dirty:
            tx.dirty = False
            try:
                tx.store.sync()
            except lmdb.Error:
                tx.dirty = True  # try again next tick (e.g. transient EIO)
                tx.written.set()

    def stop(self) -> None:
        self._stop.set()
        self._tx.written.set()  # out of its wait for a write
        self._thread.join()


def scan_damage(tx: Transactions, reader: Reader, *, decode: bool = True) -> list[Damage]:
    """Structural damage plus every damaged or missing entry (a full scan).
    The intact entries' seqs are not kept: eight bytes an entry, held to
    the scan's end, that only a reader of them needs (a final copy's damage
    looked for before its import held a megabyte per 120,000 entries)."""
    return scan(tx, reader, decode=decode, seqs=False).damage


@dataclass
class Scan:
    """What one scan of every entry found."""

    damage: list[Damage]
    #: With ``decode=False``: the seqs of the intact entries, per kind, ascending.
    seqs: dict[int, array[int]] = field(default_factory=dict)


def scan(tx: Transactions, reader: Reader, *, decode: bool = True, seqs: bool = True) -> Scan:
    """Structural damage plus every damaged or missing entry, reading each entry once.

    ``decode=False`` checks each entry's checksum without decompressing it
    (``check_entry``): the same damage unless a frame was written corrupt (no
    checksum sees that), at a fraction of the cost, with nothing decoded
    held; the intact entries' seqs per kind come with it (eight bytes each),
    for a reader that then decodes the few it shows (``seqs=False``: not kept)."""
    found = Scan(list(tx.problems))
    after = reader.floor_now()
    reader.spool.refresh()
    found.damage.extend(reader.spool.damage())
    found.damage.extend(torn_damage(tx, reader.spool))
    while (went_to := _scan_some(reader, after, decode, found, seqs)) > after:
        after = went_to
    for name in ("cursors", "meta"):
        found.damage.extend(_scan_table(tx, name))
    # What damage cost the newest spool segment is the spool's report and
    # the reads' alike: listed once.
    found.damage = list(dict.fromkeys(found.damage))
    return found


def _scan_some(reader: Reader, after: int, decode: bool, found: Scan, seqs: bool) -> int:
    """One read of ``scan`` after ``after``: its damage and checked entries
    into ``found``; where it got to. What it decoded (up to ``SCAN_BYTES``,
    or one entry of any size) is let go before the next read: held through
    it, a scan of large entries held two of them at once."""
    result = reader.read(after, max_entries=SCAN_ENTRIES, max_bytes=SCAN_BYTES, decode=decode)
    found.damage.extend(result.damaged)
    if not seqs:
        return result.next_after
    for seq, kind in result.checked:
        found.seqs.setdefault(kind, array("q")).append(seq)
    return result.next_after


def _scan_table(tx: Transactions, name: str) -> list[Damage]:
    out: list[Damage] = []
    try:
        with tx.read() as txn:
            for raw_key, value in txn.cursor(db=tx.dbs[name]):
                try:
                    # Bounded as their readers are (``txn.bounded_json``): a
                    # hostile journal's 128 MiB value is named, not inflated.
                    decode_frame(value, max_bytes=MAX_VALUE_BYTES)
                except FrameError as exc:
                    label = bytes(raw_key).decode(errors="replace")
                    out.append(Damage(None, f"{name} key {label!r} unreadable: {exc}"))
    except (lmdb.Error, JournalCorruptError) as exc:
        out.append(Damage(None, f"{name} table unreadable: {exc}"))
    return out
