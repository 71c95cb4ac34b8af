"""Places within ``--max-connections`` are not held by the slow or the keyless, over loopback.

Each window at the least rate (1 KiB/s) kept a body, or a reader of an
answer, its place for hours, and a client refused its key at the head kept
sending its body for as long as its ``Content-Length`` lasted: a local user
held every place so, and each new client was answered 503. Those are let go
for a new client; a client sending or reading at a normal rate keeps its
place. Each test waits on its sockets with a deadline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import ExitStack

import httpx
from test_slow_clients import (
    WAIT_S,
    _big_evaluation,
    _connect,
    _open,
    _own_answer,
    _read_at,
    _small_window,
    _until_closed,
    _until_read,
)

from primeruns.local import LocalPlatform

#: A request whose body of 1 MB is sent no further than its start.
_BODY_STARTED = (
    b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Authorization: Bearer pk-test\r\n"
    b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
    b'{"name": "'
)
_BUSY = {"detail": "too many connections: retry"}


def _healthz(platform: LocalPlatform) -> int:
    return httpx.get(
        f"{platform.url}/healthz", headers={"Authorization": "Bearer pk-test"}, timeout=WAIT_S
    ).status_code


def test_a_body_refused_its_key_at_the_head_holds_no_place(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A client without the key is answered 401 at its head; the rest of its
    body, read at the least rate only to be dropped, held its place for as
    long as its ``Content-Length`` lasted while every key holder was
    answered 503. Now a key holder takes its place, and it is closed."""
    platform = make_local_platform(api_key="the-key", max_connections=1, body_timeout=60)
    with _connect(platform) as sock:
        sock.sendall(_BODY_STARTED.replace(b"pk-test", b"not-the-key"))
        received = b""
        while b"}" not in received:  # (its answer, a small JSON body)
            chunk = sock.recv(65536)
            assert chunk, f"closed before its answer: {received!r}"
            received += chunk
            sock.sendall(b"x")
        assert received.startswith(b"HTTP/1.1 401 "), received[:200]
        served = httpx.get(
            f"{platform.url}/api/v1/evaluations/",
            headers={"Authorization": "Bearer the-key"},
            timeout=WAIT_S,
        )
        assert served.status_code == 200, served.text[:200]
        assert _until_closed(sock, trickle=b"x" * 1000).count(b"HTTP/1.1 ") == 0
    assert "Traceback" not in platform.log_path.read_text()


def test_bodies_sent_at_the_least_rate_give_their_places_to_a_new_client(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """Two bodies trickled past a second hold both places: a new client
    takes the place of one, which is answered 503 (``Retry-After``: the SDK
    retries), and the other goes on."""
    platform = make_local_platform(max_connections=2, body_timeout=60, head_timeout=60)
    with ExitStack() as stack:
        socks = list(_open(platform, stack, 2))
        for sock in socks:
            sock.sendall(_BODY_STARTED)
        started = time.monotonic()
        while time.monotonic() - started < 1.5:  # (past a second: progress is judged)
            for sock in socks:
                sock.sendall(b"x")
            time.sleep(0.1)
        assert _healthz(platform) == 200
        answers = []
        for sock in socks:
            sock.setblocking(False)
            try:
                first = sock.recv(65536)
            except BlockingIOError:
                continue  # (still open: the one left its place)
            sock.setblocking(True)
            answers.append(_own_answer(first + _until_closed(sock), 503))
        assert answers == [_BUSY]
    assert "Traceback" not in platform.log_path.read_text()


def test_a_body_sent_at_a_normal_rate_keeps_its_place(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A body sent at 1 MiB/s (a slow link's, not loopback's) over longer
    than progress is judged is never given up for a new client: the new
    one is answered 503, and the body's request is served. (Sixteen times
    the floor: a host stalling the sender a second still leaves it over.)"""
    platform = make_local_platform(max_connections=1, body_timeout=60)
    body = json.dumps(
        {"name": "steady", "environments": [{"id": "env"}], "metadata": {"pad": "x" * 2**21}}
    ).encode()
    piece = 64 * 1024
    with _connect(platform) as sock:
        sock.sendall(
            b"POST /api/v1/evaluations/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Authorization: Bearer pk-test\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        started = time.monotonic()
        for count, at in enumerate(range(0, len(body), piece)):
            sock.sendall(body[at : at + piece])
            time.sleep(1 / 16)
            # (Not after the last piece: the request is whole then, and its
            # answer and close may free the place before a newcomer comes.)
            last = at + piece >= len(body)
            if time.monotonic() - started > 1.2 and count % 4 == 0 and not last:
                with _connect(platform) as other:
                    assert _own_answer(_until_closed(other), 503) == _BUSY
        assert time.monotonic() - started > 1.5, "the body took less than progress is judged"
        received = _until_closed(sock)
    assert received.startswith(b"HTTP/1.1 20"), received[:200]


def test_a_reader_under_a_fair_rate_gives_its_place_to_a_new_client(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A client reading a large answer at 2 KiB/s, over the least rate of
    each window, held its place for the hours the answer lasted (6 MiB: 50
    minutes), and with one place, every other client was answered 503. Now
    a new client takes its place; the reader is let go."""
    platform = make_local_platform(max_connections=1, body_timeout=60, head_timeout=60)
    request = _big_evaluation(platform)
    reads = iter(range(10**9))

    def another_served(read: int) -> bool:
        # Asked once every ten reads (a second's): another client served.
        if next(reads) % 10:
            return False
        return _healthz(platform) == 200

    with _small_window(platform) as sock:
        sock.sendall(request)
        read = _read_at(sock, 2048, another_served)
    assert read < 2**20, "the slow reader was sent its whole answer"
    assert "Traceback" not in platform.log_path.read_text()


def test_a_reader_at_a_normal_rate_keeps_its_place(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A client reading a large answer at 2 MiB/s (a slow link's, not
    loopback's) over longer than progress is judged is never given up for
    a new client until it has read it whole: the new one is answered 503.
    (Kept alive: a connection closed after its answer, the rest the
    kernel's, holds no place.)"""
    platform = make_local_platform(max_connections=1, body_timeout=60)
    request = _big_evaluation(platform).replace(b"Connection: close\r\n", b"")
    with _connect(platform) as sock:
        sock.sendall(request)
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536)
        head, _, body = received.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        started = time.monotonic()
        reads = 0
        while len(body) < length:
            chunk = sock.recv(min(128 * 1024, length - len(body)))
            assert chunk, f"cut after {len(body)} of {length} bytes"
            body += chunk
            time.sleep(1 / 16)
            reads += 1
            if time.monotonic() - started > 1.2 and reads % 4 == 0 and len(body) < length:
                with _connect(platform) as other:
                    assert _own_answer(_until_closed(other), 503) == _BUSY
        assert time.monotonic() - started > 2, "the answer took less than two seconds"
    assert "Traceback" not in platform.log_path.read_text()


def test_bodies_each_under_a_second_pipelined_give_their_place_to_a_new_client(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A connection sending request after request, each body a byte at a
    time for under the second progress is judged after, the next head sent
    with the last byte of each (pipelined), held its place for as long as it
    liked at a few hundred bytes a second: each body's clock started at its
    head. Now a new client takes its place."""
    platform = make_local_platform(max_connections=1, body_timeout=60, head_timeout=60)
    head = _BODY_STARTED.replace(b"Content-Length: 1000000", b"Content-Length: 2")[:-10]
    with _connect(platform) as sock:
        sock.sendall(head + b"{")
        started = time.monotonic()
        served = []
        while 200 not in served and time.monotonic() - started < 4:
            time.sleep(0.5)
            sock.sendall(b"}" + head + b"{")
            if time.monotonic() - started > 2:
                served.append(_healthz(platform))
        assert 200 in served, served
        assert _until_closed(sock).count(b"HTTP/1.1 503 ") == 1  # (the one it was let go with)
    assert "Traceback" not in platform.log_path.read_text()


def test_a_body_slow_once_then_a_wait_leaves_the_next_body_unjudged_at_its_start(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A kept-alive client whose one body was slow (a second and a half for
    2 KB), then waited over a second (any new client could take its place
    as idle meanwhile), is not judged on that body when its next one is
    under way: a new client is answered 503 and the body is served."""
    platform = make_local_platform(max_connections=1, body_timeout=60, head_timeout=60)
    body = b'{"name": "' + b"x" * 2000 + b'", "environments": [{"id": "env"}]}'
    head = _BODY_STARTED.replace(b"Content-Length: 1000000", b"Content-Length: %d" % len(body))
    head = head[: -len(b'{"name": "')]
    with _connect(platform) as sock:
        sock.sendall(head)
        for at in range(0, len(body), len(body) // 15 + 1):
            sock.sendall(body[at : at + len(body) // 15 + 1])
            time.sleep(0.1)
        received = b""
        while b"}" not in received.partition(b"\r\n\r\n")[2]:
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 20"), received[:200]
        time.sleep(1.5)
        big = b'{"name": "' + b"x" * 2**20 + b'", "environments": [{"id": "env"}]}'
        sock.sendall(
            head.replace(b"Content-Length: %d" % len(body), b"Content-Length: %d" % len(big))
            + big[: 2**16]
        )
        _until_read(platform, sock)  # (its head handled: it waits on no head now)
        with _connect(platform) as other:
            assert _own_answer(_until_closed(other), 503) == _BUSY
        sock.sendall(
            big[2**16 :] + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        assert _until_closed(sock).startswith(b"HTTP/1.1 20")
    assert "Traceback" not in platform.log_path.read_text()


def test_answers_left_unread_in_the_send_queue_hold_no_place(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    """A client with the least receive window pipelines requests and reads
    none of their answers, which the socket's send queue takes whole (the
    server's writes never pause), then sends a byte of a next head now and
    then. Waiting on a head, it was not given up (its answer still going
    out), and judged on nothing (no answer waited on it, writes going): a
    new client was answered 503 up to the head's deadline. Now it is judged
    as the reader it is, and a new client takes its place."""
    platform = make_local_platform(max_connections=1, body_timeout=60, head_timeout=60)
    with _small_window(platform) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 40)
        _until_read(platform, sock)  # (its requests handled: it waits on a head)
        started = time.monotonic()
        served = []
        while 200 not in served and time.monotonic() - started < 4:
            time.sleep(0.5)
            sock.sendall(b"G")  # (a next head begun: no idle keep-alive to end)
            served.append(_healthz(platform))
        assert 200 in served, served
    assert "Traceback" not in platform.log_path.read_text()
