"""One HTTP client for the three peers a run talks to: the platform API, the
Prime Traces service and the object store behind presigned URLs.

A call here is exactly one attempt: it returns the decoded JSON object or
raises from the SDK's exception family (:mod:`.errors`). Retrying, backing off
and deciding what a failure means belong to the shippers, which know whether
a batch may be resent; this module knows nothing of threads or journals.

Thread-safe (httpx pools connections across threads). Fork-aware: a forked
child never reuses the parent's sockets; it builds its own pool on first use.
Every client of a process verifies TLS with one context (``tls_context``):
building one loads the CA bundle, which cost more than a one-episode run's
shipping, and a run builds several clients (its registration, the
environments it resolves, its uplink's).

The platform API's and Prime Traces' calls go on the standard library's
``http.client`` instead, where httpx would add nothing (:mod:`.plain` says
when): a backlog of metrics rows is bound by the client's CPU per call, and a
process that has not loaded httpx does not load it for them (httpx is
imported when a call needs it: a testing transport, a query, a cookie, a
presigned upload, an answer to decode as httpx decodes it).

``transport`` is the testing seam (as in httpx itself): an
``httpx.MockTransport`` answers every request of the three peers in-process,
so a sink is tested in milliseconds without a server. ``default_transport``
is the same seam for the clients a run builds itself (set by
``primeruns.testing.use_transport``, for a user's test).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform as _platform
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..ascii_digits import declared_over
from ..exceptions import UnprovenAnswerError
from ..loopback_owner import (
    ServedByAnotherUserError,
    connected_to_another_user,
    taken_by_another_user,
)
from . import plain as plain_module
from .errors import error_from_response, error_from_transport, oversize_answer
from .plain import (
    AnswerTooLarge,
    Deadlines,
    PlainConnections,
    Target,
    httpx_as_shipped,
    importing,
    load_httpx,
)
from .presigned_log import uploading_presigned
from .settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    import httpx

__all__ = ["PlatformClient", "json_body"]

_PLATFORM_TIMEOUT = Deadlines(connect=10.0, read=60.0)
_TRACES_TIMEOUT = Deadlines(connect=10.0, read=120.0)
_UPLOAD_TIMEOUT = Deadlines(connect=10.0, read=300.0)

#: The transport of a client built without one (None: httpx's, the network).
#: Only ``primeruns.testing.use_transport`` sets it, for the length of a test.
default_transport: httpx.BaseTransport | None = None


_tls_lock = threading.Lock()
_tls: ssl.SSLContext | None = None


def tls_context() -> ssl.SSLContext:
    """This process's TLS context, built on first use as httpx builds its
    default one (``SSL_CERT_FILE``, else ``SSL_CERT_DIR``, else certifi's CA
    bundle) and shared by every client: a context may verify many
    connections. Built here, not by httpx, which it would load."""
    global _tls
    with importing(), _tls_lock:  # (certifi may be imported: no fork meanwhile)
        if _tls is None:
            if cafile := os.environ.get("SSL_CERT_FILE"):
                _tls = ssl.create_default_context(cafile=cafile)
            elif capath := os.environ.get("SSL_CERT_DIR"):
                _tls = ssl.create_default_context(capath=capath)
            else:
                import certifi  # httpx's own requirement

                _tls = ssl.create_default_context(cafile=certifi.where())
        return _tls


def _httpx_timeout(deadlines: Deadlines) -> httpx.Timeout:
    import httpx

    return httpx.Timeout(deadlines.read, connect=deadlines.connect)


@functools.cache
def _user_agent() -> str:
    from .. import __version__

    return f"prime-runs/{__version__} python/{_platform.python_version()}"


# ``json.dumps`` with arguments builds a new encoder for each call, a third
# of its time for a metrics row's body (one per row of a backlog); this one
# is built once and holds no state between calls (the same bytes).
_BODY_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _without_the_header(exc: UnicodeEncodeError) -> UnicodeEncodeError:
    """``exc`` (a header httpx cannot encode as ASCII: an API key pasted with
    a character beyond it) with what it held masked but the character at
    fault: its text is the same, but its arguments held the whole header
    (``Bearer <key>``), which a ``repr`` of it, a caller's log or a
    traceback's locals would show."""
    text = exc.object if isinstance(exc.object, str) else ""
    start, end = exc.start, exc.end
    masked = "*" * start + text[start:end] + "*" * max(len(text) - end, 0)
    return UnicodeEncodeError(exc.encoding, masked, start, end, exc.reason)


def json_body(value: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON for a request body; NaN/Infinity refused (ValueError)."""
    return _BODY_ENCODER.encode(value).encode()


def _decode(response: httpx.Response) -> dict[str, Any]:
    return _decoded(
        response.content, response.status_code, response.request.method, response.request.url.path
    )


def _decoded(content: bytes, status: int, method: str, path: str) -> dict[str, Any]:
    """A 2xx's JSON object (an empty body is ``{}``, an array ``{"data": [...]}``,
    as the vendor's client has them). Any other body (a maintenance page, JSON
    cut short, a bare string) is no answer at all: the request may or may not
    have been acted on, so it is an ambiguous, transient failure, never fatal
    for the sink that sent it."""
    if not content:
        return {}
    what = "not JSON"
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):  # (nested past the recursion limit: no answer either)
        pass
    else:
        if isinstance(data, list):
            return {"data": data}
        if isinstance(data, dict):
            return data
        what = "not a JSON object"
    raise UnprovenAnswerError(
        f"HTTP {status} from {method} {path}: the body is {what} (a gateway's or "
        "maintenance page?); the request may or may not have been acted on",
        status_code=status,
    )


# Raw bytes of a compressed answer decoded at a time. A decoder decodes all it
# is given in one call, and a few bytes of zstd decode to 128 KiB: one 64 KiB
# chunk of a compression bomb was 2 GiB before a byte of it was counted.
# 512 of them decode to 16 MiB at most.
_DECODE_SLICE = 512


def _decoded_pieces(response: httpx.Response) -> Iterator[bytes]:
    """A streamed response's body, decoded a slice of raw bytes at a time
    (``_DECODE_SLICE``), with httpx's decoder for its Content-Encoding. An
    answer in several encodings at once (``gzip, gzip``: each multiplies
    what the one before it decoded to) raises DecodingError: no peer of
    the SDK sends one."""
    import httpx

    codings = [
        value.strip().lower()
        for value in response.headers.get_list("content-encoding", split_commas=True)
        if value.strip().lower() not in ("", "identity")
    ]
    make = getattr(response, "_get_content_decoder", None)  # (httpx's own, since 0.18)
    if not codings or make is None:
        yield from response.iter_raw() if not codings else response.iter_bytes()
        return
    if len(codings) > 1:
        raise httpx.DecodingError(
            f"an answer in several encodings at once ({', '.join(codings)}) is not taken",
            request=response.request,
        )
    decoder = make()
    for raw in response.iter_raw():
        for at in range(0, len(raw), _DECODE_SLICE):
            if piece := decoder.decode(raw[at : at + _DECODE_SLICE]):
                yield piece
    if tail := decoder.flush():
        yield tail


def _read_within(
    response: httpx.Response,
    deadline: float | None = None,
    budget: float = 0.0,
    limit: int = plain_module.MAX_ANSWER_BYTES,
) -> httpx.Response:
    """``response`` (streamed) read out, its body decoded, within ``limit``
    bytes (``plain.MAX_ANSWER_BYTES`` unless the call says; raw bytes count,
    and decoded ones: a small compressed body can decode to gigabytes) and
    by ``deadline`` (a ``time.monotonic()``, ``budget`` seconds after the
    request went; None: none). Rebuilt without its Content-Encoding, so that the body is not
    decoded again. Raises AnswerTooLarge past the limit (an error's body,
    of a status of 300 or more, is cut at ``plain.ERROR_BODY_BYTES``
    instead), httpx's ReadTimeout
    past the deadline, DecodingError for a body not in its encoding
    (``_decoded_pieces``)."""
    import httpx

    # An error's status says what happened; its body, cut past
    # ``plain.ERROR_BODY_BYTES``, only names it (a 401 is no unproven answer).
    error = response.status_code >= 300
    declared = response.headers.get("content-length", "")
    if error:
        limit = min(limit, plain_module.ERROR_BODY_BYTES)
    elif declared_over(declared, limit):
        raise AnswerTooLarge(limit)  # said so: nothing of it is read
    chunks: list[bytes] = []
    size = 0
    pieces = _decoded_pieces(response)
    while True:
        try:
            chunk = next(pieces, None)
        except httpx.RemoteProtocolError:
            if not error:
                raise
            # Cut short (the connection closed before its stated length): an
            # error's status came whole and is the answer, as on the plain
            # path (``plain._receive``); httpx does not reuse the connection.
            break
        if chunk is None:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            if not error:
                raise AnswerTooLarge(limit)
            chunks[-1] = chunk[: len(chunk) - (size - limit)]
            break
        if deadline is not None and time.monotonic() > deadline:
            raise httpx.ReadTimeout(
                f"the response did not arrive within {budget:g} s", request=response.request
            )
    headers = [  # as sent (a Latin-1 value is no ASCII string)
        (name, value)
        for name, value in response.headers.raw
        if name.lower() not in (b"content-encoding", b"content-length")
    ]
    return httpx.Response(
        response.status_code,
        headers=headers,
        content=b"".join(chunks),
        request=response.request,
        extensions=response.extensions,
    )


# Headers of an answer that httpx must see: a body to decode, a cookie to keep.
_TAKEN_BY_HTTPX = frozenset({"content-encoding", "set-cookie", "set-cookie2"})

# A path httpx sends as it is (it percent-encodes anything else): the plain
# path takes only these, and leaves the rest to httpx.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/%-]*")


# A query's key or value that httpx writes as it is (it percent-encodes the rest).
_QUERY_WORD = re.compile(r"[A-Za-z0-9._~-]+")


def _plain_query(params: Mapping[str, Any] | None) -> str | None:
    """The query httpx writes for ``params`` (``?page=2&limit=100``), where
    each key and value is a word it writes as it is (an int, not a bool:
    httpx writes ``true``); None for any other, which httpx takes."""
    if not params:
        return ""
    words = []
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int | str):
            return None
        text = str(value)
        if not (_QUERY_WORD.fullmatch(key) and _QUERY_WORD.fullmatch(text)):
            return None
        words.append(f"{key}={text}")
    return "?" + "&".join(words)


# A query httpx sends as it is: what it leaves unquoted, and escapes whole.
_PLAIN_QUERY = re.compile(r"(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})+")


def _plain_target(url: str, *, query: bool = False) -> tuple[Target, str] | None:
    """Where calls to ``url`` (an API root; with ``query``, a presigned
    URL, its query included) go on the plain path, and the path (and
    query) they start with; None for a URL httpx should take (userinfo,
    which httpx turns into Basic auth; a query, or one httpx would quote;
    another scheme; a host name beyond ASCII, which httpx sends in its
    ``xn--`` form and http.client would not; a path with ``.`` or ``..``
    segments, which httpx resolves). The Host header is the one httpx
    writes (the host name in small letters, a default port left out): a
    presigned URL's signature covers it."""
    try:
        parts = urlsplit(url)
        default = 443 if parts.scheme == "https" else 80
        port = default if parts.port is None else parts.port
    except ValueError:
        return None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or "%" in parts.hostname
        or not parts.netloc.isascii()
        or "@" in parts.netloc
        or (parts.query and not (query and _PLAIN_QUERY.fullmatch(parts.query)))
        or parts.fragment
        or url.endswith(("?", "#"))
        or not _PLAIN_PATH.fullmatch(parts.path)
        or {".", ".."} & set(parts.path.split("/"))
    ):
        return None
    path = f"{parts.path or '/'}?{parts.query}" if parts.query else parts.path
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if port == default else f"{host}:{port}"
    return Target(parts.scheme, parts.hostname, port, netloc), path


def _proxies() -> dict[str, str]:
    """``urllib.request.getproxies()``, without importing urllib.request
    (~1-2 ms of every run's ``init()``) where it could only answer ``{}``:
    where it reads the environment alone (not macOS's or Windows' system
    settings) and no variable is named ``*_proxy``, in any case."""
    if sys.platform not in ("darwin", "win32") and not any(
        name.lower().endswith("_proxy") for name in os.environ
    ):
        return {}
    with importing():  # (a client may be made in a shipper's thread: no fork meanwhile)
        import urllib.request

    return urllib.request.getproxies()


def _site_key(url: str) -> tuple[str, int] | None:
    """Where ``url`` connects to: its host (small letters, an IPv6 address
    without brackets) and port (the scheme's by default), as ``Target``
    has them; None for a URL that does not say."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname, port if port is not None else (443 if parts.scheme == "https" else 80)


def _guarded(settings: Settings) -> dict[tuple[str, int], tuple[str, str]]:
    """Per host and port a journal chose on loopback (``Settings.journal_chosen``),
    what it is and its URL, for a refusal to name."""
    found: dict[tuple[str, int], tuple[str, str]] = {}
    platform = _site_key(settings.origin)
    for url in settings.journal_chosen:
        key = _site_key(url)
        if key is not None:
            found.setdefault(key, ("platform" if key == platform else "Prime Traces", url))
    return found


class PlatformClient:
    """Single-attempt requests to the platform, traces service and object store."""

    def __init__(self, settings: Settings, *, transport: httpx.BaseTransport | None = None) -> None:
        self.settings = settings
        self._transport = transport if transport is not None else default_transport
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._http: httpx.Client | None = None
        self._storage: httpx.Client | None = None
        self._plain: PlainConnections | None = None
        # The plain path (``platform.plain``) for the API's and Prime Traces'
        # calls: never with a testing transport, nor with a proxy configured
        # (httpx honours the environment's; the plain path does not).
        self._plain_api: tuple[Target, str] | None = None
        self._plain_traces: tuple[Target, str] | None = None
        proxies = _proxies()  # "no": NO_PROXY alone, which routes nothing
        self._plain_ok = self._transport is None and not set(proxies) - {"no"}
        # The loopback ports a journal chose: each new connection to one is
        # checked for another user's socket before anything is sent on it
        # (``loopback_owner``), on either path. Every other target pays a
        # dict lookup per new connection, and a kept-alive one nothing.
        self._guarded = _guarded(settings)
        if self._plain_ok:
            self._plain_api = _plain_target(settings.api_root)
            self._plain_traces = _plain_target(settings.traces_url + "/api/v1")

    # -- connection pools -------------------------------------------------
    def _forget_if_forked(self) -> None:
        """(Under the lock.) Inherited across fork, the sockets are the
        parent's: dropped, never closed."""
        if self._pid != os.getpid():
            self._http = self._storage = None
            self._plain = None
            self._pid = os.getpid()

    def _connections(self) -> PlainConnections:
        with self._lock:
            self._forget_if_forked()
            if self._plain is None:
                vet = self._vet_plain if self._guarded else None
                self._plain = PlainConnections(tls_context, vet=vet)
            return self._plain

    def _clients(self) -> tuple[httpx.Client, httpx.Client]:
        with importing():  # (httpx's transport imports httpcore: loaded here)
            import httpcore  # noqa: F401
            import httpx

            from .cookies import keep_cookies_lazily

        with self._lock:
            self._forget_if_forked()
            if self._http is None or self._storage is None:
                # No redirect is followed: httpx strips only Authorization on
                # an origin change, so x-api-key and the body would go to
                # wherever a 3xx points, https or not. A 3xx is an error
                # naming the target (errors.error_from_response).
                tls = tls_context() if self._transport is None else None
                # A journal's loopback platform is this machine's: called
                # directly, whatever proxy the environment names (through
                # one, the key went to the proxy's machine's port, and a
                # kept-alive connection to the proxy was never checked).
                direct: dict[str, httpx.BaseTransport | None] = {
                    f"all://[{host}]" if ":" in host else f"all://{host}": None
                    for host, _ in self._guarded
                }
                self._http = keep_cookies_lazily(
                    httpx.Client(
                        follow_redirects=False,
                        mounts=direct,
                        timeout=_httpx_timeout(_PLATFORM_TIMEOUT),
                        headers={"User-Agent": _user_agent()},
                        transport=self._transport,
                        verify=True if tls is None else tls,
                    )
                )
                # Presigned URLs carry their own credentials: no auth, no redirects.
                self._storage = keep_cookies_lazily(
                    httpx.Client(
                        follow_redirects=False,
                        mounts=direct,
                        timeout=_httpx_timeout(_UPLOAD_TIMEOUT),
                        transport=self._transport,
                        verify=True if tls is None else tls,
                    )
                )
            return self._http, self._storage

    def _plain_for(
        self, root: tuple[Target, str] | None, path: str, *, storage: bool = False
    ) -> tuple[Target, str] | None:
        """Where a call to ``path`` under ``root`` goes on the plain path
        (its target and full path), or None: it goes through httpx (of the
        object store's client with ``storage``)."""
        if root is None or not _PLAIN_PATH.fullmatch(path.partition("?")[0]):
            return None  # (a query there is a presigned URL's, checked by _plain_target)
        with self._lock:
            client = self._storage if storage else self._http
            if self._pid != os.getpid():
                client = None
        if client is not None and client.cookies:
            return None  # httpx sends them back; the plain path would not
        if not httpx_as_shipped():
            return None
        return root[0], root[1] + path

    # -- a journal's loopback platform, at each new connection ------------------
    def _vet(self, key: tuple[str, int], sock: socket.socket | None) -> None:
        """Raise ServedByAnotherUserError if ``sock``, a new connection to
        ``key`` (one the journal chose), reached another user's socket, or
        another user listens on its port: a neighbour took the port while
        the platform was down. Nothing has been sent on it yet."""
        what, url = self._guarded[key]
        uid = connected_to_another_user(sock, key[1])
        if uid is not None:
            message = taken_by_another_user(what, url, uid, now=True)
            raise ServedByAnotherUserError(message, url=url, uid=uid)

    def _vet_plain(self, target: Target, sock: socket.socket) -> None:
        key = (target.host, target.port)
        if key in self._guarded:
            self._vet(key, sock)

    def _tracing(self, url: str) -> dict[str, Any] | None:
        """The extensions of an httpx request to ``url``: where the journal
        chose its port, httpcore's trace, whose end of a TCP connect (a new
        connection, before TLS or a byte of the request) checks the socket."""
        key = _site_key(url) if self._guarded else None
        if key is None or key not in self._guarded:
            return None

        def trace(event: str, info: Mapping[str, Any]) -> None:
            if event != "connection.connect_tcp.complete":
                return
            stream = info.get("return_value")
            try:
                self._vet(key, stream.get_extra_info("socket") if stream is not None else None)
            except ServedByAnotherUserError:
                if stream is not None:
                    stream.close()  # (httpcore drops a stream it never got back)
                raise

        return {"trace": trace}

    def _auth_headers(self, *, traces: bool) -> dict[str, str]:
        key = self.settings.api_key
        headers: dict[str, str] = {}
        if key:
            headers["Authorization"] = f"Bearer {key}"
            if self.settings.internal and not traces:
                headers["x-api-key"] = key
        if traces and self.settings.team_id:
            headers["X-Prime-Team-ID"] = self.settings.team_id
        return headers

    def _send(
        self,
        client: httpx.Client,
        method: str,
        url: str,
        *,
        content: bytes | None,
        headers: Mapping[str, str],
        params: Mapping[str, Any] | None,
        timeout: Deadlines,
    ) -> httpx.Response:
        import httpx

        request = client.build_request(
            method,
            url,
            content=content,
            headers=headers,
            params=params,
            timeout=_httpx_timeout(timeout),
            extensions=self._tracing(url),
        )
        try:
            response = self._bounded(client, request, timeout.read, timeout.answer_bytes)
        # DecodingError (a body not in its Content-Encoding) is no TransportError
        # to httpx, but it is a failure on the response's path all the same.
        except (httpx.TransportError, httpx.DecodingError, AnswerTooLarge) as exc:
            # The origin too: a sink pointed at the wrong host (PRIME_TRACES_URL
            # left at production beside a local platform) is then named. Worked
            # out only on failure: a backlog is thousands of requests.
            target = request.url
            where = f"{method} {target.scheme}://{target.netloc.decode('ascii')}{target.path}"
            if isinstance(exc, AnswerTooLarge):
                raise oversize_answer(where, exc.limit) from None
            raise error_from_transport(exc, where) from None
        if response.status_code >= 300:
            raise error_from_response(response)
        return response

    @staticmethod
    def _bounded(
        client: httpx.Client,
        request: httpx.Request,
        budget: float,
        limit: int = plain_module.MAX_ANSWER_BYTES,
    ) -> httpx.Response:
        """Send ``request`` and read its response within one overall deadline.

        httpx's read timeout is per read: a server trickling one byte just
        inside it (a slow-loris) would hold a shipper thread, or finish(),
        for hours. The whole response must arrive within the read timeout,
        and be no larger than ``limit`` bytes (``_read_within``):
        a 2 GB body or an endless stream was read into memory whole.
        """
        import httpx

        deadline = time.monotonic() + budget
        response = client.send(request, stream=True)
        if response.is_stream_consumed:
            # Answered with its body in hand (an httpx.MockTransport).
            if len(response.content) > limit and response.status_code < 300:
                raise AnswerTooLarge(limit)
            return response
        try:
            return _read_within(response, deadline, budget, limit)
        finally:
            response.close()
            # The streamed response and its stream refer to each other: left
            # so, each request's response, request and headers stay until a
            # full collection, which the uplink seldom runs (a backlog kept
            # ~1,000 of them, 10-20 MB). Cut, reference counting frees them.
            response.stream = httpx.ByteStream(b"")

    def _exchange(
        self,
        plain: tuple[Target, str] | None,
        url: str,
        method: str,
        *,
        content: bytes | None,
        headers: dict[str, str],
        params: Mapping[str, Any] | None,
        timeout: Deadlines,
    ) -> dict[str, Any]:
        """One call to ``url``: on the plain path where ``plain`` says it
        may go (and httpx would write its query as :func:`_plain_query` does),
        else through httpx. A header beyond ASCII raises UnicodeEncodeError
        on both paths, as httpx does, but not holding the header (the key):
        :func:`_without_the_header`."""
        try:
            query = None if plain is None else _plain_query(params)
            if plain is not None and query is not None:
                return self._plain_call(
                    plain[0], method, plain[1] + query, content, headers, timeout
                )
            http, _ = self._clients()
            response = self._send(
                http, method, url, content=content, headers=headers, params=params, timeout=timeout
            )
            return _decode(response)
        except UnicodeEncodeError as exc:
            refused = _without_the_header(exc)
        raise refused  # (outside the handler: the original, key and all, is not its context)

    # -- the three peers ----------------------------------------------------
    def api(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | bytes | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        within: float | None = None,
        answer_bytes: int | None = None,
    ) -> dict[str, Any]:
        """A platform API call; ``path`` is relative to the API prefix.
        ``within``: seconds the whole call may take (default: 60, 10 to connect).
        ``answer_bytes``: the most of its answer read (default
        ``plain.MAX_ANSWER_BYTES``), for a read whose page may be larger."""
        timeout = _PLATFORM_TIMEOUT
        if within is not None:
            timeout = Deadlines(connect=min(10.0, within), read=min(60.0, within))
        if answer_bytes is not None:
            timeout = dataclasses.replace(timeout, answer_bytes=answer_bytes)
        headers = self._auth_headers(traces=False)
        content: bytes | None = None
        if isinstance(body, bytes):
            content = body
        elif body:  # an empty mapping is sent as no body at all, and no Content-Type
            content = json_body(body)
        if content is not None:
            headers["Content-Type"] = "application/json"
        return self._exchange(
            self._plain_for(self._plain_api, path),
            self.settings.api_root + path,
            method,
            content=content,
            headers=headers,
            params=params,
            timeout=timeout,
        )

    def _plain_call(
        self,
        target: Target,
        method: str,
        full_path: str,
        content: bytes | None,
        headers: dict[str, str],
        timeout: Deadlines,
        *,
        storage: bool = False,
    ) -> dict[str, Any]:
        """A call on the plain path: what it answers and raises is what the
        httpx path answers and raises for the same exchange (``storage``:
        of the object store's client, whose cookies are its own)."""
        headers["User-Agent"] = _user_agent()
        headers["Accept"] = "*/*"
        path = full_path.partition("?")[0]  # a presigned URL's query is its credential
        try:
            answer = self._connections().request(
                target, method, full_path, headers, content, timeout
            )
        except AnswerTooLarge as exc:
            where = f"{method} {target.scheme}://{target.netloc}{path}"
            raise oversize_answer(where, exc.limit) from None
        except Exception as exc:
            httpx = load_httpx()  # (not loaded yet if this is not a failure of the exchange)

            if not isinstance(exc, httpx.TransportError | httpx.DecodingError):
                raise
            where = f"{method} {target.scheme}://{target.netloc}{path}"
            raise error_from_transport(exc, where) from None
        special = any(name.lower() in _TAKEN_BY_HTTPX for name, _ in answer.headers)
        if answer.status < 300 and not special:
            # (an object store's answer is its status alone: its body, XML or
            # none, is not read, as through httpx)
            return {} if storage else _decoded(answer.body, answer.status, method, path)
        # Anything else is rare (an error, a redirect, a cookie, a compressed
        # body): it is made the response httpx would have made, and taken as such.
        clients = self._clients()
        http = clients[1] if storage else clients[0]
        httpx = load_httpx()
        request = httpx.Request(
            method, f"{target.scheme}://{target.netloc}{full_path}", headers=headers
        )
        try:  # (a Content-Encoding is decoded here, within the answer's limit)
            response = _read_within(
                httpx.Response(
                    answer.status,
                    headers=answer.headers,
                    stream=httpx.ByteStream(answer.body),
                    request=request,
                ),
                limit=timeout.answer_bytes,
            )
        except (httpx.DecodingError, AnswerTooLarge) as exc:
            where = f"{method} {target.scheme}://{target.netloc}{path}"
            if isinstance(exc, AnswerTooLarge):
                raise oversize_answer(where, exc.limit) from None
            raise error_from_transport(exc, where) from None
        http.cookies.extract_cookies(response)
        if response.status_code >= 300:
            raise error_from_response(response)
        return {} if storage else _decode(response)

    def traces(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A Prime Traces call; ``path`` is relative to ``/api/v1``."""
        all_headers = self._auth_headers(traces=True)
        all_headers.update(headers or {})
        return self._exchange(
            self._plain_for(self._plain_traces, path),
            self.settings.traces_url + "/api/v1" + path,
            method,
            content=content,
            headers=all_headers,
            params=params,
            timeout=_TRACES_TIMEOUT,
        )

    def put_object(self, url: str, body: bytes, content_type: str) -> None:
        """Upload to a presigned URL: no platform headers, no redirects followed."""
        found = _plain_target(url, query=True) if self._plain_ok else None
        plain = None if found is None else self._plain_for((found[0], ""), found[1], storage=True)
        if plain is not None:
            headers = {"Content-Type": content_type}
            self._plain_call(
                plain[0], "PUT", plain[1], body, headers, _UPLOAD_TIMEOUT, storage=True
            )
            return
        _, storage = self._clients()
        with uploading_presigned():  # httpx logs the URL: its query is a credential
            self._send(
                storage,
                "PUT",
                url,
                content=body,
                headers={"Content-Type": content_type},
                params=None,
                timeout=_UPLOAD_TIMEOUT,
            )

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                for client in (self._http, self._storage):
                    if client is not None:
                        client.close()
                if self._plain is not None:
                    self._plain.close()
            self._http = self._storage = self._plain = None
