"""The exceptions the SDK raises, under the vendor's names and attributes.

Two families, kept apart so that one ``except`` clause says what a caller means:

- ``PrimeRunsError``: raised by the SDK itself before any request: bad settings,
  an unresolvable environment, a write to a finished run, a journal problem.
- ``APIError``: an answer (or a missing answer) from the platform. Its
  subclasses split *transient* failures (``RetryableAPIError``,
  ``TransportError``: retry the same bytes later) from *permanent* ones (the
  rest: retrying the same request cannot help).

Under the default ``on_error="warn"`` none of the ``APIError`` family ever
reaches a producer's loop; they are recorded in ``run.errors`` instead.

Typical use::

    try:
        run = pr.init(kind="train", model="m", team_id="t")
    except pr.ForbiddenError:
        ...  # the team is not enabled for external training runs
    except pr.APIError as exc:
        ...  # exc.status_code, exc.code
"""

from __future__ import annotations

__all__ = [
    "APIError",
    "APITimeoutError",
    "ConfigurationError",
    "EnvironmentResolutionError",
    "ForbiddenError",
    "JournalCorruptError",
    "JournalError",
    "JournalLockedError",
    "LineFormatConflictError",
    "NotFoundError",
    "PaymentRequiredError",
    "PrimeRunsError",
    "RetryableAPIError",
    "RunFinishedError",
    "TraceNotIndexedError",
    "TraceTooLargeError",
    "TransportError",
    "UnauthorizedError",
    "ValidationRejectedError",
    "is_record_rejection",
    "is_transient",
]


class PrimeRunsError(Exception):
    """Base for errors the SDK raises itself, before or without any request."""


class ConfigurationError(PrimeRunsError):
    """A setting is missing or invalid (mode, API key, config file, opt-out value)."""


class EnvironmentResolutionError(PrimeRunsError):
    """An environment named in ``init()`` could not be resolved to a hub id."""


class RunFinishedError(PrimeRunsError):
    """A ``log_*`` or ``update_summary`` call was made on a finished run."""


class JournalError(PrimeRunsError):
    """The local journal could not be opened or used."""


class JournalLockedError(JournalError):
    """Another live process owns the journal; ``owner`` names its pid and host."""

    def __init__(self, message: str, *, owner: str | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class JournalFullError(JournalError):
    """The journal has no room: its byte budget is reached or the disk is full.

    ``log_*`` calls never see it (the record is dropped and counted); a
    shipper that cannot record a batch or its acknowledgement backs off and
    retries, keeping everything journaled.
    """


class JournalCorruptError(JournalError):
    """The journal's structure (not one entry) is damaged beyond reading."""


class TraceTooLargeError(PrimeRunsError):
    """One JSONL line is over the service's 64 MiB per-line limit."""

    def __init__(self, line_number: int, size: int, limit: int) -> None:
        self.line_number = line_number
        self.size = size
        self.limit = limit
        super().__init__(
            f"line {line_number} is {size} bytes, over the {limit}-byte per-line limit"
        )


class APIError(PrimeRunsError):
    """The platform answered with an error, or could not be reached."""

    def __init__(
        self, message: str, *, status_code: int | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code


class UnauthorizedError(APIError):
    """401: the API key was rejected."""


class PaymentRequiredError(APIError):
    """402: the account needs billing attention."""


class ForbiddenError(APIError):
    """403: the key lacks a scope, the team is not allowed, or the service is off."""


class NotFoundError(APIError):
    """404: no such run, evaluation or object for this owner."""


class ValidationRejectedError(APIError):
    """400: the request's content was rejected; nothing was stored."""


class LineFormatConflictError(APIError):
    """409: a conflict, e.g. the same upload under another line format."""


class TraceNotIndexedError(APIError):
    """409 ``trace_not_indexed``: the trace exists but its index is still building."""


class RetryableAPIError(APIError):
    """429 or a 5xx (500 included): retry the same bytes after ``retry_after`` seconds."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code, code=code)
        self.retry_after = retry_after


class TransportError(APIError):
    """No HTTP answer: connection refused or reset, TLS failure, broken stream.

    ``ambiguous`` is True when the request may have reached the server (the
    failure came on the response path), False when it surely did not.
    """

    ambiguous: bool = True


class APITimeoutError(TransportError):
    """The request timed out at the transport level."""


def is_record_rejection(exc: BaseException) -> bool:
    """True when the failure is about this batch's content: later batches may pass."""
    if isinstance(
        exc,
        TypeError
        | ValueError
        | TraceTooLargeError
        | ValidationRejectedError
        | LineFormatConflictError,
    ):
        return True
    return isinstance(exc, APIError) and exc.status_code in (413, 422)


def is_transient(exc: BaseException) -> bool:
    """True when the failure is about this moment (retry later), not this run."""
    return isinstance(exc, RetryableAPIError | TransportError)
