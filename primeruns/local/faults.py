"""Fault injection: make the local platform fail the way a real network does.

Two kinds of failure, drawn per request from one seeded RNG so that a failing
test can be rerun with the same sequence:

- *retryable*: the request is refused before it is processed, with a 429
  carrying ``Retry-After``, a 503 carrying ``Retry-After``, or a bare-text 502
  (a gateway's answer, no envelope). Nothing is stored.
- *ambiguous*: the request is processed and committed, then the connection is
  dropped after the response head and before its body. The client sees a
  transport error (``RemoteProtocolError``) and cannot know the request landed.
- *slow-loris*: the request is processed and committed, then the response body
  is trickled one byte every ``slowloris_interval_s``: each read succeeds just
  in time, so only a client with an overall deadline gets away.
- *bogus*: a 200 that proves nothing, as a gateway or a maintenance page
  answers: an empty body, ``{}``, an HTML page, or JSON cut short (one of
  ``bogus_bodies``). Whether the request reached the platform first is drawn
  too (``bogus_processed`` of them, half by default): a client must neither
  count it as stored nor resend it blindly. At 0, none is: an object store's
  gateway that answers 200 to a PUT it never stored.

``max_body_bytes`` (0: none) refuses every faultable request whose body is
larger with a proxy's plain-text 413, before it is processed: the request
size limit of a gateway in front of the platform. A body sent chunked (no
Content-Length) is measured as it comes, as such a proxy does: held up to
the limit, refused past it, else handed to the platform whole.

``statuses`` chooses the retryable answers (any of 429 and 5xx, 500 included;
default 429, 503 and 502) and ``routes`` limits every fault to requests whose
path starts with one of its prefixes (only registration, only metrics, only
Prime Traces; default: every faultable route).

``max_faults`` (0: none) injects at most that many faults from when it is
set, then lets every request through: "the first two PUTs are swallowed",
whatever else the test's run sends meanwhile.

``latency_ms`` delays every faultable request. Faults never apply to
``/_local/*``, ``/healthz`` or ``/`` (the control and inspection surface must
stay reliable), but do apply to the object store's ``PUT``: from the client's
view it is part of the API, and its retry path deserves the same exercise.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from dataclasses import asdict, dataclass
from typing import Any, Literal

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Outcome = Literal["pass", "retryable", "ambiguous", "slowloris", "bogus"]
BogusBody = Literal["empty", "{}", "html", "truncated"]
BOGUS_BODIES: tuple[BogusBody, ...] = ("empty", "{}", "html", "truncated")
_MAINTENANCE_PAGE = (
    b"<!DOCTYPE html><html><head><title>Maintenance</title></head>"
    b"<body><h1>We'll be back soon</h1></body></html>"
)
_TOO_LARGE_PAGE = b"<html><body><h1>413 Request Entity Too Large</h1></body></html>"

_TRACES_PREFIXES = ("/api/v1/traces", "/api/v1/episodes", "/api/v1/runs")


@dataclass(frozen=True)
class FaultSettings:
    """The current fault knobs, as ``GET /_local/faults`` reports them."""

    retryable_rate: float = 0.0
    ambiguous_rate: float = 0.0
    latency_ms: int = 0
    seed: int = 0
    retry_after: float = 0.1
    slowloris_rate: float = 0.0
    slowloris_interval_s: float = 1.0
    statuses: tuple[int, ...] = (429, 503, 502)
    routes: tuple[str, ...] = ()
    bogus_rate: float = 0.0
    bogus_bodies: tuple[str, ...] = BOGUS_BODIES
    bogus_processed: float = 0.5
    max_body_bytes: int = 0
    max_faults: int = 0


class FaultInjector:
    """Thread-safe holder of the fault settings and their RNG."""

    def __init__(self, settings: FaultSettings) -> None:
        _validate(settings)
        self._lock = threading.Lock()
        self._settings = settings
        self._rng = random.Random(settings.seed)
        self._injected = 0  # faults drawn so far, for a campaign's "faults injected" figure
        self._left = settings.max_faults  # faults still allowed under ``max_faults``
        self._delayed = 0  # requests inside an injected latency now (a test waits for one)
        #: Set when the server starts shutting down: an injected latency (up to
        #: an hour) or slow-loris answer ends at once, or SIGTERM would wait on it.
        self.stopping = asyncio.Event()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**asdict(self._settings), "injected": self._injected, "delayed": self._delayed}

    def delaying(self, change: int) -> None:
        with self._lock:
            self._delayed += change

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (any subset of the fields); a given seed restarts the RNG.

        Raises ValueError (unknown key, wrong type, rate outside [0, 1], rates
        summing over 1, negative latency); nothing changes then.
        """
        unknown = set(changes) - set(asdict(FaultSettings()))
        if unknown:
            raise ValueError(f"unknown fault settings: {sorted(unknown)}")
        with self._lock:
            merged = asdict(self._settings)
            merged.update({k: v for k, v in changes.items() if v is not None})
            new = FaultSettings(
                retryable_rate=_number(merged["retryable_rate"], "retryable_rate"),
                ambiguous_rate=_number(merged["ambiguous_rate"], "ambiguous_rate"),
                latency_ms=int(_number(merged["latency_ms"], "latency_ms")),
                seed=int(_number(merged["seed"], "seed")),
                retry_after=_number(merged["retry_after"], "retry_after"),
                slowloris_rate=_number(merged["slowloris_rate"], "slowloris_rate"),
                slowloris_interval_s=_number(
                    merged["slowloris_interval_s"], "slowloris_interval_s"
                ),
                statuses=_statuses(merged["statuses"]),
                routes=_routes(merged["routes"]),
                bogus_rate=_number(merged["bogus_rate"], "bogus_rate"),
                bogus_bodies=_routes(merged["bogus_bodies"], "bogus_bodies"),
                bogus_processed=_number(merged["bogus_processed"], "bogus_processed"),
                max_body_bytes=int(_number(merged["max_body_bytes"], "max_body_bytes")),
                max_faults=int(_number(merged["max_faults"], "max_faults")),
            )
            _validate(new)
            self._settings = new
            if changes.get("seed") is not None:
                self._rng = random.Random(new.seed)
            if changes.get("max_faults") is not None:
                self._left = new.max_faults  # counted from now
            return {**asdict(new), "injected": self._injected, "delayed": self._delayed}

    def draw(self, path: str = "") -> tuple[Outcome, int, FaultSettings]:
        """Decide one request's fate: the outcome and, if retryable, its status."""
        with self._lock:
            s = self._settings
            if s.routes and not path.startswith(s.routes):
                return "pass", 0, s
            if s.max_faults and self._left <= 0:
                return "pass", 0, s
            roll = self._rng.random()
            outcome: Outcome = "pass"
            status = 0
            if roll < s.retryable_rate:
                outcome, status = "retryable", self._rng.choice(s.statuses)
            elif roll < s.retryable_rate + s.ambiguous_rate:
                outcome = "ambiguous"
            elif roll < s.retryable_rate + s.ambiguous_rate + s.slowloris_rate:
                outcome = "slowloris"
            elif roll < s.retryable_rate + s.ambiguous_rate + s.slowloris_rate + s.bogus_rate:
                outcome = "bogus"
            if outcome != "pass":
                self._count()
            return outcome, status, s

    def draw_bogus(self, settings: FaultSettings) -> tuple[str, bool]:
        """A bogus answer's body, and whether the request is processed first."""
        with self._lock:
            body = self._rng.choice(settings.bogus_bodies)
            return body, self._rng.random() < settings.bogus_processed

    def body_limit(self, path: str) -> int:
        """The ``max_body_bytes`` that applies to ``path`` (0: none), for a
        body whose size is known only once read (chunked)."""
        with self._lock:
            s = self._settings
            if s.routes and not path.startswith(s.routes):
                return 0
            return s.max_body_bytes

    def too_large(self, path: str, size: int | None) -> bool:
        """Whether a request of ``size`` body bytes is over ``max_body_bytes``
        (counted as an injected fault)."""
        with self._lock:
            s = self._settings
            if not s.max_body_bytes or size is None or size <= s.max_body_bytes:
                return False
            if s.routes and not path.startswith(s.routes):
                return False
            if s.max_faults and self._left <= 0:
                return False
            self._count()
            return True

    def _count(self) -> None:
        """One fault injected (with ``_lock`` held)."""
        self._injected += 1
        self._left -= 1


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number")
    try:
        number = float(value)
    except OverflowError:  # an integer past the floats
        number = math.inf
    if not math.isfinite(number):
        # Infinity or 1e400 (json reads both): int() of it was an OverflowError, a 500.
        raise ValueError(f"{name} must be a finite number")
    return number


def _statuses(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError("statuses must be a list of HTTP statuses")
    return tuple(int(_number(v, "statuses")) for v in value)


def _routes(value: Any, name: str = "routes") -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of strings")
    return tuple(value)


def _validate(s: FaultSettings) -> None:
    rates = ("retryable_rate", "ambiguous_rate", "slowloris_rate", "bogus_rate")
    for name in rates:
        if not 0.0 <= getattr(s, name) <= 1.0:
            raise ValueError(f"{name} must be within [0, 1]")
    if sum(getattr(s, name) for name in rates) > 1.0:
        raise ValueError(f"{' + '.join(rates)} must not exceed 1")
    if not s.bogus_bodies or not set(s.bogus_bodies) <= set(BOGUS_BODIES):
        raise ValueError(f"bogus_bodies must be a non-empty list of {list(BOGUS_BODIES)}")
    if not 0.0 <= s.bogus_processed <= 1.0:
        raise ValueError("bogus_processed must be within [0, 1]")
    if s.max_body_bytes < 0 or s.max_faults < 0:
        raise ValueError("max_body_bytes and max_faults must not be negative")
    if not s.statuses or not all(v == 429 or 500 <= v <= 599 for v in s.statuses):
        raise ValueError("statuses must be a non-empty list of 429 and 5xx statuses")
    if s.latency_ms < 0 or s.retry_after < 0 or s.slowloris_interval_s < 0:
        raise ValueError("latency_ms, retry_after and slowloris_interval_s must not be negative")
    # An injected wait holds its request (and, past its end, nothing bounds
    # it but shutdown): at most an hour, as a test or a campaign needs.
    if s.latency_ms > 3_600_000 or s.slowloris_interval_s > 3600:
        raise ValueError(
            "latency_ms must be at most 3600000 and slowloris_interval_s at most 3600 (an hour)"
        )


def is_exempt(path: str) -> bool:
    return path in ("/", "/healthz") or path.startswith("/_local/") or path == "/_local"


class FaultMiddleware:
    """ASGI middleware applying the injector's verdict to each faultable request."""

    def __init__(self, app: ASGIApp, injector: FaultInjector) -> None:
        self.app = app
        self.injector = injector

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_exempt(scope["path"]):
            await self.app(scope, receive, send)
            return
        size = _content_length(scope)
        limit = self.injector.body_limit(scope["path"]) if size is None else 0
        if limit and _chunked(scope):
            size, receive = await _measured(receive, limit)
        if self.injector.too_large(scope["path"], size):
            await _drain(receive)
            await _answer(send, 413, _TOO_LARGE_PAGE, b"text/html")
            return
        outcome, status, settings = self.injector.draw(scope["path"])
        if settings.latency_ms:
            self.injector.delaying(+1)
            try:
                with anyio.move_on_after(settings.latency_ms / 1000):
                    await self.injector.stopping.wait()
            finally:
                self.injector.delaying(-1)
        if self.injector.stopping.is_set():
            outcome, status = "retryable", 503  # shutting down: nothing is processed
        if outcome == "retryable":
            await _drain(receive)
            await _refuse(send, scope["path"], status, settings.retry_after)
        elif outcome == "ambiguous":
            await self._commit_then_drop(scope, receive, send)
        elif outcome == "slowloris":
            await self._commit_then_trickle(scope, receive, send, settings.slowloris_interval_s)
        elif outcome == "bogus":
            await self._bogus(scope, receive, send, settings)
        else:
            await self.app(scope, receive, send)

    async def _commit_then_drop(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message | None = None

        async def keep_head(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message

        await self.app(scope, receive, keep_head)
        if start is None:
            return
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        # Announce a body that never comes: uvicorn then closes the connection
        # and the client fails mid-response, after the commit.
        headers.append((b"content-length", b"1"))
        await send({**start, "headers": headers})

    async def _bogus(
        self, scope: Scope, receive: Receive, send: Send, settings: FaultSettings
    ) -> None:
        """A 200 that proves nothing, for a request processed first or not."""
        body_kind, processed = self.injector.draw_bogus(settings)
        real = bytearray()
        if processed:

            async def keep(message: Message) -> None:
                if message["type"] == "http.response.body":
                    real.extend(message.get("body", b""))

            await self.app(scope, receive, keep)
        else:
            await _drain(receive)
        if body_kind == "html":
            await _answer(send, 200, _MAINTENANCE_PAGE, b"text/html")
        elif body_kind == "truncated":
            cut = bytes(real[: len(real) // 2]) if len(real) > 1 else b'{"status":"comm'
            await _answer(send, 200, cut, b"application/json")
        else:
            await _answer(send, 200, b"{}" if body_kind == "{}" else b"", b"application/json")

    async def _commit_then_trickle(
        self, scope: Scope, receive: Receive, send: Send, interval_s: float
    ) -> None:
        start: Message | None = None
        body = bytearray()

        async def keep(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))

        await self.app(scope, receive, keep)
        if start is None:
            return
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        # One byte per interval: every read the client makes succeeds just in
        # time, so a per-read timeout never fires.
        for index in range(len(body)):
            with anyio.move_on_after(interval_s):
                await self.injector.stopping.wait()
            if self.injector.stopping.is_set():
                return  # the connection closes short of its body: the client sees that
            more = index + 1 < len(body)
            await send(
                {
                    "type": "http.response.body",
                    "body": bytes(body[index : index + 1]),
                    "more_body": more,
                }
            )
        if not body:
            await send({"type": "http.response.body", "body": b""})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _chunked(scope: Scope) -> bool:
    return any(name.lower() == b"transfer-encoding" for name, _ in scope.get("headers", []))


async def _measured(receive: Receive, limit: int) -> tuple[int, Receive]:
    """Read a body of unknown length until it ends or passes ``limit`` bytes
    (held: at most ``limit`` and one read); its size so far, and a receive
    that hands the app what was read, in one message, and then the rest."""
    held: list[bytes] = []
    size = 0
    more = True
    gone: Message | None = None
    while more and size <= limit:
        message = await receive()
        if message["type"] != "http.request":
            gone = message  # the client left: said to the app after what came
            break
        held.append(message.get("body", b""))
        size += len(held[-1])
        more = message.get("more_body", False)
    first: Message | None = (
        {"type": "http.request", "body": b"".join(held), "more_body": more}
        if held or gone is None
        else gone
    )

    async def replay() -> Message:
        nonlocal first
        if first is None:
            return await receive()
        message, first = first, None
        return message

    return size, replay


async def _answer(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _drain(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


async def _refuse(send: Send, path: str, status: int, retry_after: float) -> None:
    headers = [(b"content-type", b"application/json")]
    if status == 502:
        body = b"Bad Gateway"
        headers = [(b"content-type", b"text/plain; charset=utf-8")]
    elif status == 500:
        body = b"Internal Server Error"  # what a crashing app server or its proxy says
        headers = [(b"content-type", b"text/plain; charset=utf-8")]
    elif path.startswith(_TRACES_PREFIXES):
        code = b"rate_limited" if status == 429 else b"ingest_unavailable"
        body = b'{"error":{"code":"' + code + b'","message":"injected fault"}}'
    else:
        body = b'{"detail":"injected fault: service temporarily unavailable"}'
    if status not in (500, 502):
        headers.append((b"retry-after", f"{retry_after:g}".encode()))
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
