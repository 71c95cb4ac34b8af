"""A live run whose journal directory was deleted or moved: carry on elsewhere.

Days-long jobs meet tmp cleaners, scratch wipes and ``rm -rf`` of a state
directory. Before, every later ``log_*`` call returned normally while its
records reached no sink and no counter (the uplink reads spool segments by
name), and the warnings named a path that no longer existed.

The recorder asks :class:`Rehomer` before each append. Deletion is seen
within 50 ms (the open spool segment has no link left: one ``fstat``); a
move, by the directory's inode at its path, looked at once a second; both
at the run's finish. Then, once and
loudly: the uplink process is stopped (its offsets are final, as after any
kill of it), the journal is re-created at its path with everything the
producer still holds (``journal.rehome``), and a new uplink ships it. The
run keeps its identity and registration, so nothing is registered or
shipped twice. Where the journal cannot be re-created (no space, no
permission), the run ships from threads over the handles this process still
holds, and says so: nothing is left for ``replay`` then, but nothing
returned is lost either.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time

from primeruns.logs import get_logger

from .journal import Journal
from .journal.rehome import directory_id, gone, leave_if_cut_short, rehome
from .supervisor import Supervisor

__all__ = ["Rehomer"]

log = get_logger("primeruns")

_LOOK_EVERY_S = 1.0  # how often the directory's inode is compared (a move)
# How often the open segment's link count is (a deletion): not on every
# append, which would cost a log call a few percent; nothing appended
# meanwhile is lost, it is carried over with the rest.
_CHEAP_EVERY_S = 0.05


class Rehomer:
    """Notices the journal's directory gone and moves the run to a new one.

    ``current()`` is called before each append; it returns the journal to
    append to. Thread-safe: one move at a time, the others wait for it.
    """

    def __init__(self, journal: Journal, supervisor: Supervisor | None) -> None:
        self._journal = journal
        self._supervisor = supervisor
        self._inode = directory_id(journal.path)
        self._next_deep = time.monotonic() + _LOOK_EVERY_S
        # The time (``time.monotonic``) before which ``current`` looks at
        # nothing: the recorder compares it itself, sparing every log call a
        # call here (infinite once given up).
        self.next_look = 0.0
        self._lock = threading.Lock()
        self._given_up = False
        self._announced: Journal | None = None  # the journal whose move was said

    def current(self, *, force: bool = False) -> Journal:
        """The journal to append to, moved first if its directory is gone.

        Looked at every ``_CHEAP_EVERY_S`` (the open segment's link count) and
        every ``_LOOK_EVERY_S`` (the directory's inode), and always when
        ``force`` (the run's finish: what was appended since the last look
        is carried over with it, from this process's handles)."""
        journal = self._journal
        if self._given_up:
            return journal
        now = time.monotonic()
        if not force and now < self.next_look:
            return journal
        self.next_look = now + _CHEAP_EVERY_S
        deep = force or now >= self._next_deep
        if deep:
            self._next_deep = now + _LOOK_EVERY_S
        why = gone(journal, self._inode if deep else None)
        if why is None:
            if leave_if_cut_short(journal):
                log.warning(
                    "prime-runs: the journal of run %s at %s was truncated under the run; "
                    "writing on in a new file (what the cut took before it was stored is "
                    "counted lost)",
                    journal.local_id,
                    journal.path,
                )
            return journal
        with self._lock:
            if self._journal is journal and not self._given_up:
                self._move(journal, why, wait=force)
            return self._journal

    def _give_up(self) -> None:
        """No more looks: the run ships from this process's handles."""
        self._given_up = True
        self.next_look = math.inf

    def _move(self, old: Journal, why: str, *, wait: bool) -> None:
        """``wait``: for the uplink's threads to hand over, when they are at
        it (else the move is tried again at a later append: a log call does
        not wait for their request in flight)."""
        supervisor = self._supervisor
        if self._announced is not old:
            self._announced = old
            log.warning(
                "prime-runs: the journal directory of run %s at %s was %s while the run was "
                "writing it; re-creating it there and carrying the run over (its identity, "
                "registration, records and offsets)",
                old.local_id,
                old.path,
                why,
            )
        try:
            stopped = supervisor.stop_for_move(wait=wait) if supervisor is not None else True
        except Exception as exc:  # never into the loop: the uplink is looked after as ever
            log.warning(
                "prime-runs: could not stop the uplink of run %s for the move (%s: %s); "
                "trying again at a later append",
                old.local_id,
                type(exc).__name__,
                exc,
            )
            return
        if stopped is None:
            return  # its threads hand over to its process first: the next look moves it
        if not stopped:  # an uplink in threads reads through this process's handles
            self._give_up()
            log.warning(
                "prime-runs: run %s ships on from this process's open handles; nothing of "
                "it is left on disk for 'primeruns replay'",
                old.local_id,
            )
            return
        try:
            new = rehome(old)
        # Not a JournalError alone: a read-only or full disk's OSError, an
        # lmdb error or a bug left the uplink stopped for good (the
        # supervisor waits for ``follow``) and reached the log call.
        except Exception as exc:
            self._give_up()
            log.warning(
                "prime-runs: could not re-create the journal of run %s (%s); shipping from "
                "this process's open handles instead: nothing of it is left on disk for "
                "'primeruns replay', and records are kept only while this process lives",
                old.local_id,
                exc,
            )
            if supervisor is not None:
                supervisor.follow(old, moved=False)
            return
        self._journal = new
        self._inode = directory_id(new.path)
        if supervisor is not None:
            supervisor.follow(new, moved=True)
        with contextlib.suppress(Exception):
            old.abandon()
        log.warning(
            "prime-runs: run %s goes on in the re-created journal %s", old.local_id, new.path
        )
