"""A request's streamed response is freed as soon as it is read out: the
uplink runs the cyclic garbage collector seldom (``ship.uplink_main``), and
a response kept for it held a long run's backlog of them (~1,000 responses,
requests and headers; 10-20 MB of a 100,000-step run's uplink)."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from primeruns.platform.client import PlatformClient


class _Ok(BaseHTTPRequestHandler):
    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/object"
    finally:
        server.shutdown()
        server.server_close()


def test_a_read_out_response_does_not_wait_for_the_garbage_collector(url: str) -> None:
    streamed: list[weakref.ref[httpx.Response]] = []
    with httpx.Client() as client:
        send = client.send

        def send_and_note(request: httpx.Request, **kwargs: object) -> httpx.Response:
            response = send(request, **kwargs)  # type: ignore[arg-type]
            streamed.append(weakref.ref(response))
            return response

        client.send = send_and_note  # type: ignore[method-assign]
        request = client.build_request("PUT", url, content=b"x" * 1000)
        gc.disable()
        try:
            answer = PlatformClient._bounded(client, request, 10.0)
            assert answer.status_code == 200
            assert answer.json() == {"ok": True}
            assert len(streamed) == 1
            assert streamed[0]() is None  # freed by reference counting alone
        finally:
            gc.enable()
