"""Each HTTP answer of the local platform leaves in one write to its socket.

uvicorn's h11 protocol writes an answer's head as the app sends it, then its
body: two ``send`` calls, two TCP segments, and two wake-ups of the client,
which reads the head and waits again for the body. A sync is one
``POST /rft/metrics`` a row (the contract's), so that second write was paid
per row on both sides: the server's system call and the loopback's delivery,
the client's second read and its thread's second wake-up.

:class:`OneWriteH11Protocol` is uvicorn's h11 protocol (kept for its bounds:
``cli._serve``) with its transport wrapped in :class:`HeldWrites`: what the
protocol writes while it handles an answer is held and goes out in one write
when the answer is complete, or when the connection is closed, or at the
event loop's next turn, whichever comes first. The last one keeps an answer
sent in parts over time (a slow-loris fault's trickle, a streamed page) going
out as it is sent, one turn later; an answer whose head alone is sent (a
fault's dropped connection) still gets its head out before the close. What
is held never passes :data:`HELD_BYTES`: past it, it goes out at once, so a
large answer meets the transport's flow control (uvicorn pauses an app whose
writes the socket does not take) as it did.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HELD_BYTES", "HeldWrites", "OneWriteH11Protocol"]

#: Bytes held at most before they go out (an API answer's head and body are
#: well under it; a page or a file's chunks go out as they come past it).
HELD_BYTES = 64 * 1024


class HeldWrites:
    """An ``asyncio.Transport`` whose writes are held until :meth:`flush`
    (called at the loop's next turn at the latest, and by :meth:`close`).
    Everything else is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._size = 0
        self._turn: asyncio.Handle | None = None
        #: Bytes handed to the transport, all told (``slow_clients`` tells by
        #: them what a client took of answers).
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return  # (h11's end of a body with a length is b"": nothing to hold)
        self._held.append(bytes(data))
        self._size += len(data)
        if self._size >= HELD_BYTES:
            self.flush()
        elif self._turn is None:
            self._turn = self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is held, in one write."""
        if self._turn is not None:
            self._turn.cancel()
            self._turn = None
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            self._size = 0
            self.written += len(data)
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        # Asked several times a request (uvicorn's and ``slow_clients``'s
        # checks): direct, not through ``__getattr__``'s failed lookup first.
        return self._transport.is_closing()

    def abort(self) -> None:
        self._held.clear()
        self._size = 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, each answer written once (:class:`HeldWrites`)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        held = HeldWrites(transport, self.loop)
        super().connection_made(held)  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        # The answer is whole: out now, before a pipelined request is looked at.
        self.transport.flush()  # type: ignore[attr-defined]
        super().on_response_complete()
