"""The spool writer's slow system calls, in one thread of its own.

Two calls of the spool cost a log call milliseconds when it makes them
itself: the ``fdatasync`` a full segment needs before its successor is
written (a power cut must leave a lost tail, never a hole), and the
``close`` of a segment the mover absorbed and deleted (the last descriptor
of a deleted file: the file system frees its blocks then). Both are made
here instead, by one thread per writer that waits for work and wakes for
nothing else.

Once a thread was started for each sync ahead (every 512 KiB of appends),
and that start cost the call that made it ~1.5 ms on a loaded machine: a new
thread must be scheduled and take the GIL before ``start()`` returns (~300
starts in the backlog benchmark's 20,000 episodes). A request here is a
``notify`` under a lock. The one start left is not a log call's either: the
journal's background sync makes it at the journal's first write (``start``).
Made by the first sync ahead, a third of a second into an evaluation, it was
the slowest log call of its first seconds (3 ms, where the rest took 0.5):
its threads shipping then, the new thread and the call each waited for the
GIL behind them.

The sync at a segment's switch is what the guarantee needs; this thread
makes it cheap. The write that fills a segment asks for a sync of all of
it, and where that sync returned before the next write (a loop that does
some work between its log calls), the switch has nothing left to sync
(``synced``). While that sync runs, writes go on in the full segment, each
asking for a sync of all of it (one sync, the one after it, covers them
all: ``SpoolWriter._goes_on``); the switch then waits for that one if it is
not done (``await_sync``) instead of making one of its own, so a burst
still costs two syncs a segment.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from primeruns.logs import get_logger
from primeruns.threads import start_daemon

__all__ = ["SegmentSyncer"]

log = get_logger("primeruns.journal")


class SegmentSyncer:
    """Syncs ahead and closes let-go descriptors for one spool writer.

    ``sync`` and ``close_later`` never wait for the disk. Thread-safe. The
    thread starts at ``start`` or on first use, and ends at ``stop``; in a forked child (which
    never appends to its parent's journal) it would start again.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stopped = False
        # (segment, size): every byte of that segment up to size is on disk.
        self._synced: tuple[int, int] = (0, 0)
        self._fresh()

    def _fresh(self) -> None:
        """No thread yet (and, in a forked child, none of the parent's state:
        its lock may have been held at the fork)."""
        self._pid = os.getpid()
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        self._thread: threading.Thread | None = None
        # The newest sync asked for and not begun: (descriptor, segment, size).
        self._wanted: tuple[int, int, int] | None = None
        # The sync being made: (segment, size).
        self._busy: tuple[int, int] | None = None
        # (segment, size) of the last sync that ended, whether or not it
        # succeeded: what writes past a full segment wait on (``tried``).
        self._tried: tuple[int, int] = (0, 0)
        # Notified at the end of each sync (``await_sync``).
        self._done = threading.Condition(lock)
        # This thread warns of a failed sync: a request not begun waits
        # (``await_sync``), as the warning runs the program's logging
        # handlers, which may log to the run and wait for its append lock.
        self._warning = False
        self._closes: list[int] = []

    def synced(self, segment: int) -> int:
        """Bytes of ``segment`` (the writer's number for it) known on disk."""
        done_segment, size = self._synced
        return size if done_segment == segment else 0

    def tried(self, segment: int) -> int:
        """Bytes of ``segment`` the last sync that ended covered, whether or
        not it succeeded (a failed one was warned of: not asked again)."""
        done_segment, size = self._tried
        return size if done_segment == segment else 0

    def await_sync(self, segment: int, size: int) -> bool:
        """Wait for a sync asked for that covers ``size`` bytes of
        ``segment`` (begun or not) to end; whether they are on disk (False:
        none was asked for, or it failed: the caller syncs itself, as the
        switch before a successor must, whatever the syncs ahead tried)."""
        with self._cond:
            while not self._stopped and self._pid == os.getpid():
                busy, wanted = self._busy, self._wanted
                if not (
                    (busy is not None and busy[0] == segment and busy[1] >= size)
                    or (
                        wanted is not None
                        and wanted[1] == segment
                        and wanted[2] >= size
                        and not self._warning
                    )
                ):
                    break
                self._done.wait()
            return self.synced(segment) >= size

    def drop(self, segment: int) -> None:
        """Forget a sync of ``segment`` asked for and not begun: the caller
        syncs all of it itself."""
        fd: int | None = None
        with self._cond:
            wanted = self._wanted
            if wanted is not None and wanted[1] == segment and self._pid == os.getpid():
                fd, self._wanted = wanted[0], None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def start(self) -> None:
        """Start the thread now if it is not running (and not stopped): the
        journal's background sync calls this at the first write, so that the
        first sync ahead finds it started and no log call waits for a start."""
        if self._pid != os.getpid():  # a forked child: the parent's thread is not here
            self._fresh()
        with self._cond:
            if not self._stopped:
                self._running()

    def sync(self, fd: int, segment: int, size: int) -> None:
        """Sync ``fd`` (segment ``segment``, ``size`` bytes written) soon.

        A request made while a sync runs replaces any still waiting: the one
        after it covers both."""
        try:
            own = os.dup(fd)  # the writer may close its descriptor meanwhile
        except OSError:
            return  # the switch's own sync does all of it
        self._hand_over(wanted=(own, segment, size))

    def close_later(self, fds: list[int]) -> None:
        """Close these descriptors (segments let go) off the caller's thread."""
        if fds:
            self._hand_over(closes=fds)

    def _hand_over(
        self, *, wanted: tuple[int, int, int] | None = None, closes: list[int] | None = None
    ) -> None:
        if self._pid != os.getpid():  # a forked child: the parent's thread is not here
            self._fresh()
        replaced: int | None = None
        with self._cond:
            if self._stopped or not self._running():
                replaced = wanted[0] if wanted is not None else None
                wanted = None
            else:
                if wanted is not None:
                    if self._wanted is not None:
                        replaced = self._wanted[0]
                    self._wanted = wanted
                if closes:
                    self._closes.extend(closes)
                    closes = None
                self._cond.notify()
        for fd in [*([] if replaced is None else [replaced]), *(closes or [])]:
            with contextlib.suppress(OSError):
                os.close(fd)  # no thread to be had (stopped, or the interpreter exiting)

    def _running(self) -> bool:
        """Whether the thread runs (started here if not); under ``_cond``."""
        if self._thread is None:
            try:
                self._thread = start_daemon(self._loop, f"primeruns-spool-sync-{self._path.name}")
            except RuntimeError:
                return False
        return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._wanted is None and not self._closes and not self._stopped:
                    self._cond.wait()
                wanted, self._wanted = self._wanted, None
                closes, self._closes = self._closes, []
                stopped = self._stopped
                if wanted is not None:
                    self._busy = wanted[1:]
            for fd in closes:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if wanted is not None:
                fd, segment, size = wanted
                failed: OSError | None = None
                try:
                    if not stopped:
                        os.fdatasync(fd)
                        self._synced = (segment, size)
                except OSError as exc:
                    failed = exc
                finally:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                    with self._cond:
                        self._busy = None
                        self._tried = (segment, size)
                        self._warning = failed is not None
                        self._done.notify_all()
                if failed is not None:
                    # Warned of once a switch waiting for this sync has gone
                    # on: a handler that logs to the run waits for the append
                    # lock that switch holds (it hung there for good). A
                    # handler's own exception does not end this thread: a
                    # switch would wait for good for a sync asked of it.
                    with contextlib.suppress(Exception):  # (the program's handler's)
                        log.warning("journal %s: sync failed (%s)", self._path, failed)
                    with self._cond:
                        self._warning = False
            if stopped:
                return

    def stop(self) -> None:
        """End the thread once its sync is done (the journal closes); what
        it was still to close is closed."""
        with self._cond:
            self._stopped = True
            thread = self._thread if self._pid == os.getpid() else None
            self._cond.notify()
            self._done.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
