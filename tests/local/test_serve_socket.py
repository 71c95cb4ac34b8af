"""The local platform's listening socket: connections with Nagle's algorithm
off (with it on, every kept-alive response written in two parts waited ~40 ms
for the client's delayed ACK; tools/bench/request_latency.py measures the
request time itself)."""

from __future__ import annotations

import asyncio
import socket

from primeruns.local.cli import listening_socket


def test_connections_accepted_by_asyncio_have_nagle_off() -> None:
    """What uvicorn does with the socket: asyncio's accepted transports."""
    seen: list[int] = []

    async def main() -> None:
        sock = listening_socket("127.0.0.1", 0)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted: socket.socket = writer.get_extra_info("socket")
            seen.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            port = sock.getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await reader.read()
            writer.close()
            await writer.wait_closed()

    asyncio.run(main())
    assert len(seen) == 1 and seen[0] != 0
