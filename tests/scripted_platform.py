"""A platform scripted in-process behind ``httpx.MockTransport``, for the unit
tests of the sinks and the lifecycle.

A test declares the routes it needs, each a handler that commits the request
and answers as the platform would (``primeruns/local`` is the reference), and
queues failures per route: the next answers of that route become an error
response, ``LOST`` (the platform commits, then the connection drops before the
answer: an ambiguous failure), ``REFUSED`` (the request never reached it) or
``forwarded(answer)`` (the platform commits, and a proxy in front of it
answers ``answer`` instead of the platform's); ``PASS`` lets one request
through, so a fault can be aimed at a later one.
No socket, no thread, no sleep: a test takes milliseconds.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from primeruns.journal import Entry, EntryKind, InFlight
from primeruns.platform import PlatformClient, resolve_settings
from primeruns.ship import batchstate
from primeruns.sinks.base import Binding, SendContext, Sink

__all__ = [
    "LOST",
    "PASS",
    "REFUSED",
    "Batch",
    "Fault",
    "ScriptedPlatform",
    "entries_of",
    "error",
    "failed_attempt",
    "forwarded",
]

Handler = Callable[[httpx.Request, dict[str, str]], httpx.Response]


class _Drop(enum.Enum):
    LOST = "lost"
    REFUSED = "refused"
    PASS = "pass"


LOST = _Drop.LOST
REFUSED = _Drop.REFUSED
PASS = _Drop.PASS


@dataclass(frozen=True)
class _Forwarded:
    answer: httpx.Response


def forwarded(answer: httpx.Response) -> _Forwarded:
    """A fault: the platform commits the request, and the client gets
    ``answer`` (a proxy's, which had passed the request on)."""
    return _Forwarded(answer)


Fault = httpx.Response | _Drop | _Forwarded


def error(status: int, message: str, *, code: str | None = None) -> httpx.Response:
    """An error answer: Prime Traces' envelope when ``code`` is given, else the
    platform API's ``{"detail": ...}``."""
    if code is not None:
        return httpx.Response(status, json={"error": {"code": code, "message": message}})
    return httpx.Response(status, json={"detail": message})


class ScriptedPlatform:
    """Routes by method and path (a regex whose named groups reach the handler);
    ``calls`` lists the route name of every request, in order."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], str, Handler]] = []
        self._faults: dict[str, list[Fault]] = {}
        self.calls: list[str] = []
        self.requests: list[tuple[str, httpx.Request]] = []

    def route(self, name: str, method: str, path: str, handler: Handler) -> None:
        self._routes.append((method, re.compile(path), name, handler))

    def fail(self, name: str, *faults: Fault) -> None:
        """The next ``len(faults)`` requests of route ``name`` get these instead."""
        self._faults.setdefault(name, []).extend(faults)

    def sent(self, name: str) -> list[httpx.Request]:
        return [request for called, request in self.requests if called == name]

    def _find(self, request: httpx.Request) -> tuple[str, Handler, dict[str, str]] | None:
        for method, pattern, name, handler in self._routes:
            match = pattern.fullmatch(request.url.path)
            if match is not None and request.method == method:
                return name, handler, match.groupdict()
        return None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        found = self._find(request)
        if found is None:
            return error(404, f"no route for {request.method} {request.url.path}")
        name, handler, params = found
        self.calls.append(name)
        self.requests.append((name, request))
        queued = self._faults.get(name)
        if not queued:
            return handler(request, params)
        fault = queued.pop(0)
        if fault is PASS:
            return handler(request, params)
        if fault is REFUSED:
            raise httpx.ConnectError("connection refused", request=request)
        if fault is LOST:
            handler(request, params)
            raise httpx.RemoteProtocolError("peer closed the connection", request=request)
        if isinstance(fault, _Forwarded):
            handler(request, params)
            return fault.answer
        assert isinstance(fault, httpx.Response)
        return fault

    def client(self) -> PlatformClient:
        """A client of this platform (the API and Prime Traces on their own hosts)."""
        settings = resolve_settings(
            api_key="k-test",
            base_url="http://platform.test",
            environ={"PRIME_TRACES_URL": "http://traces.test"},
            config={},
        )
        return PlatformClient(settings, transport=httpx.MockTransport(self))


def failed_attempt(
    platform: ScriptedPlatform, route: str, fault: Fault, attempt: Callable[[], object]
) -> BaseException:
    """Queue ``fault`` on ``route`` and make ``attempt``: what it raised."""
    platform.fail(route, fault)
    try:
        attempt()
    except Exception as exc:
        return exc
    raise AssertionError(f"{route}: the attempt succeeded despite {fault!r}")


def entries_of(kind: EntryKind, records: Sequence[Any], *, first_seq: int = 1) -> list[Entry]:
    """Journal entries of ``kind``, one per record (a mapping, or payload bytes)."""
    return [
        Entry(first_seq + i, kind, record if isinstance(record, bytes) else orjson.dumps(record))
        for i, record in enumerate(records)
    ]


@dataclass
class Batch:
    """A batch as the shipper records it, and the context it gives each attempt:
    ``state`` is the batch's state in the journal's form (``InFlight.state``),
    read back into the sink's progress for each attempt; ``last_seq`` the last
    entry the sink said it used (None: all); ``saved`` lists the keys each
    save merged into the state, ``failed_at_ack`` the records its last
    attempt left to count as refused with the acknowledgement."""

    body: bytes
    state: dict[str, Any]
    records: int
    binding: Binding
    progress_type: type[Any]
    last_seq: int | None = None
    saved: list[dict[str, Any]] = field(default_factory=list)
    failed_at_ack: dict[int, tuple[int, BaseException]] = field(default_factory=dict)

    @classmethod
    def prepare(cls, sink: Sink, entries: Sequence[Entry], binding: Binding) -> Batch:
        prepared = sink.prepare(entries, binding)
        assert prepared is not None, "these entries make no batch"
        # Recorded: as the shipper does, the sink goes on from the batch's carry.
        restore = getattr(sink, "restore", None)
        if restore is not None and prepared.carry is not None:
            restore(prepared.carry)
        last = entries[-1].seq if prepared.last_seq is None else prepared.last_seq
        state = batchstate.to_journal(prepared, last)
        return cls(
            prepared.body, state, prepared.records, binding, sink.progress_type, prepared.last_seq
        )

    @property
    def progress(self) -> Any:
        """The sink's progress, read back from the recorded state."""
        inflight = InFlight(1, 1, self.body, self.state)
        return batchstate.from_journal(inflight, self.progress_type).progress

    @property
    def ctx(self) -> SendContext[Any]:
        def record(old: Any, new: Any) -> None:
            change = batchstate.changes(old, new)
            self.saved.append(change)
            self.state.update(change)

        return SendContext(
            binding=self.binding,
            progress=self.progress,
            record=record,
        )

    def send(self, sink: Sink) -> None:
        """One attempt, exactly as recorded (``failed_at_ack``: what its
        context held to count with the acknowledgement, when it ended)."""
        ctx = self.ctx
        try:
            sink.send(self.body, ctx)
        finally:
            self.failed_at_ack = dict(ctx.failed_at_ack)
