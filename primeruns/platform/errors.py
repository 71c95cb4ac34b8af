"""Turn an HTTP answer, or the lack of one, into the SDK's exception family.

Both the platform API (FastAPI style ``{"detail": ...}``) and Prime Traces
(``{"error": {"code", "message"}}``) are read by one mapper (see
docs/ARCHITECTURE.md, "The wire"), so a caller's ``except`` clauses work the
same for every endpoint. Messages carry
the server's text and the request's method and path, never a header. The
server's text is the one way a key can come back (a proxy's debug page echoing
the request's headers), so it is scrubbed here, as it enters, of the request's
own credentials and any header echo (:mod:`primeruns.redaction`). A redirect
is an error too (the client follows none): it names where it pointed,
without credentials, so the user can correct the URL.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from typing import TYPE_CHECKING, Any

from ..exceptions import (
    APIError,
    APITimeoutError,
    ForbiddenError,
    LineFormatConflictError,
    NotFoundError,
    PaymentRequiredError,
    RetryableAPIError,
    TraceNotIndexedError,
    TransportError,
    UnauthorizedError,
    ValidationRejectedError,
)
from ..redaction import scrub, scrub_cut, url_for_display
from .plain import ERROR_BODY_BYTES

if TYPE_CHECKING:  # pragma: no cover
    import httpx

__all__ = [
    "RETRY_AFTER_CAP",
    "OversizeAnswerError",
    "UnprovenAnswerError",
    "error_from_response",
    "error_from_transport",
    "is_ambiguous",
    "never_reached",
    "oversize_answer",
    "parse_retry_after",
]


class UnprovenAnswerError(RetryableAPIError):
    """A 2xx that is not the answer its endpoint documents: an HTML page, JSON
    cut short, an empty body or ``{}`` where a receipt comes back (what a
    gateway or a maintenance page answers). The request may or may not have
    been acted on, so it is ambiguous: retried as a transient failure, never
    counted as stored, and resent only where a resend is safe."""


class OversizeAnswerError(UnprovenAnswerError):
    """An answer whose body was over the SDK's limit (``plain.MAX_ANSWER_BYTES``),
    as sent or once decoded: a broken or hostile server's 2 GB body, an
    endless stream, a compression bomb. It was not read further. The
    request may or may not have been acted on: a transient failure, as any
    answer that proves nothing, never a receipt."""


def oversize_answer(where: str, limit: int) -> OversizeAnswerError:
    """The error for an answer to ``where`` (method and URL, without a query
    or credentials) cut off past ``limit`` bytes."""
    return OversizeAnswerError(
        f"{where}: the answer was over {limit} bytes and was not read further (a broken or "
        "hostile server?); the request may or may not have been acted on"
    )


#: A server's Retry-After is honoured up to this many seconds.
RETRY_AFTER_CAP = 60.0

_BY_STATUS: dict[int, type[APIError]] = {
    400: ValidationRejectedError,
    401: UnauthorizedError,
    402: PaymentRequiredError,
    403: ForbiddenError,
    404: NotFoundError,
}
# 429 and every 5xx but "not implemented" and "version not supported": a 500
# is a server's bad moment (a restart, a proxy in front of it), not a verdict on
# the request; treating it as fatal retired sinks for good on a multi-day run.
# 408 too: whoever answered gave up receiving the request (primeruns serve's
# --body-timeout, a proxy's), and a request that stalled once (a suspended
# process, a loaded host) goes whole the next time. Resent as it is where a
# resend is safe; a create treats it as ambiguous (``is_ambiguous``).
_RETRYABLE = frozenset({408, 429} | set(range(500, 600)) - {501, 505})

# Failures after the request may have reached the server: it may have acted.
# (httpx's names: httpx is loaded only once a call went through it or failed.)
_RESPONSE_PATH = (
    "CloseError",
    "DecodingError",
    "ReadError",
    "ReadTimeout",
    "RemoteProtocolError",
    "WriteError",
    "WriteTimeout",
)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait per RFC 9110: delta-seconds (fractions allowed) or a date."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            # OverflowError: a year or an offset past what a datetime holds (a
            # broken gateway's header must not escape the error's mapping).
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP)


def _code_and_message(response: httpx.Response, secrets: list[str]) -> tuple[str | None, str]:
    try:
        body: Any = json.loads(response.content)
    except (ValueError, RecursionError):  # (nested past the recursion limit: a body like any)
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            return (str(code) if code else None), str(error.get("message") or "")
        if "detail" in body:
            return None, str(body["detail"])
    # Scrubbed whole, then cut: a key echoed across the cut would no longer
    # be there whole to be masked, and its first characters would be shown.
    # A body cut at its bound (``plain.ERROR_BODY_BYTES``) may end in the
    # first characters of a key echoed across the cut: masked as well.
    cut = len(response.content) >= ERROR_BODY_BYTES
    text = (scrub_cut if cut else scrub)(_text_of(response).strip(), *secrets)[:500]
    return None, text or f"HTTP {response.status_code}"


def _text_of(response: httpx.Response) -> str:
    """The body as text, in its declared charset where that reads it, else as
    UTF-8: a gateway's page may declare one its bytes are not in (UTF-16
    without its byte-order mark) or one that is no text encoding at all
    (``hex``, ``rot13``), and reading it then raises whatever that codec
    raises, which must not escape the mapping of the answer's status."""
    try:
        return response.text
    except Exception:
        return response.content.decode("utf-8", "replace")


def _credentials(request: httpx.Request) -> list[str]:
    """The secrets the request carried, as a server could echo them."""
    found = []
    for name in ("authorization", "x-api-key", "proxy-authorization"):
        value = request.headers.get(name)
        if value:
            found.append(value)
            found.append(value.partition(" ")[2])  # "Bearer <key>": the key alone
    return found


def _redirect_message(response: httpx.Response) -> str:
    location = response.headers.get("location")
    if not location:
        return "a redirect without a Location"
    import httpx

    try:
        target = url_for_display(str(response.request.url.join(location)))
    except (httpx.InvalidURL, ValueError):
        target = url_for_display(location)
    return (
        f"redirected to {target}; API calls follow no redirect (the key and the body "
        "would go with it): if that is the platform, point the base URL (or the traces "
        "URL) at it"
    )


def error_from_response(response: httpx.Response) -> APIError:
    """The exception for a response that is not a 2xx (a 3xx included)."""
    status = response.status_code
    request = response.request
    code: str | None = None
    secrets = _credentials(request)
    if 300 <= status < 400:
        message = _redirect_message(response)
    else:
        code, message = _code_and_message(response, secrets)
    message = scrub(message, *secrets)
    code = None if code is None else scrub(code, *secrets)
    where = f"{request.method} {request.url.path}"
    text = f"HTTP {status} from {where}: {message}"
    if status in _RETRYABLE:
        return RetryableAPIError(
            text,
            status_code=status,
            code=code,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
        )
    if status == 409:
        cls: type[APIError] = (
            TraceNotIndexedError if code == "trace_not_indexed" else LineFormatConflictError
        )
        return cls(text, status_code=status, code=code)
    return _BY_STATUS.get(status, APIError)(text, status_code=status, code=code)


def error_from_transport(
    exc: httpx.TransportError | httpx.DecodingError, where: str
) -> TransportError:
    """The exception for a request that got no HTTP answer."""
    import httpx

    cls = APITimeoutError if isinstance(exc, httpx.TimeoutException) else TransportError
    # A transport error can quote the server (a status line that is not
    # HTTP): scrubbed like any answer's text.
    error = cls(scrub(f"{where}: {type(exc).__name__}: {exc or 'no response'}"))
    error.ambiguous = isinstance(  # type: ignore[attr-defined]
        exc, tuple(getattr(httpx, name) for name in _RESPONSE_PATH)
    )
    # No connection was made at all (nothing listens, no route): the platform
    # was not reached, which a closing run gives up on sooner (``unreached``).
    error.unreached = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)  # type: ignore[attr-defined]
    return error


def never_reached(exc: BaseException) -> bool:
    """Whether ``exc`` is a request that never connected to the platform."""
    return isinstance(exc, TransportError) and bool(getattr(exc, "unreached", False))


def is_ambiguous(exc: BaseException) -> bool:
    """True when the server may have acted on the request although it failed:
    a 5xx (a server error can come after its commit), a 408, a 2xx that
    proves nothing (``UnprovenAnswerError``), or a transport failure after
    the request was sent.

    A 408 says whoever answered did not receive the request whole, but the
    SDK cannot tell who that was: a proxy in front of the platform may have
    passed on what it had read (the contract counts a 503 ambiguous for the
    same reason: an intermediary's, after forwarding), so the one request
    a resend could double, a run's create, is not resent blindly after it.
    """
    if isinstance(exc, UnprovenAnswerError):
        return True
    if isinstance(exc, RetryableAPIError):
        return exc.status_code is not None and (exc.status_code >= 500 or exc.status_code == 408)
    if isinstance(exc, TransportError):
        # Set on the errors this SDK raises; one from elsewhere may have gone out.
        return bool(getattr(exc, "ambiguous", True))
    return False
