"""The answers ``primeruns serve`` sends before any app sees a request.

A request line or a head h11 cannot parse (garbage, a bad header line, a
head past ``cli.HEAD_LIMIT``) never becomes a request: uvicorn's h11 protocol
answers it 400 itself, so the guard, which puts the security headers on
every answer of the app, never saw it, and that 400 went out bare (no CSP,
no ``nosniff``, text a browser could sniff). :class:`ServeH11Protocol` sends
that 400 with the guard's headers, in the platform's ``{"detail"}`` dialect,
naming no server and no version; everything else is
:class:`~.slow_clients.BoundedH11Protocol`'s (deadlines for a client slow
to send, a bound on connections, each answer written once).

A head that parses, followed in the same read by a body that does not (a bad
chunk size), is both: a request the app has started on and a 400 sent at
once. The app's answer then meets a connection that has answered; uvicorn
logged each such request, from anyone who can connect, as an exception with
a traceback. The 400 is the answer: the app is told the client left, as it
is once the close is seen, and what it sends is dropped.
"""

from __future__ import annotations

from .slow_clients import BoundedH11Protocol

__all__ = ["BAD_REQUEST_BODY", "ServeH11Protocol"]

BAD_REQUEST_BODY = b'{"detail": "invalid HTTP request"}'


class ServeH11Protocol(BoundedH11Protocol):
    """The protocol ``serve`` runs: its own 400s carry the security headers."""

    def send_400_response(self, msg: str) -> None:
        # ``msg`` is uvicorn's, and may quote what was sent: not echoed.
        self.answer_and_close(400, BAD_REQUEST_BODY)
