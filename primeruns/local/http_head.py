"""The HTTP/1.1 parser the local platform serves with, and a bound on a
request's head where uvicorn has none.

uvicorn parses with httptools when it is installed and with h11 otherwise.
httptools costs a third less of the platform's CPU per request than h11
(a metrics sync: 0.285 -> 0.189 ms per row), and the platform is on the
path of every benchmark it answers. But uvicorn's httptools protocol bounds
nothing before a request's headers end: httptools gathers a header line,
and uvicorn the URL, however long they grow, before any route or key is
checked (a 52 MB header line was held whole, and so were a chunked body's
trailers; h11 refuses a head past its ``max_incomplete_event_size``). So
the platform takes httptools only through ``BoundedHead``, which counts
what it is fed that moves nothing on and answers 431 past ``HEAD_LIMIT``;
without httptools it names h11, with the same limit.
"""

from __future__ import annotations

import asyncio
import functools

__all__ = ["HEAD_LIMIT", "http_protocol"]

#: A request line and headers, together. The SDK's heads are under 1 KiB; a
#: dashboard's cookie and a browser's headers a few KiB.
HEAD_LIMIT = 64 * 1024

_REFUSAL = b"request head too large"


@functools.cache
def http_protocol() -> type[asyncio.Protocol] | str:
    """uvicorn's ``http`` setting: the bounded httptools protocol, or ``"h11"``."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed
        return "h11"

    class BoundedHead(HttpToolsProtocol):
        """httptools, refusing what is held unparsed past ``HEAD_LIMIT``.

        httptools hands the protocol nothing of a header line (or of a
        chunked body's trailers) until it ends, nor uvicorn the app anything
        of a URL until the head does: a read that ends no head, gives no
        body bytes and ends no request only adds to what is held. Such reads
        in a row are counted, and past the limit the connection is refused.
        asyncio hands over at most 256 KiB a read, so what is held is bounded
        by the limit and two reads (a read that moved something may also
        open what follows, uncounted).
        """

        _held = 0  # bytes of the reads in a row that moved nothing on
        _moved = False  # in the read being fed

        def data_received(self, data: bytes) -> None:
            self._moved = False
            super().data_received(data)
            if self._moved:
                self._held = 0
                return
            if self.transport.is_closing():
                return
            self._held += len(data)
            if self._held > HEAD_LIMIT:
                self.transport.write(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                    b"content-type: text/plain; charset=utf-8\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_REFUSAL), _REFUSAL)
                )
                self.transport.close()

        def on_headers_complete(self) -> None:
            self._moved = True
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            self._moved = True
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._moved = True
            super().on_message_complete()

    return BoundedHead
