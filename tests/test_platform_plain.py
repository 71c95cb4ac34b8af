"""The platform API's small calls on ``http.client`` (``platform.plain``)
answer and fail as the same calls through httpx did: over real sockets, kept
alive across threads, over verified TLS, with cookies, a proxy from the
environment, an answer cut short or trickled past its deadline."""

from __future__ import annotations

import dataclasses
import http.client
import importlib.util
import json
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from primeruns.exceptions import (
    APIError,
    APITimeoutError,
    ConfigurationError,
    NotFoundError,
    RetryableAPIError,
    TransportError,
    UnprovenAnswerError,
)
from primeruns.platform import PlatformClient, plain, resolve_settings
from primeruns.platform import client as client_module
from primeruns.platform.errors import is_ambiguous, never_reached
from primeruns.settings import Settings

#: Calls go straight to the test's servers, whatever proxy this machine sets.
pytestmark = pytest.mark.usefixtures("no_proxy")

TLS = Path(__file__).parent / "data" / "tls"  # a self-signed pair for 127.0.0.1, for tests only
KEY = "pk-plain-test-0123456789"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler, bytes], None]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.connections = 0
        self.closed = threading.Semaphore(0)  # one release per connection closed

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        self.connections += 1
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        super().shutdown_request(request)
        self.closed.release()

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that gave up at its deadline (what several tests make it
        # do) leaves this server writing to a closed socket: not news.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a platform's server
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.requests.append((self.command, self.path, dict(self.headers), body))
        self.server.answer(self, body)

    do_GET = do_PUT = do_POST

    def log_message(self, *args: object) -> None:
        pass


def _reply(
    handler: BaseHTTPRequestHandler,
    body: bytes,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def _echo(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    _reply(handler, json.dumps({"got": json.loads(body or b"null")}).encode())


@pytest.fixture
def serve() -> Iterator[Callable[..., _Server]]:
    servers: list[_Server] = []

    def start(
        answer: Callable[[BaseHTTPRequestHandler, bytes], None] = _echo,
        tls: ssl.SSLContext | None = None,
    ) -> _Server:
        server = _Server(answer)
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _client(server: _Server, scheme: str = "http") -> PlatformClient:
    port = server.server_address[1]
    root = f"{scheme}://127.0.0.1:{port}"
    settings = resolve_settings(
        api_key=KEY, base_url=root, environ={"PRIME_TRACES_URL": root}, config={}
    )
    return PlatformClient(settings)


def test_calls_from_several_threads_share_a_few_kept_alive_connections(
    serve: Callable[..., _Server],
) -> None:
    server = serve()
    client = _client(server)

    def call(i: int) -> dict[str, object]:
        return client.api("POST", "/rft/metrics", {"run_id": "r", "metrics": {"step": i}})

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(call, range(200)))
    assert answers == [{"got": {"run_id": "r", "metrics": {"step": i}}} for i in range(200)]
    assert server.connections <= 4
    method, path, headers, _ = server.requests[0]
    assert (method, path) == ("POST", "/api/v1/rft/metrics")
    assert headers["Authorization"] == f"Bearer {KEY}"
    assert headers["Content-Type"] == "application/json"
    assert headers["User-Agent"].startswith("prime-runs/")
    client.close()


def test_a_connection_the_server_closed_while_idle_is_not_used_again(
    serve: Callable[..., _Server],
) -> None:
    """A server's keep-alive timeout closes an idle connection without a
    word; a request sent on it would fail (or worse, be half sent)."""

    def answer_then_hang_up(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        _echo(handler, body)
        handler.close_connection = True  # no "Connection: close" said

    server = serve(answer_then_hang_up)
    client = _client(server)
    for step in range(10):
        answer = client.api("POST", "/rft/metrics", {"run_id": "r", "metrics": {"step": step}})
        assert answer == {"got": {"run_id": "r", "metrics": {"step": step}}}
        assert server.closed.acquire(timeout=10)  # the server has hung up before the next call
    assert server.connections == 10
    client.close()


def test_a_cookie_set_over_the_wire_goes_back_with_later_calls(
    serve: Callable[..., _Server],
) -> None:
    def set_once(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        extra = {"Set-Cookie": "lb=node-3; Path=/"} if len(handler.server.requests) == 2 else {}  # type: ignore[attr-defined]
        _reply(handler, b"{}", headers=extra)

    server = serve(set_once)
    client = _client(server)
    for step in range(4):
        client.api("POST", "/rft/metrics", {"run_id": "r", "metrics": {"step": step}})
    assert [headers.get("Cookie") for _, _, headers, _ in server.requests] == [
        None,
        None,
        "lb=node-3",
        "lb=node-3",
    ]
    client.close()


def test_a_proxy_in_the_environment_is_honoured(
    serve: Callable[..., _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A login node reaching the platform only through a proxy."""
    platform = serve()
    proxy = serve(lambda handler, body: _reply(handler, b'{"via": "proxy"}'))
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
    monkeypatch.setenv("NO_PROXY", "")
    client = _client(platform)
    assert client.api("POST", "/rft/metrics", {"run_id": "r"}) == {"via": "proxy"}
    ((_, target, _, _),) = proxy.requests
    assert target == f"http://127.0.0.1:{platform.server_address[1]}/api/v1/rft/metrics"
    assert platform.requests == []
    client.close()


def _server_tls() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS / "cert.pem", TLS / "key.pem")
    return context


def test_tls_is_verified_with_the_process_context(
    serve: Callable[..., _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(tls=_server_tls())
    # Not trusted: the process's context (the CA bundle) does not know the certificate.
    monkeypatch.setattr(client_module, "_tls", ssl.create_default_context())
    with pytest.raises(TransportError) as refused:
        _client(server, "https").api("POST", "/rft/metrics", {"run_id": "r"})
    assert never_reached(refused.value)
    assert KEY not in str(refused.value)
    assert server.requests == []
    # Trusted (as SSL_CERT_FILE would make it): answered, over one connection.
    monkeypatch.setattr(client_module, "_tls", ssl.create_default_context(cafile=TLS / "cert.pem"))
    client = _client(server, "https")
    for step in range(3):
        answer = client.api("POST", "/rft/metrics", {"run_id": "r", "metrics": {"step": step}})
        assert answer == {"got": {"run_id": "r", "metrics": {"step": step}}}
    assert len(server.requests) == 3
    client.close()


def test_an_answer_cut_short_is_an_ambiguous_failure(serve: Callable[..., _Server]) -> None:
    """The row may have been stored: the shipper must send it again, never
    count it done or lost."""

    def cut_short(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        handler.wfile.write(b'{"id": "')
        handler.close_connection = True

    server = serve(cut_short)
    with pytest.raises(TransportError) as failed:
        _client(server).api("POST", "/rft/metrics", {"run_id": "r"})
    assert is_ambiguous(failed.value) and not never_reached(failed.value)


def test_an_answer_trickled_past_its_deadline_is_cut_off(serve: Callable[..., _Server]) -> None:
    """A slow-loris answer, each byte inside the read timeout: the whole
    answer must come within it, or a shipper (or finish) is held for hours."""

    def trickle(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "200")
        handler.end_headers()
        try:
            for _ in range(200):
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(0.05)  # the server's pace, not a wait for the test
        except OSError:
            pass  # the client gave up, as it should
        handler.close_connection = True

    server = serve(trickle)
    start = time.monotonic()
    with pytest.raises(APITimeoutError):
        _client(server).api("POST", "/rft/metrics", {"run_id": "r"}, within=1.0)
    assert time.monotonic() - start < 5.0


def test_nothing_listening_is_a_platform_never_reached() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = resolve_settings(
        api_key=KEY, base_url=f"http://127.0.0.1:{port}", environ={}, config={}
    )
    with pytest.raises(TransportError) as failed:
        PlatformClient(settings).api("POST", "/rft/metrics", {"run_id": "r"})
    assert never_reached(failed.value) and not is_ambiguous(failed.value)
    assert f"127.0.0.1:{port}/api/v1/rft/metrics" in str(failed.value)


def test_a_large_body_and_a_query_go_as_they_did(serve: Callable[..., _Server]) -> None:
    server = serve()
    client = _client(server)
    big = {"run_id": "r", "samples": ["x" * 1000] * 200}  # ~200 KB: httpx's per-write timeout
    assert client.api("POST", "/evaluations/e/samples", big) == {"got": big}
    client.api("GET", "/rft/runs/r/metrics", params={"min_step": 3, "max_step": 3})
    assert server.requests[-1][1] == "/api/v1/rft/runs/r/metrics?min_step=3&max_step=3"
    client.close()


def test_errors_and_odd_bodies_are_taken_as_before(serve: Callable[..., _Server]) -> None:
    answers = iter(
        [
            (500, b'{"detail": "boom"}'),
            (404, b'{"detail": "no such run"}'),
            (200, b""),
            (200, b"<html>maintenance</html>"),
            (200, b"[1, 2]"),
        ]
    )

    def next_answer(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        status, text = next(answers)
        _reply(handler, text, status)

    client = _client(serve(next_answer))

    def call() -> dict[str, object]:
        return client.api("POST", "/rft/metrics", {"run_id": "r"})

    with pytest.raises(RetryableAPIError) as server_error:
        call()
    assert server_error.value.status_code == 500 and is_ambiguous(server_error.value)
    with pytest.raises(NotFoundError):
        call()
    assert call() == {}
    with pytest.raises(UnprovenAnswerError):
        call()
    assert call() == {"data": [1, 2]}
    client.close()


#: Answers' heads as a server, a proxy or a middlebox may send them, each
#: with the body ``{"ok": 1}``: the plain path must read each as httpx does.
_HEADS = {
    "folded header": b"HTTP/1.1 503 Busy\r\nRetry-After:\r\n \t7 \r\nContent-Length: 9\r\n\r\n",
    "blanks around values": b"HTTP/1.1 200 OK\r\nContent-Length:  9 \r\nX-A:\t a \r\n\r\n",
    "bare line feeds": b"HTTP/1.1 200 OK\nContent-Length: 9\n\n",
    "a line that is no header": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nnot a header\r\n\r\n",
    "a name with a space": b"HTTP/1.1 200 OK\r\nContent Length: 9\r\n\r\n",
    "continuation first": b"HTTP/1.1 200 OK\r\n Content-Length: 9\r\n\r\n",
    "length with a sign": b"HTTP/1.1 200 OK\r\nContent-Length: +9\r\n\r\n",
    "length with an underscore": b"HTTP/1.1 200 OK\r\nContent-Length: 0_9\r\n\r\n",
    "two lengths that differ": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nContent-Length: 7\r\n\r\n",
    "two lengths that agree": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nContent-Length: 9\r\n\r\n",
    "head cut short": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n",
    "a list of lengths that agree": b"HTTP/1.1 200 OK\r\nContent-Length: 9, 9\r\n\r\n",
    "a list of lengths that differ": b"HTTP/1.1 200 OK\r\nContent-Length: 9, 7\r\n\r\n",
    "a length of 5000 digits": b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
    "a length of 21 digits": b"HTTP/1.1 200 OK\r\nContent-Length: " + b"0" * 20 + b"9\r\n\r\n",
    "gzip, chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    "identity, with a length": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 9\r\n\r\n"
    ),
    "chunked, with a bad length": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n9\r\n"
    ),
    "a 204 said chunked": b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
    "a 204 with a length": b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n",
    "a NUL in a value": b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 9\r\n\r\n",
    "a carriage return in a value": b"HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 9\r\n\r\n",
    "a form feed before a length": b"HTTP/1.1 200 OK\r\nContent-Length: \x0c9\r\n\r\n",
    "a Latin-1 value": b"HTTP/1.1 200 OK\r\nX-A: caf\xe9\r\nContent-Length: 9\r\n\r\n",
    "150 headers": (
        b"HTTP/1.1 200 OK\r\n"
        + b"".join(b"X-%d: a\r\n" % i for i in range(150))
        + b"Content-Length: 9\r\n\r\n"
    ),
    "a line of 80 KB": (
        b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 80_000 + b"\r\nContent-Length: 9\r\n\r\n"
    ),
    "a head of 200 KB": (
        b"HTTP/1.1 200 OK\r\n"
        + b"".join(b"X-%d: " % i + b"a" * 4000 + b"\r\n" for i in range(50))
        + b"Content-Length: 9\r\n\r\n"
    ),
    "a 103 with a line that is no header": (
        b"HTTP/1.1 103 Early Hints\r\nnot a header\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"
    ),
}
_READ = {
    "folded header",
    "blanks around values",
    "bare line feeds",
    "two lengths that agree",
    "a list of lengths that agree",
    "a 204 said chunked",
    "a 204 with a length",
    "a Latin-1 value",
    "150 headers",
    "a line of 80 KB",
}


@pytest.mark.parametrize("case", sorted(_HEADS))
def test_an_answers_head_is_read_as_httpx_reads_it(
    serve: Callable[..., _Server], case: str
) -> None:
    """The plain path splits a head itself (the ``email`` package was a
    sixth of a sync's CPU): for each head, what a call answers or raises,
    the Retry-After it read and whether a failure is ambiguous, must be
    what the same call through httpx gives. A head h11 refuses (a line that
    is no header, a Content-Length that is not one number) is no answer: a
    row it answered may have been stored, and is sent again."""
    import httpx

    def raw(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.wfile.write(_HEADS[case] + (b"" if case == "head cut short" else b'{"ok": 1}'))
        handler.close_connection = True

    server = serve(raw)
    outcomes = []
    for transport in (None, httpx.HTTPTransport()):
        client = PlatformClient(_client(server).settings, transport=transport)
        try:
            outcomes.append(("answer", client.api("POST", "/rft/metrics", {"run_id": "r"})))
        except APIError as exc:
            retry_after = getattr(exc, "retry_after", None)
            outcomes.append((type(exc).__name__, is_ambiguous(exc), retry_after))
        finally:
            client.close()
    plain, through_httpx = outcomes
    assert plain == through_httpx
    if case in _READ:
        assert plain[0] != "TransportError"  # read, not refused


@pytest.mark.timeout(10)  # the regex this replaced took ~20 s on it: a hang, not a time target
def test_a_header_line_of_blanks_a_server_sends_is_refused_at_once(
    serve: Callable[..., _Server],
) -> None:
    """A header value of 100 KB of blanks and tabs, then a byte no value may
    hold: h11's regex (and the first version of the plain path's, the
    same) takes a time quadratic in the run of blanks, seconds of one
    shipper's CPU with the GIL held, the training loop beside it waiting.
    Refused at once, as h11 refuses it in the end: no answer."""

    def blanks(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.wfile.write(
            b"HTTP/1.1 200 OK\r\nX-Pad: "
            + b" \t" * 50_000
            + b"x\x00\r\nContent-Length: 2\r\n\r\n{}"
        )
        handler.close_connection = True

    client = _client(serve(blanks))
    with pytest.raises(TransportError) as failed:
        client.api("POST", "/rft/metrics", {"run_id": "r"})
    assert is_ambiguous(failed.value)
    client.close()


def test_a_mock_of_httpx_in_a_users_test_sees_every_call(
    serve: Callable[..., _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """respx replaces httpcore's pool's way out to see and answer requests
    (pytest-httpx and a monkeypatch replace httpx's transport's): code that
    mocked the vendor's SDK so must see this one's calls too, or a test
    without credentials would reach the network."""
    import httpcore

    seen: list[str] = []
    send = httpcore.ConnectionPool.handle_request

    def spy(self: httpcore.ConnectionPool, request: httpcore.Request) -> httpcore.Response:
        seen.append(request.url.target.decode())
        return send(self, request)

    server = serve()
    client = _client(server)
    client.api("POST", "/rft/metrics", {"run_id": "r"})  # before the mock: the plain path
    monkeypatch.setattr(httpcore.ConnectionPool, "handle_request", spy)
    for step in range(3):
        client.api("POST", "/rft/metrics", {"run_id": "r", "metrics": {"step": step}})
    assert seen == ["/api/v1/rft/metrics"] * 3
    assert len(server.requests) == 4
    client.close()


def test_an_informational_answer_is_skipped_as_httpx_skips_it(
    serve: Callable[..., _Server],
) -> None:
    """A 1xx (102 Processing, 103 Early Hints) comes before the answer, on
    the same connection: taken as the answer, it was a 2xx without a body
    (``{}``), and the real answer, still on its way, became the answer to
    the next request sent on that connection."""

    def hints_first(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.wfile.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n")
        handler.wfile.flush()  # on the wire before the answer is written
        _echo(handler, body)

    server = serve(hints_first)
    client = _client(server)
    for step in range(3):
        answer = client.api("POST", "/rft/metrics", {"run_id": "r", "metrics": {"step": step}})
        assert answer == {"got": {"run_id": "r", "metrics": {"step": step}}}
    client.close()


def test_a_switch_of_protocols_not_asked_for_is_no_answer(serve: Callable[..., _Server]) -> None:
    """A 101 to a request that asked for no upgrade is not the request's
    answer (httpx fails it as a protocol error): the row may or may not have
    been stored, and the connection, in another protocol now, is not used again."""

    def switch(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")

    server = serve(switch)
    client = _client(server)
    for _ in range(2):
        with pytest.raises(TransportError) as failed:
            client.api("POST", "/rft/metrics", {"run_id": "r"})
        assert is_ambiguous(failed.value) and not never_reached(failed.value)
    assert server.connections == 2
    client.close()


def _settings_with_key(base_url: str, key: str) -> Settings:
    """Settings carrying ``key`` as they are, for the client's own defence.

    ``resolve_settings`` refuses a key no header can carry (a control
    character, text beyond ASCII), naming the setting and never the key; a
    key that still reaches a client (settings built another way) must fail
    there too, on both paths alike, the key never shown."""
    good = resolve_settings(api_key=KEY, base_url=base_url, environ={}, config={})
    if any(not (" " <= c <= "~" or c == "\t") for c in key):
        with pytest.raises(ConfigurationError) as refused:
            resolve_settings(api_key=key, base_url=base_url, environ={}, config={})
        assert "api_key" in str(refused.value) and KEY[4:] not in str(refused.value)
    return dataclasses.replace(good, api_key=key)


def test_a_key_with_a_line_break_fails_as_through_httpx_without_showing_it(
    serve: Callable[..., _Server],
) -> None:
    """A key read from a file with its newline (``api_key=path.read_text()``):
    http.client refuses the header with a ValueError quoting its value, which
    escaped unscrubbed (a shipper logs an unexpected error with its text and
    retires). httpx fails it as a transport error, scrubbed."""
    server = serve()
    port = server.server_address[1]
    settings = _settings_with_key(f"http://127.0.0.1:{port}", KEY + "\n")
    client = PlatformClient(settings)
    with pytest.raises(TransportError) as failed:
        client.api("POST", "/rft/metrics", {"run_id": "r"})
    assert KEY not in str(failed.value) and "0123456789" not in str(failed.value)
    assert not is_ambiguous(failed.value) and not never_reached(failed.value)
    assert server.requests == []
    client.close()


@pytest.mark.parametrize("tail", ["\r\n X-Injected: 1", "\x00", "\n\t"])
def test_a_key_with_a_folded_line_or_a_nul_is_refused_as_httpx_refuses_it(
    serve: Callable[..., _Server], tail: str
) -> None:
    """http.client refuses a line break only where no blank follows it, and
    never a NUL: a key ending in a folded line went out as two lines (a
    server that does not fold takes the second for a header of its own),
    a NUL as it was. h11 refuses both before anything is sent: so does the
    plain path, on the first request (a line then written again was checked)."""
    server = serve()
    port = server.server_address[1]
    settings = _settings_with_key(f"http://127.0.0.1:{port}", KEY + tail)
    client = PlatformClient(settings)
    for _ in range(2):
        with pytest.raises(TransportError) as failed:
            client.api("POST", "/rft/metrics", {"run_id": "r"})
        assert KEY not in str(failed.value)
        assert not is_ambiguous(failed.value) and not never_reached(failed.value)
    assert server.requests == []
    client.close()


def test_each_call_has_its_own_deadline_on_a_kept_alive_connection(
    serve: Callable[..., _Server],
) -> None:
    """The connection a call is sent on may have been opened by a call with
    another deadline: ``within=`` (a closing run's bound) must hold on it,
    and a short one must not cut the calls that come after it on the same
    connection, as httpx applies each request's own timeout."""

    def slow_as_asked(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        time.sleep(json.loads(body)["pause"])  # the server's pace, not a wait for the test
        _reply(handler, b"{}")

    server = serve(slow_as_asked)
    client = _client(server)
    assert client.api("POST", "/rft/metrics", {"pause": 0}) == {}  # opens the connection
    start = time.monotonic()
    with pytest.raises(APITimeoutError):
        client.api("POST", "/rft/metrics", {"pause": 3}, within=0.5)
    assert time.monotonic() - start < 2.0
    assert client.api("POST", "/rft/metrics", {"pause": 0}, within=0.5) == {}
    assert client.api("POST", "/rft/metrics", {"pause": 1.0}) == {}  # 60 s to answer, not 0.5
    assert server.connections == 2  # the timed-out one was not used again
    client.close()


def test_a_mock_that_wraps_httpx_or_picks_its_transport_sees_every_call(
    serve: Callable[..., _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vcrpy replaces httpx's transport's way out with a ``functools.wraps``
    wrapper, which bears the original's module and name; respx's
    ``using="httpx"`` replaces the client's choice of transport. Either is a
    user's test answering the SDK's calls from a cassette or a route: a call
    on the plain path would go to the network instead."""
    import functools

    import httpx

    seen: list[str] = []
    handle = httpx.HTTPTransport.handle_request

    @functools.wraps(handle)
    def wrapped(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        seen.append(f"wrapped {request.url.path}")
        return handle(self, request)

    pick = httpx.Client._transport_for_url

    def picked(self: httpx.Client, url: httpx.URL) -> httpx.BaseTransport:
        seen.append(f"picked {url.path}")
        return pick(self, url)

    server = serve()
    client = _client(server)
    with monkeypatch.context() as patch:
        patch.setattr(httpx.HTTPTransport, "handle_request", wrapped)
        client.api("POST", "/rft/metrics", {"run_id": "r"})
    with monkeypatch.context() as patch:
        patch.setattr(httpx.Client, "_transport_for_url", picked)
        client.api("POST", "/rft/metrics", {"run_id": "r"})
    client.api("POST", "/rft/metrics", {"run_id": "r"})  # no mock: the plain path
    assert seen == ["wrapped /api/v1/rft/metrics", "picked /api/v1/rft/metrics"]
    assert len(server.requests) == 3
    client.close()


def test_a_host_name_beyond_ascii_is_named_as_httpx_names_it(
    serve: Callable[..., _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx sends an internationalized host name in its ASCII form
    (``xn--``) in the Host header; http.client sent its Latin-1 bytes, which
    a server or its proxy does not route (and a name beyond Latin-1 raised
    UnicodeEncodeError)."""

    def echo_host(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        _reply(handler, json.dumps({"host": handler.headers["Host"]}).encode())

    server = serve(echo_host)
    port = server.server_address[1]
    resolve = socket.getaddrinfo

    def here(host: object, *args: object, **kwargs: object) -> object:
        local = host in ("exämple.test", "xn--exmple-cua.test", b"xn--exmple-cua.test")
        return resolve("127.0.0.1" if local else host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", here)
    settings = resolve_settings(
        api_key=KEY, base_url=f"http://exämple.test:{port}", environ={}, config={}
    )
    client = PlatformClient(settings)
    assert client.api("POST", "/rft/metrics", {"run_id": "r"}) == {
        "host": f"xn--exmple-cua.test:{port}"
    }
    client.close()


def test_a_failed_answer_lets_go_of_its_connection_while_its_error_is_kept(
    serve: Callable[..., _Server],
) -> None:
    """A shipper keeps its last failure through its back-off: the error
    must not hold the connection of the answer that failed (its socket, a
    file descriptor, and the server's side of it) open, as httpx's do not."""
    hung_up = threading.Semaphore(0)

    def stall_then_wait_for_the_hang_up(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "10")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(b"{")
        handler.wfile.flush()
        handler.connection.settimeout(10)
        try:
            if handler.rfile.read(1) == b"":
                hung_up.release()
        except OSError:
            pass

    server = serve(stall_then_wait_for_the_hang_up)
    client = _client(server)
    kept: list[BaseException] = []
    for _ in range(3):
        with pytest.raises(APITimeoutError) as failed:
            client.api("POST", "/rft/metrics", {"run_id": "r"}, within=0.2)
        kept.append(failed.value)
        assert hung_up.acquire(timeout=5)  # the client closed its side, error kept or not
    client.close()


def _answer_before_the_body(status: int, body: bytes) -> tuple[int, threading.Event]:
    """A server that answers each request once its head is in, reads none
    of its body, and hangs up (as a proxy refusing a body too large does);
    its port, and an event set when it is stopped."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                conn.sendall(
                    b"HTTP/1.1 %d Refused\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (status, len(body), body)
                )
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], stop


@pytest.mark.parametrize("path", ["plain", "httpx"])
def test_an_answer_sent_before_a_large_body_was_read_is_the_outcome(path: str) -> None:
    """A 413 a server sends after the request's head, hanging up on the rest
    of a large body, is the answer (a request the sink drops, counted), as
    httpx takes it: not a failure to send, which would be resent for ever."""
    import httpx

    port, stop = _answer_before_the_body(413, b'{"detail": "too large"}')
    settings = resolve_settings(
        api_key=KEY, base_url=f"http://127.0.0.1:{port}", environ={}, config={}
    )
    transport = httpx.HTTPTransport() if path == "httpx" else None
    client = PlatformClient(settings, transport=transport)
    big = {"run_id": "r", "samples": ["x" * 1000] * 16_000}  # ~16 MB: past every buffer
    try:
        for _ in range(2):
            with pytest.raises(APIError) as refused:
                client.api("POST", "/evaluations/e/samples", big)
            assert refused.value.status_code == 413 and not is_ambiguous(refused.value)
            assert "too large" in str(refused.value)
    finally:
        stop.set()
        client.close()


def test_a_large_body_on_a_slow_link_has_each_write_within_the_timeout(
    serve: Callable[..., _Server],
) -> None:
    """A body that takes longer than the call's timeout to go out, each of
    its writes well within it, arrives (httpx bounds each write so; one
    timeout over the whole body would cut a large batch off on a slow link
    and resend it for ever)."""

    def read_slowly(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        _reply(handler, json.dumps({"bytes": len(body)}).encode())

    class SlowReader(_Handler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            chunks = []
            while length:
                chunk = self.rfile.read(min(length, 512 * 1024))
                chunks.append(chunk)
                length -= len(chunk)
                time.sleep(0.05)  # the slow link: ~10 MB/s
            self.server.answer(self, b"".join(chunks))

    server = serve(read_slowly)
    server.RequestHandlerClass = SlowReader
    # Little buffered at the server's end: what is left once the last write
    # went out (the client's send buffer) is read well within the timeout.
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    client = _client(server)
    body = b"x" * (16 * 1024 * 1024)  # past the sockets' buffers
    started = time.monotonic()
    answer = client.api("POST", "/evaluations/e/samples", body, within=1.0)
    assert answer == {"bytes": len(body)}
    assert time.monotonic() - started > 1.0  # (else the link was not slow: no test)
    client.close()


def test_a_spy_on_httpx_clients_send_sees_a_prime_traces_upload(
    serve: Callable[..., _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's test that records the SDK's requests by replacing
    ``httpx.Client.send`` (or ``httpx.Client`` with a subclass overriding
    it) saw every Prime Traces upload while they went through httpx: on the
    plain path, it sees none, and an upload meant for the spy reaches the network."""
    import httpx

    seen: list[str] = []
    send = httpx.Client.send

    def spy(self: httpx.Client, request: httpx.Request, **kwargs: object) -> httpx.Response:
        seen.append(request.url.path)
        return send(self, request, **kwargs)  # type: ignore[arg-type]

    class Recording(httpx.Client):
        def send(self, request: httpx.Request, **kwargs: object) -> httpx.Response:  # type: ignore[override]
            seen.append(f"subclass {request.url.path}")
            return super().send(request, **kwargs)  # type: ignore[arg-type]

    server = serve()
    upload = {"Content-Type": "multipart/form-data; boundary=b", "Idempotency-Key": "k"}
    with monkeypatch.context() as patch:
        patch.setattr(httpx.Client, "send", spy)
        client = _client(server)
        client.traces("POST", "/traces", content=b"null", headers=upload)
        client.close()
    with monkeypatch.context() as patch:
        patch.setattr(httpx, "Client", Recording)
        client = _client(server)
        client.traces("POST", "/traces", content=b"null", headers=upload)
        client.close()
    assert seen == ["/api/v1/traces", "subclass /api/v1/traces"]
    client = _client(server)  # nothing replaced: the plain path (http.client's Accept-Encoding)
    client.traces("POST", "/traces", content=b"null", headers=upload)
    client.close()
    plain = [headers["Accept-Encoding"] == "identity" for _, _, headers, _ in server.requests]
    assert plain == [False, False, True]


_FORK_DURING_LAZY_IMPORT = r"""
import importlib.abc, os, socket, sys, threading, time
sys.path.insert(0, sys.argv[1])
from primeruns.platform import PlatformClient, resolve_settings
assert "httpx" not in sys.modules
inside, go_on = threading.Event(), threading.Event()

class Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "httpx._client" and threading.current_thread() is not threading.main_thread():
            inside.set()  # httpx half imported, by a shipper's thread
            go_on.wait(0.5)
        return None

sys.meta_path.insert(0, Hold())
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
client = PlatformClient(resolve_settings(
    api_key="pk-x", base_url=f"http://127.0.0.1:{port}", environ={}, config={}))

def call():
    try:
        client.api("POST", "/rft/metrics", {"run_id": "r"})
    except Exception:
        pass

threading.Thread(target=call).start()  # its failure is the first: it imports httpx
assert inside.wait(10)
pid = os.fork()  # the user's fork (a pool of workers), mid-import
if pid == 0:
    call()  # the child's own client call, failing, needs httpx
    import httpx  # and so does the user's code
    os._exit(0)
go_on.set()
for _ in range(200):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(os.waitstatus_to_exitcode(status))
    time.sleep(0.05)
os.kill(pid, 9)
os.waitpid(pid, 0)
print("the child hung importing httpx")
sys.exit(3)
"""


def test_a_fork_while_a_thread_imports_httpx_leaves_the_child_able_to_import_it() -> None:
    """httpx is imported at a shipper thread's first failure, at any time:
    a process forked meanwhile (a user's pool of workers) inherits httpx
    half imported, its import lock held by a thread the child has not, and
    hung for ever at its first ``import httpx`` (the SDK's next failure, or
    the user's own code). A fork waits for that import to end."""
    import subprocess

    repo = str(Path(__file__).resolve().parent.parent)
    child = subprocess.run(
        [sys.executable, "-c", _FORK_DURING_LAZY_IMPORT, repo],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, (child.stdout + child.stderr)[-2000:]


_SIGNED = "X-Amz-Credential=AKIA%2F20261204%2Fus-east-1&X-Amz-Signature=0123abcdef"


def test_a_presigned_upload_goes_with_its_query_as_signed_and_no_platform_header(
    serve: Callable[..., _Server],
) -> None:
    """The training sample table's PUT to a presigned URL: its query (the
    store's signature) sent byte for byte, the object and its type, no key
    of the platform's; the store's answer is its status (S3 answers XML or
    nothing): taken, never read as the platform's JSON."""

    def stored(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        answer = b"<PutObjectResult/>"
        handler.send_response(200)
        handler.send_header("Content-Type", "application/xml")
        handler.send_header("Content-Length", str(len(answer)))
        handler.end_headers()
        handler.wfile.write(answer)

    server = serve(stored)
    client = _client(server)
    port = server.server_address[1]
    blob = b"PAR1" + b"\x00" * 200_000 + b"PAR1"  # past one write
    client.put_object(
        f"http://127.0.0.1:{port}/bucket/k.parquet?{_SIGNED}", blob, "application/parquet"
    )
    method, path, headers, body = server.requests[-1]
    assert (method, path, body) == ("PUT", f"/bucket/k.parquet?{_SIGNED}", blob)
    assert headers["Content-Type"] == "application/parquet"
    assert not {"Authorization", "x-api-key", "X-Prime-Team-ID"} & set(headers)
    assert "identity" in headers.get("Accept-Encoding", "identity")  # (not httpx's gzip, ...)
    client.close()


def test_a_refused_presigned_upload_is_named_without_its_signature(
    serve: Callable[..., _Server],
) -> None:
    """The URL's query is a credential for the object: an error names the
    store and the object's path, never the query (through httpx too)."""

    def refused(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        _reply(handler, b"<Error><Code>AccessDenied</Code></Error>", 403)

    server = serve(refused)
    port = server.server_address[1]
    for url in (
        f"http://127.0.0.1:{port}/bucket/k.parquet?{_SIGNED}",
        f"http://127.0.0.1:{port}/bucket/k.parquet?{_SIGNED}&odd=a%zz",  # left to httpx
    ):
        client = _client(server)
        with pytest.raises(APIError) as failed:
            client.put_object(url, b"PAR1", "application/parquet")
        assert failed.value.status_code == 403
        assert "0123abcdef" not in str(failed.value) and "/bucket/k.parquet" in str(failed.value)
        client.close()
    sent = [(path, headers["User-Agent"]) for _, path, headers, _ in server.requests]
    assert sent[0][0] == f"/bucket/k.parquet?{_SIGNED}" and sent[0][1].startswith("prime-runs/")
    assert sent[1][0] == f"/bucket/k.parquet?{_SIGNED}&odd=a%zz"  # httpx sends it as it is
    assert sent[1][1].startswith("python-httpx/")


def test_a_presigned_upload_is_logged_without_its_signature(
    serve: Callable[..., _Server], caplog: pytest.LogCaptureFixture
) -> None:
    """httpx logs each request's URL at INFO, and training scripts often turn
    INFO on (``logging.basicConfig(level=logging.INFO)``): a presigned URL's
    query, a credential for the object until it expires, went into the
    user's logs. The line keeps the store and the object's path; the
    user's own httpx requests are logged as they were."""
    server = serve(lambda handler, body: _reply(handler, b"", 200))
    port = server.server_address[1]
    client = _client(server)
    with caplog.at_level(logging.INFO, logger="httpx"):
        client.put_object(  # a query the plain path leaves to httpx
            f"http://127.0.0.1:{port}/bucket/k.parquet?{_SIGNED}&odd=a%zz", b"PAR1", "x"
        )
        httpx.get(f"http://127.0.0.1:{port}/own?mine=0123abcdef")
    client.close()
    assert server.requests[0][1].endswith(f"?{_SIGNED}&odd=a%zz")  # sent as it is
    [upload, own] = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert "/bucket/k.parquet" in upload and "0123abcdef" not in upload, upload
    assert "?mine=0123abcdef" in own, own


def test_a_call_in_flight_when_its_client_closes_lets_go_of_its_connection(
    serve: Callable[..., _Server],
) -> None:
    """``close()`` (a run's end) while a shipper's call waits for its
    answer: the connection goes when the call ends, not kept in a pool
    nobody uses again (a socket and the server's end of it held until a
    collection)."""
    answered = threading.Event()
    release = threading.Event()

    def held(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        answered.set()
        release.wait(10)
        _echo(handler, body)

    server = serve(held)
    client = _client(server)
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(client.api, "POST", "/rft/metrics", {"run_id": "r"})
        assert answered.wait(10)
        client.close()
        release.set()
        assert call.result(10) == {"got": {"run_id": "r"}}
    assert server.closed.acquire(timeout=10)  # the server saw the connection close


def test_a_presigned_upload_goes_with_the_host_and_path_httpx_sends(
    serve: Callable[..., _Server],
) -> None:
    """A presigned URL's signature covers its host and path (SigV4 signs
    the Host header): a URL httpx would send with another Host (a host
    name's capitals, a default port written out) or another path (``.`` and
    ``..`` segments, which httpx resolves) goes with what httpx sends, as it
    did before the upload took the plain path."""
    httpx = pytest.importorskip("httpx")

    def stored(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        _reply(handler, b"", 200)

    server = serve(stored)
    port = server.server_address[1]
    urls = [
        f"http://LocalHost:{port}/bucket/k.parquet?{_SIGNED}",
        f"http://127.0.0.1:{port}/bucket/./a/../k.parquet?{_SIGNED}",
        f"http://127.0.0.1:{port:05d}/bucket/k.parquet?{_SIGNED}",
    ]
    try:  # a default port written out: httpx leaves it out of the Host header
        on_80 = _Server(stored)
        on_80.server_close()
        on_80.socket = socket.create_server(("127.0.0.1", 80))
        on_80.server_address = on_80.socket.getsockname()
    except OSError:
        on_80 = None
    else:
        threading.Thread(target=on_80.serve_forever, daemon=True).start()
        urls.append(f"http://127.0.0.1:80/bucket/k.parquet?{_SIGNED}")
    try:
        for url in urls:
            client = _client(server)
            client.put_object(url, b"PAR1", "application/parquet")
            client.close()
            _, path, headers, _ = (on_80 if ":80/" in url else server).requests[-1]  # type: ignore[union-attr]
            expected = httpx.Request("PUT", url)
            assert (headers["Host"], path) == (
                expected.headers["Host"],
                expected.url.raw_path.decode(),
            ), url
    finally:
        if on_80 is not None:
            on_80.shutdown()
            on_80.server_close()


class _Writes:
    """A connected socket's stand-in: what each ``sendall`` was given."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))


def _written(conn: http.client.HTTPConnection, headers: dict[str, str]) -> list[bytes]:
    sock = conn.sock = _Writes()
    conn.request("POST", "/rft/metrics", body=b'{"run_id":"r"}', headers=headers)
    return sock.writes


def test_a_small_body_goes_in_one_write_with_its_head_as_the_same_bytes() -> None:
    headers = {"Host": "127.0.0.1:1", "Content-Type": "application/json"}
    ours = _written(plain._HTTPConnection("127.0.0.1", 1), headers)
    theirs = _written(http.client.HTTPConnection("127.0.0.1", 1), headers)
    assert len(theirs) == 2
    assert ours == [b"".join(theirs)]


def test_a_header_line_once_written_is_written_again_as_it_was_and_a_bad_one_always_fails() -> None:
    lines: dict[tuple[str, str], bytes] = {}
    headers = {"Host": "127.0.0.1:1", "Authorization": f"Bearer {KEY}", "X-N": "1"}
    expected = [b"".join(_written(http.client.HTTPConnection("127.0.0.1", 1), headers))]
    for _ in range(3):
        conn = plain._HTTPConnection("127.0.0.1", 1)
        conn.lines = lines
        assert _written(conn, headers) == expected
    assert (("Authorization", f"Bearer {KEY}") in lines) and not any(
        name == "Content-Length" for name, _ in lines
    )
    for bad, error in (("a\nb", ValueError), ("\u20ac", UnicodeEncodeError)):
        for _ in range(2):
            conn = plain._HTTPConnection("127.0.0.1", 1)
            conn.lines = lines
            with pytest.raises(error):
                _written(conn, {**headers, "X-Bad": bad})


#: Keys as they come from a file or a paste: blanks around them, a vertical
#: tab or form feed inside, text beyond ASCII; and keys h11 takes as they are.
_ODD_KEYS = [
    (KEY + " ", "refused"),
    (KEY + "\t", "refused"),
    (" " + KEY, "sent"),  # (after "Bearer ": blanks between words, which h11 takes)
    ("\t" + KEY, "sent"),
    (KEY[:4] + "\x0b" + KEY[4:], "refused"),
    (KEY[:4] + "\x0c" + KEY[4:], "refused"),
    (KEY + "é", "refused"),
    (KEY[:4] + " \t " + KEY[4:], "sent"),
    (KEY[:4] + "\x7f" + KEY[4:], "sent"),
    # A backslash or both quotes show escaped in h11's error, printable as they are.
    (KEY[:4] + "\\" + KEY[4:] + " ", "refused"),
    (KEY[:4] + "'\"" + KEY[4:] + " ", "refused"),
]


def _outcome(client: PlatformClient) -> str:
    """What a call came to: sent, or the error httpx (h11) gave it."""
    try:
        client.api("POST", "/rft/metrics", {"run_id": "r"})
    except TransportError as exc:
        assert KEY not in str(exc) and KEY[4:] not in str(exc)
        assert not is_ambiguous(exc) and not never_reached(exc)
        return "LocalProtocolError" if "LocalProtocolError" in str(exc) else str(exc)
    except UnicodeEncodeError as exc:
        # Its text names the character only; its arguments (a traceback's
        # locals, a caller's repr) held the whole header, the key in it.
        assert KEY[4:] not in repr(exc) and KEY[4:] not in str(exc.object)
        return "UnicodeEncodeError"
    return "sent"


@pytest.mark.parametrize(("key", "expected"), _ODD_KEYS)
def test_a_key_httpx_refuses_is_refused_on_the_plain_path_too_without_showing_it(
    serve: Callable[..., _Server], key: str, expected: str
) -> None:
    """``http.client`` sent a key with a blank around it, or a vertical tab
    or form feed in it, which h11 refuses before anything is sent, and a
    key beyond ASCII as Latin-1, which httpx refuses to encode: the same
    key went out or failed by which path a call took. Now each fails, or
    goes, on both paths alike, the key never in the error."""
    import httpx

    server = serve()
    settings = _settings_with_key(_client(server).settings.api_root, key)
    outcomes = []
    for transport in (None, httpx.HTTPTransport()):
        client = PlatformClient(settings, transport=transport)
        try:
            outcomes.append(_outcome(client))
        finally:
            client.close()
    plain_path, through_httpx = outcomes
    assert plain_path == through_httpx
    assert (plain_path == "sent") == (expected == "sent"), plain_path
    assert len(server.requests) == (2 if expected == "sent" else 0)


@pytest.mark.parametrize(
    "name", ["X-Team", "X Team", "X-Team ", " X-Team", "X\tTeam", "X:Team", "X(Team)", "X/Team", ""]
)
@pytest.mark.parametrize("value", ["tok", " tok", "tok ", "t\x0bok", "t\u00f8k"])
def test_a_header_httpx_refuses_is_refused_alike_on_the_plain_path(
    serve: Callable[..., _Server], name: str, value: str
) -> None:
    """Any header name and value, through ``PlainConnections`` and through
    httpx: refused alike before anything is sent (an error of the same
    class, the value never in the plain path's), or sent alike."""
    import httpx

    server = serve()
    port = server.server_address[1]
    connections = plain.PlainConnections(ssl.create_default_context)
    target = plain.Target("http", "127.0.0.1", port, f"127.0.0.1:{port}")
    headers = {"X-Good": "1", name: value}
    outcomes = []
    try:
        connections.request(
            target, "POST", "/api/v1/rft/metrics", headers, b"{}", plain.Deadlines(5, 5)
        )
        outcomes.append("sent")
    except (httpx.LocalProtocolError, UnicodeEncodeError) as exc:
        outcomes.append(type(exc).__name__)
        if isinstance(exc, httpx.LocalProtocolError):
            assert "tok" not in str(exc)
    finally:
        connections.close()
    with httpx.Client() as client:
        try:
            client.post(
                f"http://127.0.0.1:{port}/api/v1/rft/metrics", content=b"{}", headers=headers
            )
            outcomes.append("sent")
        except (httpx.LocalProtocolError, UnicodeEncodeError) as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes[0] == outcomes[1]
    sent = (name, value) == ("X-Team", "tok")  # the only one h11 takes
    assert (outcomes[0] == "sent") == sent, outcomes
    assert len(server.requests) == (2 if sent else 0)


def test_the_plain_paths_header_rules_are_h11s() -> None:
    """Copied from h11 (not imported: it loads at the first failure only):
    every byte, alone, between others and at either end, is taken or
    refused alike."""
    from h11 import _headers

    samples = [b"", b"a b", b"a \t b"]
    for byte in range(256):
        one = bytes([byte])
        samples += [one, b"a" + one + b"b", one + b"ab", b"ab" + one, b"a " + one + b" b"]
    for sample in samples:
        assert bool(plain._TOKEN.fullmatch(sample)) == bool(
            _headers._field_name_re.fullmatch(sample)
        ), sample
        assert bool(plain._FIELD_VALUE.fullmatch(sample)) == bool(
            _headers._field_value_re.fullmatch(sample)
        ), sample


def test_a_backlogs_requests_are_written_with_the_head_http_client_wrote_once(
    serve: Callable[..., _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync is one request a metrics row, alike but for the body, and
    ``http.client`` built each head anew (its request line, each header line
    and their checks: a fifth of the client's CPU a row). A head is built
    once for a method, path and headers, and written again with each body's
    length: every request's bytes are what ``http.client`` writes for it,
    on a kept-alive connection, and each is answered."""
    server = serve(_echo)
    client = _client(server)
    sent: list[bytes] = []
    asked: list[tuple[str, str, dict[str, str]]] = []
    built: list[str] = []
    send, request = plain._OneWrite.send, plain._OneWrite.request
    # (Spied below ``putrequest``: a replaced ``putrequest`` is a tracer's,
    # which sees every request built.)
    encode_request = http.client.HTTPConnection._encode_request  # type: ignore[attr-defined]

    def spy_send(self: http.client.HTTPConnection, data: bytes) -> None:
        sent.append(bytes(data))
        send(self, data)

    def spy_request(
        self: http.client.HTTPConnection,
        method: str,
        url: str,
        body: object,
        headers: dict[str, str],
        **kw: object,
    ) -> None:
        asked.append((method, url, dict(headers)))
        request(self, method, url, body, headers, **kw)  # type: ignore[arg-type]

    def spy_encode_request(self: http.client.HTTPConnection, line: str) -> bytes:
        built.append(line)
        return encode_request(self, line)  # type: ignore[no-any-return]

    monkeypatch.setattr(plain._OneWrite, "send", spy_send)
    monkeypatch.setattr(plain._OneWrite, "request", spy_request)
    monkeypatch.setattr(http.client.HTTPConnection, "_encode_request", spy_encode_request)
    bodies = [b'{"run_id":"r","metrics":{"step":%d%s}}' % (i, b',"x":1' * i * 7) for i in range(4)]
    for body in bodies:
        assert client.api("POST", "/rft/metrics", body) == {"got": json.loads(body)}
    client.close()
    assert server.connections == 1
    assert [body for _, _, _, body in server.requests] == bodies
    for (method, url, headers), body, wrote in zip(asked, bodies, sent, strict=True):
        theirs = http.client.HTTPConnection("127.0.0.1", 1)
        sock = theirs.sock = _Writes()  # type: ignore[assignment]
        http.client.HTTPConnection.request(theirs, method, url, body=body, headers=headers)
        assert wrote == b"".join(sock.writes)
    assert len(built) - len(bodies) == 1  # (each stock rendering above built one)


def test_a_tracer_wrapping_http_clients_putrequest_tags_every_request_with_its_own_header(
    serve: Callable[..., _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sentry's stdlib integration (on by default in ``sentry_sdk.init``) and
    ddtrace wrap ``HTTPConnection.putrequest``: each request starts a span
    and gets that span's ``sentry-trace`` header. A head kept for the
    backlog's rows must not stand in for that step: each row carries its
    own span's header, while the tracer is on; none, once it is off (a head
    kept while it was on carries a finished span's); and each row is
    answered, whichever way it was written."""
    server = serve(_echo)
    client = _client(server)
    stock = http.client.HTTPConnection.putrequest
    spans = iter(range(100))

    def traced(self: http.client.HTTPConnection, method: str, url: str, **kw: bool) -> None:
        stock(self, method, url, **kw)
        self.putheader("sentry-trace", f"{'a' * 32}-{next(spans):016x}")

    for phase, tracing in enumerate((True, False, True)):
        if tracing:
            monkeypatch.setattr(http.client.HTTPConnection, "putrequest", traced)
        else:
            monkeypatch.undo()
        for row in range(3):
            body = {"run_id": "r", "metrics": {"step": phase * 3 + row}}
            assert client.api("POST", "/rft/metrics", body) == {"got": body}
    client.close()
    assert server.connections == 1
    span = [f"{'a' * 32}-{n:016x}" for n in range(6)]
    assert [headers.get("sentry-trace") for _, _, headers, _ in server.requests] == [
        *span[:3],
        None,
        None,
        None,
        *span[3:],
    ]


@pytest.mark.parametrize("state", ["_CS_IDLE", "_CS_REQ_STARTED", "_CS_REQ_SENT"])
def test_an_http_client_without_one_of_its_state_names_takes_its_own_way(
    serve: Callable[..., _Server], monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """A kept head sets ``http.client``'s private state of a connection
    itself, its values read by name when the module is loaded. Another
    Python's ``http.client`` without one of those names (this one's, hidden
    while a copy of the module loads) must have every request take
    ``http.client``'s own way, never leave the connection in a state it
    does not know: each of a backlog's rows is answered on one connection."""
    spec = importlib.util.spec_from_file_location("plain_elsewhere", plain.__file__)
    assert spec is not None and spec.loader is not None
    elsewhere = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, elsewhere)  # (its dataclasses look it up)
    with monkeypatch.context() as hidden:
        hidden.delattr(http.client, state)
        spec.loader.exec_module(elsewhere)
    server = serve(_echo)
    port = server.server_address[1]
    target = elsewhere.Target("http", "127.0.0.1", port, f"127.0.0.1:{port}")
    connections = elsewhere.PlainConnections(ssl.create_default_context)
    for step in range(3):
        body = b'{"step": %d}' % step
        headers = {"Content-Type": "application/json"}
        answer = connections.request(
            target, "POST", "/rft/metrics", headers, body, elsewhere.Deadlines(5, 5)
        )
        assert (answer.status, json.loads(answer.body)) == (200, {"got": {"step": step}})
    connections.close()
    assert server.connections == 1
