"""Compaction against a brute-force recount: whatever the passes (cut every
few keys, inside a chunked entry's keys, resumed from where the last one
stopped), every entry appended is counted exactly once (present, or among
what compaction removed), each lifecycle entry is kept whole but a summary a
later acknowledged one supersedes, and every other entry up to what every
sink acknowledged is gone."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from primeruns.journal import EntryKind, Journal, capacity
from primeruns.journal.memory import MemoryJournal

_KEPT = (EntryKind.RUN_OPEN, EntryKind.SUMMARY, EntryKind.FINISH)
_KINDS = (EntryKind.RUN_OPEN, EntryKind.SUMMARY, EntryKind.EPISODE, EntryKind.METRICS)
# Random bytes do not compress: 1,300 to 16 KiB are stored in chunks.
_sizes = st.lists(st.sampled_from([10, 2_000, 5_000]), min_size=1, max_size=3)


class CompactionModel(RuleBasedStateMachine):
    in_memory = False

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="compaction-oracle-"))
        self.j = self._open(create=True)
        self.entries: dict[int, tuple[EntryKind, bytes]] = {}
        self.appended: Counter[int] = Counter()
        self.acked = 0
        self.upto = 0  # what every sink acknowledged, at the last compaction

    def _open(self, *, create: bool) -> Journal | MemoryJournal:
        if self.in_memory:
            j = MemoryJournal(max_bytes=1 << 30, meta={})
            j.set_sinks(["traces"])
            return j
        if create:
            return Journal.create(self.dir, local_id="run")
        return Journal.open(self.dir / "run")

    @rule(kind=st.sampled_from(_KINDS), sizes=_sizes, seed=st.integers(0, 1 << 30))
    def append(self, kind: EntryKind, sizes: list[int], seed: int) -> None:
        import random

        rnd = random.Random(seed)
        payloads = [rnd.randbytes(n) for n in sizes]
        first = self.j.append(kind, payloads).first_seq
        assert first is not None
        for seq, payload in enumerate(payloads, first):
            self.entries[seq] = (kind, payload)
            self.appended[int(kind)] += 1

    @rule(data=st.data())
    def ack_and_compact(self, data: st.DataObject) -> None:
        self.acked = data.draw(st.integers(self.acked, self.j.last_seq()))
        self.j.ack("traces", self.acked)
        self.j.compact(["traces"])
        self.upto = self.acked

    @rule()
    def reopen(self) -> None:
        if not self.in_memory:
            self.j.close()
            self.j = self._open(create=False)

    @invariant()
    def every_entry_once(self) -> None:
        # Counted once: present or compacted, never both, never neither.
        total = Counter[int]()
        for part in self.j.tally([3, 9]):
            total.update(part)
        assert +total == +self.appended
        assert +self.j.compacted() + +self.j.tally_range(0, self.j.last_seq()) == +self.appended
        held = self.j.read(0, max_entries=10**6, max_bytes=1 << 40).entries
        # The last summary up to what was acknowledged supersedes every one before it.
        last_summary = max(
            (s for s, (k, _) in self.entries.items() if k == EntryKind.SUMMARY and s <= self.upto),
            default=0,
        )
        want = {
            s: v
            for s, v in self.entries.items()
            if s > self.upto or (v[0] in _KEPT and (v[0] != EntryKind.SUMMARY or s == last_summary))
        }
        last = self.j.last_seq()
        for after, upto in [(0, self.upto), (self.upto // 2, last - 1), (self.upto, last)]:
            recount = Counter(int(k) for s, (k, _) in want.items() if after < s <= upto)
            assert +self.j.tally_range(after, upto) == recount, (after, upto)
        assert [(e.seq, e.kind, e.payload) for e in held] == [
            (s, k, p) for s, (k, p) in sorted(want.items())
        ]
        if not self.in_memory:
            assert isinstance(self.j, Journal) and self.j.damage() == []

    def teardown(self) -> None:
        self.j.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class MemoryCompactionModel(CompactionModel):
    in_memory = True


@pytest.mark.parametrize("model", [CompactionModel, MemoryCompactionModel])
@pytest.mark.parametrize("pass_keys", [1, 3])
def test_compaction_counts_every_entry_once(
    model: type[CompactionModel], pass_keys: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(capacity, "_COMPACT_CHUNK", pass_keys)
    run_state_machine_as_test(
        model, settings=settings(max_examples=8, stateful_step_count=15, deadline=None)
    )
