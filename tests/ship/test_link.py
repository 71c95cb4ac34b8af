"""The two pipes between a producer and its uplink: wake-ups and progress.

Both sides wait without timers, so what a user depends on here is that no
wake-up is lost: ``flush()`` from several threads each sees the uplink's
report that came after it looked; the uplink acts on a producer that never
goes quiet (a burst's wake-ups are coalesced, not postponed for ever) and at
once on a hurry (``flush()``, ``finish()``); the producer's death ends its wait.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import select
import subprocess
import termios
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from primeruns.journal import Journal
from primeruns.settings import resolve_settings
from primeruns.ship import link as link_mod
from primeruns.ship.link import HURRY, WAKE, PipeProducerLink, ProgressReader


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """A pipe; a test closes the write end itself (the producer's), the
    read end is closed here."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    yield r, w
    os.close(r)


def test_every_waiter_sees_a_report_made_after_its_mark(pipe: tuple[int, int]) -> None:
    r, w = pipe
    reader = ProgressReader(r)
    marks = [reader.mark() for _ in range(3)]
    gone: list[bool] = []
    waiters = [threading.Thread(target=lambda m=m: gone.append(reader.wait(m, 600))) for m in marks]
    for t in waiters:
        t.start()
    os.write(w, b"\0")  # one report: every waiter whose mark came before it returns
    for t in waiters:
        t.join()
    assert gone == [False, False, False]
    # A report made between a waiter's mark and its wait is not missed either.
    mark = reader.mark()
    os.write(w, b"\0")
    assert reader.wait(mark, 600) is False
    # The uplink's exit (the pipe's end) is news once, then says it is gone.
    os.close(w)
    mark = reader.mark()
    assert reader.wait(mark, 600) is True


def test_a_waiter_with_a_short_timeout_is_not_held_up_by_one_with_a_long_one(
    pipe: tuple[int, int],
) -> None:
    # flush(timeout=0.2) in one thread beside flush(timeout=None) in another:
    # the short one returns at its timeout (held behind the other's wait on
    # the pipe, it returned only when that one did: here, never).
    r, w = pipe
    reader = ProgressReader(r)
    long_wait = threading.Thread(target=reader.wait, args=(reader.mark(), 600))
    long_wait.start()
    while not reader._polling:  # the long one is on the pipe (a state it reaches)
        threading.Event().wait(0.001)
    mark = reader.mark()  # what the short one's flush does first
    assert reader.wait(mark, 0.2) is False
    assert long_wait.is_alive()
    os.write(w, b"\0")
    long_wait.join()
    os.close(w)


def test_closing_while_a_thread_waits_does_not_block(pipe: tuple[int, int]) -> None:
    # The run closes (a SIGTERM's finish, on any thread) while a flush waits.
    r, w = pipe
    reader = ProgressReader(os.dup(r))
    mark = reader.mark()
    done: list[bool] = []
    waiting = threading.Thread(target=lambda: done.append(reader.wait(mark, 600)))
    waiting.start()
    while not reader._polling:  # on the pipe (a state, not a timing: it gets there)
        threading.Event().wait(0.001)
    reader.close()  # returns with the waiter still on the pipe
    os.write(w, b"\0")  # what wakes it in the end (in the SDK: the uplink's exit)
    waiting.join()
    assert done == [False]
    os.close(w)


def _link(
    tmp_path: Path, wake_r: int, *, every_s: float = 0.0, journal: Journal | None = None
) -> tuple[Journal, PipeProducerLink, int]:
    journal = journal or Journal.create(tmp_path / "runs")
    progress_r, progress_w = os.pipe()
    # The uplink's parent is its producer: here, this process's parent.
    held = {"every_s": every_s} if every_s else {}
    link = PipeProducerLink(journal, wake_r, progress_w, producer=os.getppid(), **held)
    os.close(progress_r)
    return journal, link, progress_w


def _end(journal: Journal, link: PipeProducerLink, wake_w: int | None, progress_w: int) -> None:
    """The producer goes (its end of the wake pipe closes): the link's
    thread ends before its descriptors do."""
    if wake_w is not None:
        os.close(wake_w)
    link._thread.join()
    os.close(progress_w)
    journal.close()


def test_a_producer_that_never_goes_quiet_still_wakes_its_uplink(
    tmp_path: Path, pipe: tuple[int, int]
) -> None:
    wake_r, wake_w = pipe
    journal, link, progress_w = _link(tmp_path, wake_r)
    stop = threading.Event()
    sent = [0]

    def appends_without_pause() -> None:
        while not stop.is_set() and sent[0] < 10_000_000:
            with contextlib.suppress(BlockingIOError):
                os.write(wake_w, WAKE)
            sent[0] += 1

    producer = threading.Thread(target=appends_without_pause)
    producer.start()
    link.wait(None)  # woken while the burst goes on (at most LATE_S after it began)
    woken_while_busy = producer.is_alive() and not stop.is_set()
    stop.set()
    producer.join()
    assert woken_while_busy
    assert not link.producer_gone
    _end(journal, link, wake_w, progress_w)


def test_a_hurry_is_acted_on_without_waiting_for_quiet(
    tmp_path: Path, pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Were the hurry coalesced like a wake-up, this would wait out QUIET_S
    # and LATE_S of an hour each: the test would end by pytest's timeout.
    monkeypatch.setattr(link_mod, "QUIET_S", 3600.0)
    monkeypatch.setattr(link_mod, "LATE_S", 3600.0)
    wake_r, wake_w = pipe
    journal, link, progress_w = _link(tmp_path, wake_r)
    hurried = threading.Event()
    link.on_hurry = hurried.set
    os.write(wake_w, HURRY)
    link.wait(None)
    assert hurried.is_set()
    monkeypatch.setattr(link_mod, "QUIET_S", 0.001)
    _end(journal, link, wake_w, progress_w)


class _CountedWakes(Journal):
    """A journal counting the wake-ups its uplink's link passes on."""

    woken = 0
    changed = threading.Condition()

    def wake_all(self, *, hurry: bool = False) -> None:
        with self.changed:
            self.woken += 1
            self.changed.notify_all()
        super().wake_all(hurry=hurry)

    def until_woken(self, times: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.woken >= times, timeout=60)


def _drained(fd: int) -> None:
    """Until the link's thread has read everything written to the wake pipe."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while poller.poll(0):
        threading.Event().wait(0.001)


def test_bursts_closer_together_than_the_linger_wake_the_shippers_once(
    tmp_path: Path, pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A training loop logging a step every 20 ms woke every shipper, the
    # mover and the finish's look 50 times a second, though a small batch
    # waits out the linger anyway: the uplink's CPU per step was mostly
    # those looks. Bursts within ``every_s`` of the last wake-up are passed
    # on as one, at its end; a hurry (flush, finish) is not held back.
    # (The wake-up owed SETTLE_S after the last one read, past a hurry, is
    # the next test's.)
    monkeypatch.setattr(link_mod, "SETTLE_S", 0.0)
    wake_r, wake_w = pipe
    journal = _CountedWakes.create(tmp_path / "runs")
    assert isinstance(journal, _CountedWakes)
    _, link, progress_w = _link(tmp_path, wake_r, every_s=3600.0, journal=journal)
    hurried = threading.Event()
    link.on_hurry = hurried.set
    os.write(wake_w, WAKE)  # the first burst since the start: passed on at once
    journal.until_woken(1)
    for _ in range(3):  # three more steps' bursts, each read by the link's thread
        os.write(wake_w, WAKE)
        _drained(wake_r)
    os.write(wake_w, HURRY)  # a flush: at once, and the bursts held go with it
    journal.until_woken(2)
    assert hurried.is_set()
    assert journal.woken == 2
    os.write(wake_w, WAKE)  # held again; the producer's end comes meanwhile
    _drained(wake_r)
    os.close(wake_w)
    while not link.producer_gone:
        link.wait(None)  # not held for every_s: the end of file ends the wait
    _end(journal, link, None, progress_w)


def test_the_producers_end_of_the_wake_pipe_after_a_burst_ends_the_uplinks_wait(
    tmp_path: Path, pipe: tuple[int, int]
) -> None:
    wake_r, wake_w = pipe
    journal, link, progress_w = _link(tmp_path, wake_r)
    os.write(wake_w, WAKE * 3)  # a burst...
    os.close(wake_w)  # ...and the producer is gone (its pidfd says so at once)
    while not link.producer_gone:
        link.wait(None)  # each wake-up, then the end of file: never a hang
    _end(journal, link, None, progress_w)


def test_the_uplink_log_is_written_only_into_a_regular_file_of_its_own(tmp_path: Path) -> None:
    """A link planted at ``uplink.log`` would point the uplink's log lines at
    any file of the user's, and a named pipe would hold its open (or take its
    lines): either is refused, and the uplink logs nowhere instead."""
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / link_mod.UPLINK_LOG_NAME).symlink_to(victim)
    assert link_mod.open_uplink_log(run_dir) == subprocess.DEVNULL
    assert victim.read_text() == "kept\n"

    piped = tmp_path / "piped"
    piped.mkdir()
    os.mkfifo(piped / link_mod.UPLINK_LOG_NAME)
    assert link_mod.open_uplink_log(piped) == subprocess.DEVNULL  # no reader: no wait

    reader = os.open(piped / link_mod.UPLINK_LOG_NAME, os.O_RDONLY | os.O_NONBLOCK)
    try:  # with a reader the open succeeds, and is still refused: not a file
        assert link_mod.open_uplink_log(piped) == subprocess.DEVNULL
    finally:
        os.close(reader)

    own = tmp_path / "own"
    own.mkdir()
    fd = link_mod.open_uplink_log(own)
    try:
        os.write(fd, b"a line\n")
        assert os.get_blocking(fd)
    finally:
        os.close(fd)
    assert (own / link_mod.UPLINK_LOG_NAME).read_bytes() == b"a line\n"
    assert (own / link_mod.UPLINK_LOG_NAME).stat().st_mode & 0o777 == 0o600


class _Clock:
    """``time`` for ``ship.link`` on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_producer_that_logs_without_pause_writes_one_wake_up_a_gap_at_most(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each log call wrote a byte: a system call on every log_metrics (~1 us
    # of its ~17) that woke the uplink's thread as often. Appends within
    # WAKE_GAP_S of a byte are passed on with it (the next test).
    clock = _Clock()
    monkeypatch.setattr(link_mod, "time", clock)
    wake_r, wake_w = pipe
    uplink = object.__new__(link_mod.UplinkProcess)  # its producer's end alone
    uplink._wake_w, uplink._closed, uplink._woke_at = wake_w, False, float("-inf")
    uplink._lock, uplink._writing = threading.RLock(), 0
    for _ in range(100):
        uplink.wake()
    assert os.read(wake_r, 4096) == WAKE
    clock.now += 1.5 * link_mod.WAKE_GAP_S
    for _ in range(100):
        uplink.wake()
    assert os.read(wake_r, 4096) == WAKE
    os.close(wake_w)


_WITHIN_GAP_S = 0.0009  # an append this long after its wake-up writes none (WAKE_GAP_S: 1 ms)


def test_an_append_covered_by_the_wake_up_before_it_is_passed_on_after_it_was_made(
    tmp_path: Path, pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A producer that never goes quiet writes a wake-up while the link
    # waits out its burst, then appends within WAKE_GAP_S of it, with no
    # byte of its own. Passed on as LATE_S cut the burst, at its last read,
    # the shippers looked before that append, and nothing woke them for it.
    clock = _Clock()
    monkeypatch.setattr(link_mod, "time", clock)
    wake_r, wake_w = pipe
    written: list[float] = []  # when each byte was written
    producing = threading.Lock()  # held while the producer may write
    stopped = False

    def waits(fd: int, timeout: float) -> bool:  # the link's waits on the pidfd
        clock.now += timeout
        with producing:
            if not stopped:
                os.write(wake_w, WAKE)
                written.append(clock.now)
        return False

    monkeypatch.setattr(link_mod, "wait_readable", waits)
    passed: list[tuple[float, float]] = []  # (when, the append its last byte read covers)

    class _Watched(Journal):
        def wake_all(self, *, hurry: bool = False) -> None:
            with producing:  # the last byte the link read, and its append
                last_read = written[len(written) - _unread(wake_r) - 1]
            passed.append((clock.now, last_read + _WITHIN_GAP_S))
            super().wake_all(hurry=hurry)

    journal = _Watched.create(tmp_path / "runs")
    _, link, progress_w = _link(tmp_path, wake_r, journal=journal)
    written.append(clock.now)
    os.write(wake_w, WAKE)
    while not passed:  # (the link sets its event first, then wakes the journal)
        link.wait(0.01)
    with producing:
        stopped = True
    when, covered = passed[0]
    assert when >= covered
    _end(journal, link, wake_w, progress_w)


def _unread(fd: int) -> int:
    """How many bytes a pipe holds."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count, True)
    return count[0]


class _WatchedLock:
    """A lock that says when a thread has to wait for it (``waiting``)."""

    def __init__(self, inner: Any, waiting: threading.Event) -> None:
        self._inner = inner
        self._waiting = waiting

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._inner.acquire(blocking=False):
            return True
        self._waiting.set()
        return bool(self._inner.acquire(blocking, timeout))

    def release(self) -> None:
        self._inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_wake_up_racing_a_release_never_writes_into_a_descriptor_opened_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wake()`` (every log call) and ``hurry()`` wrote to the wake pipe
    without the lock ``release()`` takes: a release on another thread (a
    restart of the uplink, the finish) between a write's look and the write
    closed the pipe, the next open took its number, and the byte went into
    that file or socket. Here the write is held at the pipe's door until the
    release either returned or waits for it; the files opened then stay
    empty."""
    journal = Journal.create(tmp_path / "runs")
    settings = resolve_settings(
        api_key="a-key-of-the-test", base_url="http://127.0.0.1:9", environ={}, config={}
    )
    process = link_mod.UplinkProcess(journal, settings, [], await_go=True)
    opened: list[int] = []
    try:
        assert process.claim_back()  # stopped on standby: it never ships; the pipe stays open
        wake_fd = process._wake_w
        at_door, let_write, decided = threading.Event(), threading.Event(), threading.Event()
        real_write = os.write

        def write(fd: int, data: bytes) -> int:
            if fd == wake_fd and not at_door.is_set():
                at_door.set()
                let_write.wait(60)
            return real_write(fd, data)

        monkeypatch.setattr(link_mod, "os", SimpleNamespace(**{**vars(os), "write": write}))
        process._lock = _WatchedLock(process._lock, decided)  # type: ignore[assignment]

        def release() -> None:
            process.release()
            decided.set()

        waker = threading.Thread(target=process.wake)
        waker.start()
        assert at_door.wait(60)
        releaser = threading.Thread(target=release)
        releaser.start()
        assert decided.wait(60)  # released, or waiting for the write
        # Whatever opens next takes the lowest free number: the pipe's, if it was closed.
        while not opened or opened[-1] < wake_fd:
            opened.append(os.open(tmp_path / f"victim-{len(opened)}", os.O_CREAT | os.O_RDWR))
        let_write.set()
        waker.join(60)
        releaser.join(60)
        assert not waker.is_alive() and not releaser.is_alive()
        written = {fd: os.fstat(fd).st_size for fd in opened}
        assert not any(written.values()), written
        assert process._closed
    finally:
        for fd in opened:
            os.close(fd)
        process.release()
        journal.unshare_lock()
        journal.close()


def test_a_finish_nested_in_a_wake_up_leaves_the_pipe_open_for_the_write_it_interrupted(
    tmp_path: Path, pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM landing in ``wake()`` after it read the pipe's descriptor
    runs the finish in the same thread: its ``hurry()`` writes (a nested
    ``_send``, let in by the reentrant lock) and its ``release()`` follows.
    The nested write set the flag of a write under way back to False, so the
    release closed the pipe under the interrupted write, and the next open
    took its number: the wake-up's byte went into that file. Nested by hand
    here, as the signal handler would."""
    wake_r, wake_w = pipe
    uplink = object.__new__(link_mod.UplinkProcess)  # its producer's end alone
    uplink._wake_w, uplink._closed, uplink._woke_at = wake_w, False, float("-inf")
    uplink._lock, uplink._writing = threading.RLock(), 0
    uplink._proc = SimpleNamespace(poll=lambda: 0)  # exited: nothing to reap
    uplink._progress = SimpleNamespace(close=lambda: None)
    uplink._pidfd, uplink._claim = None, -1
    real_write = os.write
    opened: list[int] = []

    def write(fd: int, data: bytes) -> int:
        if data == WAKE and not opened:  # the wake-up, its descriptor read: the signal
            uplink.hurry()
            uplink.release()
            opened.append(os.open(tmp_path / "victim", os.O_CREAT | os.O_RDWR))
        return real_write(fd, data)

    monkeypatch.setattr(link_mod, "os", SimpleNamespace(**{**vars(os), "write": write}))
    try:
        uplink.wake()
        assert os.fstat(opened[0]).st_size == 0  # nothing written into the file opened
        assert os.read(wake_r, 16) == HURRY + WAKE
        assert uplink._wake_w == -1  # closed once the interrupted write was done
    finally:
        for fd in opened:
            os.close(fd)
        if uplink._wake_w >= 0:
            os.close(uplink._wake_w)
