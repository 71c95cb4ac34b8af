"""finish() with records held in memory for a full disk (``journal.overflow``):
they are waited for at most half its timeout, and the close-out keeps the rest.

Waited for the whole timeout, with the finish entry's deadline counted from
before the wait, the uplink had no time left: it closed the run out at once
and left hundreds of records unshipped."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from primeruns import closing
from primeruns.exceptions import JournalFullError
from primeruns.journal import EntryKind, Journal
from primeruns.journal.appending import Appender
from primeruns.journal.spool import SpoolWriter
from primeruns.models import RunStatus
from primeruns.recorder import Recorder
from primeruns.ship.deadline import K_AT_BOOT, boot_clock
from primeruns.ship.ledger import Closeout

_BUDGET = 4.0
_LONG_BUDGET = 60.0  # a finish that waited half of it for nothing would show


class _Uplink:
    """A supervisor whose uplink closes the run out at once, noting the wait."""

    pid = None

    def __init__(self, *, ships: bool = True) -> None:
        self.waiting: list[float] = []
        self.ships = ships  # whether a sink still ships (room may come)

    def pending(self) -> dict[str, int]:
        return {}

    def may_free_room(self) -> bool:
        return self.ships

    def replace_if_dead(self, *, restart: bool = False) -> None:
        pass  # it lives

    def wait_closeout(self, waiting: float, *, grace: bool) -> Closeout:
        self.waiting.append(waiting)
        return Closeout(True, None, {}, True, True)

    def release(self) -> None:
        pass

    @property
    def uplink(self) -> _Uplink:
        return self


def _holding_two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """A run whose journal holds two records for a disk that never has room
    for them (and has room for the finish entry)."""
    monkeypatch.setattr(Appender, "store_held", lambda self: [])  # the disk never has room
    journal = Journal.create(tmp_path, local_id="run")
    journal.hold_when_full()
    recorder = Recorder(journal, kind="train", on_error="warn")
    real_write = SpoolWriter.write

    def refused(*args: Any) -> None:
        raise JournalFullError(f"no space left on device ({errno.ENOSPC})")

    monkeypatch.setattr(SpoolWriter, "write", refused)
    recorder.append(EntryKind.METRICS, [b'{"step": 1}', b'{"step": 2}'])
    assert recorder.dropped == 0  # held, not dropped
    monkeypatch.setattr(SpoolWriter, "write", real_write)  # room for the finish entry only
    return recorder


def _finish(recorder: Recorder, uplink: _Uplink, budget: float) -> None:
    closing.finish_journal(
        recorder,
        uplink,  # type: ignore[arg-type]
        status=RunStatus.COMPLETED,
        message=None,
        budget=budget,
        wait=None,
        run_id="run",
    )


def test_finish_waits_for_held_records_half_its_time_and_the_close_out_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _holding_two(tmp_path, monkeypatch)

    uplink = _Uplink()
    before = boot_clock()
    _finish(recorder, uplink, _BUDGET)

    # The held records are let go once half the time is spent, counted with their reason.
    assert recorder.dropped == 2
    assert recorder.losses()["journal"] == {"count": 2, "reasons": ["disk full"]}
    with Journal.open(tmp_path / "run", owner=False) as reader:
        entries = reader.read(0, kinds={EntryKind.FINISH}).entries
    assert [e.seq for e in entries] == [1]
    finish = json.loads(entries[0].payload)
    # The entry was made after that wait, and its deadline counts from then,
    # with what was left of the budget: the close-out's share, never nothing.
    assert finish[K_AT_BOOT] >= before + _BUDGET / 2 - 1e-3
    assert 0 < finish["timeout"] <= _BUDGET / 2
    assert uplink.waiting == [finish["timeout"]]


def test_finish_does_not_wait_for_held_records_once_nothing_can_free_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Room for held records comes only from the uplink's shipping, which
    compaction follows. With nothing shipping (every sink retired or paused:
    the platform refused it, or was down three times in a row) and a disk
    that stays full, finish() still waited half its timeout before it let
    them go, for nothing: a stuck finish, and the close-out's time halved.
    Now it lets them go after one more try, and the close-out keeps (nearly)
    the whole budget."""
    recorder = _holding_two(tmp_path, monkeypatch)

    uplink = _Uplink(ships=False)
    _finish(recorder, uplink, _LONG_BUDGET)
    assert recorder.dropped == 2  # let go, counted with their reason
    assert recorder.losses()["journal"] == {"count": 2, "reasons": ["disk full"]}
    with Journal.open(tmp_path / "run", owner=False) as reader:
        finish = json.loads(reader.read(0, kinds={EntryKind.FINISH}).entries[0].payload)
    # Not half of it spent waiting: the close-out's deadline is most of the budget.
    assert finish["timeout"] > _LONG_BUDGET / 2
