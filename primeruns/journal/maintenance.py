"""Keeping a journal well: the background sync, dictionary training, the
reserve file, and the full scan for damage.

Durability for "process" mode: at least one sync per second while there is
something to sync (``env.sync`` is safe alongside transactions). Training
runs here, off the append path; it is woken early once a kind has enough
records, so a burst does not go uncompressed by its dictionary.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import lmdb

from primeruns.exceptions import JournalCorruptError, JournalError
from primeruns.journal.dicts import Dictionaries
from primeruns.journal.frames import FrameError, decode_frame
from primeruns.journal.reading import Reader
from primeruns.journal.txn import Transactions, ensure_reserve
from primeruns.journal.types import Damage
from primeruns.threads import start_daemon

SYNC_INTERVAL = 1.0


class Background:
    """The thread that syncs, trains dictionaries and restores the reserve."""

    def __init__(
        self,
        tx: Transactions,
        reader: Reader,
        dicts: Dictionaries,
        *,
        durability: str,
        wake: threading.Event,
        sync_spool: Callable[[], None] | None = None,
    ) -> None:
        self._tx = tx
        self._reader = reader
        self._dicts = dicts
        self._durability = durability
        self._wake = wake
        self._sync_spool = sync_spool
        self._stop = threading.Event()
        ensure_reserve(tx.path)
        self._thread = start_daemon(self._loop, f"primeruns-journal-{tx.path.name}")

    def _loop(self) -> None:
        tx = self._tx
        while not self._stop.is_set():
            self._wake.wait(SYNC_INTERVAL)
            self._wake.clear()
            if self._stop.is_set():
                break
            if self._sync_spool is not None and self._durability == "process":
                self._sync_spool()
            if self._sync_spool is not None:
                # Lets go of this appender's segments a mover elsewhere deleted.
                self._reader.spool.let_go()
            if tx.dirty and self._durability == "process":
                tx.dirty = False
                try:
                    tx.store.sync()
                except lmdb.Error:
                    tx.dirty = True  # try again next tick (e.g. transient EIO)
            with contextlib.suppress(JournalError, lmdb.Error):
                self._dicts.train(self._reader.read, self._reader.floor)
            ensure_reserve(tx.path)  # back in place once the disk has room again

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()


def scan_damage(tx: Transactions, reader: Reader) -> list[Damage]:
    """Structural damage plus every damaged or missing entry (a full scan)."""
    found = list(tx.problems)
    after = reader.floor_now()
    reader.spool.refresh()
    found.extend(reader.spool.damage())
    while True:
        result = reader.read(after, max_entries=10_000, max_bytes=64 << 20)
        found.extend(result.damaged)
        if result.next_after <= after:
            break
        after = result.next_after
    for name in ("cursors", "meta"):
        found.extend(_scan_table(tx, name))
    return found


def _scan_table(tx: Transactions, name: str) -> list[Damage]:
    out: list[Damage] = []
    try:
        with tx.read() as txn:
            for raw_key, value in txn.cursor(db=tx.dbs[name]):
                try:
                    decode_frame(value)
                except FrameError as exc:
                    label = bytes(raw_key).decode(errors="replace")
                    out.append(Damage(None, f"{name} key {label!r} unreadable: {exc}"))
    except (lmdb.Error, JournalCorruptError) as exc:
        out.append(Damage(None, f"{name} table unreadable: {exc}"))
    return out
