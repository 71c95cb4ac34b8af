"""The Journal: a run's write-ahead log of records, its cursors and its meta.

Concepts:

- **Entries** have dense sequence numbers from 1 (big-endian u64 keys) and are
  framed (``frames``): a returned ``append`` is committed, so the death of the
  process right after it loses nothing.
- **Cursors**, one per sink: ``acked`` (every entry up to it is acknowledged)
  and at most one **in-flight** batch, stored before the first attempt with its
  exact body, so a resend after a restart is byte-identical.
- **Meta**: JSON values by key (format version, local id, owner, platform
  binding, lifecycle, loss counters), each updated in one transaction with what
  it describes.
- **Durability.** ``"process"`` (default): commits are not fsynced but are in
  the OS page cache once ``append`` returns (SIGKILL-safe); a background
  thread syncs at least once a second. ``"fsync"``: every commit is synced
  (power-loss safe, ~0.3 ms per append).
- **Capacity.** At the byte budget or on a full disk, ``append`` returns
  ``dropped`` and counts the loss under sink ``"journal"``; it never raises.

Thread-safety: every method may be called from any thread. One process owns a
journal for writing (``owner=True``, an flock); read-only opens take no lock
and work while the owner writes. A live run's uplink shares its producer's
lock (``open(lock_fd=...)``): it writes cursors, acknowledgements and meta but
never appends, and sees the producer's appends as they commit; only the
appending process compresses staged entries and trains dictionaries. A
forked child cannot use an inherited Journal: every call raises JournalError
(``store`` explains why).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import struct
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import lmdb
import zstandard

from primeruns.exceptions import JournalCorruptError, JournalError, JournalFullError
from primeruns.journal import dictionary
from primeruns.journal.frames import (
    HEADER_SIZE,
    EntryKind,
    FrameError,
    decode_frame,
    encode_frame,
    encode_frames_off_gil,
    peek_header,
)
from primeruns.journal.fsinfo import warn_if_network_fs
from primeruns.journal.lock import OwnerLock
from primeruns.journal.store import DATA_NAME, Store, acquire_store, is_disk_full, release_store
from primeruns.journal.types import (
    AppendResult,
    CursorState,
    Damage,
    Entry,
    InFlight,
    ReadResult,
)
from primeruns.threads import start_daemon

__all__ = ["DEFAULT_MAX_JOURNAL_BYTES", "FORMAT_VERSION", "Durability", "Journal"]

log = logging.getLogger("primeruns.journal")

Durability = Literal["process", "fsync"]
DEFAULT_MAX_JOURNAL_BYTES = 64 << 30
# 2: entries between LMDB's in-page limit and _CHUNK_UPTO are stored as
# chunks (see _split). 3: the newest entries may sit in the "staging" table
# (see append). Older journals have neither and read the same.
FORMAT_VERSION = 3
SYNC_INTERVAL = 1.0
# Internal meta keys share the meta table with the callers' keys under this prefix.
K_FORMAT = "journal.format_version"
K_LOCAL_ID = "journal.local_id"
K_OWNER = "journal.owner"
K_CREATED = "journal.created_at"
K_LOSSES = "journal.losses"
K_FLOOR = "journal.compacted_upto"
K_DICTS = "journal.dicts"  # {kind: dictionary id} in use for new entries
K_DICT_PREFIX = "journal.dict."  # + id: the dictionary's bytes
# The largest in-flight body recorded, for the appender's control reserve
# (the uplink records batches in another process).
K_INFLIGHT_PEAK = "journal.inflight_peak"
K_BUDGET = "journal.max_bytes"  # the producer's byte budget, which its uplink keeps too
_MAX_REASONS = 5
# A read examines at most this many entries, so skipping a long run of other
# kinds never holds the lock for long; next_after says where it stopped.
_MAX_SCAN = 50_000
_COMPACT_CHUNK = 10_000
# A file of this size sits in the run directory while the disk has room. On a
# full disk it is deleted to make room for the writes that shipping needs (an
# in-flight batch, an acknowledgement), which then free pages by compaction.
# Accounting for LMDB's copy-on-write pages cannot promise that room; a file
# that is already there can.
RESERVE_NAME = "reserve"
_RESERVE_BYTES = 256 << 10
_META_KIND = 0

_T = TypeVar("_T")
_KEY = struct.Struct(">Q")
_CKEY = struct.Struct(">QH")
# LMDB keeps a value of up to ~2,000 bytes inside its leaf page (4 KiB pages);
# anything larger takes whole overflow pages of its own, and values near half
# a page pack two to a page at best. A compressed 9 KB episode is ~1.2-2.5 KB,
# so stored whole it would cost ~40% more disk than its bytes. Values above
# _INPAGE_MAX, up to _CHUNK_UPTO, are therefore split into equal chunks of at
# most _CHUNK bytes, which pack pages densely: the first under the entry's
# 8-byte key, the rest under (seq, index) keys, which sort right after it.
# Larger values keep overflow pages, where the waste is under one page in many.
# Measured on the gsm8k workload: 0.28 -> 0.23 file bytes per raw JSON byte.
# Appending compresses small records inline (~2 µs with their dictionary), but
# a record of _DEFER_MIN bytes or more (a 9 KB episode: ~25 µs of zstd, more
# than the rest of a log call) goes uncompressed into the "staging" table, and
# a background thread compresses it (with the GIL released) and moves it into
# "entries", in order. Once anything is staged, every append is staged, so
# every staged seq is above every seq in "entries" and both read as one log.
# At most _STAGED_RAW_MAX records wait uncompressed: past that the producer
# compresses inline again, which bounds the raw bytes the file ever holds.
_DEFER_MIN = 2_048
_STAGED_RAW_MAX = 32
_MOVE_BATCH = 64
_INPAGE_MAX = 1_300
_CHUNK = 1_000
_CHUNK_UPTO = 16 << 10


def _key(seq: int) -> bytes:
    return _KEY.pack(seq)


def _split(frame: bytes) -> list[bytes]:
    """A stored frame as the values to put (one, or equal in-page chunks)."""
    size = len(frame)
    if size <= _INPAGE_MAX or size > _CHUNK_UPTO:
        return [frame]
    count = -(-size // _CHUNK)
    step = -(-size // count)
    return [frame[i : i + step] for i in range(0, size, step)]


def _seq_of(key: bytes | memoryview) -> int:
    """The entry a key belongs to (an entry key or one of its chunk keys)."""
    return int(_KEY.unpack_from(key)[0])


def _is_chunk_key(key: bytes | memoryview) -> bool:
    return len(key) == _CKEY.size


def _gather(cur: lmdb.Cursor, seq: int, first: bytes | memoryview) -> tuple[bytes, bool]:
    """The entry's whole stored value: ``first`` plus the chunks that follow it
    (the cursor ends on the entry's last key). The flag says the chunk keys
    were in order; a gap makes the value fail its checksum, reported as damage."""
    parts = [bytes(first)]
    ordered = True
    expected = 1
    while cur.next():
        key = cur.key()
        if not _is_chunk_key(key) or _seq_of(key) != seq:
            cur.prev()
            break
        ordered = ordered and _CKEY.unpack(key)[1] == expected
        expected += 1
        parts.append(bytes(cur.value()))
    return b"".join(parts), ordered


# What compaction never removes: the run's spec, summaries and finish decide
# how a crashed run is closed out (``ship.uplink.terminal_state`` reads them from
# the start), and they are few and small.
_KEPT_KINDS = frozenset({int(EntryKind.RUN_OPEN), int(EntryKind.SUMMARY), int(EntryKind.FINISH)})


def _kept_kind(value: bytes | memoryview) -> bool:
    try:
        return peek_header(value).kind in _KEPT_KINDS
    except FrameError:
        return True  # unreadable: leave it for the damage report, never delete it


def _put_new(txn: lmdb.Transaction, key: bytes, value: bytes, db: Any) -> None:
    """Put a key that must not exist yet, after every key in ``db``.

    py-lmdb's ``put(append=True)`` returns False (it does not raise) for a key
    that is not past the last one: an entry would be silently lost. Raised
    inside the transaction, the whole append is aborted instead.
    """
    if not txn.put(key, value, db=db, append=True):
        raise JournalError(f"journal key {key.hex()} is not past the last one: append refused")


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def default_local_id() -> str:
    """``<UTC yyyymmdd-HHMMSS>-<8 hex>``: unique and sortable by creation time."""
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"


class Journal:
    """A run's journal directory. Thread-safe; one writer process (the owner) at a time."""

    path: Path
    local_id: str
    durability: str

    def __init__(
        self,
        path: Path,
        store: Store,
        lock: OwnerLock | None,
        durability: Durability,
        *,
        appender: bool = True,
    ) -> None:
        """Use ``create`` or ``open``."""
        self.path = path
        # Whether this process appends: the uplink sharing a producer's lock does not.
        self._appender = lock is not None and appender
        self.durability = durability
        self._store = store
        self._owner_lock = lock
        self._pid = os.getpid()
        self._lock = store.lock  # serializes transactions (see store: growth)
        self._appended = threading.Condition(threading.Lock())
        self._wake_gen = 0
        self._closed = False
        self._dirty = False
        self._pending_drops = 0  # dropped appends not yet persisted in the loss counter
        self._structural: list[Damage] = [Damage(None, p) for p in store.problems]
        self._floor = 0
        self._zdicts: dict[int, zstandard.ZstdCompressionDict] = {}
        self._psize = int(store.env.stat()["psize"])
        self._headroom = 0  # bytes known to fit without counting again (_room_for)
        self._inflight_peak = 0  # largest in-flight body recorded (_room_for's reserve)
        # Set when space runs short (a drop, a refused write, or little room
        # left): the next acknowledgement compacts what every sink has shipped.
        self._tight = False
        self._sinks: frozenset[str] = frozenset()  # whose acks compaction needs (set_sinks)
        self._kind_counts: dict[int, int] = {}
        self._dict_tried: set[int] = set()
        self._last_seq = self._read_last_seq()
        active = self._safe_meta(K_DICTS)
        self._active_dicts: dict[int, int] = (
            {int(k): int(v) for k, v in active.items()} if isinstance(active, dict) else {}
        )
        local_id = self._safe_meta(K_LOCAL_ID)
        self.local_id = local_id if isinstance(local_id, str) else path.name
        self._staged = self._count_staged()  # entries in "staging" (under self._lock)
        self._move_wake = threading.Event()
        self._move_thread: threading.Thread | None = None
        # Whether this process moves staged entries: the appender, until it
        # hands that to its uplink (``hand_over_staging``), so that no thread of
        # the producer holds the lock its appends need while it waits for
        # LMDB's writer lock behind the uplink's transactions.
        self._moves_here = self._appender
        self._stop_sync = threading.Event()
        # Wakes the background thread early: a kind just got enough records to
        # train its dictionary (a burst would otherwise go uncompressed by it).
        self._bg_wake = threading.Event()
        self._sync_thread: threading.Thread | None = None
        if lock is not None:
            self._ensure_reserve()
            self._sync_thread = start_daemon(
                self._background_loop, f"primeruns-journal-{path.name}"
            )
            if self._appender:
                self._start_mover()

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        runs_dir: Path,
        *,
        local_id: str | None = None,
        durability: Durability = "process",
        max_bytes: int = DEFAULT_MAX_JOURNAL_BYTES,
        meta: Mapping[str, Any] | None = None,
    ) -> Journal:
        """Create ``runs_dir/<local_id>`` (0700, files 0600) and own it.

        Raises JournalError if it exists or cannot be created.
        """
        _check_durability(durability)
        local_id = local_id or default_local_id()
        if not local_id or "/" in local_id or local_id in (".", ".."):
            raise JournalError(f"invalid local run id {local_id!r}")
        runs_dir = Path(runs_dir)
        path = runs_dir / local_id
        if runs_dir.exists() and not runs_dir.is_dir():
            # mkdir(exist_ok=True) raises FileExistsError for a file, which
            # would read as "the run directory exists": name the real problem.
            raise JournalError(f"cannot create a journal under {runs_dir}: it is not a directory")
        try:
            runs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.mkdir(mode=0o700)
            os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
        except FileExistsError:
            raise JournalError(f"a run directory {path} already exists") from None
        except OSError as exc:
            raise JournalError(f"cannot create a journal under {runs_dir}: {exc}") from exc
        warn_if_network_fs(path)
        lock = OwnerLock(path)
        try:
            store = acquire_store(
                path, readonly=False, create=True, sync=durability == "fsync", max_bytes=max_bytes
            )
        except lmdb.Error as exc:
            lock.release()
            raise JournalError(f"cannot create the journal at {path}: {exc}") from exc
        for name in (DATA_NAME, "lock.mdb"):
            with contextlib.suppress(OSError):
                os.chmod(path / name, 0o600)
        journal = cls(path, store, lock, durability)
        values: dict[str, Any] = dict(meta or {})
        values.update(
            {
                K_FORMAT: FORMAT_VERSION,
                K_LOCAL_ID: local_id,
                K_OWNER: lock.owner.to_json(),
                K_CREATED: time.time(),
                K_BUDGET: max_bytes,
            }
        )
        journal.update_meta(values)
        journal.local_id = local_id
        return journal

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        owner: bool = True,
        durability: Durability = "process",
        max_bytes: int = DEFAULT_MAX_JOURNAL_BYTES,
        repair: bool = False,
        lock_fd: int | None = None,
    ) -> Journal:
        """Open an existing journal.

        ``lock_fd``: the owner lock a live producer shared with this process
        (its uplink; see ``lock``): opened for writing without taking the lock,
        trusted (the producer made it) and never appended to.

        ``repair=True`` (with ``owner``) rebuilds the file from a page scan
        before anything writes to it, keeping the damaged file beside it: for a
        journal whose verification found damage, since LMDB must never write
        into a damaged tree.

        ``owner=True`` takes the owner lock (JournalLockedError naming the owner
        while it lives); ``owner=False`` opens read-only, without a lock.
        Raises JournalError if ``path`` is not a journal, JournalCorruptError if
        its structure cannot be read at all; lesser damage is in ``damage()``.
        """
        _check_durability(durability)
        path = Path(path)
        if not (path / DATA_NAME).is_file():
            raise JournalError(f"{path} is not a prime-runs journal (no {DATA_NAME})")
        shared = lock_fd is not None
        if not shared:
            warn_if_network_fs(path)  # the producer warned already
        if lock_fd is not None:
            lock: OwnerLock | None = OwnerLock.inherit(path, lock_fd)
        else:
            lock = OwnerLock(path) if owner else None
        owner = owner or shared
        try:
            try:
                store = acquire_store(
                    path,
                    readonly=not owner,
                    create=False,
                    sync=durability == "fsync",
                    max_bytes=max_bytes,
                    repair=repair and owner and not shared,
                    trusted=shared,
                )
            except ValueError as exc:
                raise JournalError(str(exc)) from None
            except (lmdb.InvalidError, lmdb.VersionMismatchError, lmdb.NotFoundError) as exc:
                raise JournalError(f"{path} is not a prime-runs journal: {exc}") from None
            except lmdb.Error as exc:
                if "already open" in str(exc):
                    # py-lmdb allows one environment per file per process, and a
                    # forked child must keep its inherited one open (see store).
                    raise JournalError(
                        f"{path} is already open in this process (a forked child cannot "
                        "reopen its parent's journal)"
                    ) from None
                raise JournalCorruptError(f"journal {path} cannot be opened: {exc}") from None
            journal = cls(path, store, lock, durability, appender=not shared)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        version = journal._safe_meta(K_FORMAT)
        if isinstance(version, int) and version > FORMAT_VERSION:
            journal.close()
            raise JournalError(
                f"journal {path} has format {version}; this prime-runs reads up to "
                f"{FORMAT_VERSION}: upgrade prime-runs to ship it"
            )
        budget = journal._safe_meta(K_BUDGET)
        if shared and isinstance(budget, int) and budget > 0:
            journal._store.max_bytes = budget  # compaction here keeps the producer's budget
        if lock is not None and not shared:
            try:
                journal.set_meta(K_OWNER, lock.owner.to_json())
            except (lmdb.Error, JournalError) as exc:
                journal._structural.append(Damage(None, f"journal cannot be written: {exc}"))
        return journal

    def _start_mover(self) -> None:
        self._moves_here = True
        self._move_thread = start_daemon(
            self._move_loop, f"primeruns-journal-zstd-{self.path.name}"
        )
        if self._staged:
            self._move_wake.set()  # left staged by an earlier process

    def hand_over_staging(self) -> None:
        """The uplink (which shares the lock) moves staged entries from now on."""
        self._moves_here = False
        self._move_wake.set()  # the mover sees the flag and ends
        thread, self._move_thread = self._move_thread, None
        if thread is not None:
            thread.join()

    def take_back_staging(self) -> None:
        """The uplink is gone: this process moves staged entries again."""
        if not self._moves_here and self._appender and not self._closed:
            with self._lock:
                self._staged = self._count_staged()
            self._start_mover()

    def move_staged(self) -> None:
        """In the uplink's view: take over moving the producer's staged entries."""
        self._check_writable()
        if not self._moves_here:
            self._start_mover()

    def share_lock(self) -> int:
        """The owner lock's descriptor, to hand to this run's uplink process
        (see ``lock``: the two then hold the lock together)."""
        self._check_writable()
        assert self._owner_lock is not None
        return self._owner_lock.share()

    def name_uplink(self, pid: int) -> None:
        """Name the uplink process sharing the owner lock in the lock file."""
        if self._owner_lock is not None:
            self._owner_lock.add_helper(pid)

    def unshare_lock(self) -> None:
        """The uplink could not be started: this process holds the lock alone again."""
        if self._owner_lock is not None:
            self._owner_lock.unshare()

    # -- guards and transactions --------------------------------------------------------

    def _check(self) -> None:
        if os.getpid() != self._pid or self._store.forked:
            raise JournalError(
                f"journal {self.path} was opened in process {self._pid} and cannot be used "
                "in a forked child; open it anew in the child (read-only) if needed"
            )
        if self._closed:
            raise JournalError(f"journal {self.path} is closed")

    def _check_writable(self) -> None:
        self._check()
        if self._owner_lock is None:
            raise JournalError(f"journal {self.path} is open read-only")

    def _short_write_on_full_disk(self, exc: lmdb.Error) -> bool:
        """LMDB reports a short write as EIO: on a disk with less free space
        than the reserve, that is the disk being full, not a failing device."""
        if "Input/output error" not in str(exc):
            return False
        try:
            stat = os.statvfs(self.path)
        except OSError:
            return False
        return int(stat.f_bavail) * int(stat.f_frsize) < _RESERVE_BYTES

    def _ensure_reserve(self) -> None:
        """Put the reserve file in place when the disk can spare it (best effort)."""
        reserve = self.path / RESERVE_NAME
        if reserve.exists():
            return
        try:
            stat = os.statvfs(self.path)
            if int(stat.f_bavail) * int(stat.f_frsize) < 4 * _RESERVE_BYTES:
                return
            fd = os.open(reserve, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return
        try:
            os.posix_fallocate(fd, 0, _RESERVE_BYTES)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(reserve)  # a partial reserve is no reserve
        finally:
            os.close(fd)

    def _release_reserve(self) -> bool:
        """Delete the reserve file to make room; whether there was one."""
        try:
            os.unlink(self.path / RESERVE_NAME)
        except OSError:
            return False
        log.warning(
            "journal %s: the disk is full; released the journal's reserve to keep shipping",
            self.path,
        )
        return True

    def _write(self, fn: Callable[[lmdb.Transaction], _T], *, control: bool = True) -> _T:
        """Run ``fn`` in one write transaction, growing the map on MapFullError.

        Raises JournalFullError at the budget or on a full disk, JournalError
        for any other failed write.
        """
        with self._lock:
            while True:
                try:
                    folded = self._pending_drops
                    with self._store.begin(write=True) as txn:
                        if folded:
                            self._fold_drops(txn, folded)
                        result = fn(txn)
                    self._pending_drops -= folded
                    self._dirty = True
                    return result
                except lmdb.MapFullError:
                    if not self._store.grow():
                        self._tight = True
                        raise JournalFullError(
                            f"journal {self.path} is at its byte budget"
                        ) from None
                except lmdb.Error as exc:
                    if is_disk_full(exc) or self._short_write_on_full_disk(exc):
                        self._tight = True
                        # Records are dropped on a full disk; the bookkeeping
                        # that ships them (and frees their room) must go on.
                        if control and self._release_reserve():
                            continue
                        raise JournalFullError(
                            f"journal {self.path}: the disk is full ({exc})"
                        ) from None
                    raise JournalError(f"write to journal {self.path} failed: {exc}") from None

    def _fold_drops(self, txn: lmdb.Transaction, count: int) -> None:
        # Drops at the budget could not be counted in their own (failed) txn;
        # they ride along with the next write that succeeds.
        losses = self._losses_in(txn)
        rec = losses.setdefault("journal", {"count": 0, "reasons": []})
        rec["count"] = int(rec.get("count", 0)) + count
        self._put_meta(txn, K_LOSSES, losses)

    @contextlib.contextmanager
    def _read_txn(self, *, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        # LMDB's own errors inside a read mean a damaged tree: callers see one
        # exception family (JournalError), never lmdb's.
        try:
            with self._lock, self._store.begin(buffers=buffers) as txn:
                yield txn
        except lmdb.Error as exc:
            raise JournalCorruptError(f"journal {self.path} is damaged: {exc}") from None

    # -- meta -----------------------------------------------------------------------------

    def _put_meta(self, txn: lmdb.Transaction, key: str, value: Any) -> None:
        txn.put(key.encode(), encode_frame(_META_KIND, _json(value)), db=self._store.dbs["meta"])

    def _meta_in(self, txn: lmdb.Transaction, key: str) -> Any:
        """A meta value; raises JournalCorruptError naming the key if unreadable."""
        raw = txn.get(key.encode(), db=self._store.dbs["meta"])
        if raw is None:
            raise KeyError(key)
        try:
            return json.loads(decode_frame(raw)[1])
        except (FrameError, ValueError) as exc:
            raise JournalCorruptError(
                f"meta key {key!r} of {self.path} unreadable: {exc}"
            ) from None

    def _safe_meta(self, key: str) -> Any:
        try:
            with self._read_txn() as txn:
                return self._meta_in(txn, key)
        except KeyError:
            return None
        except JournalCorruptError as exc:
            self._structural.append(Damage(None, str(exc)))
            return None
        except lmdb.Error as exc:
            self._structural.append(Damage(None, f"meta key {key!r} unreadable: {exc}"))
            return None

    def get_meta(self, key: str, default: Any = None) -> Any:
        """The JSON value stored under ``key``, or ``default``.

        Raises JournalCorruptError if the stored value is damaged.
        """
        self._check()
        try:
            with self._read_txn() as txn:
                return self._meta_in(txn, key)
        except KeyError:
            return default

    def all_meta(self) -> dict[str, Any]:
        """Every readable meta value by key (damaged ones are left out; see damage())."""
        self._check()
        out: dict[str, Any] = {}
        with self._read_txn() as txn:
            for key, value in txn.cursor(db=self._store.dbs["meta"]):
                try:
                    out[bytes(key).decode()] = json.loads(decode_frame(value)[1])
                except (FrameError, ValueError):
                    continue
        return out

    def set_meta(self, key: str, value: Any) -> None:
        """Store one JSON value; committed when it returns."""
        self.update_meta({key: value})

    def update_meta(self, values: Mapping[str, Any]) -> None:
        """Store several JSON values in one transaction."""
        self._check_writable()
        encoded = {k: _json(v) for k, v in values.items()}  # fail on bad JSON before writing

        def put(txn: lmdb.Transaction) -> None:
            for k, v in encoded.items():
                txn.put(k.encode(), encode_frame(_META_KIND, v), db=self._store.dbs["meta"])

        self._write(put)

    def push_meta(self, key: str, item: Any, *, cap: int) -> None:
        """Append ``item`` to the JSON list under ``key`` in one transaction,
        keeping the first ``cap`` items (the count of the rest under ``key#more``)."""
        self._check_writable()
        encoded = json.loads(_json(item))

        def put(txn: lmdb.Transaction) -> None:
            current = self._meta_in_default(txn, key, [])
            items = current if isinstance(current, list) else []
            if len(items) < cap:
                self._put_meta(txn, key, [*items, encoded])
            else:
                more = self._meta_in_default(txn, f"{key}#more", 0)
                self._put_meta(txn, f"{key}#more", int(more or 0) + 1)

        self._write(put)

    # -- appending --------------------------------------------------------------------------

    def _read_last_seq(self) -> int:
        try:
            with self._read_txn() as txn:
                last = 0
                for name in ("entries", "staging"):
                    if name not in self._store.dbs:
                        continue
                    cur = txn.cursor(db=self._store.dbs[name])
                    if cur.last() and len(cur.key()) >= 8:
                        last = max(last, _seq_of(cur.key()))
                floor = int(self._meta_in_default(txn, K_FLOOR, 0))
            self._floor = max(self._floor, floor)
            return max(last, floor)
        except (lmdb.Error, JournalCorruptError, ValueError, TypeError) as exc:
            self._structural.append(Damage(None, f"cannot find the last entry: {exc}"))
            return 0

    def append(
        self, kind: EntryKind, payloads: Sequence[bytes], *, essential: bool = False
    ) -> AppendResult:
        """Append entries of one kind in one transaction; returns once committed.

        At the byte budget or on a full disk nothing is written and
        ``dropped=len(payloads)`` is returned (counted under sink ``"journal"``);
        that never raises. ``essential`` entries (a run's spec, its finish: a
        few hundred bytes that decide how the run is closed) may use the room
        kept for bookkeeping, the reserve file included. Raises JournalError on
        a read-only or forked journal and ValueError for a payload over the
        per-entry limit.
        """
        self._check_writable()
        if not payloads:
            return AppendResult(None, 0, 0)
        dict_id = self._active_dicts.get(int(kind), 0)
        zdict = self._dict(dict_id) if dict_id else None
        # Read without the lock: it only chooses raw or compressed, never where
        # an entry goes (decided under the lock, in put).
        raw = [False] * len(payloads)  # which go uncompressed: decided in put
        frames: list[bytes] = []
        staged = [False]  # set by put: where this append went
        db = self._store.dbs["entries"]

        def put(txn: lmdb.Transaction) -> int:
            first = self._last_seq + 1
            staged_now = self._staged
            if not self._moves_here and "staging" in self._store.dbs:
                # Another process moves them: count what it left, in this txn.
                staged_now = int(txn.stat(self._store.dbs["staging"])["entries"])
            defer = "staging" in self._store.dbs and staged_now < _STAGED_RAW_MAX
            raw[:] = [defer and len(p) >= _DEFER_MIN for p in payloads]
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
                staging = self._store.dbs["staging"]
                for i, frame in enumerate(frames):
                    _put_new(txn, _key(first + i), frame, staging)
                return first
            for i, frame in enumerate(frames):
                seq = first + i
                head, *rest = _split(frame)
                _put_new(txn, _key(seq), head, db)
                for index, chunk in enumerate(rest, 1):
                    _put_new(txn, _CKEY.pack(seq, index), chunk, db)
            return first

        try:
            with self._lock:
                # Frames are built in put; raw payloads bound their size.
                if not essential and not self._room_for(
                    sum(len(p) + HEADER_SIZE for p in payloads)
                ):
                    self._tight = True
                    raise JournalFullError("journal byte budget reached")
                first = self._write(put, control=essential)
                if staged[0]:
                    self._staged += len(payloads)
                # Under the lock that chose ``first``: the next append's seq
                # follows this one's, whichever thread it comes from.
                last = self._last_seq = first + len(frames) - 1
        except JournalFullError:
            with self._lock:
                self._pending_drops += len(payloads)
            return AppendResult(None, 0, len(payloads))
        count = self._kind_counts[int(kind)] = self._kind_counts.get(int(kind), 0) + len(payloads)
        if count >= dictionary.MIN_SAMPLES and not dict_id and int(kind) not in self._dict_tried:
            self._bg_wake.set()
        if self._staged and self._moves_here:
            self._move_wake.set()
        with self._appended:
            self._appended.notify_all()
        return AppendResult(first, last - first + 1, 0)

    def _room_for(self, nbytes: int) -> bool:
        """Whether ``nbytes`` of new entries fit the budget minus the control reserve.

        Entries stop short of the budget so that cursor, ack and meta writes
        (which free space, through compaction) always still fit. Called under
        the transaction lock. The exact count is costly (~3 µs), so it is only
        taken once the room known from the last count has been used up.
        """
        need = nbytes + nbytes // 8 + 4 * self._psize  # page and branch overhead
        if need <= self._headroom:
            self._headroom -= need
            return True
        env = self._store.env
        budget = self._disk_budget()
        reserve = min(64 << 20, max(256 << 10, budget // 16))
        # Each sink rewrites its in-flight body copy-on-write (old and new
        # pages live at once): keep room for several of the largest seen.
        if not self._appender or self._inflight_peak == 0:
            with contextlib.suppress(JournalError, lmdb.Error, ValueError, TypeError):
                with self._read_txn() as txn:
                    peak = int(self._meta_in_default(txn, K_INFLIGHT_PEAK, 0) or 0)
                self._inflight_peak = max(self._inflight_peak, peak)
        reserve = max(reserve, 8 * self._inflight_peak)
        used = (int(env.info()["last_pgno"]) + 1) * self._psize  # the file's high-water mark
        if used + need > budget - reserve:
            # Near the budget: count pages in use (LMDB reuses freed pages).
            with self._read_txn() as txn:
                pages = 2
                for st in [env.stat(), *(txn.stat(db) for db in self._store.dbs.values())]:
                    pages += int(st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"])
            used = pages * self._psize
        room = budget - reserve - used
        if room < budget // 4:
            self._tight = True  # compact at the next acknowledgement, before drops begin
        if need > room:
            return False
        # Count again after a quarter of the room is used (or 4 MiB at most).
        self._headroom = min((room - need) // 4, 4 << 20)
        return True

    def _disk_budget(self) -> int:
        """The byte budget, lowered to what the disk can still hold.

        Without this, entries fill a small disk to the last byte and then the
        cursor, ack and in-flight writes that shipping needs fail with ENOSPC
        or EIO. Counting the disk's free space keeps the control reserve
        available on a full disk too.
        """
        try:
            stat = os.statvfs(self.path)
        except OSError:
            return self._store.max_bytes
        free = int(stat.f_bavail) * int(stat.f_frsize)
        return min(self._store.max_bytes, self._store.file_size() + free)

    def last_seq(self) -> int:
        """The highest sequence number written (compaction does not lower it)."""
        self._check()
        if not self._appender:
            self._last_seq = max(self._last_seq, self._read_last_seq())
        return self._last_seq

    def wait_for_append(self, after_seq: int, timeout: float) -> bool:
        """Block until ``last_seq() > after_seq``: True then; False on timeout or wake_all().

        Woken by appends in this process (no polling). Where another process
        appends (the uplink's view), ``wake_all`` is called on its wake-ups
        and the log is read again under the condition, so a wake-up that
        arrives before the wait still counts.
        """
        self._check()
        deadline = time.monotonic() + max(0.0, timeout)
        with self._appended:
            gen = self._wake_gen
            while self._last_seq <= after_seq and self._wake_gen == gen and not self._closed:
                if not self._appender and self.last_seq() > after_seq:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._appended.wait(left)
        return self.last_seq() > after_seq if not self._closed else False

    def wake_all(self) -> None:
        """Wake every thread in wait_for_append (they return False unless data arrived)."""
        with self._appended:
            self._wake_gen += 1
            self._appended.notify_all()
        if self._moves_here and not self._appender:
            self._move_wake.set()  # the producer appended: there may be staged entries

    # -- reading ----------------------------------------------------------------------------

    def read(
        self,
        after_seq: int,
        *,
        kinds: Collection[EntryKind] | None = None,
        max_entries: int = 1000,
        max_bytes: int = 8 << 20,
    ) -> ReadResult:
        """Entries after ``after_seq`` of the given kinds, copied out, ascending.

        Stops at ``max_entries`` or ``max_bytes`` of payload (at least one
        matching entry is returned if any exists). Entries of other kinds are
        skipped by their header, never decompressed. Damaged entries are
        reported in ``damaged`` and passed over; nothing raises for damage.
        """
        self._check()
        wanted = None if kinds is None else frozenset(int(k) for k in kinds)
        raw: list[tuple[int, bytes]] = []
        damaged: list[Damage] = []
        next_after = after_seq
        total = 0
        floor = self._floor_now()
        try:
            with self._read_txn(buffers=True) as txn:
                expected = after_seq + 1
                examined = 0
                full = False
                for name in ("entries", "staging"):  # one log: staged seqs come last
                    if full or name not in self._store.dbs:
                        continue
                    cur = txn.cursor(db=self._store.dbs[name])
                    more = cur.set_range(_key(expected))
                    while more and examined < _MAX_SCAN:
                        key, value = cur.item()
                        if _is_chunk_key(key) and _seq_of(key) < expected:
                            more = cur.next()  # a chunk of an entry passed over
                            continue
                        if len(key) != 8:
                            damaged.append(Damage(None, f"malformed entry key {bytes(key).hex()}"))
                            more = cur.next()
                            continue
                        seq = _KEY.unpack(key)[0]
                        if seq > expected and expected > floor:
                            damaged.append(_missing(expected, seq - 1))
                        expected = seq + 1
                        examined += 1
                        try:
                            head = peek_header(value)
                        except FrameError as exc:
                            damaged.append(Damage(seq, f"entry {seq}: {exc}"))
                            next_after = seq
                            more = cur.next()
                            continue
                        if wanted is None or head.kind in wanted:
                            if raw and (
                                len(raw) >= max_entries or total + head.raw_len > max_bytes
                            ):
                                full = True
                                break
                            whole, _ = _gather(cur, seq, value)
                            raw.append((seq, whole))
                            total += head.raw_len
                        next_after = seq
                        more = cur.next()
        except (lmdb.Error, JournalCorruptError) as exc:
            damaged.append(Damage(None, f"reading after entry {next_after} failed: {exc}"))
        entries: list[Entry] = []
        for seq, value in raw:
            entry, damage = _decode_entry(seq, value, self._dict)
            if entry is not None:
                entries.append(entry)
            if damage is not None:
                damaged.append(damage)
        return ReadResult(entries, next_after, damaged)

    def _floor_now(self) -> int:
        """Entries up to here were compacted away (re-read where another
        process may compact: a read-only view, or a producer with an uplink)."""
        if self._owner_lock is None or self._appender:
            value = self._safe_meta(K_FLOOR)
            if isinstance(value, int):
                self._floor = value
        return self._floor

    def get(self, seq: int) -> Entry | None:
        """The entry ``seq``, or None if absent (never written or compacted).

        Raises JournalCorruptError if it is damaged.
        """
        self._check()
        with self._read_txn() as txn:
            cur = txn.cursor(db=self._store.dbs["entries"])
            value: bytes | None = None
            if cur.set_key(_key(seq)):
                value, _ = _gather(cur, seq, cur.value())
            elif "staging" in self._store.dbs:
                staged = txn.get(_key(seq), db=self._store.dbs["staging"])
                value = None if staged is None else bytes(staged)
        if value is None:
            return None
        entry, damage = _decode_entry(seq, value, self._dict)
        if damage is not None:
            raise JournalCorruptError(f"{self.path}: {damage.what}")
        return entry

    # -- cursors ----------------------------------------------------------------------------

    def _cursor_in(self, txn: lmdb.Transaction, sink: str) -> dict[str, Any]:
        raw = txn.get(sink.encode(), db=self._store.dbs["cursors"])
        if raw is None:
            return {"acked": 0, "inflight": None}
        try:
            data = json.loads(decode_frame(raw)[1])
        except (FrameError, ValueError) as exc:
            raise JournalCorruptError(f"cursor {sink!r} of {self.path} unreadable: {exc}") from None
        if not isinstance(data, dict):
            raise JournalCorruptError(f"cursor {sink!r} of {self.path} is not an object")
        return data

    def _put_cursor(self, txn: lmdb.Transaction, sink: str, data: Mapping[str, Any]) -> None:
        txn.put(sink.encode(), encode_frame(_META_KIND, _json(data)), db=self._store.dbs["cursors"])

    def cursor(self, sink: str) -> CursorState:
        """The sink's acknowledged offset and in-flight batch (acked=0 if never set).

        Raises JournalCorruptError if the cursor or its in-flight body is damaged.
        """
        self._check()
        with self._read_txn() as txn:
            data = self._cursor_in(txn, sink)
            body = txn.get(sink.encode(), db=self._store.dbs["inflight"])
        return self._state(sink, data, body)

    def _state(
        self, sink: str, data: Mapping[str, Any], body: bytes | memoryview | None
    ) -> CursorState:
        info = data.get("inflight")
        if info is None:
            return CursorState(int(data.get("acked", 0)), None)
        if body is None:
            raise JournalCorruptError(f"cursor {sink!r} of {self.path}: in-flight body missing")
        try:
            payload = decode_frame(body)[1]
        except FrameError as exc:
            raise JournalCorruptError(
                f"cursor {sink!r} of {self.path}: in-flight body {exc}"
            ) from None
        inflight = InFlight(
            int(info["first_seq"]), int(info["last_seq"]), payload, dict(info.get("state") or {})
        )
        return CursorState(int(data.get("acked", 0)), inflight)

    def cursors(self) -> dict[str, int]:
        """Every sink's acknowledged offset."""
        self._check()
        out: dict[str, int] = {}
        with self._read_txn() as txn:
            for key, _ in txn.cursor(db=self._store.dbs["cursors"]):
                sink = bytes(key).decode(errors="replace")
                try:
                    out[sink] = int(self._cursor_in(txn, sink).get("acked", 0))
                except (JournalCorruptError, ValueError, TypeError):
                    continue
        return out

    def set_inflight(self, sink: str, inflight: InFlight) -> None:
        """Record the sink's in-flight batch; committed (durable) when it returns."""
        self._check_writable()
        if inflight.first_seq > inflight.last_seq:
            raise ValueError("in-flight range is empty")
        state = _json(inflight.state)  # JSON-able or fail before writing
        body = encode_frame(_META_KIND, inflight.body)
        # The control reserve must hold the in-flight bodies (see _room_for).
        grew = len(body) > self._inflight_peak
        self._inflight_peak = max(self._inflight_peak, len(body))

        def put(txn: lmdb.Transaction) -> None:
            if grew:
                self._put_meta(txn, K_INFLIGHT_PEAK, self._inflight_peak)
            data = self._cursor_in(txn, sink)
            data["inflight"] = {
                "first_seq": inflight.first_seq,
                "last_seq": inflight.last_seq,
                "state": json.loads(state),
            }
            self._put_cursor(txn, sink, data)
            txn.put(sink.encode(), body, db=self._store.dbs["inflight"])

        self._write(put)

    def update_inflight_state(self, sink: str, state: Mapping[str, Any]) -> None:
        """Merge ``state`` into the in-flight batch's state; JournalError if none."""
        self._check_writable()
        extra = json.loads(_json(dict(state)))

        def put(txn: lmdb.Transaction) -> None:
            data = self._cursor_in(txn, sink)
            if not data.get("inflight"):
                raise JournalError(f"sink {sink!r} has no batch in flight")
            data["inflight"]["state"] = {**(data["inflight"].get("state") or {}), **extra}
            self._put_cursor(txn, sink, data)

        self._write(put)

    def ack(self, sink: str, upto_seq: int, *, failed: int = 0, reason: str | None = None) -> None:
        """Atomically: acked=upto_seq, in-flight cleared, ``failed`` counted as lost.

        Raises ValueError if ``upto_seq`` goes backwards or past ``last_seq()``.
        """
        self._check_writable()
        if upto_seq > self._last_seq and upto_seq > self.last_seq():
            raise ValueError(f"cannot ack {upto_seq}: the last entry is {self._last_seq}")

        def put(txn: lmdb.Transaction) -> None:
            data = self._cursor_in(txn, sink)
            if upto_seq < int(data.get("acked", 0)):
                raise ValueError(f"sink {sink!r} already acked {data['acked']} > {upto_seq}")
            self._put_cursor(txn, sink, {"acked": upto_seq, "inflight": None})
            txn.delete(sink.encode(), db=self._store.dbs["inflight"])
            if failed > 0:
                self._add_loss(txn, sink, failed, reason)

        self._write(put)
        if not self._appender and self._sinks:
            # The appender, which notices a short budget, is another process:
            # look at the room here (cheap until the known headroom is used).
            with self._lock, contextlib.suppress(JournalError, lmdb.Error, OSError):
                self._headroom = 0  # counted afresh: the appender's use is not seen here
                self._room_for(0)
        if self._tight and self._sinks:
            self._tight = False
            with contextlib.suppress(JournalError):
                self.compact(sinks=self._sinks)

    def set_sinks(self, names: Collection[str]) -> None:
        """Name the sinks that ship this journal: while space is short, entries
        every one of them acknowledged are compacted away (oldest first), so
        the byte budget bounds the backlog, not the run's whole history. With
        no sinks named (an offline run, a reader) nothing is ever compacted."""
        self._sinks = frozenset(names)

    def drop_sink(self, name: str) -> None:
        """``name`` is off for good (not enabled for the account, opted out):
        nothing it would have shipped is owed, so compaction no longer waits
        for its acknowledgements."""
        self._sinks = self._sinks - {name}

    # -- losses ---------------------------------------------------------------------------

    def _losses_in(self, txn: lmdb.Transaction) -> dict[str, dict[str, Any]]:
        try:
            value = self._meta_in(txn, K_LOSSES)
        except KeyError:
            return {}
        return value if isinstance(value, dict) else {}

    def _add_loss(self, txn: lmdb.Transaction, sink: str, count: int, reason: str | None) -> None:
        losses = self._losses_in(txn)
        rec = losses.setdefault(sink, {"count": 0, "reasons": []})
        rec["count"] = int(rec.get("count", 0)) + count
        if reason:
            rec["reasons"] = [*rec.get("reasons", []), reason][-_MAX_REASONS:]
        self._put_meta(txn, K_LOSSES, losses)

    def record_loss(self, sink: str, count: int, reason: str) -> None:
        """Count ``count`` records lost for ``sink`` (the last few reasons are kept)."""
        self._check_writable()
        self._write(lambda txn: self._add_loss(txn, sink, count, reason))

    def losses(self) -> dict[str, dict[str, Any]]:
        """``{sink: {"count": n, "reasons": [...]}}``; budget drops are under ``"journal"``."""
        self._check()
        with self._read_txn() as txn:
            losses = self._losses_in(txn)
        if self._pending_drops:
            rec = losses.setdefault("journal", {"count": 0, "reasons": []})
            rec["count"] = int(rec["count"]) + self._pending_drops
        for rec in losses.values():
            rec.setdefault("reasons", [])
        if "journal" in losses and not losses["journal"]["reasons"]:
            losses["journal"]["reasons"] = ["journal byte budget reached or disk full"]
        return losses

    # -- maintenance ------------------------------------------------------------------------

    def size_bytes(self) -> int:
        """Bytes of the journal's data file on disk."""
        return self._store.file_size()

    def structural_damage(self) -> list[Damage]:
        """Damage found while opening (file, meta), without scanning entries."""
        return list(self._structural)

    def damage(self) -> list[Damage]:
        """Structural damage plus every damaged or missing entry (a full scan)."""
        self._check()
        found = list(self._structural)
        after = self._floor_now()
        while True:
            result = self.read(after, max_entries=10_000, max_bytes=64 << 20)
            found.extend(result.damaged)
            if result.next_after <= after:
                break
            after = result.next_after
        for name in ("cursors", "meta"):
            found.extend(self._scan_table(name))
        return found

    verify = damage

    def _scan_table(self, name: str) -> list[Damage]:
        out: list[Damage] = []
        try:
            with self._read_txn() as txn:
                for key, value in txn.cursor(db=self._store.dbs[name]):
                    try:
                        decode_frame(value)
                    except FrameError as exc:
                        label = bytes(key).decode(errors="replace")
                        out.append(Damage(None, f"{name} key {label!r} unreadable: {exc}"))
        except (lmdb.Error, JournalCorruptError) as exc:
            out.append(Damage(None, f"{name} table unreadable: {exc}"))
        return out

    def compact(self, sinks: Collection[str] | None = None) -> int:
        """Delete entries acknowledged by every sink in ``sinks`` (default:
        every sink with a cursor; a named sink without one has acknowledged
        nothing); returns how many.

        ``last_seq()`` is unchanged; a read after the removed range starts later.
        """
        self._check_writable()
        acked = self.cursors()
        if sinks is not None:
            acked = {name: acked.get(name, 0) for name in sinks}
        if not acked:
            return 0
        upto = min(min(acked.values()), self._last_seq)
        if upto <= self._floor:
            return 0
        removed = 0
        db = self._store.dbs["entries"]
        while True:

            def chunk(txn: lmdb.Transaction) -> tuple[int, bool, int]:
                cur = txn.cursor(db=db)
                n = keys = 0
                more = cur.first()
                kept = -1  # the seq of a lifecycle entry passed over (and its chunks)
                while (
                    more
                    and keys < _COMPACT_CHUNK
                    and len(cur.key()) in (_KEY.size, _CKEY.size)
                    and _seq_of(cur.key()) <= upto
                ):
                    seq = _seq_of(cur.key())
                    if len(cur.key()) == _KEY.size and _kept_kind(cur.value()):
                        kept = seq
                    if seq == kept:
                        more = cur.next()
                        continue
                    n += len(cur.key()) == _KEY.size  # entries, not their chunks
                    keys += 1
                    more = cur.delete()
                unstaged = 0
                if keys < _COMPACT_CHUNK and "staging" in self._store.dbs:
                    cur = txn.cursor(db=self._store.dbs["staging"])
                    more = cur.first()
                    while (
                        more
                        and keys < _COMPACT_CHUNK
                        and len(cur.key()) == _KEY.size
                        and _seq_of(cur.key()) <= upto
                    ):
                        if _kept_kind(cur.value()):
                            more = cur.next()
                            continue
                        n, keys = n + 1, keys + 1
                        unstaged += 1
                        more = cur.delete()
                floor = self._meta_in_default(txn, K_FLOOR, 0)
                if upto > floor:
                    self._put_meta(txn, K_FLOOR, upto)
                return n, keys >= _COMPACT_CHUNK, unstaged

            with self._lock:
                n, full, unstaged = self._write(chunk)
                self._staged -= unstaged
            removed += n
            if not full:
                break
        self._floor = max(self._floor, upto)
        with self._lock:
            self._headroom = 0  # count the room again: pages were freed
        return removed

    def _meta_in_default(self, txn: lmdb.Transaction, key: str, default: Any) -> Any:
        try:
            return self._meta_in(txn, key)
        except KeyError:
            return default

    def sync(self) -> None:
        """Flush the journal to disk (fsync)."""
        self._check()
        if self._owner_lock is not None:
            self._store.sync()
            self._dirty = False

    def _background_loop(self) -> None:
        # Durability for "process" mode: at least one sync per second while there
        # is something to sync (env.sync is safe alongside txns); and dictionary
        # training, kept off the append path.
        while not self._stop_sync.is_set():
            self._bg_wake.wait(SYNC_INTERVAL)
            self._bg_wake.clear()
            if self._stop_sync.is_set():
                break
            if self._dirty and self.durability == "process":
                self._dirty = False
                try:
                    self._store.sync()
                except lmdb.Error:
                    self._dirty = True  # try again next tick (e.g. transient EIO)
            if self._appender:
                with contextlib.suppress(JournalError, lmdb.Error):
                    self.train_dictionaries()
            self._ensure_reserve()  # back in place once the disk has room again

    def _count_staged(self) -> int:
        if "staging" not in self._store.dbs:
            return 0
        try:
            with self._read_txn() as txn:
                return int(txn.stat(self._store.dbs["staging"])["entries"])
        except lmdb.Error:
            return 0

    def _move_loop(self) -> None:
        # Never lets an error out: a staged entry is intact and readable where
        # it is; it only takes more room until it moves.
        while not self._stop_sync.is_set() and self._moves_here:
            self._move_wake.wait(SYNC_INTERVAL)
            self._move_wake.clear()
            try:
                while not self._stop_sync.is_set() and self._moves_here and self._move_some():
                    pass
            except JournalFullError:
                # No room to move into until something is acknowledged and
                # compacted (or the user frees the disk): try again later.
                continue
            except (JournalError, lmdb.Error, FrameError, ValueError) as exc:
                log.warning("journal %s: background compression stopped: %s", self.path, exc)
                return

    def _move_some(self) -> bool:
        """Compress the oldest staged entries and move them into "entries", in
        order, in one transaction; False when nothing is staged."""
        staging = self._store.dbs.get("staging")
        if staging is None:
            return False
        batch: list[tuple[bytes, bytes]] = []
        with self._read_txn() as txn:
            for key, value in txn.cursor(db=staging):
                batch.append((bytes(key), bytes(value)))
                if len(batch) >= _MOVE_BATCH:
                    break
        if not self._appender:
            active = self._safe_meta(K_DICTS)  # the producer may have trained one since
            if isinstance(active, dict):
                self._active_dicts = {int(k): int(v) for k, v in active.items()}
        if not batch:
            with self._lock:
                # Another process may have compacted staged entries away.
                self._staged = self._count_staged()
            return False
        # Uncompressed ones are compressed here, off the GIL, outside the lock.
        todo: dict[int, list[int]] = {}
        payloads: dict[int, bytes] = {}
        for index, (key, value) in enumerate(batch):
            try:
                head = peek_header(value)
                if head.flags == 0 and head.raw_len >= _DEFER_MIN:
                    payloads[index] = decode_frame(value, seq=_seq_of(key))[1]
                    todo.setdefault(head.kind, []).append(index)
            except FrameError:
                pass  # moved as it is: the damage is reported where it is read
        final = [value for _, value in batch]
        for kind, indexes in todo.items():
            dict_id = self._active_dicts.get(kind, 0)
            zdict = self._dict(dict_id) if dict_id else None
            seqs = [_seq_of(batch[i][0]) for i in indexes]
            packed = encode_frames_off_gil(
                kind, [payloads[i] for i in indexes], seqs, dict_id, zdict
            )
            for i, frame in zip(indexes, packed, strict=True):
                final[i] = frame
        entries = self._store.dbs["entries"]

        def put(txn: lmdb.Transaction) -> int:
            moved = 0  # (a transaction retried after growth starts over)
            for (key, old), frame in zip(batch, final, strict=True):
                current = txn.get(key, db=staging)
                if current is None:
                    continue  # compacted away meanwhile
                if current != old:
                    break  # not what was read: leave the rest for the next round
                seq = _seq_of(key)
                head, *rest = _split(frame)
                _put_new(txn, key, head, entries)
                for index, chunk in enumerate(rest, 1):
                    _put_new(txn, _CKEY.pack(seq, index), chunk, entries)
                txn.delete(key, db=staging)
                moved += 1
            return moved

        with self._lock:
            self._staged -= self._write(put, control=False)
        return True

    def train_dictionaries(self) -> list[EntryKind]:
        """Train a zstd dictionary for each kind with enough records and none yet.

        Runs in the background thread; callable directly. Returns the kinds
        that got one. A dictionary is stored (committed) before any entry uses it.
        """
        self._check_writable()
        trained = []
        for kind in EntryKind:
            if kind in self._active_dicts or kind in self._dict_tried:
                continue
            if self._kind_counts.get(kind, 0) < dictionary.MIN_SAMPLES:
                continue
            self._dict_tried.add(kind)
            got = self.read(
                self._floor,
                kinds=[kind],
                max_entries=dictionary.MAX_SAMPLES,
                max_bytes=dictionary.MAX_SAMPLE_BYTES,
            )
            data = dictionary.train([e.payload for e in got.entries])
            if data is None:
                continue
            with self._lock:
                new_id = max([0, *self._active_dicts.values()]) + 1
                if new_id > 255:
                    break
                active = {**self._active_dicts, int(kind): new_id}

                def put(
                    txn: lmdb.Transaction,
                    data: bytes = data,
                    active: Any = active,
                    new_id: int = new_id,
                ) -> None:
                    txn.put(
                        f"{K_DICT_PREFIX}{new_id}".encode(),
                        encode_frame(_META_KIND, data),
                        db=self._store.dbs["meta"],
                    )
                    self._put_meta(txn, K_DICTS, {str(k): v for k, v in active.items()})

                self._write(put)
                self._zdicts[new_id] = zstandard.ZstdCompressionDict(data)
                self._active_dicts = active
            trained.append(kind)
        return trained

    def _dict(self, dict_id: int) -> zstandard.ZstdCompressionDict | None:
        """A stored dictionary by id (loaded once; None if absent or damaged)."""
        found = self._zdicts.get(dict_id)
        if found is None:
            try:
                with self._read_txn() as txn:
                    raw = txn.get(f"{K_DICT_PREFIX}{dict_id}".encode(), db=self._store.dbs["meta"])
                if raw is None:
                    return None
                found = zstandard.ZstdCompressionDict(decode_frame(raw)[1])
            except (FrameError, lmdb.Error, JournalError):
                return None
            self._zdicts[dict_id] = found
        return found

    def close(self) -> None:
        """Sync, close and release the owner lock; idempotent.

        In a forked child it only marks the inherited journal closed.
        """
        if self._closed:
            return
        forked = os.getpid() != self._pid or self._store.forked
        with self._appended:
            self._closed = True
            self._appended.notify_all()
        if forked:
            return
        self._stop_sync.set()
        self._bg_wake.set()
        self._move_wake.set()
        for thread in (self._move_thread, self._sync_thread):
            if thread is not None:
                thread.join()
        if self._appender or self._moves_here:
            # What the background did not get to moves now (bounded): a journal
            # at rest is compressed and has nothing staged.
            deadline = time.monotonic() + 30.0
            with contextlib.suppress(JournalError, lmdb.Error, FrameError, ValueError):
                while time.monotonic() < deadline and self._move_some():
                    pass
        with self._lock:
            if self._owner_lock is not None:
                with contextlib.suppress(lmdb.Error):
                    self._store.sync()
            release_store(self._store)
        if self._owner_lock is not None:
            self._owner_lock.release()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r}, last_seq={self._last_seq})"


def _check_durability(durability: str) -> None:
    if durability not in ("process", "fsync"):
        raise ValueError(f"durability must be 'process' or 'fsync', not {durability!r}")


def _missing(first: int, last: int) -> Damage:
    what = f"entry {first} missing" if first == last else f"entries {first}..{last} missing"
    return Damage(first, what)


def _decode_entry(
    seq: int,
    value: bytes | memoryview,
    dicts: Callable[[int], zstandard.ZstdCompressionDict | None],
) -> tuple[Entry | None, Damage | None]:
    try:
        kind, payload = decode_frame(value, dicts, seq)
    except FrameError as exc:
        return None, Damage(seq, f"entry {seq}: {exc}")
    try:
        return Entry(seq, EntryKind(kind), payload), None
    except ValueError:
        return None, Damage(seq, f"entry {seq}: unknown kind {kind}")
