"""The Journal: a run's write-ahead log of records, its cursors and its meta.

Concepts:

- **Entries** have dense sequence numbers from 1 (big-endian u64 keys) and are
  framed (``frames``): a returned ``append`` is in the spool, written, so the
  death of the process right after it loses nothing, and every reader sees it
  (``appending``, ``spool``); the mover absorbs the spool into LMDB,
  compressed, in batches (``mover``, ``layout``).
- **Cursors**, one per sink: ``acked`` (every entry up to it is acknowledged)
  and at most one **in-flight** batch, stored before the first attempt with its
  exact body, so a resend after a restart is byte-identical (``cursors``).
- **Meta**: JSON values by key (format version, local id, owner, platform
  binding, lifecycle, loss counters), each updated in one transaction with what
  it describes (``meta``).
- **Durability.** ``"process"`` (default): writes are not fsynced but are in
  the OS page cache once ``append`` returns (SIGKILL-safe); a background
  thread syncs within a second of a write (``maintenance``). ``"fsync"``: every
  append is synced (power-loss safe).
- **Capacity.** At the byte budget or on a full disk, ``append`` returns
  ``dropped`` and counts the loss under sink ``"journal"``; it never raises
  (``capacity``).

This class opens a journal and composes those parts over one transaction
helper (``txn``), choosing them by the process's role: the producer holds
the appender and its own view of the log's end, and runs the mover (which
trains the dictionaries too) until its uplink takes that over; the uplink,
which shares the producer's lock (``open(lock_fd=...)``), holds the reader,
the cursors and then the mover, never an appender, and reads the log's end
again on each look; a read-only open takes no lock and holds no writer part
at all.

Thread-safety: every method may be called from any thread. One process owns a
journal for writing (``owner=True``, an flock); read-only opens take no lock
and work while the owner writes. A forked child cannot use an inherited
Journal: every call raises JournalError (``store`` explains why).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import lmdb

from primeruns.exceptions import JournalCorruptError, JournalError
from primeruns.journal.appending import Appender
from primeruns.journal.capacity import K_COMPACTED_KINDS, Capacity, compacted_kinds
from primeruns.journal.cursors import Cursors, inflight_frame
from primeruns.journal.dicts import Dictionaries
from primeruns.journal.frames import HEADER_SIZE, EntryKind
from primeruns.journal.fsinfo import warn_if_network_fs
from primeruns.journal.fullness import full_cause
from primeruns.journal.lock import LOCK_NAME, OwnerLock
from primeruns.journal.maintenance import Background, Scan, scan, scan_damage
from primeruns.journal.meta import (
    K_BUDGET,
    K_CREATED,
    K_FORMAT,
    K_LOCAL_ID,
    K_OWNER,
    Meta,
)
from primeruns.journal.mover import Mover
from primeruns.journal.newest import Found, newest
from primeruns.journal.origin import K_ORIGIN, Origin
from primeruns.journal.overflow import HELD_MAX_BYTES, Watch
from primeruns.journal.reading import Reader
from primeruns.journal.spool import SpoolView, SpoolWriter, spool_bytes
from primeruns.journal.stamps import STAMP_LEN, STAMPED, no_earlier_than_made
from primeruns.journal.store import (
    DATA_NAME,
    AlreadyOpenError,
    Store,
    acquire_store,
    detach_store,
    release_store,
)
from primeruns.journal.tail import OwnTail, SharedTail, read_end
from primeruns.journal.torn import record_writer
from primeruns.journal.trust import check_dir, check_file, make_private_dirs, warn_if_swappable
from primeruns.journal.txn import Transactions
from primeruns.journal.types import (
    K_SKIPPED,
    AppendResult,
    CursorState,
    Damage,
    Entry,
    InFlight,
    ReadResult,
    skipped_ranges,
)
from primeruns.logs import get_logger

__all__ = ["DEFAULT_MAX_JOURNAL_BYTES", "FORMAT_VERSION", "Durability", "Journal"]

log = get_logger("primeruns.journal")

Durability = Literal["process", "fsync"]
DEFAULT_MAX_JOURNAL_BYTES = 64 << 30
# 4: entries sit in LMDB's "entries" table, those between LMDB's in-page
# limit and layout.CHUNK_UPTO in chunks (see layout), and the newest may sit
# in spool files beside the data file (see spool).
FORMAT_VERSION = 4
# Formats 1-3 were development formats, never released: no user has a journal
# in one, so nothing reads them and ``open`` refuses them.
_OLDEST_FORMAT = 4
_CLOSE_MOVE_S = 30.0  # at close, what is still spooled moves within this


def default_local_id(runs_dir: Path | None = None) -> str:
    """``<UTC yyyymmdd-HHMMSS>-<8 hex>``: unique and sortable by creation time.
    In ``runs_dir``, never stamped earlier than a journal made there before
    (``stamps``)."""
    new = f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"
    if runs_dir is None:
        return new
    return no_earlier_than_made(runs_dir, new[:STAMP_LEN]) + new[STAMP_LEN:]


def _named_in(runs_dir: Path, local_id: str | None) -> str:
    """``local_id`` (its stamp now the newest given in ``runs_dir``, if it is
    later), else a new one (``default_local_id``)."""
    if not local_id:
        return default_local_id(runs_dir)
    if STAMPED.match(local_id):
        no_earlier_than_made(runs_dir, local_id[:STAMP_LEN])
    return local_id


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
        self.durability = durability
        self._store = store
        self._owner_lock = lock
        self._pid = os.getpid()
        self._closed = False
        tx = self._tx = Transactions(path, store)
        appends = lock is not None and appender
        self._spool = SpoolView(path)
        last, floor = read_end(tx, self._spool)
        self._tail = (OwnTail if appends else SharedTail)(tx, last, self._spool)
        self._dicts = Dictionaries(tx)
        # A live run's uplink is the only process that compacts its journal.
        shares = lock is not None and not appends
        self._reader = Reader(tx, self._dicts, floor, self._spool, sole_compactor=shares)
        self._mover = Mover(tx, self._dicts, path, self._spool, self._reader)
        # While set, the background's tick leaves the mover be (``defer_moving``).
        self._moving_deferred = False
        self._capacity = Capacity(tx, self._reader, self._mover)
        self._cursors = Cursors(tx, self._tail, self._capacity)
        # Entries a sink acknowledged while they were still spooled could not
        # be compacted then (compaction stops at LMDB's end); once moved they
        # are, here, not at the next acknowledgement: at the budget none may
        # come (every append refused), and the run would drop for good.
        # Nudges wait only while the room is ample (``Capacity.ample``).
        self._mover.holds_nudges = lambda: self._capacity.ample
        self._mover.after_moving = lambda: self._capacity.acknowledged(
            self._cursors.offsets, self._tail.last
        )
        self._meta = Meta(tx)
        self._appender: Appender | None = None
        start_syncing: Callable[[], None] | None = None
        if appends:
            record_writer(self._meta, path, durability)
            writer = SpoolWriter(path, self._spool, fsync=durability == "fsync", written=tx.written)
            start_syncing = writer.start_syncing
            self._capacity.spooled = writer.pending_bytes
            self._appender = Appender(tx, self._tail, self._capacity, writer)
            self._appender.after = self._appends_after(last)
        local_id = tx.safe_meta(K_LOCAL_ID)
        self.local_id = local_id if isinstance(local_id, str) else path.name
        self._background: Background | None = None
        self._start_syncing = start_syncing
        self._quiesced: bool | None = None  # (``quiesce``) whether it moved when quiesced
        if lock is not None:
            self._start_background()
            if appends:
                self._mover.start()

    def _start_background(self) -> None:
        self._background = Background(
            self._tx,
            self._reader,
            durability=self.durability,
            sync_spool=None if self._appender is None else self._appender.sync,
            tick=self._tick_mover,
            first_written=self._start_syncing,
            keep_lock=None if self._owner_lock is None else self._owner_lock.restore,
        )

    def _appends_after(self, last: int) -> int:
        """The seq this owner's appends follow: the log's end ``last``, or
        the furthest seq past it that stored state names. A power cut can
        leave zeros where the spool's last appends were, while LMDB keeps a
        sink's offset or batch in flight past them, or the damage proves
        they were written: appended again under those seqs, new entries
        were never shipped by that sink, or taken for the lost ones. The
        seqs between are never written: every reader reports them missing,
        and a sink that had not shipped them counts them lost."""
        lost = self._spool.lost_after(last)
        try:
            named = self._cursors.furthest()
        except (lmdb.Error, JournalError):
            named = 0  # unreadable cursors name nothing (reported as damage)
        proofs = [
            (last if lost is None else last + lost.entries, "damage at the spool's end cost them"),
            (self._spool.named_after(last), "a later spool segment's name says they were written"),
            (named, "a sink's cursor names them"),
        ]
        plausible = [proof for proof in proofs if proof[0] <= self._could_be_spooled(last)]
        end, why = max(plausible, default=(last, ""))
        if end > last and self._note_skipped(last + 1, end):
            # Once: every owner until an append lands works it out again
            # (each replay of a run whose platform is down).
            log.warning(
                "journal %s: entries %d to %d are lost (%s); new entries start at %d, so that "
                "none is taken for one of them",
                self.path,
                last + 1,
                end,
                why,
                end + 1,
            )
        return max(end, last)

    def _could_be_spooled(self, last: int) -> int:
        """The furthest seq past ``last`` (the log's end) a new owner takes
        for lost: entries past the log's end were spooled, a spool never
        held more than the byte budget, and each entry takes a frame header
        there at least. A seq further on is no proof but damage (a bit flip,
        a hostile copy): taken for one, every other sink counted that many
        entries lost (2**62), and past the last seq a key holds, appends
        went where no reader sees them."""
        return last + max(self._store.max_bytes, DEFAULT_MAX_JOURNAL_BYTES) // HEADER_SIZE

    def _note_skipped(self, first: int, last: int) -> bool:
        """Record that appends start past ``first``..``last`` (``K_SKIPPED``);
        not written, the next owner works it out again. Whether it was not
        recorded yet."""
        skipped = self._tx.safe_meta(K_SKIPPED)
        skipped = dict(skipped) if isinstance(skipped, dict) else {}
        if skipped.get(str(first)) == last:
            return False
        skipped[str(first)] = last
        with contextlib.suppress(JournalError, lmdb.Error):
            self._meta.update({K_SKIPPED: skipped})
        return True

    def skipped_after(self, seq: int) -> int:
        """The last seq of a range an owner's appends started after, that
        holds ``seq + 1`` (lost past the log's end then, never written:
        ``_appends_after``); ``seq`` where none does. An import may stand
        inside one, not only before it: an earlier copy brought its first
        entries, taken before the power cut that lost them."""
        self._check()
        holding = [
            last
            for first, last in skipped_ranges(self._tx.safe_meta(K_SKIPPED))
            if first <= seq + 1 <= last <= self._could_be_spooled(first - 1)
        ]
        return max(holding, default=seq)

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
        origin: Origin | None = None,
    ) -> Journal:
        """Create ``runs_dir/<local_id>`` (0700, files 0600) and own it.
        ``origin``: the origin of the journal this one re-creates at its
        path (``journal.rehome``), which it keeps; else this process's.

        Raises JournalError if it exists or cannot be created.
        """
        _check_durability(durability)
        runs_dir = Path(runs_dir)
        if local_id and ("/" in local_id or local_id in (".", "..")):
            raise JournalError(f"invalid local run id {local_id!r}")
        if runs_dir.exists() and not runs_dir.is_dir():
            # mkdir(exist_ok=True) raises FileExistsError for a file, which
            # would read as "the run directory exists": name the real problem.
            raise JournalError(f"cannot create a journal under {runs_dir}: it is not a directory")
        check_dir(runs_dir, "runs directory")
        try:
            make_private_dirs(runs_dir)
            check_dir(runs_dir, "runs directory")  # made meanwhile by someone else?
            # Named once the directory is there: its mark of the newest stamp too.
            path = runs_dir / _named_in(runs_dir, local_id)
            path.mkdir(mode=0o700)
            os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
        except FileExistsError as exc:
            raise JournalError(f"a run directory {exc.filename} already exists") from None
        except OSError as exc:
            cause = ""
            if exc.errno == errno.ENOSPC and "inodes" in (why := full_cause(runs_dir)):
                cause = f" ({why})"
            raise JournalError(f"cannot create a journal under {runs_dir}: {exc}{cause}") from exc
        warn_if_network_fs(path)
        warn_if_swappable(runs_dir)
        try:
            journal = cls._made_in(path, durability, max_bytes, meta, origin)
        except JournalError:
            # Refused (a full disk, most often) after its folder was made: the
            # run goes elsewhere, and the folder, which no listing shows and
            # no gc takes, would stay in the runs directory for good. It was
            # made by this call under a name no one else takes, and holds no
            # record yet.
            shutil.rmtree(path, ignore_errors=True)
            raise
        journal.local_id = path.name
        return journal

    @classmethod
    def _made_in(
        cls,
        path: Path,
        durability: Durability,
        max_bytes: int,
        meta: Mapping[str, Any] | None,
        origin: Origin | None,
    ) -> Journal:
        """The new journal in ``path``, a folder just made for it, owned by
        this process; a JournalError if it cannot be made there."""
        try:
            lock = OwnerLock(path)
        except OSError as exc:
            # A full disk refuses the owner's record in the lock file: a
            # JournalError, so that an online run's journal goes elsewhere
            # (refuge.py) rather than init() raising ENOSPC at its caller.
            raise JournalError(f"cannot create the journal at {path}: {exc}") from exc
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
        try:
            # Its place is this folder, also for a journal re-made with the
            # origin it had (``rehome``): that one's folder is gone.
            origin = (origin or Origin.here(path)).placed_at(path)
            origin.write_beside(path)
            values: dict[str, Any] = dict(meta or {})
            values.update(
                {
                    K_FORMAT: FORMAT_VERSION,
                    K_LOCAL_ID: path.name,
                    K_OWNER: lock.owner.to_json(),
                    K_ORIGIN: origin.to_json(),
                    K_CREATED: time.time(),
                    K_BUDGET: max_bytes,
                }
            )
            journal.update_meta(values)
            if durability == "process":
                # Once, whatever the durability: LMDB's file is not a journal until
                # its first commit is on disk, and a power cut in a run's first
                # second would otherwise leave one nothing can open.
                journal.sync()
        except (OSError, lmdb.Error, JournalError) as exc:
            # A disk that filled meanwhile: the journal is given up, so its
            # lock and environment are let go (held, the directory read as a
            # live run's for as long as this process lived), and an OSError is
            # a JournalError, so an online run's journal goes elsewhere.
            with contextlib.suppress(Exception):
                journal.close()
            if isinstance(exc, JournalError):
                raise
            raise JournalError(f"cannot create the journal at {path}: {exc}") from exc
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
        written_here: bool = False,
    ) -> Journal:
        """Open an existing journal.

        ``lock_fd``: the owner lock a live producer shared with this process
        (its uplink; see ``lock``): opened for writing without taking the lock,
        trusted (the producer made it) and never appended to.

        ``written_here``: this process wrote the journal and closed it just
        now (``listing.keep_summary``), so its tree is not probed in a child.

        ``repair=True`` (with ``owner``) rebuilds the file from a page scan
        before anything writes to it, keeping the damaged file beside it: for a
        journal whose verification found damage, since LMDB must never write
        into a damaged tree.

        ``owner=True`` takes the owner lock (JournalLockedError naming the owner
        while it lives); ``owner=False`` opens read-only, without a lock.
        Raises JournalError if ``path`` is not a journal or has a format this
        prime-runs does not read (a newer one, or a development format 1-3),
        JournalCorruptError if its structure cannot be read at all; lesser
        damage is in ``damage()``.
        """
        _check_durability(durability)
        path = Path(path)
        # LMDB opens its files by name, following links, and writes its lock
        # file even to read: nothing is opened in a folder another user could
        # write into, or through a link (trust). Checked first: another
        # user's private folder cannot even be looked into.
        check_dir(path, "journal directory")
        if not (path / DATA_NAME).is_file():
            raise JournalError(f"{path} is not a prime-runs journal (no {DATA_NAME})")
        for name in (DATA_NAME, "lock.mdb", LOCK_NAME):
            check_file(path / name)
        shared = lock_fd is not None
        if not shared:
            warn_if_network_fs(path)  # the producer warned already
        if lock_fd is not None:
            lock: OwnerLock | None = OwnerLock.inherit(path, lock_fd)
        else:
            try:
                lock = OwnerLock(path) if owner else None
            except OSError as exc:
                # A full disk refuses the owner's record (as at create): the
                # callers (sync, replay, the mirror) handle a JournalError.
                raise JournalError(f"cannot take the journal at {path}: {exc}") from exc
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
                    trusted=shared or written_here,
                )
            except AlreadyOpenError:
                raise JournalError(
                    f"{path} is already open in this process (a forked child cannot "
                    "reopen its parent's journal)"
                ) from None
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
        version = journal._tx.safe_meta(K_FORMAT)
        if isinstance(version, int) and version > FORMAT_VERSION:
            journal.close()
            raise JournalError(
                f"journal {path} has format {version}; this prime-runs reads up to "
                f"{FORMAT_VERSION}: upgrade prime-runs to ship it"
            )
        if isinstance(version, int) and version < _OLDEST_FORMAT:
            journal.close()
            raise JournalError(
                f"journal {path} has format {version}, a development format no release of "
                f"prime-runs wrote; this prime-runs reads formats {_OLDEST_FORMAT} to "
                f"{FORMAT_VERSION}"
            )
        budget = journal._tx.safe_meta(K_BUDGET)
        if shared and isinstance(budget, int) and budget > 0:
            journal._store.max_bytes = budget  # compaction here keeps the producer's budget
        if lock is not None and not shared:
            try:
                journal.set_meta(K_OWNER, lock.owner.to_json())
            except (lmdb.Error, JournalError) as exc:
                journal._tx.problems.append(Damage(None, f"journal cannot be written: {exc}"))
        return journal

    # -- sharing with the uplink ---------------------------------------------------------

    def hand_over_moving(self) -> None:
        """The uplink (which shares the lock) moves spooled entries into LMDB
        from now on: the producer only appends."""
        self._mover.stop()

    def take_back_moving(self) -> None:
        """The uplink is gone: this process moves spooled entries into LMDB again."""
        if not self._mover.here and self._appender is not None and not self._closed:
            self._mover.start()

    def take_over_moving(self) -> None:
        """In the uplink's view: move the producer's spooled entries into LMDB."""
        self._check_writable()
        if not self._mover.here:
            self._mover.start()

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

    # -- guards ---------------------------------------------------------------------------

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

    # -- meta -----------------------------------------------------------------------------

    def get_meta(self, key: str, default: Any = None) -> Any:
        """The JSON value stored under ``key``, or ``default``.

        Raises JournalCorruptError if the stored value is damaged.
        """
        self._check()
        return self._meta.get(key, default)

    def get_metas(self, keys: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
        """The JSON values stored under ``keys``, read in one transaction
        (absent keys left out), and the keys whose stored values are damaged
        (left out too): a caller reading many small values pays one read."""
        self._check()
        return self._meta.get_many(keys)

    def all_meta(
        self, max_value_bytes: int | None = None, shape: Callable[[Any], Any] | None = None
    ) -> dict[str, Any]:
        """Every readable meta value by key (damaged ones are left out; see damage()).

        ``max_value_bytes``: values declaring more are left out undecoded
        (listed under ``journal.oversized``); ``shape`` is applied to each
        decoded value before the next is read (the dashboard clips them)."""
        self._check()
        return self._meta.all(max_value_bytes, shape)

    def set_meta(self, key: str, value: Any) -> None:
        """Store one JSON value; committed when it returns."""
        self.update_meta({key: value})

    def update_meta(self, values: Mapping[str, Any], drop: Iterable[str] = ()) -> None:
        """Store several JSON values in one transaction, and remove the keys
        ``drop`` names (absent ones are no error)."""
        self._check_writable()
        self._meta.update(values, drop)

    def push_meta(self, key: str, item: Any, *, cap: int) -> None:
        """Append ``item`` to the JSON list under ``key`` in one transaction,
        keeping the first ``cap`` items (the count of the rest under ``key#more``)."""
        self._check_writable()
        self._meta.push(key, item, cap=cap)

    # -- appending --------------------------------------------------------------------------

    def append(
        self,
        kind: EntryKind,
        payloads: Sequence[bytes],
        *,
        essential: bool = False,
        final: bool = False,
    ) -> AppendResult:
        """Append entries of one kind in one spool ``write()`` (``appending``);
        returns once written: every reader sees them, and the process's death
        right after loses none (with durability ``"fsync"``: synced too).

        At the byte budget or on a full disk nothing is written and
        ``dropped=len(payloads)`` is returned (counted under sink ``"journal"``);
        that never raises. After ``hold_when_full``, what the disk refuses is
        held in memory instead (``held=len(payloads)``, no seq yet), and so
        is every append after it, until they are stored in order.
        ``essential`` entries (a run's spec, its finish: a
        few hundred bytes that decide how the run is closed) may use the room
        kept for bookkeeping, the reserve file included. Raises JournalError on
        a read-only, shared (the uplink's) or forked journal and ValueError for
        a payload over the per-entry limit. ``final`` (a run's finish): this
        handle refuses every later append with RunFinishedError.
        """
        appender = self._appender
        # ``_check_writable``'s conditions inline (on every log call); it says which.
        if self._pid != os.getpid() or self._closed or self._store.forked or appender is None:
            self._check_writable()
            raise JournalError(f"journal {self.path} is shared with the process that appends to it")
        return appender.append(kind, payloads, essential=essential, final=final)

    def hold_when_full(self, limit: int = HELD_MAX_BYTES) -> None:
        """From now on, hold what a full disk refuses in memory, in order, up
        to ``limit`` payload bytes, and store it as room comes back
        (``overflow``): for a run whose uplink ships and compacts the journal,
        which frees that room. Past the bound, and at the byte budget, records
        are dropped and counted as before."""
        self._check_writable()
        if self._appender is not None:
            self._appender.hold_when_full(limit)

    def when_held_stored(self, tell: Callable[[int, int], None] | None) -> None:
        """Call ``tell(kind, last seq)`` (from the overflow's thread) for each
        held append once it is stored: the run's flush targets, its uplink's wake-up."""
        if self._appender is not None:
            self._appender.on_stored = tell

    def watch_held(self) -> Watch | None:
        """What is held for a full disk now, for a ``flush()`` to wait for
        (``wait_watched``); None where nothing is."""
        self._check()
        return None if self._appender is None else self._appender.watch_held()

    def wait_watched(self, watch: Watch, within: float) -> bool:
        """Wait up to ``within`` seconds for the held appends ``watch`` names
        to be stored, letting none go, not for those held since; whether
        they are (``watch.lasts``: the last seq of each kind they took)."""
        assert self._appender is not None  # (a watch comes from it)
        return self._appender.wait_watched(watch, within)

    def settle_held(self, within: float, room_may_come: Callable[[], bool] | None = None) -> int:
        """Wait up to ``within`` seconds for what is held for a full disk to
        be stored, then let the rest go, counted lost (``"disk full"``); how
        many records were let go (0 at once when nothing is held). Not past
        a ``room_may_come`` that says nothing may free room any more."""
        self._check()
        if self._appender is None:
            return 0
        return self._appender.settle_held(within, room_may_come)

    def held_lost(self) -> int:
        """Records held for a full disk and let go in all (``settle_held``,
        a finish appended while some were held, ``close``)."""
        return 0 if self._appender is None else self._appender.held_lost

    def appends_follow(self, seq: int) -> None:
        """The next append takes ``seq + 1``, or the seq after the log's end
        where that is further: for a sync journal's import, whose entries
        take the copy's own seqs (checked there). Those that stored state
        names past its end, lost to damage here, come back as they were
        (``seq``: its end); past seqs the copy's owner skipped, it skips
        them too (``skipped_after``)."""
        self._check_writable()
        if self._appender is not None:
            self._appender.after = seq

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called: every use of it raises ``JournalError``
        from then on (threads still at work then end on it, quietly)."""
        return self._closed

    def last_seq(self) -> int:
        """The highest sequence number written (compaction does not lower it)."""
        self._check()
        return self._tail.current()

    def wait_for_append(
        self,
        after_seq: int,
        timeout: float | None,
        until: Callable[[], bool] | None = None,
    ) -> bool:
        """Block until ``last_seq() > after_seq``: True then; False on timeout
        (None: none), ``wake_all()``, close, or once ``until()`` holds (looked
        at under the condition ``wake_all`` notifies: set what it reads, then
        call ``wake_all``, and no wait misses it).

        Woken by appends in this process (no polling). Where another process
        appends (the uplink's view), ``wake_all`` is called on its wake-ups
        and the log is read again under the condition, so a wake-up that
        arrives before the wait still counts.
        """
        self._check()
        return self._tail.wait(after_seq, timeout, until)

    def defer_moving(self, deferred: bool) -> None:
        """While ``deferred``, neither the background sync's tick nor
        ``wake_all`` (a shipper's poke, as its threads stand down) wakes this
        process's mover: an evaluation whose uplink's threads ship beside its
        loop for its first seconds, until its uplink process takes the moving
        over (``ship.startup``), has spooled entries moved by that process,
        not by a third thread holding the GIL beside the loop (woken by the
        standing down, it moved the whole first second's spool while the
        handover waited for it). Near the byte budget the room count still
        wakes it (``capacity``); the journal's close moves what is left
        either way."""
        self._moving_deferred = deferred

    def _tick_mover(self) -> None:
        if self._mover.here and not self._moving_deferred:
            self._mover.wake()

    def wake_all(self, *, hurry: bool = False) -> None:
        """Wake every thread in wait_for_append (they return False unless
        data arrived), and nudge the mover, or wake it at once for a
        ``hurry`` (a flush or finish waits: what it ships is compacted
        away only once LMDB holds it, and under a small budget the
        producer counts what stays spooled)."""
        self._tail.wake_all()
        if self._mover.here and not self._moving_deferred:
            # The producer appended: there may be spooled entries.
            if hurry:
                self._mover.wake()
            else:
                self._mover.nudge()

    # -- reading ----------------------------------------------------------------------------

    def read(
        self,
        after_seq: int,
        *,
        kinds: Collection[EntryKind] | None = None,
        max_entries: int = 1000,
        max_bytes: int = 8 << 20,
        max_entry_bytes: int | None = None,
        frames: bool = False,
    ) -> ReadResult:
        """Entries after ``after_seq`` of the given kinds, copied out, ascending.

        Stops at ``max_entries`` or ``max_bytes`` of payload (at least one
        matching entry is returned if any exists, unless a scan's limit
        comes first: 50,000 entries looked at, or ``REMAP_AFTER_BYTES`` of
        others passed over; ``next_after`` then says where it stopped).
        Entries of other kinds are skipped by their header, never
        decompressed. Damaged entries are reported in ``damaged`` and passed
        over; nothing raises for damage. An entry declaring more than
        ``max_entry_bytes`` is not decompressed either: it is listed in
        ``oversized`` (a reader that shows records bounds what one record
        may cost it; ``0`` reads headers only: every entry is listed there,
        one of no bytes too). ``frames``: each entry's
        stored frame too, in ``ReadResult.frames`` (for ``put_frames``).
        """
        self._check()
        return self._reader.read(
            after_seq,
            kinds=kinds,
            max_entries=max_entries,
            max_bytes=max_bytes,
            max_entry_bytes=max_entry_bytes,
            frames=frames,
        )

    def dictionary(self, dict_id: int) -> bytes | None:
        """The zstd dictionary stored under ``dict_id`` (None: absent or damaged)."""
        self._check()
        found = self._dicts.get(dict_id)
        return None if found is None else bytes(found.as_bytes())

    def adopt_dictionary(self, dict_id: int, data: bytes) -> bool:
        """Hold another journal's dictionary under its id, for its frames
        (``Dictionaries.adopt``); False when another is stored under it, or
        it does not fit (its frames are appended then)."""
        self._check_writable()
        return self._dicts.adopt(dict_id, data)

    def put_frames(self, frames: Sequence[tuple[int, bytes]]) -> bool:
        """Store another copy of this log's entries as their frames are, each
        under its own seq (a sync journal's import: ``Appender.put_frames``):
        each frame read from a copy with ``read(frames=True)``, and the
        dictionary it names adopted (``adopt_dictionary``). False where they
        were not stored (append their payloads then)."""
        self._check_writable()
        if self._appender is None:
            return False
        return self._appender.put_frames(frames, self._absorb)

    def get(self, seq: int) -> Entry | None:
        """The entry ``seq``, or None if absent (never written or compacted).

        Raises JournalCorruptError if it is damaged.
        """
        self._check()
        return self._reader.get(seq)

    def newest(self, kinds: Collection[EntryKind], *, after: int = 0) -> Iterator[Found]:
        """``(seq, kind, declared bytes)`` of each entry of ``kinds`` after
        ``after`` whose header reads, newest first (``journal.newest``): the
        entries ``read`` finds by their headers, in reverse, each read as it
        is asked for, so a reader of the last one costs the entries past it,
        not the log. Nothing is decompressed or checked: ``get`` or ``read``
        an entry to learn whether its body reads."""
        self._check()
        return newest(self._tx, self._spool, kinds, after)

    def tally(self, cuts: Sequence[int] = ()) -> list[Counter[int]]:
        """Entries per kind in each interval the ascending offsets ``cuts`` make:
        ``(0, c1], ..., (cn, end]``, read from headers alone. The first also
        counts what compaction removed, so summed they are what the run logged
        (less damaged entries); an interval after a sink's offset is what that
        sink still has to ship (compaction never removes unshipped entries)."""
        self._check()
        counts = self._reader.tally(cuts)
        counts[0].update(self.compacted())
        return counts

    def tally_past(self, after: int) -> Counter[int]:
        """Entries per kind past offset ``after``, read from headers alone:
        ``tally([after])[-1]`` at the cost of the entries past it (what a
        sink has left to ship, at every close-out, where nearly all of a
        long run's log is behind its offset)."""
        return self.tallies_past([after])[0]

    def tallies_past(self, afters: Sequence[int]) -> list[Counter[int]]:
        """``tally_past`` of each offset of ``afters``, in one scan of the
        entries past the lowest: a finish asks it of every sink, and counting
        each sink's rest anew read the log's tail once per sink."""
        self._check()
        if not afters:
            return []
        cuts = sorted(set(afters))
        intervals = self._reader.tally(cuts, past=cuts[0])
        past: dict[int, Counter[int]] = {}
        running: Counter[int] = Counter()
        # ``intervals[i + 1]`` is ``(cuts[i], cuts[i + 1]]``: what is past a
        # cut is its interval and every one after it.
        for cut, counts in zip(reversed(cuts), reversed(intervals[1:]), strict=True):
            running = running + counts
            past[cut] = running
        return [Counter(past[after]) for after in afters]

    def tally_range(self, after: int, upto: int) -> Counter[int]:
        """Entries per kind in ``(after, upto]``, read from headers alone:
        ``tally([after, upto])[1]`` at the cost of the entries in the range
        (a batch's, counted each time one is lost; a forked child's left up
        to its target, counted at each look while its parent finishes),
        however long the log is. What compaction removed is not in it
        (``compacted``)."""
        self._check()
        if upto <= after:
            return Counter()
        return self._reader.tally([after, upto], past=after, upto=upto)[1]

    def compacted(self) -> Counter[int]:
        """Entries per kind compaction removed (what ``tally``'s first
        interval adds to those present): one read of the journal's meta."""
        self._check()
        return compacted_kinds(self._tx.safe_meta(K_COMPACTED_KINDS))

    # -- cursors and losses -----------------------------------------------------------------

    def cursor(self, sink: str) -> CursorState:
        """The sink's acknowledged offset and in-flight batch (acked=0 if never set).

        Raises JournalCorruptError if the cursor or its in-flight body is damaged.
        """
        self._check()
        return self._cursors.cursor(sink)

    def acked(self, sink: str) -> int:
        """The sink's acknowledged offset (0 if never set), without reading
        its in-flight batch."""
        self._check()
        return self._cursors.acked(sink)

    def cursors(self) -> dict[str, int]:
        """Every sink's acknowledged offset."""
        self._check()
        return self._cursors.offsets()

    def set_inflight(self, sink: str, inflight: InFlight, *, frame: bytes | None = None) -> None:
        """Record the sink's in-flight batch; committed (durable) when it returns.
        ``frame``: ``inflight_frame(inflight.body)``, made beforehand."""
        self._check_writable()
        self._cursors.set_inflight(sink, inflight, frame)

    def inflight_frame(self, body: bytes) -> bytes:
        """How ``set_inflight`` stores a batch's body, for a caller that makes
        it beforehand (``ship.early``); any thread, no transaction."""
        return inflight_frame(body)

    def update_inflight_state(self, sink: str, state: Mapping[str, Any]) -> None:
        """Merge ``state`` into the in-flight batch's state; JournalError if none."""
        self._check_writable()
        self._cursors.update_inflight_state(sink, state)

    def ack(self, sink: str, upto_seq: int, *, failed: int = 0, reason: str | None = None) -> None:
        """Atomically: acked=upto_seq, in-flight cleared, ``failed`` counted as lost.

        Raises ValueError if ``upto_seq`` goes backwards or past ``last_seq()``.
        """
        self._check_writable()
        self._cursors.ack(sink, upto_seq, failed=failed, reason=reason)

    def record_loss(
        self, sink: str, count: int, reason: str, *, damaged_through: int | None = None
    ) -> None:
        """Count ``count`` records lost for ``sink`` (the last few reasons are kept).

        ``damaged_through``: they are entries found damaged, every one up to
        that seq counted now; kept with the count (``damage_counted``)."""
        self._check_writable()
        self._cursors.record_loss(sink, count, reason, damaged_through=damaged_through)

    def damage_counted(self, sink: str) -> int:
        """The last entry whose damage ``sink``'s shipper counted as lost (-1:
        none): a shipper starting after a process that stopped before it
        acknowledged them does not count them again."""
        self._check()
        return self._cursors.damage_counted(sink)

    def damaged_end(self) -> int:
        """``last_seq()``, or past it the last entry that damage at the log's
        end cost (``SpoolView.lost_at_end``): as far as counted damage reaches."""
        last = self.last_seq()
        self._spool.refresh()
        lost = self._spool.lost_after(last)
        return last if lost is None else last + lost.entries

    def losses(self) -> dict[str, dict[str, Any]]:
        """``{sink: {"count": n, "reasons": [...]}}``; budget drops are under ``"journal"``."""
        self._check()
        return self._cursors.losses()

    # -- capacity ---------------------------------------------------------------------------

    def set_sinks(self, names: Collection[str]) -> None:
        """Name the sinks that ship this journal: while space is short, entries
        every one of them acknowledged are compacted away (oldest first), so
        the byte budget bounds the backlog, not the run's whole history. With
        no sinks named (an offline run, a reader) nothing is ever compacted."""
        self._capacity.name_sinks(names)

    def drop_sink(self, name: str) -> None:
        """``name`` is off for good (not enabled for the account, opted out):
        nothing it would have shipped is owed, so compaction no longer waits
        for its acknowledgements."""
        self._capacity.drop_sink(name)

    def compact(self, sinks: Collection[str] | None = None) -> int:
        """Delete entries acknowledged by every sink in ``sinks`` (default:
        every sink with a cursor; a named sink without one has acknowledged
        nothing); returns how many.

        ``last_seq()`` is unchanged; a read after the removed range starts later.
        """
        self._check_writable()
        self._absorb()  # what compaction may remove must be in LMDB first
        acked = self._cursors.offsets()
        if sinks is not None:
            acked = {name: acked.get(name, 0) for name in sinks}
        return self._capacity.compact(acked, self._tail.last)

    def _absorb(self) -> None:
        """Move everything spooled into LMDB now, in this thread."""
        with contextlib.suppress(JournalError, lmdb.Error, ValueError):
            for _ in range(1_000_000):
                if not self._mover.step():
                    break

    def size_bytes(self) -> int:
        """Bytes of the journal on disk: its data file and its spool."""
        return self._store.file_size() + spool_bytes(self.path)

    # -- maintenance ------------------------------------------------------------------------

    def structural_damage(self) -> list[Damage]:
        """Damage found while opening (file, meta), without scanning entries."""
        return list(self._tx.problems)

    def damage(self, *, decode: bool = True) -> list[Damage]:
        """Structural damage plus every damaged or missing entry (a full scan).
        ``decode=False``: found from each entry's checksum, nothing
        decompressed (a frame written corrupt is not found), as ``checksums``
        finds it, without keeping the intact entries' seqs."""
        self._check()
        return scan_damage(self._tx, self._reader, decode=decode)

    def checksums(self) -> Scan:
        """``damage()`` from each entry's checksum, nothing decompressed, with
        the intact entries' seqs per kind (``maintenance.scan``)."""
        self._check()
        return scan(self._tx, self._reader, decode=False)

    def sync(self) -> None:
        """Flush the journal to disk (fsync)."""
        self._check()
        if self._owner_lock is not None:
            if self._appender is not None:
                self._appender.sync()
            self._store.sync()
            self._tx.dirty = False

    def train_dictionaries(self) -> list[EntryKind]:
        """Train a zstd dictionary for each kind with enough records and none yet;
        returns the kinds that got one.

        The mover's thread does this once a kind has enough records; here it
        is done now, in this thread (benchmarks, the sample journal's tool).
        A dictionary is stored (committed) before any entry uses it.
        """
        self._check_writable()
        before = set(self._dicts.active)
        self._absorb()  # what is spooled counts too: it is compressed (and trained on) now
        self._dicts.train(self._reader.read, self._reader.floor)
        return [kind for kind in EntryKind if kind in self._dicts.active and kind not in before]

    def close(self) -> None:
        """Sync, close and release the owner lock; idempotent.

        In a forked child it only marks the inherited journal closed.
        """
        if self._closed:
            return
        forked = os.getpid() != self._pid or self._store.forked
        self._closed = True
        self._tail.close()
        if forked:
            return
        moves_here = self._mover.here
        self._mover.stop(final=True)
        if self._background is not None:
            self._background.stop()
        if self._appender is not None:
            self._appender.stop_holding()
            self._appender.sync()
            self._appender.close()
        if self._appender is not None or moves_here:
            # What the background did not get to moves now (bounded): a journal
            # at rest is compressed and has nothing spooled. Only
            # the appender, closing, knows nothing more comes to its newest
            # spool segment.
            self._mover.drain(_CLOSE_MOVE_S, retire=self._appender is not None)
        self._spool.close()
        with self._tx.lock:
            if self._owner_lock is not None:
                with contextlib.suppress(lmdb.Error):
                    self._store.sync()
            release_store(self._store)
        if self._owner_lock is not None:
            self._owner_lock.release()

    def quiesce(self) -> None:
        """Stop this handle's mover and background sync (``journal.rehome``:
        they act on files by name, and another journal may soon live there)."""
        if self._quiesced is None:
            self._quiesced = self._mover.here
        self._mover.stop(final=True)
        if self._background is not None:
            self._background.stop()
            self._background = None

    def resume(self) -> None:
        """Undo ``quiesce``: no other journal came to live at the path (its
        re-creation failed, ``journal.rehome``) and this handle goes on, its
        spool moved into LMDB (else nothing is compacted, and the spool,
        counted against the budget, fills it) and synced as before."""
        moving, self._quiesced = self._quiesced, None
        if moving is None or self._closed:
            return
        self._mover.reopen()
        if moving:
            self._mover.start()
        if self._background is None and self._owner_lock is not None:
            self._start_background()

    def abandon(self) -> None:
        """Let go of a journal re-created elsewhere at its path (``journal.rehome``):
        its threads stop and its handles close, and nothing is done by name at
        its path, where the new journal lives now."""
        if self._closed:
            return
        self._closed = True
        self._tail.close()
        self.quiesce()
        if self._appender is not None:
            self._appender.close()
        self._spool.close()
        detach_store(self._store)  # the path's name is the new journal's now
        with self._tx.lock:
            release_store(self._store)
        if self._owner_lock is not None:
            self._owner_lock.release()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r}, last_seq={self._tail.last})"


def _check_durability(durability: str) -> None:
    if durability not in ("process", "fsync"):
        raise ValueError(f"durability must be 'process' or 'fsync', not {durability!r}")
