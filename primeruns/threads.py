"""Background threads the SDK starts, with the process's signals kept off them.

A signal sent to the process (a scheduler's SIGTERM, Ctrl-C's SIGINT) is
delivered by the kernel to any thread that does not block it. When that is
one of ours, CPython only flags it for the main thread, and a main thread
blocked in a wait (``Event.wait``, ``Thread.join``, a lock) runs the handler
when the wait ends: a preemption's SIGTERM was handled up to minutes late,
after the scheduler's grace had run out. Threads started here block the
signals users handle, so the kernel delivers them to the main thread (or the
user's own threads), which a blocking wait does not hide them from.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

# The longest single wait handed to the OS: threading and select overflow on
# an infinite (or very large) timeout, which flush() and finish() accept.
MAX_WAIT_S = 86_400.0


def bounded(seconds: float) -> float:
    """``seconds`` as one wait the OS takes (0 to a day); a caller whose
    deadline is later waits again."""
    return max(0.0, min(seconds, MAX_WAIT_S))


# The signals a user's process (or this SDK's run handle) handles.
_KEPT_OFF = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}


def start_daemon(
    target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()
) -> threading.Thread:
    """Start a daemon thread running ``target(*args)`` with those signals blocked.

    A new thread inherits its creator's signal mask, so the mask is set around
    ``start()`` in the creating thread and restored at once: no window in which
    the new thread can take a signal.
    """
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _KEPT_OFF)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread
