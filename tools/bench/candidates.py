"""Candidate SDK changes, applied by monkeypatching inside a benchmark process.

The benchmarks never edit ``primeruns/``; a change a profile suggests is tried
here first, measured side by side with the SDK as it is, and proposed to the
lead as a diff with that measurement. Each function applies one candidate to
this process and says in its docstring what the proposed diff is.
"""

from __future__ import annotations

import time

from primeruns.ship.shipper import Shipper

__all__ = ["CANDIDATES", "stop_repokes"]

_REPOKE_S = 0.05


def stop_repokes() -> None:
    """``Shipper.stop`` wakes the thread again every 50 ms until it has exited.

    Why: ``stop()`` wakes the shipper once (``poke`` → ``journal.wake_all``).
    A shipper that is between its stop check and ``journal.wait_for_append``
    when that happens (the common case right after ``drain`` returned: it is
    reading the journal for its next batch) misses the wake and sleeps the
    full 5 s wait, so ``finish()`` takes ≥ 5 s however little there was to
    ship. Re-poking until the thread exits bounds that at ~50 ms.
    """

    def stop(self: Shipper, timeout: float | None = None) -> None:
        self._stop.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        thread = self._thread
        while thread is not None and thread.is_alive():
            self.poke()
            left = _REPOKE_S if deadline is None else min(_REPOKE_S, deadline - time.monotonic())
            if left <= 0:
                break
            thread.join(left)

    Shipper.stop = stop  # type: ignore[method-assign]


CANDIDATES = {"stop_repokes": stop_repokes}
