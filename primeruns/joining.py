"""Worker processes that join a run explicitly: ``run.handle()`` and ``pr.join()``.

A forked child inherits its parent's run handle and logs into it as it is
(:mod:`primeruns.forkchild`). A process that was not forked from the run's
(multiprocessing's ``spawn`` and ``forkserver`` starts, a ``subprocess``)
has nothing to inherit: the run's process hands its workers
``run.handle()``, a small picklable value, and each worker calls
``pr.join(handle)``. What the worker gets is what a forked child gets: a
journal of its own attached to the run, shipped by an uplink of its own,
whose ``finish()`` ships the worker's records and leaves the run open (the
run's own process closes it, after waiting for its workers' records). A
child the worker forks (a pool of its own) logs through the worker's run as
the worker's forked child: a journal of its own, which the worker's
``finish()`` (or exit) waits for.

One call in the worker, with nothing to repeat of ``init()``'s arguments,
and the same call for every start method: ``pr.join`` returns the same run
for the same handle within one process, so a pool's task function may call
it on every task (a worker then keeps one journal, not one per task).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace

from .forkchild import ForkOrigin, open_child
from .models import RunKind
from .recorder import Recorder
from .run import Run

__all__ = ["RunHandle", "join"]


@dataclass(frozen=True)
class RunHandle:
    """What a worker needs to log into a run: made by ``run.handle()``,
    given to ``pr.join()``. Picklable (pass it to a pool's workers as an
    argument). It carries the run's API key, as the run's process holds it:
    give it to your own workers, do not write it down (its repr never shows
    the key)."""

    origin: ForkOrigin | None  # None: a disabled run (nothing is written anywhere)
    run_id: str
    kind: RunKind = "eval"

    def __repr__(self) -> str:
        return f"<RunHandle run={self.run_id!r}>"


_joined: dict[tuple[str, int], Run] = {}
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """Run by ``hooks``' after-fork handler: a fresh lock, since a thread of
    the parent may have been joining (its hold copied, never released here,
    and the child's own ``join`` waited for it for good)."""
    global _lock
    _lock = threading.Lock()


def handle_of(origin: ForkOrigin | None, run_id: str, kind: RunKind) -> RunHandle:
    """The handle of a run whose process holds ``origin`` (noted as for a
    fork: its finish() looks for its workers' journals from now on)."""
    if origin is None:
        return RunHandle(None, run_id, kind)
    clean = replace(origin, forked=False, _child=None, _child_pid=None, _failed=False)
    return RunHandle(clean, run_id, kind)


def join(handle: RunHandle) -> Run:
    """Log into the run ``handle`` names (from ``run.handle()`` in the run's
    process), from this worker process: a journal of this process's own,
    attached to the run. Returns the same run for the same handle within a
    process until it is finished. Its ``finish()`` (or this process's exit)
    ships this process's records and leaves the run open.

    Raises ``TypeError`` for anything but a handle, and what ``init()``
    raises when the journal cannot be made or the platform refuses the key.
    """
    if not isinstance(handle, RunHandle):
        raise TypeError(f"join: pass the run.handle() of a run, got {type(handle).__name__}")
    origin = handle.origin
    if origin is None:
        return _disabled(handle)
    key = (origin.parent_id, os.getpid())
    with _lock:
        run = _joined.get(key)
        if run is None or run.finished:
            # A fresh copy: the key remembered for redaction in this process too.
            fresh = replace(origin, settings=replace(origin.settings))
            run = _joined[key] = open_child(fresh)
        return run


def _disabled(handle: RunHandle) -> Run:
    return Run(
        Recorder(None, kind=handle.kind, on_error="warn"),
        mode="disabled",
        name=None,
        config={},
        finish_timeout=0.0,
        attached=True,
        local_id=handle.run_id,
    )
