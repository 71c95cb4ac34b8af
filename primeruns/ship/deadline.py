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
    (``default`` without a timeout)."""
    budget = finish.get("timeout")
    if not isinstance(budget, int | float) or isinstance(budget, bool):
        return default
    at = finish.get(K_AT_BOOT)
    if not isinstance(at, int | float) or isinstance(at, bool):
        return max(0.0, float(budget))
    passed = boot_clock() - float(at)
    if passed < 0:  # another boot wrote it (a journal moved between hosts): no shared clock
        return max(0.0, float(budget))
    return max(0.0, float(budget) - passed)
