"""A journal's owner lock across a fork another thread makes: the child
never keeps a copy of the lock's descriptor, whatever the thread that opens
or closes it was doing at the fork."""

from __future__ import annotations

import fcntl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import procs
import pytest

from primeruns.journal import lock as lock_module
from primeruns.journal.lock import LOCK_NAME, OwnerLock


class _Registry:
    """The lock registry's lock, letting the paused thread go on as soon as
    a fork waits for it (without the fix, nothing waits for it)."""

    def __init__(self, real: Any, resume: threading.Event) -> None:
        self._real, self._resume = real, resume

    def acquire(self, *args: Any) -> bool:
        if threading.current_thread() is threading.main_thread():
            self._resume.set()
        return bool(self._real.acquire(*args))

    def release(self) -> None:
        self._real.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _held_by_a_child_forked_while_taking(
    monkeypatch: pytest.MonkeyPatch, take: Callable[[], Any], lock_file: Callable[[], Path]
) -> tuple[bool, list[Any]]:
    """``take`` in a thread, paused just after it locked a file (not yet
    known as held); a fork then: whether the child holds that descriptor of
    ``lock_file``, and what ``take`` returned."""
    inside, resume = threading.Event(), threading.Event()
    paused: list[int] = []
    real_flock = fcntl.flock

    def pausing_flock(fd: int, operation: int) -> None:
        real_flock(fd, operation)
        if operation & fcntl.LOCK_EX and not paused:  # locked, not yet known as held
            paused.append(fd)
            inside.set()
            resume.wait()

    monkeypatch.setattr(fcntl, "flock", pausing_flock)
    real = getattr(lock_module, "_REGISTRY", threading.RLock())
    monkeypatch.setattr(lock_module, "_REGISTRY", _Registry(real, resume), raising=False)
    taken: list[Any] = []
    taker = threading.Thread(target=lambda: taken.append(take()))
    taker.start()
    try:
        assert inside.wait(timeout=60)
        held = procs.held_in_forked_child(paused[0], lock_file())
    finally:
        resume.set()
        taker.join()
    return held, taken


def test_a_child_forked_while_another_thread_takes_a_lock_does_not_hold_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork by one thread while another takes a journal's lock (a pool's
    worker handler forks a new worker at any time) gave the child a copy of
    the locked descriptor that it never closed: once the journal's writer
    died, the child held its journal, refused to replay and waited for by
    the run's primary as a process still logging, for as long as it lived."""
    held, taken = _held_by_a_child_forked_while_taking(
        monkeypatch, lambda: OwnerLock(tmp_path), lambda: tmp_path / LOCK_NAME
    )
    for lock in taken:
        lock.release()
    assert not held


def test_a_child_forked_while_another_thread_takes_a_runs_primary_lock_does_not_hold_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same fork while a thread takes a run's (or a launcher rank's)
    lock under ``<runs dir>/.primary/`` (``ranks``): the child kept a copy
    the fork handler never closed, not yet known as held. Once the rank
    died, that child (a pool's worker) held its lock for as long as it
    lived: rank 0 started again took itself for a process that inherited
    the rank, so nobody was the run's primary and nobody closed it."""
    from primeruns import ranks

    try:
        held, _ = _held_by_a_child_forked_while_taking(
            monkeypatch,
            lambda: ranks.claim_created(tmp_path, "run-f", "20261201-000000-aaaaaaaa"),
            lambda: next((tmp_path / ".primary").glob("*.lock")),
        )
    finally:
        ranks._after_fork_in_child()  # what this process's exit does: lets it go
    assert not held
