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
theirs, and kept. Several evaluations at once in one process share it: it
is given back when the last of their threads stop. A forked child (a pool's
worker, a data loader's) gets it back at once: no thread of ours ships in it.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["SHIPPING_INTERVAL_S", "ShortSwitch"]

#: The switch interval while the threads ship (seconds).
SHIPPING_INTERVAL_S = 0.0002

# The process's one interval, shared by every run whose threads ship now.
_lock = threading.Lock()
_holders = 0  # ShortSwitch instances lowered now
_saved: float | None = None  # the interval before the first of them lowered it
_ours = 0.0  # the interval as set here (the interpreter rounds it)
_generation = 0  # a forked child's holders are not its own: counted from none


class ShortSwitch:
    """One run's hold on the short interval: lowered once, given back once."""

    def __init__(self) -> None:
        self._held_in: int | None = None  # the generation it was lowered in

    def lower(self) -> None:
        global _holders, _saved, _ours
        with _lock:
            if self._held_in == _generation:
                return
            self._held_in = _generation
            _holders += 1
            before = sys.getswitchinterval()
            if _holders == 1 and before > SHIPPING_INTERVAL_S:  # (else: as short already)
                sys.setswitchinterval(SHIPPING_INTERVAL_S)
                _saved, _ours = before, sys.getswitchinterval()

    def restore(self) -> None:
        global _holders
        with _lock:
            if self._held_in != _generation:
                return  # never lowered, given back already, or lowered before a fork
            self._held_in = None
            _holders -= 1
            if _holders == 0:
                _give_back()


def _give_back() -> None:
    """The interval as it was, unless someone set another meanwhile (``_lock`` held)."""
    global _saved
    if _saved is not None and sys.getswitchinterval() == _ours:
        sys.setswitchinterval(_saved)
    _saved = None


def _after_fork_in_child() -> None:
    global _lock, _holders, _generation
    _lock = threading.Lock()  # (another thread may have held it at the fork)
    _holders, _generation = 0, _generation + 1
    _give_back()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
