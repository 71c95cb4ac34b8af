"""The switch interval an evaluation lowers while its threads ship is given
back as it was, and a user's own setting is never overwritten."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from primeruns.ship.switch_interval import SHIPPING_INTERVAL_S, ShortSwitch


@pytest.fixture(autouse=True)
def _interval_kept() -> Iterator[None]:
    original = sys.getswitchinterval()
    yield
    sys.setswitchinterval(original)


def test_lowered_then_given_back_once() -> None:
    sys.setswitchinterval(0.005)
    before = sys.getswitchinterval()
    switch = ShortSwitch()
    switch.lower()
    switch.lower()  # (once: the second would save the short one as the user's)
    assert sys.getswitchinterval() == pytest.approx(SHIPPING_INTERVAL_S)
    switch.restore()
    assert sys.getswitchinterval() == before
    sys.setswitchinterval(0.003)
    switch.restore()  # given back already: nothing more
    assert sys.getswitchinterval() == pytest.approx(0.003)


def test_an_interval_the_user_set_meanwhile_is_kept() -> None:
    sys.setswitchinterval(0.005)
    switch = ShortSwitch()
    switch.lower()
    sys.setswitchinterval(0.02)  # the user's, while the threads ship
    switch.restore()
    assert sys.getswitchinterval() == pytest.approx(0.02)


def test_a_user_interval_as_short_already_is_left_alone() -> None:
    sys.setswitchinterval(0.0001)
    before = sys.getswitchinterval()
    switch = ShortSwitch()
    switch.lower()
    assert sys.getswitchinterval() == before
    sys.setswitchinterval(0.004)
    switch.restore()
    assert sys.getswitchinterval() == pytest.approx(0.004)


def test_given_back_when_the_threads_first_uplink_fails_to_start_its_watcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An uplink that lowered the interval and then failed to start (no
    thread to be had: the interpreter's shutdown, or an interrupt there)
    never gave it back: nothing would, the run's uplink was never made.
    Nor the journal's moving, deferred while the threads ship."""
    from primeruns.ship import startup

    class _Standby:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

    def no_thread(*args: object, **kwargs: object) -> None:
        raise RuntimeError("can't start new thread")

    class _Journal:
        deferred = False

        def defer_moving(self, deferred: bool) -> None:
            self.deferred = deferred

    monkeypatch.setattr(startup, "UplinkProcess", _Standby)
    monkeypatch.setattr(startup, "UplinkThreads", _Standby)
    monkeypatch.setattr(startup, "start_daemon", no_thread)
    sys.setswitchinterval(0.005)
    before = sys.getswitchinterval()
    journal = _Journal()
    with pytest.raises(RuntimeError):
        startup.ThreadsFirst(journal, object())  # type: ignore[arg-type]
    assert sys.getswitchinterval() == before
    assert not journal.deferred  # the background's ticks move again


def test_several_runs_at_once_share_it_until_the_last_gives_it_back() -> None:
    """Two evaluations in one process: the first to hand over must not give
    the interval back while the other's threads still ship."""
    sys.setswitchinterval(0.005)
    before = sys.getswitchinterval()
    first, second = ShortSwitch(), ShortSwitch()
    first.lower()
    second.lower()
    first.restore()
    assert sys.getswitchinterval() == pytest.approx(SHIPPING_INTERVAL_S)
    first.restore()  # (twice: counted once)
    assert sys.getswitchinterval() == pytest.approx(SHIPPING_INTERVAL_S)
    second.restore()
    assert sys.getswitchinterval() == before
