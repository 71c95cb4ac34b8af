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

The API's small calls (a metrics row, a lifecycle call) go on the standard
library's ``http.client`` instead, where httpx would add nothing (:mod:`.plain`
says when): a backlog of metrics rows is bound by the client's CPU per call.

``transport`` is the testing seam (as in httpx itself): an
``httpx.MockTransport`` answers every request of the three peers in-process,
so a sink is tested in milliseconds without a server. ``default_transport``
is the same seam for the clients a run builds itself (set by
``primeruns.testing.use_transport``, for a user's test).
"""

from __future__ import annotations

import json
import os
import platform as _platform
import re
import ssl
import threading
import time
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..exceptions import UnprovenAnswerError
from .cookies import keep_cookies_lazily
from .errors import error_from_response, error_from_transport
from .plain import MAX_BODY, PlainConnections, Target, httpx_as_shipped
from .settings import Settings

__all__ = ["PlatformClient", "json_body"]

_PLATFORM_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
_TRACES_TIMEOUT = httpx.Timeout(120.0, connect=10.0)
_UPLOAD_TIMEOUT = httpx.Timeout(300.0, connect=10.0)
_SPENT = httpx.ByteStream(b"")  # what a read-out streamed response keeps as its stream

#: The transport of a client built without one (None: httpx's, the network).
#: Only ``primeruns.testing.use_transport`` sets it, for the length of a test.
default_transport: httpx.BaseTransport | None = None


_tls_lock = threading.Lock()
_tls: ssl.SSLContext | None = None


def tls_context() -> ssl.SSLContext:
    """This process's TLS context, built on first use as httpx builds its
    default one (the CA bundle, ``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured)
    and shared by every client: a context may verify many connections."""
    global _tls
    with _tls_lock:
        if _tls is None:
            _tls = httpx.create_ssl_context()
        return _tls


def _user_agent() -> str:
    from .. import __version__

    return f"prime-runs/{__version__} python/{_platform.python_version()}"


def json_body(value: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON for a request body; NaN/Infinity refused (ValueError)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


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
    except ValueError:
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


# Headers of an answer that httpx must see: a body to decode, a cookie to keep.
_TAKEN_BY_HTTPX = frozenset({"content-encoding", "set-cookie", "set-cookie2"})

# A path httpx sends as it is (it percent-encodes anything else): the plain
# path takes only these, and leaves the rest to httpx.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/%-]*")


def _plain_target(api_root: str) -> tuple[Target, str] | None:
    """Where the API's calls go on the plain path, and the path they start
    with; None for a root httpx should take (userinfo, which httpx turns
    into Basic auth; a query; another scheme; a host name beyond ASCII,
    which httpx sends in its ``xn--`` form and http.client would not)."""
    try:
        parts = urlsplit(api_root)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or not parts.netloc.isascii()
        or "@" in parts.netloc
        or parts.query
        or parts.fragment
        or not _PLAIN_PATH.fullmatch(parts.path)
    ):
        return None
    return Target(parts.scheme, parts.hostname, port, parts.netloc), parts.path


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
        # The plain path (``platform.plain``) for the API's small calls:
        # never with a testing transport, nor with a proxy configured (httpx
        # honours the environment's; the plain path does not).
        self._plain_target: tuple[Target, str] | None = None
        proxies = urllib.request.getproxies()  # "no": NO_PROXY alone, which routes nothing
        if self._transport is None and not set(proxies) - {"no"}:
            self._plain_target = _plain_target(settings.api_root)

    # -- connection pools -------------------------------------------------
    def _clients(self) -> tuple[httpx.Client, httpx.Client]:
        with self._lock:
            if self._pid != os.getpid():
                # Inherited across fork: the sockets are the parent's. Drop, never close.
                self._http = self._storage = None
                self._plain = None
                self._pid = os.getpid()
            if self._http is None or self._storage is None:
                # No redirect is followed: httpx strips only Authorization on
                # an origin change, so x-api-key and the body would go to
                # wherever a 3xx points, https or not. A 3xx is an error
                # naming the target (errors.error_from_response).
                tls = tls_context() if self._transport is None else None
                self._http = keep_cookies_lazily(
                    httpx.Client(
                        follow_redirects=False,
                        timeout=_PLATFORM_TIMEOUT,
                        headers={"User-Agent": _user_agent()},
                        transport=self._transport,
                        verify=True if tls is None else tls,
                    )
                )
                # Presigned URLs carry their own credentials: no auth, no redirects.
                self._storage = keep_cookies_lazily(
                    httpx.Client(
                        follow_redirects=False,
                        timeout=_UPLOAD_TIMEOUT,
                        transport=self._transport,
                        verify=True if tls is None else tls,
                    )
                )
                self._plain = PlainConnections(tls_context)
            return self._http, self._storage

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
        timeout: httpx.Timeout,
    ) -> httpx.Response:
        request = client.build_request(
            method, url, content=content, headers=headers, params=params, timeout=timeout
        )
        try:
            response = self._bounded(client, request, timeout)
        except httpx.TransportError as exc:
            # The origin too: a sink pointed at the wrong host (PRIME_TRACES_URL
            # left at production beside a local platform) is then named. Worked
            # out only on failure: a backlog is thousands of requests.
            target = request.url
            where = f"{method} {target.scheme}://{target.netloc.decode('ascii')}{target.path}"
            raise error_from_transport(exc, where) from None
        if response.status_code >= 300:
            raise error_from_response(response)
        return response

    @staticmethod
    def _bounded(
        client: httpx.Client, request: httpx.Request, timeout: httpx.Timeout
    ) -> httpx.Response:
        """Send ``request`` and read its response within one overall deadline.

        httpx's read timeout is per read: a server trickling one byte just
        inside it (a slow-loris) would hold a shipper thread, or finish(),
        for hours. The whole response must arrive within the read timeout.
        """
        budget = timeout.read if timeout.read is not None else 300.0
        deadline = time.monotonic() + budget
        response = client.send(request, stream=True)
        if response.is_stream_consumed:
            return response  # answered with its body in hand (an httpx.MockTransport)
        try:
            chunks: list[bytes] = []
            for chunk in response.iter_raw():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(
                        f"the response did not arrive within {budget:g} s", request=request
                    )
        finally:
            response.close()
            # The streamed response and its stream refer to each other: left
            # so, each request's response, request and headers stay until a
            # full collection, which the uplink seldom runs (a backlog kept
            # ~1,000 of them, 10-20 MB). Cut, reference counting frees them.
            response.stream = _SPENT
        # Rebuilt from the raw bytes with the original headers, so that any
        # Content-Encoding is decoded exactly once.
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            content=b"".join(chunks),
            request=request,
            extensions=response.extensions,
        )

    # -- the three peers ----------------------------------------------------
    def api(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | bytes | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        within: float | None = None,
    ) -> dict[str, Any]:
        """A platform API call; ``path`` is relative to the API prefix.
        ``within``: seconds the whole call may take (default: 60, 10 to connect)."""
        http, _ = self._clients()
        timeout = _PLATFORM_TIMEOUT
        if within is not None:
            timeout = httpx.Timeout(min(60.0, within), connect=min(10.0, within))
        headers = self._auth_headers(traces=False)
        content: bytes | None = None
        if isinstance(body, bytes):
            content = body
        elif body:  # an empty mapping is sent as no body at all, and no Content-Type
            content = json_body(body)
        if content is not None:
            headers["Content-Type"] = "application/json"
        url = self.settings.api_root + path
        plain, target = self._plain, self._plain_target
        if (
            plain is not None
            and target is not None
            and params is None
            and (content is None or len(content) <= MAX_BODY)
            and not http.cookies  # httpx sends them back; the plain path would not
            and _PLAIN_PATH.fullmatch(path)
            and httpx_as_shipped()
        ):
            return self._plain_api(
                plain, target[0], http, method, target[1] + path, content, headers, timeout
            )
        response = self._send(
            http, method, url, content=content, headers=headers, params=params, timeout=timeout
        )
        return _decode(response)

    def _plain_api(
        self,
        plain: PlainConnections,
        target: Target,
        http: httpx.Client,
        method: str,
        full_path: str,
        content: bytes | None,
        headers: dict[str, str],
        timeout: httpx.Timeout,
    ) -> dict[str, Any]:
        """``api`` on the plain path: what it answers and raises is what the
        httpx path answers and raises for the same exchange."""
        headers["User-Agent"] = http.headers["User-Agent"]
        headers["Accept"] = "*/*"
        try:
            answer = plain.request(target, method, full_path, headers, content, timeout)
        except httpx.TransportError as exc:
            where = f"{method} {target.scheme}://{target.netloc}{full_path}"
            raise error_from_transport(exc, where) from None
        special = any(name.lower() in _TAKEN_BY_HTTPX for name, _ in answer.headers)
        if answer.status < 300 and not special:
            return _decoded(answer.body, answer.status, method, full_path)
        # Anything else is rare (an error, a redirect, a cookie, a compressed
        # body): it is made the response httpx would have made, and taken as such.
        response = httpx.Response(
            answer.status,
            headers=answer.headers,
            content=answer.body,
            request=httpx.Request(
                method, f"{target.scheme}://{target.netloc}{full_path}", headers=headers
            ),
        )
        http.cookies.extract_cookies(response)
        if response.status_code >= 300:
            raise error_from_response(response)
        return _decode(response)

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
        http, _ = self._clients()
        all_headers = self._auth_headers(traces=True)
        all_headers.update(headers or {})
        url = self.settings.traces_url + "/api/v1" + path
        response = self._send(
            http,
            method,
            url,
            content=content,
            headers=all_headers,
            params=params,
            timeout=_TRACES_TIMEOUT,
        )
        return _decode(response)

    def put_object(self, url: str, body: bytes, content_type: str) -> None:
        """Upload to a presigned URL: no platform headers, no redirects followed."""
        _, storage = self._clients()
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
