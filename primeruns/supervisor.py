"""The producer's side of an online run's uplink: start it, wake it, wait on it.

``go_online`` registers the run (so ``run.url`` is there at once) and starts
the uplink (:mod:`primeruns.ship.link`: a process, or threads where one cannot
start). The :class:`Supervisor` it returns is all the run handle knows of
shipping: it passes the recorder's wake-ups on, waits for the sinks to catch
up (``flush``), starts again an uplink process that died mid-run (looked at
from the log calls once a second, and by ``flush``; in the finish's wait it
ships from threads in this process instead, but at an exit, which waits
less, it starts one again too), stops the uplink of an ``init()``
that failed after it started (``abandon``), and waits for the close-out
(shipping from threads itself when the run ends before its uplink process
began: a short run does not wait for that process's start-up). Every
answer it gives is read from the journal, where the uplink writes it
(``ship.ledger``); it never talks to the platform itself after ``init()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from primeruns.logs import get_logger

from . import hooks, ranks
from .exceptions import (
    APIError,
    ForbiddenError,
    JournalError,
    PaymentRequiredError,
    TransportError,
    UnauthorizedError,
    is_transient,
)
from .journal import Journal, in_memory
from .models import RunKind
from .platform import PlatformClient, Settings
from .platform.binding import Binding
from .settings import SdkSettings, process_sdk_settings
from .ship import ledger
from .ship.factory import sink_kinds
from .ship.family import ParentNotRegistered
from .ship.lifecycle import KeyCreatesSpent, Lifecycle
from .ship.link import UplinkHandle, UplinkThreads, job_stopped, kill_uplink, start_uplink
from .ship.policy import RetryPolicy
from .ship.uplink import K_FOLLOWS, earlier_journals

__all__ = ["Supervisor", "go_online"]

log = get_logger("primeruns")

_AUTH_ERRORS = (UnauthorizedError, ForbiddenError, PaymentRequiredError)
# finish() waits this much past its timeout for the uplink's last steps
# (stopping its shippers, the close-out call) before it returns anyway.
_CLOSE_GRACE = 10.0
# While finish() waits, it looks this often whether the uplink process is
# stopped (SIGSTOP), and kills one seen stopped this long in a row: a process
# that cannot move would spend the whole wait, then close the run out without
# what it had left once resumed (its budget spent). Long enough that a job
# suspended whole and resumed (SIGCONT to each of its processes, one by one)
# is not taken for one.
_STOPPED_LOOK_S = 1.0
# The longest single wait of a flush's drain in the caller's thread: a signal
# flagged on its way into one is handled at its end.
_SIGNAL_LOOK_S = 1.0
_STOPPED_FOR_S = 3.0
# Looks further apart than this (in this process's time) were not one
# stretch: this process was held between them (stopped with its job, or
# starved), and the uplink's stop is counted anew from the later one.
_STOPPED_GAP_S = 2 * _STOPPED_LOOK_S
# A log call looks this often whether the uplink process is still there
# (``Supervisor.wake``). One that died mid-run (killed alone: an out-of-memory
# kill, a cleanup of stray processes) shipped nothing more until a flush() or
# the finish, days later in a long training run, and a producer killed after
# it left every record since to a command; the vendor's thread ships on.
_LOOK_S = 1.0
# An uplink process started again that died again this many times is not
# started once more: threads of this process ship on, as where none can start.
_RESTARTS = 3
# ... this many times in a row, that is: one that lived this long before it
# died was no crash loop, and the count starts again. A three-day training run
# whose uplink an out-of-memory killer takes now and then would otherwise
# ship from threads after the third, whatever the days between, and a
# producer killed after that would leave the rest to a command.
_RESTARTS_FORGIVEN_S = 600.0
# init()'s own registration (two tries) is there for run.url at once, and
# holds the user's job while it lasts: a platform asking for a longer wait
# between them (a 429's Retry-After, honoured up to 60 s) is left to the
# uplink's registration in the background, which waits it out there; and so
# is one that takes longer all told (a gateway holding each request until
# the 60 s timeout held init() for two minutes). A create whose answer was
# cut off is looked up by its token then, never made twice.
_INIT_LONGEST_WAIT_S = 2.0
_INIT_WITHIN_S = 30.0


def go_online(
    journal: Journal,
    settings: Settings,
    kind: RunKind,
    on_failure: Callable[[str, BaseException], None],
    tuning: SdkSettings | None = None,
    *,
    siblings: bool = True,
) -> tuple[Supervisor, list[Path]]:
    """Register the run and start its uplink; the supervisor, and the journals
    of earlier processes of an attached run that it took over. ``siblings``:
    look for those (not for a forked child's journal, whose run's other
    journals are its parent's and its siblings', each shipped by its own).

    Raises the platform's authorization errors (401, 402, 403) and any
    failure that is not transient; a platform that cannot be reached only
    warns (the uplink registers the run once it can).
    """
    tuning = tuning or process_sdk_settings()
    policy = RetryPolicy.from_settings(tuning)
    client = PlatformClient(settings)
    lifecycle = Lifecycle(journal, client, policy=policy, on_failure=on_failure)
    try:
        lifecycle.register(attempts=2, longest_wait=_INIT_LONGEST_WAIT_S, within=_INIT_WITHIN_S)
    except ParentNotRegistered:
        pass  # a forked child: its uplink binds it once the parent's run is registered
    except KeyCreatesSpent:
        # Not "registers when it can": the uplink says when it tries one more
        # create (the key's window ended, the run still going); a finish()
        # before then gives up, saying when a replay may create the run.
        pass
    except APIError as exc:
        if not is_transient(exc) or isinstance(exc, _AUTH_ERRORS):
            raise
        log.warning(
            "prime-runs: %s (%s); the run goes on journaling and registers when it can. "
            "run.url is None until then.",
            "the platform is unreachable"
            if isinstance(exc, TransportError)
            else "the platform did not register the run yet",
            exc,
        )
    finally:
        client.close()  # from here on only the uplink talks to the platform
    attach = lifecycle.spec.attach_id
    predecessors: list[Path] = []
    # The run's earlier processes whose journals are left: an ``id=``
    # attach's, and a run key's once it named its run (registered here).
    # The uplink process of one SIGKILLed outlives it and ships them; in
    # threads (the fallback), they died with it, and were left to a
    # ``primeruns replay`` nobody ran while this process closed the run.
    binding = lifecycle.binding()
    keyed = lifecycle.spec.run_key and binding is not None
    of_run = attach or (binding.run_id if keyed and binding is not None else None)
    if of_run and siblings and not in_memory(journal):  # (one in memory has no folder)
        found = earlier_journals(journal.path.parent, of_run, exclude=journal.path)
        predecessors, alive = found.left, found.live
        if found.finished:  # passed over: said before its uplink starts, which reads it
            try:
                journal.set_meta(K_FOLLOWS, [p.name for p in found.finished])
            except JournalError:  # (a full disk) taken over then, as before
                predecessors = [*predecessors, *found.finished]
        if alive and attach:
            # Ranks of one run (primeruns.ranks): expected, and said once.
            log.info(
                "prime-runs: other processes (%s) log to run %s as well; this one %s",
                " and ".join(alive),
                attach,
                "closes it (its primary)"
                if ranks.is_primary(journal)
                else "leaves it open for its primary to close",
            )
    # An evaluation ships from threads while its uplink process starts
    # (``ship.startup``): not a forked child's, nor a run not yet registered.
    early = kind == "eval" and siblings and lifecycle.binding() is not None
    uplink = start_uplink(journal, settings, predecessors, tuning, threads_first=early)
    return Supervisor(journal, settings, kind, lifecycle, uplink, tuning), predecessors


class Supervisor:
    """A live run's uplink, seen from the producer. Thread-safe."""

    def __init__(
        self,
        journal: Journal,
        settings: Settings,
        kind: RunKind,
        lifecycle: Lifecycle,
        uplink: UplinkHandle,
        tuning: SdkSettings | None = None,
    ) -> None:
        self._journal = journal
        self._settings = settings
        self._tuning = tuning
        self._kind: RunKind = kind
        self._lifecycle = lifecycle
        self.uplink = uplink
        self._replaced = False
        self._replacing = threading.Lock()  # flush() and finish() on two threads
        self._bound: Binding | None = None
        self._next_look = time.monotonic() + _LOOK_S  # (read unlocked: a stale read costs a look)
        self._restarts = 0
        self._up_since = time.monotonic()  # when the uplink process now running was started
        # When a look last found it alive: how long it lived is known up to
        # there, not up to the look that finds it dead (a loop logging every
        # 15 minutes looks that late at an uplink that died at its start).
        self._alive_at = self._up_since
        self._moving = False  # stopped for a move of the journal (rehoming), not dead
        self._look_failed: str | None = None  # the last look's failure, said once

    def binding(self) -> Binding | None:
        """The platform's run, once registered (cached: it never changes)."""
        if self._bound is None:
            try:
                self._bound = self._lifecycle.binding()
            except JournalError:
                return None
        return self._bound

    def wake(self) -> None:
        # One clock read, after the append, for both gates: the uplink's
        # (a wake-up at most each WAKE_GAP_S) and this look's.
        now = time.monotonic()
        self.uplink.wake(now)
        if now >= self._next_look:
            self._look_at_uplink()

    # -- flush ---------------------------------------------------------------------
    def drain(self, targets: Mapping[int, int], timeout: float | None) -> bool:
        """Wait until every live sink acknowledged what was journaled up to
        ``targets`` (per entry kind); False at the timeout, or once a sink is
        retired or paused."""
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        hurried = False
        while True:
            mark = self.uplink.progress_mark()  # before the look: no report is missed
            done, settled = self._caught_up(targets)
            if done:
                return True
            if settled:
                return False
            if not hurried:
                self.uplink.hurry()  # small batches go now: someone waits for them
                hurried = True
            uplink = self.uplink
            self.replace_if_dead(restart=True)  # mid-run: a process outlives this one
            if self.uplink is not uplink:
                self.uplink.hurry()  # the new one: this flush still waits
            left = deadline - time.monotonic()
            if left <= 0 or not self.uplink.alive():
                return False  # out of time, or nothing left to ship it
            # Woken by the uplink's progress, or after a slice: CPython runs a
            # signal's handler at the main thread's next check, and a SIGTERM
            # landing on this wait's way in was handled only when a flush with
            # a stalled platform timed out (never, without a timeout).
            self.uplink.wait_progress(mark, min(left, _SIGNAL_LOOK_S))

    def _caught_up(self, targets: Mapping[int, int]) -> tuple[bool, bool]:
        """(every sink has what it owes up to ``targets``, the rest are retired or paused)."""
        journal = self._journal
        done = settled = True
        try:
            for name, kinds in sink_kinds(self._kind).items():
                target = max((targets.get(int(k), 0) for k in kinds), default=0)
                if target == 0:
                    continue
                standing = ledger.read_standing(journal, name)
                if standing.off is not None or journal.acked(name) >= target:
                    continue
                done = False
                settled = settled and standing.settled
        except JournalError:
            return False, True
        return done, settled and not done

    def may_free_room(self) -> bool:
        """Whether the uplink may still free room in the journal: a sink still
        ships (is not off, retired or paused; compaction follows the
        acknowledgements). Not whether one has records left: room freed by
        the last acknowledgements comes later than they do (LMDB reuses a
        page once no reader holds it), and held records the disk then takes
        are shipped in turn. True where the journal cannot tell."""
        journal = self._journal
        try:
            return not all(
                ledger.read_standing(journal, name).settled for name in sink_kinds(self._kind)
            )
        except JournalError:
            return True

    def pending(self) -> dict[str, int]:
        """Per sink still on, how many records it has not shipped (reads the journal)."""
        try:
            return ledger.pending_by_sink(self._journal, sink_kinds(self._kind))
        except JournalError:
            return {}

    # -- the uplink's life ---------------------------------------------------------
    def replace_if_dead(self, *, restart: bool = False) -> None:
        """If the uplink process died before closing the run out (killed, out
        of memory), ship on without it: with ``restart`` (mid-run), from a new
        uplink process, which outlives this one again; else, or once it died
        ``_RESTARTS`` times, from threads in this process from now on.

        A SIGTERM meanwhile (a flush() of the main thread starting a process
        again) is handled once ``_replacing`` is let go: its finish takes it."""
        with hooks.sigterm_deferred, self._replacing:
            self._replace_if_dead(restart=restart)

    def _look_at_uplink(self) -> None:
        """From a log call, once a second: start the uplink process again if it
        died mid-run. Never waits: a flush, a finish or a move already at it
        looks for itself. Never raises into the loop."""
        if not self._replacing.acquire(blocking=False):
            return
        try:
            self._next_look = time.monotonic() + _LOOK_S
            self._replace_if_dead(restart=True)
            self._look_failed = None
        except Exception as exc:  # the next look, flush or finish tries again
            # Said once per failure, not once a second for as long as it lasts
            # (a journal that keeps failing to read filled the job's log).
            said = f"{type(exc).__name__}: {exc}"
            level = logging.DEBUG if said == self._look_failed else logging.WARNING
            self._look_failed = said
            log.log(level, "prime-runs: could not look after the run's uplink: %s", exc)
        finally:
            self._replacing.release()

    def _replace_if_dead(self, *, restart: bool) -> None:
        """``replace_if_dead`` with ``_replacing`` held."""
        uplink, journal = self.uplink, self._journal
        # Stopped for a move, it is followed by another (``follow``): started
        # again here, on the journal being left, it would ship beside that one.
        if self._replaced or self._moving:
            return
        if uplink.alive():
            self._alive_at = time.monotonic()
            return
        if ledger.read_closeout(journal) is not None:
            return  # it finished its work
        if self._alive_at - self._up_since >= _RESTARTS_FORGIVEN_S:
            self._restarts = 0  # seen alive that long: no crash loop
        if restart and self._restarts < _RESTARTS and isinstance(getattr(uplink, "pid", None), int):
            self._restarts += 1
            self._up_since = self._alive_at = time.monotonic()
            self._restart(uplink, journal)
            return
        self._replaced = True
        self._replace(uplink, journal)

    def _restart(self, uplink: UplinkHandle, journal: Journal) -> None:
        """Ship on from a new uplink process, from the journal's offsets and
        recorded batches, as after any kill of one; from threads here where
        none can start."""
        log.warning(
            "prime-runs: the uplink process of run %s exited before the run was finished; "
            "starting it again (nothing is lost: it ships from the journal)",
            (self.binding() or Binding(journal.local_id, self._kind)).run_id,
        )
        predecessors = list(getattr(uplink, "predecessors", []))
        uplink.release()
        journal.unshare_lock()
        # The new process takes the moving over from the dead one; only
        # threads (no process could start) need this process's mover back.
        self.uplink = start_uplink(journal, self._settings, predecessors, self._tuning)
        if isinstance(self.uplink, UplinkThreads):
            self._replaced = True
            journal.take_back_moving()

    def _replace(self, uplink: UplinkHandle, journal: Journal) -> None:
        log.warning(
            "prime-runs: the uplink process of run %s exited before the run was finished; "
            "shipping from threads in this process from now on (nothing is lost: it ships "
            "from the journal)",
            (self.binding() or Binding(journal.local_id, self._kind)).run_id,
        )
        uplink.release()
        journal.unshare_lock()
        journal.take_back_moving()
        self.uplink = UplinkThreads(journal, self._settings, [], self._tuning)

    def stop_for_move(self, *, wait: bool = True) -> bool | None:
        """Stop the uplink process so the journal can be re-created elsewhere
        (``primeruns.rehoming``): its offsets are final once it is gone, as
        after any kill of it. False for an uplink in threads, which reads
        through this process's own handles and needs no move. Threads that
        ship while the process starts (``ship.startup``) hand over to it
        first: None while they are at it, unless ``wait``."""
        with self._replacing:
            uplink = self.uplink
            settle = getattr(uplink, "settle", None)
            if settle is not None and not settle(wait=wait):
                return None
            pid = getattr(uplink, "pid", None)
            if not isinstance(pid, int) or self._replaced:
                return False
            self._moving = True  # (see _replace_if_dead) until follow()
            try:
                kill_uplink(pid)  # (its group: under an interpreter's stand-in, its child too)
                uplink.wait_exit(30.0)
                uplink.release()
            except BaseException:
                # No move follows: a dead uplink is started again as ever.
                self._moving = False
                raise
            return True

    def follow(self, journal: Journal, *, moved: bool) -> None:
        """Ship ``journal`` from now on, with a new uplink process (``moved``:
        the journal was re-created) or, where the move failed, from threads
        over the journal this process still holds."""
        with self._replacing:
            old = self._journal
            self._journal = journal
            self._lifecycle.journal = journal  # where the registration is read
            self._moving = False
            if moved:
                self.uplink = start_uplink(journal, self._settings, [], self._tuning)
                return
            old.unshare_lock()
            old.take_back_moving()
            self._replaced = True
            self.uplink = UplinkThreads(old, self._settings, [], self._tuning)

    def ship_here_if_unstarted(self) -> bool:
        """Ship from threads in this process if the uplink process has not
        begun (``UplinkProcess.claim_back``: it then never will); whether
        this process ships now. For the finish: the loop is over, and a
        short run need not wait for that process's interpreter and imports."""
        with self._replacing:
            uplink, journal = self.uplink, self._journal
            if self._replaced or not uplink.claim_back():
                return False
            self._replaced = True
            uplink.release()
            journal.unshare_lock()
            journal.take_back_moving()
            predecessors = getattr(uplink, "predecessors", [])
            self.uplink = UplinkThreads(journal, self._settings, predecessors, self._tuning)
            return True

    def wait_closeout(self, waiting: float, *, grace: bool) -> ledger.Closeout | None:
        """After the finish entry: tell the uplink, and wait up to ``waiting``
        (plus a grace for its last steps) for it to close the run out; how it
        went, or None if it is still at it.

        An uplink process that died is started again where this call waits
        less than the uplink may ship (no ``grace``: an exit), for a process
        goes on after the interpreter where threads here would stop with it,
        the rest unshipped and the run left open; else threads ship here."""
        restart = not grace
        self.replace_if_dead(restart=restart)
        if grace:
            # This call waits out the uplink's whole budget, so threads
            # here ship as long as the process would have. Not at an exit
            # that waits less: the process goes on after it, threads would not.
            self.ship_here_if_unstarted()
        uplink = self.uplink
        uplink.closing()
        done_by = time.monotonic() + waiting + (_CLOSE_GRACE if grace else 0.0)
        stopped: tuple[float, float] | None = None
        while True:
            look_by = min(done_by, time.monotonic() + _STOPPED_LOOK_S)
            if uplink.wait_exit(max(0.0, look_by - time.monotonic())):
                self.replace_if_dead(restart=restart)  # it died before closing the run out
                if self.uplink is uplink:
                    break
                uplink = self.uplink
                uplink.closing()
            elif time.monotonic() >= done_by:
                break
            else:
                stopped = self._kill_if_stopped(uplink, stopped)
        return ledger.read_closeout(self._journal)

    def _kill_if_stopped(
        self, uplink: UplinkHandle, seen: tuple[float, float] | None
    ) -> tuple[float, float] | None:
        """Kill the uplink process if it was seen stopped (SIGSTOP) at every
        look for ``_STOPPED_FOR_S``: then it exits, and the finish's wait
        ships on without it (``replace_if_dead``) from the offsets it left,
        as after any kill. ``seen``: when it was first seen stopped and the
        last look (None: it is not stopped)."""
        pid = getattr(uplink, "pid", None)
        if not isinstance(pid, int) or self._replaced or not job_stopped(pid):
            return None
        now = time.monotonic()
        if seen is None or now - seen[1] > _STOPPED_GAP_S:
            # Its first look, or the first since this process was held: a job
            # suspended whole (the producer too) and resumed one process at a
            # time, the producer first, is not an uplink stopped that long.
            return now, now
        if now - seen[0] < _STOPPED_FOR_S:
            return seen[0], now
        log.warning(
            "prime-runs: the uplink process of run %s (pid %d) is stopped (SIGSTOP) while "
            "the run finishes; killing it and shipping on without it",
            (self.binding() or Binding(self._journal.local_id, self._kind)).run_id,
            pid,
        )
        kill_uplink(pid)
        return None

    def abandon(self) -> None:
        """``init()`` failed after ``go_online``: its handle is never
        returned, so nothing finishes the run. Stop the uplink, whichever end
        ships, without closing the run out; else its process would wait for
        this producer's death (one more per failed ``init()`` of a notebook
        that retries). The journal keeps where each sink stands, as after
        any kill of the uplink. Then the journal may be closed."""
        with self._replacing:
            self._replaced = True  # nothing ships this run here any more
            self.uplink.stop()
            self._journal.unshare_lock()
            self._journal.take_back_moving()

    def release(self) -> None:
        """The run's journal is closing: let go of the uplink's ends here."""
        self.binding()
        self.uplink.release()


# A SIGTERM's finish looks after the uplink too (``wait_closeout``): handled
# inside this call, which holds ``_replacing``, it waited for that lock for
# ever in the thread holding it, and a preempted job hung instead of ending.
hooks.sigterm_deferred.defers(Supervisor.replace_if_dead)
