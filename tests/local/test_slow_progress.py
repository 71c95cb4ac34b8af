"""How the bound judges a connection's progress, on one protocol in process.

Moments a loopback test cannot pick: the server resumed reading a body it
held up, and the client's next bytes have not come in yet; the moment before
each piece of a body comes in, on a clock that moves only when told.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import h11
import pytest
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from test_one_write import Socket
from uvicorn.server import ServerState

from primeruns.local.slow_clients import FAIR_RATE, JUDGED_AFTER, BoundedH11Protocol


def test_a_body_whose_reading_just_resumed_is_not_judged_on_the_pause() -> None:
    """The server held a body up (its app had not taken 64 KiB of it) for
    longer than progress is judged after, then read on; until the client's
    next bytes came in, a new connection past the bound judged it on the
    pause (no bytes over seconds: rate 0) and evicted a client that was
    sending as fast as it was let."""
    protocol = BoundedH11Protocol.__new__(BoundedH11Protocol)
    protocol.transport = SimpleNamespace(is_closing=lambda: False, get_write_buffer_size=lambda: 0)
    protocol.flow = SimpleNamespace(write_paused=False, read_paused=False)  # (just resumed)
    protocol.conn = SimpleNamespace(their_state=h11.SEND_BODY)
    protocol.cycle = None
    protocol._sent_from = None
    protocol._received = 10 * 2**20
    # Where the last look, during the pause, left the body's clock.
    protocol._body_from = protocol._body_start = 100.0
    protocol._body_start_base = protocol._received
    protocol._held_up = True
    protocol._judged_time, protocol._judged_bytes = 0.0, 0
    assert protocol._progress(100.0 + 5 * JUDGED_AFTER) is None


def test_a_second_answer_on_a_kept_alive_connection_is_judged_from_its_own_start() -> None:
    """A client took a 1 MiB answer whose writes paused, then asked again
    (its next head) and the app worked 100 s on it; the second answer's
    writes paused and the client took 4 MiB of it in 2 s. Judged from the
    first answer's start, that was 5 MiB over 103 s, under FAIR_RATE, and a
    new connection past the bound aborted a client reading at 2 MiB/s."""
    clock = [100.0]
    state = {"written": 0, "buffered": 0}
    protocol = BoundedH11Protocol.__new__(BoundedH11Protocol)
    protocol.loop = SimpleNamespace(time=lambda: clock[0])
    protocol.transport = SimpleNamespace(
        is_closing=lambda: False,
        get_write_buffer_size=lambda: state["buffered"],
        get_extra_info=lambda name: None,
    )
    protocol.flow = SimpleNamespace(write_paused=True, read_paused=False)
    protocol.conn = SimpleNamespace(their_state=h11.DONE)
    protocol.cycle = None
    protocol._sent_from = None
    protocol._due = lambda: None  # type: ignore[method-assign]  # (no timer here)

    def written(total: int, buffered: int) -> None:
        state["written"], state["buffered"] = total, buffered
        protocol.transport.written = total  # type: ignore[attr-defined]

    written(2**20, 2**20)
    protocol._answer_waits()  # the first answer's writes paused at 100 s
    clock[0] = 101.0
    written(2**20, 0)
    protocol.flow.write_paused = False  # all of it taken
    protocol._watch()  # the client's next head
    clock[0] = 201.0  # the app's work on it
    written(2**20 + 8 * 2**20, 8 * 2**20)
    protocol.flow.write_paused = True
    protocol._answer_waits()  # the second answer's writes paused
    clock[0] = 203.0
    written(2**20 + 8 * 2**20, 4 * 2**20)  # 4 MiB of it taken since, at 2 MiB/s
    rate = protocol._progress(clock[0])
    assert rate is not None and rate > FAIR_RATE


class _Clock(asyncio.SelectorEventLoop):
    """A loop whose time moves only when a test moves it."""

    now = 100.0

    def time(self) -> float:
        return self.now


class _Socket(Socket):
    """:mod:`test_one_write`'s transport, which takes every write at once."""

    def abort(self) -> None:
        self.close()

    def get_write_buffer_size(self) -> int:
        return 0


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    while (await receive()).get("more_body"):
        pass
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"{}"})


def _connected(
    loop: _Clock, app: ASGIApp | None = None, sock: _Socket | None = None
) -> tuple[BoundedH11Protocol, _Socket]:
    """A connection made to the bound's protocol over ``sock``, its app
    ``app`` (:func:`_answer` unless told)."""
    config = uvicorn.Config(
        app or _answer, http=BoundedH11Protocol, lifespan="off", access_log=False
    )
    config.load()
    protocol = BoundedH11Protocol(
        config=config, server_state=ServerState(), app_state={}, _loop=loop
    )
    sock = sock or _Socket()
    protocol.connection_made(sock)  # type: ignore[arg-type]
    return protocol, sock


def _judged(
    loop: _Clock, requests: Coroutine[Any, Any, None], rates: list[float | None]
) -> list[float]:
    """The rates of ``rates`` the bound judged, once ``requests`` ran on ``loop``."""
    try:
        loop.run_until_complete(requests)
    finally:
        loop.close()
    return [rate for rate in rates if rate is not None]


@pytest.mark.parametrize("gap", [0.012, 0.025])
def test_small_bodies_sent_in_pieces_are_not_judged_slow(gap: float) -> None:
    """A kept-alive client sends request after request, each a 2 KiB body in
    three pieces ``gap`` apart as the server reads them (a client's 10 ms
    timer, a loaded host), its head with the first. The piece that came with
    the head was left out of the count, and the client, 12 ms apart judged
    at 57 KB/s, gave its place to a new connection; counted, 25 ms apart it
    was still judged, over the pieces' latency, at 40 KB/s. Judged at every
    moment before a piece comes in, it is never under FAIR_RATE (each body
    ends within BODY_GRACE: none is judged)."""
    loop = _Clock()
    body = b'{"name": "' + b"x" * 2000 + b'", "environments": [{"id": "env"}]}'
    head = (
        b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    third = len(body) // 3 + 1
    pieces = [head + body[:third], body[third : 2 * third], body[2 * third :]]
    rates: list[float | None] = []

    async def requests() -> None:
        protocol, sock = _connected(loop)
        for _ in range(80):  # (two seconds of bodies and more)
            for at, piece in enumerate(pieces):
                if at:
                    loop.now += gap
                    rates.append(protocol._progress(loop.now))  # (the moment before it)
                protocol.data_received(piece)
            for _ in range(20):  # (the app's turns: it answers)
                await asyncio.sleep(0)
            assert b"".join(sock.writes).count(b"HTTP/1.1 200 ") == len(rates) // 2
            loop.now += 0.001  # (the client reads the answer, sends the next)
        protocol.connection_lost(None)

    judged = _judged(loop, requests(), rates)
    assert all(rate >= FAIR_RATE for rate in judged), min(judged)


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_large_head_is_not_counted_as_its_body(pipelined: bool) -> None:
    """A kept-alive client sends request after request, each head 40 KB of
    headers with its body's first byte, the body's last byte half a second
    later: two bytes of body in each half second. Counted from the read that
    brought the head, head and all, each body was judged at 80 KB/s, over
    FAIR_RATE, and the client kept its place past --max-connections while
    its bodies came at 4 bytes a second. Only a body's own bytes count: nor
    was a head sent with the last byte of the body before (pipelined), which
    that body's count took up to the end of the read."""
    loop = _Clock()
    head = (
        b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
        + b"p" * 40_000
        + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
    )
    rates: list[float | None] = []

    async def requests() -> None:
        protocol, sock = _connected(loop)
        for at in range(6):  # (three seconds of bodies: judged from the second on)
            if not pipelined or not at:
                protocol.data_received(head + b"{")
            loop.now += 0.5
            rates.append(protocol._progress(loop.now))  # (the moment before its last byte)
            protocol.data_received(b"}" + (head + b"{" if pipelined and at < 5 else b""))
            for _ in range(20):  # (the app's turns: it answers)
                await asyncio.sleep(0)
            assert b"".join(sock.writes).count(b"HTTP/1.1 200 ") == len(rates)
            loop.now += 0.001  # (the client reads the answer, sends the next)
        protocol.connection_lost(None)

    judged = _judged(loop, requests(), rates)
    assert len(judged) >= 4, "the bodies were not judged"
    assert max(judged) < FAIR_RATE, max(judged)


class _Unread(_Socket):
    """A transport whose client reads nothing until told (:meth:`take`):
    past asyncio's high-water mark a write pauses the protocol's writes, as
    a client slow to read an answer does."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol: BoundedH11Protocol | None = None
        self.unread = 0
        self.written = 0  # (what HeldWrites counts, for what the client took)

    def write(self, data: bytes) -> None:
        super().write(data)
        self.unread += len(data)
        if self.unread > 64 * 1024 and self.protocol is not None:
            self.protocol.pause_writing()

    def get_write_buffer_size(self) -> int:
        return self.unread

    def take(self) -> None:
        """The client reads all it was sent: writes resume."""
        self.unread = 0
        if self.protocol is not None and self.protocol.flow.write_paused:
            self.protocol.resume_writing()


async def _large_answer(scope: Scope, receive: Receive, send: Send) -> None:
    while (await receive()).get("more_body"):
        pass
    answer = b"a" * 100_000  # (past the high-water mark: the writes pause)
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def _post(size: int) -> bytes:
    return b"POST /api/v1/objects/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % size


async def _turns() -> None:
    for _ in range(20):  # (the app's turns)
        await asyncio.sleep(0)


def _unread_connection(loop: _Clock) -> tuple[BoundedH11Protocol, _Unread]:
    """A connection whose app answers :func:`_large_answer`, its client
    reading nothing until told (:class:`_Unread`)."""
    sock = _Unread()
    protocol, _ = _connected(loop, _large_answer, sock)
    sock.protocol = protocol
    return protocol, sock


async def _body_ending_while_writes_wait(
    loop: _Clock, size: int, pieces: int, paused_for: float
) -> tuple[BoundedH11Protocol, _Unread]:
    """A body of ``size`` bytes sent at 300 KB/s in ``pieces`` whose last
    comes in while the server's writes are paused (paused here by hand, as
    asyncio does when a write during a body, an early answer or a 100
    Continue, passes its high-water mark on a client not reading what it
    was sent), then a 100 KB answer the client reads
    ``paused_for`` seconds on, its writes paused again as they go out."""
    protocol, sock = _unread_connection(loop)
    body = b"b" * size
    step = size // pieces
    protocol.data_received(_post(size) + body[:step])
    for at in range(1, pieces):
        await _turns()
        loop.now += step / 300_000
        if at == pieces - 1:
            sock.unread = 70_000  # (what the client has not read passes the mark)
            protocol.pause_writing()
        protocol.data_received(body[at * step : (at + 1) * step if at < pieces - 1 else size])
    await _turns()
    loop.now += paused_for
    sock.take()  # the app's answer goes out, and its writes pause again
    await _turns()
    assert sock.unread and protocol.flow.write_paused and protocol.conn.their_state is h11.IDLE
    loop.now += 0.01
    sock.take()
    return protocol, sock


async def _next_body(
    loop: _Clock, protocol: BoundedH11Protocol, rate: int, rates: list[float | None]
) -> None:
    """A next body, 2 s at ``rate`` bytes a second in pieces of 0.1 s,
    judged the moment before each piece comes in."""
    piece = b"c" * (rate // 10)
    protocol.data_received(_post(20 * len(piece)) + piece)
    for _ in range(19):
        await _turns()
        loop.now += 0.1
        rates.append(protocol._progress(loop.now))
        protocol.data_received(piece)
    await _turns()


@pytest.mark.parametrize("wait", [0.5, 90.0])
def test_a_body_ending_while_writes_are_paused_ends_its_count(wait: float) -> None:
    """A kept-alive client's 60 KB body came at 300 KB/s, its end while the
    server's writes were paused (an answer not yet read), then a large answer
    it read 5 s on. The body's count, looked at only while writes were not
    paused, did not end: the next body, sent half a second later at 300 KB/s,
    was counted as going on from the first's start, the pauses and the wait
    in its time (judged at 15,638 B/s, under FAIR_RATE: a new connection past
    the bound took its place), and a minute and a half later was answered
    408 as it came, its window the first body's, long run out."""
    loop = _Clock()
    rates: list[float | None] = []

    async def requests() -> None:
        protocol, sock = await _body_ending_while_writes_wait(loop, 60_000, 4, 5.0)
        loop.now += wait
        await _next_body(loop, protocol, 300_000, rates)
        assert b"".join(sock.writes).count(b"HTTP/1.1 200 ") == 2  # (not 408)
        protocol.connection_lost(None)

    judged = _judged(loop, requests(), rates)
    assert len(judged) > 5, "the body was not judged"
    assert min(judged) >= FAIR_RATE, min(judged)


@pytest.mark.parametrize("after", [0, 300_000])
def test_a_body_begun_while_writes_are_paused_is_judged_once_they_resume(after: int) -> None:
    """A kept-alive client sent its next request, the head and 1 KB of a
    1 MB body, while the server's writes were paused on the answer before
    it (100 KB it had not read), read that answer 2 s on, then sent its
    body at ``after`` bytes a second. Looked at only as the reader of an
    answer while writes were paused, the body was first looked at at its
    next read: a client silent after reading its answer was never judged
    meanwhile (up to a body's deadline), a new connection past the bound
    unable to take its place. Judged from the resume, it is let go when
    silent and kept at 300 KB/s."""
    loop = _Clock()
    rates: list[float | None] = []

    async def requests() -> None:
        protocol, sock = _unread_connection(loop)
        protocol.data_received(_post(10) + b"b" * 10)
        await _turns()
        assert protocol.flow.write_paused  # (its answer unread)
        loop.now += 0.1
        protocol.data_received(_post(10**6) + b"c" * 1000)
        await _turns()
        loop.now += 2.0
        sock.take()  # the answer read: writes resume
        await _turns()
        for _ in range(30):  # (three seconds after the resume)
            loop.now += 0.1
            rates.append(protocol._progress(loop.now))  # (the moment before a piece)
            if after:
                protocol.data_received(b"c" * (after // 10))
            await _turns()
        protocol.connection_lost(None)

    judged = _judged(loop, requests(), rates)
    assert len(judged) >= 19, "the body was not judged"  # (from a second after the resume)
    if after:
        assert min(judged) >= FAIR_RATE, min(judged)
    else:
        assert max(judged) < FAIR_RATE, max(judged)


async def _keyed(scope: Scope, receive: Receive, send: Send) -> None:
    """:func:`_answer`, but 401 at the head to a request without the key,
    none of its body read (the guard's way)."""
    if (b"authorization", b"Bearer the-key") not in scope["headers"]:
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})
        return
    await _answer(scope, receive, send)


def test_a_body_after_one_answered_at_its_head_is_judged_from_its_own() -> None:
    """A kept-alive client sent a 1,000-byte body without the key, answered
    401 at its head; 30 s later the rest of it, with its next request (with
    the key) and 1 KB of that one's 1 MB body, which then came at 300 KB/s.
    The body's end and the next head came in one read, between two looks:
    the next body went on with the refused one's count and window, judged
    from its start (10 KB/s, under FAIR_RATE: a new connection past the
    bound took its place). Judged from its own head, it is over."""
    loop = _Clock()
    rates: list[float | None] = []

    def post(size: int, key: bytes) -> bytes:
        return _post(size).replace(b"\r\n\r\n", b"\r\nAuthorization: Bearer %s\r\n\r\n" % key)

    async def requests() -> None:
        protocol, sock = _connected(loop, _keyed)
        protocol.data_received(post(1000, b"not-the-key") + b"a" * 10)
        await _turns()
        assert b"".join(sock.writes).count(b"HTTP/1.1 401 ") == 1
        loop.now += 30.0
        protocol.data_received(b"a" * 990 + post(10**6, b"the-key") + b"b" * 1000)
        for _ in range(20):  # (two seconds of it)
            await _turns()
            loop.now += 0.1
            rates.append(protocol._progress(loop.now))  # (the moment before a piece)
            protocol.data_received(b"b" * 30_000)
        protocol.connection_lost(None)

    judged = _judged(loop, requests(), rates)
    assert len(judged) >= 5, "the body was not judged"
    assert min(judged) >= FAIR_RATE, min(judged)


def test_a_body_silent_once_its_reading_resumed_is_judged() -> None:
    """A client sent 70 KB of a 1 MB body at once, past what the server reads
    ahead of its app (64 KiB: reading paused), and nothing more once the app
    had taken it and reading resumed. Counted again only from its next read,
    it was judged on nothing for as long as its silence was let last (the
    body deadline, 60 s): a place held for 70 KB a minute, while a new
    connection past the bound was answered 503. Judged from the resume, its
    silence is under FAIR_RATE a second on."""
    loop = _Clock()
    rates: list[float | None] = []

    async def requests() -> None:
        protocol, _ = _connected(loop)
        protocol.data_received(_post(10**6) + b"b" * 70_000)
        assert protocol.flow.read_paused  # (past 64 KiB the app has not taken)
        await _turns()
        assert not protocol.flow.read_paused  # (the app took it: reading resumed)
        for _ in range(30):  # (three seconds of silence)
            loop.now += 0.1
            rates.append(protocol._progress(loop.now))
            await _turns()
        protocol.connection_lost(None)

    judged = _judged(loop, requests(), rates)
    assert len(judged) >= 15, "the body was not judged"
    assert max(judged) < FAIR_RATE, max(judged)
