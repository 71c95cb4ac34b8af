"""Who listens on a port of this machine: the users whose sockets serve it.

A journal names the platform its run was recorded for, and one recorded for
a platform on this machine (``primeruns serve`` on loopback) is synced there
without a flag, with the API key of the user's environment. On a shared
login node any user can listen on a loopback port: a journal recorded for a
local platform on a compute node (``http://127.0.0.1:8000``), copied to the
login node and synced, would send the user's key to whatever a neighbour
serves on that port there. Linux says which user's socket listens on a port
(``/proc/net/tcp`` and ``tcp6``: the socket's owner); a port served by
another user (root aside, who could read the key anyway) is refused.
Where that cannot be read, nothing is known, and nothing is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["listening_users", "served_by_another_user"]

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"  # the socket state column's value for LISTEN


def listening_users(port: int) -> set[int] | None:
    """The uids owning a socket that listens on TCP ``port`` (any address),
    or None where the kernel's tables cannot be read (not Linux)."""
    uids: set[int] = set()
    readable = False
    for table in _TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid ...
            fields = line.split()
            if len(fields) < 8 or fields[3] != _LISTEN:
                continue
            try:
                if int(fields[1].rpartition(":")[2], 16) == port:
                    uids.add(int(fields[7]))
            except ValueError:
                continue
    return uids if readable else None


def served_by_another_user(port: int) -> int | None:
    """A uid, neither this process's nor root's, listening on ``port``;
    None if there is none (or it cannot be known)."""
    uids = listening_users(port)
    if not uids:
        return None
    others = uids - {os.getuid(), os.geteuid(), 0}
    return min(others) if others else None
