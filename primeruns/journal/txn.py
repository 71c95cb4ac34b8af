"""The one transaction helper every journal component writes and reads through.

LMDB allows one write transaction at a time per environment, and growing the
map needs every transaction of this process closed (see ``store``), so all of
them run under one in-process lock. Writes grow the map on MapFullError, turn
a full disk, or a data file at the process's file size limit, into
JournalFullError (after releasing the reserve file for the bookkeeping that
frees room), and carry the drops that could not be counted
in their own failed transaction. Reads turn LMDB's errors into
JournalCorruptError: callers see one exception family.

Meta values (JSON under a string key) and the loss counters are read and
written inside other components' transactions, so their primitives are here.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from primeruns import jsonbound
from primeruns.exceptions import JournalCorruptError, JournalError, JournalFullError
from primeruns.journal.frames import decode_frame, encode_frame
from primeruns.journal.fullness import disk_cause, file_size_limit, note_limit
from primeruns.journal.layout import META_KIND, dumps
from primeruns.journal.store import Store, is_disk_full
from primeruns.journal.types import Damage, is_loss_record
from primeruns.logs import get_logger

log = get_logger("primeruns.journal")

_T = TypeVar("_T")

K_LOSSES = "journal.losses"
_MAX_REASONS = 5
# A file of this size sits in the run directory while the disk has room. On a
# full disk it is deleted to make room for the writes that shipping needs (an
# in-flight batch, an acknowledgement), which then free pages by compaction.
# Accounting for LMDB's copy-on-write pages cannot promise that room; a file
# that is already there can.
RESERVE_NAME = "reserve"
RESERVE_BYTES = 256 << 10
# Every page a read touches stays resident until the map goes (see
# Store.drop_resident_pages): after reads of this many bytes, the map is
# dropped between two reads, so a long scan or shipment holds a bounded part
# of the file (the bytes counted leave out the pages' own overhead, so about
# twice this), not all of it.
REMAP_AFTER_BYTES = 32 << 20
# Set by ``ship.resident`` in a process that ships: called with the store
# after each of its transactions, none of them open, to drop the map's
# pages when they piled up (a transaction counts little here, but touches
# pages wherever LMDB put their latest copies, all over a long file).
after_transaction: Callable[[Store], None] | None = None


class Transactions:
    """Write and read transactions on one journal's store, in this process."""

    def __init__(self, path: Path, store: Store) -> None:
        self.path = path
        self.store = store
        self.dbs = store.dbs
        self.lock = store.lock  # an RLock: components nest their own critical sections
        self.dirty = False  # committed since the last sync
        # Set on every write (here, and by the appender's spool): wakes the
        # background sync, which otherwise sleeps without a timer.
        self.written = threading.Event()
        # Set when space runs short (a drop, a refused write, or little room
        # left): the next acknowledgement compacts what every sink has shipped.
        self.tight = False
        self.pending_drops = 0  # dropped appends not yet persisted in the loss counter
        self._read_since_remap = 0
        self.problems: list[Damage] = [Damage(None, p) for p in store.problems]

    def write(self, fn: Callable[[lmdb.Transaction], _T], *, control: bool = True) -> _T:
        """Run ``fn`` in one write transaction, growing the map on MapFullError.

        ``control`` writes (cursors, acknowledgements, meta) may release the
        reserve file on a full disk. Raises JournalFullError at the budget or
        on a full disk, JournalError for any other failed write.
        """
        with self.lock:
            while True:
                try:
                    folded = self.pending_drops
                    with self.store.begin(write=True) as txn:
                        if folded:
                            self.add_loss(txn, "journal", folded, None)
                        result = fn(txn)
                    self.pending_drops -= folded
                    self.dirty = True
                    self.written.set()
                    self._after()
                    return result
                except lmdb.MapFullError:
                    if not self.store.grow():
                        self.tight = True
                        raise JournalFullError(
                            f"journal {self.path} is at its byte budget"
                        ) from None
                except lmdb.Error as exc:
                    if (
                        is_disk_full(exc)
                        or self._short_write_on_full_disk(exc)
                        or self._at_file_size_limit(exc)
                    ):
                        self.tight = True
                        # Records are dropped on a full disk; the bookkeeping
                        # that ships them (and frees their room) must go on.
                        if control and release_reserve(self.path):
                            continue
                        raise JournalFullError(
                            f"journal {self.path}: {disk_cause(self.path)} ({exc})"
                        ) from None
                    raise JournalError(f"write to journal {self.path} failed: {exc}") from None

    @contextlib.contextmanager
    def read(self, *, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        # LMDB's own errors inside a read mean a damaged tree: callers see one
        # exception family (JournalError), never lmdb's.
        try:
            with self.lock:
                with self.store.begin(buffers=buffers) as txn:
                    yield txn
                self._after()
        except lmdb.Error as exc:
            raise JournalCorruptError(f"journal {self.path} is damaged: {exc}") from None

    def _after(self) -> None:
        """A transaction ended (none open; the lock held): see ``after_transaction``."""
        hook = after_transaction
        if hook is not None:
            hook(self.store)

    def count_read(self, nbytes: int) -> None:
        """Note ``nbytes`` of the map read; past ``REMAP_AFTER_BYTES`` since the
        last time, drop the resident pages. Call it outside a transaction."""
        self._read_since_remap += nbytes
        if self._read_since_remap >= REMAP_AFTER_BYTES:
            self._read_since_remap = 0
            # Only memory is at stake: a read after a failed remap fails
            # and is reported as any damaged read is.
            with contextlib.suppress(lmdb.Error):
                self.store.drop_resident_pages()

    def _short_write_on_full_disk(self, exc: lmdb.Error) -> bool:
        """LMDB reports a short write as EIO: on a disk with less free space
        than the reserve, that is the disk being full, not a failing device."""
        if "Input/output error" not in str(exc):
            return False
        try:
            stat = os.statvfs(self.path)
        except OSError:
            return False
        return int(stat.f_bavail) * int(stat.f_frsize) < RESERVE_BYTES

    def _at_file_size_limit(self, exc: lmdb.Error) -> bool:
        """LMDB met the file size limit (``ulimit -f``): a write past it fails
        with EFBIG, one across it comes back short, which LMDB reports as
        EIO; its data file then reaches the limit. Full, not a failing device:
        the shippers' writes waited on it as on a broken disk, and nothing
        freed room for what was held. Noted for the warning (``fullness``)."""
        text = str(exc)
        if "File too large" not in text and "Input/output error" not in text:
            return False
        limit = file_size_limit()
        if limit is None:
            return False
        if "File too large" not in text and self.store.file_size() + (64 << 10) < limit:
            return False
        note_limit(self.path)
        return True

    # -- meta values, inside a transaction ----------------------------------------------

    def put_meta(self, txn: lmdb.Transaction, key: str, value: Any) -> None:
        self.put_meta_bytes(txn, key, dumps(value))

    def put_meta_bytes(self, txn: lmdb.Transaction, key: str, value: bytes) -> None:
        txn.put(key.encode(), encode_frame(META_KIND, value), db=self.dbs["meta"])

    def meta(self, txn: lmdb.Transaction, key: str) -> Any:
        """A meta value; KeyError if absent, JournalCorruptError naming the key if unreadable."""
        raw = txn.get(key.encode(), db=self.dbs["meta"])
        if raw is None:
            raise KeyError(key)
        try:
            # Whole, as written: the SDK reads back its own spec and config,
            # of any size; listings read through ``Meta.all``'s bounds.
            return json.loads(decode_frame(raw)[1])
        except (ValueError, RecursionError) as exc:  # FrameError too
            raise JournalCorruptError(
                f"meta key {key!r} of {self.path} unreadable: {exc}"
            ) from None

    def meta_or(self, txn: lmdb.Transaction, key: str, default: Any) -> Any:
        try:
            return self.meta(txn, key)
        except KeyError:
            return default

    def safe_meta(self, key: str) -> Any:
        """A meta value, or None if absent or unreadable (recorded as structural damage)."""
        try:
            with self.read() as txn:
                return self.meta(txn, key)
        except KeyError:
            return None
        except JournalCorruptError as exc:
            self.problems.append(Damage(None, str(exc)))
            return None
        except lmdb.Error as exc:
            self.problems.append(Damage(None, f"meta key {key!r} unreadable: {exc}"))
            return None

    # -- loss counters, inside a transaction --------------------------------------------

    def losses_in(self, txn: lmdb.Transaction) -> dict[str, dict[str, Any]]:
        value = self.meta_or(txn, K_LOSSES, {})
        if not isinstance(value, dict):
            self._damaged(f"meta {K_LOSSES!r} is not a record per sink: left out")
            return {}
        # A sink's record of another shape (a hostile or foreign journal: a
        # count that is not one, ``as_count``) is left out and named as
        # damage: ``ls`` and ``show`` read its count as a number and failed
        # with a traceback, or summed a negative one into the run's total.
        # A loss counted for that sink starts it afresh.
        kept = {sink: rec for sink, rec in value.items() if is_loss_record(rec)}
        for sink in value.keys() - kept.keys():
            shown = repr(value[sink])[:80]
            self._damaged(f"meta {K_LOSSES!r}: sink {sink!r} holds no loss count ({shown})")
        return kept

    def _damaged(self, what: str) -> None:
        """Name meta found damaged (once, however often it is read)."""
        found = Damage(None, what)
        if found not in self.problems:
            self.problems.append(found)

    def add_loss(self, txn: lmdb.Transaction, sink: str, count: int, reason: str | None) -> None:
        """Count ``count`` records lost for ``sink`` (the last few reasons are kept).

        Drops at the budget go under sink "journal", with no reason of their own.
        """
        losses = self.losses_in(txn)
        rec = losses.setdefault(sink, {"count": 0, "reasons": []})
        rec["count"] = int(rec.get("count", 0)) + count
        if reason:
            rec["reasons"] = [*rec.get("reasons", []), reason][-_MAX_REASONS:]
        self.put_meta(txn, K_LOSSES, losses)


#: The most JSON decoded of one meta value or cursor: a journal is untrusted
#: input, and a frame declaring 128 MiB packs into a few KB (``meta``). The
#: meta module's bounds are these; they live here, where both are decoded.
MAX_VALUE_BYTES = 16 << 20
#: The most values (containers and scalars) decoded of one: 2 MiB of
#: ``[[],[],...]`` is 700,000 lists, ~60 bytes each once decoded.
MAX_VALUES = 500_000


def bounded_json(frame: bytes | memoryview) -> Any:
    """The JSON value a meta or cursor ``frame`` holds; ValueError (FrameError
    among them) if it declares more than ``MAX_VALUE_BYTES``, holds more than
    ``MAX_VALUES`` values, nests past the decoder's limit or is not JSON:
    refused before it is decompressed, or parsed."""
    return jsonbound.loads(
        decode_frame(frame, max_bytes=MAX_VALUE_BYTES)[1], MAX_VALUE_BYTES, MAX_VALUES
    )


def ensure_reserve(path: Path) -> None:
    """Put the reserve file in place when the disk can spare it (best effort)."""
    reserve = path / RESERVE_NAME
    if reserve.exists():
        return
    try:
        stat = os.statvfs(path)
        if int(stat.f_bavail) * int(stat.f_frsize) < 4 * RESERVE_BYTES:
            return
        fd = os.open(reserve, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(reserve)  # a partial reserve is no reserve
    finally:
        os.close(fd)


def release_reserve(path: Path) -> bool:
    """Delete the reserve file to make room; whether there was one."""
    try:
        os.unlink(path / RESERVE_NAME)
    except OSError:
        return False
    log.warning(
        "journal %s: %s; released the journal's reserve to keep shipping", path, disk_cause(path)
    )
    return True
