"""The SDK's loggers, whose calls never raise.

A log call runs the program's logging filters and handlers, and logging
guards only a handler's ``emit``: a ``Filter`` whose ``filter()`` raises, on
a logger or on a handler, raises out of the call that logged. Out of the
SDK's background threads (the uplink's shippers, the mover, the journal's
sync), which log warnings in their loops and in the guards that keep them
going, it ended the thread and nothing more was shipped; out of a log call,
it reached the user's loop, which ``on_error="warn"`` never lets happen.
A record such a filter refuses by raising is dropped, as one it refuses by
returning False.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import MutableMapping
from typing import Any


class _NeverRaises(logging.LoggerAdapter):  # type: ignore[type-arg]
    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        # First, as a logger does: a call below the level (a debug line in a
        # loop) costs no guard, no copy of its arguments, only this test.
        if not self.logger.isEnabledFor(level):
            return
        # One frame more than the caller's: the record names the SDK's call, not this.
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
        # The program's filter failed, not the SDK: there is nothing to tell it by.
        with contextlib.suppress(Exception):
            super().log(level, msg, *args, **kwargs)

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs  # as given: no ``extra`` of the adapter's


def get_logger(name: str) -> logging.LoggerAdapter:  # type: ignore[type-arg]
    """The logger ``name``, through which a log call never raises."""
    return _NeverRaises(logging.getLogger(name), None)
