"""The answers ``primeruns serve`` sends before any app sees a request.

A request line or a head h11 cannot parse (garbage, a bad header line, a
head past ``cli.HEAD_LIMIT``) never becomes a request: uvicorn's h11 protocol
answers it 400 itself, so the guard, which puts the security headers on
every answer of the app, never saw it, and that 400 went out bare (no CSP,
no ``nosniff``, text a browser could sniff). :class:`ServeH11Protocol` sends
that 400 with the guard's headers, in the platform's ``{"detail"}`` dialect,
naming no server and no version; everything else is
:class:`~.one_write.OneWriteH11Protocol`'s.

A head that parses, followed in the same read by a body that does not (a bad
chunk size), is both: a request the app has started on and a 400 sent at
once. The app's answer then meets a connection that has answered; uvicorn
logged each such request, from anyone who can connect, as an exception with
a traceback. The 400 is the answer: the app is told the client left, as it
is once the close is seen, and what it sends is dropped.
"""

from __future__ import annotations

import h11

from .guard import SECURITY_HEADERS
from .one_write import OneWriteH11Protocol

__all__ = ["BAD_REQUEST_BODY", "ServeH11Protocol"]

BAD_REQUEST_BODY = b'{"detail": "invalid HTTP request"}'


class ServeH11Protocol(OneWriteH11Protocol):
    """The protocol ``serve`` runs: its own 400s carry the security headers."""

    def send_400_response(self, msg: str) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BAD_REQUEST_BODY)).encode()),
            (b"connection", b"close"),
            *SECURITY_HEADERS,
        ]
        try:
            data = self.conn.send(h11.Response(status_code=400, headers=headers))
            data = (data or b"") + (self.conn.send(h11.Data(data=BAD_REQUEST_BODY)) or b"")
            data += self.conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            # An answer of ours was already under way on this connection (the
            # bad bytes were pipelined behind a request): nothing more can
            # be said on it, only closed, as uvicorn's own 400 would fail to.
            data = b""
        if data:
            self.transport.write(data)
        self.transport.close()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # What connection_lost will say, said before the app's next turn.
            cycle.disconnected = True
            cycle.message_event.set()
