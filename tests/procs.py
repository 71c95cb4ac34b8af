"""Child processes the tests start, reaped whatever the test's outcome.

A test that fails between starting a child and waiting for it would otherwise
leave the child running past the test (and a ``ResourceWarning`` from
``Popen.__del__``, which pytest turns into an error somewhere unrelated). Every
child is started through :func:`start`; the autouse fixture in ``conftest.py``
calls :func:`reap_all` after each test: a child still running is killed, every
child is waited for and its pipes are closed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import CodeType
from typing import Any

_started: list[subprocess.Popen[Any]] = []


def start(cmd: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(cmd, **kwargs)``, registered for reaping."""
    proc: subprocess.Popen[Any] = subprocess.Popen(cmd, **kwargs)
    _started.append(proc)
    return proc


def reap_all() -> None:
    """Kill what still runs, wait for every child, close every pipe."""
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _main_thread_state(pid: int) -> tuple[str, int]:
    """The state letter of ``pid``'s main thread and its context switches so far."""
    fields = dict(
        line.split(":", 1)
        for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines()
        if ":" in line
    )
    switches = int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])
    return fields["State"].split()[0], switches


def wait_until_asleep(pid: int, timeout: float = 60.0) -> None:
    """Return once ``pid``'s main thread slept through a whole look (0.1 s)
    without waking: it is inside its long wait, not on its way in.

    CPython only flags a signal for the main thread; a blocking wait (a lock's
    acquire, a sleep, ``pause()``) is cut short by one that lands inside it,
    but one that lands between the interpreter's last check and the wait's
    system call is handled when the wait ends (a trial hung 120 s so, about 1
    in 40 on a loaded host). A test of a handler that must run at once while
    the main thread waits signals it once it is in there."""
    deadline = time.monotonic() + timeout
    before = _main_thread_state(pid)
    while time.monotonic() < deadline:
        time.sleep(0.1)  # the look itself: a wait ending in it shows as a switch
        now = _main_thread_state(pid)
        if now[0] == "S" and now == before:
            return
        before = now
    raise AssertionError(f"process {pid}'s main thread never settled in a wait in {timeout} s")


def signal_once_waiting_in(code: CodeType, settle: float = 0.5) -> threading.Thread:
    """Start a daemon thread of this process that, once the main thread's
    stack holds a frame of ``code`` (and ``settle`` seconds more, so that a
    wait taken whole is well inside its system call), takes a SIGTERM itself.

    The thread does not block SIGTERM, so CPython's C handler only flags it:
    the Python handler waits for the main thread's next check, and nothing
    but a signal of its own cuts the main thread's wait. That is the state a
    signal landing on a wait's way in (or one the kernel hands to another
    thread) leaves, made every time; a wait that ends on it must be one in
    slices that checks for handlers between them."""
    main = threading.main_thread().ident
    assert main is not None

    def waiting() -> bool:
        frame = sys._current_frames().get(main)
        while frame is not None:
            if frame.f_code is code:
                return True
            frame = frame.f_back
        return False

    def take_the_signal() -> None:
        while not waiting():
            time.sleep(0.01)
        time.sleep(settle)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    thread = threading.Thread(target=take_the_signal, daemon=True)
    thread.start()
    return thread


def uplink_journal(pid: int) -> bytes | None:
    """The journal process ``pid`` ships, if it is an uplink process (on
    standby or not) and alive (a zombie, killed and not reaped, is gone);
    None otherwise (b"" for one whose journal its command line does not say)."""
    proc = Path(f"/proc/{pid}")
    try:
        args = (proc / "cmdline").read_bytes().split(b"\0")
        state = (proc / "stat").read_text().rsplit(") ", 1)[-1][:1]
    except OSError:
        return None
    at = args.index(b"--journal") if b"--journal" in args[:-1] else len(args)
    if state == "Z" or not any(b"standby.py" in a or b"uplink_main" in a for a in args[:at]):
        return None
    return args[at + 1] if at < len(args) else b""


def kill_uplinks_under(root: Path) -> None:
    """SIGKILL every uplink process shipping a journal under ``root``: one a
    producer left shipping by design (it exited without finish, was killed)
    ships on, or retries a platform stopped with its test, for minutes after
    the test, on the cores of the tests and benchmarks after it."""
    from primeruns.ship.link import kill_uplink

    prefix = os.fsencode(root) + b"/"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (uplink_journal(int(entry.name)) or b"").startswith(prefix):
            kill_uplink(int(entry.name))


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's), from /proc."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def kill_job(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL a producer together with its children (its uplink), as a
    scheduler or an out-of-memory kill of the whole job does. Stopped first,
    so it cannot start a child between the listing and the kill."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGSTOP)
        for child in children(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGKILL)


def held_in_forked_child(fd: int, lock_file: Path) -> bool:
    """Fork here; whether the child holds descriptor ``fd`` of ``lock_file``."""
    ours, theirs = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: says whether it has a copy, and ends at once
        try:
            held = os.fstat(fd).st_ino == os.stat(lock_file).st_ino
        except OSError:
            held = False
        os.write(theirs, b"1" if held else b"0")
        os._exit(0)
    os.close(theirs)
    try:
        return os.read(ours, 1) == b"1"
    finally:
        os.close(ours)
        os.waitpid(pid, 0)
