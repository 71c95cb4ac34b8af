"""``serve``'s accept that runs out of descriptors is said in a line, not a traceback a try.

asyncio stops accepting for a second when an accept fails for want of
descriptors, and logged each failed try with a traceback: a neighbour
holding connections filled the log. ``descriptors.AcceptErrors`` is the
server's event loop's exception handler (the flood itself, over loopback,
is in ``test_slow_clients.py``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Iterator

import pytest

from primeruns.local import descriptors
from primeruns.local.descriptors import RESERVED, AcceptErrors
from primeruns.local.settings import ConnectionLimits

_OUT_OF_FILES = {
    "message": "socket.accept() out of system resource",
    "exception": OSError(errno.EMFILE, "Too many open files"),
}


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_accepts_out_of_descriptors_are_said_once_a_minute_in_one_line(
    loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(loop, "time", lambda: now[0])
    handler = AcceptErrors()
    for _ in range(30):  # asyncio's tries, a second apart
        handler(loop, _OUT_OF_FILES)
        now[0] += 1.0
    handler(loop, _OUT_OF_FILES)
    now[0] += 60.0
    handler(loop, _OUT_OF_FILES)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "primeruns serve: cannot accept connections: [Errno 24] Too many open files; "
        "trying again every second",
        "primeruns serve: cannot accept connections: [Errno 24] Too many open files "
        "(30 more times since); trying again every second",
    ]
    assert caplog.records == []


def test_other_errors_of_the_loop_are_logged_as_before(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        AcceptErrors()(loop, {"message": "Task exception was never retrieved"})
    assert [r.getMessage() for r in caplog.records] == ["Task exception was never retrieved"]


@pytest.mark.parametrize("asked", [20_000, 10**20])
def test_an_unlimited_hard_limit_the_system_caps_lowers_the_bound_to_its_own(
    monkeypatch: pytest.MonkeyPatch, asked: int
) -> None:
    """macOS: a soft limit of 256 under an unlimited hard one, and no soft
    limit past the system's own per process (10,240 here) taken. The bound
    is lowered to what the most it takes holds, not refused for the 256
    (``ulimit -Hn`` told to rise where it was already unlimited), and a
    bound too large to ask of the system at all is lowered the same way."""
    import resource

    most = 10_240
    limit = [256]

    def setrlimit(which: int, value: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        if value[0] > 2**63 - 1:
            raise OverflowError("Python int too large to convert to C long")
        if value[0] > most:
            raise ValueError("current limit exceeds maximum limit")
        limit[0] = value[0]

    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit[0], resource.RLIM_INFINITY))
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    limits, said = descriptors.fit(ConnectionLimits(max_connections=asked))
    assert limit[0] == most
    assert limits.max_connections == most - RESERVED
    assert said is not None and f"lowered from {asked} to {most - RESERVED}" in said
