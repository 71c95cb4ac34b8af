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

Once is not enough: a sync outlives its platform's restarts, and a
neighbour may take the port while the platform is down, between two
connections of one sync. So each new connection to such a port is checked
too, once connected and before a byte is sent (:func:`connected_to_another_user`):
the socket at its far end (the one the listener's kernel made for it,
owned by the listener's user, accepted yet or not) and the port's listeners.
The far end is the one that reads what is sent: a neighbour that closed its
listener once it had the connection is caught there.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from .exceptions import PrimeRunsError

__all__ = [
    "ServedByAnotherUserError",
    "connected_to_another_user",
    "listening_users",
    "served_by_another_user",
    "taken_by_another_user",
]

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"  # the socket state column's value for LISTEN
_MAPPED = bytes(10) + b"\xff\xff"  # ::ffff:a.b.c.d, an IPv4 address in IPv6's form


class ServedByAnotherUserError(PrimeRunsError):
    """A new connection to a loopback platform a journal chose reached
    another user's socket: nothing was sent on it. Fatal for the sink that
    met it (``ship.policy``): the journal keeps its records, for a sync
    with ``--base-url``."""

    def __init__(self, message: str, *, url: str, uid: int) -> None:
        super().__init__(message)
        self.url = url
        self.uid = uid


def taken_by_another_user(what: str, url: str, uid: int, *, now: bool = False) -> str:
    """The refusal of ``url`` (the ``what`` a journal was recorded for)
    whose port another user (``uid``) serves; ``now``: found so at a new
    connection during the shipment, where nothing was sent on it."""
    served = "is now served" if now else "is served"
    sent = " (nothing was sent on that connection)" if now else ""
    return (
        f"the run was recorded for the {what} at {url}, and on this machine that port "
        f"{served} by another user's process (uid {uid}), not a platform of yours{sent}: "
        "a journal does not choose where your API key goes; pass --base-url with the "
        "platform to ship it to"
    )


def _address(text: str) -> bytes:
    """A table's hex address (IPv4: one 32-bit word; IPv6: four, each as
    the machine holds it: little-endian on most) as 16 bytes, an IPv4 one
    in its mapped form. ValueError if it is neither."""
    order = sys.byteorder
    if len(text) == 8:
        return _MAPPED + int(text, 16).to_bytes(4, order)
    if len(text) != 32:
        raise ValueError(text)
    return b"".join(int(text[i : i + 8], 16).to_bytes(4, order) for i in range(0, 32, 8))


def _reached_from_loopback(address: bytes) -> bool:
    """Whether a socket bound to ``address`` takes a connection to a
    loopback address: a loopback one, or every address. One bound to the
    machine's network address does not."""
    if address[:12] == _MAPPED:
        return address[12:] == bytes(4) or address[12] == 127  # 0.0.0.0, 127.x
    return address in (bytes(16), bytes(15) + b"\1")  # :: or ::1


def _endpoint(text: str) -> tuple[bytes | None, int]:
    """A table's ``address:port`` (hex); the address None where unread."""
    address, _, port = text.rpartition(":")
    try:
        return _address(address), int(port, 16)
    except ValueError:
        return None, int(port, 16)


_Ends = tuple[tuple[bytes, int], tuple[bytes, int]]  # a connection's local and remote ends


def _owners(port: int, far_end: _Ends | None) -> set[int] | None:
    """The uids of the sockets listening on ``port`` where a loopback URL
    reaches them, and of the socket whose local and remote ends are
    ``far_end``'s; None where the kernel's tables cannot be read."""
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
            if len(fields) < 8:
                continue
            try:
                if fields[3] == _LISTEN:
                    address, listened = _endpoint(fields[1])
                    # (an address unread is counted, as one reached)
                    if listened == port and (address is None or _reached_from_loopback(address)):
                        uids.add(int(fields[7]))
                elif far_end is not None and far_end == (
                    _endpoint(fields[1]),
                    _endpoint(fields[2]),
                ):
                    uids.add(int(fields[7]))
            except ValueError:
                continue
    return uids if readable else None


def _others(uids: set[int] | None) -> int | None:
    others = (uids or set()) - {os.getuid(), os.geteuid(), 0}
    return min(others) if others else None


def listening_users(port: int) -> set[int] | None:
    """The uids owning a socket that listens on TCP ``port`` where a
    loopback URL reaches it (a loopback address, or every address), or
    None where the kernel's tables cannot be read (not Linux)."""
    return _owners(port, None)


def served_by_another_user(port: int) -> int | None:
    """A uid, neither this process's nor root's, listening on ``port``;
    None if there is none (or it cannot be known)."""
    return _others(listening_users(port))


def _as_table(name: tuple[Any, ...]) -> tuple[bytes, int]:
    """A socket address (``getsockname``'s) as the tables have it."""
    host, port = str(name[0]), int(name[1])
    if ":" in host:
        return socket.inet_pton(socket.AF_INET6, host.partition("%")[0]), port
    return _MAPPED + socket.inet_pton(socket.AF_INET, host), port


def connected_to_another_user(sock: socket.socket | None, port: int) -> int | None:
    """A uid, neither this process's nor root's, owning the far end of the
    connected ``sock`` or listening on ``port`` (the URL's: where a proxy
    is used, ``sock`` goes to the proxy); None if there is none (or it
    cannot be known). One read of the tables: a connection's cost. Without
    ``sock`` (a transport that does not show its socket), the port's
    listeners are still looked at: not knowing the far end is no pass."""
    try:
        if sock is None:
            raise ValueError("no socket")
        far_end = (_as_table(sock.getpeername()), _as_table(sock.getsockname()))
    except (OSError, ValueError):
        far_end = None  # (not an internet socket, already closed, none: its port alone)
    return _others(_owners(port, far_end))
