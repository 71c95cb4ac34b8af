"""WAL checkpoints of the local platform's database, off the request path.

In WAL mode every commit appends pages to ``platform.sqlite3-wal``; a
checkpoint copies them back into the database file and syncs it. SQLite runs
one itself after any commit that leaves 1,000 pages or more in the WAL: in
the committing thread, while it holds the one connection (and its lock), so
the request that happened to cross the mark waited for the copy and its
``fdatasync`` and every other write waited behind it. With episodes stored
twice (a sample row and a trace), 5,000 of them write ~90 MB: the copies were
a tenth of the server's CPU in ``tools/bench/end_to_end.py``, all of it on
the path of some request, and the run drained a fifth faster with none.

So a thread of its own, on a connection of its own, checkpoints
(``PASSIVE``: it never waits for the writer, nor the writer for it; SQLite's
own locks keep the two apart) once a commit says there is something to copy,
at most every :data:`MIN_INTERVAL` seconds, with the GIL released for the
copy.

A checkpoint copies only what was committed before it began, and only a WAL
copied whole is begun anew (by the next commit). Under writes that keep
coming, some commit always came during the copy: the WAL never started over
and grew to the backstop, where the writer's own checkpoint copied what was
left in some request's commit (up to 400 ms of it, writes flat out; the WAL
file 64 to 110 MB). So once the WAL holds :data:`RESTART_PAGES`, a round
copies in a second pass what came during the first, then what came during
the second with the writer held off (its lock; a short copy, most of it
synced already), and the next commit starts the WAL over: it stays near
16 MiB. The writer's own automatic checkpoint stays, at
:data:`BACKSTOP_PAGES`, should this thread fall behind or be gone.
Durability is SQLite's as before: a commit is in the WAL when it returns,
whoever copies it later.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from primeruns.logs import get_logger

from ..threads import start_daemon

__all__ = ["BACKSTOP_PAGES", "MIN_INTERVAL", "RESTART_PAGES", "Checkpointer"]

log = get_logger("primeruns.local")

#: Seconds between two checkpoints at least: a busy server commits every few
#: milliseconds, and each checkpoint ends with an ``fdatasync``.
MIN_INTERVAL = 0.05
#: Pages the WAL may hold before the writer checkpoints in its commit, as
#: SQLite always did at 1,000: 64 MiB of 4 KiB pages, reached only when the
#: thread here falls behind (writes flat out) or is gone.
BACKSTOP_PAGES = 16_384
#: Pages in the WAL from which a round ends with the writer held off for the
#: last of the copy, so that the next commit starts the WAL over (16 MiB: a
#: few such short holds a second at most, where SQLite's own checkpoint held
#: the writer for every 4 MiB and its whole copy).
RESTART_PAGES = 4_096


class Checkpointer:
    """Checkpoints the WAL of the database at ``path`` from a thread of its own;
    ``writer``: the lock every use of the writer's connection holds."""

    def __init__(self, path: Path, writer: threading.Lock) -> None:
        self._writer = writer
        self._wanted = threading.Event()  # a commit left pages to copy
        self._stop = threading.Event()
        self._lock = threading.Condition()
        self._rounds = 0  # checkpoints done (for ``wait_for_round``)
        self._thread: threading.Thread | None = None
        try:
            # Its own connection: a checkpoint on the writer's would take the
            # writer's lock, which is what this thread is here to spare. Opened
            # here, just after the writer's, on the files Database checked: by
            # name in the thread, whenever it got to run, it would follow what
            # stood at the name by then (a link) or create a file gone meanwhile.
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.warning("WAL checkpoints stay in the writer's commits: %s", exc)
            return
        self._thread = start_daemon(self._loop, "primeruns-local-checkpoint", (conn,))

    def wake(self) -> None:
        """Called after each commit: there are pages to copy."""
        self._wanted.set()

    def wait_for_round(self, after: int, timeout: float) -> int:
        """Wait until more than ``after`` checkpoints were done (or ``timeout``
        seconds); the number done."""
        with self._lock:
            self._lock.wait_for(lambda: self._rounds > after, timeout)
            return self._rounds

    @property
    def rounds(self) -> int:
        with self._lock:
            return self._rounds

    def stop(self) -> None:
        """End the thread once its checkpoint in progress is done (at once
        when called from the thread itself: a finalizer may run there)."""
        self.stop_soon()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def stop_soon(self) -> None:
        """Ask the thread to end, without waiting for it (a Database dropped
        unclosed: its finalizer may run in any thread, this one's too)."""
        self._stop.set()
        self._wanted.set()

    def _loop(self, conn: sqlite3.Connection) -> None:
        failing: str | None = None  # the error the last round failed with
        try:
            while True:
                self._wanted.wait()
                if self._stop.is_set():
                    return
                self._wanted.clear()
                try:
                    self._round(conn)
                except sqlite3.Error as exc:  # the backstop in the writer copies meanwhile
                    # Said once while it lasts: a full disk fails every round,
                    # and a busy server has a round every 50 ms.
                    if str(exc) != failing:
                        log.warning("WAL checkpoints fail (the writer's own go on): %s", exc)
                    failing = str(exc)
                else:
                    if failing is not None:
                        log.warning("WAL checkpoints work again (after: %s)", failing)
                    failing = None
                with self._lock:
                    self._rounds += 1
                    self._lock.notify_all()
                self._stop.wait(MIN_INTERVAL)
        finally:
            conn.close()

    def _round(self, conn: sqlite3.Connection) -> None:
        busy, pages = _passive(conn)
        if busy or pages < RESTART_PAGES:
            return
        # The copy's figures are the WAL as it began: what was committed
        # during it is not copied, and a WAL not all copied is never begun
        # anew. A second pass copies that, and what came during the second
        # (less again) is copied with the writer held off: a WAL all copied,
        # which the next commit starts over.
        busy, _ = _passive(conn)
        if not busy:
            with self._writer:
                _passive(conn)


def _passive(conn: sqlite3.Connection) -> tuple[bool, int]:
    """A PASSIVE checkpoint: (whether another one held it off, pages in the WAL)."""
    busy, pages, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return bool(busy), int(pages)
