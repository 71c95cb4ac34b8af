"""A request's head and a pipelined client are bounded whether or not
httptools is installed: ``serve`` runs uvicorn's h11 protocol, which
uvicorn would swap for its httptools one wherever httptools is installed
(uvicorn[standard] brings it). That one holds a header line, a URL or a
chunked body's trailers however long they grow, and parses and queues every
request a client pipelines before any is answered, all before a route or a
key is checked. Honest requests on a kept-alive connection go on being
answered."""

from __future__ import annotations

import http.client
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from primeruns.local import LocalPlatform
from primeruns.local.cli import HEAD_LIMIT

MIB = 1024 * 1024
GROWN = 16 * MIB


@pytest.fixture(params=["httptools-installed", "httptools-absent"])
def parser_platform(
    request: pytest.FixtureRequest,
    make_local_platform: Callable[..., LocalPlatform],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[str, LocalPlatform]:
    if request.param == "httptools-installed":
        # As with uvicorn[standard] (the test extra installs it): uvicorn's
        # "auto" would pick it; serve must not.
        import httptools  # noqa: F401
    else:
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


def _goes_on(url: str) -> None:
    """The platform answers a new connection."""
    split = urlsplit(url)
    conn = http.client.HTTPConnection(split.hostname or "", split.port, timeout=30)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200, "the platform goes on"
    conn.close()


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
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:80]
    _goes_on(platform.url)


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


def _answers(sock: socket.socket, count: int) -> list[bytes]:
    """Read until ``count`` answers' status lines are in (or the platform
    closes, or 60 s pass); returns the status lines, in order."""
    got = bytearray()
    sock.settimeout(60)
    while got.count(b"HTTP/1.1 ") < count:
        data = sock.recv(1 << 20)
        if not data:
            break
        got += data
    return [part.split(b"\r\n", 1)[0] for part in bytes(got).split(b"HTTP/1.1 ")[1:]]


def test_requests_pipelined_faster_than_answered_are_not_held_parsed(
    parser_platform: tuple[str, LocalPlatform],
) -> None:
    """uvicorn's httptools protocol parses every request a read holds and
    queues each as a scope and a cycle (2 KB apiece), resuming reading after
    every answer: one connection sending minimal requests grew the platform
    by 650 MB in 5 s, before any route or key. h11 parses the next request
    only once the last is answered."""
    parser, platform = parser_platform
    split = urlsplit(platform.url)
    request = b"GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n" % split.netloc.encode()
    count = MIB // len(request)
    before = _peak_rss(platform.pid)
    with socket.create_connection((split.hostname, split.port), timeout=60) as sock:
        reader = ThreadPoolExecutor(1)
        answers = reader.submit(_answers, sock, count)
        sock.sendall(request * count)
        statuses = answers.result()
        reader.shutdown()
    grown = _peak_rss(platform.pid) - before
    assert grown < 8 * MIB, f"{parser}: peak RSS grew by {grown / MIB:.1f} MiB"
    assert statuses == [b"200 OK"] * count, f"{parser}: {len(statuses)} answers of {count}"


def test_pipelined_requests_are_all_answered_when_the_client_half_closes(
    parser_platform: tuple[str, LocalPlatform],
) -> None:
    """A script that writes its requests and shuts its side (printf | nc) is
    answered every one: uvicorn's httptools protocol reads on while requests
    are queued, sees the end of input and closes (44-49 of 300 answered)."""
    parser, platform = parser_platform
    split = urlsplit(platform.url)
    request = b"GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n" % split.netloc.encode()
    with socket.create_connection((split.hostname, split.port), timeout=60) as sock:
        sock.sendall(request * 300)
        sock.shutdown(socket.SHUT_WR)
        statuses = _answers(sock, 300)
    assert statuses == [b"200 OK"] * 300, f"{parser}: {len(statuses)} answers of 300"


def test_pipelined_requests_with_bodies_are_all_answered_in_order(
    parser_platform: tuple[str, LocalPlatform],
) -> None:
    """Pipelined requests with bodies, chunked or not, are each answered,
    in order, each with its own body."""
    parser, platform = parser_platform
    split = urlsplit(platform.url)
    host = b"Host: %s\r\n" % split.netloc.encode()
    get = b"GET /healthz HTTP/1.1\r\n" + host + b"\r\n"
    body = b'{"environments": [{"id": "e"}], "name": "' + b"x" * MIB + b'"}'
    post = (
        b"POST /api/v1/evaluations/ HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    chunked = (
        b"POST /api/v1/evaluations/ HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:1000], body[1000:]))
        + b"0\r\n\r\n"
    )
    requests = [get, get, post, get, chunked, get, post]
    with socket.create_connection((split.hostname, split.port), timeout=60) as sock:
        sock.sendall(b"".join(requests))
        statuses = _answers(sock, len(requests))
    expected = [b"201 Created" if r.startswith(b"POST") else b"200 OK" for r in requests]
    assert statuses == expected, parser


def test_an_upgrade_offer_is_an_ordinary_request_with_its_body(
    parser_platform: tuple[str, LocalPlatform],
) -> None:
    """No route upgrades (``ws="none"``), and curl --http2 offers h2c with
    every request, a POST's body too: the offer is an ordinary request, its
    body is its own and what follows the next request. uvicorn's httptools
    protocol hands the app no body (httptools skips an upgrade's) and drops
    the rest of the read."""
    parser, platform = parser_platform
    split = urlsplit(platform.url)
    host = b"Host: %s\r\n" % split.netloc.encode()
    get = b"GET /healthz HTTP/1.1\r\n" + host + b"\r\n"
    offer = (  # as curl --http2 sends it
        b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
    )
    body = b'{"environments": [{"id": "e"}], "name": "' + b"x" * MIB + b'"}'
    post = (
        b"POST /api/v1/evaluations/ HTTP/1.1\r\n" + host + offer + b"Content-Type: application/json"
        b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    with socket.create_connection((split.hostname, split.port), timeout=60) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n" + host + offer + b"\r\n" + get + post + get)
        statuses = _answers(sock, 4)
    assert statuses == [b"200 OK", b"200 OK", b"201 Created", b"200 OK"], parser


def test_a_head_of_many_short_headers_is_held_no_larger_than_its_bytes(
    parser_platform: tuple[str, LocalPlatform],
) -> None:
    """uvicorn's httptools protocol keeps each header of a head still coming
    in as Python objects, ~120 bytes however short the line: heads of 12,600
    "a:b" lines, under the limit in bytes, held 1.5 MB each (20 connections:
    30 MB) where h11 holds their 63 KB. And a browser's head, many headers
    and a large cookie (every local server's for 127.0.0.1), is answered."""
    parser, platform = parser_platform
    split = urlsplit(platform.url)
    host = b"Host: %s\r\n" % split.netloc.encode()
    before = _peak_rss(platform.pid)
    socks = [socket.create_connection((split.hostname, split.port), timeout=30) for _ in range(20)]
    try:
        for sock in socks:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n" + host + b"a:b\r\n" * 12_600)
        # Answered on the platform's one loop after the heads above were
        # read: they were readable (loopback) before this connects.
        conn = http.client.HTTPConnection(split.hostname or "", split.port, timeout=30)
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        assert response.status == 200, parser
        grown = _peak_rss(platform.pid) - before
    finally:
        for sock in socks:
            sock.close()
    assert grown < 8 * MIB, f"{parser}: peak RSS grew by {grown / MIB:.1f} MiB"
    browser = {f"X-Header-{i}": "v" * 40 for i in range(60)}
    browser["Cookie"] = "; ".join(f"c{i}={'v' * 400}" for i in range(120))
    conn.request("GET", "/healthz", headers=browser)
    assert conn.getresponse().status == 200, parser
    conn.close()


def _refusal(url: str, request: bytes) -> bytes:
    """What the platform answers ``request`` (sent raw), until it closes."""
    split = urlsplit(url)
    got = bytearray()
    with socket.create_connection((split.hostname, split.port), timeout=30) as sock:
        try:
            sock.sendall(request % split.netloc.encode())
            while data := sock.recv(1 << 16):
                got += data
        except (BrokenPipeError, ConnectionResetError):
            pass  # (a reset after the answer: what came is what was said)
    return bytes(got)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GARBAGE\r\nHost: %s\r\n\r\n", id="request-line"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: %s\r\nno colon here\r\n\r\n", id="header"),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nHost: %s\r\nContent-Length: x\r\n\r\n", id="length"
        ),
        pytest.param(
            # Unfinished past the limit: refused before its end comes.
            b"GET /healthz HTTP/1.1\r\nHost: %s\r\nX-Grow: " + b"a" * (HEAD_LIMIT + 1024),
            id="head-too-large",
        ),
    ],
)
def test_the_servers_own_refusals_carry_the_security_headers_and_name_no_server(
    local_platform: LocalPlatform, request_bytes: bytes
) -> None:
    """A head h11 cannot parse never reaches the app or its guard: uvicorn
    answered it 400 itself, without the CSP, frame and nosniff headers every
    other answer carries, as text/plain. Now that 400 carries them too, in
    the platform's JSON, and names no server or version."""
    answer = _refusal(local_platform.url, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:200]
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    assert b"default-src 'self'" in headers.get(b"content-security-policy", b""), head
    assert b"frame-ancestors 'none'" in headers[b"content-security-policy"]
    assert headers.get(b"x-frame-options") == b"DENY", head
    assert headers.get(b"x-content-type-options") == b"nosniff", head
    assert headers.get(b"content-type") == b"application/json", head
    assert b"server" not in headers, head
    assert b"uvicorn" not in answer.lower() and b"h11" not in answer.lower(), answer
    assert body == b'{"detail": "invalid HTTP request"}', body


@pytest.mark.parametrize("key", [None, "the-key"], ids=["no-key", "key"])
@pytest.mark.parametrize(
    "request_line",
    [
        pytest.param(b"POST /healthz HTTP/1.1", id="answered-at-once"),
        pytest.param(b"POST /api/v1/evaluations/ HTTP/1.1", id="key-checked-first"),
    ],
)
def test_a_request_refused_for_its_bad_body_logs_no_traceback(
    make_local_platform: Callable[..., LocalPlatform], key: str | None, request_line: bytes
) -> None:
    """A head that parses followed in the same read by a chunked body that
    does not (a bad chunk size) is a request the app starts on and a 400 the
    protocol sends at once. The app's own answer (a 401 without the key, a
    405), written after, met a connection that had already answered: every
    such request, from anyone who can connect, logged "Exception in ASGI
    application" and a traceback of some 50 lines. The 400 is the answer;
    the app's is dropped, as for a client gone."""
    platform = make_local_platform(api_key=key)
    answer = _refusal(
        platform.url,
        request_line + b"\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    # The app's turn came before this connection was accepted (one loop).
    _goes_on(platform.url)
    log = platform.log_path.read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]
