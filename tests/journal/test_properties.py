"""Any interleaving of appends, cursor moves, reopenings and compactions matches a model."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from primeruns.journal import EntryKind, InFlight, Journal

SINKS = ("traces", "metrics")
payloads = st.lists(st.binary(max_size=300), min_size=1, max_size=5)


class JournalModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="journal-prop-"))
        self.j = Journal.create(self.dir, local_id="run")
        self.entries: dict[int, tuple[EntryKind, bytes]] = {}
        self.last = 0
        self.acked = dict.fromkeys(SINKS, 0)
        self.inflight: dict[str, InFlight | None] = dict.fromkeys(SINKS)
        self.floor = 0
        self.has_cursor: set[str] = set()

    @rule(kind=st.sampled_from(EntryKind), data=payloads)
    def append(self, kind: EntryKind, data: list[bytes]) -> None:
        r = self.j.append(kind, data)
        assert (r.first_seq, r.count, r.dropped) == (self.last + 1, len(data), 0)
        for p in data:
            self.last += 1
            self.entries[self.last] = (kind, p)

    @rule(sink=st.sampled_from(SINKS), n=st.integers(1, 10), body=st.binary(max_size=200))
    def set_inflight(self, sink: str, n: int, body: bytes) -> None:
        first = self.acked[sink] + 1
        if first > self.last:
            return
        f = InFlight(first, min(self.last, first + n - 1), body, {"k": n})
        self.j.set_inflight(sink, f)
        self.inflight[sink] = f
        self.has_cursor.add(sink)

    @rule(sink=st.sampled_from(SINKS), data=st.data())
    def ack(self, sink: str, data: st.DataObject) -> None:
        upto = data.draw(st.integers(self.acked[sink], self.last))
        self.j.ack(sink, upto)
        self.acked[sink], self.inflight[sink] = upto, None
        self.has_cursor.add(sink)

    @rule()
    def compact(self) -> None:
        # Only sinks that have a cursor hold entries back.
        upto = min((self.acked[s] for s in self.has_cursor), default=0)
        removed = self.j.compact()
        # The entries that decide how a run is closed are kept: the spec, the
        # finish, and the newest summary up to there. An older summary goes
        # once a pass meets a later one (one a handle passed over before a
        # reopen may stay: the journal says which went).
        kept = (EntryKind.RUN_OPEN, EntryKind.SUMMARY, EntryKind.FINISH)

        def stays(seq: int, kind: EntryKind) -> bool:
            return seq > upto or kind in kept

        summaries = [
            s for s, (k, _) in sorted(self.entries.items()) if k == EntryKind.SUMMARY and s <= upto
        ]
        held = {e.seq for e in self.j.read(0, kinds={EntryKind.SUMMARY}, max_entries=10**6).entries}
        gone = {s for s in summaries if s not in held}
        assert not summaries or summaries[-1] not in gone, "the newest summary was compacted"
        expected = sum(1 for s, (k, _) in self.entries.items() if not stays(s, k))
        assert removed == expected + len(gone)
        self.entries = {s: v for s, v in self.entries.items() if stays(s, v[0]) and s not in gone}
        self.floor = max(self.floor, upto)

    @rule()
    def reopen(self) -> None:
        self.j.close()
        self.j = Journal.open(self.dir / "run")

    @rule(
        after=st.integers(0, 60),
        kinds=st.none() | st.sets(st.sampled_from(EntryKind), min_size=1),
        max_entries=st.integers(1, 20),
    )
    def read(self, after: int, kinds: set[EntryKind] | None, max_entries: int) -> None:
        got = self.j.read(after, kinds=kinds, max_entries=max_entries)
        want = [
            (s, k, p)
            for s, (k, p) in sorted(self.entries.items())
            if s > after and (kinds is None or k in kinds)
        ][:max_entries]
        assert [(e.seq, e.kind, e.payload) for e in got.entries] == want
        assert got.damaged == []
        assert got.next_after >= (want[-1][0] if want else after)

    @invariant()
    def matches_model(self) -> None:
        assert self.j.last_seq() == self.last
        got = self.j.read(0, max_entries=10**6)
        assert [(e.seq, e.kind, e.payload) for e in got.entries] == [
            (s, k, p) for s, (k, p) in sorted(self.entries.items())
        ]
        # dense: from the compaction floor to the last entry (below it, only
        # the kept kinds remain)
        above = [e.seq for e in got.entries if e.seq > self.floor]
        assert above == list(range(self.floor + 1, self.last + 1))
        for sink in SINKS:
            cur = self.j.cursor(sink)
            assert cur.acked == self.acked[sink] and cur.inflight == self.inflight[sink]

    def teardown(self) -> None:
        self.j.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_journal_model() -> None:
    # Most of an example's time is its reopenings (each probes the file in a
    # child process); -m slow explores ten times as many interleavings.
    run_state_machine_as_test(
        JournalModel, settings=settings(max_examples=25, stateful_step_count=25, deadline=None)
    )


@pytest.mark.slow
# A long hypothesis run whose length follows the disk's sync times: 313 s on a
# loaded 2-core machine, past the suite's 300 s default.
@pytest.mark.timeout(1800)
def test_journal_model_long() -> None:
    run_state_machine_as_test(
        JournalModel, settings=settings(max_examples=250, stateful_step_count=40, deadline=None)
    )
