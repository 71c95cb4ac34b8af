"""The run's lifecycle entries (its spec, its last summary, its finish)
outlive compaction; a summary a later one supersedes does not (a run that
updates its summary every step kept one per step). What compaction does at
an acknowledgement must cost what was acknowledged since the last one, not
every lifecycle entry kept before it, and it must still keep each of them
whole and remove everything else acknowledged."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import lmdb
import pytest

from primeruns.journal import EntryKind, Journal, capacity
from primeruns.journal.layout import kept_kind, key, seq_of
from primeruns.journal.memory import MemoryJournal


class _CountingEntries(dict[int, Any]):
    """The memory journal's entries, counting the looks at them."""

    looks = 0

    def __getitem__(self, seq: int) -> Any:
        type(self).looks += 1
        return super().__getitem__(seq)


def test_an_acknowledgement_in_memory_looks_at_what_it_acknowledged_alone() -> None:
    j = MemoryJournal(max_bytes=1 << 30, meta={})
    j.set_sinks(["traces"])
    j.append(EntryKind.RUN_OPEN, [b"{}"])
    for step in range(2_000):
        j.append(EntryKind.SUMMARY, [b'{"best": %d}' % step])
        j.append(EntryKind.EPISODE, [b'{"step": %d}' % step])
    j.ack("traces", j.last_seq())
    j._entries = _CountingEntries(j._entries)
    _CountingEntries.looks = 0
    j.append(EntryKind.EPISODE, [b"e1", b"e2"])
    j.append(EntryKind.SUMMARY, [b'{"best": -1}'])
    j.ack("traces", j.last_seq())
    assert _CountingEntries.looks <= 3
    # Every lifecycle entry is still there; every other one acknowledged is gone.
    # The spec and the last summary are still there (a later summary
    # supersedes the one before it); every other entry acknowledged is gone.
    held = j.read(0, max_entries=10_000, max_bytes=1 << 30).entries
    assert [e.kind for e in held] == [EntryKind.RUN_OPEN, EntryKind.SUMMARY]
    assert held[-1].payload == b'{"best": -1}'
    assert j.compacted() == {int(EntryKind.EPISODE): 2_002, int(EntryKind.SUMMARY): 2_000}


def _noise(i: int, size: int) -> bytes:
    return json.dumps({"i": i, "noise": random.Random(i).randbytes(size).hex()}).encode()


def test_compaction_looks_past_where_it_stopped_and_keeps_each_lifecycle_entry_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Entries stored in chunks, kept ones among them, and passes of a few
    # keys: a pass stops inside a removed entry's chunks, and the next goes
    # on from there.
    monkeypatch.setattr(capacity, "_COMPACT_CHUNK", 3)
    looked: list[int] = []
    monkeypatch.setattr(capacity, "kept_kind", lambda value: looked.append(1) or kept_kind(value))
    summaries: dict[int, bytes] = {}
    with Journal.create(tmp_path, local_id="run") as j:
        j.append(EntryKind.RUN_OPEN, [b"{}"])
        for i in range(60):
            if i % 3 == 0:
                payload = _noise(i, 3_000)  # stored in chunks
                summaries[j.append(EntryKind.SUMMARY, [payload]).first_seq or 0] = payload
            j.append(EntryKind.EPISODE, [_noise(1_000 + i, 2_500 if i % 2 else 50)])
        j.ack("traces", j.last_seq())
        removed = j.compact(["traces"])
        assert removed == 60 + 19  # the episodes, and each summary a later one supersedes
        last = max(summaries)
        looked.clear()
        for i in range(3):
            j.append(EntryKind.EPISODE, [_noise(2_000 + i, 2_500)])
        j.ack("traces", j.last_seq())
        assert j.compact(["traces"]) == 3
        assert len(looked) <= 3  # the new heads alone, not the entries kept before them
        end = j.last_seq()
        for seq, payload in summaries.items():
            entry = j.get(seq)
            if seq == last:
                assert entry is not None and entry.payload == payload
            else:
                assert entry is None
        assert j.compacted()[int(EntryKind.SUMMARY)] == 19
        assert j.damage() == []
    # Nothing but the lifecycle entries (and their chunks) is left of what was acknowledged.
    env = lmdb.open(str(tmp_path / "run"), max_dbs=8, readonly=True, lock=False)
    with env.begin() as txn:
        left = {seq_of(k) for k, _ in txn.cursor(db=env.open_db(b"entries", txn=txn))}
    env.close()
    assert {seq for seq in left if seq <= end} == {1, last}


@pytest.mark.parametrize("pass_keys", [3, 10_000])
def test_compaction_goes_on_past_a_malformed_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pass_keys: int
) -> None:
    # A key no entry has (its length is neither an entry's nor a chunk's:
    # damage the reader reports) stopped every pass there, and a pass cut
    # on it went on past what every sink acknowledged: what followed it was
    # never compacted, and the journal grew to its budget.
    monkeypatch.setattr(capacity, "_COMPACT_CHUNK", pass_keys)
    with Journal.create(tmp_path, local_id="run") as j:
        j.append(EntryKind.RUN_OPEN, [b"{}"])
        j.append(EntryKind.EPISODE, [_noise(i, 2_500 if i % 2 else 50) for i in range(19)])
        path = j.path
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        db = env.open_db(b"entries", txn=txn)
        for seq in (4, 11):
            assert txn.put(key(seq) + b"\x77", b"not an entry", db=db)
    env.close()
    with Journal.open(path) as j:
        j.ack("traces", j.last_seq())
        assert j.compact(["traces"]) == 19
        assert j.compacted() == {int(EntryKind.EPISODE): 19}
        assert sum(j.tally()[0].values()) == 20
        assert [e.seq for e in j.read(0).entries] == [1]


def test_a_run_updating_its_summary_every_step_keeps_logging_at_its_byte_budget(
    tmp_path: Path,
) -> None:
    # Every summary outlived compaction: a shipped run that updates its
    # summary each step filled its byte budget with them, and from then on
    # every record it logged was dropped, however fast it shipped.
    with Journal.create(tmp_path, local_id="run", max_bytes=2 << 20) as j:
        j.set_sinks(["traces"])
        j.append(EntryKind.RUN_OPEN, [b"{}"])
        dropped = 0
        for step in range(3_000):  # ~4.5 MB of summaries, twice the budget
            dropped += j.append(EntryKind.SUMMARY, [_noise(step, 1_500)]).dropped
            dropped += j.append(EntryKind.METRICS, [b'{"step": %d}' % step]).dropped
            j.ack("traces", j.last_seq())
        assert dropped == 0
        last = j.read(j.last_seq() - 2, kinds={EntryKind.SUMMARY}).entries
        assert [json.loads(e.payload)["i"] for e in last] == [2_999]
        # Every entry logged is counted once: present, or compacted away.
        assert j.tally()[0][int(EntryKind.SUMMARY)] == 3_000
        assert j.damage() == []
