"""Giving back the memory shipping no longer uses, in a process that ships:
the uplink, and ``primeruns replay`` / ``sync``.

Over a 20,000-step training run the uplink's resident memory doubled
(196 -> 400 MB) although what it held did not grow: the same ~290,000 live
Python blocks at step 1,000 and at step 20,000. Three things kept it:

- **The allocator.** A batch is transient (megabytes of entries read,
  decoded, stamped and compressed into a body, freed once acknowledged), and
  glibc keeps what is freed in the middle of its heaps, one heap per thread
  that allocated (each sink's shipper, the mover), handing back only the top
  of each. ``malloc_trim`` gave back 200 MB at step 20,000.
- **The journal's pages.** LMDB maps the journal; every page a read or a
  write's copy touched stays counted in the process's RSS (``RssFile``)
  until the map goes, and Linux maps up to 64 KiB of cached file around
  each page it faults in. A batch's bookkeeping (its in-flight record, the
  acknowledgement, the binding and cursors read back) touches a few pages
  each time, and LMDB writes each new copy of a page wherever a freed one
  was, so over a long run they are scattered over the whole file: in a
  second of batches a 100,000-step ``sync`` touched half of its 31 MB
  sync journal (17 MB resident, against under 1 MB at 2,000 steps).
  Dropping the map (``Store.drop_resident_pages``, every journal's: the
  next read faults its pages back in from the page cache, the same bytes)
  after any transaction once the process's file-backed pages grew by
  ``FILE_SLACK_BYTES`` since the last drop keeps that part flat in the
  run's length; the check is ``/proc/self/statm``, a few microseconds a
  transaction, and a short run's small file seldom reaches it.
- **The largest batch.** glibc maps a block of 128 KiB or more on its own
  and unmaps it when freed, but raises that threshold to the size of each
  such block freed (up to 32 MiB): after the first Prime Traces batch (a
  30 MB body) a later batch's buffers of that size came from the heap,
  where a block allocated after them kept their pages (a freed 20 MB
  buffer stayed resident: ``tests/ship/test_resident.py``). A shipping
  process fixes the threshold at 1 MiB (``mallopt``), so a batch's large
  buffers leave the process as they are freed.

So the shipping process releases the first two at most once a second: after
a batch, and when a sink runs out of work, at once if the last release is a
second old, else once it is (one timer, so what an idle uplink holds is then
what it uses); the journal's pages also after any transaction where they
piled up. A release on every catch-up cost a live training loop's uplink
more than it gave back: its sinks catch up after nearly every batch, several
times a second, and each release made the next batch fault its heap and the
journal's pages in again (80,000-100,000 page faults over a 250-step loop,
33,000-54,000 with one release a second). Elsewhere (no glibc, or a process
that did not ``enable`` it: the user's own, in threads mode, keeps its
memory as it is) this does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable

import lmdb

from ..journal import txn
from ..journal.store import Store, drop_every_resident_page
from ..libc import libc as c_library

__all__ = ["FILE_SLACK_BYTES", "after_batch", "enable", "idle"]

_INTERVAL_S = 1.0  # at most one release a second while batches flow
_M_MMAP_THRESHOLD = -3  # mallopt's parameter
_MMAP_THRESHOLD = 1 << 20  # fixed: glibc's own moves up with the largest block freed
# File-backed memory a shipping process may gain between two drops of the
# journals' maps: what it adds to a long run's RSS, half of it on average.
FILE_SLACK_BYTES = 2 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

_lock = threading.Lock()
_libc: ctypes.CDLL | None = None
_dirty = False  # a batch was freed since the last release
_last = 0.0
_file_base: int | None = None  # file-backed pages just after the last drop
_pending = False  # a release is due when the second since the last one is over
_pending_lock = threading.Lock()  # not ``_lock``: a catch-up never waits for a release
_clock = time.monotonic


def _start_timer(delay: float, then: Callable[[], None]) -> None:
    """Call ``then`` in ``delay`` seconds, on a thread that never holds up
    the process's exit."""
    timer = threading.Timer(delay, then)
    timer.name = "primeruns-release"
    timer.daemon = True
    timer.start()


def enable() -> bool:
    """Release from now on in this process; whether this libc allows it."""
    global _libc
    try:
        libc = c_library()
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): nothing to ask
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    _libc = libc
    txn.after_transaction = _after_transaction
    return True


def after_batch() -> None:
    """A batch was acknowledged (its memory freed): release if a second has passed."""
    global _dirty
    if _libc is None:
        return
    _dirty = True
    if _clock() - _last >= _INTERVAL_S:
        _release()


def idle() -> None:
    """A sink has nothing to send: release what the batches since the last
    time left, now if the last release is a second old, else once it is."""
    global _pending
    if _libc is None or not _dirty:
        return
    left = _last + _INTERVAL_S - _clock()
    if left <= 0:
        _release()
        return
    with _pending_lock:
        if _pending:
            return  # one release is due already: it takes this batch's memory too
        _pending = True
    _start_timer(left, _release_due)


def _release_due() -> None:
    """The release ``idle`` put off, unless a batch since did it."""
    global _pending
    with _pending_lock:
        _pending = False
    if _dirty:
        _release()


def _file_pages() -> int | None:
    """This process's resident file-backed (and shared) pages, or None."""
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return None  # not Linux
    try:
        return int(os.read(fd, 256).split()[2])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def _after_transaction(store: Store) -> None:
    """After each transaction of ``store`` (``journal.txn.after_transaction``):
    drop its map's pages once the process's file-backed pages grew by
    ``FILE_SLACK_BYTES`` since the last drop."""
    global _file_base
    now = _file_pages()
    if now is None:
        return
    if _file_base is None or now < _file_base:
        _file_base = now  # the first, or pages dropped elsewhere (a long read, a release)
    elif (now - _file_base) * _PAGE >= FILE_SLACK_BYTES:
        with contextlib.suppress(lmdb.Error):  # only memory is at stake
            store.drop_resident_pages()
        _file_base = _file_pages()


def _drop_journal_pages() -> None:
    """Drop every journal map's pages (called under ``_lock``)."""
    global _file_base
    drop_every_resident_page()
    _file_base = _file_pages()


def _release() -> None:
    global _dirty, _last
    libc = _libc
    if libc is None or not _lock.acquire(blocking=False):
        return  # another thread is releasing right now: that one does it
    try:
        _dirty = False
        _last = _clock()
        libc.malloc_trim(0)
        _drop_journal_pages()
    finally:
        _lock.release()
