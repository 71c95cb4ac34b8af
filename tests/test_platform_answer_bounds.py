"""An answer's body is read up to ``plain.MAX_ANSWER_BYTES``, on both of the
client's paths (``http.client`` and httpx), as sent and once decoded.

A broken or hostile platform (or a gateway in front of it) answering a 2 GB
body, an endless stream or a compression bomb to any request had the uplink
read all of it into memory within the call's deadline (60 s of an endless
stream over a fast link is gigabytes). Past the limit the answer is a failed
request that may have been acted on (retried, never a receipt), named by its
URL and never by its key.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import zstandard

from primeruns.exceptions import (
    APIError,
    UnauthorizedError,
    UnprovenAnswerError,
    ValidationRejectedError,
    is_transient,
)
from primeruns.platform import PlatformClient, plain, resolve_settings
from primeruns.platform.errors import is_ambiguous

#: Calls go straight to the test's servers, whatever proxy this machine sets.
pytestmark = pytest.mark.usefixtures("no_proxy")

KEY = "pk-bounds-test-0123456789"
_OVER = plain.MAX_ANSWER_BYTES + (1 << 20)  # a JSON answer just past the limit
_PAD = b'{"pad": "' + b"x" * _OVER + b'"}'  # valid JSON: read whole, it parses


class _Handler(BaseHTTPRequestHandler):
    """Keeps its connection open after an answer, as an HTTP/1.1 server may:
    a client that reused one it left mid-answer reads the rest as its next
    answer. (One that closed after answering, unannounced, raced the
    client's next request: "closed connection without response".)"""

    protocol_version = "HTTP/1.1"
    answer: Callable[[BaseHTTPRequestHandler], None]

    def handle(self) -> None:
        with contextlib.suppress(OSError):  # the client stopped reading, as it should
            super().handle()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).answer(self)

    do_PUT = do_GET = do_POST

    def log_message(self, *args: object) -> None:
        pass


def _chunked(handler: BaseHTTPRequestHandler, status: int = 200) -> None:
    """An answer of no stated length, in chunks: ``_PAD``."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for at in range(0, len(_PAD), 1 << 16):
        piece = _PAD[at : at + (1 << 16)]
        handler.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
    handler.wfile.write(b"0\r\n\r\n")


def _answering(
    body: bytes, coding: str | None = None, status: int = 200
) -> Callable[[BaseHTTPRequestHandler], None]:
    """An answer of ``body``, its length stated (in ``coding``, if any)."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        if coding is not None:
            handler.send_header("Content-Encoding", coding)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


_ANSWERS = {
    "chunked": _chunked,
    "said length": _answering(_PAD),
    "gzip bomb": _answering(gzip.compress(_PAD, 9), "gzip"),  # ~17 MB of JSON in ~17 KB
}


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[BaseHTTPRequestHandler], None]], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Callable[[BaseHTTPRequestHandler], None]) -> str:
        handler = type("Answering", (_Handler,), {"answer": staticmethod(answer)})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _client(root: str, transport: httpx.BaseTransport | None = None) -> PlatformClient:
    settings = resolve_settings(
        api_key=KEY, base_url=root, environ={"PRIME_TRACES_URL": root}, config={}
    )
    return PlatformClient(settings, transport=transport)


def _assert_cut_off(failed: pytest.ExceptionInfo[UnprovenAnswerError], where: str) -> None:
    """A transient failure that may have been acted on, naming the URL, not the key."""
    exc = failed.value
    assert is_transient(exc) and is_ambiguous(exc)
    assert where in str(exc) and str(plain.MAX_ANSWER_BYTES) in str(exc)
    assert KEY not in str(exc) and KEY not in repr(exc)


@pytest.mark.parametrize("answer", sorted(_ANSWERS))
@pytest.mark.parametrize("path", ["plain", "httpx"])
def test_an_answer_over_the_limit_is_a_failed_request_naming_its_url(
    serve: Callable[[Callable[[BaseHTTPRequestHandler], None]], str], answer: str, path: str
) -> None:
    root = serve(_ANSWERS[answer])
    # A transport of its own sends every call through httpx (``_plain_ok``).
    client = _client(root, httpx.HTTPTransport() if path == "httpx" else None)
    try:
        with pytest.raises(UnprovenAnswerError) as failed:
            client.api("POST", "/rft/metrics", {"run_id": "r"})
        _assert_cut_off(failed, f"POST {root}/api/v1/rft/metrics")
        with pytest.raises(UnprovenAnswerError) as failed:
            client.traces("GET", "/runs", params={"limit": 1})
        _assert_cut_off(failed, f"GET {root}/api/v1/runs")
    finally:
        client.close()


def _cut_short(status: int, sent: int) -> Callable[[BaseHTTPRequestHandler], None]:
    """An error saying it is longer than ``ERROR_BODY_BYTES`` (``_PAD``'s
    length), whose connection closes after ``sent`` bytes of it."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(_PAD)))
        handler.end_headers()
        handler.wfile.write(_PAD[:sent])
        handler.wfile.flush()
        handler.close_connection = True

    return answer


_ERRORS = {
    "chunked": lambda status: lambda handler: _chunked(handler, status),
    "said length": lambda status: _answering(_PAD, status=status),
    "gzip bomb": lambda status: _answering(gzip.compress(_PAD, 9), "gzip", status),
    "said length, cut short": lambda status: _cut_short(status, 1000),
    "said length, none sent": lambda status: _cut_short(status, 0),
}


@pytest.mark.parametrize("answer", sorted(_ERRORS))
@pytest.mark.parametrize("path", ["plain", "httpx"])
@pytest.mark.parametrize(
    ("status", "error"), [(401, UnauthorizedError), (400, ValidationRejectedError)]
)
def test_an_error_whose_body_is_over_the_limit_is_that_error(
    serve: Callable[[Callable[[BaseHTTPRequestHandler], None]], str],
    answer: str,
    path: str,
    status: int,
    error: type[APIError],
) -> None:
    """Found by an adversarial review: an error's status says what happened,
    its body only names it. Cut off past the limit, a 401 (which init()
    raises) was a transient unproven answer, retried as long as the run
    lived, and a 400 refusing a push's content (a validation error quoting
    the 20 MB push it refused) three transient strikes that retired the
    evaluation's sink, where the batch is counted failed and the rest ship.
    So is one that says it is longer and closes its connection before the
    limit (a gateway giving up on a large error page): it was an
    IncompleteRead, transient and ambiguous, the 401 retried likewise."""
    root = serve(_ERRORS[answer](status))
    client = _client(root, httpx.HTTPTransport() if path == "httpx" else None)
    try:
        for _ in range(2):  # and the connection after it is a sound one
            with pytest.raises(APIError) as failed:
                client.api("POST", "/rft/metrics", {"run_id": "r"})
            assert type(failed.value) is error and failed.value.status_code == status
            assert not is_transient(failed.value) and KEY not in str(failed.value)
    finally:
        client.close()


@pytest.mark.parametrize("path", ["plain", "httpx"])
def test_a_key_echoed_across_the_cut_of_an_error_body_is_not_shown_in_part(
    serve: Callable[[Callable[[BaseHTTPRequestHandler], None]], str], path: str
) -> None:
    """Found by an adversarial review: a server echoing the key where an
    error's body is cut (``plain.ERROR_BODY_BYTES``) left its first
    characters in the error, no longer whole to be masked (a page padded
    with blanks is read as text, and blanks are stripped): 20 of its 25
    characters were shown, where the body read whole had it masked."""
    shown = 20  # of the key, before the cut
    body = b" " * (plain.ERROR_BODY_BYTES - shown) + KEY.encode() + b" is not a valid key"
    root = serve(_answering(body, status=401))
    client = _client(root, httpx.HTTPTransport() if path == "httpx" else None)
    try:
        with pytest.raises(UnauthorizedError) as failed:
            client.api("POST", "/rft/metrics", {"run_id": "r"})
    finally:
        client.close()
    assert KEY[:shown] not in str(failed.value) and KEY[:8] not in repr(failed.value)
    assert str(failed.value).endswith("***")  # what was there is still said


def _zstd_bomb() -> bytes:
    """A JSON answer of 256 MiB in zstd: some 8 KB, a few bytes a 128 KiB block."""
    packer = zstandard.ZstdCompressor(level=3).compressobj()
    parts = [packer.compress(b'{"pad": "')]
    piece = b"x" * (1 << 20)
    parts += [packer.compress(piece) for _ in range(256)]
    parts += [packer.compress(b'"}'), packer.flush()]
    return b"".join(parts)


@pytest.mark.parametrize("path", ["plain", "httpx"])
def test_a_compression_bomb_is_cut_off_without_being_decoded_whole(
    serve: Callable[[Callable[[BaseHTTPRequestHandler], None]], str], path: str
) -> None:
    """Decoded a raw chunk at a time, its 8 KB decoded to 256 MiB in one call
    before a byte of it was counted; a slice at a time, it never holds much
    more than the limit."""
    root = serve(_answering(_zstd_bomb(), "zstd"))
    client = _client(root, httpx.HTTPTransport() if path == "httpx" else None)
    tracemalloc.start()
    try:
        with pytest.raises(UnprovenAnswerError) as failed:
            client.api("POST", "/rft/metrics", {"run_id": "r"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        client.close()
    _assert_cut_off(failed, f"POST {root}/api/v1/rft/metrics")
    assert peak < 3 * plain.MAX_ANSWER_BYTES, peak


def test_an_endless_stream_is_cut_off_at_the_limit_not_at_the_deadline() -> None:
    """An answer that never ends (here from a mock transport, as fast as it
    is read): cut off once past the limit, whatever time is left."""
    piece = b" " * (1 << 16)
    read = 0

    class Endless(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            nonlocal read
            while True:
                read += len(piece)
                yield piece

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "application/json"}, stream=Endless())

    client = _client("http://platform.test", httpx.MockTransport(handler))
    with pytest.raises(UnprovenAnswerError) as failed:
        client.api("POST", "/rft/metrics", {"run_id": "r"}, within=30.0)
    _assert_cut_off(failed, "POST http://platform.test/api/v1/rft/metrics")
    assert read <= plain.MAX_ANSWER_BYTES + 2 * len(piece)


def test_an_answer_within_the_limit_is_read_as_before(
    serve: Callable[[Callable[[BaseHTTPRequestHandler], None]], str],
) -> None:
    body = b'{"pad": "' + b"x" * (plain.MAX_ANSWER_BYTES - 64) + b'"}'

    root = serve(_answering(gzip.compress(body, 1), "gzip"))
    for transport in (None, httpx.HTTPTransport()):
        client = _client(root, transport)
        try:
            assert len(client.api("POST", "/rft/metrics", {"run_id": "r"})["pad"]) == len(body) - 11
        finally:
            client.close()
