"""A request's head is bounded whichever parser uvicorn has (httptools when
installed, h11 otherwise): a header line or a URL that grows without end is
refused before the platform holds it, and honest requests on a kept-alive
connection go on being answered."""

from __future__ import annotations

import http.client
import os
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from primeruns.local import LocalPlatform
from primeruns.local.http_head import HEAD_LIMIT

MIB = 1024 * 1024
GROWN = 16 * MIB
#: What each parser answers a head past the limit: our bound on httptools
#: says 431, h11's own refusal 400.
REFUSED_WITH = {"httptools": 431, "h11": 400}


@pytest.fixture(params=sorted(REFUSED_WITH))
def parser_platform(
    request: pytest.FixtureRequest,
    make_local_platform: Callable[..., LocalPlatform],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[str, LocalPlatform]:
    if request.param == "h11":
        # As on a machine without httptools: uvicorn falls back to h11.
        hidden = tmp_path / "hidden"
        (hidden / "httptools").mkdir(parents=True)
        (hidden / "httptools" / "__init__.py").write_text(
            "raise ModuleNotFoundError(\"No module named 'httptools'\", name='httptools')\n"
        )
        path = os.pathsep.join(filter(None, [str(hidden), os.environ.get("PYTHONPATH")]))
        monkeypatch.setenv("PYTHONPATH", path)
    return request.param, make_local_platform()


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _grow(url: str, opening: bytes) -> tuple[int, bytes]:
    """Send ``opening`` and then ``GROWN`` bytes of one head that never ends;
    returns how much was sent before the platform shut the connection, and
    what it answered (empty if the reset came first)."""
    split = urlsplit(url)
    sent = 0
    with socket.create_connection((split.hostname, split.port), timeout=30) as sock:
        sock.sendall(opening % split.netloc.encode())
        chunk = b"a" * (64 * 1024)
        try:
            while sent < GROWN:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            answer = sock.recv(4096)
        except ConnectionResetError:
            answer = b""
    return sent, answer


@pytest.mark.parametrize(
    "opening",
    [
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: %s\r\nX-Grow: ", id="header-line"),
        pytest.param(b"GET /healthz?%s", id="url"),
        pytest.param(
            # A route that reads its body whole, so nothing is answered before.
            b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
            b"\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: ",
            id="trailer",
        ),
    ],
)
def test_a_head_that_grows_without_end_is_refused_before_it_is_held(
    parser_platform: tuple[str, LocalPlatform], opening: bytes
) -> None:
    parser, platform = parser_platform
    before = _peak_rss(platform.pid)
    sent, answer = _grow(platform.url, opening)
    grown = _peak_rss(platform.pid) - before
    # The platform shut the connection long before the head's 16 MiB were in
    # (the socket buffers hold a few MiB on loopback), and never held them.
    assert sent < GROWN, f"{parser}: the whole {GROWN} bytes of one head were taken"
    assert grown < 4 * MIB, f"{parser}: peak RSS grew by {grown / MIB:.1f} MiB"
    if answer:  # a reset may overtake the answer; when it does not, it says why
        assert answer.startswith(b"HTTP/1.1 %d " % REFUSED_WITH[parser]), answer[:80]
    split = urlsplit(platform.url)
    conn = http.client.HTTPConnection(split.hostname or "", split.port, timeout=30)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200, "the platform goes on"
    conn.close()


def test_a_head_near_the_limit_and_large_bodies_go_on_on_one_connection(
    parser_platform: tuple[str, LocalPlatform],
) -> None:
    """A body's last read ends its request: none of it is taken for the next
    head, so a kept-alive connection carries one large upload after another;
    and a head just under the limit is answered."""
    parser, platform = parser_platform
    split = urlsplit(platform.url)
    conn = http.client.HTTPConnection(split.hostname or "", split.port, timeout=30)
    sock_before: socket.socket | None = None
    for size in (300 * 1024, 1 * MIB, 300 * 1024):
        conn.request(
            "POST",
            "/api/v1/evaluations/",
            body=b'{"environments": [{"id": "e"}], "name": "' + b"x" * size + b'"}',
            headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
        )
        response = conn.getresponse()
        answer = response.read()
        assert response.status < 300, f"{parser}: {response.status} {answer[:200]!r}"
        assert not response.will_close, f"{parser}: the platform closed after a {size}-byte body"
        assert sock_before is None or conn.sock is sock_before, f"{parser}: a new connection"
        sock_before = conn.sock
    conn.request("GET", "/healthz", headers={"X-Padding": "p" * (HEAD_LIMIT - 1024)})
    assert conn.getresponse().status == 200, parser
    conn.close()
