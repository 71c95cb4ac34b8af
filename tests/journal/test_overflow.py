"""Appends a full disk refused, held in memory and journaled once it has room
(``journal.overflow``): in order, each once, or counted lost as "disk full"."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from primeruns.exceptions import JournalFullError
from primeruns.journal import EntryKind, Journal
from primeruns.journal.appending import Appender
from primeruns.journal.spool import SpoolWriter

_WAIT_S = 60.0  # a bound on a wait for the overflow's thread, never a pace


class _Disk:
    """The spool's writes refused (ENOSPC) while ``full``; LMDB's puts of held
    appends too while ``pages_full`` (no free page in the journal's file)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, pages_full: bool = True) -> None:
        self.full = False
        self.pages_full = pages_full
        write, put = SpoolWriter.write, Appender._put_locked

        def refused_write(writer: SpoolWriter, first_seq: int, frames: list[bytes]) -> None:
            if self.full:
                raise JournalFullError(f"no space left on device ({errno.ENOSPC})")
            write(writer, first_seq, frames)

        def refused_put(appender: Appender, *args: Any, **kwargs: Any) -> bool:
            return not (self.full and self.pages_full) and put(appender, *args, **kwargs)

        monkeypatch.setattr(SpoolWriter, "write", refused_write)
        monkeypatch.setattr(Appender, "_put_locked", refused_put)


@contextlib.contextmanager
def _holding(tmp_path: Path, **kwargs: Any) -> Iterator[Journal]:
    """A journal that holds what a full disk refuses (an online run's)."""
    with Journal.create(tmp_path, local_id="run", **kwargs) as journal:
        journal.hold_when_full()
        yield journal


def _record(i: int) -> bytes:
    return json.dumps({"id": f"e{i}", "answer": "step by step " * 40}).encode()


def _ids(journal: Journal) -> list[str]:
    read = journal.read(0, kinds={EntryKind.EPISODE}, max_entries=10_000)
    assert [e.seq for e in read.entries] == list(range(1, len(read.entries) + 1))  # dense
    return [json.loads(e.payload)["id"] for e in read.entries]


def test_appends_a_full_disk_refused_are_held_in_order_and_journaled_once_it_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _Disk(monkeypatch)
    with _holding(tmp_path) as j:
        assert j.append(EntryKind.EPISODE, [_record(0)]).count == 1
        disk.full = True
        held = [j.append(EntryKind.EPISODE, [_record(i), _record(i + 1)]) for i in (1, 3)]
        assert [(r.first_seq, r.dropped, r.held) for r in held] == [(None, 0, 2)] * 2
        assert j.last_seq() == 1  # nothing of them journaled yet
        disk.full = False
        # Once the disk has room, a later call is journaled after them, not before.
        j.append(EntryKind.EPISODE, [_record(5)])
        assert j.settle_held(_WAIT_S) == 0  # every one stored, none let go
        assert _ids(j) == [f"e{i}" for i in range(6)]
        assert j.losses() == {}


def test_held_appends_go_into_the_journals_free_pages_when_the_spool_cannot_take_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk's blocks are the journal's data file's: compaction frees pages
    inside it, which no spool segment can use. Held appends are stored there,
    after what was spooled, and the spool goes on after them once it can."""
    disk = _Disk(monkeypatch, pages_full=False)
    with _holding(tmp_path) as j:
        j.append(EntryKind.EPISODE, [_record(i) for i in range(3)])  # spooled
        disk.full = True
        for i in range(3, 6):
            assert j.append(EntryKind.EPISODE, [_record(i)]).held == 1
        assert j.settle_held(_WAIT_S) == 0  # stored past the spool, in LMDB
        assert j.last_seq() == 6
        disk.full = False
        assert j.append(EntryKind.EPISODE, [_record(6)]).count == 1  # spooled again
        assert _ids(j) == [f"e{i}" for i in range(7)]
        assert j.damage() == []
    with Journal.open(tmp_path / "run", owner=False) as ro:
        assert _ids(ro) == [f"e{i}" for i in range(7)]
        assert ro.damage() == []


def test_held_appends_the_disk_never_takes_are_counted_lost_as_disk_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _Disk(monkeypatch)
    with _holding(tmp_path) as j:
        j.append(EntryKind.EPISODE, [_record(0)])
        disk.full = True
        j.append(EntryKind.EPISODE, [_record(1), _record(2)])
        j.append(EntryKind.METRICS, [b'{"step": 1}'])
        assert j.settle_held(0.0) == 3
        assert j.held_lost() == 3
        assert j.losses()["journal"] == {"count": 3, "reasons": ["disk full"]}
        disk.full = False
        # Nothing is held any more: the next append is journaled at once.
        assert j.append(EntryKind.EPISODE, [_record(3)]).first_seq == 2
        assert _ids(j) == ["e0", "e3"]


def test_the_run_finish_is_journaled_after_what_was_held_never_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finish appended while records are held (another thread's log call
    came after the finish's wait) lets them go, counted: nothing may follow
    the finish, and the close-out ships up to it."""
    disk = _Disk(monkeypatch)
    monkeypatch.setattr(Appender, "store_held", lambda self: [])  # not stored meanwhile
    with _holding(tmp_path) as j:
        disk.full = True
        j.append(EntryKind.EPISODE, [_record(0)])
        disk.full = False
        done = j.append(EntryKind.FINISH, [b'{"status": "completed"}'], essential=True, final=True)
        assert done.first_seq == 1
        assert j.held_lost() == 1
        assert j.losses()["journal"]["reasons"] == ["disk full"]


def test_the_byte_budget_still_drops_and_counts_rather_than_holding(tmp_path: Path) -> None:
    """A budget is the user's bound on the journal: its refusals are dropped
    as before; only the disk's are held."""
    with _holding(tmp_path, max_bytes=2 << 20) as j:
        results = [j.append(EntryKind.EPISODE, [os.urandom(900)]) for _ in range(4000)]
        assert sum(r.dropped for r in results) > 0
        assert sum(r.held for r in results) == 0
