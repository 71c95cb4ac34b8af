"""What a parent's finish counts as left in a forked child's journal, at
each look while it waits: the records each sink has not shipped up to the
child's end when the finish began, over that range alone (a child that has
logged for long is looked at as often as one that has not)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primeruns.forkchild import _Child
from primeruns.journal import EntryKind, Journal, frames, reading

_EPISODES = frozenset({EntryKind.EPISODE})


def _child_journal(path: Path, entries: int) -> Journal:
    journal = Journal.create(path, local_id="child")
    payloads = [json.dumps({"id": f"e{i}"}).encode() for i in range(entries)]
    for at in range(0, entries, 500):
        journal.append(EntryKind.EPISODE, payloads[at : at + 500])
    journal._absorb()  # into LMDB, where compaction works
    return journal


def test_each_sink_counts_what_it_left_up_to_the_target_and_no_further(tmp_path: Path) -> None:
    journal = _child_journal(tmp_path / "child", 40)
    journal.ack("traces", 30)
    # Compacted while only "traces" was named (``Journal.compact``'s
    # sinks): "eval_samples" at offset 0 never shipped those 30.
    assert journal.compact(["traces"]) == 30
    target = journal.last_seq()
    journal.append(EntryKind.EPISODE, [b'{"id": "later"}'] * 5)  # logged after the finish began
    child = _Child(
        tmp_path / "child",
        journal,
        {"traces": _EPISODES, "eval_samples": _EPISODES},
        target,
        0.0,
    )
    child._look(1.0)
    assert child.pending == {"traces": 10, "eval_samples": 40}
    journal.ack("traces", target)
    child._look(2.0)
    assert child.pending == {"eval_samples": 40}
    journal.close()


def test_a_look_reads_the_range_left_not_the_whole_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = _child_journal(tmp_path / "child", 3_000)
    journal.ack("traces", 2_990)
    child = _Child(tmp_path / "child", journal, {"traces": _EPISODES}, 2_995, 0.0)
    looked: list[int] = []
    monkeypatch.setattr(
        reading, "peek_kind", lambda value: looked.append(1) or frames.peek_kind(value)
    )
    child._look(1.0)
    assert child.pending == {"traces": 5}
    assert len(looked) <= 5
    journal.close()
