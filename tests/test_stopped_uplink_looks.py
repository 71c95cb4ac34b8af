"""When ``finish()`` takes an uplink process for one stopped (SIGSTOP) and
kills it: seen stopped at looks ``_STOPPED_FOR_S`` apart, in this process's
own time. A job suspended whole stops the producer too; resumed one process
at a time, the producer first, its first look after the resume came while
the uplink was still stopped, and the hour the job was suspended counted as
the uplink's stop: a healthy uplink was killed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import primeruns.supervisor as supervisor


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> Any:
    clock = Clock()
    killed: list[int] = []
    monkeypatch.setattr(supervisor.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(supervisor, "job_stopped", lambda pid: True)
    monkeypatch.setattr(supervisor, "kill_uplink", killed.append)
    owner = SimpleNamespace(
        _replaced=False,
        binding=lambda: None,
        _journal=SimpleNamespace(local_id="run"),
        _kind="eval",
    )
    uplink = SimpleNamespace(pid=4242)

    def look_at(times: list[float]) -> list[int]:
        seen = None
        for at in times:
            clock.now = at
            seen = supervisor.Supervisor._kill_if_stopped(owner, uplink, seen)  # type: ignore[arg-type]
        return killed

    return look_at


def test_an_uplink_stopped_through_looks_a_second_apart_is_killed(looks: Any) -> None:
    assert looks([100.0, 101.0, 102.0, 103.0]) == [4242]


def test_the_producers_own_stop_does_not_count_as_the_uplinks(looks: Any) -> None:
    # One look, then the whole job is stopped for an hour; the producer's
    # first look once resumed still sees the uplink stopped (its SIGCONT
    # comes next): not three seconds of it, nor a second after.
    assert looks([100.0, 3700.0, 3701.0]) == []


def test_once_resumed_the_uplink_stopped_on_is_killed(looks: Any) -> None:
    assert looks([100.0, 3700.0, 3701.0, 3702.0, 3703.0]) == [4242]
