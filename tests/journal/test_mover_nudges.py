"""A producer's wake-ups nudge its uplink's mover (``journal.mover``): a
training loop wakes its uplink ten times a second, and a move each time cost
the uplink a sixth of its CPU; at most one move a second takes them all,
while shipping reads the spool meanwhile."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sdk_helpers import wait_for

from primeruns.journal import EntryKind, Journal
from primeruns.journal.tail import stored_end


class _Waits(threading.Event):
    """The mover's wake-up event, noting the bounded waits it makes."""

    def __init__(self) -> None:
        super().__init__()
        self.bounded: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.bounded.append(timeout)
        return super().wait(timeout)


def _append(j: Journal, count: int) -> int:
    """The last seq of ``count`` episodes appended."""
    done = j.append(EntryKind.EPISODE, [b'{"traces": []}'] * count)
    assert done.first_seq is not None
    return done.first_seq + count - 1


def _on_a_clock(
    j: Journal, monkeypatch: pytest.MonkeyPatch, waits: _Waits | None = None
) -> list[float]:
    """Start ``j``'s mover again on a clock the test moves (returned: its
    ``[now]``), its first move just done; ``waits``: its wake-up event."""
    mover = j._mover
    mover.stop()
    now = [1000.0]
    monkeypatch.setattr(mover, "_clock", lambda: now[0], raising=False)
    monkeypatch.setattr(mover, "_moved_at", float("-inf"), raising=False)
    if waits is not None:
        monkeypatch.setattr(mover, "_wake", waits)
    mover.start()
    first = _append(j, 1)
    j.wake_all()  # the first wake-up in a while: moved at once
    wait_for(lambda: _stored(j) >= first, what="the first entry moved")
    return now


def _stored(j: Journal) -> int:
    with j._tx.read() as txn:
        return stored_end(j._tx, txn)


def test_wake_ups_within_a_second_of_a_move_are_taken_by_one_move_once_it_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = Journal.create(tmp_path / "j")
    try:
        waits = _Waits()
        now = _on_a_clock(j, monkeypatch, waits)
        last = _append(j, 3)
        for _ in range(5):
            j.wake_all()  # within the second: held, not a move each
        wait_for(lambda: waits.bounded, what="the mover holding the wake-ups")
        assert waits.bounded[0] == pytest.approx(1.0)
        now[0] += 1.0  # the second is over: the next look moves what came
        j.wake_all()
        wait_for(lambda: _stored(j) >= last, what="the held entries moved")
        assert [e.seq for e in j.read(0).entries][-1] == last
    finally:
        j.close()


@pytest.mark.parametrize("how", ["wake", "hurry", "short of room"])
def test_what_must_not_wait_moves_at_once_however_recent_the_last_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # The background sync's tick and the room count near the byte budget
    # (``wake``: a burst must not be refused for its raw size); a flush or
    # finish (``hurry``: what it shipped is compacted only once LMDB holds
    # it); and any wake-up once the room left is under half the budget
    # (what stays spooled counts against the producer's room: a run under
    # a 4 MiB budget paced by flushes dropped a third of its episodes).
    j = Journal.create(tmp_path / "j")
    try:
        _on_a_clock(j, monkeypatch)
        last = _append(j, 1)
        if how == "wake":
            j._mover.wake()
        elif how == "hurry":
            j.wake_all(hurry=True)
        else:
            monkeypatch.setattr(j._capacity, "ample", False)
            j.wake_all()
        wait_for(lambda: _stored(j) >= last, what="the entry moved at once")
    finally:
        j.close()
