"""Whom the local platform answers: one ASGI layer in front of every route.

``primeruns serve`` runs beside a browser, on machines shared with others. A
security review found the dashboard and ``/_local/*`` open despite a key,
``Host: evil.example`` accepted (DNS rebinding), and an empty cross-site form
post finalizing an evaluation. Checks spread over route modules miss routes
(the dashboard, static files, an unknown path); one layer outside the app,
before fault injection, sees every request first:

- **Host**: only loopback names (or the name ``--host`` gave), so a page whose
  DNS name was rebound to 127.0.0.1 is refused. Bound to a wildcard address
  any name is accepted: the key, which such a bind requires, is the guard.
- **Key**: with one, every route needs it except ``/healthz`` (says "ok",
  nothing else) and the object store (presigned: its URL's token is the
  credential). The API and ``/_local/*`` take it as a header; the dashboard
  takes a session cookie, set from a one-time login link (as Jupyter does) so
  that the key never sits in a browser's history. API routes also check the
  key themselves (this layer answers in their dialect, with their words).
- **No form CSRF**: a state change must not come from another site (``Origin``,
  ``Sec-Fetch-Site``) and must carry a type a form cannot send: JSON, or the
  multipart and binary bodies the API really takes. A body-less request
  without a Content-Type (how the SDK sends ``{}``) is allowed.
- **Headers**: CSP, ``X-Frame-Options`` and ``nosniff`` on every answer.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .context import wanted_headers

#: Names a loopback-bound server answers to (compared lower-case, port dropped).
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
COOKIE = "primeruns_session"
#: Styles may be inline (the histogram's bars, uPlot's sizes), scripts may
#: not: the dashboard's scripts are files it serves itself.
CSP = (
    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
#: On every answer the server sends: the app's through the guard, the
#: protocol's own refusals of what never became a request (``bare_answers``).
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: What an HTML form can send cross-site without a CORS preflight.
_FORM_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})
#: Routes whose real clients send multipart (the Prime Traces upload).
_MULTIPART_ROUTES = ("/api/v1/traces",)
_TRACES_PREFIXES = ("/api/v1/traces", "/api/v1/episodes", "/api/v1/runs")
_PAGE_PREFIXES = ("/dashboard/", "/_dashboard/")
LOGIN_PATH = "/_local/login"
#: (status, message, body): a refusal's answer; body None renders the message.
Refusal = tuple[int, str, "dict[str, str] | None"]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    return host.strip("[]") in ("", "0.0.0.0", "::")


def allowed_hosts(bind: str) -> frozenset[str] | None:
    """The Host names to accept when bound to ``bind``; None accepts any."""
    if is_wildcard(bind):
        return None
    return LOOPBACK_NAMES | {bind.strip("[]").lower()}


def _host_name(value: str) -> str:
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def key_refusal(key: str, setting: str) -> str | None:
    """Why ``key`` cannot be this server's key, naming ``setting`` (never the
    key), or None if it can.

    A key must be sendable in a header and compared as sent: HTTP clients
    refuse non-ASCII and control characters (httpx does) or send them in an
    encoding the server cannot guess (a UTF-8 client's ``é`` arrives as two
    latin-1 characters), and blanks around a header's value are dropped on
    the way; such a key would never authenticate anyone.
    """
    fix = (
        "use printable ASCII only (e.g. python3 -c "
        "'import secrets; print(secrets.token_urlsafe(32))')"
    )
    at = next((i for i, c in enumerate(key) if not " " <= c <= "~"), None)
    if at is not None:
        return (
            f"${setting} is not usable as a key: character {at + 1} of {len(key)} is not "
            f"printable ASCII (a non-ASCII letter or a control character such as a line "
            f"break), which clients cannot send in a header; {fix}"
        )
    if key != key.strip():
        return (
            f"${setting} is not usable as a key: it begins or ends with a blank, which "
            f"never arrives in a header; remove it"
        )
    return None


def _same(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


class LoginLinks:
    """One-time login tokens and the session they open.

    A token is spent when used, so a link that leaks (shell history, a shared
    log) after its owner logged in opens nothing. The session is one random
    value per server start: a restart logs every browser out.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: list[str] = []
        self.session = secrets.token_urlsafe(32)

    def mint(self) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens.append(token)
        return token

    def redeem(self, token: str) -> bool:
        with self._lock:
            for known in self._tokens:
                if _same(known, token):
                    self._tokens.remove(known)
                    return True
        return False


@dataclass(frozen=True)
class GuardSettings:
    #: Out of the repr, which reaches logs and tracebacks.
    api_key: str | None = field(repr=False)
    #: None: any Host name (bound to a wildcard address).
    hosts: frozenset[str] | None = LOOPBACK_NAMES


class Guard:
    """ASGI middleware applying the checks in the module docstring."""

    def __init__(self, app: ASGIApp, settings: GuardSettings) -> None:
        self.app = app
        self.settings = settings
        self.links = LoginLinks()
        self.origin = ""  # set by the server once it knows its port, for printed links

    def login_url(self) -> str:
        return f"{self.origin}/?{urlencode({'token': self.links.mint()})}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = wanted_headers(scope, _READ)
        path: str = scope["path"]
        method: str = scope["method"]

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        raw_query: bytes = scope.get("query_string", b"")
        query = parse_qsl(raw_query.decode("latin-1")) if raw_query else []
        token = dict(query).get("token")
        key = self.settings.api_key
        if key is not None and token is not None and method == "GET" and _is_page(path):
            # The login link: checked for its Host like any request, then exchanged.
            refusal = self._host_refusal(headers)
            if refusal is None:
                await self._login(send_guarded, path, query, token)
                return
        else:
            refusal = self._refusal(headers, path, method)
        if refusal is not None:
            await _answer(send_guarded, path, *refusal)
            return
        if key is not None and path == LOGIN_PATH and method == "POST":
            await _answer(send_guarded, path, 200, "", {"url": self.login_url()})
            return
        await self.app(scope, receive, send_guarded)

    def _host_refusal(self, headers: Mapping[str, str]) -> Refusal | None:
        hosts = self.settings.hosts
        host = headers.get("host")
        if hosts is not None and host is not None and _host_name(host) not in hosts:
            # Its own names, not the client's: a header value echoed is a
            # reflection anyone who can connect chooses (up to a 64 KiB head).
            names = ", ".join(sorted(hosts))
            return 400, f"the request's Host is not a name of this server ({names})", None
        return None

    def _refusal(self, headers: Mapping[str, str], path: str, method: str) -> Refusal | None:
        """(status, message, body) to refuse with, or None to let the request in."""
        refusal = self._host_refusal(headers)
        if refusal is not None:
            return refusal
        key = self.settings.api_key
        if key is not None and not self._authenticated(headers, path, method):
            if _is_page(path):
                return 401, "log in with the link primeruns serve printed at start", None
            return 401, "Invalid or missing API key", None
        if method in _STATE_CHANGING:
            return self._cross_site(headers, path)
        return None

    def _authenticated(self, headers: Mapping[str, str], path: str, method: str) -> bool:
        key = self.settings.api_key
        assert key is not None
        if path == "/healthz" or path.startswith("/storage/"):
            return True
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and _same(key, token.strip()):
            return True
        if _same(key, headers.get("x-api-key")):
            return True
        if _is_page(path) and method in ("GET", "HEAD"):
            return _same(self.links.session, _cookie(headers, COOKIE))
        return False

    def _cross_site(self, headers: Mapping[str, str], path: str) -> Refusal | None:
        site = headers.get("sec-fetch-site", "").lower()
        origin = headers.get("origin")
        if site in ("cross-site", "same-site") or (origin is not None and not self._own(origin)):
            return 403, "cross-site requests may not change anything here", None
        content_type = headers.get("content-type")
        if content_type is None:
            # The object store takes raw bytes (its presigned token is the credential).
            if _has_body(headers) and not path.startswith("/storage/"):
                return 415, "a request body needs a Content-Type (application/json)", None
            return None
        media = content_type.split(";")[0].strip().lower()
        if media == "multipart/form-data" and path.startswith(_MULTIPART_ROUTES):
            return None
        if media in _FORM_TYPES:
            return 415, f"Expected application/json, got {media!r}", None
        return None

    def _own(self, origin: str) -> bool:
        """Whether ``origin`` (scheme://host[:port]) names this server."""
        _, _, rest = origin.partition("://")
        hosts = self.settings.hosts
        return bool(rest) and (hosts is None or _host_name(rest) in hosts)

    async def _login(self, send: Send, path: str, query: list[tuple[str, str]], token: str) -> None:
        if not self.links.redeem(token):
            await _answer(send, path, 401, "this login link is spent or unknown", None)
            return
        # Redirect to the same page without the token: it leaves the address bar.
        rest = urlencode([(k, v) for k, v in query if k != "token"])
        location = path + (f"?{rest}" if rest else "")
        cookie = f"{COOKIE}={self.links.session}; Path=/; HttpOnly; SameSite=Strict"
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", location.encode()),
                    (b"set-cookie", cookie.encode()),
                    (b"cache-control", b"no-store"),
                    (b"content-length", b"0"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})


#: The headers the guard reads, by their names as bytes (``wanted_headers``).
_READ = {
    name.encode(): name
    for name in (
        "host",
        "authorization",
        "x-api-key",
        "cookie",
        "sec-fetch-site",
        "origin",
        "content-type",
        "content-length",
        "transfer-encoding",
    )
}


def _cookie(headers: Mapping[str, str], name: str) -> str | None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except CookieError:
        return None
    morsel = jar.get(name)
    return None if morsel is None else morsel.value


def _is_page(path: str) -> bool:
    return path == "/" or path.startswith(_PAGE_PREFIXES)


def _has_body(headers: Mapping[str, str]) -> bool:
    length = headers.get("content-length")
    return headers.get("transfer-encoding") is not None or (length not in (None, "0"))


async def _answer(
    send: Send, path: str, status: int, message: str, body: dict[str, str] | None
) -> None:
    """A JSON answer in the dialect of ``path`` (the traces envelope or ``{"detail"}``)."""

    if body is None:
        if path.startswith(_TRACES_PREFIXES):
            code = "unauthenticated" if status == 401 else None
            body_value: object = {"error": {"code": code, "message": message}}
        else:
            body_value = {"detail": message}
    else:
        body_value = body
    raw = json.dumps(body_value).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": raw})
