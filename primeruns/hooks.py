"""Process-wide hooks of the runs this process opened: exit, SIGTERM, fork.

At interpreter exit an unfinished run is closed as crashed, all runs within
one grace together (``_EXIT_GRACE``); SIGTERM (a scheduler's preemption)
closes every run as cancelled within a short grace, then lets the signal's
previous disposition act; a forked child never closes its parent's runs
(before a fork, each run notes what the child needs to log into it).
A run takes part through ``register``; it only needs ``_at_exit(deadline)``
and ``_on_sigterm()``.

SIGTERM's handler runs in the main thread between two bytecodes, possibly in
the middle of a ``log_*`` call of that thread that holds the journal's
append lock. Closing the run from there would take that lock again and
deadlock the process (a preempted job hung instead of ending). The ``log_*``
calls run inside ``sigterm_deferred``: a SIGTERM arriving there is kept and
handled as the call returns, with no lock of the SDK held.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from _thread import get_ident
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, Protocol

__all__ = ["install_sigterm", "register", "sigterm_deferred", "unregister"]

# How long the interpreter's exit may wait, in all, to close out runs the
# script never finished: long enough to ship a healthy run's tail, short
# enough that an exit with the platform down does not look like a hang.
# Whatever is left stays in the journal (the uplink may go on shipping it),
# and the warning names the command.
_EXIT_GRACE = 30.0


class _Closable(Protocol):
    def _at_exit(self, deadline: float) -> None: ...

    def _on_sigterm(self) -> None: ...

    def before_fork(self) -> None: ...

    def reset_after_fork(self) -> None: ...


# Runs to close out at exit or on SIGTERM (a set of handles, compared by identity).
_exit_runs: set[_Closable] = set()
_previous_sigterm: Any = None
_sigterm_installed = False
_holding_for_fork: Any = None  # the lock module a fork holds (``_before_fork``)


def register(run: _Closable) -> None:
    _exit_runs.add(run)


def unregister(run: _Closable) -> None:
    _exit_runs.discard(run)


def _at_exit_all() -> None:
    deadline = time.monotonic() + _EXIT_GRACE  # one grace for all runs, not one each
    for run in list(_exit_runs):
        run._at_exit(deadline)


atexit.register(_at_exit_all)


class _Deferral:
    """``with sigterm_deferred:`` around a call of the main thread that takes
    the SDK's locks: a SIGTERM arriving inside is handled at its end.

    Only the main thread counts (Python runs signal handlers there); the
    count nests. Cheaper than a generator context manager, and nothing but
    the count on the way in and out: it is on every ``log_*`` call. A
    KeyboardInterrupt (Ctrl-C's handler runs as any function is entered)
    can cut ``__exit__`` before its first line, and a count left up by one
    kept every later SIGTERM, outside any call, for an end that never came:
    the process no longer died of it. So where a SIGTERM would be kept,
    the stack is looked at for a call under way (a frame of a function that
    ``defers``, ``under_way``): none, and the count is stale, set to 0."""

    __slots__ = ("codes", "depth", "pending")

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None
        self.codes: set[CodeType] = set()

    def defers(self, *functions: Callable[..., Any]) -> None:
        """The functions whose bodies run ``with sigterm_deferred``: a frame
        of theirs on the stack is a call under way."""
        self.codes.update(function.__code__ for function in functions)

    def __enter__(self) -> None:
        if get_ident() == _MAIN:
            self.depth += 1

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        if get_ident() != _MAIN:
            return
        self.depth -= 1
        # Another call under way outside this one (its caller's frames on):
        # the SIGTERM waits for that one's end.
        if self.pending is not None and not self.under_way(sys._getframe(1).f_back):
            signum, self.pending = self.pending, None
            _handle_sigterm(signum, None)

    def under_way(self, frame: FrameType | None) -> bool:
        """Whether a call is under way in the main thread's stack at
        ``frame`` (its innermost); if not, a count left up by a cut exit
        is set to 0."""
        if self.depth > 0:
            while frame is not None:
                if frame.f_code in self.codes:
                    return True
                frame = frame.f_back
        self.depth = 0
        return False

    def clear(self) -> None:
        self.depth = 0
        self.pending = None


_MAIN = threading.main_thread().ident
# This process's id, set again first thing in a forked child (by the
# handler below, registered at import: before any the user registers
# later: os.fork(), a pool's fork, a preexec_fn all run it). The log calls
# compare it where os.getpid() was a system call (~0.6 us) on each; the
# journal's own append still asks the kernel, so nothing written depends on it.
PID = os.getpid()
sigterm_deferred = _Deferral()


def _handle_sigterm(signum: int, frame: FrameType | None) -> None:
    if sigterm_deferred.depth and sigterm_deferred.under_way(frame):
        sigterm_deferred.pending = signum  # handled when the log call returns
        return
    for run in list(_exit_runs):
        run._on_sigterm()
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install_sigterm() -> None:
    global _previous_sigterm, _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        _previous_sigterm = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _handle_sigterm)
        _sigterm_installed = True
    except (ValueError, OSError):  # not the main interpreter / no signals here
        pass


def _before_fork() -> None:
    # What a forked child needs of a run that only the parent can read.
    for run in list(_exit_runs):
        # A fork must never fail for it: the child then drops its records.
        with contextlib.suppress(Exception):
            run.before_fork()
    # Last, after whatever the runs' handlers waited for: a thread opening or
    # closing a journal's lock descriptor finishes first (``journal.lock``).
    global _holding_for_fork
    _holding_for_fork = sys.modules.get("primeruns.journal.lock")
    if _holding_for_fork is not None:
        _holding_for_fork.hold_for_fork()


def _after_fork_in_parent() -> None:
    if _holding_for_fork is not None:
        _holding_for_fork.let_go_after_fork()


def _after_fork_in_child() -> None:
    # The thread that forked is the child's main thread, and it is in none of
    # the log calls the parent's main thread may have been in: a pool's worker
    # handler forks a worker in place of one that died while the run's main
    # thread logs, and that worker kept SIGTERM for the end of a call it never
    # makes (Pool.terminate() then waited for it for ever).
    global _MAIN, _sigterm_installed, PID
    PID = os.getpid()
    _MAIN = get_ident()
    sigterm_deferred.clear()
    # SIGTERM as it was before the run's handler: the child ships nothing
    # from it (its uplink ships its journal), and a Python-level handler runs
    # only once the main thread's wait ends. A pool worker waiting for a task
    # on a semaphore (held for good by its pool's terminate()) whose SIGTERM
    # landed out of that wait never ended. A run the child opens installs
    # the handler again.
    if _sigterm_installed:
        _sigterm_installed = False
        with contextlib.suppress(ValueError, OSError, TypeError):
            if signal.getsignal(signal.SIGTERM) is _handle_sigterm:
                previous = _previous_sigterm
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    # A child never finalizes its parent's run, even from atexit; and it must
    # not wait on a lock another thread of the parent held at the fork.
    for run in list(_exit_runs):
        run.reset_after_fork()
    _exit_runs.clear()
    for name in _LOADED_LATER:
        module = sys.modules.get(name)
        if module is not None:
            module._after_fork_in_child()


# The after-fork work of modules ``import primeruns`` does not load (its
# public names load on first use): run from this handler, registered at
# import, so the SDK's handlers keep that place among the user's own (a
# handler the user registers later finds a child's journals marked
# inherited), whenever those modules loaded.
_LOADED_LATER = (
    "primeruns.journal.lock",
    "primeruns.journal.store",
    "primeruns.forkchild",
    "primeruns.joining",
    "primeruns.ranks",
)

os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
