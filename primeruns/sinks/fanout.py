"""A few calls at once, on a small pool of daemon threads: how a sink keeps
several requests in flight.

A backlog of metrics rows is one request per row (the platform takes one row
per request). Sent one after another, each row waited out a whole round trip
while the client and the server took turns: neither saturated a core, and a
long offline run synced at a few hundred rows a second. ``Fanout.run`` sends
a handful of them at once and hands back each call's outcome in the order
given, so the caller settles them in order (what is recorded as done is
always a prefix) whatever order they were answered in.

The threads are daemons (a request hanging at exit must not hold the process,
as the shipper's own thread does not) with the process's signals kept off
them (``primeruns.threads``), started on first use, and started afresh in a
forked child, which inherits none of them.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from ..threads import start_daemon

__all__ = ["Fanout", "NotSent", "Outcome"]

T = TypeVar("T")
R = TypeVar("R")


class Outcome(Generic[R]):
    """What one call did: its ``value``, or the ``error`` it raised."""

    __slots__ = ("error", "value")

    def __init__(self, value: R | None = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error


class NotSent(Exception):
    """The outcome of a call never made: one before it failed so that the
    caller stops there (``give_up``), and settles nothing after it."""


class _Round(Generic[T, R]):
    """One ``run``: the items, taken one at a time by whichever thread is free."""

    def __init__(
        self, call: Callable[[T], R], items: Sequence[T], give_up: Callable[[BaseException], bool]
    ) -> None:
        self.call = call
        self.items = items
        self.give_up = give_up
        self.outcomes: list[Outcome[R]] = [Outcome() for _ in items]
        self._next = 0
        self._left = len(items)
        self._lock = threading.Lock()
        self.done = threading.Event()
        if not items:
            self.done.set()

    def work(self) -> None:
        while True:
            with self._lock:
                index = self._next
                if index >= len(self.items):
                    return
                self._next += 1
            outcome = self.outcomes[index]
            try:
                outcome.value = self.call(self.items[index])
            except BaseException as exc:  # handed to the caller, which decides
                outcome.error = exc
            with self._lock:
                if outcome.error is not None and self.give_up(outcome.error):
                    # Items are taken in order: none not taken yet comes
                    # before this one, so the caller never settles them.
                    # A platform that is down gets one request per thread.
                    for later in self.outcomes[self._next :]:
                        later.error = NotSent("an earlier request of its round failed")
                    self._left -= len(self.items) - self._next
                    self._next = len(self.items)
                self._left -= 1
                if not self._left:
                    self.done.set()


class Fanout:
    """Runs calls ``width`` at a time (the caller's thread is one of them)."""

    def __init__(self, width: int, name: str) -> None:
        self.width = max(1, width)
        self._name = name
        self._lock = threading.Lock()
        self._pid = -1
        self._work: queue.SimpleQueue[_Round[object, object] | None] = queue.SimpleQueue()

    def run(
        self,
        call: Callable[[T], R],
        items: Sequence[T],
        *,
        give_up: Callable[[BaseException], bool] = lambda exc: True,
    ) -> list[Outcome[R]]:
        """``call`` on each item, up to ``width`` at once; the outcomes in the
        order of ``items``, once every call has returned or raised. After a
        call raised an error ``give_up`` says yes to, the items not started
        yet are not (their outcome: :class:`NotSent`)."""
        batch: _Round[T, R] = _Round(call, items, give_up)
        helpers = min(self.width, len(items)) - 1
        if helpers > 0:
            work = self._helpers()
            for _ in range(helpers):
                work.put(batch)  # type: ignore[arg-type]
        batch.work()
        batch.done.wait()
        return batch.outcomes

    def _helpers(self) -> queue.SimpleQueue[_Round[object, object] | None]:
        """The helpers' queue, with ``width - 1`` threads taking from it (in
        this process: a forked child starts its own)."""
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._work = queue.SimpleQueue()
                for number in range(self.width - 1):
                    start_daemon(_serve, f"{self._name}-{number}", (self._work,))
            return self._work

    def close(self) -> None:
        """End the helper threads (once their rounds are done): the caller
        runs no more. A process shipping from threads outlives its run's."""
        with self._lock:
            if self._pid == os.getpid():
                for _ in range(self.width - 1):
                    self._work.put(None)
            self._pid = -1


def _serve(work: queue.SimpleQueue[_Round[object, object] | None]) -> None:
    while (batch := work.get()) is not None:
        batch.work()  # a round already taken up returns at once
