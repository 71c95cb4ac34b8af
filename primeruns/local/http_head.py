"""The HTTP/1.1 parser the local platform serves with, and a bound on a
request's head where uvicorn has none.

uvicorn parses with httptools when it is installed and with h11 otherwise.
httptools costs a third less of the platform's CPU per request than h11
(a metrics sync: 0.285 -> 0.189 ms per row), and the platform is on the
path of every benchmark it answers. But uvicorn's httptools protocol bounds
nothing before a request's headers end: httptools gathers a header line,
and uvicorn the URL, however long they grow, before any route or key is
checked (a 52 MB header line was held whole; h11 refuses a head past its
``max_incomplete_event_size``). So the platform takes httptools only
through ``BoundedHead``, which counts the bytes fed while a head is still
open and answers 431 past ``HEAD_LIMIT``; without httptools it names h11,
with the same limit.
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
        """httptools, refusing a head that grows past ``HEAD_LIMIT``.

        asyncio hands over at most 256 KiB a read, so what is held before
        the refusal is bounded by the limit and two reads: a read that ends
        one request may open the next, and is not counted (which of its
        bytes are the next head is not known; a body's end would be taken
        for a head), so a head is counted from the read after it opened.
        """

        _head_open = True  # from the connection's start and after each request
        _head_bytes = 0
        _request_ended = False  # in the read being fed

        def data_received(self, data: bytes) -> None:
            self._request_ended = False
            super().data_received(data)
            if not self._head_open or self._request_ended or self.transport.is_closing():
                return
            self._head_bytes += len(data)
            if self._head_bytes > HEAD_LIMIT:
                self._head_open = False
                self.transport.write(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                    b"content-type: text/plain; charset=utf-8\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_REFUSAL), _REFUSAL)
                )
                self.transport.close()

        def on_headers_complete(self) -> None:
            self._head_open = False
            self._head_bytes = 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._head_open = True
            self._head_bytes = 0
            self._request_ended = True
            super().on_message_complete()

    return BoundedHead
