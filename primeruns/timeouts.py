"""Timeouts a caller passes (``init(finish_timeout=)``, ``finish(timeout=)``,
``flush(timeout=)``), read as the vendor's SDK reads them, minus its traps.

The vendor reads a timeout as ``max(0, float(x))``, so code written for it
passes "30" or -1, and those keep working here (with a warning naming the
fix). Not a NaN or an infinity: NaN compares false with everything, so
``max(0.0, nan)`` is 0 and ``finish(timeout=nan)`` closed the run out at once,
its records unshipped; ``flush(timeout=nan)`` spun on a wait that returned at
once; and an infinite wait overflows a lock's timeout (OverflowError, into
the user's loop). Those are the default, with a warning: a timeout is no
place to raise from (``on_error="warn"`` promises the loop none). Except
in ``flush``: an infinity waits without a limit, as None does, and a
negative timeout, a deadline already passed, is 0 with no warning
(``flush_timeout``).

A number is any type ``float()`` reads (numpy's scalars, a Fraction, a
Decimal), not text or a bool; an int past a float's range is an infinity of
its sign. Read by type (``int``, ``float``), ``flush(timeout=10**400)`` and
numpy's ``float32("inf")`` were not the infinity they are: each waited the
default 30 s, with a warning, where ``flush(math.inf)`` waits without a limit.
"""

from __future__ import annotations

import math
from typing import Any

from primeruns.logs import get_logger

__all__ = ["flush_timeout", "given_seconds", "shown"]

log = get_logger("primeruns")

_FIX = "pass a non-negative number of seconds (not NaN nor an infinity)"


def given_seconds(call: str, field: str, given: Any, default: float) -> float:
    """``given`` in seconds: a finite number of at least 0, a negative one
    as 0 and text as its number (the vendor's reading), anything else (NaN,
    an infinity, not a number) ``default``; each but the first with a
    warning naming ``call``'s ``field`` and the fix. ``None``: ``default``."""
    if given is None:
        return default
    seconds = _seconds(given)
    if 0 <= seconds < math.inf and _is_number(given):  # (NaN is neither)
        return seconds
    if not math.isfinite(seconds):
        seconds = default
    seconds = max(0.0, seconds)
    log.warning(
        "prime-runs: %s: %s=%s is taken as %r: %s", call, field, shown(given), seconds, _FIX
    )
    return seconds


def flush_timeout(given: Any, default: float) -> float | None:
    """``flush(timeout=)``: None or an infinity wait without a limit; a
    negative number is a deadline already passed (0, as the vendor's: code
    passing what is left of its own deadline says nothing wrong); the rest
    as ``given_seconds``."""
    if given is None:
        return None
    if _is_number(given):
        seconds = _seconds(given)
        if seconds == math.inf:
            return None
        if seconds < 0:  # (-inf included; NaN is not below 0)
            return 0.0
    return given_seconds("flush", "timeout", given, default)


def _is_number(given: Any) -> bool:
    """Whether ``given`` is read as a number, silently: not text (the vendor's
    reading, said) nor a bool (``timeout=True`` is a slip, said)."""
    return not isinstance(given, str | bytes | bytearray | bool)


def _seconds(given: Any) -> float:
    """``float(given)``: an int (or a Fraction) past a float's range as an
    infinity of its sign, where ``float()`` raises OverflowError; NaN where
    it is not a number (a ``__float__`` of its own may raise anything)."""
    try:
        return float(given)
    except OverflowError:
        try:
            return math.inf if given > 0 else -math.inf
        except Exception:
            return math.nan
    except Exception:
        return math.nan


def shown(value: Any) -> str:
    """``value``'s repr, cut at 80 characters; its type's name where it has
    none (a repr that raises, an int past 4,300 digits): formatted in the
    log call, that error lost the warning to a logging traceback."""
    try:
        return repr(value)[:80]
    except Exception:
        return f"<{type(value).__name__}>"
