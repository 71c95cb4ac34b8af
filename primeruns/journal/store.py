"""The LMDB environment under a journal: opening with care, growth, fork safety.

Three things here are easy to get wrong with LMDB, and each is handled once:

- **Damaged files.** LMDB maps ``data.mdb`` and trusts it: a file truncated
  below what its newest meta page names makes LMDB touch pages past the end of
  the file, or aborts on a page of the wrong type: the process dies.
  ``inspect_file`` reads the two meta pages in Python first; a file they do
  not describe correctly is never given to LMDB: ``salvage`` rebuilds a fresh
  environment from a pure-Python page scan (a private copy for a reader, in
  place for the owner, keeping the damaged file beside it).
- **Growth.** The map starts small and doubles on MapFullError up to the
  journal's byte budget. ``set_mapsize`` needs no transaction active in this
  process; the Journal serializes every transaction under one lock for that.
  A reader process whose map is smaller than the writer's file sees
  MapResizedError and adopts the new size (``begin``).
- **Fork.** An environment must never be used across fork, and must not even
  be *closed* in the child: ``mdb_env_close`` clears the reader slots of the
  pid recorded at open, which is the parent's. A child therefore keeps every
  inherited environment referenced forever (``_ORPHANS``) so it is never
  deallocated there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from primeruns.journal.probe import probe
from primeruns.journal.salvage import scan_pages

__all__ = [
    "DATA_NAME",
    "DB_NAMES",
    "FileReport",
    "Store",
    "acquire_store",
    "inspect_file",
    "is_disk_full",
    "last_txnid",
    "release_store",
]

DATA_NAME = "data.mdb"
DB_NAMES = (b"entries", b"meta", b"cursors", b"inflight")
_INITIAL_MAP = 16 << 20
_META_MAGIC = 0xBEEFC0DE


@dataclass(frozen=True)
class FileReport:
    """What the meta pages of ``data.mdb`` say, checked against the file's size."""

    size: int
    needed: int  # bytes the newest valid meta page needs
    problems: tuple[str, ...]
    psize: int = 4096

    @property
    def truncated(self) -> bool:
        return self.needed > self.size


def inspect_file(path: Path) -> FileReport:
    """Read ``data.mdb``'s two meta pages without LMDB; never raises on bad bytes."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(2 * 65536)
    except OSError as exc:
        return FileReport(0, 0, (f"{path.name} unreadable: {exc.strerror}",))
    metas, problems, psize = _meta_pages(head, path.name, size)
    if not metas:
        return FileReport(size, 0, (*problems, f"{path.name} has no valid meta page"), psize)
    _txnid, last, psize = max(metas)
    needed = (last + 1) * psize
    if needed > size:
        problems.append(
            f"{path.name} is truncated: {size} bytes, the last committed transaction "
            f"needs {needed}; entries stored past the end are lost"
        )
    return FileReport(size, needed, tuple(problems), psize)


def last_txnid(path: str | Path) -> int | None:
    """The newest transaction id ``data.mdb``'s meta pages name (LMDB raises it
    at every commit), read in Python from the file's first pages; None when
    the file cannot be read or has no valid meta page."""
    try:
        # Never through a link, never blocking: a FIFO planted in its place
        # fails to be read instead (as a folder does).
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.pread(fd, 2 * 4096, 0)
        psize = struct.unpack_from("<I", head, 40)[0] if len(head) >= 44 else 0
        if psize > 4096 and psize in _PAGE_SIZES:
            head = os.pread(fd, 2 * psize, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    metas, _, _ = _meta_pages(head, DATA_NAME, len(head))
    return max(metas)[0] if metas else None


_PAGE_SIZES = (4096, 8192, 16384, 32768, 65536)


def _meta_pages(
    head: bytes, name: str, size: int
) -> tuple[list[tuple[int, int, int]], list[str], int]:
    """The valid meta pages in the first bytes of a ``data.mdb`` as (txnid,
    last page, page size), what is wrong with the others, and the page size."""
    metas: list[tuple[int, int, int]] = []
    problems: list[str] = []
    psize = struct.unpack_from("<I", head, 40)[0] if len(head) >= 44 else 0
    if psize not in _PAGE_SIZES:
        psize = 4096
    for index in (0, 1):
        off = index * psize + 16  # page header is 16 bytes on 64-bit builds
        if len(head) < off + 136:
            problems.append(f"{name} meta page {index} missing ({size} bytes in file)")
            continue
        magic, version = struct.unpack_from("<II", head, off)
        if magic != _META_MAGIC or version != 1:
            problems.append(f"{name} meta page {index} is damaged (bad magic/version)")
            continue
        last, txnid = struct.unpack_from("<QQ", head, off + 120)
        metas.append((txnid, last, psize))
    return metas, problems, psize


def report_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def is_disk_full(exc: BaseException) -> bool:
    """True for LMDB errors that mean the disk (or the user's quota) is full."""
    if isinstance(exc, lmdb.DiskError):
        return True
    text = str(exc)
    return any(s in text for s in ("No space left", "ENOSPC", "Disk quota exceeded"))


_LIVE: weakref.WeakSet[Store] = weakref.WeakSet()
_ORPHANS: list[Any] = []


# The journal folders whose environment a forked child inherited (and keeps
# open, see module doc): opening one anew would be a second environment on the
# same file in one process, which LMDB forbids (closing either breaks the
# other's locks). py-lmdb refuses that itself only from 1.5 on; this check holds
# at every version the project declares.
_INHERITED: set[str] = set()


def _after_fork_in_child() -> None:
    """Keep inherited environments alive forever in the child: see module doc.
    Run by ``hooks``' after-fork handler, which keeps its place among the
    user's handlers."""
    global _REGISTRY_LOCK
    # A thread of the parent may have been opening or closing a journal at
    # the fork: its hold on the lock is copied, and nobody here releases it
    # (the child's first record, which opens its own journal, waited for ever).
    _REGISTRY_LOCK = threading.Lock()
    for store in _live_stores():
        _ORPHANS.append(store.env)
        store.forked = True
        _INHERITED.add(os.path.realpath(store.directory))


def drop_every_resident_page() -> None:
    """Drop the pages every journal map of this process holds
    (``Store.drop_resident_pages``): a shipping process does it as they pile
    up (``ship.resident``). Through each store, under its lock: no
    transaction reads the map while it goes, and no remap or close moves it
    between finding it and dropping it."""
    for store in _live_stores():
        # Only memory is at stake; a store closed meanwhile raises here.
        with contextlib.suppress(lmdb.Error):
            store.drop_resident_pages()


def _live_stores() -> list[Store]:
    """The stores open now. Another thread opening or closing one while the
    set is walked makes the walk raise (``Set changed size during
    iteration``), which a shipper's release after a batch passed on to the
    shipper: it retired its sink as stopped by an internal error. The walk is then taken
    again, not locked: a forked child walks it too (``_after_fork_in_child``),
    and must never wait for a lock a thread of its parent held at the fork."""
    while True:
        try:
            return list(_LIVE)
        except RuntimeError:
            continue  # changed under the walk: the next one sees it as it is now


class AlreadyOpenError(ValueError):
    """The file's environment is already open in this process (inherited by a fork)."""


_REGISTRY: dict[str, tuple[Store, int]] = {}
# The size LMDB gives its lock file (lock.mdb) for its default 126 readers.
_LOCK_FILE_BYTES = 8192


def _back_lock_file(where: Path) -> None:
    """Give LMDB's lock file real blocks before LMDB maps it.

    LMDB sizes lock.mdb with ftruncate (a sparse file) and writes to it
    through a shared map: on a disk with a few KiB free the first write to a
    page the disk cannot back is a SIGBUS, which killed the producer inside
    ``init()``. Allocated here first, a full disk is an error instead
    (lmdb.DiskError, which ``Journal.create`` turns into a JournalError and
    an online run into a fallback folder). A file system that cannot
    allocate, or a directory we may not write, is left to LMDB as before;
    so is a lock file LMDB already sized (a journal made before this, or
    copied): LMDB wrote the page it sets up then, and on a full disk
    allocating its holes refused every reader of it.
    """
    path = where / "lock.mdb"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    size = 0
    try:
        size = os.fstat(fd).st_size
        os.posix_fallocate(fd, 0, max(size, _LOCK_FILE_BYTES))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT) and size < _LOCK_FILE_BYTES:
            raise lmdb.DiskError(f"no room for {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


_REGISTRY_LOCK = threading.Lock()
_DETACHED: dict[int, tuple[Store, int]] = {}  # detach_store: by id, with its references


def acquire_store(
    directory: Path,
    *,
    readonly: bool,
    create: bool,
    sync: bool,
    max_bytes: int,
    repair: bool = False,
    trusted: bool = False,
) -> Store:
    """A shared Store for ``directory``: LMDB allows one environment per file per process.

    A read-only journal opened in the owner's process reuses the owner's
    environment (and its transaction lock). Raises ValueError if a writer asks
    for a directory this process holds open read-only.
    """
    key = os.path.realpath(directory)
    with _REGISTRY_LOCK:
        if key in _INHERITED:
            raise AlreadyOpenError(f"{directory} is already open in this process")
        found = _REGISTRY.get(key)
        if found is not None and not found[0].forked:
            store, refs = found
            if store.readonly and not readonly:
                raise ValueError(f"{directory} is open read-only in this process; close that first")
            _REGISTRY[key] = (store, refs + 1)
            return store
        store = Store(
            directory,
            readonly=readonly,
            create=create,
            sync=sync,
            max_bytes=max_bytes,
            repair=repair,
            trusted=trusted,
        )
        _REGISTRY[key] = (store, 1)
        return store


def detach_store(store: Store) -> None:
    """Forget ``store`` as the environment of its directory (whose files were
    deleted or moved: a journal re-created there must not share it). Its
    holders keep it; each ``release_store`` then drops it, the last closes it."""
    key = os.path.realpath(store.directory)
    with _REGISTRY_LOCK:
        found = _REGISTRY.get(key)
        if found is not None and found[0] is store:
            del _REGISTRY[key]
            _DETACHED[id(store)] = (store, found[1])


def release_store(store: Store) -> None:
    """Drop one reference; the environment closes with the last one."""
    key = os.path.realpath(store.directory)
    with _REGISTRY_LOCK:
        found = _REGISTRY.get(key)
        if found is not None and found[0] is store:
            if found[1] > 1:
                _REGISTRY[key] = (store, found[1] - 1)
                return
            del _REGISTRY[key]
        elif id(store) in _DETACHED:
            held, refs = _DETACHED.pop(id(store))
            if refs > 1:
                _DETACHED[id(store)] = (held, refs - 1)
                return
    store.close()


class Store:
    """One LMDB environment with the journal's named databases.

    ``lock`` serializes every transaction in this process, so that ``grow``
    (``set_mapsize``) never runs while one is open.
    """

    def __init__(
        self,
        directory: Path,
        *,
        readonly: bool,
        create: bool,
        sync: bool,
        max_bytes: int,
        repair: bool = False,
        trusted: bool = False,
    ) -> None:
        """Open (or create) the environment; raises lmdb.Error on failure.

        ``trusted``: the file was written by a live process of this SDK (the
        uplink opening its producer's journal), so its tree is not probed.

        A damaged ``data.mdb`` is salvaged as the module doc says; what was
        found wrong is listed in ``self.problems``.
        """
        self.directory = directory
        self.max_bytes = max_bytes
        self.readonly = readonly
        self.forked = False
        self.lock = threading.RLock()
        self.problems: list[str] = []
        self._tempdir: str | None = None
        # The mapped file, to see it shrink under the map (``_check_size``).
        self._data_fd: int | None = None
        self._release_fd: weakref.finalize[Any, Any] | None = None
        self._data_id: tuple[int, int] | None = None
        self._size_seen = 0
        data = directory / DATA_NAME
        open_dir = directory
        map_size = _INITIAL_MAP
        if data.exists():
            report = inspect_file(data)
            self.problems.extend(report.problems)
            if report.needed == 0 and report.size < 2 * report.psize:
                raise lmdb.InvalidError(f"{data} is not an LMDB file")
            if not report.problems and not repair and not create and not trusted:
                # A file this process did not write: walk its tree in a child
                # first, so a damaged page aborts the child, not this process.
                trouble = probe(directory)
                if trouble is not None:
                    self.problems.append(f"{DATA_NAME} tree damaged ({trouble})")
                    repair = True
            if report.problems or repair:
                if repair and not report.problems and not self.problems:
                    self.problems.append(f"{DATA_NAME} rebuilt: damage was found inside it")
                open_dir = self._salvage(data, report.psize, readonly)
            map_size = max(map_size, report.needed, report.size)
        # Never start above the budget, unless the file is already bigger.
        map_size = max(min(map_size, max_bytes), report_size(data))
        try:
            self._open(open_dir, map_size, readonly, create, sync)
        except (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError) as exc:
            # InvalidError on a file whose meta pages we could read means LMDB
            # disliked another header field: still a journal, salvage it.
            if self._tempdir is not None or not data.exists() or not inspect_file(data).needed:
                raise
            # The meta pages looked fine but the tree is damaged: salvage instead.
            self.problems.append(f"{DATA_NAME} tree damaged ({exc})")
            open_dir = self._salvage(data, inspect_file(data).psize, readonly)
            self._open(open_dir, map_size, readonly, create, sync)
        self._watch_size(Path(open_dir) / DATA_NAME)
        _LIVE.add(self)

    def _watch_size(self, data: Path) -> None:
        """Keep a descriptor of the mapped file, to see it truncated (``begin``).
        Closed with the store, or when it is collected unclosed."""
        with contextlib.suppress(OSError):
            fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
            self._release_fd = weakref.finalize(self, _close_quietly, fd)
            # Not at the interpreter's exit: the run's own exit handlers
            # (its close-out) still use the store after weakref's.
            self._release_fd.atexit = False
            st = os.fstat(fd)
            self._data_fd, self._data_id = fd, (st.st_dev, st.st_ino)
            self._size_seen = st.st_size

    def _check_size(self) -> None:
        """Refuse a transaction on a file that shrank under the map.

        LMDB never shrinks its file; something else did (a ``cp`` or
        ``rsync --inplace`` onto it, a truncation by hand). A read of a page
        past the new end is a SIGBUS, which kills the process: the user's
        loop included, under ``on_error="warn"``. Seen here (one ``fstat``),
        it is a damaged journal, an error the callers handle."""
        fd = self._data_fd
        if fd is None:
            return
        try:
            st = os.fstat(fd)
        except OSError:
            return
        if (st.st_dev, st.st_ino) != self._data_id:
            # Not the file any more: its number was closed by someone else
            # and taken by another file. Stop looking, and never close it.
            self._data_fd = None
            if self._release_fd is not None:
                self._release_fd.detach()
            return
        size = st.st_size
        if size < self._size_seen:
            raise lmdb.CorruptedError(
                f"{DATA_NAME} was truncated under this process "
                f"({size} bytes, {self._size_seen} before)"
            )
        self._size_seen = size

    def _open(self, where: Path, map_size: int, readonly: bool, create: bool, sync: bool) -> None:
        if self._tempdir is None:
            _back_lock_file(where)
        self.env = lmdb.open(
            str(where),
            map_size=map_size,
            subdir=True,
            readonly=readonly,
            create=create,
            max_dbs=len(DB_NAMES) + 2,
            sync=sync,
            metasync=sync,
            writemap=False,  # a full disk must be an error, not a SIGBUS
            mode=0o600,
            lock=self._tempdir is None,  # a private salvaged copy needs no lock
        )
        try:
            with contextlib.suppress(lmdb.Error):
                self.env.reader_check()  # free slots of dead reader processes
            self.dbs = {}
            for name in DB_NAMES:
                # An existing journal always has its tables. One that is missing
                # was lost to damage in the main tree (a flipped key): creating
                # it empty would hide every entry, so the file is salvaged.
                try:
                    self.dbs[name.decode()] = self.env.open_db(name, create=create)
                except lmdb.NotFoundError:
                    raise lmdb.CorruptedError(f"table {name.decode()} missing") from None
        except BaseException:
            self.env.close()
            self._drop_tempdir()
            raise

    def _salvage(self, data: Path, psize: int, readonly: bool) -> Path:
        # LMDB must not open this file (see module doc). Rebuild a fresh
        # environment from a page scan: a reader builds a private copy and
        # leaves the file untouched; the owner (the repair path: replay, sync)
        # keeps the damaged file beside it as data.mdb.damaged-<time>.
        found = scan_pages(data, psize)
        self.problems.append(
            f"recovered {len(found.entries)} entries, {len(found.cursors)} cursors and "
            f"{len(found.meta)} meta values by scanning {found.pages} pages"
        )
        import tempfile  # here: salvage is rare, and a listing never needs it

        target = Path(
            tempfile.mkdtemp(prefix="primeruns-salvage-", dir=None if readonly else self.directory)
        )
        env = lmdb.open(
            str(target),
            map_size=max(_INITIAL_MAP, 2 * data.stat().st_size),
            max_dbs=len(DB_NAMES) + 2,
            mode=0o600,
            lock=False,
        )
        try:
            dbs = {n: env.open_db(n) for n in DB_NAMES}
            with env.begin(write=True) as txn:
                for seq in sorted(found.entries):
                    txn.put(struct.pack(">Q", seq), found.entries[seq], db=dbs[b"entries"])
                for key, value in found.meta.items():
                    txn.put(key, value, db=dbs[b"meta"])
                for key, value in found.cursors.items():
                    txn.put(key, value, db=dbs[b"cursors"])
        finally:
            env.close()
        if readonly:
            self._tempdir = str(target)
            return target
        os.replace(data, data.with_name(f"{DATA_NAME}.damaged-{int(time.time())}"))
        os.replace(target / DATA_NAME, data)
        with contextlib.suppress(OSError):
            os.unlink(self.directory / "lock.mdb")  # describes the old file's readers
        shutil.rmtree(target, ignore_errors=True)
        return self.directory

    def _drop_tempdir(self) -> None:
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)
            self._tempdir = None

    def begin(self, *, write: bool = False, buffers: bool = False) -> lmdb.Transaction[Any]:
        """A transaction; adopts a map grown by another process (MapResizedError).

        ``buffers=True`` yields memoryviews into the map, valid only inside it.
        """
        self._check_size()
        try:
            return self._begin(write, buffers)
        except lmdb.MapResizedError:
            self.env.set_mapsize(0)
            return self._begin(write, buffers)

    def _begin(self, write: bool, buffers: bool) -> lmdb.Transaction[Any]:
        if buffers:
            return self.env.begin(write=write, buffers=True)
        return self.env.begin(write=write)

    def grow(self) -> bool:
        """Double the map up to the budget; False when already at the budget."""
        current = int(self.env.info()["map_size"])
        new = min(self.max_bytes, current * 2)
        if new <= current:
            return False
        self.env.set_mapsize(new)
        return True

    def file_size(self) -> int:
        try:
            return (self.directory / DATA_NAME).stat().st_size
        except OSError:
            return 0

    def sync(self) -> None:
        self.env.sync(True)

    def drop_resident_pages(self) -> None:
        """Map the file again, so the pages reads touched leave this process's
        resident set (they stay in the kernel's page cache).

        LMDB maps the whole file and a page once read stays resident until
        the map goes: a scan of a 200 MB journal would hold 200 MB. Remapping
        (``set_mapsize`` at the same size: LMDB unmaps and maps again) is
        allowed only with no transaction open in this process, which the
        lock guarantees."""
        if self.forked:
            return  # the inherited environment is the parent's (module doc)
        with self.lock:
            self.env.set_mapsize(int(self.env.info()["map_size"]))

    def close(self) -> None:
        """Close the environment; in a forked child the inherited one is kept (module doc)."""
        _LIVE.discard(self)
        if self._release_fd is not None:
            self._data_fd = None
            self._release_fd()  # once: a finalizer runs at most once
        if not self.forked:
            with self.lock:  # not while another thread drops its pages
                self.env.close()
        self._drop_tempdir()


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
