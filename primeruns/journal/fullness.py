"""Why a journal is full, in words a user can act on.

ENOSPC means two different things: no free blocks, or no free inodes (a
scratch filesystem holding millions of small files). ``df -h`` shows plenty
of room in the second case, so a message saying "the disk is full" sends the
user looking in the wrong place. ``statvfs`` tells the two apart; the budget
(``PRIME_RUNS_MAX_JOURNAL_BYTES``) is the third cause, when the filesystem has
room of both kinds.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["disk_cause", "full_cause"]

# Below this many free bytes the disk, not the journal's budget, is what stopped it.
_LOW_BYTES = 1 << 20


def full_cause(path: Path | str) -> str:
    """A phrase naming what is exhausted where ``path`` lives: its inodes, its
    disk space, or (when statvfs shows room of both) the journal's byte budget."""
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
    """After ENOSPC (the budget is not the cause): "no free inodes" or "the disk is full"."""
    return "no free inodes" if "inodes" in full_cause(path) else "the disk is full"
