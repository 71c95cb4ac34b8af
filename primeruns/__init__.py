"""prime-runs: track RL evaluation and training runs on the Prime platform.

Every ``log_*`` call appends to a crash-safe local journal and returns; the
run's uplink (a process beside the producer) uploads the journal to the
platform and remembers, in the journal, what was acknowledged.
Nothing a call accepted is lost to a crash, a flaky network or a restart.

A leaf package: it imports no producer package (verifiers, pydantic, numpy);
records are duck-typed. ``import prime_runs`` gives this same package.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

# Imported eagerly, as before the names below were loaded lazily: the exit
# and fork hooks it registers keep their place among the user's own.
from . import hooks as _hooks  # noqa: F401

if _typing.TYPE_CHECKING:
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

# Where each public name lives. They are imported on first use (PEP 562), so
# ``import primeruns`` for its command line (``primeruns ls``) or a submodule
# does not load the SDK's run machinery, its platform client or httpx;
# ``import primeruns as pr; pr.init(...)`` is unchanged.
_HOMES = {
    **{name: ".exceptions" for name in __all__ if name.endswith("Error")},
    **dict.fromkeys(["RunHandle", "join"], ".joining"),
    **dict.fromkeys(
        [
            "CONFIG_SOURCE_KEY",
            "ConfigSource",
            "EnvironmentRef",
            "RunKind",
            "RunStatus",
            "TrainingSpec",
        ],
        ".models",
    ),
    "init": ".opening",
    "MODE_ENV": ".platform.settings",
    "TRACES_OPT_OUT_ENV": ".platform.settings",
    "Run": ".run",
}
_MODULES = {"metrics", "projection"}


def __getattr__(name: str) -> _typing.Any:
    if name in _MODULES:
        value = _importlib.import_module(f".{name}", __name__)
    elif name in _HOMES:
        value = getattr(_importlib.import_module(_HOMES[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
