"""The spool: appends land in files beside LMDB, and every reader sees one log.

What a user depends on: an append that returned survives the process's death
and is read, exactly once and in order, by every reader (the uplink, ``ls``,
``replay``) whether the mover has absorbed it into LMDB yet or not; a write
cut short by a death, or a damaged spool file, never costs another entry and
never takes a reader down.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind, Journal, spool, staging
from primeruns.journal.frames import encode_frame, encode_frames_off_gil
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
    records = [json.dumps({"n": n, "pad": "x" * 600}).encode() for n in range(3)]
    real = encode_frames_off_gil
    appended: list[int] = []

    def compress_while_appending(*args: Any, **kwargs: Any) -> list[bytes]:
        if not appended:
            appended.append(1)
            j.append(EntryKind.EPISODE, [records[1]])  # into the segment being absorbed
            j.append(EntryKind.EPISODE, [records[2]])  # past SEGMENT_MAX: a new segment
        return real(*args, **kwargs)

    monkeypatch.setattr(staging, "encode_frames_off_gil", compress_while_appending)
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()
        j.append(EntryKind.EPISODE, [records[0]])
        assert j._mover.absorb_some()
        assert len(list_segments(j.path)) == 2
        while j._mover.step():
            pass
        assert _payloads(j) == records
    assert list_segments(tmp_path / "run") == []
    with Journal.open(tmp_path / "run", owner=False) as reader:
        assert _payloads(reader) == records


def test_an_append_cut_short_by_a_death_is_not_part_of_the_log(tmp_path: Path) -> None:
    """Its call never returned: none of its entries is read (a call is in the
    log whole or not at all, which a requeued job resumes by), no damage is
    reported, and the next owner's appends follow the entries before it."""
    out = subprocess.run(
        [sys.executable, "-c", _DIE_MID_WRITE, str(tmp_path)], capture_output=True, timeout=60
    )
    assert out.returncode == -9, out.stderr.decode()
    path = tmp_path / "run"
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
