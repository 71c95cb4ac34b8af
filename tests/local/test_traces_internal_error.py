"""An unexpected failure on a traces route answers in the traces service's envelope, over loopback.

The traces service answers every error as ``{"error": {"code", "message"}}``
(its code may be null), the platform API as ``{"detail": ...}``. A failure
no route expected (here the data folder lost a table under the running
platform) was answered in the platform API's words on every route, the
traces service's included, so a client of the service read a body its
contract does not have.
"""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import httpx

from primeruns.local import LocalPlatform

KEY = "internal-error-key"


def _lose_a_table(data: Path) -> None:
    """The data folder loses a table under the running platform: every read of it fails."""
    conn = sqlite3.connect(data / "platform.sqlite3")
    try:
        conn.execute("DROP TABLE episodes")
        conn.commit()
    finally:
        conn.close()


def test_an_unexpected_error_on_a_traces_route_is_the_services_envelope(tmp_path: Path) -> None:
    data = tmp_path / "data"
    headers = {"Authorization": f"Bearer {KEY}"}
    with LocalPlatform(data, api_key=KEY) as platform:
        _lose_a_table(data)
        traces = httpx.get(f"{platform.url}/api/v1/episodes", headers=headers, timeout=10)
        # The platform API's routes keep their own dialect.
        evaluations = httpx.get(f"{platform.url}/api/v1/evaluations/", headers=headers, timeout=10)
        platform_run = httpx.get(f"{platform.url}/_local/runs/r", headers=headers, timeout=10)
    assert traces.status_code == 500, traces.text
    assert traces.json() == {"error": {"code": None, "message": "internal error"}}
    assert evaluations.status_code == 200, evaluations.text
    assert platform_run.status_code == 500, platform_run.text
    assert platform_run.json() == {"detail": "internal error"}


def _answer_then_end(port: int, request: bytes) -> tuple[bytes, bytes]:
    """Send ``request`` on a raw connection; return the answer's head and what
    followed until the server closed it (raises if it stays open 10 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while True:  # until the server ends the connection (a read times out if it never does)
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    return head, rest


def test_an_unexpected_error_says_the_connection_ends(tmp_path: Path) -> None:
    """After a 500 the server ends the connection (its state is unknown: a
    body half read, a database row damaged); the answer must say so, or a
    client reuses the kept-alive connection and its next request meets a
    closed socket, read as an ambiguous failure of a request never answered."""
    data = tmp_path / "data"
    with LocalPlatform(data) as platform:
        _lose_a_table(data)
        port = int(platform.url.rsplit(":", 1)[1])
        ask = b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        for path in (b"/_local/runs/r", b"/api/v1/episodes"):
            head, rest = _answer_then_end(port, ask % path)
            assert head.startswith(b"HTTP/1.1 500 "), head
            assert b"\r\nconnection: close" in head.lower(), head
            assert b"internal error" in rest
