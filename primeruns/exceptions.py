"""The exceptions the SDK raises, under the vendor's names and attributes.

Two families, apart at their root, so one ``except`` clause says what a
caller means and clauses written for the vendor's ``prime-runs`` catch the
same errors here::

    Exception
    ├── PrimeRunsError                 this SDK itself, before or without a request
    │   ├── ConfigurationError         a setting is missing or invalid
    │   ├── EnvironmentResolutionError an environment could not be resolved
    │   ├── RunFinishedError           a write to a finished run
    │   └── JournalError               the local journal cannot be opened or used
    │       ├── JournalLockedError     another live process owns it
    │       ├── JournalFullError       its byte budget or the disk is full
    │       ├── JournalMovedError      replaced by one re-created at its path (internal)
    │       └── JournalCorruptError    its structure is damaged beyond reading
    └── prime_traces.PrimeTracesError  the platform: prime-traces' own classes
        ├── TraceTooLargeError         one JSONL line over the 64 MiB limit
        └── APIError                   an answer, or no answer (status_code, code)
            ├── UnauthorizedError          401
            ├── PaymentRequiredError       402
            ├── ForbiddenError             403 (a scope, the team, the service off)
            ├── NotFoundError              404
            ├── ValidationRejectedError    400
            ├── LineFormatConflictError    409 line_format_conflict
            ├── TraceNotIndexedError       409 trace_not_indexed
            ├── AmbiguousDeleteError       a delete whose answer was lost
            ├── RetryableAPIError          429, 5xx: retry after retry_after s
            │   └── UnprovenAnswerError    a 2xx that proves nothing (a page, ``{}``)
            └── TransportError             no HTTP answer
                └── APITimeoutError        the request timed out

The platform's classes *are* ``prime_traces.exceptions``' (as in the vendor's
SDK, where ``prime_runs.APIError is prime_traces.APIError``): an ``except
prime_traces.ForbiddenError`` catches a team outside the training allowlist.
``is_transient`` splits the transient failures (retry the same bytes later)
from the permanent ones. Under the default ``on_error="warn"`` no platform
error ever reaches a producer's loop; they are recorded in ``run.errors``.

Typical use::

    try:
        run = pr.init(kind="train", model="m", team_id="t")
    except pr.ForbiddenError:
        ...  # the team is not enabled for external training runs
    except pr.APIError as exc:
        ...  # exc.status_code, exc.code
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import traces_exceptions

if TYPE_CHECKING:
    from prime_traces.exceptions import (
        AmbiguousDeleteError,
        APIError,
        APITimeoutError,
        ForbiddenError,
        LineFormatConflictError,
        NotFoundError,
        PaymentRequiredError,
        PrimeTracesError,
        RetryableAPIError,
        TraceNotIndexedError,
        TraceTooLargeError,
        TransportError,
        UnauthorizedError,
        ValidationRejectedError,
    )

    from .platform.errors import UnprovenAnswerError

__all__ = [
    "APIError",
    "APITimeoutError",
    "AmbiguousDeleteError",
    "ConfigurationError",
    "EnvironmentResolutionError",
    "ForbiddenError",
    "JournalCorruptError",
    "JournalError",
    "JournalFullError",
    "JournalLockedError",
    "JournalMovedError",
    "LineFormatConflictError",
    "NotFoundError",
    "PaymentRequiredError",
    "PrimeRunsError",
    "PrimeTracesError",
    "RetryableAPIError",
    "RunFinishedError",
    "TraceNotIndexedError",
    "TraceTooLargeError",
    "TransportError",
    "UnauthorizedError",
    "UnprovenAnswerError",
    "ValidationRejectedError",
    "is_record_rejection",
    "is_transient",
]


# The platform's classes are loaded on first use, and without prime_traces'
# package, which brings its HTTP clients and models with it (0.1-0.3 s; see
# ``traces_exceptions``). ``UnprovenAnswerError`` lives with the
# platform's answers (``platform.errors``); every one is a name of this module.
def __getattr__(name: str) -> Any:
    if name == "UnprovenAnswerError":
        home = "primeruns.platform.errors"
    elif name in __all__:  # a name not defined below: prime_traces' own
        value = getattr(traces_exceptions.load(), name)
        globals()[name] = value
        return value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


class PrimeRunsError(Exception):
    """Base for errors the SDK raises itself, before or without any request."""


class ConfigurationError(PrimeRunsError):
    """A setting is missing or invalid (mode, API key, config file, opt-out value)."""


class EnvironmentResolutionError(PrimeRunsError):
    """An environment named in ``init()`` could not be resolved to a hub id."""


class RunFinishedError(PrimeRunsError):
    """A ``log_*`` or ``update_summary`` call was made on a finished run."""


# A call that was already journaling when another thread finished the run.
FINISHED_WHILE_LOGGING = (
    "the run was finished (by another thread) while this call journaled its records; "
    "they were not journaled. Finish the run after the threads that log to it are done"
)


class JournalError(PrimeRunsError):
    """The local journal could not be opened or used."""


class JournalLockedError(JournalError):
    """Another live process owns the journal; ``owner`` names its pid and host."""

    def __init__(self, message: str, *, owner: str | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class JournalMovedError(JournalError):
    """This journal handle was replaced by one re-created at its path after
    its directory was deleted or moved under the run; appends go there.

    Internal: the run's recorder appends again on the new journal, so
    ``log_*`` calls never see it.
    """


class JournalFullError(JournalError):
    """The journal has no room: its byte budget is reached or the disk is full.

    ``log_*`` calls never see it (the record is dropped and counted); a
    shipper that cannot record a batch or its acknowledgement backs off and
    retries, keeping everything journaled.
    """


class JournalCorruptError(JournalError):
    """The journal's structure (not one entry) is damaged beyond reading."""


def is_record_rejection(exc: BaseException) -> bool:
    """True when the failure is about this batch's content: later batches may pass."""
    platform = traces_exceptions.load()
    if isinstance(
        exc,
        TypeError
        | ValueError
        | platform.TraceTooLargeError
        | platform.ValidationRejectedError
        | platform.LineFormatConflictError,
    ):
        return True
    return isinstance(exc, platform.APIError) and exc.status_code in (413, 422)


def is_transient(exc: BaseException) -> bool:
    """True when the failure is about this moment (retry later), not this run."""
    platform = traces_exceptions.load()
    return isinstance(exc, platform.RetryableAPIError | platform.TransportError)
