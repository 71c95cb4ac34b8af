"""The local platform writes each answer to its socket once (``local.one_write``):
uvicorn's h11 protocol wrote the head and the body apart, two system calls
and two wake-ups of the client for each of a sync's one-row requests. An
answer sent in parts over time still goes out as it is sent, and a head
whose body never comes (a fault's dropped connection) still goes out before
the connection closes."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from primeruns.local.one_write import HELD_BYTES, OneWriteH11Protocol

REQUEST = b"POST /api/v1/rft/metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"
HEAD = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}


class Socket:
    """A transport that keeps what each write gave it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8765)}.get(name)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _serve_one(app: Any, turns: int = 20) -> Socket:
    """``REQUEST`` handled by the protocol serve runs, over a :class:`Socket`."""
    config = uvicorn.Config(app, http=OneWriteH11Protocol, lifespan="off", log_level="warning")
    config.load()
    protocol = OneWriteH11Protocol(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    sock = Socket()
    protocol.connection_made(sock)  # type: ignore[arg-type]
    protocol.data_received(REQUEST)
    for _ in range(turns):
        await asyncio.sleep(0)
    protocol.connection_lost(None)
    return sock


def test_an_answer_is_written_once() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(HEAD)
        await send({"type": "http.response.body", "body": b"{}"})

    sock = asyncio.run(_serve_one(app))
    assert len(sock.writes) == 1
    assert sock.writes[0].startswith(b"HTTP/1.1 200 ") and sock.writes[0].endswith(b"\r\n\r\n{}")


def test_an_answer_sent_in_parts_over_time_goes_out_as_it_is_sent() -> None:
    parts: list[int] = []
    sock_seen: list[Socket] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(HEAD)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        parts.append(len(sock_seen[0].writes) if sock_seen else -1)
        await send({"type": "http.response.body", "body": b"{}"})

    async def main() -> Socket:
        original = Socket.__init__

        def remember(self: Socket) -> None:
            original(self)
            sock_seen.append(self)

        Socket.__init__ = remember  # type: ignore[method-assign]
        try:
            return await _serve_one(app)
        finally:
            Socket.__init__ = original  # type: ignore[method-assign]

    sock = asyncio.run(main())
    assert parts == [1]  # the head was out before the body was sent
    assert len(sock.writes) == 2 and sock.writes[1] == b"{}"


def test_a_head_whose_body_never_comes_goes_out_before_the_close() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({**HEAD, "headers": [(b"content-length", b"1")]})

    sock = asyncio.run(_serve_one(app))
    assert sock.closed
    assert len(sock.writes) == 1 and sock.writes[0].startswith(b"HTTP/1.1 200 ")


def test_a_large_answer_goes_out_as_it_is_sent() -> None:
    """Past ``HELD_BYTES`` nothing waits: the transport's flow control sees
    a large answer's chunks as uvicorn's own protocol gave them."""
    chunk = b"x" * HELD_BYTES

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        length = str(3 * len(chunk)).encode()
        await send({**HEAD, "headers": [(b"content-length", length)]})
        for _ in range(3):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    sock = asyncio.run(_serve_one(app))
    assert [len(w) for w in sock.writes[1:]] == [len(chunk)] * 2
    assert sock.writes[0].startswith(b"HTTP/1.1 200 ") and sock.writes[0].endswith(chunk)
