"""The producer's end of its uplink, and the uplink's end of its producer.

A live run ships from an uplink process beside the producer, so the user's
loop never pays for decompressing, encoding and sending. Between the two
there is the journal (the only queue and the only state) and two pipes that
only ever carry wake-ups, never data:

- *wake* (producer → uplink): one byte after an append, written without
  blocking (a full pipe already means a wake-up is pending), at most one
  each ``WAKE_GAP_S``; ``HURRY`` when ``flush()`` or ``finish()`` waits, so
  small batches go out without lingering. The uplink acts on a burst of
  appends (a training step's episodes, then its metrics row) once the
  producer has been quiet for ``QUIET_S``: woken in the middle of one, it
  would take a core from the producer's next call (a 2-core machine's p99
  per-step log time went from ~4 ms to ~2 ms with this); and bursts closer
  together than the run's linger are passed on as one (``_until_due``).
  A wake-up is passed on to the shippers no sooner than ``SETTLE_S`` after
  the uplink read it (``_settle``), so an append within ``WAKE_GAP_S`` of
  the producer's last byte needs none of its own: that byte, read after it
  was written, is passed on later than the append (the write was a system
  call per ``log_*`` call, and woke the uplink's thread as often);
- *progress* (uplink → producer): one byte whenever a sink acknowledged,
  failed or changed standing, so ``flush()`` and ``finish()`` wait without
  polling. Its end of file says the uplink is gone.

Who ships is settled once, by a *claim*: a pipe holding one byte, whose
read end both processes have. The uplink reads it as soon as it starts,
before it touches the journal or the platform, and ships only if it got
the byte. A run that finishes before its uplink got that far (its
interpreter and imports take ~0.5 s, a one-episode evaluation less) reads
the byte itself (``UplinkProcess.claim_back``): the uplink then never ships,
is stopped, and the producer ships the rest from threads while it waits in
``finish()`` (its loop is over: no tax on it). One of the two reads the
byte, never both, so nothing is shipped twice, and a run that lives on
ships from the process as before. An evaluation's producer ships from
threads meanwhile (``ship.startup``): its process, started with
``--await-go``, looks at the claim only once told to go (``GO``), or once
its producer is gone.

The uplink learns of its producer's death from a pidfd (or, where there is
none, from the wake pipe's end of file and its parent pid), ships what is left
and closes the run out as crashed. It runs in a session of its own, so a
Ctrl-C in the terminal reaches the producer (which finishes the run) and not
the uplink before that. Its settings reach it through a pipe (its standard
input), the API key among them, never its command line; its environment
keeps no ``PRIME_*`` variable, so it ships by the settings its producer
resolved and nothing else. Where no process can be started, the same uplink
runs as threads in the producer (``UplinkThreads``), with one warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import select
import signal
import stat
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from primeruns.logs import get_logger

from ..exceptions import JournalError
from ..journal import Journal
from ..platform import Settings
from ..settings import SdkSettings, process_sdk_settings, without_settings
from ..threads import bounded, start_daemon
from .policy import RetryPolicy
from .standby import GO, HURRY, SETTLE_S, WARM, pause, wait_for_word
from .uplink import Uplink

__all__ = [
    "PipeProducerLink",
    "ProgressReader",
    "UplinkHandle",
    "UplinkProcess",
    "UplinkThreads",
    "await_go",
    "kill_uplink",
    "start_uplink",
]

log = get_logger("primeruns")

WAKE = b"\0"
_MAIN = "primeruns.ship.uplink_main"
QUIET_S = 0.005  # the producer's appends are one burst until it is quiet this long
# The producer writes at most one wake-up this often, and the uplink passes
# one on SETTLE_S after it read it at the earliest: an append within the
# gap is covered by the byte before (see the module doc), if the gap is
# the shorter of the two.
WAKE_GAP_S = 0.001
assert WAKE_GAP_S < SETTLE_S
LATE_S = 0.05  # and a burst is acted on this long after it began, at the latest
UPLINK_LOG_NAME = "uplink.log"  # the uplink's standard error, in the run's directory


class UplinkHandle(Protocol):
    """What the producer holds of its uplink, process or threads."""

    pid: int | None

    def wake(self, now: float | None = None) -> None:
        """Tell the uplink something was appended; never blocks. ``now``: the
        monotonic time, read after the append (None: read here)."""

    def closing(self) -> None:
        """Tell the uplink the finish entry is journaled."""

    def hurry(self) -> None:
        """Tell the uplink someone waits for what is journaled (flush)."""

    def progress_mark(self) -> int:
        """How much progress was reported so far: take it before looking at
        the journal, then ``wait_progress`` from it, and no report between
        the look and the wait is missed."""

    def wait_progress(self, mark: int, timeout: float) -> None:
        """Until the uplink reported progress since ``mark``, exits, or
        ``timeout`` passes."""

    def alive(self) -> bool: ...

    def wait_exit(self, timeout: float) -> bool:
        """Wait for the uplink to be done; whether it is."""

    def release(self) -> None:
        """Close this side's ends (the run's journal is closing)."""

    def claim_back(self) -> bool:
        """Take the shipping back from an uplink that has not begun it (see
        the module doc): True when this process ships from now on."""

    def stop(self) -> None:
        """Stop shipping, without closing the run out, and let go of this
        side's ends: ``init()`` failed after the uplink started, and nothing
        will finish the run. The journal keeps where each sink stands."""


def start_uplink(
    journal: Journal,
    settings: Settings,
    predecessors: Sequence[Path],
    tuning: SdkSettings | None = None,
    *,
    threads_first: bool = False,
) -> UplinkHandle:
    """Start the uplink of a live run: a process, or threads where one cannot
    start or ``tuning.uplink`` says so. ``tuning``: the run's resolved SDK
    settings (None: this process's, ``process_sdk_settings``).
    ``threads_first``: threads ship until the process is ready
    (``ship.startup``; not with ``predecessors``, which the process takes over)."""
    tuning = tuning or process_sdk_settings()
    if tuning.uplink != "threads":
        try:
            if threads_first and not predecessors:
                from .startup import ThreadsFirst  # (it is built on this module)

                return ThreadsFirst(journal, settings, tuning)
            return UplinkProcess(journal, settings, predecessors, tuning)
        # A JournalError too: the journal refused the hand-over (its lock
        # shared, the uplink named, the moving handed over; the process, if
        # it started, is stopped again). Threads here ship from it all the
        # same; raised, it reached the user's loop from a flush() that
        # started a dead uplink again, under on_error="warn".
        except (OSError, subprocess.SubprocessError, ValueError, JournalError) as exc:
            log.warning(
                "prime-runs: could not start the uplink process (%s); shipping from threads "
                "in this process instead",
                exc,
            )
    return UplinkThreads(journal, settings, predecessors, tuning)


def wait_readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` became readable (or at its end) within ``timeout``.

    poll, not select: a user's process may hold over 1024 descriptors, and
    select refuses a number that high."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        return bool(poller.poll(bounded(timeout) * 1000.0))
    except (OSError, ValueError):
        return True  # (a closed descriptor) the caller looks at it again


class ProgressReader:
    """The producer's end of the progress pipe: it counts the uplink's
    reports, so that any number of threads wait on them (``flush()`` from
    several) and none misses one that came after its mark.

    One waiter at a time waits on the pipe, without the lock; the others wait
    on the condition, which it notifies once it has counted what it read. No
    lock is held across a wait, so a signal handler that ends the run (SIGTERM
    during a flush, on the same thread) can close it.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._reports = 0  # progress bytes read so far (and one for the end of file)
        self._eof = False
        self._closed = False
        self._polling = False  # a waiter is on the pipe
        self._cond = threading.Condition(threading.RLock())

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            while not self._eof and not self._closed:
                chunk = os.read(self._fd, 4096)
                if not chunk:
                    self._eof = True
                    self._reports += 1  # the uplink's exit is news too
                    return
                self._reports += len(chunk)
                if len(chunk) < 4096:
                    return

    def mark(self) -> int:
        with self._cond:
            if not self._polling:
                self._drain()
            return self._reports

    def ended(self) -> bool:
        """Whether the pipe is at its end: the uplink is gone, or going."""
        with self._cond:
            if not self._polling:
                self._drain()
            return self._eof

    def wait(self, mark: int, timeout: float) -> bool:
        """Until a report came after ``mark`` or ``timeout`` passes; whether
        the pipe is at its end with nothing new (the uplink is gone)."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                # Only the one on the pipe reads it while it is there: a byte
                # read by another would leave it waiting for one more.
                if not self._polling:
                    self._drain()
                if self._reports != mark or self._closed:
                    return False
                if self._eof:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if self._polling:
                    self._cond.wait(bounded(left))  # the one on the pipe notifies
                    continue
                self._polling = True
                self._cond.release()
                try:
                    wait_readable(self._fd, left)
                finally:
                    self._cond.acquire()
                    self._polling = False
                    if self._closed:
                        self._close_fd()
                    self._drain()
                    self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            if not self._polling:  # else the one on the pipe closes it when it is off it
                self._close_fd()
            self._cond.notify_all()

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class UplinkProcess:
    """An uplink process: ``python -m primeruns.ship.uplink_main``."""

    #: What it ships besides the journal, for threads that take over from it.
    predecessors: list[Path]

    def __init__(
        self,
        journal: Journal,
        settings: Settings,
        predecessors: Sequence[Path],
        tuning: SdkSettings | None = None,
        *,
        await_go: bool = False,
    ) -> None:
        """``await_go``: the process waits on standby for ``warm`` (or
        ``go``), reports once it is ready, then waits for ``go`` (or its
        producer's death) before it looks at the claim; the producer keeps
        the journal's moving until then (``ship.startup``, ``ship.standby``)."""
        tuning = tuning or process_sdk_settings()
        self.predecessors = list(predecessors)
        wake_r, self._wake_w = os.pipe()
        self._progress_r, progress_w = os.pipe()
        self._claim = _claim_token()
        self._ships_there = False  # the uplink took the claim (known once it is looked at)
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._progress_r, False)
        lock_fd = journal.share_lock()
        # On standby first (``ship.standby``: a bare interpreter, no imports)
        # when it may never be needed; else the uplink itself.
        entry = ["-S", str(Path(__file__).with_name("standby.py"))] if await_go else ["-m", _MAIN]
        command = [
            sys.executable,
            # -P: the working directory (or the script's) does not go first
            # on the child's path: a "primeruns" directory there (another
            # checkout) must not be what the uplink runs.
            "-P",
            *entry,
            "--journal",
            str(journal.path),
            "--producer",
            str(os.getpid()),
            "--wake-fd",
            str(wake_r),
            "--progress-fd",
            str(progress_w),
            "--lock-fd",
            str(lock_fd),
            "--claim-fd",
            str(self._claim),
            *(["--await-go"] if await_go else []),
        ]
        # No PRIME_* variable: the settings (the key among them) come by the pipe.
        env = without_settings(os.environ)
        # The very package this process runs, however it was put on its path.
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        # Its log goes beside the journal from the start, never to the
        # producer's stdout or stderr: a caller reading the producer's pipes
        # (subprocess.run(capture_output=True), `| tee`) would otherwise wait
        # for the uplink's close-out after the producer exited.
        log_fd = open_uplink_log(journal.path)
        try:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log_fd,
                pass_fds=(wake_r, progress_w, lock_fd, self._claim),
                start_new_session=True,  # a terminal's Ctrl-C is the producer's to handle
                env=env,
            )
            handover = {
                "settings": {
                    **dataclasses.asdict(settings),
                    "sources": dict(settings.sources),
                },
                "sdk": tuning.to_handover(),
                "predecessors": [str(p) for p in predecessors],
            }
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(handover).encode())
            self._proc.stdin.close()
            self.pid: int | None = self._proc.pid
            # Its exit is waited for on a pidfd (Popen.wait with a timeout polls).
            self._pidfd: int | None = None
            with contextlib.suppress(OSError, AttributeError):
                self._pidfd = os.pidfd_open(self._proc.pid)
            journal.name_uplink(self._proc.pid)  # before init() returns: listings see it
            if not await_go:
                journal.hand_over_moving()  # the uplink absorbs the spool into LMDB
        except BaseException:
            # Started, then this failed (its handover not written, a journal
            # error, a Ctrl-C): no handle is returned, so nothing would stop
            # it; with its group (an interpreter's stand-in may run it).
            spawned = getattr(self, "_proc", None)
            if spawned is not None:
                kill_uplink(spawned.pid)
                spawned.wait()
            for fd in (self._wake_w, self._progress_r, self._claim, getattr(self, "_pidfd", None)):
                if fd is None:
                    continue
                with contextlib.suppress(OSError):
                    os.close(fd)
            journal.unshare_lock()
            raise
        finally:
            os.close(wake_r)
            os.close(progress_w)
            if log_fd != subprocess.DEVNULL:
                os.close(log_fd)
        self._progress = ProgressReader(self._progress_r)
        # Held by each write to the wake pipe and by release(): reentrant, for
        # a SIGTERM's finish may release in the thread it interrupted mid-write.
        self._lock = threading.RLock()
        # How many writes to the wake pipe are under way in this thread: a
        # count, for a signal handler's write (a SIGTERM's finish hurries)
        # nests in the one it interrupted, and a flag the inner one cleared
        # let release() close the pipe under the outer one.
        self._writing = 0
        self._closed = False
        self._woke_at = float("-inf")  # when the last wake-up was about to be written

    def wake(self, now: float | None = None) -> None:
        # Within WAKE_GAP_S of the last byte's time, this append is passed
        # on with that byte: the uplink read it after it was written, so
        # after that time, and passes it on SETTLE_S after the read at the
        # earliest (``PipeProducerLink._settle``), after now. The time is
        # taken before the write and kept after it: a byte cut off between
        # the two (Ctrl-C) leaves none that covers later appends, and a
        # thread that reads an older time only writes one more. (A time
        # read after the append, handed by the caller, is as good: the
        # supervisor reads one clock for this gate and its own.)
        if now is None:
            now = time.monotonic()
        if now - self._woke_at < WAKE_GAP_S:
            return
        self._send(WAKE)
        self._woke_at = now

    def hurry(self) -> None:
        self._send(HURRY)

    def _send(self, byte: bytes) -> None:
        # Never beside release(): a descriptor it closed under a write may be
        # given to another open at once (a journal file, a socket), and the
        # byte written there. Under the lock, then, and a release by a signal
        # handler of this very thread (a SIGTERM's finish, which the reentrant
        # lock lets in) leaves the pipe to be closed here, once written.
        with self._lock:
            if self._closed:
                return
            self._writing += 1  # (before the descriptor is read)
            try:
                os.write(self._wake_w, byte)
            except BlockingIOError:
                pass  # the pipe is full: the uplink has wake-ups waiting already
            except OSError:
                pass  # the uplink is gone; alive() says so
            finally:
                self._writing -= 1
                if self._closed and not self._writing:  # the outermost write closes it
                    self._close_wake()

    def _close_wake(self) -> None:
        fd, self._wake_w = self._wake_w, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def closing(self) -> None:
        self.hurry()

    def go(self, *, hurry: bool = False) -> None:
        """Let an uplink started with ``await_go`` go on to the claim
        (``hurry``: in the same write, so that it is read with the go)."""
        self._send(GO + HURRY if hurry else GO)

    def warm(self) -> None:
        """Let an uplink started with ``await_go`` do its imports, then report ready."""
        self._send(WARM)

    def wait_ready(self, timeout: float) -> bool:
        """Whether an uplink started with ``await_go`` reported that it waits
        for ``go`` (its imports done) within ``timeout``; False once it is
        gone. The progress pipe's end of file (counted as news) is no report:
        a dying process's descriptors close before its exit can be seen
        (``alive()``), and an interpreter's stand-in may outlive it; its exit
        is waited for instead, within ``timeout``."""
        deadline = time.monotonic() + max(0.0, timeout)
        self._progress.wait(0, timeout)
        if self._progress.ended():
            self.wait_exit(max(0.0, deadline - time.monotonic()))
            return False
        return self._progress.mark() != 0 and self.alive()

    def progress_mark(self) -> int:
        return self._progress.mark()

    def wait_progress(self, mark: int, timeout: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout)
        if self._progress.wait(mark, timeout):
            # The uplink is gone (or going): its exit is what to wait for.
            self.wait_exit(deadline - time.monotonic())

    def alive(self) -> bool:
        return not self._exited()

    def exit_code(self) -> int | None:
        self._exited()
        return self._proc.returncode

    def _exited(self) -> bool:
        """Whether the process started has exited; if so, what is left of its
        process group is killed before it is reaped. An interpreter's
        stand-in that runs the interpreter as its child (not exec'd) is that
        process: killed alone, its child, the uplink, shipped on unseen, and
        the producer took the uplink for dead and started another (two
        shippers of one journal; the first, its wake pipe closed, then closed
        the run out as crashed). Killed while the exited process is not yet
        reaped, its pid, the group's id, cannot have been taken by another."""
        if self._proc.returncode is not None:
            return True
        try:
            exited = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            exited = None  # reaped already (``_reap_when_done``)
        except OSError:
            return self._proc.poll() is not None
        if exited is not None:
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        return self._proc.poll() is not None

    def wait_exit(self, timeout: float) -> bool:
        pidfd = self._pidfd
        if pidfd is not None and not self._closed:
            if not wait_readable(pidfd, timeout):
                return False
            self._exited()  # (its group killed before it is reaped)
            timeout = 1.0  # it has exited: reaping it is immediate
        try:
            self._proc.wait(bounded(timeout))
        except subprocess.TimeoutExpired:
            return False
        return True

    def claim_back(self) -> bool:
        with self._lock:
            fd, self._claim = self._claim, -1
        if fd < 0:
            return False
        try:
            got = os.read(fd, 1)
        except OSError:
            got = b""  # (not expected) the uplink may have it: it ships, as it would
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        if not got:
            self._ships_there = True
            return False  # the uplink has it: it ships, and closes the run out
        # It can never ship now, and stands down once it looks; it is
        # stopped at once so that the rest of its start-up takes no CPU.
        kill_uplink(self._proc.pid)
        with contextlib.suppress(OSError):
            self._proc.kill()
        self.wait_exit(5.0)
        return True

    def stop(self) -> None:
        # Killed whether or not it took the claim (the claim taken back
        # first, so one that has not begun never will): a kill leaves the
        # journal's offsets final, as after any death of the uplink.
        self.claim_back()
        kill_uplink(self._proc.pid)
        self.wait_exit(30.0)
        self.release()

    def begun(self) -> bool:
        """Whether the uplink process took the claim: it ships this run, and
        ``claim_back`` will not take it back (a test freezing the uplink
        waits for this first)."""
        with self._lock:
            if self._claim < 0:
                return self._ships_there
            try:
                count = fcntl.ioctl(self._claim, termios.FIONREAD, b"\0\0\0\0")
            except OSError:
                return False
            return bool(struct.unpack("i", count)[0] == 0)

    def release(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._proc.poll() is None:
                _reap_when_done(self._proc)
            self._progress.close()
            pidfd, self._pidfd = self._pidfd, None
            claim, self._claim = self._claim, -1
            if not self._writing:  # else the write under way closes it (``_send``)
                self._close_wake()
            for fd in (pidfd, claim):
                if fd is not None and fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)


# Uplink processes let go of while they still ship (``_reap_when_done``).
_OUTLIVING: set[subprocess.Popen[bytes]] = set()


def _reap_when_done(proc: subprocess.Popen[bytes]) -> None:
    """An uplink still at work when its producer lets go of it (a close-out
    that outlives finish()'s wait, an exit that waits less): waited for by a
    thread of its own, so it is reaped once done, and its ``Popen``, left to
    the garbage collector with the run, is never that of a process still
    running (a ResourceWarning then, raised in whatever ran next)."""
    _OUTLIVING.add(proc)

    def reap() -> None:
        with contextlib.suppress(Exception):
            proc.wait()
        _OUTLIVING.discard(proc)

    start_daemon(reap, f"primeruns-uplink-reaper-{proc.pid}")


class _ThreadLink:
    """The uplink-in-threads' view of its producer: the same process."""

    producer_gone = False

    def __init__(self) -> None:
        self.event = threading.Event()

    def wait(self, timeout: float | None) -> None:
        self.event.wait(timeout)
        self.event.clear()


# Shipping from threads, a batch waits at least this long after its sink's
# last request for more to queue up (the run's linger_s, if longer). There
# every batch's work (reading, decoding, stamping, encoding, its journal
# writes, its request) holds the loop's GIL, and what it costs is mostly per
# batch, not per record: at the process's tenth of a second, a training loop
# logging a step every 20 ms had three sinks each make a batch every two or
# three steps, and each of them took the GIL from the loop several times.
# A sink of a steady loop now makes one batch a second; flush() and finish()
# still send at once, and a full batch goes without waiting.
THREADS_LINGER_S = 1.0


class UplinkThreads:
    """The fallback: the same uplink, as threads in the producer."""

    pid: int | None = None

    def __init__(
        self,
        journal: Journal,
        settings: Settings,
        predecessors: Sequence[Path],
        tuning: SdkSettings | None = None,
        *,
        beside_the_loop: bool = True,
    ) -> None:
        """``beside_the_loop``: batches wait ``THREADS_LINGER_S`` for more
        (the fallback, for the rest of the run); False for threads that ship
        only until a process takes over (``ship.startup``), which are to
        catch up, at the run's linger."""
        self._progress = threading.Condition()
        self._gen = 0
        self._link = _ThreadLink()
        policy = RetryPolicy.from_settings(tuning or process_sdk_settings())
        if beside_the_loop and policy.linger_s < THREADS_LINGER_S:
            policy = dataclasses.replace(policy, linger_s=THREADS_LINGER_S)
        self.uplink = Uplink(journal, settings, policy=policy, notify=self._notify)
        self._thread = start_daemon(self._serve, "primeruns-uplink", (list(predecessors),))

    def _serve(self, predecessors: list[Path]) -> None:
        try:
            self.uplink.serve(self._link, predecessors)
        except Exception:
            if self.uplink.journal.closed:
                # finish() returned while a request here still waited on the
                # platform, and closed the journal: what is left is in it.
                log.info("prime-runs: the uplink's threads ended with the run's journal")
            else:
                log.exception("prime-runs: the uplink stopped by an unexpected error")
            # No shipper outlives serve: whatever ships next (threads that
            # replace these, a process told to go) ships from the journal's
            # offsets, and two shippers of one sink must never run at once.
            try:
                self.uplink.stop_shipping()
            except Exception:
                log.exception("prime-runs: the uplink's shippers could not be stopped")
        finally:
            self._notify()

    def _notify(self) -> None:
        with self._progress:
            self._gen += 1
            self._progress.notify_all()

    def wake(self, now: float | None = None) -> None:
        pass  # the journal's own condition wakes the shippers in this process

    def closing(self) -> None:
        self._link.event.set()

    def hurry(self) -> None:
        self.uplink.hurry()

    def progress_mark(self) -> int:
        with self._progress:
            return self._gen

    def wait_progress(self, mark: int, timeout: float) -> None:
        with self._progress:
            if self._thread.is_alive():
                self._progress.wait_for(lambda: self._gen != mark, timeout=bounded(timeout))

    def alive(self) -> bool:
        return self._thread.is_alive()

    def exit_code(self) -> int | None:
        return None if self._thread.is_alive() else 0

    def wait_exit(self, timeout: float) -> bool:
        self._thread.join(bounded(timeout))
        return not self._thread.is_alive()

    def release(self) -> None:
        pass

    def claim_back(self) -> bool:
        return False  # shipping from this process already

    def stop(self) -> None:
        # (registered or not: no other uplink takes over now)
        if self.uplink.stand_down(for_good=True):
            self._link.event.set()
            self._thread.join()

    def stand_down(self) -> bool:
        """Stop shipping without closing the run out, once each shipper's
        attempt in flight is recorded (``Uplink.stand_down``); whether it
        did (False: the close-out had begun, and goes on)."""
        if not self.uplink.stand_down():
            return False
        self._link.event.set()
        self._thread.join()
        return True


class PipeProducerLink:
    """The uplink process's view of its producer: wake-ups by pipe, its death by pidfd."""

    def __init__(
        self,
        journal: Journal,
        wake_fd: int,
        progress_fd: int,
        producer: int,
        on_gone: Callable[[], None] | None = None,
        *,
        every_s: float = 0.0,
    ) -> None:
        """``on_gone`` runs once, in the watching thread, when the producer is
        gone; ``on_hurry`` (settable later) when it asks for haste.
        ``every_s``: the shippers are woken at most this often by appends
        (the run's linger: a small batch waits that long for more anyway);
        a hurry or the producer's death wakes them at once."""
        self._journal = journal
        self._every_s = max(0.0, every_s)
        self._woken_at = float("-inf")  # monotonic time of the last wake-up passed on
        self._wake_read_at = float("-inf")  # ... and of the last read of one (``_settle``)
        self._on_gone = on_gone
        self._on_hurry: Callable[[], None] | None = None
        # A hurry read before ``on_hurry`` is set (the link starts first; the
        # standby may have read the go alone): kept for it.
        self._hurry_lock = threading.Lock()
        self._hurry_pending = False
        self._wake_fd = wake_fd
        self._progress_fd = progress_fd
        os.set_blocking(progress_fd, False)
        os.set_blocking(wake_fd, False)
        self._event = threading.Event()
        self._gone = threading.Event()
        self._pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(producer)
        # Checked after the pidfd is open: if the parent is still the
        # producer, the pidfd is the producer's (not a reused pid's). Its
        # parent pid tells only where the producer is its parent: under an
        # interpreter's stand-in that runs it as a child (not exec'd), the
        # stand-in is: the pidfd tells then (none: taken for dead, as ever).
        self._producer = producer
        if self._pidfd is None and os.getppid() != producer:
            self._mark_gone()
        self._thread = start_daemon(self._watch, "primeruns-uplink-wake")

    @property
    def producer_gone(self) -> bool:
        return self._gone.is_set()

    @property
    def on_hurry(self) -> Callable[[], None] | None:
        return self._on_hurry

    @on_hurry.setter
    def on_hurry(self, callback: Callable[[], None] | None) -> None:
        with self._hurry_lock:
            self._on_hurry = callback
            pending = self._hurry_pending and callback is not None
            if pending:
                self._hurry_pending = False
        if pending and callback is not None:
            with contextlib.suppress(Exception):
                callback()

    def _hurried(self) -> None:
        with self._hurry_lock:
            callback = self._on_hurry
            if callback is None:
                self._hurry_pending = True
        if callback is not None:
            with contextlib.suppress(Exception):
                callback()

    def _mark_gone(self) -> None:
        if self._on_gone is not None and not self._gone.is_set():
            with contextlib.suppress(Exception):
                self._on_gone()
        self._gone.set()
        self._event.set()
        with contextlib.suppress(Exception):
            self._journal.wake_all()

    def _watch(self) -> None:
        # poll, not select: the descriptors keep the producer's numbers, which
        # may be over select's 1024.
        poller = select.poll()
        for fd in (self._wake_fd, self._pidfd):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        # Without a pidfd, the parent pid is looked at now and then: the wake
        # pipe's end of file comes late if a forked child holds its write end.
        tick = None if self._pidfd is not None else 1000
        while not self._gone.is_set():
            try:
                ready = {fd for fd, _ in poller.poll(tick)}
            except (OSError, ValueError):
                self._mark_gone()
                return
            if self._pidfd is not None and self._pidfd in ready:
                self._mark_gone()
                return
            if self._wake_fd in ready:
                data = self._read_wake()
                if data is None:
                    continue  # read by nobody else; a spurious readiness
                if data and HURRY not in data:
                    data = self._until_quiet(data)
                if data and HURRY not in data:
                    data = self._until_due(data)
                if not data:
                    self._mark_gone()
                    return
                hurry = HURRY in data
                if hurry:  # at once: someone waits
                    self._hurried()
                    self._pass_on(hurry=True)
                settled = self._settle()
                if settled is None:
                    self._mark_gone()
                    return
                if settled or not hurry:
                    self._pass_on(hurry=False)
            if tick is not None and os.getppid() != self._producer:
                self._mark_gone()
                return

    def _pass_on(self, *, hurry: bool) -> None:
        """Wake the shippers, the mover and the finish's look."""
        self._woken_at = time.monotonic()
        self._event.set()
        with contextlib.suppress(Exception):
            self._journal.wake_all(hurry=hurry)

    def _read_wake(self) -> bytes | None:
        """What the wake pipe holds: b"" at its end of file (the producer is
        gone), None when it is empty."""
        try:
            data = os.read(self._wake_fd, 65536)
        except BlockingIOError:
            return None
        except OSError:
            return b""
        if WAKE in data:
            self._wake_read_at = time.monotonic()
        return data

    def _settle(self) -> bool | None:
        """Wait until ``SETTLE_S`` has passed since a wake-up was last read,
        reading nothing meanwhile (the pidfd alone is watched): the
        producer wrote none for its appends within ``WAKE_GAP_S`` of that
        one (``UplinkProcess.wake``), and they are passed on with it, so no
        sooner than this. Whether it waited; None once the producer is gone.
        A burst that ended quiet waited that out already (``QUIET_S``); one
        cut at ``LATE_S`` or by the linger's end (or a hurry) waits up to
        that. A hurry that comes meanwhile is read after it."""
        left = self._wake_read_at + SETTLE_S - time.monotonic()
        if left <= 0:
            return False
        if self._pidfd is None:
            pause(left)  # (its death shows as the pipe's end of file, read next)
        elif wait_readable(self._pidfd, left):
            return None
        return True

    def _until_quiet(self, data: bytes) -> bytes:
        """Wait out the producer's burst of appends: until no wake-up came for
        ``QUIET_S`` (or ``LATE_S`` passed, or it hurries); the wake-ups read,
        b"" once it is gone. Only its pidfd is watched meanwhile, so the
        burst's own wake-ups do not wake this thread."""
        late = time.monotonic() + LATE_S
        while HURRY not in data:
            left = late - time.monotonic()
            if left <= 0:
                break
            if self._pidfd is None:
                # The quiet period itself (no pidfd to watch meanwhile: its
                # death shows as the wake pipe's end of file, read just below).
                pause(min(QUIET_S, left))
            elif wait_readable(self._pidfd, min(QUIET_S, left)):
                return b""  # the pidfd: the producer is gone
            more = self._read_wake()
            if more is None:
                break  # quiet
            if not more:
                return b""
            data += more
        return data

    def _until_due(self, data: bytes) -> bytes:
        """Wait, past a burst, until ``every_s`` has passed since the last
        wake-up passed on (or it hurries); the wake-ups read, b"" once the
        producer is gone.

        Each wake-up costs every shipper a look at the journal (a read
        transaction, the spool's segments listed), the mover a step and
        ``Uplink.serve`` a read for the finish: a training loop logging a
        step every 20 ms woke them 50 times a second, though a small batch
        waits out the linger anyway. So bursts closer together than that
        are passed on as one; a flush or finish (``HURRY``) is not held."""
        due = self._woken_at + self._every_s
        poller = select.poll()
        for fd in (self._wake_fd, self._pidfd):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        while HURRY not in data:
            left = due - time.monotonic()
            if left <= 0:
                break
            try:
                ready = {fd for fd, _ in poller.poll(bounded(left) * 1000.0)}
            except (OSError, ValueError):
                return b""
            if self._pidfd is not None and self._pidfd in ready:
                return b""  # the producer is gone
            if self._wake_fd in ready:
                more = self._read_wake()
                if more is not None and not more:
                    return b""  # the wake pipe's end of file: gone
                data += more or b""
        return data

    def wait(self, timeout: float | None) -> None:
        self._event.wait(timeout)
        self._event.clear()

    def notify(self) -> None:
        """Tell the producer something changed; never blocks."""
        try:
            os.write(self._progress_fd, b"\0")
        except BlockingIOError:
            pass  # full: the producer has wake-ups waiting already
        except OSError:
            pass  # the producer is gone


def _claim_token() -> int:
    """The read end of a pipe holding one byte, its write end closed: whoever
    reads the byte ships (a read of an empty pipe then returns b"")."""
    claim_r, claim_w = os.pipe()
    try:
        os.write(claim_w, b"\0")
    except OSError:
        os.close(claim_r)
        raise
    finally:
        os.close(claim_w)
    os.set_blocking(claim_r, False)
    return claim_r


def take_claim(fd: int | None) -> bool:
    """In the uplink process: whether it ships (it read the claim's byte).
    No claim descriptor (an older producer's way of starting it): it ships."""
    if fd is None:
        return True
    try:
        return bool(os.read(fd, 1))
    except OSError:
        # Unreadable here is not proof that the producer cannot read it:
        # standing down is the safe side (the producer ships from threads
        # once it finds this process gone, ``Supervisor.replace_if_dead``).
        return False
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def kill_uplink(pid: int) -> None:
    """SIGKILL an uplink process with its process group, which it leads
    (``start_new_session``): an interpreter's stand-in that runs the
    interpreter as its child (not exec'd) is ``pid``, the uplink its child."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def job_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (SIGSTOP, SIGTSTP): the
    state ``T`` of ``/proc/<pid>/stat``. Not a tracer's stop (``t``: someone
    is debugging it), and False where there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = stat.rsplit(b")", 1)[-1].split()
    return bool(fields) and fields[0] == b"T"


def await_go(wake_fd: int, progress_fd: int, producer: int) -> bool:
    """In an uplink process started with ``--await-go``: report that it is
    ready, then wait until its producer says go, closes its end, or dies
    (threads that shipped in it are gone with it). The claim decides next.
    Whether a hurry came with the go (read here, so the link will not see it)."""
    with contextlib.suppress(OSError):
        os.write(progress_fd, b"\0")
    return wait_for_word(wake_fd, producer, (GO,))[1]


def open_uplink_log(journal_path: Path) -> int:
    """A descriptor appending to the uplink's log beside the journal (0600);
    ``subprocess.DEVNULL`` where it cannot be opened (no inodes, a directory
    deleted): the uplink then logs nowhere rather than into the producer's
    pipes.

    Only a regular file of our own is written: a link planted in its place
    is not followed (it could point the log at any file of the user's), and
    a named pipe is neither waited on (no reader: the open fails at once)
    nor written into."""
    try:
        fd = os.open(
            journal_path / UPLINK_LOG_NAME,
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
            0o600,
        )
    except OSError:
        return subprocess.DEVNULL
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.set_blocking(fd, True)
            return fd
    except OSError:
        pass
    os.close(fd)
    return subprocess.DEVNULL


def settings_from_handover(data: dict[str, Any]) -> Settings:
    values = dict(data)
    values["sources"] = dict(values.get("sources") or {})
    values["journal_chosen"] = tuple(values.get("journal_chosen") or ())  # (JSON: a list)
    return Settings(**values)
