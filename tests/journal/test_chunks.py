"""Entries stored in chunks (see layout): values between LMDB's in-page limit and
16 KiB are split so they pack pages densely. They must read back exactly,
everywhere an entry is read, and damage to one chunk must cost only its entry."""

from __future__ import annotations

import json
import random
import shutil
import struct
from pathlib import Path

import lmdb
import pytest
from test_corruption import _probe

from primeruns.journal import EntryKind, Journal, frames, mover, reading
from primeruns.journal.frames import encode_frame
from primeruns.journal.layout import key, put_entry, split
from primeruns.journal.reading import UNREADABLE
from primeruns.journal.salvage import scan_pages
from primeruns.journal.spool import list_segments
from primeruns.journal.tail import stored_end

# Hex of random bytes compresses to about half: stored sizes from ~0.2 to ~30 KB,
# on both sides of every threshold.
SIZES = [100, 1_200, 1_300, 1_400, 2_000, 2_600, 5_000, 15_000, 16_500, 30_000, 60_000]


def _payload(i: int, size: int) -> bytes:
    return json.dumps({"i": i, "noise": random.Random(i).randbytes(size).hex()}).encode()


def _write(base: Path) -> list[bytes]:
    payloads = [_payload(i, size) for i, size in enumerate(SIZES * 3)]
    with Journal.create(base, local_id="run") as j:
        for i, p in enumerate(payloads):
            j.append(EntryKind.EPISODE if i % 2 else EntryKind.TRACE, [p])
    return payloads


def test_chunked_entries_read_back_everywhere(tmp_path: Path) -> None:
    payloads = _write(tmp_path)
    with Journal.open(tmp_path / "run") as j:
        assert [
            e.payload for e in j.read(0, max_entries=1000, max_bytes=1 << 30).entries
        ] == payloads
        episodes = j.read(0, kinds={EntryKind.EPISODE}, max_entries=1000, max_bytes=1 << 30)
        assert [e.payload for e in episodes.entries] == payloads[1::2]
        for seq in (1, 2, 6, 7, len(payloads)):
            entry = j.get(seq)
            assert entry is not None and entry.payload == payloads[seq - 1]
        assert j.last_seq() == len(payloads)
        # A read that stops early resumes on the next entry, never on a chunk.
        first = j.read(0, max_entries=3, max_bytes=1 << 30)
        rest = j.read(first.next_after, max_entries=1000, max_bytes=1 << 30)
        assert [e.payload for e in first.entries + rest.entries] == payloads
        assert j.damage() == []
        j.ack("traces", 10)
        j.ack("eval_samples", 12)
        assert j.compact() == 10  # entries, not their chunks
        assert [e.seq for e in j.read(0, max_entries=1000, max_bytes=1 << 30).entries] == list(
            range(11, len(payloads) + 1)
        )
        assert j.damage() == []


def test_damage_to_one_chunk_costs_only_its_entry(tmp_path: Path) -> None:
    payloads = _write(tmp_path)
    data = tmp_path / "run" / "data.mdb"
    env = lmdb.open(str(tmp_path / "run"), max_dbs=8, readonly=True, lock=False)
    with env.begin() as txn:  # entry 7's second chunk, as stored
        chunk = txn.get(struct.pack(">QH", 7, 1), db=env.open_db(b"entries", txn=txn))
    env.close()
    assert chunk is not None and len(chunk) > 100
    raw = bytearray(data.read_bytes())
    at = raw.find(chunk)
    assert at > 0
    # Every copy: a freed page may still hold an older one (copy-on-write),
    # and flipping only the first found then missed the live chunk.
    while at >= 0:
        raw[at + len(chunk) // 2] ^= 0x04
        at = raw.find(chunk, at + len(chunk))
    data.write_bytes(bytes(raw))
    result = _probe(tmp_path / "run", "reader")
    entries = result["entries"]
    assert isinstance(entries, dict)
    assert sorted(int(s) for s in entries) == [s for s in range(1, len(payloads) + 1) if s != 7]
    assert any(seq == 7 for seq, _ in result["damage"])  # type: ignore[union-attr]
    checked = result["checked"]  # by checksum, as show checks: the same
    assert isinstance(checked, dict) and any(seq == 7 for seq, _ in checked["damage"])
    assert checked["seqs"] == sorted(int(s) for s in entries)


@pytest.mark.parametrize("trial", range(6))
def test_truncated_file_salvages_chunked_entries(tmp_path: Path, trial: int) -> None:
    base = tmp_path / "pristine"
    payloads = _write(base)
    path = tmp_path / "run"
    shutil.copytree(base / "run", path)
    data = path / "data.mdb"
    raw = data.read_bytes()
    rng = random.Random(trial)
    data.write_bytes(raw[: rng.randrange(len(raw) // 3, len(raw))])
    result = _probe(path, "owner" if trial % 2 else "reader")
    if "error" in result:
        assert "journal" in str(result["error"])
        return
    entries = result["entries"]
    assert isinstance(entries, dict)
    for seq, text in entries.items():  # whatever comes back is exactly what was written
        assert text.encode() == payloads[int(seq) - 1]
    if len(entries) < len(payloads):
        assert result["damage"]


def test_spooled_entries_read_as_one_log_and_move_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends go to the spool uncompressed and are moved into LMDB later, a
    batch at a time; a reader sees one dense log wherever an entry is at the
    moment, and a closed journal has no spool left."""
    monkeypatch.setattr(mover, "_ABSORB_BATCH", 7)
    small = [json.dumps({"i": i}).encode() for i in range(5)]
    big = [_payload(i, 3_000) for i in range(40)]
    expected = small + big[:20] + small + big[20:]
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()  # hold the background mover: entries stay spooled
        j.append(EntryKind.METRICS, small)
        j.append(EntryKind.EPISODE, big[:20])
        j.append(EntryKind.METRICS, small)
        j.append(EntryKind.EPISODE, big[20:])
        assert list_segments(j.path) and j.size_bytes() > sum(map(len, expected))
        with j._tx.read() as txn:
            assert stored_end(j._tx, txn) == 0  # nothing in LMDB yet
        got = j.read(0, max_entries=1000, max_bytes=1 << 30)
        assert [e.payload for e in got.entries] == expected and not got.damaged
        assert j.get(len(expected)) is not None and j.get(len(expected) + 1) is None
        assert sum(j.tally()[0].values()) == len(expected)
        moves = 0
        while j._mover.step():  # what the background thread does
            moves += 1
            half = j.read(0, max_entries=30, max_bytes=1 << 30)  # across LMDB and spool
            rest = j.read(half.next_after, max_entries=1000, max_bytes=1 << 30)
            assert [e.payload for e in half.entries + rest.entries] == expected
        assert moves == -(-len(expected) // 7)
        with j._tx.read() as txn:
            assert stored_end(j._tx, txn) == len(expected)
        j.ack("traces", 10)
        assert j.compact() == 10
        assert [e.payload for e in j.read(10, max_entries=1000).entries] == expected[10:]
        assert j.damage() == []
    assert list_segments(tmp_path / "run") == []
    with Journal.open(tmp_path / "run", owner=False) as reader:
        assert [e.payload for e in reader.read(0, max_entries=1000).entries] == expected[10:]


def test_tally_counts_entries_not_chunks_across_cuts_and_compaction(tmp_path: Path) -> None:
    """What ``primeruns ls`` shows as episodes logged, and each sink's pending."""
    payloads = _write(tmp_path)
    n = len(payloads)
    kinds = [EntryKind.EPISODE if i % 2 else EntryKind.TRACE for i in range(n)]

    def expected(lo: int, hi: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for kind in kinds[lo:hi]:
            out[int(kind)] = out.get(int(kind), 0) + 1
        return out

    with Journal.open(tmp_path / "run") as j:
        assert [dict(c) for c in j.tally()] == [expected(0, n)]
        assert [dict(c) for c in j.tally([7, 20])] == [
            expected(0, 7),
            expected(7, 20),
            expected(20, n),
        ]
        j.ack("traces", 10)
        j.ack("eval_samples", 12)
        assert j.compact() == 10
        # Compacted entries still count as logged; what is left is as before.
        assert [dict(c) for c in j.tally([12])] == [expected(0, 12), expected(12, n)]
    # A damaged entry is counted as unreadable: still there, and shipped by nobody.
    _damage_head(tmp_path / "run", 15)
    with Journal.open(tmp_path / "run", owner=False) as j:
        [counts] = j.tally()
    total = expected(0, n)
    total[int(kinds[14])] -= 1
    total[UNREADABLE] = 1
    assert dict(counts) == total


def test_tally_past_an_offset_is_the_tally_after_it_and_reads_only_what_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a sink has left (every close-out asks, per sink) is counted from
    its offset on, not over the whole log: the same counts as the last
    interval of ``tally``, chunked entries, compaction and the spool's
    entries included, at the cost of the entries past the offset."""
    n = len(_write(tmp_path))
    with _with_three_spooled(tmp_path) as j:
        total = n + 3
        for after in (0, 1, 5, n - 1, n, n + 2, total, total + 5):
            assert j.tally_past(after) == j.tally([after])[-1], after
        j.ack("traces", 12)
        j.ack("eval_samples", 12)
        assert j.compact() == 12
        for after in (0, 5, 12, 13, n + 1, total):
            assert j.tally_past(after) == j.tally([after])[-1], after
        looked: list[int] = []
        monkeypatch.setattr(
            reading, "peek_kind", lambda value: looked.append(1) or frames.peek_kind(value)
        )
        j.tally_past(n - 1)
        assert len(looked) <= total - (n - 1)  # those past it LMDB holds, if any
        looked.clear()
        j.tally([n - 1])
        assert len(looked) >= n - 12  # every entry LMDB holds


def test_tallies_past_several_offsets_are_each_ones_tally_past_in_one_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finish counts what every sink has left: each offset's counts are
    ``tally_past``'s (repeated and unordered offsets, chunked entries, the
    spool's included), read in one scan of the entries past the lowest."""
    n = len(_write(tmp_path))
    with _with_three_spooled(tmp_path) as j:
        total = n + 3
        afters = [n - 1, 5, total, n - 1, 0, total + 5]
        assert j.tallies_past(afters) == [j.tally_past(after) for after in afters]
        assert j.tallies_past([]) == []
        looked: list[int] = []
        monkeypatch.setattr(
            reading, "peek_kind", lambda value: looked.append(1) or frames.peek_kind(value)
        )
        j.tallies_past([n - 1, 5, 7])
        assert len(looked) <= total - 5


def test_tally_of_a_range_is_the_tally_between_two_cuts_and_reads_only_the_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's entries (counted when its state is damaged) and a forked
    child's left up to its target (counted at each look while its parent
    finishes) are counted over their range alone: the same counts as the
    middle interval of ``tally``, chunked entries, compaction, the spool's
    entries and damaged ones included, at the cost of the range however
    long the log is past or before it."""
    n = len(_write(tmp_path))
    with _with_three_spooled(tmp_path) as j:
        total = n + 3
        ranges = [(a, b) for a in (0, 1, 5, n - 1, n, total) for b in (a + 1, a + 4, total + 2)]
        for after, upto in ranges:
            assert j.tally_range(after, upto) == j.tally([after, upto])[1], (after, upto)
        assert j.tally_range(7, 7) == {} and j.tally_range(7, 3) == {}
        j.ack("traces", 12)
        j.ack("eval_samples", 12)
        assert j.compact() == 12
        assert j.compacted() == j.tally()[0] - j.tally_range(0, total)
        for after, upto in [(0, 12), (0, 15), (5, 14), (12, 13), (n - 2, n + 2), (0, total)]:
            assert j.tally_range(after, upto) == j.tally([after, upto])[1], (after, upto)
        looked: list[int] = []
        monkeypatch.setattr(
            reading, "peek_kind", lambda value: looked.append(1) or frames.peek_kind(value)
        )
        j.tally_range(14, 18)
        assert len(looked) <= 4
        looked.clear()
        j.tally([14, 18])
        assert len(looked) >= n - 12  # every entry LMDB holds
    # A damaged entry of the range counts as unreadable, as in ``tally``.
    _damage_head(tmp_path / "run", 15)
    with Journal.open(tmp_path / "run", owner=False) as j:
        counts = j.tally_range(13, 17)
        assert counts[UNREADABLE] == 1 and counts.total() == 4
        assert counts == j.tally([13, 17])[1]


def _with_three_spooled(base: Path) -> Journal:
    """The journal ``_write`` made, opened with its mover stopped and three
    metric rows appended: entries in LMDB (chunked ones among them) and
    three more in the spool."""
    j = Journal.open(base / "run")
    j._mover.stop()  # the entries appended from here on stay in the spool
    for i in range(3):
        j.append(EntryKind.METRICS, [_payload(100 + i, 50)])
    return j


def _damage_head(path: Path, seq: int) -> None:
    """Make entry ``seq``'s header unreadable (an unknown frame version), in
    every copy of it: pages are copied on write, stale copies may sit in
    freed pages."""
    env = lmdb.open(str(path), max_dbs=8, readonly=True, lock=False)
    with env.begin() as txn:
        head = txn.get(struct.pack(">Q", seq), db=env.open_db(b"entries", txn=txn))
    env.close()
    assert head is not None
    data = path / "data.mdb"
    raw = bytearray(data.read_bytes())
    at = raw.find(head[:24])
    assert at >= 0
    while at >= 0:
        raw[at] = 0xEE
        at = raw.find(head[:24], at + 1)
    data.write_bytes(bytes(raw))


def test_salvage_finds_a_chunked_entry_behind_a_stale_node_of_the_same_seq(
    tmp_path: Path,
) -> None:
    """A stale copy of an entry's head (left in a freed page by a copy on
    write, damaged since) fails its checksum under the entry's own key, like
    a chunk head does alone. Found in a page before the live head, it used to
    be the only head tried, and the intact entry was dropped from the rebuilt
    journal (seen after ``sync`` of a damaged journal)."""
    payload = _payload(9, 2_600)
    frame = encode_frame(int(EntryKind.EPISODE), payload, seq=9)
    head = split(frame)[0]
    assert len(split(frame)) > 1  # stored chunked
    env = lmdb.open(str(tmp_path), max_dbs=8, map_size=1 << 24)
    old, entries = env.open_db(b"old"), env.open_db(b"entries")
    old_reader = env.begin()  # no page is reused: the live head comes last in the file
    with env.begin(write=True) as txn:
        rotted = bytearray(head)
        rotted[len(rotted) // 2] ^= 0xFF
        txn.put(key(9), bytes(rotted), db=old)
    with env.begin(write=True) as txn:
        put_entry(txn, 9, frame, entries)
    old_reader.abort()
    env.close()

    assert scan_pages(tmp_path / "data.mdb").entries == {9: frame}


def test_salvage_finds_a_chunked_entry_behind_a_rotted_stale_copy_of_one_chunk(
    tmp_path: Path,
) -> None:
    """A chunk's old copy (left in a freed page by a copy on write) that has
    rotted since, found before the live chunk, must not cost the entry."""
    payload = _payload(9, 2_600)
    frame = encode_frame(int(EntryKind.EPISODE), payload, seq=9)
    first = split(frame)[1]
    env = lmdb.open(str(tmp_path), max_dbs=8, map_size=1 << 24)
    old, entries = env.open_db(b"old"), env.open_db(b"entries")
    old_reader = env.begin()  # no page is reused: the live chunks come later in the file
    with env.begin(write=True) as txn:
        rotted = bytearray(first)
        rotted[len(rotted) // 2] ^= 0xFF
        txn.put(struct.pack(">QH", 9, 1), bytes(rotted), db=old)
    with env.begin(write=True) as txn:
        put_entry(txn, 9, frame, entries)
    old_reader.abort()
    env.close()

    assert scan_pages(tmp_path / "data.mdb").entries == {9: frame}
