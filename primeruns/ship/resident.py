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
- **The journal's pages.** LMDB maps the journal; every entry shipped was
  read through the map, and the pages read stay counted in the process's
  RSS (``RssFile``) as the journal grows, which is what a scheduler that
  kills a job by RSS sees. ``madvise(MADV_DONTNEED)`` on the map drops them
  from this process (the map is read-only and shared: the next read faults
  them back in from the page cache, the same bytes).

- **The largest batch.** glibc maps a block of 128 KiB or more on its own
  and unmaps it when freed, but raises that threshold to the size of each
  such block freed (up to 32 MiB): after the first Prime Traces batch (a
  30 MB body) a later batch's buffers of that size came from the heap,
  where a block allocated after them kept their pages (a freed 20 MB
  buffer stayed resident: ``tests/ship/test_resident.py``). A shipping
  process fixes the threshold at 1 MiB (``mallopt``), so a batch's large
  buffers leave the process as they are freed.

So the shipping process releases the first two: after a batch at most once a second,
and as soon as a sink runs out of work (what an idle uplink holds is then
what it uses). Elsewhere (no glibc, or a process that did not ``enable`` it:
the user's own, in threads mode, keeps its memory as it is) this does
nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Iterator

from ..journal.store import DATA_NAME
from ..libc import libc as c_library

__all__ = ["after_batch", "enable", "idle", "journal_maps"]

_INTERVAL_S = 1.0  # at most one release a second while batches flow
_MADV_DONTNEED = 4  # Linux
_M_MMAP_THRESHOLD = -3  # mallopt's parameter
_MMAP_THRESHOLD = 1 << 20  # fixed: glibc's own moves up with the largest block freed

_lock = threading.Lock()
_libc: ctypes.CDLL | None = None
_dirty = False  # a batch was freed since the last release
_last = 0.0


def enable() -> bool:
    """Release from now on in this process; whether this libc allows it."""
    global _libc
    try:
        libc = c_library()
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): nothing to ask
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    _libc = libc
    return True


def after_batch() -> None:
    """A batch was acknowledged (its memory freed): release if a second has passed."""
    global _dirty
    if _libc is None:
        return
    _dirty = True
    if time.monotonic() - _last >= _INTERVAL_S:
        _release()


def idle() -> None:
    """A sink has nothing to send: release what the batches since the last time left."""
    if _libc is not None and _dirty:
        _release()


def journal_maps(maps: str) -> Iterator[tuple[int, int]]:
    """(start, length) of each mapping of a journal's data file in ``maps``
    (the text of ``/proc/self/maps``)."""
    suffix = "/" + DATA_NAME
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        # Only a read-only shared map (LMDB's, without writemap): its pages
        # are the file's, so dropping them loses nothing.
        if (
            len(parts) == 6
            and parts[5].endswith(suffix)
            and parts[1].startswith("r-")
            and "s" in parts[1]
        ):
            low, _, high = parts[0].partition("-")
            start = int(low, 16)
            yield start, int(high, 16) - start


def _release() -> None:
    global _dirty, _last
    libc = _libc
    if libc is None or not _lock.acquire(blocking=False):
        return  # another thread is releasing right now: that one does it
    try:
        _dirty = False
        _last = time.monotonic()
        libc.malloc_trim(0)
        maps = ""
        with contextlib.suppress(OSError), open("/proc/self/maps") as f:
            maps = f.read()
        for start, length in journal_maps(maps):
            libc.madvise(start, length, _MADV_DONTNEED)  # a failure leaves them: harmless
    finally:
        _lock.release()
