"""The platform API's small calls on the standard library's ``http.client``.

A backlog is one request per metrics row (the wire takes one row per
``POST /rft/metrics``), and a sync drains it as fast as its one interpreter
makes requests: three quarters of a sync's CPU was httpx, httpcore and h11,
which build a request, a URL, headers, a response and its streams for every
call (~290 µs of CPU per call on a kept-alive connection on a 2-core test
machine, against ~85 µs for ``http.client`` doing the same exchange).

So a small call goes here when, and only when, httpx would do nothing more
with it than this module does (``PlatformClient.api`` decides): no testing
transport, httpx's own way out not replaced by a test's mock
(:func:`httpx_as_shipped`), no proxy configured in the environment (httpx
honours one; this module does not), no cookie held, no query parameters. A body goes in writes of
:data:`WRITE_CHUNK` bytes, each within the call's timeout, as httpcore bounds
each of its writes (one ``sendall`` of the whole body would bound it all by
one timeout: a large body on a slow link would be cut off); a write the
server cut short is followed by a read of its answer, as httpcore reads one
(a 413 sent before the body was read is that answer, not a failure to send). TLS is
verified with the process's one context, as httpx's. Failures are raised as
the httpx exceptions httpx raises for the same event (refused, timed out, cut
short), so the SDK maps them exactly as before, ambiguity included.

Nothing here imports httpx or httpcore until a call fails: a process that
has not loaded them (an evaluation script that never imported an HTTP
library) paid ~70-130 ms of CPU for their import in its first ``init()``,
for calls that never went through them (with trio installed, httpcore
imports it too; with click and rich, httpx its command line).

Connections are kept alive and shared by the threads of a client: each is
used by one request at a time, and one the server closed while idle (a
keep-alive timeout) is dropped before use, as httpcore does.
"""

from __future__ import annotations

import http.client
import os
import re
import select
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import FunctionType, ModuleType
from typing import IO, Any

__all__ = [
    "ERROR_BODY_BYTES",
    "MAX_ANSWER_BYTES",
    "WRITE_CHUNK",
    "Answer",
    "AnswerTooLarge",
    "Deadlines",
    "PlainConnections",
    "Target",
    "httpx_as_shipped",
    "importing",
    "load_httpx",
]

#: Bytes of a body sent per write (each within the call's timeout).
WRITE_CHUNK = 64 * 1024
_IDLE_KEPT = 16  # connections kept idle per origin (a shipper's fan-out is 4)
_LINES_KEPT = 64  # header lines kept encoded per client (``_OneWrite.putheader``)
_HEADS_KEPT = 64  # request heads kept per client (``_OneWrite.request``)
_CHUNK = 65536
#: The most bytes of an answer's body read, and once decoded (``client``): the
#: SDK's answers are receipts and pages of a few MB at most. A broken or
#: hostile server's 2 GB body, or an endless stream, is cut off here instead
#: of read into the uplink's memory (all of it, within the call's deadline).
MAX_ANSWER_BYTES = 16 << 20


#: The most of an error's body read (a status of 300 or more): its status says
#: what happened, and its body only names it. Past this, the body is cut
#: there, not refused: a platform's 401 or 422 whose page is large (a
#: validation error quoting a 20 MB push) is still that 401 or 422, never an
#: answer that may have been acted on.
ERROR_BODY_BYTES = 64 << 10


class AnswerTooLarge(Exception):
    """An answer's body went past ``limit`` bytes (``MAX_ANSWER_BYTES``): not
    read further, its connection closed. The caller names the request."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer's body was over {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class Deadlines:
    """A call's bounds: its timeouts, to connect, and for each write, each
    read and the whole answer (as ``httpx.Timeout(read, connect=connect)``
    has them), and the most bytes of its answer read (``answer_bytes``)."""

    connect: float
    read: float
    #: A call whose answer may legitimately be larger says so (a page of the
    #: sample table: each row may be as large as a push).
    answer_bytes: int = MAX_ANSWER_BYTES


# The SDK's lazy imports (httpx, httpcore, certifi) happen in a shipper's
# thread at its first failure, at any time: a fork meanwhile (a user's pool
# of workers) would leave the child the module half imported, its import
# lock held by a thread the child has not, and the child hung for ever at
# its first import of it (the SDK's next failure, or the user's own code).
# A fork waits for such an import to end. Its hook is registered at the
# first lazy import, so that it runs before the hooks registered earlier
# (logging's takes the lock an import that logs needs: waited for after
# it, the import would never end), and it waits a bounded time at most.
_importing = threading.RLock()
_registering = threading.Lock()
_registered = False
_held_for_fork = False
_FORK_WAIT_S = 10.0


def _before_fork() -> None:
    global _held_for_fork
    _held_for_fork = _importing.acquire(timeout=_FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        _importing.release()


def _after_fork_in_child() -> None:
    global _importing, _held_for_fork
    _importing = threading.RLock()
    _held_for_fork = False


def importing() -> AbstractContextManager[object]:
    """Held around a lazy import: no fork happens in the middle of it."""
    global _registered
    if not _registered:
        with _registering:
            if not _registered and hasattr(os, "register_at_fork"):
                os.register_at_fork(
                    before=_before_fork,
                    after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child,
                )
            _registered = True
    return _importing


def load_httpx() -> ModuleType:
    """httpx, imported if it is not yet (see :func:`importing`)."""
    with importing():
        import httpx
    return httpx


def _httpx_error(name: str, message: str) -> Exception:
    """httpx's exception ``name``: httpx is loaded at the first failure only."""
    httpx = load_httpx()
    error: Exception = getattr(httpx, name)(message)
    return error


def _shipped(function: object, module: str, qualname: str) -> bool:
    # The code's own name: a wrapper made with functools.wraps (vcrpy's)
    # copies the original's __module__ and __qualname__, not its code.
    return (
        getattr(function, "__module__", None) == module
        and getattr(getattr(function, "__code__", None), "co_qualname", None) == qualname
    )


def _method(module: str, owner: str, name: str) -> object:
    """``module.owner.name`` if ``module`` is loaded (a half-loaded one has
    not all of it: None, taken as replaced); ``_UNLOADED`` if it is not."""
    loaded = sys.modules.get(module)
    if loaded is None:
        return _UNLOADED
    return getattr(getattr(loaded, owner, None), name, None)


_UNLOADED = object()


def httpx_as_shipped() -> bool:
    """Whether httpx's way out is the one httpx ships. A user's test that
    sees or answers the SDK's requests by replacing it (respx replaces
    httpcore's pool's, pytest-httpx and a monkeypatch httpx's transport's)
    must see every request, as it did when every request went through
    httpx: while it is replaced, nothing goes on the plain path. respx's
    ``using="httpx"`` replaces the client's choice of transport instead.
    A spy on ``httpx.Client.send``, or ``httpx.Client`` swapped for a
    subclass overriding it, is a replacement too: every request of the SDK
    that goes through httpx goes through ``Client.send``.
    A library not loaded yet has nothing replaced (a mock imports it)."""
    loaded = sys.modules.get("httpx")
    if loaded is not None:
        client = getattr(loaded, "Client", None)
        if client is None or client is not getattr(
            sys.modules.get("httpx._client"), "Client", None
        ):
            return False  # httpx.Client is not httpx's (or httpx is half loaded)
    for module, owner, name, home in (
        ("httpx", "Client", "send", "httpx._client"),
        ("httpx", "Client", "_transport_for_url", "httpx._client"),
        ("httpx", "HTTPTransport", "handle_request", "httpx._transports.default"),
        ("httpcore", "ConnectionPool", "handle_request", "httpcore._sync.connection_pool"),
    ):
        function = _method(module, owner, name)
        if function is not _UNLOADED and not _shipped(function, home, f"{owner}.{name}"):
            return False
    return True


@dataclass(frozen=True)
class Target:
    """Where a call goes, split once per API root."""

    scheme: str  # "http" or "https"
    host: str  # as the socket takes it (an IPv6 literal without brackets)
    port: int
    netloc: str  # the Host header: as httpx writes it (small letters, no default port)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class PlainConnections:
    """Kept-alive ``http.client`` connections, per origin, for a client's threads."""

    def __init__(
        self,
        tls: Callable[[], ssl.SSLContext],
        *,
        vet: Callable[[Target, socket.socket], None] | None = None,
    ) -> None:
        """``vet``: called with each new connection, once connected (TLS
        included) and before anything is sent on it; what it raises is the
        call's failure, the connection closed (``PlatformClient._vet``)."""
        self._tls = tls
        self._vet = vet
        self._lock = threading.Lock()
        self._idle: dict[Target, list[http.client.HTTPConnection]] = {}
        self._closed = False  # a call in flight at close() closes its connection after
        self._lines: dict[tuple[str, str], bytes] = {}  # (_OneWrite.putheader)
        self._heads: dict[HeadKey, tuple[bytes, bytes]] = {}  # (_OneWrite.request)

    def request(
        self,
        target: Target,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: Deadlines,
    ) -> Answer:
        """One exchange. Raises httpx's exceptions for what went wrong."""
        budget = timeout.read
        conn = self._take(target)
        if conn is None:
            conn = self._connect(target, timeout.connect)
        # Each call's own deadline: a kept connection was opened by a call
        # that may have had another (``within=``), and a socket keeps its timeout.
        assert conn.sock is not None
        conn.sock.settimeout(budget)
        kept = False
        all_headers = {"Host": target.netloc, **headers}
        sent: bytes | Iterator[memoryview] | None = body
        if body is not None and len(body) > WRITE_CHUNK:
            all_headers["Content-Length"] = str(len(body))
            sent = _pieces(body)
        try:
            try:
                conn.request(method, path, body=sent, headers=all_headers)
            except TimeoutError as exc:
                raise _httpx_error("WriteTimeout", str(exc) or "timed out") from None
            except (OSError, http.client.HTTPException) as exc:
                failed = _httpx_error("WriteError", str(exc) or type(exc).__name__)
                # The server may have answered before it read the whole body
                # (a 413) and closed: that answer is the outcome, as httpcore
                # takes it (a request whose headers never went out has none:
                # http.client refuses to read, and that is this failure).
                if not isinstance(exc, OSError):
                    raise failed from None
                try:
                    answer, _ = _receive(conn, budget, timeout.answer_bytes)
                except Exception:
                    raise failed from None
                return answer  # (the connection is not used again)
            except UnicodeError:
                raise  # a header beyond ASCII: httpx raises the same (``_refuse_illegal``)
            except ValueError as exc:
                # A header h11 (httpx) refuses (a key read from a file with
                # its newline, or with a blank at its end): refused before
                # anything is sent, as httpx refuses it. http.client's text
                # quotes the value, the key: it is not passed on. httpx
                # encodes every header before h11 checks any: one beyond
                # ASCII is what it raises for, wherever it is.
                for name, value in all_headers.items():
                    name.encode("ascii")
                    value.encode("ascii")
                part = exc.part if isinstance(exc, _IllegalHeader) else "value"
                raise _httpx_error("LocalProtocolError", f"illegal header {part}") from None
            answer, kept = _receive(conn, budget, timeout.answer_bytes)
            return answer
        finally:
            if kept:
                self._give_back(target, conn)
            else:
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def _take(self, target: Target) -> http.client.HTTPConnection | None:
        while True:
            with self._lock:
                idle = self._idle.get(target)
                if not idle:
                    return None
                conn = idle.pop()
            if _usable(conn):
                return conn
            conn.close()  # the server closed it while it was idle

    def _give_back(self, target: Target, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(target, [])
            if len(idle) < _IDLE_KEPT and not self._closed:
                idle.append(conn)
                return
        conn.close()

    def _connect(self, target: Target, connect_s: float | None) -> http.client.HTTPConnection:
        conn: _OneWrite
        if target.scheme == "https":
            conn = _HTTPSConnection(
                target.host, target.port, timeout=connect_s, context=self._tls()
            )
        else:
            conn = _HTTPConnection(target.host, target.port, timeout=connect_s)
        try:
            conn.connect()  # TCP, then TLS: httpx names a failure of either a ConnectError
        except TimeoutError as exc:
            conn.close()
            raise _httpx_error("ConnectTimeout", str(exc) or "timed out") from None
        except OSError as exc:
            conn.close()
            raise _httpx_error("ConnectError", str(exc) or type(exc).__name__) from None
        conn.response_class = _Response
        conn.lines = self._lines
        conn.heads = self._heads
        assert conn.sock is not None
        if self._vet is not None:
            try:
                self._vet(target, conn.sock)
            except BaseException:
                conn.close()
                raise
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as httpcore
        return conn


# ``http.client``'s states of a connection (idle; its request line written;
# its request sent): private names, so read once and defensively (another
# Python without them: every request takes ``http.client``'s way).
_IDLE = getattr(http.client, "_CS_IDLE", object())
_REQ_STARTED = getattr(http.client, "_CS_REQ_STARTED", object())
_REQ_SENT = getattr(http.client, "_CS_REQ_SENT", object())
# A kept head sets the state to "sent" itself: without each of the three
# names, none is written again (a state ``http.client`` does not know would
# have its ``getresponse`` refuse every answer).
_STATES_KNOWN = all(
    hasattr(http.client, name) for name in ("_CS_IDLE", "_CS_REQ_STARTED", "_CS_REQ_SENT")
)
#: A request's method, path and headers, as ``_OneWrite.request`` keys its heads.
HeadKey = tuple[str, str, tuple[tuple[str, str], ...]]
#: The steps of ``http.client``'s way that a kept head stands in for.
_STEPS = ("request", "_send_request", "putrequest", "putheader", "endheaders")
# (Looked up on the TLS class: a step replaced on either class is seen there.)
_STEPS_OF: Any = getattr(http.client, "HTTPSConnection", http.client.HTTPConnection)
_shipped_steps: tuple[object, ...] = ()  # the steps last found to be the library's own


def _steps_as_shipped() -> bool:
    """Whether the steps a kept head stands in for are ``http.client``'s own.
    A tracer wraps one to see and tag each request (Sentry's stdlib
    integration, on by default, wraps ``putrequest`` to start a span and add
    its ``sentry-trace`` and ``baggage`` headers; ddtrace wraps ``request``
    and ``putrequest``): a head kept then would carry one request's span to
    every later one, and one kept before would carry none. While any is
    replaced, no head is kept or written again. A step is the library's own
    when it is a plain function of ``http.client``'s, of its name: a wrapper
    made with ``functools.wraps`` copies the name but not the code, and
    wrapt's proxy is no plain function. (Never, without the states' names.)"""
    global _shipped_steps
    # (Each the one found before, by identity: wrapt's proxy compares
    # equal to what it wraps. Spelled out: a backlog's every row asks.)
    of, seen = _STEPS_OF, _shipped_steps
    if (
        seen
        and of.request is seen[0]
        and of._send_request is seen[1]
        and of.putrequest is seen[2]
        and of.putheader is seen[3]
        and of.endheaders is seen[4]
    ):
        return True
    if not _STATES_KNOWN:
        return False
    steps = tuple(getattr(of, name, None) for name in _STEPS)
    for name, step in zip(_STEPS, steps, strict=True):
        if (
            type(step) is not FunctionType
            or step.__globals__ is not vars(http.client)
            or step.__code__.co_qualname != f"HTTPConnection.{name}"
        ):
            return False
    _shipped_steps = steps
    return True


class _OneWrite(http.client.HTTPConnection):
    """A request whose body is bytes (at most :data:`WRITE_CHUNK` of them:
    a longer one is passed as pieces) goes in one write with its head.
    ``http.client`` writes the head, then the body: two ``sendall`` calls,
    two segments with TCP_NODELAY, and a read more for the server, for each
    metrics row of a backlog. The bytes sent are the same, and a write still
    carries at most one piece's worth of body within the call's timeout."""

    #: The heads ``request`` wrote, by method, path and headers, cut around
    #: the Content-Length's value: the ``PlainConnections``' own (set at
    #: connect), shared by its connections.
    heads: dict[HeadKey, tuple[bytes, bytes]] | None = None
    _learning: HeadKey | None = None

    def request(  # type: ignore[override]
        self,
        method: str,
        url: str,
        body: object = None,
        headers: Mapping[str, str] = {},  # (http.client's signature; not mutated)
        *,
        encode_chunked: bool = False,
    ) -> None:
        # A backlog's requests differ in their body alone (a metrics row's
        # method, path and headers are the same for every row), and
        # ``http.client`` builds each head anew: the request line, seven
        # header lines and their checks. A head it once wrote for a body in
        # one write (``_send_output``) is written again as it wrote it, only
        # the body's length in it changed: the same bytes, its checks passed
        # by the same method, path and headers. (With the answer's head read
        # in one piece, ``_whole_head``: a fifth fewer instructions a call.)
        heads = self.heads
        if (
            heads is None
            or type(body) is not bytes
            or not body
            or len(body) > WRITE_CHUNK
            or encode_chunked
            or any(type(k) is not str or type(v) is not str for k, v in headers.items())
            or not _steps_as_shipped()  # (a tracer's wrapper: it sees each request)
        ):
            super().request(method, url, body, headers, encode_chunked=encode_chunked)  # type: ignore[arg-type]
            return
        key = (method, url, tuple(headers.items()))
        head = heads.get(key)
        response = getattr(self, "_HTTPConnection__response", None)
        if (
            head is None
            or getattr(self, "_HTTPConnection__state", None) is not _IDLE
            or (response is not None and not response.isclosed())
        ):
            learn = head is None and not _framed_by_caller(headers)
            if learn and len(heads) >= _HEADS_KEPT:
                # Full of heads used once (a presigned URL's, an upload's
                # own key): begun again, those used again are kept again.
                heads.clear()
            self._learning = key if learn else None
            try:
                super().request(method, url, body, headers, encode_chunked=encode_chunked)
            finally:
                self._learning = None
            return
        # What ``putrequest`` and ``endheaders`` leave behind them, as they do.
        self._HTTPConnection__response = None
        self._HTTPConnection__state = _REQ_SENT
        self._method = method
        self.send(b"%s%d%s%s" % (head[0], len(body), head[1], body))

    def _send_output(self, message_body: object = None, encode_chunked: bool = False) -> None:
        if type(message_body) is not bytes or encode_chunked or not message_body:
            super()._send_output(message_body, encode_chunked)  # type: ignore[misc]
            return
        buffer: list[bytes] = self._buffer  # type: ignore[attr-defined]
        buffer.extend((b"", message_body))  # the head, its blank line, the body
        msg = b"\r\n".join(buffer)
        learning, heads = self._learning, self.heads
        if learning is not None and heads is not None:
            self._keep_head(learning, heads, buffer, len(message_body))
        del buffer[:]
        self.send(msg)

    @staticmethod
    def _keep_head(
        key: HeadKey, heads: dict[HeadKey, tuple[bytes, bytes]], lines: list[bytes], size: int
    ) -> None:
        """Keep the head of ``lines`` (``_send_output``'s buffer: the head's
        lines, a blank one, the body) cut around its one Content-Length's
        value, which is ``size``: ``request`` writes it again with another."""
        length = b"Content-Length: %d" % size
        head = lines[:-2]  # (not the blank line, nor the body)
        if head.count(length) != 1:
            return  # (none: not kept)
        at = head.index(length)
        before = b"\r\n".join(lines[:at]) + b"\r\nContent-Length: "
        after = b"\r\n" + b"\r\n".join(lines[at + 1 : -1]) + b"\r\n"
        heads[key] = (before, after)

    #: The header lines ``putheader`` wrote, by name and value: the
    #: ``PlainConnections``' own (set at connect), shared by its connections.
    lines: dict[tuple[str, str], bytes] | None = None

    def putheader(self, header: str | bytes, *values: object) -> None:
        # A client's requests repeat the same few headers (host, key, type,
        # agent), and ``http.client`` encodes and checks each line again for
        # every request (~5 us for a metrics row's seven). A line it once
        # wrote for a name and a value, both text, is written as it wrote it:
        # the checks are of those alone. Anything else, or a request not
        # started, takes ``http.client``'s way (its checks, its errors).
        # A name or value h11 (httpx) refuses is refused here too
        # (``_refuse_illegal``): ``http.client`` passes a break followed by a
        # blank (a folded line, which a server that does not fold takes for
        # a header of its own), a NUL, a value with blanks around it, a name
        # with blanks or other characters no token has. A line kept was
        # checked when first written.
        lines = self.lines
        if (
            lines is None
            or len(values) != 1
            or type(header) is not str
            or type(values[0]) is not str
            or getattr(self, "_HTTPConnection__state", None) != _REQ_STARTED
        ):
            _refuse_illegal(header, values)
            super().putheader(header, *values)  # type: ignore[arg-type]
            return
        key = (header, values[0])
        line = lines.get(key)
        if line is None:
            _refuse_illegal(header, values)
            super().putheader(header, *values)  # type: ignore[arg-type]
            if header.lower() != "content-length" and len(lines) < _LINES_KEPT:
                lines[key] = self._buffer[-1]  # type: ignore[attr-defined]
            return
        self._buffer.append(line)  # type: ignore[attr-defined]


def _framed_by_caller(headers: Mapping[str, str]) -> bool:
    """Whether ``headers`` frame the body themselves (``http.client`` then
    writes no Content-Length of its own: there is none to write anew)."""
    return any(name.lower() in ("content-length", "transfer-encoding") for name in headers)


# A header's name and value as h11 (httpx) takes them (``h11._abnf``, its
# ``field_name`` and ``field_value``; copied, not imported: h11 is loaded at
# the first failure only). A name is a token: no blank, colon, slash,
# bracket, quote or control. A value is visible characters (a byte beyond
# ASCII counts, as obs-text), with blanks (space, tab) between them only:
# none leading or trailing, no line break, NUL, vertical tab or form feed.
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_FIELD_VALUE = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")


class _IllegalHeader(ValueError):
    """A header name or value h11 refuses (``part``); its text not quoted:
    the value may be the key."""

    def __init__(self, part: str) -> None:
        super().__init__(f"illegal header {part}")
        self.part = part


def _refuse_illegal(header: str | bytes, values: tuple[object, ...]) -> None:
    """Raise what httpx raises, before anything is sent, for a header it
    refuses: UnicodeEncodeError for text beyond ASCII (httpx encodes names
    and text values as ASCII; ``http.client`` as Latin-1, and sent ``é``),
    else _IllegalHeader for what h11 refuses."""
    name = header.encode("ascii") if isinstance(header, str) else bytes(header)
    if not _TOKEN.fullmatch(name):
        raise _IllegalHeader("name")
    for value in values:
        if isinstance(value, str):
            raw = value.encode("ascii")
        elif isinstance(value, bytes | bytearray):
            raw = bytes(value)
        elif isinstance(value, int):
            raw = str(value).encode("ascii")  # (how ``http.client`` writes it)
        else:
            continue  # not one httpx takes: ``http.client``'s own way
        if not _FIELD_VALUE.fullmatch(raw):
            raise _IllegalHeader("value")


class _HTTPConnection(_OneWrite):
    pass


class _HTTPSConnection(_OneWrite, http.client.HTTPSConnection):
    pass


class _Head(http.client.HTTPMessage):
    """An answer's headers (``_parsed_head``), read without the ``email``
    package's per-read parse: each value was decoded from ISO-8859-1, so
    has no surrogate, and ``compat32``'s ``header_fetch_parse`` gives it back
    as stored. Its ``get``, ``get_all`` and ``items`` (a few calls each per
    answer, ~10 µs of a backlog's every request) give what ``Message``'s give."""

    #: The body's length its headers give (``_content_length``), or None.
    length: int | None = None

    # (A name is ASCII, whose small letters are as many: a name of another
    # length is not the one asked for, and is passed over without ``lower``.)
    def get(self, name: str, failobj: Any = None) -> Any:
        name = name.lower()
        size = len(name)
        for key, value in self._headers:  # type: ignore[attr-defined]
            if len(key) == size and key.lower() == name:
                return value
        return failobj

    def get_all(self, name: str, failobj: Any = None) -> Any:
        name = name.lower()
        size = len(name)
        values = [
            value
            for key, value in self._headers  # type: ignore[attr-defined]
            if len(key) == size and key.lower() == name
        ]
        return values or failobj

    def items(self) -> list[tuple[str, str]]:
        return list(self._headers)  # type: ignore[attr-defined]


class _Response(http.client.HTTPResponse):
    """``http.client``'s response, its head read as h11 (httpx) reads one.

    - Every informational answer (1xx) is skipped, and a 101 no upgrade was
      asked for fails. ``http.client`` skips a 100 Continue alone: a 102 or
      a 103 Early Hints was taken as the answer (a 2xx-like status without a
      body), and the real answer, still to come, was left on the kept-alive
      connection to be read as the next request's.
    - The headers are split here, not by the ``email`` package
      (``http.client.parse_headers``): its feed parser was a sixth of a
      sync's CPU, 15-50 µs an answer for four short headers (this: ~3). A
      line that is no header, a head cut short or over 100 KiB, a
      ``Content-Length`` that is not one number and a ``Transfer-Encoding``
      but ``chunked`` fail (``RemoteProtocolError``), as h11 fails them,
      where ``http.client`` read past them; a body is framed as h11 frames
      it (none for a 204 or a 304, whatever the headers say).
    """

    def begin(self) -> None:
        # http.client's own begin(), but for the head's parse (above).
        while True:
            version, status, reason = self._read_status()  # type: ignore[attr-defined]
            if status == http.client.SWITCHING_PROTOCOLS:
                raise http.client.HTTPException(
                    "101 Switching Protocols, and no upgrade was asked for"
                )
            if not 100 <= status < 200:
                break
            _parsed_head(self.fp)  # an informational answer's headers, checked as h11 checks them
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        self.headers = self.msg = _parsed_head(self.fp)
        self.chunk_left = None
        self.will_close = self._check_close()  # type: ignore[attr-defined]
        # The body's framing, as h11's: none for a 204, a 304 or a HEAD's
        # answer, whatever its headers say; else chunked; else the length.
        self.chunked = False
        if status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED) or self._method == "HEAD":  # type: ignore[attr-defined]
            self.length = 0
        elif self.headers.get("transfer-encoding") is not None:
            self.chunked = True
            self.length = None
        else:
            self.length = self.headers.length  # (checked by _parsed_head)
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True  # its end is where the server closes


#: The bytes of a head's header lines: httpcore has h11 refuse a head
#: longer than 100 KiB (however many lines it has, however long each).
_MAX_HEAD = 100 * 1024
#: A header line's text (ISO-8859-1): its name, a token (RFC 9110 5.1), a
#: colon, and its value, blanks around it to be cut, any bytes but NUL, a
#: line break, a form feed or a vertical tab (h11's field-value, checked
#: without its regex: h11's takes a time quadratic in a run of blanks,
#: seconds for one 40 KB header line; this one's is linear).
_FIELD = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+):([^\x00\n\r\x0b\x0c]*)")
#: A Content-Length's digits: h11 takes at most 20.
_LENGTH = re.compile(r"[0-9]{1,20}")


def _head_lines(fp: IO[bytes]) -> list[bytes]:
    """The lines of a head up to the blank line that ends it, line ends cut
    (a line feed, and a carriage return before it), a folded line joined to
    the one before by a space (obsolete line folding). Raised once the whole
    head is read: a head over 100 KiB or cut short, then a first line that is
    a continuation (one loop, not a pass over the lines for each: a
    backlog's every answer has eight header lines)."""
    whole = _whole_head(fp)
    if whole is not None:
        return whole
    joined: list[bytes] = []
    continuation_first = False
    left = _MAX_HEAD
    while True:
        line = fp.readline(left + 1)
        left -= len(line)
        if left < 0:
            raise http.client.HTTPException("the answer's head is longer than 100 KiB")
        if not line.endswith(b"\n"):
            raise http.client.HTTPException("the answer's head was cut short")
        line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        if not line:
            break
        if line[:1] in (b" ", b"\t"):  # obsolete line folding
            if joined:
                joined[-1] += b" " + line.lstrip(b" \t")
            else:
                continuation_first = True
        else:
            joined.append(line)
    if continuation_first:
        raise http.client.HTTPException("the answer's first header line is a continuation")
    return joined


def _whole_head(fp: IO[bytes]) -> list[bytes] | None:
    """:func:`_head_lines` of a head already read whole into ``fp``'s
    buffer (an answer comes in one segment) and plain: every line ended by
    CRLF, none folded. Taken in one read, not a ``readline`` a line; None
    (nothing taken) for any other, which ``_head_lines`` reads line by line."""
    peek = getattr(fp, "peek", None)
    if peek is None:
        return None
    buffered: bytes = peek(0)[:_MAX_HEAD]
    if buffered.startswith(b"\r\n"):
        fp.read(2)
        return []
    end = buffered.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buffered[:end]
    if (
        head.count(b"\n") != head.count(b"\r\n")
        or b"\r\n " in head
        or b"\r\n\t" in head
        or head[:1] in (b" ", b"\t")
    ):
        return None
    fp.read(end + 4)
    return head.split(b"\r\n")


def _parsed_head(fp: IO[bytes]) -> _Head:
    """The headers of an answer, names and values as h11 reads them: a value's
    surrounding blanks cut, a folded line joined to its header by a space.
    What h11 refuses in any head is refused: a Content-Length that is not
    one number, a Transfer-Encoding but one ``chunked``."""
    message = _Head()
    headers: list[tuple[str, str]] = message._headers  # type: ignore[attr-defined]
    for line in _head_lines(fp):
        # A name (a token: ASCII, so its ISO-8859-1 text is its ASCII text),
        # its colon, and a value without the bytes a value may not hold
        # (blanks around it are none of them): one match of the line's text.
        field = _FIELD.fullmatch(line.decode("iso-8859-1"))
        if field is None:
            raise http.client.HTTPException("a line of the answer's head is no header")
        headers.append((field[1], field[2].strip(" \t")))  # (Message.set_raw)
    codings = message.get_all("transfer-encoding") or ()
    if len(codings) > 1 or any(coding.lower() != "chunked" for coding in codings):
        raise http.client.HTTPException("the answer's Transfer-Encoding is not chunked alone")
    message.length = _content_length(message)
    return message


def _content_length(headers: http.client.HTTPMessage) -> int | None:
    """The body's length the headers give, or None for none (one read till
    the server closes). Several, or a list in one, must agree, and each be
    at most 20 digits alone: ``int()`` would read "+5" or "1_0", which h11
    refuses, and fail a number of 4,301 digits with a ValueError."""
    values = {
        part.strip(" \t")
        for value in headers.get_all("content-length") or ()
        for part in value.split(",")
    }
    if not values:
        return None
    value = values.pop()
    if values or not _LENGTH.fullmatch(value):
        raise http.client.HTTPException("the answer's Content-Length is not one number")
    return int(value)


def _pieces(body: bytes) -> Iterator[memoryview]:
    """``body`` in writes of :data:`WRITE_CHUNK` bytes (``http.client`` sends
    each with one ``sendall``, within the socket's timeout)."""
    view = memoryview(body)
    for at in range(0, len(view), WRITE_CHUNK):
        yield view[at : at + WRITE_CHUNK]


def _usable(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection may carry a request: still open, with
    nothing waiting to be read (an idle connection that reads is one the
    server closed, or wrote to unasked)."""
    sock = conn.sock
    if sock is None:
        return False
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return not poll.poll(0)


def _receive(
    conn: http.client.HTTPConnection, budget: float, limit: int = MAX_ANSWER_BYTES
) -> tuple[Answer, bool]:
    """The answer, read whole within ``budget`` seconds (a server trickling
    its body one byte a second is cut off, as ``PlatformClient._bounded``
    does for httpx) and ``limit`` bytes (``AnswerTooLarge``; an error's
    body is cut at ``ERROR_BODY_BYTES`` instead), and whether the
    connection may be used again."""
    deadline = time.monotonic() + budget
    response: http.client.HTTPResponse | None = None
    cut = False  # an error's body cut at ERROR_BODY_BYTES: the connection is not reused
    try:
        response = conn.getresponse()
        error = response.status >= 300
        if error:
            limit = min(limit, ERROR_BODY_BYTES)
        elif response.length is not None and response.length > limit:
            raise AnswerTooLarge(limit)  # said so: nothing of it is read
        chunks: list[bytes] = []
        size = 0
        short = False  # an error's chunked body cut short (a stated length: ``length`` left)
        while True:
            try:
                chunk = response.read1(_CHUNK)
            except http.client.IncompleteRead:
                if not error:
                    raise
                short = True
                break
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # (chunked, or a length that lied)
                if not error:
                    raise AnswerTooLarge(limit)
                chunks[-1] = chunk[: len(chunk) - (size - limit)]
                cut = True
                break
            if time.monotonic() > deadline:
                raise _httpx_error(
                    "ReadTimeout", f"the response did not arrive within {budget:g} s"
                )
        # read1 ends quietly at an early end of a stated length
        if (short or response.length) and not cut:
            if not error:
                raise http.client.IncompleteRead(b"".join(chunks), response.length)
            # An error's status came whole and says what happened; its body
            # only names it. Cut short (a gateway giving up on a large error
            # page) it was an IncompleteRead: transient and ambiguous, a 401
            # retried as long as the run lived. Its connection is not reused.
            cut = True
        # Read out, but only read() marks it so: the connection then takes
        # its next request.
        response.close()
    except TimeoutError as exc:
        raise _httpx_error("ReadTimeout", str(exc) or "timed out") from None
    except http.client.HTTPException as exc:  # cut short, not HTTP, a line too long
        raise _httpx_error("RemoteProtocolError", str(exc) or type(exc).__name__) from None
    except OSError as exc:
        raise _httpx_error("ReadError", str(exc) or type(exc).__name__) from None
    finally:
        if response is not None:
            # Given up on, an answer that said it would close holds the
            # socket (the connection handed it over), and so would the
            # error, which holds this frame: a shipper keeps its last one
            # through its back-off.
            response.close()
    answer = Answer(response.status, response.getheaders(), b"".join(chunks))
    return answer, not (response.will_close or cut)
