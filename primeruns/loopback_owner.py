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


def _reached_from_loopback(address: str) -> bool:
    """Whether a socket bound to ``address`` (the tables' hex: an IPv4
    address as a little-endian word, an IPv6 one as four) takes a
    connection to a loopback address: a loopback one, or every address.
    One bound to the machine's network address does not."""
    try:
        if len(address) == 8:
            return address == "00000000" or int(address[6:8], 16) == 127  # 0.0.0.0, 127.x
        words = [int(address[i : i + 8], 16).to_bytes(4, "little") for i in range(0, 32, 8)]
    except ValueError:
        return True  # (unread: counted, as before)
    raw = b"".join(words)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":  # ::ffff:a.b.c.d
        return raw[12:] == bytes(4) or raw[12] == 127
    return raw in (bytes(16), bytes(15) + b"\1")  # :: or ::1


def listening_users(port: int) -> set[int] | None:
    """The uids owning a socket that listens on TCP ``port`` where a
    loopback URL reaches it (a loopback address, or every address), or
    None where the kernel's tables cannot be read (not Linux)."""
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
            address, _, listened = fields[1].rpartition(":")
            try:
                if int(listened, 16) == port and _reached_from_loopback(address):
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
