"""Why a journal is full, in words a user can act on.

ENOSPC means two different things: no free blocks, or no free inodes (a
scratch filesystem holding millions of small files). ``df -h`` shows plenty
of room in the second case, so a message saying "the disk is full" sends the
user looking in the wrong place. ``statvfs`` tells the two apart; the budget
(``PRIME_RUNS_MAX_JOURNAL_BYTES``) is the third cause, when the filesystem has
room of both kinds.

EFBIG is a fourth: a file of the journal reached the process's file size
limit (``ulimit -f``, RLIMIT_FSIZE, set by a job's shell or scheduler), with
disk and budget to spare. The failed write knows it (``note_too_large``), and
so does the room count, which keeps LMDB's data file short of the limit
(``file_size_limit``, ``note_limit``): filled to it, LMDB could no longer
write the cursors and acknowledgements that free its pages, and every sink
stalled. No free space nor a larger budget helps then: the limit is named,
with its fix.
"""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

__all__ = [
    "disk_cause",
    "file_size_limit",
    "full_cause",
    "full_remedy",
    "note_limit",
    "note_too_large",
]

# Below this many free bytes the disk, not the journal's budget, is what stopped it.
_LOW_BYTES = 1 << 20
# The journals (their paths) a write of which was refused with EFBIG.
_TOO_LARGE: set[str] = set()
_LIMIT_REMEDY = (
    "Raise the file size limit of the job (`ulimit -f unlimited` in the script that starts "
    "it, or the scheduler's setting) or start it where none is set."
)


def note_too_large(path: Path | str, exc: OSError) -> None:
    """A write into the journal at ``path`` failed with ``exc``: if that was
    EFBIG, its file size limit is what stops it from here on."""
    if exc.errno == errno.EFBIG:
        note_limit(path)


def note_limit(path: Path | str) -> None:
    """The journal at ``path`` is stopped by the file size limit from here on
    (a write met it, or the room count kept its data file short of it)."""
    _TOO_LARGE.add(str(path))


def file_size_limit() -> int | None:
    """This process's file size limit in bytes (``ulimit -f``: RLIMIT_FSIZE's
    soft limit); None where there is none."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _amount(nbytes: int) -> str:
    """``nbytes`` as a user set it: ``ulimit -f 1000`` is 1000 KiB, which
    "0 MiB" hid."""
    if nbytes >= 1 << 20 and not nbytes % (1 << 20):
        return f"{nbytes >> 20} MiB"
    if nbytes >= 1 << 10 and not nbytes % (1 << 10):
        return f"{nbytes >> 10} KiB"
    return f"{nbytes} bytes"


def _too_large(path: Path | str) -> str | None:
    """The file size limit that stopped the journal at ``path``, in words; None
    if no write of it met one."""
    if str(path) not in _TOO_LARGE:
        return None
    soft = file_size_limit()
    if soft is None:
        return "a file of it reached the largest file its filesystem takes"
    return (
        f"a file of it reached this process's file size limit (ulimit -f: "
        f"{_amount(soft)}), not its disk space nor its byte budget"
    )


def full_cause(path: Path | str) -> str:
    """A phrase naming what is exhausted where ``path`` lives: its inodes, its
    disk space, the file size limit a write of it met (EFBIG), or (when
    statvfs shows room of both) the journal's byte budget."""
    too_large = _too_large(path)
    if too_large is not None:
        return too_large
    try:
        st = os.statvfs(path)
    except OSError:
        return "byte budget or disk"
    free = int(st.f_bavail) * int(st.f_frsize)
    # f_files == 0: a filesystem with no inode table (btrfs reports inodes so).
    if st.f_files > 0 and st.f_favail == 0:
        return f"no free inodes on its filesystem ({free >> 20} MiB of space still free)"
    if free < _LOW_BYTES:
        return "no free disk space"
    return "its byte budget (PRIME_RUNS_MAX_JOURNAL_BYTES) is reached"


def disk_cause(path: Path | str) -> str:
    """After ENOSPC or EFBIG (the budget is not the cause): "no free inodes",
    the file size limit, or "the disk is full"."""
    cause = full_cause(path)
    if _too_large(path) is not None:
        return cause
    return "no free inodes" if "inodes" in cause else "the disk is full"


def full_remedy(path: Path | str, otherwise: str) -> str:
    """What the user can do about the journal at ``path`` being full: raise
    the file size limit a write of it met, else ``otherwise``."""
    return _LIMIT_REMEDY if _too_large(path) is not None else otherwise
