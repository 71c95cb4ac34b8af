"""The sync root's working folders, and those a killed sync left behind.

A sync reads a copy from a private snapshot and makes a sync journal under a
temporary name, both folders in the sync root (``mirror``), each a whole
journal. Removed on the way out, they stayed when the process was killed
(SIGKILL, the OOM killer, a login session's SIGHUP, a batch system's
SIGTERM: Python's default handlers end without unwinding), in a home folder
whose quota is small, for good: nothing else looks at them.

So a folder in use is held under an ``flock`` of its own descriptor (the
kernel lets it go however its process ends), and a sync making one removes
first every working folder no process holds, as ``primeruns gc`` does.

Only this host's: a home folder is shared by a cluster's login nodes over
NFS (or another network filesystem), where a folder's flock is the host's
own (no network lock is taken for a directory), so a live sync on another
node holds its folders unseen. A folder is named after the host that made it
(``<prefix><host>@...``), and only that host's syncs and gc remove it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PREFIXES", "sweep", "working_folder"]

#: The names working folders start with (no local id starts with a dot).
PREFIXES = (".snapshot-", ".creating-")


@contextlib.contextmanager
def working_folder(root: Path, prefix: str) -> Iterator[Path]:
    """A new private folder in ``root`` named ``prefix...``, held while in
    use and removed afterwards; the abandoned ones (``sweep``) go first."""
    sweep(root)
    path, fd = _made_and_held(root, prefix + _host_mark())
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def _made_and_held(root: Path, prefix: str) -> tuple[Path, int]:
    """A new folder and a descriptor of it holding its lock (where one can
    be taken). Another sync's sweep may remove it between its making and
    the lock: then one more."""
    while True:
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            # No lock to be had there (ENOLCK): used unheld, which no sweep
            # removes (it cannot prove one abandoned without its lock).
            return path, fd
        if os.fstat(fd).st_nlink:  # (a removed folder has no link left)
            return path, fd
        os.close(fd)


def _host_mark() -> str:
    """What follows a prefix in the names of this host's working folders:
    its name, then a character no such name holds (``a-b`` is not ``a``'s)."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) + "@"


def sweep(root: Path) -> int:
    """Remove the working folders this host made in ``root`` that no
    process holds; how many."""
    own = tuple(prefix + _host_mark() for prefix in PREFIXES)
    with os.scandir(root) as entries:
        names = [e.name for e in entries if e.name.startswith(own)]
    return sum(_remove_if_abandoned(root / name) for name in names)


def _remove_if_abandoned(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # gone meanwhile, or no folder
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # in use, or no lock to be had there: either may be
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)
