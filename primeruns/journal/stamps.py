"""A journal's creation stamp (the first characters of its name), and the
newest one given in a runs directory.

A name is never stamped earlier than one made before it in its runs
directory: the wall clock stepped back since (NTP, a VM resumed) would name
the new journal as made before the last, and what looks for a run's later
journals among those made since one of its own would pass it over
(``listing.made_since``): a parent's finish, its forked children; a
primary's close-out, the processes that attached to the run it created
(``ranks.others_of``).

The newest stamp given is kept in one small file of the runs directory
(``MARK_NAME``), read and raised under a lock at each creation: what
``init()`` pays is the same with 100,000 past runs as with none (a listing
of the directory cost 91 ms at 100,000). A name in the directory that no
creation here gave (a journal copied from a host whose clock is far ahead,
a link) moves no stamp. A mark that is not this user's plain file (a shared
runs directory, another user's) is not used: the clock alone names the
journal, as it did before any mark.

The lock is a POSIX record lock (``lockf``), which a forked child never
holds: a child forked while another thread of its parent held an flock would
keep it for as long as it lives, and every creation in the directory would
wait for it. Two threads of one process are not kept apart by it; their
stamps are read from one clock.

The lock is waited for a bounded time (``LOCK_WAIT_S``): a process stopped
(SIGSTOP, a debugger) or hung on a dead file system while holding it would
otherwise keep every ``init()`` in the directory waiting for as long as it
is stopped. Past the wait the mark is read but not raised, unguarded, as
where locks are unavailable: the name is no earlier than the mark read, and
the holder's own raise is not overwritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import time
from pathlib import Path

from primeruns.ship.standby import pause

__all__ = ["MARK_NAME", "STAMPED", "STAMP_LEN", "no_earlier_than_made"]

#: A local id's creation stamp, ``yyyymmdd-HHMMSS``: its first characters.
STAMP_LEN = 15
STAMPED = re.compile(r"^\d{8}-\d{6}-")
_STAMP = re.compile(rb"\d{8}-\d{6}")

#: The newest stamp given to a journal made in the runs directory.
MARK_NAME = ".newest-stamp"

#: How long a creation waits for another's hold on the mark before naming
#: its journal without it: a creation holds it for a read and a write.
LOCK_WAIT_S = 1.5
_LOCK_RETRY_S = 0.01


def no_earlier_than_made(runs_dir: Path, stamp: str) -> str:
    """``stamp``, or the newest stamp given in ``runs_dir`` if that is later;
    the mark raised to the answer. Best effort: ``stamp`` when the mark
    cannot be used."""
    try:
        fd = os.open(
            os.path.join(runs_dir, MARK_NAME),
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
    except OSError:
        return stamp
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return stamp
        if not _locked(fd):
            return _later_of_mark(fd, stamp)
        return _raised(fd, stamp)
    except OSError:
        return stamp
    finally:
        os.close(fd)  # and the lock with it


def _locked(fd: int) -> bool:
    """Whether ``fd``'s mark may be raised: locked within ``LOCK_WAIT_S``, or
    the file system has no locks (ENOLCK and the like: raised unguarded, as
    before there was a lock). False when another holds it past the wait."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except (BlockingIOError, PermissionError):  # EAGAIN / EACCES: held by another
            if time.monotonic() >= deadline:
                return False
            # A lock's wait has no timeout of its own (an alarm's signal is
            # the main thread's only, and init() runs in any thread): tried
            # again shortly. A holder keeps it for a read and a write.
            pause(_LOCK_RETRY_S)
        except OSError:
            return True


def _later_of_mark(fd: int, stamp: str) -> str:
    """The later of ``stamp`` and the mark ``fd`` holds, the mark left as it is."""
    held = os.pread(fd, STAMP_LEN + 1, 0)
    if _STAMP.fullmatch(held) and held.decode() > stamp:
        return held.decode()
    return stamp


def _raised(fd: int, stamp: str) -> str:
    """The later of ``stamp`` and the mark ``fd`` holds, which is raised to it."""
    held = os.pread(fd, STAMP_LEN + 1, 0)
    if _STAMP.fullmatch(held) and held.decode() >= stamp:
        return held.decode()
    if _STAMP.fullmatch(stamp.encode()):
        with contextlib.suppress(OSError):
            os.pwrite(fd, stamp.encode(), 0)
            os.ftruncate(fd, STAMP_LEN)
    return stamp
