"""A client slow to send, or one of too many, is answered and let go, over loopback.

Any local user can connect to ``primeruns serve``. A connection that sent
nothing, a head sent a byte at a time, or a body announced and never sent
was held for ever (a socket, the body read so far), and thousands of them
held the process's descriptors until nobody was served. Each test sets short
limits through the server's settings and waits on its socket, with a
deadline, for the answer and the close; none waits for the limits to pass
on the honest client's side.
"""

from __future__ import annotations

import fcntl
import json
import selectors
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from primeruns.local import LocalPlatform
from primeruns.local.guard import SECURITY_HEADERS
from primeruns.local.slow_clients import FULL_BODY

#: How long a test waits on its socket for what a short limit brings: a
#: bound on a hang, far past the limits set below.
WAIT_S = 30.0


def _port(platform: LocalPlatform) -> int:
    return int(platform.url.rsplit(":", 1)[1])


def _until_closed(sock: socket.socket, *, trickle: bytes = b"") -> bytes:
    """What the server sends until it closes ``sock``, sending ``trickle`` a
    byte at a time meanwhile (a client that never ends its request). A reset
    after its answer is a close too: the server closed with some of the
    request unread (a connection past the bound is closed as it is accepted)."""
    sock.settimeout(0.2 if trickle else WAIT_S)
    deadline = time.monotonic() + WAIT_S
    received = b""
    sent = 0
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if sent < len(trickle):
                sock.sendall(trickle[sent : sent + 1])
                sent += 1
            continue
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"still open after {WAIT_S} s; received {received[:200]!r}")


def _own_answer(received: bytes, status: int) -> dict[str, object]:
    """The server's own JSON answer ``status``, closing, with the guard's headers."""
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1.1 %d " % status), lines[0]
    headers = [tuple(line.split(b": ", 1)) for line in lines[1:]]
    assert (b"connection", b"close") in headers, headers
    assert (b"content-type", b"application/json") in headers, headers
    for header in SECURITY_HEADERS:
        assert header in headers, header
    answer: dict[str, object] = json.loads(body)
    return answer


def _connect(platform: LocalPlatform) -> socket.socket:
    return socket.create_connection(("127.0.0.1", _port(platform)), timeout=WAIT_S)


def test_a_connection_that_never_sends_is_closed(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    platform = make_local_platform(head_timeout=1)
    with _connect(platform) as sock:
        assert _until_closed(sock) == b""


@pytest.mark.parametrize("answered_before", [0, 3])
def test_a_head_sent_a_byte_at_a_time_is_answered_408(
    make_local_platform: Callable[..., LocalPlatform], answered_before: int
) -> None:
    """Bytes that keep coming do not move the head's deadline (a slowloris),
    on a new connection or on one kept alive after answers."""
    platform = make_local_platform(head_timeout=1)
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Pad: " + b"a" * 4096
    with _connect(platform) as sock:
        for _ in range(answered_before):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            received = b""
            while not received.endswith(b"}"):
                received += sock.recv(65536)
            assert received.startswith(b"HTTP/1.1 200 "), received
        sock.sendall(head[:10])
        answer = _own_answer(_until_closed(sock, trickle=head[10:]), 408)
    assert answer == {"detail": "request not received in time"}
    assert httpx.get(f"{platform.url}/healthz", timeout=WAIT_S).status_code == 200


#: A request whose body of 1 MB is sent no further than its start.
_BODY_STARTED = (
    b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
    b'{"name": "'
)


def test_a_body_that_stops_is_answered_408(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    platform = make_local_platform(body_timeout=1)
    with _connect(platform) as sock:
        sock.sendall(_BODY_STARTED)
        answer = _own_answer(_until_closed(sock), 408)
    assert answer == {"detail": "request not received in time"}
    assert "Traceback" not in platform.log_path.read_text()


def test_a_slow_body_that_keeps_moving_is_not_cut(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """The body's deadline is a silence, not a duration: a body sent in
    pieces over longer than it is taken whole, as an upload on a slow link.
    The silence allowed is a dozen times the client's pace: on a loaded host
    a pause of a second between two of its sends is no rare thing, and the
    test is about reads spread over longer than the deadline, not about how
    fast the host schedules it."""
    platform = make_local_platform(body_timeout=3, head_timeout=1)
    # 4 KiB/s, four times the least rate a body must keep past the deadline.
    pad = "x" * 16 * 1024
    body = json.dumps(
        {"name": "slow", "environments": [{"id": "env"}], "tags": [], "metadata": {"pad": pad}}
    ).encode()
    size = -(-len(body) // 16)
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    with _connect(platform) as sock:
        sock.sendall(
            b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        started = time.monotonic()
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.25)  # the client's pace: each piece well within the silence allowed
        assert time.monotonic() - started > 3, "the body took longer than the deadline"
        received = _until_closed(sock)
    assert received.startswith(b"HTTP/1.1 20"), received[:200]


def test_a_body_trickled_within_each_silence_is_answered_408(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A byte every fraction of the silence allowed never meets the silence;
    each window of the body deadline must carry a least rate (1 KiB/s), and
    a trickle is let go rather than holding its connection for hours."""
    platform = make_local_platform(body_timeout=2)
    with _connect(platform) as sock:
        sock.sendall(
            b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        )
        answer = _own_answer(_until_closed(sock, trickle=b'{"name": "' + b"x" * 1000), 408)
    assert answer == {"detail": "request not received in time"}
    assert "Traceback" not in platform.log_path.read_text()


def _open(platform: LocalPlatform, stack: ExitStack, count: int) -> Iterator[socket.socket]:
    for _ in range(count):
        yield stack.enter_context(_connect(platform))


def _body_under_way(sock: socket.socket) -> None:
    """Start a request on ``sock`` whose body is under way: its head read by
    the server (its ``100 Continue`` is the proof) and a byte of its body sent."""
    sock.sendall(
        b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n"
    )
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"closed before its 100 Continue: {received!r}"
        received += chunk
    assert received.startswith(b"HTTP/1.1 100 "), received
    sock.sendall(b"{")


def test_a_connection_past_the_bound_is_answered_503_and_the_server_goes_on(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """Every connection within the bound has a request under way: a new
    one is answered 503, and those go on."""
    platform = make_local_platform(max_connections=3)
    with ExitStack() as stack:
        held = list(_open(platform, stack, 3))
        for sock in held:
            _body_under_way(sock)
        with _connect(platform) as sock:
            sock.sendall(
                b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
            )
            received = _until_closed(sock)
        answer = _own_answer(received, 503)
        assert answer == {"detail": "too many connections: retry"}
        assert b"\r\nretry-after: 1\r\n" in received
        # A request within the bound is answered as ever (its body, ``{}``,
        # is no evaluation: the route's own 4xx).
        held[0].sendall(b"}")
        assert _until_closed(held[0]).startswith(b"HTTP/1.1 4")
    # Once they are closed, new connections are served again.
    deadline = time.monotonic() + WAIT_S
    while httpx.get(f"{platform.url}/healthz", timeout=WAIT_S).status_code != 200:
        assert time.monotonic() < deadline, "still refused once the connections closed"


def test_a_connection_past_the_bound_is_answered_503_before_it_sends_anything(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """Answered and closed as it is accepted: one that sends nothing does not
    hold a descriptor until the head's deadline (60 s here)."""
    platform = make_local_platform(max_connections=1, head_timeout=60)
    with _connect(platform) as busy:
        _body_under_way(busy)
        with _connect(platform) as sock:
            answer = _own_answer(_until_closed(sock), 503)
    assert answer == {"detail": "too many connections: retry"}


def _answered(sock: socket.socket, request: bytes) -> bytes:
    """The head of the server's answer to ``request`` on a kept-alive ``sock``,
    its body read (by its ``Content-Length``), the connection left open."""
    sock.sendall(request)
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"closed without an answer: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed within an answer"
        body += chunk
    return head


def test_connections_waiting_for_a_head_give_way_to_a_new_one_longest_first(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """Connections kept alive between requests, or trickling a head, held
    every place within the bound, and each new client was answered 503 for
    as long as they liked (a request every few seconds each). Now a new
    connection takes the place of the one that waited longest for a head,
    which is answered 503 (``Retry-After``: the SDK retries) and closed; the
    others are served."""
    platform = make_local_platform(max_connections=3, head_timeout=60)
    healthz = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with ExitStack() as stack:
        kept_alive = stack.enter_context(_connect(platform))
        assert _answered(kept_alive, healthz).startswith(b"HTTP/1.1 200 ")
        kept_alive.sendall(healthz[:9])  # (its next head, begun: no keep-alive close)
        trickling = list(_open(platform, stack, 2))
        for sock in trickling:
            sock.sendall(healthz[:9])
        served = httpx.get(f"{platform.url}/healthz", timeout=WAIT_S)
        assert served.status_code == 200, served.text
        received = _until_closed(kept_alive)
        assert _own_answer(received, 503) == {"detail": "too many connections: retry"}
        assert b"\r\nretry-after: 1\r\n" in received
        for sock in trickling:
            assert _answered(sock, healthz[9:]).startswith(b"HTTP/1.1 200 ")
    assert "Traceback" not in platform.log_path.read_text()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_bodies_held_past_the_memory_bound_are_answered_503(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """Each connection may hold a body up to its route's cap for as long as
    it keeps sending (26 MiB sent at the least rate takes seven hours): 512
    of them held 13 GiB. With 8 MiB allowed all told, clients
    sending 3 MiB of 4 MiB bodies and then waiting are held while they fit,
    those whose bytes pass the bound are answered 503 with Retry-After and
    closed, the server holds no more than the bound, and an honest request
    is served."""
    platform = make_local_platform(body_memory=8, body_timeout=60)
    piece = b"x" * 2**20
    with ExitStack() as stack:
        before = _rss_kib(platform.pid)
        socks = list(_open(platform, stack, 6))
        for sock in socks:
            sock.sendall(
                b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (4 * 2**20)
            )
            for _ in range(3):
                try:
                    sock.sendall(piece)
                except OSError:  # (answered 503 and closed while sending)
                    break
        # At most two 3 MiB bodies fit in 8 MiB: the other four are refused,
        # whichever of them the server reads first.
        assert _closed_after_503(socks, 4) == [json.loads(FULL_BODY)] * 4
        grown = _rss_kib(platform.pid) - before
        assert grown < 24 * 1024, f"the server grew by {grown} KiB holding bodies"
        assert httpx.get(f"{platform.url}/healthz", timeout=WAIT_S).status_code == 200
    assert "Traceback" not in platform.log_path.read_text()


#: Run ``python -m primeruns.local ARGS`` with the limit on open files (soft
#: and hard) given first.
_WITH_FILES = (
    "import resource, runpy, sys; files = int(sys.argv.pop(1)); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (files, files)); "
    "runpy.run_module('primeruns.local', run_name='__main__', alter_sys=True)"
)


def _serve_with_files(files: int, data: Path, *flags: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``serve`` allowed ``files`` descriptors, its output in a log beside ``data``."""
    log = data.parent / "server.log"
    with log.open("wb") as out:
        command = [sys.executable, "-c", _WITH_FILES, str(files), "--port", "0"]
        command += ["--data", str(data), *flags]
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    return server, log


def _until_listening(server: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + WAIT_S * 2
    while time.monotonic() < deadline and server.poll() is None:
        for line in log.read_text().splitlines():
            if "listening on http://" in line:
                return int(line.rsplit(":", 1)[1])
        time.sleep(0.05)
    raise AssertionError(f"serve did not start: {log.read_text()[-2000:]}")


def _closed_after_503(socks: list[socket.socket], count: int) -> list[dict[str, object]]:
    """The server's own 503s (each with ``Retry-After: 1``) to those of
    ``socks`` it answered and closed, waiting for ``count`` of them at most
    ``WAIT_S``; the others are left open."""
    received = {sock: b"" for sock in socks}
    answers: list[dict[str, object]] = []
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + WAIT_S
        while len(answers) < count and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    received[sock] += chunk
                    continue
                selector.unregister(sock)
                assert b"\r\nretry-after: 1\r\n" in received[sock], received[sock][:300]
                answers.append(_own_answer(received[sock], 503))
    return answers


def test_with_few_descriptors_the_bound_is_lowered_and_a_flood_is_let_go(
    tmp_path: Path,
) -> None:
    """Allowed 700 descriptors, fewer than 512 connections and the server's
    own need, serve lowers its bound to what fits and says so once; 1,000
    connections opened at once, sending nothing, are all answered 503 and
    closed but the bound's worth of the last (each new one takes the place
    of the one that waited longest for a head), nothing is logged for them
    (asyncio logged a traceback each time an accept ran out of descriptors),
    and a connection within the bound is served."""
    server, log = _serve_with_files(700, tmp_path / "data", "--head-timeout", "60")
    try:
        port = _until_listening(server, log)
        with ExitStack() as stack:
            socks = [
                stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=WAIT_S))
                for _ in range(1000)
            ]
            said = log.read_text()
            assert said.count("--max-connections lowered from 512 to ") == 1, said
            bound = int(said.split("--max-connections lowered from 512 to ")[1].split(":")[0])
            assert 0 < bound < 512
            assert len(_closed_after_503(socks, 1000 - bound)) == 1000 - bound
            socks[-1].setblocking(True)
            socks[-1].sendall(
                b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
            assert _until_closed(socks[-1]).startswith(b"HTTP/1.1 200 ")
        said = log.read_text()
        assert "Traceback" not in said and "cannot accept" not in said, said[-2000:]
    finally:
        server.terminate()
        server.wait(WAIT_S)


@pytest.mark.parametrize(
    ("flag", "given"),
    [
        ("--head-timeout", "0"),
        ("--body-timeout", "nan"),
        ("--head-timeout", "inf"),
        ("--max-connections", "-3"),
        ("--head-timeout", "0.001"),
        ("--body-timeout", "0.5"),
    ],
)
def test_a_limit_that_bounds_nothing_is_refused_naming_its_flag_and_default(
    tmp_path: Path, flag: str, given: str
) -> None:
    """A limit of 0, NaN, an infinity or a deadline under a second is refused
    at start (exit 2), the message naming that flag alone, what was given, its
    floor and its default: an infinite deadline would hold a silent connection
    for ever, and a tiny one answers every client 408."""
    command = [sys.executable, "-m", "primeruns", "serve", "--port", "0"]
    command += ["--data", str(tmp_path / "data"), flag, given]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve {flag} {given} was taken: the server ran")
    assert done.returncode == 2, done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert f"{flag} {given} is refused" in said, said
    assert "at least 1 (default " in said, said
    others = {"--head-timeout", "--body-timeout", "--max-connections"} - {flag}
    assert not any(other in said for other in others), said


@pytest.mark.parametrize("pipelined", [2, 8])
def test_a_client_that_never_reads_its_answers_does_not_hold_its_connection(
    make_local_platform: Callable[..., LocalPlatform], pipelined: int
) -> None:
    """Large answers to requests pipelined by a client that reads none of
    them fill its socket, and what is left of one waits for room that never
    comes: after the last answer (2: its close waits for it) or before the
    next (8). That wait is the client's silence too, bounded like a body's,
    so the connection is let go and the one slot it held serves another."""
    platform = make_local_platform(head_timeout=1, body_timeout=1, max_connections=1)
    key = {"Authorization": "Bearer pk-test"}
    created = httpx.post(
        f"{platform.url}/api/v1/evaluations/",
        json={"name": "big", "environments": [{"id": "env"}], "metadata": {"pad": "x" * 2**21}},
        headers=key,
        timeout=WAIT_S,
    )
    assert created.status_code < 300, created.text[:200]
    eval_id = created.json()["evaluation_id"]
    # Answers of 2 MiB each: two are past what loopback's buffers take (4 MiB).
    request = (
        b"GET /api/v1/evaluations/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer pk-test\r\n\r\n" % eval_id.encode()
    ) * pipelined
    with _connect(platform) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(request)
        deadline = time.monotonic() + WAIT_S
        while httpx.get(f"{platform.url}/healthz", timeout=WAIT_S).status_code != 200:
            assert time.monotonic() < deadline, "the client that never reads still holds its slot"
    assert "Traceback" not in platform.log_path.read_text()


def test_a_body_sent_fast_then_trickled_is_answered_408(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A body's rate is judged over its last window, not averaged since its
    head: 300 KB in half a second bought five minutes of a byte now and then (hours
    with 25 MiB), its connection held all along. Now the window after the
    fast one carries a few bytes, short of 1 KiB/s, and the body is let go."""
    platform = make_local_platform(body_timeout=2)
    with _connect(platform) as sock:
        sock.sendall(_BODY_STARTED)
        for _ in range(10):
            # Pieces the app takes as they come: reading never pauses (a
            # pause started the count again, and the fast bytes went uncounted).
            sock.sendall(b"x" * 30_000)
            time.sleep(0.05)
        answer = _own_answer(_until_closed(sock, trickle=b"x" * 1000), 408)
    assert answer == {"detail": "request not received in time"}
    assert "Traceback" not in platform.log_path.read_text()


def _big_evaluation(platform: LocalPlatform, pad: int = 6 * 2**20) -> bytes:
    """A request for an answer of ``pad`` bytes and some (an evaluation with
    that much metadata): 6 MiB is past what loopback's socket buffers take
    (4 MiB), so the server holds some of it until the client reads."""
    created = httpx.post(
        f"{platform.url}/api/v1/evaluations/",
        json={"name": "big", "environments": [{"id": "env"}], "metadata": {"pad": "x" * pad}},
        headers={"Authorization": "Bearer pk-test"},
        timeout=WAIT_S,
    )
    assert created.status_code < 300, created.text[:200]
    return (
        b"GET /api/v1/evaluations/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Authorization: Bearer pk-test\r\n\r\n" % created.json()["evaluation_id"].encode()
    )


def _small_window(platform: LocalPlatform) -> socket.socket:
    """A connection whose receive buffer is the least the system gives,
    set before it connects (the window it offers is then a few hundred
    bytes, not the 64 KiB it offered first): the server's send queue falls
    as the client reads, a few hundred bytes at a time."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    sock.settimeout(WAIT_S)
    sock.connect(("127.0.0.1", _port(platform)))
    return sock


def _read_at(sock: socket.socket, rate: int, until: Callable[[int], bool]) -> int:
    """Read ``sock`` at ``rate`` bytes a second, a tenth of a second's worth
    at a time, until ``until`` holds of what was read or the server closes
    (or resets) it; what was read."""
    sock.settimeout(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    read = 0
    while not until(read):
        assert time.monotonic() < deadline, f"{until.__name__} not met after {WAIT_S} s"
        try:
            chunk = sock.recv(max(1, rate // 10))
        except ConnectionResetError:
            return read
        if not chunk:
            return read
        read += len(chunk)
        time.sleep(0.1)
    return read


def test_a_reader_slower_than_the_least_rate_does_not_hold_its_connection(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A client reading a large answer a little at a time, never silent for
    the deadline but far under 1 KiB/s, held its connection for as long as
    the answer lasted (6 MiB at 400 B/s: four hours), and with one connection
    allowed, every other client was answered 503. Now an answer's rate is
    judged over each window as a body's is: the reader is let go, and the
    slot serves another client."""
    platform = make_local_platform(head_timeout=1, body_timeout=4, max_connections=1)
    request = _big_evaluation(platform)
    reads = iter(range(10**9))

    def another_served(read: int) -> bool:
        # Asked once every ten reads (a second's): another client served.
        if next(reads) % 10:
            return False
        return httpx.get(f"{platform.url}/healthz", timeout=WAIT_S).status_code == 200

    with _small_window(platform) as sock:
        sock.sendall(request)
        read = _read_at(sock, 400, another_served)
        assert read < 2**20, "the slow reader was sent its whole answer"
    deadline = time.monotonic() + WAIT_S
    while not another_served(0):
        assert time.monotonic() < deadline, "the slow reader still holds its slot"
    assert "Traceback" not in platform.log_path.read_text()


def test_a_reader_at_a_useful_rate_is_not_cut(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A client reading a large answer at a few KiB/s (a slow link's) goes
    on being sent it over several windows of the deadline."""
    # Windows of 5 s: a reader of this test stalled a few seconds by a
    # loaded host still takes eight times what the least rate asks.
    platform = make_local_platform(body_timeout=5)
    request = _big_evaluation(platform)
    with _small_window(platform) as sock:
        sock.sendall(request)
        # At 8 KiB/s at most: twelve seconds, over two windows.
        wanted = 96 * 1024
        started = time.monotonic()
        read = _read_at(sock, 8 * 1024, lambda read: read >= wanted)
        assert time.monotonic() - started > 10, "the reader took less than two windows"
    assert read >= wanted, f"cut after {read} bytes"


def _kernel_holds(platform: LocalPlatform, sock: socket.socket) -> int:
    """Bytes sent to ``sock`` that the kernel holds: what it may read (its
    receive queue) and the server's socket has not had taken (its send
    queue, ``tx_queue`` in Linux's /proc/net/tcp)."""
    readable = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    ends = (f":{_port(platform):04X}", f":{sock.getsockname()[1]:04X}")
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(ends[0]) and fields[2].endswith(ends[1]):
            return readable + int(fields[4].split(":")[0], 16)
    raise AssertionError("the server's end of the connection is not in /proc/net/tcp")


def _until_read(platform: LocalPlatform, sock: socket.socket) -> None:
    """Wait until the server has read every byte sent on ``sock``: none is
    in ``sock``'s send queue, nor in the receive queue of the server's end
    (``rx_queue`` in Linux's /proc/net/tcp). The server reads and handles a
    read in one turn of its loop, and accepts a new connection in another:
    one made after this returns finds what was sent handled."""
    ends = (f":{_port(platform):04X}", f":{sock.getsockname()[1]:04X}")
    deadline = time.monotonic() + WAIT_S
    while True:
        unsent = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        unread = None
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1].endswith(ends[0]) and fields[2].endswith(ends[1]):
                unread = int(fields[4].split(":")[1], 16)
        assert unread is not None, "the server's end of the connection is not in /proc/net/tcp"
        if not unsent and not unread:
            return
        assert time.monotonic() < deadline, f"the server left {unsent + unread} bytes unread"
        time.sleep(0.001)  # (polled: what ends the wait is the queues, not the time)


def _whole_answer(platform: LocalPlatform, request: bytes) -> int:
    """The bytes of the answer to ``request`` (one closing its connection)."""
    with _connect(platform) as sock:
        sock.sendall(request)
        return len(_until_closed(sock))


def test_a_close_waiting_on_a_client_that_reads_nothing_does_not_hold_its_connection(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """An answer a few KiB past what the kernel takes for a client that
    reads nothing leaves the rest in the server's transport, under the
    mark past which asyncio pauses its writes; the answer is complete and
    the connection closing, and a close waits for the rest to go out. No
    deadline ran there: the connection was held for ever. Now the rest
    waits on the client's least rate, and the slot serves another."""
    platform = make_local_platform(head_timeout=1, body_timeout=4, max_connections=1)
    pad = 6 * 2**20
    request = _big_evaluation(platform, pad)
    around = _whole_answer(platform, request) - pad  # (the answer's head and JSON)
    deadline = time.monotonic() + WAIT_S
    with _small_window(platform) as sock:
        sock.sendall(request)
        held, last = _kernel_holds(platform, sock), -1
        while held != last:  # (until the kernel's queues are full)
            assert time.monotonic() < deadline, "the kernel's queues never settled"
            time.sleep(0.2)
            held, last = _kernel_holds(platform, sock), held
    while httpx.get(f"{platform.url}/healthz", timeout=WAIT_S).status_code != 200:
        assert time.monotonic() < deadline, "the client that left still holds its slot"
    # 32 KiB past what the kernel held: half the transport's mark.
    request = _big_evaluation(platform, held + 2**15 - around)
    with _small_window(platform) as sock:
        sock.sendall(request)
        deadline = time.monotonic() + WAIT_S
        while httpx.get(f"{platform.url}/healthz", timeout=WAIT_S).status_code != 200:
            assert time.monotonic() < deadline, "the client that reads nothing holds its slot"
    assert "Traceback" not in platform.log_path.read_text()


def _open_from(platform: LocalPlatform) -> int:
    """Connections the server's end holds open (ESTABLISHED in Linux's
    /proc/net/tcp): one it let go with bytes unsent is the kernel's alone."""
    port = f":{_port(platform):04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[1].endswith(port) and line.split()[3] == "01")


def test_answers_held_for_clients_that_do_not_read_are_bounded(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A client that asks for a large answer and reads nothing held it in
    the server for a window (60 s by default), one reading 1 KiB/s for as
    long as the answer lasts (26 MiB: seven hours), and no bound counted it:
    twelve clients holding answers of 8 MiB grew the server by 470 MiB (each
    answer's copies on the way out), 512 of them by tens of GiB. Now what
    the transports hold of answers counts against ``body_memory`` with the
    bodies: with 8 MiB allowed, those past it are let go at once (the
    kernel, not the server, holds what their sockets had taken)."""
    platform = make_local_platform(body_memory=8, body_timeout=60)
    request = _big_evaluation(platform, 8 * 2**20)
    with ExitStack() as stack:
        for _ in range(12):
            stack.enter_context(_small_window(platform)).sendall(request)
        deadline = time.monotonic() + WAIT_S
        # Each holds some 4 MiB past its socket's queue: two fit, ten do not.
        while (held := _open_from(platform)) > 2:
            assert time.monotonic() < deadline, f"{held} connections hold their answers"
            time.sleep(0.2)
        assert httpx.get(f"{platform.url}/healthz", timeout=WAIT_S).status_code == 200
    assert "Traceback" not in platform.log_path.read_text()


def _answer_left_to_the_kernel(
    platform: LocalPlatform, sock: socket.socket, request: bytes
) -> bytes:
    """Send ``request`` (for an answer past what the kernel's queues take)
    on ``sock`` and read its answer until the server's transport holds none
    of it, the rest in the kernel's queues: what was read."""
    sock.sendall(request)
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head = received.partition(b"\r\n\r\n")[0]
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    whole = len(head) + 4 + length
    deadline = time.monotonic() + WAIT_S
    reads = 0  # (the kernel's count looked at every 64 reads: /proc is slow to read)
    while reads % 64 or len(received) + _kernel_holds(platform, sock) < whole:
        assert time.monotonic() < deadline, "the server's transport still holds some"
        received += sock.recv(65536)
        reads += 1
    return received


def test_a_connection_whose_answer_the_kernel_holds_keeps_its_place(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A client reading a large answer slowly, its next request begun, was
    taken for one waiting on a head once the server's transport had handed
    the answer's end to the kernel, and gave way to a new connection: its
    next request was answered 503, and where the socket's send queue had no
    room for that 503, the connection stayed open past the bound until the
    client read it all or its window ran out (120 s here). Now an answer the
    socket still holds is an answer going out: the connection keeps its
    place and is served, and the new one is answered 503."""
    platform = make_local_platform(max_connections=1, head_timeout=120, body_timeout=120)
    # 2 MiB: past what the kernel's queues take (1.6 MB, the client's
    # window the least), not by much, so the transport drains soon.
    request = _big_evaluation(platform, 2 * 2**20).replace(b"Connection: close\r\n", b"")
    healthz = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with _small_window(platform) as reader:
        received = _answer_left_to_the_kernel(platform, reader, request)
        reader.sendall(healthz[:1])  # (its next request, begun)
        with _connect(platform) as sock:
            answer = _own_answer(_until_closed(sock), 503)
        assert answer == {"detail": "too many connections: retry"}
        assert _open_from(platform) == 1
        reader.sendall(healthz[1:])
        reader.settimeout(WAIT_S)
        while received.count(b"HTTP/1.1 ") < 2 or not received.endswith(b"}"):
            chunk = reader.recv(65536)
            assert chunk, f"closed: {received[-300:]!r}"
            received += chunk
        first, second = received.split(b"\r\n\r\n", 1)[0], received.rsplit(b"HTTP/1.1 ", 1)[1]
        assert first.startswith(b"HTTP/1.1 200 "), first[:100]
        assert second.startswith(b"200 "), second[:300]
    assert "Traceback" not in platform.log_path.read_text()
