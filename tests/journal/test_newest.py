"""The last entries of a kind, read from the log's end (``Journal.newest``).

A crash is closed out with the run's last summary, ``show`` and the offline
dashboard show it: each found it by a pass over every header of the journal
(200 ms for a run that updated its summary 100,000 times). Read from the end,
it must be the same entry the forward pass found, wherever the log's entries
are (moved into LMDB or still spooled) and whatever damage holds.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import cast

import pytest
from damaging import flip_stored, put_stray
from hypothesis import given, settings
from hypothesis import strategies as st

from primeruns.exceptions import JournalCorruptError
from primeruns.journal import EntryKind, Journal, by_kind, newest, reading, spool, txn
from primeruns.journal.by_kind import last_entry, last_payload, seqs_by_kind
from primeruns.journal.memory import MemoryJournal
from primeruns.journal.tail import stored_end
from primeruns.models import CRASH_ERROR
from primeruns.ship.uplink import terminal_state


def _summary(step: int) -> bytes:
    return json.dumps({"step": step}).encode()


def _move_all(journal: Journal) -> None:
    """Move every spooled entry into LMDB (the mover driven here)."""
    while journal._mover.step():
        pass


def _left_as_killed(journal: Journal) -> Path:
    """Close ``journal`` as a killed producer leaves it: what it spooled stays spooled."""
    journal._mover.drain = lambda *a, **k: None  # type: ignore[method-assign]
    journal.close()
    return journal.path


def _lmdb_end(journal: Journal) -> int:
    """The last seq LMDB holds (the spool's entries follow it)."""
    with journal._tx.read() as txn:
        return stored_end(journal._tx, txn)


def _flip_in_spool(journal: Journal, seq: int) -> bool:
    """Flip the last byte of spooled entry ``seq``'s frame (its body fails its
    check); False where it is not spooled."""
    view = journal._spool
    view.refresh()
    with view.lock:
        for found, _, size, seg, index in view.frames(seq - 1):
            if found != seq:
                return False
            path = journal.path / seg.name
            data = bytearray(path.read_bytes())
            data[seg.offsets[index] + size - 1] ^= 0xFF
            path.write_bytes(bytes(data))
            return True
    return False


def _seqs(journal: Journal, kinds: Collection[EntryKind], after: int = 0) -> list[int]:
    return [seq for seq, _, _ in journal.newest(kinds, after=after)]


def test_the_last_summary_and_the_finish_are_found_in_lmdb_and_in_the_spool(
    tmp_path: Path,
) -> None:
    j = Journal.create(tmp_path, local_id="run")
    j._mover.stop()  # moved only where the test moves them
    first = j.append(EntryKind.SUMMARY, [_summary(1)]).first_seq
    j.append(EntryKind.EPISODE, [b"{}"] * 3)
    second = j.append(EntryKind.SUMMARY, [_summary(2)]).first_seq
    _move_all(j)
    assert _seqs(j, [EntryKind.SUMMARY]) == [second, first]
    assert last_payload(j, EntryKind.SUMMARY) == _summary(2)
    j.append(EntryKind.METRICS, [b'{"step": 2}'])  # spooled, of another kind
    assert last_payload(j, EntryKind.SUMMARY) == _summary(2)
    third = j.append(EntryKind.SUMMARY, [_summary(3)]).first_seq  # spooled
    assert _seqs(j, [EntryKind.SUMMARY]) == [third, second, first]
    assert _seqs(j, [EntryKind.SUMMARY], after=second) == [third]
    assert terminal_state(j) == ("crashed", CRASH_ERROR, {"step": 3})
    finish = j.append(EntryKind.FINISH, [b'{"status": "completed"}']).first_seq
    assert _seqs(j, [EntryKind.FINISH, EntryKind.SUMMARY]) == [finish, third, second, first]
    assert terminal_state(j)[0] == "completed"
    # Read as the close-out of another process reads a killed producer's journal.
    with Journal.open(_left_as_killed(j), owner=False) as reader:
        assert reader._spool.end() == finish  # (still spooled)
        assert _seqs(reader, [EntryKind.SUMMARY]) == [third, second, first]
        assert last_payload(reader, EntryKind.SUMMARY) == _summary(3)
        assert terminal_state(reader)[0] == "completed"


@pytest.mark.parametrize("spooled", [False, True])
def test_a_damaged_last_summary_gives_the_one_before_it(tmp_path: Path, spooled: bool) -> None:
    j = Journal.create(tmp_path, local_id="run")
    j._mover.stop()
    j.append(EntryKind.SUMMARY, [_summary(1)])
    j.append(EntryKind.EPISODE, [b"{}"])
    damaged = j.append(EntryKind.SUMMARY, [_summary(2)]).first_seq
    assert damaged is not None
    if spooled:
        assert _flip_in_spool(j, damaged)
    else:
        _move_all(j)
        flip_stored(j, damaged, -1)
    with Journal.open(_left_as_killed(j), owner=False) as reader:
        with pytest.raises(JournalCorruptError):
            reader.get(damaged)
        assert last_payload(reader, EntryKind.SUMMARY) == _summary(1)
        assert terminal_state(reader) == ("crashed", CRASH_ERROR, {"step": 1})


def test_a_damaged_finish_leaves_a_crash_closed_out_with_the_last_summary(tmp_path: Path) -> None:
    j = Journal.create(tmp_path, local_id="run")
    j.append(EntryKind.SUMMARY, [_summary(1)])
    finish = j.append(EntryKind.FINISH, [b'{"status": "completed"}']).first_seq
    assert finish is not None
    _move_all(j)
    flip_stored(j, finish, -1)
    assert terminal_state(j) == ("crashed", CRASH_ERROR, {"step": 1})
    j.close()


@pytest.mark.parametrize(
    "stray", [b"\xff", b"\x01\x02\x03", b"\xff" * 8, (1 << 63).to_bytes(8, "big")]
)
def test_a_key_no_entry_has_after_the_log_leaves_its_end_found(
    tmp_path: Path, stray: bytes
) -> None:
    """A key no entry has (a hand-made journal, a damaged tree) sorting after
    every entry's: one shorter than a seq's whose first byte is not 0, or one
    past the highest seq a journal holds. Taken for the log's end, the first
    said LMDB held nothing: the last summary and the finish that the forward
    pass finds were not found, and the close-out of a completed run closed it
    as crashed, with no summary. The second had the forward pass itself fail
    on the key past it (``show`` and ``export`` ended in a traceback)."""
    j = Journal.create(tmp_path, local_id="run")
    j.append(EntryKind.SUMMARY, [_summary(1)])
    finish = j.append(EntryKind.FINISH, [b'{"status": "completed"}']).first_seq
    assert finish is not None
    j.close()
    with Journal.open(j.path) as owner:  # (its close leaves every entry in LMDB, none spooled)
        put_stray(owner, stray, b"not an entry")
    with Journal.open(j.path, owner=False) as reader:
        kinds = [EntryKind.SUMMARY, EntryKind.FINISH]
        assert _seqs(reader, kinds) == _forward(reader, kinds, 0) == [finish, finish - 1]
        assert last_payload(reader, EntryKind.SUMMARY) == _summary(1)
        assert terminal_state(reader)[0] == "completed"
        assert reader.read(0, max_entries=10).damaged  # (named as the damage it is)


def test_a_journal_without_a_summary_has_none(tmp_path: Path) -> None:
    with Journal.create(tmp_path, local_id="run") as j:
        assert list(j.newest([EntryKind.SUMMARY])) == []
        assert last_payload(j, EntryKind.SUMMARY) is None
        assert terminal_state(j) == ("crashed", CRASH_ERROR, {})
        j.append(EntryKind.METRICS, [b"{}"] * 5)
        _move_all(j)
        j.append(EntryKind.EPISODE, [b"{}"] * 5)
        assert list(j.newest([EntryKind.SUMMARY, EntryKind.FINISH])) == []
        assert last_payload(j, EntryKind.SUMMARY) is None
        assert terminal_state(j) == ("crashed", CRASH_ERROR, {})


def test_spooled_frames_newest_first_are_the_forward_frames_reversed(tmp_path: Path) -> None:
    # A segment's seqs at or past its successor's first are not its own (a
    # failed write moved on to a new segment): read from the end, they are
    # passed over as a forward read passes them.
    j = Journal.create(tmp_path, local_id="run")
    j._mover.stop()
    for n in range(6):
        j.append(EntryKind.EPISODE, [b'{"n": %d}' % n])
    path = _left_as_killed(j)
    [(_, name)] = spool.list_segments(path)
    shutil.copy(path / name, path / spool.segment_name(4))
    view = spool.SpoolView(path)
    view.refresh()
    with view.lock:
        for after in range(12):
            for below in (None, 1, 3, 5, 8, 20):
                forward = [f[:3] for f in view.frames(after) if below is None or f[0] < below]
                backward = [f[:3] for f in view.frames_newest_first(after, below)]
                assert backward == forward[::-1], (after, below)
    view.close()


def test_a_journal_in_memory_gives_its_last_summary_and_finish_the_same_way() -> None:
    j = MemoryJournal(max_bytes=1 << 20, meta={})
    j.append(EntryKind.SUMMARY, [_summary(1)])
    j.append(EntryKind.EPISODE, [b"{}"])
    j.append(EntryKind.SUMMARY, [_summary(2)])
    assert [seq for seq, _, _ in j.newest([EntryKind.SUMMARY])] == [3, 1]
    assert [seq for seq, _, _ in j.newest([EntryKind.SUMMARY], after=1)] == [3]
    assert terminal_state(cast(Journal, j)) == ("crashed", CRASH_ERROR, {"step": 2})
    j.append(EntryKind.FINISH, [b'{"status": "completed"}'])
    assert terminal_state(cast(Journal, j))[0] == "completed"
    j.close()


# -- against the forward pass over the headers, as the oracle ---------------------------

_KINDS = [EntryKind.RUN_OPEN, EntryKind.EPISODE, EntryKind.METRICS, EntryKind.SUMMARY]
# 1,300 bytes to 16 KiB are stored in chunks (random bytes do not compress).
_SIZES = [1, 30, 2_000]
_appends = st.lists(
    st.tuples(
        st.sampled_from(_KINDS),
        st.lists(st.sampled_from(_SIZES), min_size=1, max_size=3),
        st.booleans(),  # moved into LMDB after it
    ),
    min_size=0,
    max_size=25,
)


def _forward(journal: Journal, kinds: Collection[EntryKind], after: int) -> list[int]:
    """The seqs of ``kinds`` after ``after`` the forward pass finds, newest first."""
    found = seqs_by_kind(journal, list(kinds))
    return sorted((seq for seqs in found.values() for seq in seqs if seq > after), reverse=True)


def _forward_last(journal: Journal, kinds: Collection[EntryKind]) -> bytes | None:
    for seq in _forward(journal, kinds, 0):
        try:
            entry = journal.get(seq)
        except JournalCorruptError:
            continue
        if entry is not None:
            return entry.payload
    return None


@settings(max_examples=60, deadline=None)
@given(
    appends=_appends,
    finish=st.booleans(),
    seed=st.integers(0, 1 << 30),
    wanted=st.lists(st.sampled_from([*_KINDS, EntryKind.FINISH]), min_size=1, unique=True),
    segment=st.sampled_from([300, 4 << 20]),
)
def test_entries_read_from_the_end_are_those_the_forward_pass_finds(
    appends: list[tuple[EntryKind, list[int], bool]],
    finish: bool,
    seed: int,
    wanted: list[EntryKind],
    segment: int,
) -> None:
    rnd = random.Random(seed)
    folder = Path(tempfile.mkdtemp(prefix="newest-"))
    with pytest.MonkeyPatch.context() as mp:
        # Several spool segments, several transactions of a walk, several reads of the pass.
        mp.setattr(spool, "SEGMENT_MAX", segment)
        mp.setattr(newest, "_BATCH", 2)
        mp.setattr(newest, "_MAX_SCAN", 3)
        mp.setattr(reading, "_MAX_SCAN", 4)
        mp.setattr(txn, "REMAP_AFTER_BYTES", 3_000)  # (a walk's bytes: past two large entries)
        try:
            j = Journal.create(folder, local_id="run")
            j._mover.stop()
            for kind, sizes, move in appends:
                j.append(kind, [rnd.randbytes(n) for n in sizes])
                if move:
                    _move_all(j)
            if finish:
                j.append(EntryKind.FINISH, [b'{"status": "completed"}'])
            # Damage: bodies that fail their check, headers that do not read
            # (in LMDB: a spooled one's ends the spool's parse, for both reads).
            in_lmdb = _lmdb_end(j)
            for seq in range(1, j.last_seq() + 1):
                what = rnd.random()
                if what < 0.15 and seq > in_lmdb:
                    assert _flip_in_spool(j, seq)
                elif what < 0.15:
                    flip_stored(j, seq, -1)
                elif what < 0.25 and seq <= in_lmdb:
                    flip_stored(j, seq, 0)
            with Journal.open(_left_as_killed(j), owner=False) as reader:
                last = reader.last_seq()
                for after in sorted({0, rnd.randint(0, last + 1), last}):
                    got = list(reader.newest(wanted, after=after))
                    assert [seq for seq, _, _ in got] == _forward(reader, wanted, after)
                    assert all(kind in wanted for _, kind, _ in got)
                found = last_entry(reader, wanted)
                assert (None if found is None else found.payload) == _forward_last(reader, wanted)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


# -- the seqs of a kind against the forward read of whole entries, as the oracle ---------


def _read_forward(journal: Journal | MemoryJournal, kinds: Collection[EntryKind]) -> list[int]:
    """The seqs of ``kinds`` a forward read of whole entries returns, ascending."""
    seqs: list[int] = []
    after = 0
    while True:
        found = journal.read(after, kinds=set(kinds), max_entries=3)
        seqs += [entry.seq for entry in found.entries]
        if found.next_after <= after:
            return seqs
        after = found.next_after


@settings(max_examples=60, deadline=None)
@given(
    appends=st.lists(
        st.tuples(
            st.sampled_from(_KINDS),
            st.lists(st.sampled_from([0, *_SIZES]), min_size=1, max_size=3),  # 0: a header alone
            st.booleans(),  # moved into LMDB after it
        ),
        max_size=25,
    ),
    seed=st.integers(0, 1 << 30),
    wanted=st.lists(st.sampled_from(_KINDS), min_size=1, unique=True),
    in_memory=st.booleans(),
)
def test_the_seqs_of_a_kind_are_those_the_forward_read_returns_entries_of_no_bytes_too(
    appends: list[tuple[EntryKind, list[int], bool]],
    seed: int,
    wanted: list[EntryKind],
    in_memory: bool,
) -> None:
    """``seqs_by_kind`` reads headers only (``max_entry_bytes=0``), and lists
    what that read leaves out for its size. An entry of no bytes is not over
    a limit of none: it was read whole instead, and listed nowhere, so
    ``show`` counted and sampled a kind's rows without it while the forward
    read, ``newest`` and the uplink all have it."""
    rnd = random.Random(seed)
    folder = Path(tempfile.mkdtemp(prefix="by-kind-"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spool, "SEGMENT_MAX", 300)  # several segments
        mp.setattr(reading, "_MAX_SCAN", 4)  # several reads of the pass
        mp.setattr(by_kind, "_BATCH", 2)
        try:
            j: Journal | MemoryJournal
            if in_memory:
                j = MemoryJournal(max_bytes=1 << 20, meta={})
            else:
                j = Journal.create(folder, local_id="run")
                j._mover.stop()
            for kind, sizes, move in appends:
                j.append(kind, [rnd.randbytes(n) for n in sizes])
                if move and isinstance(j, Journal):
                    _move_all(j)
            found = seqs_by_kind(cast(Journal, j), wanted)
            listed = sorted(seq for seqs in found.values() for seq in seqs)
            assert listed == _read_forward(j, wanted)
            for kind, seqs in found.items():
                assert list(seqs) == _read_forward(j, [EntryKind(kind)])
            j.close()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
