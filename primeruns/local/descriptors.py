"""``primeruns serve``'s file descriptors: room for its connections and its own files.

Each connection holds a descriptor, and a process's soft ``RLIMIT_NOFILE`` is
often 1,024: about a thousand connections anyone on the machine opens used
them all, then every accept failed (EMFILE, which asyncio logged with a
traceback each time, up to a listen backlog's worth a second) and the
server could no longer open its own files (SQLite's, the object store's).
:func:`fit` raises the soft limit as far as ``--max-connections`` needs and
the hard limit allows, and where the hard limit is too low lowers the cap
to what fits, saying so once at start; :class:`AcceptErrors` says an accept
that still runs out in one line, at most once a minute.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from .settings import ConnectionLimits

if TYPE_CHECKING:
    import asyncio

__all__ = ["BACKLOG", "RESERVED", "AcceptErrors", "fit"]

#: The listening socket's backlog, and so the connections asyncio accepts at
#: once each time it finds the socket ready (uvicorn's 2,048 would be that
#: many descriptors taken in one go).
BACKLOG = 128
#: Descriptors kept beside the connections the cap allows: the server's own
#: (the database, its WAL and shared memory, the checkpoint's connection,
#: objects being written, the log, the listener, the event loop's: 64 is
#: twice what an idle server holds), and connections accepted and not yet
#: counted or closed: one past the cap is answered and closed three loop turns
#: after its accept, and each turn may accept a backlog's worth.
RESERVED = 64 + 3 * BACKLOG


def fit(limits: ConnectionLimits) -> tuple[ConnectionLimits, str | None]:
    """``limits`` with a cap the process's descriptors can hold, raising the
    soft limit toward the hard one for it; the second value says what was
    lowered and why (None: nothing was).

    Raises ValueError when even one connection does not fit.
    """
    try:
        import resource
    except ImportError:  # (no such limit to read here)
        return limits, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = limits.max_connections + RESERVED
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        soft = _raised_soft(soft, raised, hard)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return limits, None
    fits = soft - RESERVED
    if fits < 1:
        raise ValueError(
            f"the process may open only {soft} files (ulimit -n), too few to serve: "
            f"{RESERVED} are kept for the server's own; raise the limit (ulimit -Hn {wanted})"
        )
    said = (
        f"primeruns serve: --max-connections lowered from {limits.max_connections} to {fits}: "
        f"the process may open only {soft} files (ulimit -Hn, or the system's own limit), "
        f"{RESERVED} kept for its own"
    )
    return dataclasses.replace(limits, max_connections=fits), said


def _raised_soft(soft: int, wanted: int, hard: int) -> int:
    """The soft limit on open files raised from ``soft`` toward ``wanted`` as
    far as the system takes it: ``wanted`` itself, else the most it takes
    (macOS's hard limit is unlimited, but no soft limit past its own per
    process, ``kern.maxfilesperproc``, is taken: refused there, the soft
    limit was left at its 256 and serve refused to start)."""
    import resource

    def taken(value: int) -> bool:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (value, hard))
        except (ValueError, OSError, OverflowError):
            return False
        return True  # (each one taken is above the last: the limit ends at the most)

    if taken(wanted):
        return wanted
    low, high = soft, wanted - 1  # (low is taken: the limit as it is)
    while low < high:
        middle = (low + high + 1) // 2
        if taken(middle):
            low = middle
        else:
            high = middle - 1
    return low


class AcceptErrors:
    """An event loop's exception handler under which an accept that ran out of
    descriptors (or memory) is said in one line, at most once a minute, and
    anything else goes to the loop's default handler as before.

    asyncio logs ``socket.accept() out of system resource`` with a traceback
    for each failed accept, and its accept loop goes on trying, up to the
    listen backlog's count, before it stops accepting for a second and starts
    again: 1,603 tracebacks, 3.2 MB of log, from 1,000 connections in a test.
    """

    #: Seconds between two lines saying accepts run out.
    EVERY_S = 60.0

    def __init__(self) -> None:
        self._said_at: float | None = None
        self._unsaid = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") != "socket.accept() out of system resource":
            loop.default_exception_handler(context)
            return
        now = loop.time()
        if self._said_at is not None and now - self._said_at < self.EVERY_S:
            self._unsaid += 1
            return
        more = f" ({self._unsaid} more times since)" if self._unsaid else ""
        print(
            f"primeruns serve: cannot accept connections: {exc}{more}; trying again every second",
            file=sys.stderr,
            flush=True,
        )
        self._said_at, self._unsaid = now, 0
