"""A summary supersedes the one before it only once it reads: compaction
removes an earlier summary when it meets a later one, and the close-out of
a crash sends the last intact summary (``by_kind.last_payload`` passes over
a damaged one to the one before it). Removing that one for a later summary
whose body is damaged left a crash closed out with no summary at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from damaging import flip_stored

from primeruns.journal import EntryKind, Journal, capacity
from primeruns.journal.by_kind import last_payload


@pytest.mark.parametrize("pass_keys", [1, 1000])
def test_a_damaged_summary_does_not_supersede_the_one_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pass_keys: int
) -> None:
    monkeypatch.setattr(capacity, "_COMPACT_CHUNK", pass_keys)
    journal = Journal.create(tmp_path, local_id="run")
    journal.append(EntryKind.SUMMARY, [b'{"step": 1}'])
    journal.append(EntryKind.EPISODE, [b"{}"] * 3)
    damaged = journal.append(EntryKind.SUMMARY, [b'{"step": 2}']).first_seq
    assert damaged is not None
    journal.close()
    journal = Journal.open(tmp_path / "run")  # every entry in LMDB
    flip_stored(journal, damaged)
    journal.ack("traces", journal.last_seq())
    journal.compact(["traces"])
    assert last_payload(journal, EntryKind.SUMMARY) == b'{"step": 1}'
    # A later intact summary supersedes both.
    journal.append(EntryKind.SUMMARY, [b'{"step": 3}'])
    journal.ack("traces", journal.last_seq())
    journal.compact(["traces"])
    assert last_payload(journal, EntryKind.SUMMARY) == b'{"step": 3}'
    journal.close()
