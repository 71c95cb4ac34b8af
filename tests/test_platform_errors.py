"""Error mapping: every platform answer becomes the SDK exception a caller expects."""

from __future__ import annotations

import contextlib
import email.utils
import socket
import threading

import httpx
import pytest

from primeruns import exceptions as ex
from primeruns.platform import PlatformClient, resolve_settings
from primeruns.platform.errors import error_from_response, is_ambiguous, parse_retry_after
from primeruns.ship.policy import Failure, classify


def _response(
    status: int, body: bytes = b"", headers: dict[str, str] | None = None
) -> httpx.Response:
    request = httpx.Request("POST", "http://127.0.0.1/api/v1/traces")
    return httpx.Response(status, content=body, headers=headers, request=request)


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, ex.ValidationRejectedError),
        (401, ex.UnauthorizedError),
        (402, ex.PaymentRequiredError),
        (403, ex.ForbiddenError),
        (404, ex.NotFoundError),
        (409, ex.LineFormatConflictError),
        (429, ex.RetryableAPIError),
        (502, ex.RetryableAPIError),
        (503, ex.RetryableAPIError),
        (504, ex.RetryableAPIError),
        (413, ex.APIError),
        (500, ex.RetryableAPIError),  # a server error is its bad moment, not a verdict
        (501, ex.APIError),
    ],
)
def test_status_maps_to_exception(status: int, cls: type[ex.APIError]) -> None:
    err = error_from_response(_response(status, b'{"error":{"code":"c","message":"m"}}'))
    assert type(err) is cls
    assert err.status_code == status
    assert err.code == "c"
    assert "m" in str(err)


def test_fastapi_detail_and_plain_text_bodies() -> None:
    err = error_from_response(_response(401, b'{"detail":"bad token"}'))
    assert err.code is None and "bad token" in str(err)
    err = error_from_response(_response(502, b"<html>gateway</html>"))
    assert "gateway" in str(err)


def test_trace_not_indexed_is_its_own_409() -> None:
    err = error_from_response(
        _response(409, b'{"error":{"code":"trace_not_indexed","message":""}}')
    )
    assert isinstance(err, ex.TraceNotIndexedError)


def test_retry_after_parsing() -> None:
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("999") == 60.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    when = email.utils.format_datetime(email.utils.localtime().replace(microsecond=0), usegmt=False)
    assert parse_retry_after(when) == 0.0  # now or in the past: retry at once
    future = email.utils.formatdate(timeval=2_000_000_000 + 10, usegmt=True)
    assert parse_retry_after(future, now=2_000_000_000) == 10.0
    err = error_from_response(_response(429, b"", {"Retry-After": "2"}))
    assert isinstance(err, ex.RetryableAPIError) and err.retry_after == 2.0


@pytest.mark.parametrize(
    "value", ["01 Jan 99999999999 00:00:00 GMT", "Mon, 01 Jan 2020 00:00:00 +99999999999999999999"]
)
def test_a_retry_after_date_beyond_any_calendar_is_no_retry_after(value: str) -> None:
    """A date whose year or offset overflows a datetime (a broken or hostile
    gateway): before, its OverflowError escaped the error mapping, so init()
    raised it into the user's code and a shipper retired its sink on it."""
    assert parse_retry_after(value) is None
    err = error_from_response(_response(503, b"", {"Retry-After": value}))
    assert isinstance(err, ex.RetryableAPIError) and err.retry_after is None


_TOO_DEEP = b"[" * 100_000  # JSON nested past the interpreter's recursion limit


def _client_answering(status: int, body: bytes) -> PlatformClient:
    settings = resolve_settings(api_key="k-test", base_url="http://platform.test", config={})
    answer = httpx.Response(status, content=body, headers={"Content-Type": "application/json"})
    return PlatformClient(settings, transport=httpx.MockTransport(lambda _request: answer))


@pytest.mark.parametrize(
    ("status", "cls"), [(200, ex.UnprovenAnswerError), (503, ex.RetryableAPIError)]
)
def test_an_answer_nested_past_the_recursion_limit_is_an_api_error(
    status: int, cls: type[ex.APIError]
) -> None:
    """A broken or hostile gateway's body of 100,000 ``[``: before, the
    RecursionError of its parse escaped the client, so init() raised it into
    the user's code and a shipper took it for a fatal failure and retired
    its sink. Now it is the answer's usual error: a 2xx that proves nothing,
    or the status's own."""
    client = _client_answering(status, _TOO_DEEP)
    try:
        with pytest.raises(cls):
            client.api("POST", "/evaluations/", {"name": "x"})
    finally:
        client.close()


@pytest.mark.parametrize("charset", ["utf-16", "utf-32", "idna", "rot13", "hex", "undefined"])
def test_an_error_page_in_a_charset_no_decoder_takes_is_still_its_status_error(
    charset: str,
) -> None:
    """A gateway's error page declaring a charset its bytes cannot be read in
    (UTF-16 without its byte-order mark) or one that is no text encoding:
    before, the error of reading its text escaped the error mapping
    (UnicodeError, TypeError, AssertionError), so init() raised it into the
    user's code and a shipper took it for a fatal failure and retired its
    sink. Now it is the status's error, its text read as UTF-8."""
    headers = {"Content-Type": f"text/html; charset={charset}"}
    err = error_from_response(_response(503, b"<html>Bad gateway</html>", headers))
    assert isinstance(err, ex.RetryableAPIError) and "Bad gateway" in str(err)


def _serving_once_per_connection(answer: bytes) -> tuple[str, socket.socket]:
    """A loopback server sending ``answer`` to every request (no httpx in the
    way: a client without a testing transport takes its plain path)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}", server


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("path", ["plain", "httpx"])
def test_a_body_its_content_encoding_does_not_decode_is_an_ambiguous_transport_error(
    encoding: str, path: str
) -> None:
    """A 200 whose body is not in the Content-Encoding it declares (a proxy
    that mangled it): httpx raises DecodingError, which is not one of its
    TransportErrors. Before, it escaped the client, so init() raised it into
    the user's code and a shipper took it for a fatal failure and retired its
    sink. Now it is what the module meant it to be: a transport error on the
    response's path (the request may have been acted on), retried."""
    body = b'{"id": "not compressed"}'
    if path == "httpx":

        def answer(_request: httpx.Request) -> httpx.Response:
            headers = {"Content-Encoding": encoding}
            return httpx.Response(200, stream=httpx.ByteStream(body), headers=headers)

        settings = resolve_settings(api_key="k-test", base_url="http://platform.test", config={})
        client = PlatformClient(settings, transport=httpx.MockTransport(answer))
        server = None
    else:
        url, server = _serving_once_per_connection(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: "
            + encoding.encode()
            + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            + body
        )
        client = PlatformClient(resolve_settings(api_key="k-test", base_url=url, config={}))
    try:
        with pytest.raises(ex.TransportError) as raised:
            client.api("POST", "/evaluations/", {"name": "x"})
        assert is_ambiguous(raised.value) and ex.is_transient(raised.value)
    finally:
        client.close()
        if server is not None:
            server.close()


def test_gateway_errors_are_ambiguous_but_429_is_not() -> None:
    assert is_ambiguous(error_from_response(_response(503)))
    assert not is_ambiguous(error_from_response(_response(429)))
    assert ex.is_transient(error_from_response(_response(429)))
    assert ex.is_record_rejection(error_from_response(_response(422)))


def test_a_request_timed_out_receiving_is_retried_and_ambiguous_to_a_create() -> None:
    """408: whoever answered gave up reading the request (primeruns serve's
    --body-timeout answers it to a body silent too long), so the batch is
    resent, not the sink stopped for the run; but a proxy's 408 may come
    after it passed the request on, so it is ambiguous (a create is not
    resent blindly after it, as after a 503)."""
    body = b'{"detail": "request not received in time"}'
    err = error_from_response(_response(408, body, {"Retry-After": "1"}))
    assert classify(err) is Failure.TRANSIENT
    assert is_ambiguous(err)
    assert isinstance(err, ex.RetryableAPIError) and err.retry_after == 1.0
