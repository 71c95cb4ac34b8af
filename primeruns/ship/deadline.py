"""The close-out's deadline, on a clock the producer and its uplink share.

``finish(timeout=...)`` gives the uplink a budget counted from the finish
call. The two are different processes, so the instant of the call must be
read on one clock both see. The wall clock is not one: NTP steps it, a VM
resumed moves it by hours, and a deadline of ``at + timeout - time.time()``
taken across such a step left every pending record unshipped with the run
closed as COMPLETED. ``CLOCK_BOOTTIME`` is system-wide on Linux, never
steps, and counts a suspend too; the uplink of a live run is on the
producer's host and boot, so it reads the same clock. Where the finish entry
has no such stamp (an older SDK, a platform without the clock) the budget
counts from the moment the uplink reads the entry, never from wall time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["K_AT_BOOT", "boot_clock", "budget_left"]

K_AT_BOOT = "at_boot"  # the finish entry's field: boot_clock() when finish() was called
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def boot_clock() -> float:
    """Seconds on the host's boot clock (monotonic, shared by its processes)."""
    return time.clock_gettime(_CLOCK)


def budget_left(finish: Mapping[str, Any], default: float) -> float:
    """Seconds the uplink has left to ship, from the finish entry: its
    ``timeout`` less what passed since ``at_boot`` on the boot clock
    (``default`` without a timeout, or with one that is not a finite number:
    the entry is untrusted input, and NaN compared false with every bound,
    so it read as 0 and the run closed out with its records unshipped)."""
    budget = _finite(finish.get("timeout"))
    if budget is None:
        return default
    budget = max(0.0, budget)
    at = _finite(finish.get(K_AT_BOOT))
    if at is None:
        return budget
    passed = boot_clock() - at
    if passed < 0:  # another boot wrote it (a journal moved between hosts): no shared clock
        return budget
    return max(0.0, budget - passed)


def _finite(value: Any) -> float | None:
    """``value`` as a float if it is a finite number (not a bool), else None."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        return None
    return number if math.isfinite(number) else None
