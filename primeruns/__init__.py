"""prime-runs: track RL evaluation and training runs on the Prime platform.

Every ``log_*`` call appends to a crash-safe local journal and returns; the
run's uplink (a process beside the producer) uploads the journal to the
platform and remembers, in the journal, what was acknowledged.
Nothing a call accepted is lost to a crash, a flaky network or a restart.

A leaf package: it imports no producer package (verifiers, pydantic, numpy);
records are duck-typed. ``import prime_runs`` gives this same package.
"""

from __future__ import annotations

from . import metrics, projection
from .exceptions import (
    APIError,
    APITimeoutError,
    ConfigurationError,
    EnvironmentResolutionError,
    ForbiddenError,
    JournalCorruptError,
    JournalError,
    JournalLockedError,
    LineFormatConflictError,
    NotFoundError,
    PaymentRequiredError,
    PrimeRunsError,
    RetryableAPIError,
    RunFinishedError,
    TraceTooLargeError,
    TransportError,
    UnauthorizedError,
    ValidationRejectedError,
)
from .joining import RunHandle, join
from .models import (
    CONFIG_SOURCE_KEY,
    ConfigSource,
    EnvironmentRef,
    RunKind,
    RunStatus,
    TrainingSpec,
)
from .opening import init
from .platform.settings import MODE_ENV, TRACES_OPT_OUT_ENV
from .run import Run

__version__ = "0.2.0"

__all__ = [
    "CONFIG_SOURCE_KEY",
    "MODE_ENV",
    "TRACES_OPT_OUT_ENV",
    "APIError",
    "APITimeoutError",
    "ConfigSource",
    "ConfigurationError",
    "EnvironmentRef",
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
    "Run",
    "RunFinishedError",
    "RunHandle",
    "RunKind",
    "RunStatus",
    "TraceTooLargeError",
    "TrainingSpec",
    "TransportError",
    "UnauthorizedError",
    "ValidationRejectedError",
    "init",
    "join",
    "metrics",
    "projection",
]
