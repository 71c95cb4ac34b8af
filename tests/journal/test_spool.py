"""The spool: appends land in files beside LMDB, and every reader sees one log.

What a user depends on: an append that returned survives the process's death
and is read, exactly once and in order, by every reader (the uplink, ``ls``,
``replay``) whether the mover has absorbed it into LMDB yet or not; a write
cut short by a death, or a damaged spool file, never costs another entry and
never takes a reader down.
"""

from __future__ import annotations

import contextlib
import dis
import errno
import json
import logging
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdk_helpers import wait_for
from spooled import acked_then_cut, killed_segment

from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind, InFlight, Journal, spool, spoolsync
from primeruns.journal.appending import Appender
from primeruns.journal.frames import HEADER_SIZE, encode_frame, encode_frames_off_gil
from primeruns.journal.listing import journal_info
from primeruns.journal.mover import Mover
from primeruns.journal.spool import APPEND, list_segments

_DIE_MID_WRITE = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from primeruns.journal import EntryKind, Journal
    from primeruns.journal.frames import encode_frame
    from primeruns.journal.spool import APPEND, list_segments
    j = Journal.create(Path(sys.argv[1]), local_id="run")
    j._mover.stop()  # as if the mover had not got to them yet
    j.append(EntryKind.EPISODE, [b'{"n":1}', b'{"n":2}'])
    # The next append's write() (three entries), cut short by the death: a
    # fatal signal ends a large write between pages, two entries and a bit in.
    frames = [
        encode_frame(int(EntryKind.EPISODE), b'{"n":%d}' % n, compress=False, seq=n)
        for n in (3, 4, 5)
    ]
    whole = APPEND.pack(b"PS", 1, 3, sum(map(len, frames))) + b"".join(frames)
    (_, name), = list_segments(j.path)
    with open(j.path / name, "ab") as f:
        f.write(whole[: -5])
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _payloads(journal: Journal) -> list[bytes]:
    got = journal.read(0, max_entries=100_000, max_bytes=1 << 30)
    assert not got.damaged, got.damaged
    return [e.payload for e in got.entries]


def test_a_segment_that_rotates_while_the_mover_absorbs_keeps_its_last_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The appender fills a segment and starts the next while the mover is
    absorbing the first: the mover must not take the segment it parsed
    earlier for all there is. (Found with 8 threads logging: 33 of 8,000
    entries missing before the fix.)"""
    monkeypatch.setattr(spool, "SEGMENT_MAX", 700)
    monkeypatch.setattr(spool, "_GO_ON_SHARE", 8)  # an eighth past full, as the appends assume
    records = [json.dumps({"n": n, "pad": "x" * 600}).encode() for n in range(3)]
    real = encode_frames_off_gil
    appended: list[int] = []

    def compress_while_appending(*args: Any, **kwargs: Any) -> list[bytes]:
        if not appended:
            appended.append(1)
            j.append(EntryKind.EPISODE, [records[1]])  # into the segment being absorbed
            j.append(EntryKind.EPISODE, [records[2]])  # past SEGMENT_MAX: a new segment
        return real(*args, **kwargs)

    monkeypatch.setattr("primeruns.journal.mover.encode_frames_off_gil", compress_while_appending)
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()
        j.append(EntryKind.EPISODE, [records[0]])
        assert j._mover.step()
        assert len(list_segments(j.path)) == 2
        while j._mover.step():
            pass
        assert _payloads(j) == records
    assert list_segments(tmp_path / "run") == []
    with Journal.open(tmp_path / "run", owner=False) as reader:
        assert _payloads(reader) == records


@pytest.mark.parametrize(
    "short_at", [0, 10, APPEND.size + 5], ids=["header-unread", "header-half", "body-half"]
)
def test_an_append_a_read_sees_short_of_its_size_is_read_again_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short_at: int
) -> None:
    """On FUSE and network file systems ``fstat`` can report the bytes an
    append is writing a moment before a read returns them. The mover must
    neither move the next segment's entries past that append nor delete its
    segment: its entries would be lost from both. (Found by the power-cut
    tests on a FUSE file system with no power cut at all: holes of up to a
    segment in LMDB in 13 of 19 runs of 20,000 rows.)"""
    monkeypatch.setattr(spool, "SEGMENT_MAX", 700)
    monkeypatch.setattr(spool, "_GO_ON_SHARE", 8)  # an eighth past full, as the appends assume
    records = [json.dumps({"n": n, "pad": "x" * 400}).encode() for n in range(3)]
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()
        j.append(EntryKind.EPISODE, [records[0]])
        ((_, name),) = list_segments(j.path)
        first = os.stat(j.path / name)
        short = first.st_size + short_at  # into the second append, which the read misses
        j.append(EntryKind.EPISODE, [records[1]])
        j.append(EntryKind.EPISODE, [records[2]])  # past SEGMENT_MAX: the next segment
        assert len(list_segments(j.path)) == 2
        real = os.pread
        shortened: list[int] = []

        def pread(fd: int, size: int, offset: int) -> bytes:
            data = real(fd, size, offset)
            mine = offset <= short < offset + size and os.fstat(fd).st_ino == first.st_ino
            if mine and not shortened:
                shortened.append(offset)
                return data[: short - offset]
            return data

        monkeypatch.setattr(os, "pread", pread)
        while j._mover.step():
            pass
        assert shortened, "the read was never made short"
        assert _payloads(j) == records
    assert list_segments(tmp_path / "run") == []
    with Journal.open(tmp_path / "run", owner=False) as reader:
        assert _payloads(reader) == records and reader.damage() == []


def test_an_append_cut_short_by_a_death_is_not_part_of_the_log(tmp_path: Path) -> None:
    """Its call never returned: none of its entries is read (a call is in the
    log whole or not at all, which a requeued job resumes by), no damage is
    reported, and the next owner's appends follow the entries before it."""
    out = subprocess.run(
        [sys.executable, "-c", _DIE_MID_WRITE, str(tmp_path)], capture_output=True, timeout=60
    )
    assert out.returncode == -9, out.stderr.decode()
    path = tmp_path / "run"
    listed = journal_info(path, tally=True)  # what `primeruns ls` shows of it
    assert listed.size_bytes > (path / "data.mdb").stat().st_size
    assert listed.last_seq == 2
    with Journal.open(path, owner=False) as reader:
        assert _payloads(reader) == [b'{"n":1}', b'{"n":2}'] and reader.damage() == []
        assert sum(reader.tally()[0].values()) == 2
    with Journal.open(path) as owner:
        assert owner.last_seq() == 2
        assert owner.append(EntryKind.EPISODE, [b'{"n":"new"}']).first_seq == 3
        assert _payloads(owner) == [b'{"n":1}', b'{"n":2}', b'{"n":"new"}']
    assert list_segments(path) == []  # all of it in LMDB now, nothing left beside it
    with Journal.open(path, owner=False) as reader:
        assert _payloads(reader) == [b'{"n":1}', b'{"n":2}', b'{"n":"new"}']


def _spooled_journal(path: Path, count: int) -> tuple[Path, list[bytes]]:
    """A journal whose ``count`` entries are all still in one spool segment,
    as a producer killed before its mover got to them leaves it."""
    records = [json.dumps({"n": n, "text": "y" * (n % 7 * 40)}).encode() for n in range(count)]
    j = Journal.create(path, local_id="run")
    j._mover.stop()
    j.append(EntryKind.EPISODE, records)
    segment = j.path / list_segments(j.path)[0][1]
    data = segment.read_bytes()
    j._mover.drain = lambda *a, **k: None  # type: ignore[method-assign]  # as if killed
    j.close()
    segment.write_bytes(data)
    return segment, records


def test_a_damaged_entry_in_the_spool_costs_that_entry_alone(tmp_path: Path) -> None:
    segment, records = _spooled_journal(tmp_path, 6)
    data = bytearray(segment.read_bytes())
    second = APPEND.size + len(encode_frame(2, records[0], compress=False, seq=1))
    data[second + 14] ^= 0xFF  # a payload byte of entry 2: its checksum fails
    segment.write_bytes(bytes(data))
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
        assert [e.payload for e in got.entries] == records[:1] + records[2:]
        assert [d.seq for d in got.damaged] == [2]
    with Journal.open(segment.parent) as owner:  # absorbed as it is: still reported
        owner._absorb()
        got = owner.read(0, max_entries=100)
        assert [e.payload for e in got.entries] == records[:1] + records[2:]
        assert [d.seq for d in got.damaged] == [2]


@pytest.mark.parametrize("flaw", ["short frame", "compressed", "version 1", "one too many"])
def test_a_one_entry_append_whose_frame_does_not_fill_it_is_damage(
    tmp_path: Path, flaw: str
) -> None:
    """An append of one entry is parsed by its frame's header alone: a frame
    that is not a spooled entry's, or does not fill its append exactly, is
    damage where it starts, never an entry (or two)."""
    segment, records = _spooled_journal(tmp_path, 3)
    frame = bytearray(encode_frame(int(EntryKind.EPISODE), b'{"n":4}', compress=False, seq=4))
    count, extra = 1, b""
    if flaw == "short frame":
        extra = b"\0" * 5  # the append claims five bytes the frame does not
    elif flaw == "compressed":
        frame[2] = 1  # FLAG_ZSTD: never spooled
    elif flaw == "version 1":
        frame[0] = 1
    else:  # a second whole frame after the one the header counts
        extra = encode_frame(int(EntryKind.EPISODE), b'{"n":5}', compress=False, seq=5)
    body = bytes(frame) + extra
    with segment.open("ab") as f:
        f.write(APPEND.pack(b"PS", 1, count, len(body)) + body)
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
        assert [e.payload for e in got.entries] == records
        assert [d.seq for d in got.damaged] == [4]


@pytest.mark.parametrize("damaged", [(4,), (4, 6), (9,), (8, 9), (0, 9), (2, 3, 4)])
def test_damage_in_the_newest_segment_is_reported_with_every_entry_it_cost(
    damaged: tuple[int, ...], tmp_path: Path
) -> None:
    """No later segment's first seq says how many entries the newest one
    held past damage that ends what a reader takes of it: the read that
    reaches the log's end reports them all (found by the whole appends
    after it, or by the damaged ones' own headers), and the append the
    kill cut short at the end, whose call never returned, is not one."""
    segment, data, starts = _ten_calls_spooled(tmp_path)  # "PS" in their text too
    for index in damaged:
        data[starts[index]] ^= 0xFF  # its magic
    cut = encode_frame(int(EntryKind.EPISODE), b'{"n":"cut"}', compress=False, seq=31)
    segment.write_bytes(bytes(data) + APPEND.pack(b"PS", 1, 1, len(cut)) + cut[:-5])
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
        first = 3 * damaged[0] + 1
        assert [e.seq for e in got.entries] == list(range(1, first))
        assert [(d.seq, d.entries) for d in got.damaged] == [(first, 31 - first)]
        assert [(d.seq, d.entries) for d in reader.damage()] == [(first, 31 - first)]


def _damage_and_bytes(
    segment: Path, monkeypatch: pytest.MonkeyPatch, where: tuple[Any, str] | None = None
) -> tuple[list[tuple[int | None, int]], int]:
    """What a reader of ``segment``'s journal reports damaged (seq, entries),
    and the bytes its spool took through ``where`` (default ``os.pread``:
    read from the file; ``(spool, "_read")``: looked at through a scan's
    window)."""
    owner, name = where or (spool.os, "pread")
    real = getattr(owner, name)
    taken = 0

    def counting(source: Any, length: int, offset: int) -> bytes:
        nonlocal taken
        out = real(source, length, offset)
        taken += len(out)
        return out

    monkeypatch.setattr(owner, name, counting)
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
    return [(d.seq, d.entries) for d in got.damaged], taken


def _ten_calls_spooled(path: Path) -> tuple[Path, bytearray, list[int]]:
    """Ten calls of three entries (see ``_calls_spooled``)."""
    calls = [[b'{"n":%d,"t":"PS"}' % (3 * n + k) for k in range(3)] for n in range(10)]
    return _calls_spooled(path, calls)


def _calls_spooled(path: Path, calls: list[list[bytes]]) -> tuple[Path, bytearray, list[int]]:
    """``calls``, each one append, all in the newest segment of a producer
    killed before its mover got to them: (the segment, its bytes, where
    each append starts)."""
    j = Journal.create(path, local_id="run")
    j._mover.stop()
    for payloads in calls:
        j.append(EntryKind.EPISODE, payloads)
    return killed_segment(j)


@pytest.mark.parametrize("damaged", [4, 8])
def test_a_damaged_length_that_runs_past_the_end_is_damage_not_a_torn_tail(
    damaged: int, tmp_path: Path
) -> None:
    """An append's length damaged so that it runs past the segment's end
    looked like the append a kill cut short: the reader took the log to end
    there, and the whole appends written after it were lost with no damage
    reported and none counted. An append cut short is the segment's last
    (the next one is written once it is whole): whole ones after it say the
    header is damaged, and they are the entries it cost."""
    segment, data, starts = _ten_calls_spooled(tmp_path)
    at = starts[damaged]
    length = APPEND.unpack_from(data, at)[3]
    data[at + 8 : at + 16] = (length | 1 << 22).to_bytes(8, "little")  # one bit
    cut = encode_frame(int(EntryKind.EPISODE), b'{"n":"cut"}', compress=False, seq=31)
    segment.write_bytes(bytes(data) + APPEND.pack(b"PS", 1, 1, len(cut)) + cut[:-5])
    first = 3 * damaged + 1
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
        assert [e.seq for e in got.entries] == list(range(1, first))
        assert [(d.seq, d.entries) for d in got.damaged] == [(first, 31 - first)]
        assert [(d.seq, d.entries) for d in reader.damage()] == [(first, 31 - first)]
    with Journal.open(segment.parent) as owner:
        owner.read(0, max_entries=100)
    assert segment.exists()  # kept, for every sink of a later process to count


def test_a_partial_write_undone_while_a_reader_looks_at_it_is_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write cut short (a full disk) is truncated back and the next
    append written where it was: a reader that took it for a tail, and
    looks past its header for whole appends meanwhile, finds the next ones
    there. Not damage in its length: they are read once written."""
    j = Journal.create(tmp_path, local_id="run")
    j._mover.stop()
    j.append(EntryKind.EPISODE, [b'{"n":0}'])
    [(_, name)] = list_segments(j.path)
    segment = j.path / name
    start = segment.stat().st_size
    big = [
        encode_frame(int(EntryKind.EPISODE), b'{"n":"x%d"}' % n + b" " * 900, compress=False, seq=n)
        for n in (2, 3, 4)
    ]
    partial = (APPEND.pack(b"PS", 1, 3, sum(map(len, big))) + b"".join(big))[:2000]
    with open(segment, "ab") as out:  # what the write cut short left, before its undo
        out.write(partial)
    real = spool._whole_append_in
    undone: list[bool] = []

    def undo_then_look(fd: int, pos: int, size: int) -> bool:
        if not undone:
            undone.append(True)
            os.truncate(segment, start)
            j.append(EntryKind.EPISODE, [b'{"n":1}'])
            j.append(EntryKind.EPISODE, [b'{"n":2}'])
        return real(fd, pos, size)

    monkeypatch.setattr(spool, "_whole_append_in", undo_then_look)
    with Journal.open(j.path, owner=False) as reader:
        first = reader.read(0, max_entries=100)
        assert undone and first.damaged == []
        after = max([0] + [e.seq for e in first.entries])
        got = reader.read(after, max_entries=100)
        seen = [e.payload for e in first.entries + got.entries]
        assert seen == [b'{"n":0}', b'{"n":1}', b'{"n":2}'] and got.damaged == []
    j.close()


def test_a_run_of_appends_whose_first_entry_is_damaged_is_placed_in_linear_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past damage in the newest segment, a whole append is placed by the
    seq its first entry's checksum covers, searched over every seq the bytes
    since the last one placed could hold. Where the first entry of each of a
    run of appends is damaged too, that range grew with each: a 440 KB
    segment took 7.9 s to read (4 MiB: minutes, for ``show`` or ``sync`` of
    a damaged or crafted journal). The whole appends skipped narrow it, and
    the first intact one after them is still placed exactly."""
    calls = 300
    segment, data, starts = _calls_spooled(
        tmp_path, [[b'{"n":%d,"pad":"%s"}' % (n, b"x" * 60)] * 2 for n in range(calls)]
    )
    data[starts[1]] ^= 0xFF  # the magic of the second call's append
    for at in starts[2:-1]:  # and a payload byte of every later one's first entry, but the last
        data[at + APPEND.size + HEADER_SIZE + 3] ^= 0x01
    segment.write_bytes(bytes(data))
    searched = 0
    real = spool._seq_by_checksum

    def counted(fd: int, offset: int, nbytes: int, lo: int, hi: int) -> int | None:
        nonlocal searched
        searched += hi - lo + 1
        return real(fd, offset, nbytes, lo, hi)

    monkeypatch.setattr(spool, "_seq_by_checksum", counted)
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=10)
        assert [(d.seq, d.entries) for d in got.damaged] == [(3, 2 * calls - 2)]
    assert searched < 100 * calls  # seqs tried: about 20 a call, not a range growing with each


def test_damage_in_a_segment_lmdb_holds_all_of_is_not_kept_for_good(tmp_path: Path) -> None:
    """The mover had moved every entry of the newest segment into LMDB when
    the producer was killed, and the segment was damaged after: the damage
    cost nothing, and no sink counts any. Kept all the same (its damage was
    to be met by every later process), every later sync listed it as
    damage of 18 entries and exited 4. An owner deletes it, as before."""
    segment, data, starts = _ten_calls_spooled(tmp_path)
    with Journal.open(segment.parent) as owner:
        owner._mover.stop()
        while owner._mover.step():
            pass  # all of it moved, then killed before the segment was deleted
        owner._mover.drain = lambda *a, **k: None  # type: ignore[method-assign]
    data[starts[4]] ^= 0xFF
    segment.write_bytes(bytes(data))
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
        assert [e.seq for e in got.entries] == list(range(1, 31)) and got.damaged == []
    with Journal.open(segment.parent) as owner:
        assert owner.read(0, max_entries=100).damaged == []
    assert not segment.exists()
    with Journal.open(segment.parent, owner=False) as reader:
        assert reader.damage() == []


def test_a_power_cuts_zero_filled_tail_costs_no_entry(tmp_path: Path) -> None:
    """A power cut can leave a segment's size on disk and not its last bytes:
    a tail of zeros, as a torn tail is, where no append can be found and none
    placed. Counted as one entry lost, every sink recorded a loss for a run
    whose every returned call it had read; a torn tail of fewer bytes than
    an append's header was counted as none."""
    segment, data, _ = _ten_calls_spooled(tmp_path)
    segment.write_bytes(bytes(data) + bytes(4096))
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
        assert [e.seq for e in got.entries] == list(range(1, 31))
        assert got.damaged == []
        assert reader.damaged_end() == reader.last_seq() == 30
        assert [(d.seq, d.entries) for d in reader.damage()] == [(31, 1)]  # listed, as before
    with Journal.open(segment.parent):
        pass  # an owner moves the rest: the segment holds nothing more to count
    assert not segment.exists()  # not kept, to be listed as damage by every sync after


def test_a_damaged_segment_still_growing_is_not_looked_at_whole_by_every_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that sees damage in a segment its producer still appends to
    (an uplink) counts what it cost at every read that reaches the end: it
    looked at every append after the damage again each time the segment
    grew, quadratic in its appends (2,000 appends and reads: 4.3 s against
    0.07 s). It goes on from the last whole append, and counts the same."""
    j = Journal.create(tmp_path, local_id="run")
    j._mover.stop()
    for n in range(10):
        j.append(EntryKind.EPISODE, [b'{"n":%d}' % n])
    [(_, name)] = list_segments(j.path)
    fd = os.open(j.path / name, os.O_RDWR)
    try:
        at = 0
        for _ in range(5):
            at += APPEND.size + APPEND.unpack_from(os.pread(fd, APPEND.size, at))[3]
        os.pwrite(fd, b"\xff", at)  # the magic of the sixth append
    finally:
        os.close(fd)
    looks = 0
    real = spool._append_at

    def counted(*args: Any) -> Any:
        nonlocal looks
        looks += 1
        return real(*args)

    monkeypatch.setattr(spool, "_append_at", counted)
    appends = 200
    with Journal.open(j.path, owner=False) as uplink:
        after = 0
        for n in range(10, 10 + appends):
            j.append(EntryKind.EPISODE, [b'{"n":%d}' % n])
            got = uplink.read(after, max_entries=100)
            after = max([after] + [e.seq for e in got.entries])
            assert [(d.seq, d.entries) for d in got.damaged] == [(6, n - 4)]
        assert looks < 4 * appends  # each append looked at about once, not each time
    with Journal.open(j.path, owner=False) as later:  # a fresh look agrees
        assert [(d.seq, d.entries) for d in later.read(5, max_entries=100).damaged] == [
            (6, appends + 5)
        ]
    j.close()


def test_a_segment_named_past_any_seq_never_takes_a_reader_down(tmp_path: Path) -> None:
    """A journal is untrusted input: an empty segment whose name says a seq
    no LMDB key can hold is not a gap a read passes (the next read's key
    would fail to pack)."""
    segment, records = _spooled_journal(tmp_path, 3)
    (segment.parent / "spool-99999999999999999999").write_bytes(b"")
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
        assert [e.payload for e in got.entries] == records
        assert reader.read(got.next_after, max_entries=100).entries == []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_a_spool_segment_of_any_bytes_never_takes_a_reader_down(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """A journal is untrusted input: whatever a segment holds, readers and a
    new owner only ever return entries exactly as they were written."""
    base = tmp_path_factory.mktemp("spool")
    segment, records = _spooled_journal(base, 8)
    raw = bytearray(segment.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(0, len(raw)))] + data.draw(st.binary(max_size=40))
    segment.write_bytes(bytes(raw))
    for owner in (False, True):
        try:
            with Journal.open(segment.parent, owner=owner) as j:
                got = j.read(0, max_entries=100)
                j.tally()
                j.damage()
                if owner:
                    j._absorb()
                    got = j.read(0, max_entries=100)
        except JournalError:
            continue
        for entry in got.entries:
            assert entry.payload == records[entry.seq - 1]


def test_a_failed_sync_keeps_the_append_it_followed_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``durability="fsync"``: the write landed and the sync failed (EIO). The
    call returns its records as written (every reader sees them), and the
    appends after it keep their own seqs."""
    with Journal.create(tmp_path, local_id="run", durability="fsync") as j:
        j._mover.stop()
        j.append(EntryKind.EPISODE, [b'{"a":0}'])

        def eio(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", eio)
        assert j.append(EntryKind.EPISODE, [b'{"synced":false}']).count == 1
        monkeypatch.undo()
        later = [json.dumps({"later": i}).encode() for i in range(3)]
        for record in later:
            assert j.append(EntryKind.EPISODE, [record]).count == 1
        assert _payloads(j) == [b'{"a":0}', b'{"synced":false}', *later]


def test_an_fsync_append_whose_sync_failed_is_synced_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``durability="fsync"``: the sync of a run's last append fails (EIO)
    and nothing is logged after it. The warning says the background tries
    again, and it does, within a second: before, nothing synced it until the
    journal closed, and a power cut meanwhile lost a call that returned."""
    real = os.fdatasync
    failed: list[int] = []
    synced: list[int] = []

    def fdatasync(fd: int) -> None:
        if not failed:
            failed.append(os.fstat(fd).st_ino)
            raise OSError(errno.EIO, "Input/output error")
        real(fd)
        synced.append(os.fstat(fd).st_ino)

    with Journal.create(tmp_path, local_id="run", durability="fsync") as j:
        j.append(EntryKind.EPISODE, [b'{"a":0}'])
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        assert j.append(EntryKind.EPISODE, [b'{"synced":false}']).count == 1
        wait_for(lambda: failed[0] in synced, timeout=20, what="the failed sync made again")
        monkeypatch.undo()
        assert _payloads(j) == [b'{"a":0}', b'{"synced":false}']


def test_a_fifo_named_like_a_segment_never_blocks_a_reader(tmp_path: Path) -> None:
    """A foreign file in a journal directory is damage, not a hang."""
    with Journal.create(tmp_path, local_id="run") as j:
        j.append(EntryKind.EPISODE, [b'{"a":0}'])
    os.mkfifo(tmp_path / "run" / spool.segment_name(2))
    with Journal.open(tmp_path / "run", owner=False) as reader:
        assert [e.payload for e in reader.read(0).entries] == [b'{"a":0}']
        assert any("not a regular file" in d.what for d in reader.damage())


def test_an_owner_that_misreads_the_end_refuses_to_append_rather_than_hide_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment this process could not open (out of descriptors) hides the
    entries in it from the end an owner reads; appending there would put new
    entries under seqs the log has already. The append is refused (the run
    counts it dropped) until the end is read again."""
    monkeypatch.setattr(spool, "SEGMENT_MAX", 100)
    monkeypatch.setattr(spool, "_GO_ON_SHARE", 8)  # an eighth past full, as the appends assume
    records = [json.dumps({"n": n, "pad": "x" * 80}).encode() for n in range(4)]
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()
        for record in records:
            j.append(EntryKind.EPISODE, [record])  # one segment each
        j._mover.drain = lambda *a, **k: None  # type: ignore[method-assign]  # left spooled
    path = tmp_path / "run"
    assert len(list_segments(path)) == 4
    real_open = os.open

    def out_of_descriptors(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(file).endswith(spool.segment_name(4)):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", out_of_descriptors)
    monkeypatch.setattr(Mover, "start", lambda self: None)
    with Journal.open(path) as owner:
        assert owner.last_seq() == 3  # entry 4 is hidden from it
        with pytest.raises(JournalError):
            owner.append(EntryKind.EPISODE, [b'{"new":1}'])
        monkeypatch.setattr(os, "open", real_open)
        assert owner.append(EntryKind.EPISODE, [b'{"new":1}']).first_seq == 5
        assert _payloads(owner) == [*records, b'{"new":1}']


def _spool_descriptors() -> list[str]:
    """What this process's open spool descriptors point at."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if "spool-" in target:
                out.append(target)
    return out


def test_a_producer_lets_go_of_the_segments_its_uplink_absorbed(tmp_path: Path) -> None:
    """After the hand-over another process absorbs and deletes the
    producer's segments: the producer must not keep them open (their disk
    space would never be freed, and descriptors run out)."""
    with Journal.create(tmp_path, local_id="run") as j:
        j.hand_over_moving()
        monkey_max = spool.SEGMENT_MAX
        spool.SEGMENT_MAX = 2_000
        try:
            for n in range(40):
                j.append(EntryKind.EPISODE, [json.dumps({"n": n, "pad": "z" * 900}).encode()])
                if n % 4 == 3:
                    view = spool.SpoolView(j.path)
                    mover = Mover(j._tx, j._dicts, j.path, view, j._reader)
                    while mover.step():  # the uplink's mover, with a view of its own
                        pass
                    mover._spool.close()
                    j._spool.let_go()  # as the producer's background thread does
        finally:
            spool.SEGMENT_MAX = monkey_max
        # Let go off the producer's thread: the spool's syncer closes them
        # (``SegmentSyncer.close_later``), soon after the last let-go.
        wait_for(
            lambda: not [h for h in _spool_descriptors() if h.endswith("(deleted)")],
            timeout=30,
            what="the segments let go to be closed",
        )
        held = _spool_descriptors()
        assert len(set(held)) <= 1  # the segment being written (writing and reading)


def test_two_movers_at_once_never_let_go_of_a_segment_lmdb_does_not_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two movers for a moment (a hand-over; a close's drain beside the
    # uplink's; compaction's absorb beside the mover thread). The one whose
    # commit lost the race must not delete the segments its batch covered:
    # the winner's batch was shorter (an older view) and ended before them.
    import threading

    from primeruns.journal.dicts import Dictionaries

    def rec(i: int) -> bytes:
        return b"%06d" % i + os.urandom(10_000)  # ~10 KB: the first segment ends near 420

    monkeypatch.setattr(spool, "_GO_ON_SHARE", 8)  # an eighth past full, as the appends assume
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()  # both movers driven here
        for i in range(1, 301):
            j.append(EntryKind.EPISODE, [rec(i)])

        def mover(ready: threading.Event, go: threading.Event) -> Mover:
            dicts = Dictionaries(j._tx)
            real = dicts.refresh
            first = [True]

            def refresh() -> None:  # after its batch is read, before it commits
                if first[0]:
                    first[0] = False
                    ready.set()
                    go.wait()
                real()

            dicts.refresh = refresh  # type: ignore[method-assign]
            return Mover(j._tx, dicts, j.path, spool.SpoolView(j.path), j._reader)

        b_ready, b_go, a_ready, a_go = (threading.Event() for _ in range(4))
        b = mover(b_ready, b_go)
        tb = threading.Thread(target=b.step)
        tb.start()
        b_ready.wait()  # b's batch: 1..300
        for i in range(301, 501):  # the first segment fills, a second begins
            j.append(EntryKind.EPISODE, [rec(i)])
        assert len(list_segments(j.path)) == 2
        a = mover(a_ready, a_go)
        ta = threading.Thread(target=a.step)
        ta.start()
        a_ready.wait()  # a's batch: 1..500
        b_go.set()
        tb.join()  # b commits 1..300
        a_go.set()
        ta.join()  # a's commit finds LMDB moved: it lets go of nothing
        while b.step() or a.step():
            pass
        for m in (a, b):
            m._spool.close()
    with Journal.open(tmp_path / "run", owner=False) as ro:
        got = ro.read(0, max_entries=10_000, max_bytes=1 << 30)
        assert [int(e.payload[:6]) for e in got.entries] == list(range(1, 501))
        assert got.damaged == []


def _mover_runs_after_the_next_lmdb_read(j: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mover's thread takes its turn right after a reader's LMDB read and
    before the reader looks at the spool: it moves everything into LMDB and
    closes the segments it emptied (this process's view is the reader's)."""
    real_read = j._tx.read
    armed = [True]

    @contextlib.contextmanager
    def read(**kwargs: Any) -> Any:
        with real_read(**kwargs) as txn:
            yield txn
        if armed[0]:
            armed[0] = False
            while j._mover.step():
                pass

    monkeypatch.setattr(j._tx, "read", read)


@pytest.mark.parametrize("look", ["read", "tally", "get"])
def test_a_reader_beside_the_mover_misses_nothing_it_moves_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, look: str
) -> None:
    # Threads mode (the producer's mover beside its shippers) and the uplink
    # (its mover beside its shippers) share one view of the spool. A read
    # used to report the entries of a segment moved in that window as
    # missing, and its shipper counted them lost: 34 of 40 here.
    monkeypatch.setattr(spool, "SEGMENT_MAX", 64 << 10)
    monkeypatch.setattr(spool, "_GO_ON_SHARE", 8)  # an eighth past full, as the appends assume
    with Journal.create(tmp_path) as j:
        j.hand_over_moving()  # the mover moves only when the test says
        records = [json.dumps({"i": i, "pad": "x" * 4000}).encode() for i in range(40)]
        for record in records:
            j.append(EntryKind.EPISODE, [record])
        assert len(list_segments(j.path)) == 3
        _mover_runs_after_the_next_lmdb_read(j, monkeypatch)
        if look == "tally":
            assert sum(j.tally()[0].values()) == 40
        elif look == "get":
            got = j.get(1)
            assert got is not None and got.payload == records[0]
        else:
            # One read: the uplink looks for the producer's finish once, then
            # waits for a wake-up. A read that came back short here (LMDB's
            # part only) had it sleep with the finish there, for the 300 s
            # the producer's finish() then waited.
            result = j.read(0)
            assert result.damaged == []
            assert [e.seq for e in result.entries] == list(range(1, 41))
            assert result.next_after == 40
        assert len(list_segments(j.path)) == 1  # the mover did move meanwhile


def _moved(j: Journal, seq: int) -> bool:
    """Whether LMDB holds every entry up to ``seq``."""
    from primeruns.journal.tail import stored_end

    with j._tx.read() as txn:
        return stored_end(j._tx, txn) >= seq


def test_appends_are_moved_into_lmdb_while_the_run_is_open(tmp_path: Path) -> None:
    # No append wakes the mover (a thread woken in the middle of a burst of
    # log calls slows every one of them down: see maintenance); the
    # background sync's tick does, a second after the writes.
    with Journal.create(tmp_path, local_id="run") as j:
        result = j.append(EntryKind.METRICS, [b'{"step": %d}' % n for n in range(20)])
        assert result.first_seq is not None
        last = result.first_seq + 19
        wait_for(lambda: _moved(j, last), timeout=30, what="the tick to move the appends")


def test_a_reopened_journal_moves_what_a_dead_producer_left_with_no_append(
    tmp_path: Path,
) -> None:
    segment, records = _spooled_journal(tmp_path, 30)
    with Journal.open(segment.parent) as j:  # its owner, as a requeued job is
        wait_for(lambda: _moved(j, 30), timeout=30, what="the first look to move the spool")
        assert _payloads(j) == records


def test_entries_acknowledged_while_spooled_are_compacted_once_moved(tmp_path: Path) -> None:
    """A live run's uplink acknowledges entries straight from the spool, before
    its mover moves them into LMDB, so compaction at that acknowledgement
    stops short of them. Once moved they must be compacted without waiting
    for another acknowledgement: at the budget none may come (every append
    refused), and the run dropped every later call (CI: 1,150 of 1,500
    episodes, Prime Traces off, a 4 MiB budget)."""
    budget = 4 << 20
    with Journal.create(tmp_path, local_id="run", max_bytes=budget) as j:
        j.hand_over_moving()  # the uplink moves, as in a live run
        uplink = Journal.open(j.path, lock_fd=os.dup(j.share_lock()))
        try:
            uplink.set_sinks(["samples"])
            accepted = 0
            for _ in range(60):  # ~3 MiB of incompressible entries, all spooled
                accepted += j.append(EntryKind.EPISODE, [os.urandom(50_000)]).count
            assert accepted == 60
            uplink.ack("samples", j.last_seq())  # shipped from the spool
            uplink.take_over_moving()  # its mover now moves them into LMDB
            wait_for(lambda: uplink.get_meta("journal.compacted_upto", 0) == accepted, 15)
            # Room for as much again, without another acknowledgement.
            assert j.append(EntryKind.EPISODE, [os.urandom(50_000)] * 40).dropped == 0
        finally:
            uplink.close()


def _episode(n: int) -> bytes:
    return json.dumps({"n": n, "pad": "z" * 900}).encode()


def _syncs_by_thread(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each ``fdatasync`` from now on, by the name of the thread that made it."""
    real = os.fdatasync
    made: list[str] = []

    def fdatasync(fd: int) -> None:
        real(fd)
        made.append(threading.current_thread().name)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return made


def _spool_sync_threads() -> set[int]:
    return {
        t.ident or 0 for t in threading.enumerate() if t.name.startswith("primeruns-spool-sync-")
    }


def test_a_segment_is_synced_ahead_in_a_thread_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full segment is synced before its successor is written (a power cut
    must leave a lost tail, never a hole). Most of that sync runs ahead, in a
    thread of its own, every few hundred KiB, while appends go on without
    waiting for it; the sync at the switch then has little left to write.
    Before, the log call that filled a segment waited for the whole
    segment's sync (10-40 ms on 4 MiB: the backlog benchmark's worst call).
    One thread makes every sync ahead of the journal: starting one for each
    cost the call that asked ~1.5 ms on a loaded machine."""
    real = os.fdatasync
    gate = threading.Event()
    ahead: list[int] = []

    def fdatasync(fd: int) -> None:
        if threading.current_thread().name.startswith("primeruns-spool-sync-"):
            ahead.append(threading.get_ident())
            assert gate.wait(30)  # a slow disk
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(spool, "SEGMENT_MAX", 8_000)
    monkeypatch.setattr(spool, "_AHEAD_STEP", 2_000)
    with Journal.create(tmp_path, local_id="run") as j:
        try:
            j.hand_over_moving()  # nothing absorbs or deletes segments here
            for n in range(3):  # ~3 KB: past a step
                j.append(EntryKind.EPISODE, [_episode(n)])
            wait_for(lambda: ahead, timeout=15, what="a sync ahead")
            for n in range(3, 6):  # short of a full segment
                j.append(EntryKind.EPISODE, [_episode(n)])
            # Appends went on while the sync ahead was held up by the disk.
            assert len(ahead) == 1
            gate.set()
            n = 6
            # The switches to successors, and their own syncs ahead (where a
            # switch comes depends on how far its sync ahead got: ``_goes_on``).
            while len(list_segments(j.path)) < 3:
                j.append(EntryKind.EPISODE, [_episode(n)])
                n += 1
            # Past a step of the newest: a switch may have made (and so
            # dropped) the syncs ahead asked before it, this one none does.
            for _ in range(3):
                j.append(EntryKind.EPISODE, [_episode(n)])
                n += 1
            wait_for(lambda: len(ahead) >= 2, timeout=15, what="the syncs ahead")
            assert len(set(ahead)) == 1  # one thread made them all
            # (a full segment goes on while its sync waits for the GIL: n may pass 100)
            entries = j.read(0, max_entries=10_000).entries
            assert [e.seq for e in entries] == list(range(1, n + 1))
        finally:
            gate.set()
    assert not _spool_sync_threads()  # it ends with the journal


def test_no_log_call_starts_the_thread_that_syncs_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spool's syncer thread is started by the journal's background sync
    at its first write, not by the log call whose append first asks for a
    sync ahead. A thread's start waits for the new thread to take the GIL:
    in an evaluation's first seconds, with its uplink's threads shipping
    beside the loop, that call took 3 ms where the others took 0.5, the
    slowest log call of those seconds (``tools/bench/eval_loop.py``)."""
    real = spoolsync.start_daemon
    started_by: list[str] = []
    started = threading.Event()

    def start_daemon(*args: Any, **kwargs: Any) -> threading.Thread:
        started_by.append(threading.current_thread().name)
        started.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(spoolsync, "start_daemon", start_daemon)
    monkeypatch.setattr(spool, "_AHEAD_STEP", 2_000)
    with Journal.create(tmp_path, local_id="run") as j:
        j.hand_over_moving()  # nothing absorbs or deletes segments here
        j.append(EntryKind.EPISODE, [_episode(0)])
        assert started.wait(15), "the syncer's thread was not started at the first write"
        for n in range(1, 6):  # ~5 KB: past two steps, each asking for a sync ahead
            j.append(EntryKind.EPISODE, [_episode(n)])
        assert len(started_by) == 1
        assert started_by[0].startswith("primeruns-journal-")  # the background sync
    assert not _spool_sync_threads()  # it ends with the journal


def test_a_switch_after_a_pause_of_the_loop_waits_for_no_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write that fills a segment has all of it synced ahead; a loop that
    does some work before its next log call finds that sync done, and the
    call that starts the successor makes none of its own (it made one of up
    to 512 KiB before: a training loop's p99 log call)."""
    monkeypatch.setattr(spool, "SEGMENT_MAX", 8_000)
    syncs = _syncs_by_thread(monkeypatch)
    with Journal.create(tmp_path, local_id="run") as j:
        j.hand_over_moving()  # nothing absorbs or deletes segments here
        assert j._appender is not None
        writer = j._appender._spool
        n = 0
        while len(list_segments(j.path)) < 2:
            n += 1
            j.append(EntryKind.EPISODE, [_episode(n)])
            if writer._size >= 8_000:  # full: the loop's work lets its sync ahead end
                wait_for(
                    lambda: writer._syncer.synced(writer._segment) >= writer._size,
                    timeout=15,
                    what="the sync ahead of the full segment",
                )
        assert syncs and "MainThread" not in syncs  # the switch's call synced nothing itself
        assert [e.seq for e in j.read(0, max_entries=100).entries] == list(range(1, n + 1))


def _held_syncs_ahead(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], threading.Event]:
    """Each ``fdatasync`` from now on, by the name of the thread that made
    it; the spool's syncer thread's are held up (a slow disk) until the
    event is set."""
    real = os.fdatasync
    gate = threading.Event()
    syncs: list[str] = []

    def fdatasync(fd: int) -> None:
        syncs.append(threading.current_thread().name)
        if threading.current_thread().name.startswith("primeruns-spool-sync-"):
            assert gate.wait(30)  # a slow disk: the sync ahead is not done yet
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return syncs, gate


def test_a_call_right_after_the_one_that_filled_a_segment_waits_for_no_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training step logs its episodes, then a metrics row a moment later:
    when the episodes filled a segment, the row's call found the sync ahead
    of it still running, and made the whole sync itself (1-8 ms on a loaded
    host, at every switch of ``tools/bench/uplink_loop.py``'s loop). It goes
    on in the full segment instead, and the switch comes at a later call,
    once all of the segment is on disk: never before, or a power cut could
    leave a hole."""
    syncs, gate = _held_syncs_ahead(monkeypatch)
    monkeypatch.setattr(spool, "SEGMENT_MAX", 8_000)
    with Journal.create(tmp_path, local_id="run") as j:
        try:
            j.hand_over_moving()  # nothing absorbs or deletes segments here
            assert j._appender is not None
            writer = j._appender._spool
            n = 0
            while writer._size < 8_000:  # the step's episodes fill the segment
                n += 1
                j.append(EntryKind.EPISODE, [_episode(n)])
            n += 1
            j.append(EntryKind.METRICS, [b'{"step": 1, "loss": 0.5}'])  # the row, at once
            assert "MainThread" not in syncs
            assert len(list_segments(j.path)) == 1  # no successor before the sync
            gate.set()  # the loop's next work: the syncs ahead end
            wait_for(
                lambda: writer._syncer.synced(writer._segment) >= writer._size,
                timeout=15,
                what="the sync of all of the full segment",
            )
            n += 1
            j.append(EntryKind.EPISODE, [_episode(n)])  # the next step's: the successor
            assert len(list_segments(j.path)) == 2
            assert "MainThread" not in syncs
            assert [e.seq for e in j.read(0, max_entries=100).entries] == list(range(1, n + 1))
        finally:
            gate.set()


@contextlib.contextmanager
def _syncing_at_full_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Journal, spool.SpoolWriter]]:
    """A journal of 8,000-byte segments, synced ahead only once full, whose
    segments nothing absorbs or deletes: (it, its spool's writer)."""
    monkeypatch.setattr(spool, "SEGMENT_MAX", 8_000)
    monkeypatch.setattr(spool, "_AHEAD_STEP", 1 << 30)  # no syncs ahead but at full
    with Journal.create(tmp_path, local_id="run") as j:
        j.hand_over_moving()
        assert j._appender is not None
        yield j, j._appender._spool


def test_a_burst_while_a_full_segments_first_sync_runs_makes_no_sync_on_the_loops_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst's writes go on in a full segment while the sync asked for
    when it filled runs (a slow disk), up to twice full. Capped at an eighth
    past full, the write that reached the cap made an ``fdatasync`` itself
    at the switch, which ended only after that first sync (11-71 ms in the
    backlog benchmark's loop on a busy disk). Still no byte of the successor is
    written before all of the full segment is on disk: the first write
    after the first sync ended waits for the one the writes past full
    asked for."""
    syncs, gate = _held_syncs_ahead(monkeypatch)
    with _syncing_at_full_only(tmp_path, monkeypatch) as (j, writer):
        try:
            n = 0
            # On to half past full (the cap was an eighth past it), or to a switch.
            while writer._size < 12_000 and len(list_segments(j.path)) < 2:
                n += 1
                j.append(EntryKind.EPISODE, [_episode(n)])
            assert "MainThread" not in syncs
            assert len(list_segments(j.path)) == 1  # no successor before the sync
            gate.set()
            full, segment, filled = writer._size, writer._segment, writer._filled
            wait_for(lambda: writer._syncer.tried(segment) >= filled, 15, "the first sync's end")
            n += 1
            j.append(EntryKind.EPISODE, [_episode(n)])  # the successor
            assert len(list_segments(j.path)) == 2
            assert writer._syncer.synced(segment) >= full  # all of it, before the successor
            assert "MainThread" not in syncs
            assert [e.seq for e in j.read(0, max_entries=100).entries] == list(range(1, n + 1))
        finally:
            gate.set()


def test_a_switch_in_a_burst_syncs_what_is_left_before_the_successor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a burst the sync ahead of a full segment may not be done when a
    call starts its successor (once the segment went on to twice full):
    that call syncs what is left itself, so no byte of the successor
    can reach the disk before the full segment's."""
    syncs, gate = _held_syncs_ahead(monkeypatch)
    monkeypatch.setattr(spool, "SEGMENT_MAX", 8_000)
    monkeypatch.setattr(spool, "_AHEAD_STEP", 1 << 30)
    with Journal.create(tmp_path, local_id="run") as j:
        try:
            j.hand_over_moving()
            n = 0
            while len(list_segments(j.path)) < 2:
                n += 1
                j.append(EntryKind.EPISODE, [_episode(n)])
            assert syncs.count("MainThread") == 1  # at the switch, the full segment
            gate.set()
            assert j._appender is not None
            syncer = j._appender._spool._syncer
            wait_for(lambda: syncer._busy is None, timeout=15, what="the sync ahead's end")
            # What the writes past full asked for and was not begun was
            # dropped: the switch's covered it (at most the sync ahead begun).
            assert len([name for name in syncs if name.startswith("primeruns-spool-sync-")]) <= 1
        finally:
            gate.set()


def test_a_burst_through_a_switch_syncs_the_full_segment_twice_in_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes go on in a full segment only while the sync asked for when it
    filled runs; the first write after that sync ended starts the successor,
    waiting for the one the writes past full asked for (never making one
    itself). A burst so costs two syncs of a segment, as when the switch
    made its own: going on after each sync kept the spool's thread syncing
    back to back (184-687 syncs for 150,000 rows where 28 were made)."""
    real = os.fdatasync
    first = threading.Event()
    syncs: list[str] = []

    def fdatasync(fd: int) -> None:
        name = threading.current_thread().name
        if name == "MainThread" or name.startswith("primeruns-spool-sync-"):
            syncs.append(name)  # (not the background sync's, once a second)
        if syncs == ["primeruns-spool-sync-run"] and name == syncs[0]:
            assert first.wait(30)  # a slow disk: the sync of the full segment runs on
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with _syncing_at_full_only(tmp_path, monkeypatch) as (j, writer):
        try:
            n = 0
            while writer._size < 8_000:
                n += 1
                j.append(EntryKind.EPISODE, [_episode(n)])
            wait_for(lambda: syncs, timeout=15, what="the sync of the full segment")
            for _ in range(3):  # rows while it runs: on in the full segment
                n += 1
                j.append(EntryKind.METRICS, [b'{"step": 1, "loss": 0.5}'])
            assert len(list_segments(j.path)) == 1
            first.set()
            filled = writer._filled
            wait_for(lambda: writer._syncer.tried(writer._segment) >= filled, 15, "its end")
            n += 1
            j.append(EntryKind.EPISODE, [_episode(n)])  # the successor, at once
            assert len(list_segments(j.path)) == 2
            assert "MainThread" not in syncs
            assert len(syncs) == 2  # the sync at full, and the one the rows asked for
            assert [e.seq for e in j.read(0, max_entries=100).entries] == list(range(1, n + 1))
        finally:
            first.set()


_LOGGING_TO_THE_RUN = textwrap.dedent(
    """
    import errno, json, logging, os, sys, threading, time
    from pathlib import Path
    from primeruns.journal import EntryKind, Journal, spool
    spool.SEGMENT_MAX = 8_000
    spool._AHEAD_STEP = 1 << 30  # no syncs ahead but at full
    failing = int(sys.argv[2])  # which sync of the full segment fails
    raising = sys.argv[3] == "raising"  # the handler raises (a bug of its own)
    real = os.fdatasync
    gates = [threading.Event(), threading.Event()]
    if failing == 1:
        gates[1].set()
    count = [0]
    def fdatasync(fd):
        if threading.current_thread().name.startswith("primeruns-spool-sync-"):
            count[0] += 1
            n = count[0]
            if n <= 2:
                assert gates[n - 1].wait(60)  # a slow disk
            if n == failing:
                raise OSError(errno.EIO, "Input/output error")
        real(fd)
    j = Journal.create(Path(sys.argv[1]), local_id="run")
    j.hand_over_moving()
    class ToRun(logging.Handler):  # the program's: its warnings logged to the run
        def emit(self, record):
            if raising:
                raise RuntimeError("a handler's own bug")
            j.append(EntryKind.METRICS, [json.dumps({"log": record.getMessage()}).encode()])
    logging.getLogger("primeruns.journal").addHandler(ToRun())
    w = j._appender._spool
    n = 0
    while w._size < 8_000:
        n += 1
        j.append(EntryKind.EPISODE, [json.dumps({"n": n, "pad": "x" * 900}).encode()])
    os.fdatasync = fdatasync
    j.append(EntryKind.METRICS, [b'{"row": 1}'])  # asks the sync of the full segment
    filled = w._filled
    while w._syncer._busy is None:  # that sync begun, held by the disk
        time.sleep(0.001)
    j.append(EntryKind.METRICS, [b'{"row": 2}'])  # goes on, asking for a sync of all
    assert w._segment == 1 and w._size > filled
    gates[0].set()
    while w._syncer.tried(1) < filled:
        time.sleep(0.001)
    main = threading.main_thread().ident
    def waiting():
        frame = sys._current_frames().get(main)
        while frame is not None:
            if frame.f_code.co_name == "await_sync":
                return True
            frame = frame.f_back
        return False
    def release():  # the second sync fails once the switch waits for it
        while not waiting():
            time.sleep(0.001)
        gates[1].set()
    threading.Thread(target=release, daemon=True).start()
    j.append(EntryKind.EPISODE, [b'{"next": 1}'])  # the switch
    assert w._segment == 2
    def warned():
        got = j.read(0, max_entries=1000).entries
        return [e for e in got if b"sync failed" in e.payload]
    while not (raising or warned()):
        time.sleep(0.001)
    os.fdatasync = real
    j.append(EntryKind.EPISODE, [b'{"last": 1}'])
    assert w._syncer._thread.is_alive()  # it syncs on
    print(len(j.read(0, max_entries=1000).entries))
    j.close()
    """
)


@pytest.mark.parametrize(
    ("failing", "handler"),
    [(1, "logging"), (2, "logging"), (1, "raising")],
    ids=["at-full", "past-full", "at-full-raising"],
)
def test_a_failed_sync_warned_to_a_handler_that_logs_to_the_run_hangs_no_call(
    tmp_path: Path, failing: int, handler: str
) -> None:
    """The program logs warnings to the run (a logging handler whose ``emit``
    logs a record). The spool thread's sync of a full segment fails while
    a call starts the successor, waiting for that sync under the append
    lock (``SegmentSyncer.await_sync``): the thread's warning, logged before
    it told that call the sync had ended, waited for the lock in the
    handler, and the call for the thread, for good. And a request not yet
    begun is not waited for while the thread warns (the handler's own
    record may start the successor, from that thread: at-full). A handler
    that raises (a bug of its own) ended the thread, and the switch waited
    for good for the sync asked for past full, which no thread would make."""
    proc = subprocess.run(
        [sys.executable, "-c", _LOGGING_TO_THE_RUN, str(tmp_path / "run"), str(failing), handler],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    # The episodes that filled the segment, the two rows, the switch's, the
    # warning (logged to the run), the last one.
    assert int(proc.stdout) >= (14 if handler == "logging" else 13)


def test_segments_the_mover_deleted_are_closed_off_the_log_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last descriptor of a deleted segment frees its blocks when closed,
    which takes milliseconds: the appender's own descriptors of segments its
    uplink absorbed are closed by the spool's thread, not by the log call
    that starts a segment."""
    monkeypatch.setattr(spool, "SEGMENT_MAX", 8_000)
    monkeypatch.setattr(spool, "_GO_ON_SHARE", 8)  # an eighth past full, as the appends assume
    real = os.close
    closed_by: dict[int, str] = {}

    def close(fd: int) -> None:
        closed_by[fd] = threading.current_thread().name
        real(fd)

    with Journal.create(tmp_path, local_id="run") as j:
        j.hand_over_moving()  # as in a live run: another process moves
        mover = Journal.open(j.path, lock_fd=os.dup(j.share_lock()))
        try:
            for n in range(12):  # two segments
                j.append(EntryKind.EPISODE, [_episode(n)])
            assert len(list_segments(j.path)) == 2
            mover.take_over_moving()
            wait_for(lambda: len(list_segments(j.path)) == 1, 15, "the first segment moved")
            own = {seg.fd for seg in j._spool._segments.values()}
            monkeypatch.setattr(os, "close", close)
            for n in range(12, 24):  # the next switch lets go of the deleted one
                j.append(EntryKind.EPISODE, [_episode(n)])
            wait_for(lambda: own & closed_by.keys(), 15, "the deleted segment's close")
            assert all(closed_by[fd] != "MainThread" for fd in own & closed_by.keys())
        finally:
            monkeypatch.undo()
            mover.close()


def test_bytes_past_damage_full_of_the_magic_are_read_in_linear_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past damage in the newest segment, the next append is found by its
    magic, two bytes, which a crafted (or merely unlucky) segment may hold
    every two bytes: each look read up to 1 MiB from where it stood, so 40 KB
    of them read 400 MB, and a 4 MiB segment terabytes, for one ``show`` or
    ``sync``. The damage is still counted as before."""
    segment, data, starts = _ten_calls_spooled(tmp_path)
    data[starts[3]] ^= 0xFF  # the magic of the fourth call's append
    segment.write_bytes(bytes(data) + b"PS" * 20_000)
    size = segment.stat().st_size
    damaged, read = _damage_and_bytes(segment, monkeypatch)
    assert damaged == [(10, 22)]
    assert read < 1_000 * size, f"{read} bytes read of a {size}-byte segment"


def _false_appends_chained(room: int) -> bytes:
    """False appends, each with one frame header after it whose payload is
    the next one's header: from each, frames chain on to the end, as many
    as its header says, and end a byte short of where its length says."""
    n = room // 28
    frame = struct.pack("<BBBBII", 2, int(EntryKind.EPISODE), 0, 0, APPEND.size, 0)
    return b"".join(APPEND.pack(b"PS", 1, n - k, 28 * (n - k) - 17) + frame for k in range(n))


def _damaged_runs_and_appends(units: int) -> bytes:
    """Bytes no header can be read from, each run followed by a whole
    append of one entry whose checksum fails."""
    frame = bytearray(encode_frame(int(EntryKind.EPISODE), b'{"x":1}', compress=False, seq=1))
    frame[-1] ^= 1
    return (b"\xee" * 100 + APPEND.pack(b"PS", 1, 1, len(frame)) + bytes(frame)) * units


@pytest.mark.parametrize("craft", ["magic", "chained", "unplaced"])
def test_a_crafted_segment_past_damage_costs_work_linear_in_its_size(
    craft: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every process that opens a journal (the uplink, ``ls``, ``sync``)
    counts what damage in its newest segment cost, and a journal may be
    crafted. Past the damage, each two-byte magic was a read of its own
    (a 4 MiB segment of them: 2.2 s); a false append whose frames chain
    over the ones after it was walked to the end from each (64 KB: 1.8 s,
    4 MiB: hours); and each whole append whose first entry is damaged was
    placed by trying every seq the damage before it could hold (64 KB:
    a million checksums). The same entries are counted, for work that
    grows with the segment's bytes alone."""
    segment, data, starts = _ten_calls_spooled(tmp_path)
    data[starts[3]] ^= 0xFF  # the magic of the fourth call's append
    room = 64 << 10
    crafted, lost = {
        "magic": (b"PS" * (room // 2), 31 - 10 + 1),  # (one damaged run)
        "chained": (_false_appends_chained(room), 31 - 10 + room // 28),
        "unplaced": (_damaged_runs_and_appends(room // 135), 31 - 10 + 2 * (room // 135)),
    }[craft]
    segment.write_bytes(bytes(data) + crafted)
    size = segment.stat().st_size
    work = {"read": 0, "reads": 0, "headers": 0, "checksums": 0}
    real_pread, real_peek, real_crc = os.pread, spool.peek_header, spool.checksum.crc32

    def pread(fd: int, length: int, offset: int) -> bytes:
        out = real_pread(fd, length, offset)
        work["read"] += len(out)
        work["reads"] += 1
        return out

    def peek_header(data: bytes) -> Any:
        work["headers"] += 1
        return real_peek(data)

    def crc32(data: bytes, value: int = 0) -> int:
        work["checksums"] += 1
        return real_crc(data, value)

    monkeypatch.setattr(spool.os, "pread", pread)
    monkeypatch.setattr(spool, "peek_header", peek_header)
    monkeypatch.setattr(spool, "checksum", types.SimpleNamespace(crc32=crc32))
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
    assert [(d.seq, d.entries) for d in got.damaged] == [(10, lost)]
    # Bytes read a few times over at most, and twice the frame headers its
    # bytes may hold, and some: 10 to 100,000 times more, before.
    assert work["read"] < 8 * size, work
    assert work["reads"] < size // 16, work
    assert work["headers"] < 3 * size // HEADER_SIZE, work
    assert work["checksums"] < size // 16, work


@settings(max_examples=100, deadline=None)
@given(
    payload=st.binary(max_size=64),
    seq=st.integers(0, (1 << 64) - 1),
    below=st.integers(0, 300),
    above=st.integers(0, 300),
    wide=st.integers(0, 1 << 40),
)
def test_an_entry_is_placed_at_the_seq_its_checksum_covers(
    payload: bytes, seq: int, below: int, above: int, wide: int
) -> None:
    """Past damage, an append is placed by the seq its first entry checks
    out under: the first of a range, as trying each seq of it finds it."""
    frame = encode_frame(int(EntryKind.EPISODE), payload, compress=False, seq=seq)
    head, body = frame[:HEADER_SIZE], frame[HEADER_SIZE:]

    def checks_out(n: int) -> bool:
        crc = zlib.crc32(n.to_bytes(8, "big"), zlib.crc32(body, zlib.crc32(head[:8])))
        return crc == int.from_bytes(head[8:], "little")

    fd, name = tempfile.mkstemp()
    try:
        os.write(fd, b"x" + frame)
        lo, hi = max(0, seq - below), min(seq + above, (1 << 64) - 1)
        tried = next((n for n in range(lo, hi + 1) if checks_out(n)), None)
        assert spool._seq_by_checksum(fd, 1, len(frame), lo, hi) == tried == seq
        if seq > below:
            assert spool._seq_by_checksum(fd, 1, len(frame), lo - 1, seq - 1) is None
        found = spool._seq_by_checksum(fd, 1, len(frame), max(0, seq - wide), seq)
        assert found is not None and found <= seq and checks_out(found)
    finally:
        os.close(fd)
        os.unlink(name)


@pytest.mark.parametrize("cut", ["first entry whole", "all of it cut"])
def test_zeros_over_several_appends_count_what_the_append_after_them_proves(
    cut: str, tmp_path: Path
) -> None:
    """Zeros where several appends were (pages that never reached the disk),
    then the append a death cut short at the end: no whole append after
    them to place, and the zeros say nothing of how many calls they held.
    They were counted as one entry lost, for 21 a sink never gets; the
    append cut short, where its first entry is whole, says by its checksum
    the seq it was to have, and every one before it returned. Where it says
    nothing, the zeros still count as one call's: all that is known."""
    segment, data, starts = _ten_calls_spooled(tmp_path)
    data[starts[3] :] = bytes(len(data) - starts[3])  # calls 4 to 10, zeros
    frames = [
        encode_frame(int(EntryKind.EPISODE), b'{"n":"cut%d"}' % n, compress=False, seq=31 + n)
        for n in range(2)
    ]
    whole = APPEND.pack(b"PS", 1, 2, sum(map(len, frames))) + b"".join(frames)
    segment.write_bytes(bytes(data) + whole[: -5 if cut == "first entry whole" else 20])
    lost = 21 if cut == "first entry whole" else 1
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
        assert [e.seq for e in got.entries] == list(range(1, 10))
        assert [(d.seq, d.entries) for d in got.damaged] == [(10, lost)]
        assert reader.damaged_end() == 9 + lost


def test_a_chain_of_damaged_appends_is_looked_at_in_linear_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Damaged appends (a magic no append has) whose headers fit their
    lengths, each landing on the next: the scan follows them by their
    lengths, and yet looked for the next append's start after each, to the
    segment's end where there is none (64 KB of them: 150 MB looked at; 4
    MiB: minutes per process that opened the journal). Where a header's
    length says where the next one starts, nothing is looked for."""
    segment, data, starts = _ten_calls_spooled(tmp_path)
    data[starts[3]] ^= 0xFF  # the magic of the fourth call's append
    unit = APPEND.pack(b"XX", 1, 1, HEADER_SIZE) + bytes(HEADER_SIZE)
    units = (64 << 10) // len(unit)
    segment.write_bytes(bytes(data) + unit * units)
    size = segment.stat().st_size
    damaged, looked = _damage_and_bytes(segment, monkeypatch, (spool, "_read"))
    assert damaged == [(10, 31 - 10 + units)]
    assert looked < 8 * size, f"{looked} bytes looked at of a {size}-byte segment"


def _false_appends_over_frames_far_apart(appends: int, frames: int) -> bytes:
    """False appends, each with a first frame whose payload reaches the
    same frames, each further from the one before than a scan's window
    reads: every one walks them all, and each a read of its own."""
    gap = spool._WINDOW + 1
    chain = struct.pack("<BBBBII", 2, int(EntryKind.EPISODE), 0, 0, gap, 0) + bytes(gap)
    out = b""
    for i in range(appends):
        first = 28 * (appends - i) - 28  # payload bytes to the first of them
        length = HEADER_SIZE + first + frames * len(chain) - 1  # a byte short
        frame = struct.pack("<BBBBII", 2, int(EntryKind.EPISODE), 0, 0, first, 0)
        out += APPEND.pack(b"PS", 1, frames + 1, length) + frame
    return out + chain * frames


def test_frames_far_apart_under_many_false_appends_are_read_in_linear_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frame headers further apart than a scan's window reads, reached
    from each of many false appends: the headers each one walks are few,
    but each was a read of a whole window (a 4 MiB segment: 40 GB read,
    3 s per process that opened the journal). What a scan reads is
    bounded by its bytes too; the same entries are counted."""
    segment, data, starts = _ten_calls_spooled(tmp_path)
    data[starts[3]] ^= 0xFF  # the magic of the fourth call's append
    segment.write_bytes(bytes(data) + _false_appends_over_frames_far_apart(1000, 8))
    size = segment.stat().st_size
    damaged, read = _damage_and_bytes(segment, monkeypatch)
    # (the first false append says 9 entries, where no whole one follows)
    assert damaged == [(10, 31 - 10 + 9)]
    assert read < 8 * size, f"{read} bytes read of a {size}-byte segment"


def test_a_damaged_length_past_the_first_damage_does_not_end_the_count(tmp_path: Path) -> None:
    """Past the damage that ended the parse, an append whose length was
    damaged to run past the segment's end, with whole appends after it:
    the count took it for the append a death cut short at the end, and
    stopped there (9 entries counted for 21 a sink never gets). As the
    parse does, whole appends after it say its length is damage."""
    segment, data, starts = _ten_calls_spooled(tmp_path)
    data[starts[3]] ^= 0xFF  # the magic of the fourth call's append
    data[starts[6] + 10] ^= 0x40  # the seventh's length: 4 MiB more
    segment.write_bytes(bytes(data))
    with Journal.open(segment.parent, owner=False) as reader:
        got = reader.read(0, max_entries=100)
        assert [e.seq for e in got.entries] == list(range(1, 10))
        assert [(d.seq, d.entries) for d in got.damaged] == [(10, 21)]
        assert reader.damaged_end() == 30


def test_a_segment_whose_entries_run_past_any_seq_never_takes_a_reader_down(
    tmp_path: Path,
) -> None:
    """A journal is untrusted input: a segment named two seqs short of the
    last a u64 holds, with an append of three entries, put its third at a
    seq no key (nor checksum) is written for. A read raised struct.error
    (the seq packed for its checksum), and so did an owner's ``damage()``
    and ``close()`` (the mover, its LMDB key). An append whose seqs pass
    the last a key may hold is damage; none of its entries is taken."""
    segment, records = _spooled_journal(tmp_path, 3)
    first = (1 << 64) - 2
    frames = [
        encode_frame(int(EntryKind.EPISODE), b'{"n":%d}' % n, compress=False, seq=seq)
        for n, seq in enumerate([first, first + 1, 0])
    ]
    crafted = segment.parent / spool.segment_name(first)
    crafted.write_bytes(APPEND.pack(b"PS", 1, 3, sum(map(len, frames))) + b"".join(frames))
    with Journal.open(segment.parent, owner=False) as reader:
        assert [e.payload for e in reader.read(0, max_entries=100).entries] == records
        assert reader.read(first - 1, max_entries=100).entries == []
    with Journal.open(segment.parent) as owner:
        owner.damage()
        assert [e.payload for e in owner.read(0, max_entries=100).entries] == records


@pytest.mark.parametrize("proof", ["acknowledged", "in flight", "damage counted at the end"])
def test_an_owner_after_a_power_cut_at_the_spools_end_never_reuses_a_seq_stored_state_names(
    proof: str, tmp_path: Path
) -> None:
    """A power cut left zeros where the newest segment's last appends were
    (entries 10 to 30), while LMDB kept what refers to them: a sink's
    offset, its batch in flight, or the entries that damage cost the end
    (proved by an append cut short after the zeros). The next owner
    appended from entry 10 again: a sink whose offset or batch covers them
    never shipped the new entries, and a reader took new entries for the
    lost ones. Its appends start after them; the gap is reported missing,
    and counted by a sink that had not shipped it."""
    j = Journal.create(tmp_path, local_id="run")
    j._mover.stop()
    for n in range(10):
        j.append(EntryKind.EPISODE, [b'{"n":%d}' % (3 * n + k) for k in range(3)])
    if proof == "acknowledged":
        j.ack("traces", 30)
    elif proof == "in flight":
        j.set_inflight("traces", InFlight(25, 30, b"[25, 30]", {}))
    segment, data, starts = killed_segment(j)
    data[starts[3] :] = bytes(len(data) - starts[3])  # calls 4 to 10: zeros
    if proof == "damage counted at the end":  # its first entry whole: it was to be 31
        cut = [
            encode_frame(int(EntryKind.EPISODE), b'{"n":"cut%d"}' % n, compress=False, seq=31 + n)
            for n in range(2)
        ]
        data += (APPEND.pack(b"PS", 1, 2, sum(map(len, cut))) + b"".join(cut))[:-5]
    segment.write_bytes(bytes(data))
    with Journal.open(segment.parent) as owner:
        assert owner.append(EntryKind.EPISODE, [b'{"n":"new"}']).first_seq == 31
        assert [e.payload for e in owner.read(30).entries] == [b'{"n":"new"}']
        behind = owner.read(9)
        assert [e.seq for e in behind.entries] == [31]
        assert [(d.seq, d.entries) for d in behind.damaged] == [(10, 21)]
    with Journal.open(segment.parent, owner=False) as reader:
        assert reader.last_seq() == 31
        assert [e.seq for e in reader.read(0, max_entries=100).entries] == [*range(1, 10), 31]


@pytest.mark.parametrize("seq", [1 << 62, (1 << 63) - 1], ids=["2**62", "2**63-1"])
@pytest.mark.parametrize("where", ["acknowledged", "in flight", "damage counted"])
def test_a_seq_no_spool_could_have_held_is_damage_not_entries_a_new_owner_skips(
    where: str, seq: int, tmp_path: Path
) -> None:
    """A journal is untrusted input (a copy from another host, a bit flip):
    its stored state may name a seq far past anything ever appended. The
    next owner took it for entries lost at the spool's end and appended
    after it: every other sink counted 2**62 entries lost, and past the
    last seq a key holds (2**63-1) an append returned with its entry where
    no reader sees it, and every later owner was refused appends. Only
    seqs the spool could have held are skipped."""
    j = Journal.create(tmp_path, local_id="run")
    j.append(EntryKind.EPISODE, [b'{"n":1}', b'{"n":2}', b'{"n":3}'])
    if where == "acknowledged":
        j._tx.write(lambda txn: j._cursors._put(txn, "traces", {"acked": seq, "inflight": None}))
    elif where == "in flight":
        j.set_inflight("traces", InFlight(1, seq, b"[1]", {}))
    else:
        j.record_loss("traces", 1, "damaged", damaged_through=seq)
    path = j.path
    j.close()
    for new in (4, 5):
        with Journal.open(path) as owner:
            assert owner.append(EntryKind.EPISODE, [b'{"n":"new"}']).first_seq == new
    with Journal.open(path, owner=False) as reader:
        read = reader.read(0, max_entries=100)
        assert [e.seq for e in read.entries] == [1, 2, 3, 4, 5] and read.damaged == []


def test_entries_a_new_owner_skips_are_said_lost_once_not_by_every_owner_until_an_append(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each owner until an append lands works the skip out again (each
    replay of a run whose platform is down): the warning is the first's."""
    path = acked_then_cut(tmp_path)
    with caplog.at_level(logging.WARNING, logger="primeruns.journal"):
        for _ in range(3):
            Journal.open(path).close()
        with Journal.open(path) as owner:
            assert owner.append(EntryKind.EPISODE, [b'{"n":"new"}']).first_seq == 11
    said = [r.getMessage() for r in caplog.records if "are lost" in r.getMessage()]
    assert len(said) == 1 and "entries 4 to 10" in said[0]


def _lines(function: Any) -> list[int]:
    return sorted({line for _, line in dis.findlinestarts(function.__code__) if line})


# Every line of the producer's append, in the functions that write the spool
# and note what it wrote.
_APPEND_LINES = [
    (function, line)
    for function in (Appender.append, Appender._write, spool.SpoolWriter.write)
    for line in _lines(function)
]


@pytest.mark.parametrize(
    ("function", "line"), _APPEND_LINES, ids=[f"{f.__name__}:{n}" for f, n in _APPEND_LINES]
)
def test_an_append_interrupted_at_any_line_costs_no_later_entry(
    tmp_path: Path, function: Any, line: int
) -> None:
    """Ctrl-C's KeyboardInterrupt is raised in the main thread between any
    two lines: a loop that catches it and logs on must lose nothing after it."""
    code = function.__code__
    raised: list[bool] = []

    def local(frame: types.FrameType, event: str, arg: object) -> object:
        if event == "line" and frame.f_lineno == line and not raised:
            raised.append(True)
            raise KeyboardInterrupt
        return local

    def tracer(frame: types.FrameType, event: str, arg: object) -> object:
        return local if frame.f_code is code else None

    with Journal.create(tmp_path / "j", local_id="run") as j:
        j.append(EntryKind.RUN_OPEN, [b"{}"])
        sys.settrace(tracer)
        try:
            j.append(EntryKind.EPISODE, [b"a1", b"a2"])
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        j.append(EntryKind.EPISODE, [b"b1"])
        assert j.damage() == []
        payloads = [e.payload for e in j.read(0, kinds={EntryKind.EPISODE}).entries]
        assert payloads[-1] == b"b1" and payloads.count(b"b1") == 1
        assert payloads[:-1] in ([], [b"a1", b"a2"])  # the interrupted call: all or nothing


def test_a_disk_failing_every_fsync_append_sync_is_warned_of_once_a_spell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``durability="fsync"`` on a disk that fails every sync (EIO: a
    network file system gone bad): each log call warned, a line per record
    (1,000 lines for 1,000 calls). Now once, until a sync succeeds again;
    a later failure is warned of again."""
    real = os.fdatasync
    failing = [True]

    def fdatasync(fd: int) -> None:
        if failing[0]:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    with Journal.create(tmp_path, local_id="run", durability="fsync") as j:
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        with caplog.at_level(logging.WARNING, logger="primeruns.journal"):
            for spell in (True, False, True):
                failing[0] = spell
                for n in range(50):
                    assert j.append(EntryKind.EPISODE, [b'{"n":%d}' % n]).count == 1
        monkeypatch.undo()
    said = [r for r in caplog.records if "sync failed" in r.getMessage()]
    assert len(said) == 2
