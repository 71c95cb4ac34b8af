"""Appends a full disk refused, held in memory until the journal takes them.

A disk that fills mid-run (a checkpoint written beside the runs directory, a
small scratch disk) refused every record from then on: dropped and counted,
920 of an evaluation's 1,000 episodes on a 2 MiB disk, where the vendor's
SDK, which keeps nothing on disk, holds 256 batches in memory and ships them
all. For an online run room comes back: the uplink ships what the journal
holds, and compaction frees the pages of what every sink acknowledged. So an
append the disk refuses, and every append after it (no record may take a seq
before an earlier one), waits here in order, and a thread of its own stores
them as room comes back (``Appender.store_held``): straight into LMDB's
freed pages, never through the spool the disk refused.

Not at the byte budget: a budget is the user's bound on the journal, and its
drops are counted as before. Bounded: past ``HELD_MAX_BYTES`` of payload a
refused append is dropped and counted as before. What is still held when the
run finishes (``finish()`` waits for it at most a share of its timeout) or
when the journal closes is dropped, counted with the reason ``DISK_FULL``.
The thread is started by the first append held, so a run whose disk never
fills pays one flag test per append.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from primeruns.threads import start_daemon

__all__ = ["DISK_FULL", "HELD_MAX_BYTES", "RETRY_S", "Held", "Overflow", "Watch"]

#: The most payload bytes held (as a run's backlog on disk is bounded by its
#: budget): the vendor's queue of 256 batches of ten 9 KB episodes is ~23 MB.
HELD_MAX_BYTES = 64 << 20
#: How often the held appends are offered to the journal again: room comes
#: back with each acknowledgement the uplink compacts after, which nothing
#: announces in this process.
RETRY_S = 0.2
#: The loss reason of a held record the journal never took.
DISK_FULL = "disk full"


class Held(NamedTuple):
    """One refused append: its entries, as the call gave them."""

    kind: int
    payloads: Sequence[bytes]
    essential: bool
    nbytes: int


class Watch:
    """The appends held when a ``flush()`` was called (``Overflow.watch``):
    up to ``mark`` (their ordinal), and the last seq of each kind those
    stored so far took (``lasts``: its targets once all are stored)."""

    def __init__(self, mark: int) -> None:
        self.mark = mark
        self.lasts: dict[int, int] = {}


class Overflow:
    """The held appends of one journal, oldest first, and the thread that
    stores them. Every method is called under the appender's lock (``lock``),
    which the thread takes for each try: no append overtakes a held one."""

    def __init__(
        self,
        lock: threading.Lock,
        store: Callable[[], list[tuple[int, int]]],
        after: Callable[[list[tuple[int, int]]], None],
        name: str,
        *,
        limit: int = HELD_MAX_BYTES,
    ) -> None:
        self.items: deque[Held] = deque()
        self.nbytes = 0
        self.limit = limit
        self._lock = lock
        # The appender's try, made under ``lock``: (kind, last seq) of each
        # append it stored; ``after`` is told of them outside the lock.
        self._store = store
        self._after = after
        self._name = name
        # Notified (under ``lock``) whenever the held appends went or were let go.
        self.changed = threading.Condition(lock)
        # Stored appends whose ``after`` has not returned yet: until it has,
        # the run's flush targets do not name them (``wait_empty``).
        self._telling = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Appends held in all (the ordinals 1, 2, ...), and how many of them,
        # oldest first, were stored or let go: a flush waits for those held
        # when it was called (``watch``), not for every one held after it,
        # which another thread's logging on a full disk never ended.
        self.queued = 0
        self.finished = 0
        self._watches: list[Watch] = []
        # What the last store took (kind, last seq) while it is told
        # (``_telling``): stored, so no longer held, but not in the run's
        # targets yet. A flush called meanwhile waits for it too.
        self._untold: list[tuple[int, int]] = []

    def hold(self, held: Held) -> bool:
        """Hold ``held`` after the others; False past the bound (drop it then)."""
        if self.nbytes + held.nbytes > self.limit:
            return False
        self.items.append(held)
        self.nbytes += held.nbytes
        self.queued += 1
        if self._thread is None and not self._stop.is_set():
            self._thread = start_daemon(self._loop, f"primeruns-journal-held-{self._name}")
        return True

    def popleft(self) -> Held:
        held = self.items.popleft()
        self.nbytes -= held.nbytes
        self.finished += 1
        return held

    def let_go(self) -> int:
        """Forget every held append; how many records they held."""
        count = sum(len(held.payloads) for held in self.items)
        self.finished += len(self.items)
        self.items.clear()
        self.nbytes = 0
        self.changed.notify_all()
        return count

    def wait_empty(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) until nothing is held and every append
        stored was told (``after``); whether so. Not under the lock."""
        with self.changed:
            return self.changed.wait_for(
                lambda: not self.items and not self._telling, max(0.0, timeout)
            )

    def watch(self) -> Watch | None:
        """Watch the appends held now, and those stored but not told yet
        (None: none is); under the lock. Each watch ends with one
        ``wait_watched``."""
        if not self.items and not self._telling:
            return None
        watch = Watch(self.queued)
        for kind, last in self._untold:
            watch.lasts[kind] = max(watch.lasts.get(kind, 0), last)
        self._watches.append(watch)
        return watch

    def wait_watched(self, watch: Watch, timeout: float) -> bool:
        """Wait (up to ``timeout``) until the appends ``watch`` names are
        stored and told (``after``), or let go; whether so. Ends the watch.
        Not under the lock."""
        with self.changed:
            try:
                return self.changed.wait_for(
                    lambda: self.finished >= watch.mark and not self._telling, max(0.0, timeout)
                )
            finally:
                self._watches.remove(watch)

    def _note_stored(self, before: int, stored: list[tuple[int, int]]) -> None:
        """The appends from ordinal ``before + 1`` on were stored as
        ``stored`` (kind, last seq): what each watch of them targets."""
        for watch in self._watches:
            for ordinal, (kind, last) in enumerate(stored, before + 1):
                if ordinal <= watch.mark:
                    watch.lasts[kind] = max(watch.lasts.get(kind, 0), last)

    def _loop(self) -> None:
        while not self._stop.wait(RETRY_S):
            with self._lock:
                before = self.finished
                stored = self._store() if self.items else []
                self._note_stored(before, stored)
                self._telling += bool(stored)
                if stored:
                    self._untold = stored
                self.changed.notify_all()
                done = not self.items
                if done:
                    # Under the lock an append holds with: the next one held
                    # starts a thread of its own.
                    self._thread = None
            if stored:
                try:
                    self._after(stored)
                finally:
                    with self._lock:
                        self._telling -= 1
                        if not self._telling:
                            self._untold = []
                        self.changed.notify_all()
            if done:
                return

    def stop(self) -> None:
        """The journal closes: the thread ends (not under the lock: it may wait for it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
