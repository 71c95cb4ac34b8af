"""An evaluation ships from threads while its uplink process starts, then hands over.

The uplink process's interpreter and imports take ~0.3-0.5 s, and nothing
shipped meanwhile: an evaluation that logs as fast as its rollouts finish
(5,000 episodes in ~0.6 s) had all of them waiting for that process, and ran
at ~0.85x the vendor's episodes/s where the same SDK shipping from threads
ran at ~1.0x. So a live evaluation ships from threads in its producer
(``UplinkThreads``) from ``init()``, while its uplink process waits beside
it on standby (``ship.standby``: no imports until the run has lived
``_WARM_AFTER_S``, or its producer died); once its imports are done it
reports, and waits.
The producer's threads ship on until they have caught up (a run logged
flat out is often over by then), then it hands over (``ThreadsFirst``):

1. its threads stop shipping after each attempt in flight, whose outcome
   they record first (``Uplink.stand_down``): the journal then says where
   each sink stands, as it does after any uplink's death;
2. it hands the journal's moving over, and writes *go*;
3. the process takes the claim (``ship.link``) and ships on from the
   offsets the journal holds, a recorded batch in flight first, byte for
   byte: nothing twice, nothing skipped.

One ships at a time: the process looks at the claim only after *go*, after
its producer closed its end of the pipe (only once the process was stopped
or told to go), or once its producer is dead, threads and all.

Nothing is moved in the producer meanwhile (``Journal.defer_moving``): its
mover's steps held the GIL for tens of ms (200 on a loaded machine) beside
the loop and the threads (a dictionary's training a second in, then the
batch the handover waited for), the log calls waiting behind them; the
process moves what was spooled once it takes over, and where the threads
ship for good the producer's ticks move again.

A run that finishes before the handover (``finish()``: its loop is over)
keeps its threads and stops the process (``claim_back``), as a short run
did before; an exit that waits less (``closing`` without ``claim_back``)
hands over at once instead, so the process goes on after the interpreter
is gone. Only evaluations: a training loop's producer would pay the
threads' CPU in its first steps (the loop-tax benchmark's p99), where a
training run's first steps leave nothing to catch up anyway.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

from primeruns.logs import get_logger

from ..exceptions import JournalError
from ..journal import Journal
from ..platform import Settings
from ..settings import SdkSettings
from ..threads import bounded, start_daemon
from .link import UplinkHandle, UplinkProcess, UplinkThreads
from .switch_interval import ShortSwitch

__all__ = ["ThreadsFirst"]

log = get_logger("primeruns")

# Which end ships: threads (the process waits), the handover under way, the
# process, or threads for good (the process was stopped or died starting).
_THREADS, _HANDING, _PROCESS, _THREADS_ONLY = "threads", "handing", "process", "threads-only"
# A progress mark's high bits say which end it came from (see progress_mark).
_EPOCH_SHIFT = 40
# A hurry this recent is passed on to the process at the handover.
_HURRY_S = 5.0
# A run that lives this long has its process do its imports (on standby until then).
_WARM_AFTER_S = 1.0
# Once the process is ready, the threads ship on until they have caught up,
# for at most this long (a producer that never lets them catch up pays their
# CPU that long), looking at least this often.
_CATCH_UP_S = 5.0
_LOOK_S = 0.1
# Caught up: each sink within this many entries of the journal's end. A
# steady evaluation (a few episodes per step of its own work) is never
# wholly shipped when looked at, always an entry or a batch behind; waiting
# for none left kept it on threads for the whole ``_CATCH_UP_S``, its loop
# paying their CPU (a loop slowed +25% where the vendor's was +18%, its log
# call's p99 10-20 ms). A backlog of a run logged flat out is thousands.
_CAUGHT_UP_ENTRIES = 256
# The producer moves nothing while the threads ship for at most this long
# (``Journal.defer_moving``): a process not ready by then (held, stopped,
# starved) may never be, and the threads then ship for good in all but name.
_DEFER_MOVING_S = 10.0
# How long one look for the process's report waits.
_READY_LOOK_S = 60.0


class ThreadsFirst:
    """A live run's uplink: threads in this process until its uplink process
    is ready, that process from then on (see the module doc)."""

    predecessors: Sequence[Path] = ()
    #: The uplink process's, once it ships (a move stops it by this).
    pid: int | None = None

    def __init__(
        self, journal: Journal, settings: Settings, tuning: SdkSettings | None = None
    ) -> None:
        self._journal = journal
        self._settings, self._tuning = settings, tuning
        self._cond = threading.Condition()
        self._state = _THREADS
        self._epoch = 0
        self._hurried_at = -1e9
        self._closing = False  # the producer journaled its finish (closing())
        self._releasing = False  # the producer let go of its ends (release())
        self._process = UplinkProcess(journal, settings, [], tuning, await_go=True)
        # The loop takes the GIL back from the threads sooner while they ship
        # beside it (``ship.switch_interval``); as it was once they stop.
        self._switch = ShortSwitch()
        self._switch.lower()
        # Nor does a mover compress beside the loop and the threads meanwhile:
        # the process moves what was spooled once it takes over.
        journal.defer_moving(True)
        try:
            self._threads = UplinkThreads(journal, settings, [], tuning, beside_the_loop=False)
        except BaseException:
            self._threads_phase_over()
            self._drop_process()
            raise
        try:
            start_daemon(self._watch, "primeruns-uplink-start")
        except BaseException:  # (no new thread at the interpreter's shutdown; an interrupt)
            self._threads_phase_over()  # (no uplink was made: nothing else would give it back)
            raise

    def _threads_phase_over(self) -> None:
        """The threads no longer ship beside the loop (the process took
        over, or they ship on for good, or the run is over): the switch
        interval as it was, and the background's ticks move here again
        (where the moving is still this process's)."""
        self._switch.restore()
        self._journal.defer_moving(False)

    # -- the handover ----------------------------------------------------------------
    def _watch(self) -> None:
        """Hand over once the process reports it is ready; if it exits
        first, threads ship for the rest of the run (the fallback's)."""
        process = self._process
        with self._cond:
            # A run over by then never loads the process (``ship.standby``).
            self._cond.wait_for(lambda: self._state != _THREADS, timeout=_WARM_AFTER_S)
            if self._state != _THREADS:
                return
        process.warm()
        ready = False
        deferred_until = time.monotonic() + _DEFER_MOVING_S
        while not ready and process.alive():
            with self._cond:
                if self._state != _THREADS:
                    return
                if time.monotonic() >= deferred_until:
                    # Not ready yet: the producer's ticks move again, else a
                    # process that is never ready left the whole run's
                    # spool unmoved (a quarter of the room left, raw, before
                    # the room count woke the mover).
                    self._journal.defer_moving(False)
            left = deferred_until - time.monotonic()
            ready = process.wait_ready(left if left > 0 else _READY_LOOK_S)
        if ready:
            self._when_caught_up()
        # Ready, the process takes over. Dead in its start-up, threads ship
        # for the rest of the run, beside the loop: the fallback's, at its
        # linger (``_ship_on_from_threads``), not these, which catch up at
        # the run's (0.1 s: a batch every few steps of a steady loop, each
        # taking the loop's GIL). These stand down first, as at a handover.
        self._hand_over()

    def _when_caught_up(self) -> None:
        """Wait until the threads have shipped all there is but a few
        batches' worth (``_CAUGHT_UP_ENTRIES``), or ``_CATCH_UP_S`` passed: a
        standing down then waits for a small request in flight at most, and
        a short evaluation logged flat out is shipped by the threads to its
        end (its finish then stops the process, which never shipped)."""
        threads, journal = self._threads, self._journal
        deadline = time.monotonic() + _CATCH_UP_S
        while self._state == _THREADS:
            mark = threads.progress_mark()
            try:
                last = journal.last_seq()
                shippers = threads.uplink.shippers  # (none until its thread made them)
                behind = last - _CAUGHT_UP_ENTRIES
                if shippers and all(s.settled(behind) for s in shippers):
                    return
            except JournalError:
                return
            left = deadline - time.monotonic()
            if left <= 0 or not threads.alive():
                return
            threads.wait_progress(mark, min(left, _LOOK_S))

    def _hand_over(self) -> None:
        """Stop the threads and let the process go, if the threads still ship.

        The threads' attempts in flight may take as long as a request's
        timeout: nothing waits for this but the watcher (and a move, which
        needs it done). What the producer asked for meanwhile (its close,
        its release) is done once it is over, by whichever end then ships."""
        if self._begin_handover():
            self._complete_handover()

    def _begin_handover(self) -> bool:
        with self._cond:
            if self._state != _THREADS:
                return False
            self._state = _HANDING
            self._epoch += 1
            return True

    def _complete_handover(self) -> None:
        try:
            stood_down = self._threads.stand_down()
        except Exception as exc:
            # (A journal closed under it: an exit that waited no time.) The
            # threads were not told and ship on; the process still waits for
            # go, or for this producer's death, and takes over then. Not
            # dropped: at an exit, it is all that ships the rest.
            log.warning("prime-runs: the uplink's threads could not stand down: %s", exc)
            with self._cond:
                self._state = _THREADS
                # No watcher tries again: the threads may ship to the run's
                # end, and the producer's ticks move again meanwhile.
                self._journal.defer_moving(False)
                self._epoch += 1
                closing = self._closing
                self._cond.notify_all()
            if closing:
                self._threads.closing()
            return
        with self._cond:
            if stood_down and not self._process.alive():
                stood_down = not self._ship_on_from_threads()
            if stood_down:
                self._journal.hand_over_moving()
                # A flush() waits (the threads were told): the hurry goes in
                # the go's own write, read with it (``ship.standby``).
                self._process.go(hurry=time.monotonic() - self._hurried_at < _HURRY_S)
                self._state = _PROCESS
                self._threads_phase_over()
                self.pid = self._process.pid
            else:  # the threads began closing the run out: they finish it
                self._drop_process()
                self._state = _THREADS_ONLY
                self._threads_phase_over()
            self._epoch += 1
            current = self._current()
            closing, releasing = self._closing, self._releasing
            self._cond.notify_all()
        if closing:
            current.closing()
        if releasing:
            current.release()

    def _hand_over_soon(self) -> None:
        """Start the handover without waiting for it (see ``_hand_over``).
        Under way from here (``wait_exit`` waits for it, not for the threads)."""
        if self._begin_handover():
            try:
                start_daemon(self._complete_handover, "primeruns-uplink-handover")
            except RuntimeError:  # no new thread at the interpreter's shutdown
                self._complete_handover()

    def _ship_on_from_threads(self) -> bool:
        """The process died (starting, or after it reported ready, while the
        threads stood down): threads ship on, new ones with the fallback's
        linger (``link.THREADS_LINGER_S``). (A death after this look is the
        supervisor's to notice: replace_if_dead.)"""
        try:
            threads = UplinkThreads(self._journal, self._settings, [], self._tuning)
        except Exception:
            log.exception("prime-runs: could not start the uplink's threads again")
            return False
        if time.monotonic() - self._hurried_at < _HURRY_S:
            threads.hurry()  # a flush() waits
        self._threads = threads
        return True

    def _drop_process(self) -> None:
        """Stop the process before it ever shipped (it waits for *go*)."""
        self._process.claim_back()
        self._process.release()
        self._journal.unshare_lock()

    def settle(self, *, wait: bool = True) -> bool:
        """Hand over if the threads still ship (a move of the journal stops
        the process, which must then be the one shipping); whether no
        handover is under way any more. ``wait``: for one, else only begin
        it (the threads' request in flight may take a request's timeout)."""
        self._hand_over_soon()
        with self._cond:
            if wait:
                self._cond.wait_for(lambda: self._state != _HANDING)
            return self._state != _HANDING

    def _current(self) -> UplinkHandle:
        return self._process if self._state == _PROCESS else self._threads

    # -- UplinkHandle ------------------------------------------------------------------
    def wake(self, now: float | None = None) -> None:
        if self._state == _PROCESS:
            self._process.wake(now)
        # (threads are woken by the journal itself; the process reads from
        # the offsets when it starts)

    def hurry(self) -> None:
        self._hurried_at = time.monotonic()
        with self._cond:
            if self._state != _HANDING:
                self._current().hurry()

    def closing(self) -> None:
        # After claim_back (finish()), the threads close the run out. Else
        # this is an exit that waits less than the close-out may take: the
        # process must go on after this interpreter, so it is handed over.
        with self._cond:
            self._closing = True
            if self._state in (_THREADS, _HANDING):
                self._hand_over_soon()
                return
            current = self._current()
        current.closing()

    def progress_mark(self) -> int:
        with self._cond:
            epoch, state = self._epoch, self._state
        inner = 0 if state == _HANDING else self._current().progress_mark()
        return (epoch << _EPOCH_SHIFT) | inner

    def wait_progress(self, mark: int, timeout: float) -> None:
        with self._cond:
            if mark >> _EPOCH_SHIFT != self._epoch:
                return  # the end that ships changed: that is news
            if self._state == _HANDING:
                self._cond.wait(bounded(timeout))
                return
            current = self._current()
        current.wait_progress(mark & ((1 << _EPOCH_SHIFT) - 1), timeout)

    def alive(self) -> bool:
        with self._cond:
            return self._state == _HANDING or self._current().alive()

    def exit_code(self) -> int | None:
        with self._cond:
            current = self._current()
        return getattr(current, "exit_code", lambda: None)()

    def wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            if not self._cond.wait_for(lambda: self._state != _HANDING, bounded(timeout)):
                return False
            current = self._current()
        return current.wait_exit(max(0.0, deadline - time.monotonic()))

    def release(self) -> None:
        with self._cond:
            self._releasing = True
            if self._state in (_THREADS, _HANDING):
                # (never closed: the process ships what is left, once handed over)
                self._hand_over_soon()
                return
            current = self._current()
        current.release()

    def claim_back(self) -> bool:
        with self._cond:
            if self._state == _THREADS:
                self._drop_process()
                self._state = _THREADS_ONLY
                self._threads_phase_over()
                self._epoch += 1
                self._cond.notify_all()
            if self._state in (_THREADS_ONLY, _HANDING):
                # The threads ship on and close the run out; or, mid-handover,
                # the process will (as one that took the claim would).
                return False
        return self._process.claim_back()

    def stop(self) -> None:
        with self._cond:
            if self._state == _THREADS:
                self._drop_process()  # on standby: killed, having loaded nothing
                self._state = _THREADS_ONLY
                self._threads_phase_over()
                self._epoch += 1
                self._cond.notify_all()
            # A handover under way ends first: then one end ships, and is stopped.
            self._cond.wait_for(lambda: self._state != _HANDING)
            current = self._current()
        current.stop()

    def begun(self) -> bool:
        """Whether the process took the claim (it ships this run)."""
        return self._state == _PROCESS and self._process.begun()
