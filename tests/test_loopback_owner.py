"""A loopback platform a journal chose is checked at every new connection,
not only when the sync starts: a neighbour may take its port while it is
down, and the next connection would carry the user's key to it.

"Another user" is the kernel's tables (``/proc/net/tcp``, ``tcp6``) saying
so: here a copy of them the test writes, so that no root is needed; the
sockets and connections are real. ``tests/cli/test_cli_trust.py`` has the
end-to-end sync against a socket of a real second uid.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from primeruns import loopback_owner
from primeruns.exceptions import TransportError
from primeruns.loopback_owner import ServedByAnotherUserError, connected_to_another_user
from primeruns.platform import PlatformClient, resolve_settings
from primeruns.ship.policy import Failure, classify

#: Calls go straight to the test's servers, whatever proxy this machine sets.
pytestmark = pytest.mark.usefixtures("no_proxy")

KEY = "pk-loopback-owner-test-0123456789"
NEIGHBOUR = 4242  # neither this process's uid nor root's
_MAPPED = bytes(10) + b"\xff\xff"


def _hex(address: bytes) -> str:
    """A 16-byte address as the tables write it (four little-endian words)."""
    return "".join(f"{int.from_bytes(address[i : i + 4], 'little'):08X}" for i in range(0, 16, 4))


def _row(local: str, remote: str, state: str, uid: int) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid} 0 1 1"


def _tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tcp: list[str], tcp6: list[str]
) -> None:
    """The kernel's tables, as the test says they are."""
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    paths = []
    for name, rows in (("tcp", tcp), ("tcp6", tcp6)):
        path = tmp_path / name
        path.write_text("\n".join([head, *rows]) + "\n")
        paths.append(path)
    monkeypatch.setattr(loopback_owner, "_TABLES", tuple(paths))


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, int, int]]:
    """A real connection to a loopback listener: (client socket, the
    listener's port, the client's port)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as sock:
            yield sock, port, sock.getsockname()[1]


def test_the_far_end_of_a_connection_is_found_in_either_table(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    connection: tuple[socket.socket, int, int],
) -> None:
    """The socket that reads a connection (the listener's kernel made it,
    with the listener's owner) is found by its ends: in ``tcp`` for an
    IPv4 listener, in ``tcp6`` in the mapped form for a dual-stack one.
    Another connection's socket, or another port's listener, is not it."""
    sock, port, mine = connection
    v4 = "0100007F"
    far4 = _row(f"{v4}:{port:04X}", f"{v4}:{mine:04X}", "01", NEIGHBOUR)
    m6 = _hex(_MAPPED + bytes([127, 0, 0, 1]))
    far6 = _row(f"{m6}:{port:04X}", f"{m6}:{mine:04X}", "01", NEIGHBOUR)
    ours = _row(f"{v4}:{mine:04X}", f"{v4}:{port:04X}", "01", os.getuid())
    _tables(tmp_path, monkeypatch, [ours, far4], [])
    assert connected_to_another_user(sock, port) == NEIGHBOUR
    _tables(tmp_path, monkeypatch, [ours], [far6])
    assert connected_to_another_user(sock, port) == NEIGHBOUR
    other = _row(f"{v4}:{port:04X}", f"{v4}:{(mine + 1) % 65536:04X}", "01", NEIGHBOUR)
    elsewhere = _row(f"{v4}:{port + 1:04X}", "00000000:0000", "0A", NEIGHBOUR)
    _tables(tmp_path, monkeypatch, [ours, other, elsewhere], [])
    assert connected_to_another_user(sock, port) is None
    listening = _row(f"{v4}:{port:04X}", "00000000:0000", "0A", NEIGHBOUR)
    _tables(tmp_path, monkeypatch, [ours, listening], [])
    assert connected_to_another_user(sock, port) == NEIGHBOUR  # (its listeners count too)
    # A transport that does not show its socket: the port's listeners still count.
    assert connected_to_another_user(None, port) == NEIGHBOUR
    monkeypatch.setattr(loopback_owner, "_TABLES", (tmp_path / "none",))
    assert connected_to_another_user(sock, port) is None  # nothing known, nothing refused


class _Platform(ThreadingHTTPServer):
    """The user's own platform on loopback: answers ``{}``, closes each connection."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.keys: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request a connection: the next opens one
    server: _Platform

    def do_GET(self) -> None:
        self.server.keys.append(self.headers.get("Authorization", ""))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def _taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, chosen: bool
) -> tuple[PlatformClient, socket.socket, str]:
    """A client that called its loopback platform once; the platform then
    went down and a neighbour (by the tables: another user) listens on its
    port. ``chosen``: the journal chose the URL (else the user did)."""
    platform = _Platform()
    threading.Thread(target=platform.serve_forever, daemon=True).start()
    port = platform.server_address[1]
    url = f"http://127.0.0.1:{port}"
    settings = resolve_settings(
        api_key=KEY, base_url=url, environ={"PRIME_TRACES_URL": url}, config={}
    )
    if chosen:
        settings = replace(settings, journal_chosen=(url,))
    client = PlatformClient(settings)
    assert client.api("GET", "/ping") == {}  # the tables are the kernel's: the user's own
    platform.shutdown()
    platform.server_close()
    assert platform.keys == [f"Bearer {KEY}"]
    neighbour = socket.create_server(("127.0.0.1", port))
    neighbour.settimeout(10)
    v4 = "0100007F"
    _tables(tmp_path, monkeypatch, [_row(f"{v4}:{port:04X}", "00000000:0000", "0A", NEIGHBOUR)], [])
    return client, neighbour, url


def _what_it_got(neighbour: socket.socket) -> bytes:
    """What the neighbour read on the connection that came (till it closed)."""
    conn, _ = neighbour.accept()
    with conn:
        conn.settimeout(10)
        got = b""
        while chunk := conn.recv(65536):
            got += chunk
            if b"\r\n\r\n" in got:
                break  # a request's head: enough to see whether the key came
        return got


@pytest.mark.parametrize("path", ["plain", "httpx"])
def test_a_new_connection_to_a_journals_loopback_platform_another_user_took_sends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Checked at the start of the sync only, the port went to whoever took
    it while the platform was down: the next connection carried the key
    there. Now the new connection is checked before anything is sent (on
    the plain path and through httpx: a query httpx must write sends this
    one that way), the call fails naming the URL, the uid and the fix, and
    the neighbour reads nothing."""
    client, neighbour, url = _taken_over(tmp_path, monkeypatch, chosen=True)
    with neighbour:
        params = {"flag": True} if path == "httpx" else None  # (a bool: httpx writes it)
        with pytest.raises(ServedByAnotherUserError) as caught:
            client.api("GET", "/ping", params=params)
        assert _what_it_got(neighbour) == b""
    message = str(caught.value)
    assert url in message and f"uid {NEIGHBOUR}" in message and "--base-url" in message
    assert KEY not in message
    assert (caught.value.url, caught.value.uid) == (url, NEIGHBOUR)
    # Fatal for the sink that meets it: not retried, and no record counted lost.
    assert classify(caught.value) is Failure.FATAL
    client.close()


def test_a_platform_the_user_named_is_not_second_guessed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loopback URL of the user's own settings (``--base-url``) is theirs
    to choose: its connections are not checked (nor do they pay for it)."""
    client, neighbour, _ = _taken_over(tmp_path, monkeypatch, chosen=False)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            client.api("GET", "/ping", within=10)
        except BaseException as exc:  # (looked at below)
            outcome.append(exc)

    caller = threading.Thread(target=call)
    with neighbour:
        caller.start()
        got = _what_it_got(neighbour)  # (then closed: no answer)
    caller.join(15)
    assert b"GET /api/v1/ping" in got
    assert len(outcome) == 1 and isinstance(outcome[0], TransportError)
    client.close()


def test_a_journals_loopback_platform_is_reached_directly_whatever_proxy_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy in the environment (a login node's) took the calls to the
    journal's loopback platform: the key went to the proxy, whose loopback
    is its own machine's port (no check here says who serves that), and on
    a kept-alive connection to it no new connection to the port was ever
    checked. A journal's loopback platform is this machine's: it is called
    directly, each new connection checked, the proxy told nothing."""
    platform = _Platform()
    threading.Thread(target=platform.serve_forever, daemon=True).start()
    proxy = _Platform()  # (answers ``{}`` too: a proxy that forwarded the call)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{platform.server_address[1]}"
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        settings = resolve_settings(
            api_key=KEY, base_url=url, environ={"PRIME_TRACES_URL": url}, config={}
        )
        client = PlatformClient(replace(settings, journal_chosen=(url,)))
        assert client.api("GET", "/ping") == {}
        assert client.traces("GET", "/ping") == {}
        client.close()
        assert proxy.keys == []
        assert platform.keys == [f"Bearer {KEY}"] * 2
    finally:
        for server in (platform, proxy):
            server.shutdown()
            server.server_close()


def test_the_tables_are_read_in_the_machines_byte_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connection: tuple[socket.socket, int, int]
) -> None:
    """The kernel writes each 32-bit word of an address as the machine
    holds it: ``0100007F`` for 127.0.0.1 on a little-endian one, ``7F000001``
    on a big-endian one (s390x). Read as little-endian there, a neighbour on
    127.0.0.1 was on 1.0.0.127, not reached from loopback: nothing refused."""
    sock, port, mine = connection
    monkeypatch.setattr(sys, "byteorder", "big")
    v4 = "7F000001"
    listening = _row(f"{v4}:{port:04X}", "00000000:0000", "0A", NEIGHBOUR)
    _tables(tmp_path, monkeypatch, [listening], [])
    assert loopback_owner.served_by_another_user(port) == NEIGHBOUR
    m6 = (_MAPPED + bytes([127, 0, 0, 1])).hex().upper()  # (each word in network order)
    far6 = _row(f"{m6}:{port:04X}", f"{m6}:{mine:04X}", "01", NEIGHBOUR)
    _tables(tmp_path, monkeypatch, [], [far6])
    assert connected_to_another_user(sock, port) == NEIGHBOUR
    lo6 = _row(f"{'0' * 31}1:{port:04X}", f"{'0' * 32}:0000", "0A", NEIGHBOUR)  # ::1
    _tables(tmp_path, monkeypatch, [], [lo6])
    assert loopback_owner.served_by_another_user(port) == NEIGHBOUR
