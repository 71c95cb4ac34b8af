"""A short switch interval while an evaluation's threads ship beside its loop.

For its first seconds an evaluation ships from threads in its own process
(``ship.startup``). Each log call ends in a ``write()``, which lets the GIL
go; taking it back, the loop waits while a shipper thread holds it (stamping,
gzip, JSON), until the interpreter asks that thread to let go: every switch
interval, 5 ms by default. The log call's p99 in those seconds was 6-10 ms,
the vendor's SDK's 0.05 (its thread waits on the network, and is seldom
holding the GIL). At 0.2 ms, measured with ``tools/bench/eval_loop.py``: a
p99 of 1.4 ms then, and the loop's slowdown no worse (+11% against +14-22%).

Lowered only while those threads ship, and given back as it was when they
stop (the uplink process took over, or the threads ship on for good, or the
run is over), unless someone set another interval meanwhile: that one is
theirs, and kept. A forked child (a pool's worker, a data loader's) gets it
back at once: no thread of ours ships in it.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref

__all__ = ["SHIPPING_INTERVAL_S", "ShortSwitch"]

#: The switch interval while the threads ship (seconds).
SHIPPING_INTERVAL_S = 0.0002


class ShortSwitch:
    """The interpreter's switch interval, lowered once and given back once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._saved: float | None = None  # the interval before, while lowered
        self._ours = 0.0  # the interval as set here (the interpreter rounds it)
        _LOWERING.add(self)

    def lower(self) -> None:
        with self._lock:
            before = sys.getswitchinterval()
            if self._saved is not None or before <= SHIPPING_INTERVAL_S:
                return  # lowered already, or as short already (the user's)
            sys.setswitchinterval(SHIPPING_INTERVAL_S)
            self._saved, self._ours = before, sys.getswitchinterval()

    def restore(self) -> None:
        with self._lock:
            saved, self._saved = self._saved, None
            if saved is not None and sys.getswitchinterval() == self._ours:
                sys.setswitchinterval(saved)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # (another thread may have held it at the fork)
        self.restore()


_LOWERING: weakref.WeakSet[ShortSwitch] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for lowered in list(_LOWERING):
        lowered._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
