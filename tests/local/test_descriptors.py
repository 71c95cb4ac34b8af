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

from primeruns.local.descriptors import AcceptErrors

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
