"""The sinks that take a journal's episodes read each from the journal once
(``ship.sharedreads``): an episode was copied out, checksummed and
decompressed once per sink. Each sink still gets every entry of its kinds,
in order, however far behind the other it is, and what is kept for the
sink behind is bounded."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from primeruns.journal import Entry, EntryKind, Journal
from primeruns.platform import PlatformClient, resolve_settings
from primeruns.ship.factory import make_shippers
from primeruns.ship.lifecycle import Lifecycle
from primeruns.ship.policy import RetryPolicy
from primeruns.ship.sharedreads import SharedReads
from primeruns.ship.shipper import Shipper
from primeruns.sinks.base import Binding, NoProgress, Prepared, SendContext
from primeruns.spec import SPEC_KEY, RunSpec

_FAST = RetryPolicy(base_delay_s=0.001, max_delay_s=0.01, attempts_per_strike=3)
_BOUND = Binding(run_id="run-1", kind="eval")
_BOTH = frozenset({EntryKind.EPISODE, EntryKind.TRACE})


class Collecting:
    """Stores the ids of the records of each batch (up to ``max_entries``)."""

    isolates_rejections = False
    progress_type: type[Any] = NoProgress

    def __init__(self, name: str, kinds: frozenset[EntryKind], max_entries: int) -> None:
        self.name = name
        self.kinds = kinds
        self.max_entries = max_entries
        self.max_bytes = 1 << 20
        self.stored: list[str] = []

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared[Any] | None:
        ids = [json.loads(e.payload)["id"] for e in entries]
        return Prepared(body=json.dumps(ids).encode(), records=len(ids), progress=NoProgress())

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        self.stored += json.loads(body)


def _journal(tmp_path: Path, n: int) -> Journal:
    """``n`` episodes, a metrics row (no sink's here) and every 10th a bare trace."""
    journal = Journal.create(tmp_path / "runs")
    for i in range(n):
        journal.append(EntryKind.METRICS, [b'{"step": %d}' % i])
        journal.append(EntryKind.EPISODE, [json.dumps({"id": f"e{i}"}).encode()])
        if i % 10 == 0:
            journal.append(EntryKind.TRACE, [json.dumps({"id": f"t{i}"}).encode()])
    return journal


def _ship(journal: Journal, sinks: list[Collecting], reads: SharedReads) -> None:
    shippers = [
        Shipper(
            journal,
            sink,
            binding=lambda: _BOUND,
            training=False,
            policy=_FAST,
            on_failure=lambda what, exc: None,
            reads=reads,
        )
        for sink in sinks
    ]
    for shipper in shippers:
        shipper.start()
    for shipper in shippers:
        assert shipper.drain(journal.last_seq(), deadline=time.monotonic() + 30)
        shipper.stop(timeout=5)


def test_two_sinks_taking_each_episode_have_it_read_from_the_journal_once(
    tmp_path: Path, count_reads: Callable[[Journal], list[int]]
) -> None:
    journal = _journal(tmp_path, 300)
    counts = count_reads(journal)
    traces = Collecting("traces", _BOTH, max_entries=64)
    samples = Collecting("samples", frozenset({EntryKind.EPISODE}), max_entries=25)
    _ship(journal, [traces, samples], SharedReads(journal, _BOTH))
    episodes = [f"e{i}" for i in range(300)]
    assert samples.stored == episodes
    assert traces.stored == [x for i in range(300) for x in [f"e{i}", f"t{i}"][: 1 + (i % 10 == 0)]]
    assert sum(counts) == 330  # each entry read once (it was once per sink: 630)
    journal.close()


def test_a_sink_further_behind_than_what_is_kept_reads_for_itself(tmp_path: Path) -> None:
    journal = _journal(tmp_path, 100)
    reads = SharedReads(journal, _BOTH, keep_bytes=200)
    ahead, behind = reads.reader("ahead"), reads.reader("behind")
    after, seen = 0, []
    behind_first = behind.read(0, kinds={EntryKind.EPISODE}, max_entries=1, max_bytes=1 << 20)
    while after < journal.last_seq():  # one sink reads all before the other goes on
        got = ahead.read(after, kinds=_BOTH, max_entries=7, max_bytes=1 << 20)
        seen += [e.seq for e in got.entries]
        after = got.next_after
        assert reads.kept <= 20  # bounded, though the sink behind has read none of it
    after, late = behind_first.next_after, [e.seq for e in behind_first.entries]
    while after < journal.last_seq():
        got = behind.read(after, kinds={EntryKind.EPISODE}, max_entries=9, max_bytes=1 << 20)
        late += [e.seq for e in got.entries]
        after = got.next_after
    everything = journal.read(0, kinds=_BOTH, max_entries=10_000).entries
    assert seen == [e.seq for e in everything]
    assert late == [e.seq for e in everything if e.kind is EntryKind.EPISODE]
    journal.close()


def test_a_reader_that_left_keeps_nothing_back(tmp_path: Path) -> None:
    journal = _journal(tmp_path, 50)
    reads = SharedReads(journal, _BOTH)
    off, on = reads.reader("off"), reads.reader("on")
    off.read(0, kinds=_BOTH, max_entries=1, max_bytes=1 << 20)
    got = on.read(0, kinds=_BOTH, max_entries=40, max_bytes=1 << 20)
    assert reads.kept > 0  # kept for the sink at the start
    reads.leave("off")  # its sink turned off
    on.read(got.next_after, kinds=_BOTH, max_entries=1, max_bytes=1 << 20)
    assert reads.kept <= 1
    journal.close()


def test_a_backlog_larger_than_what_is_kept_leaves_the_oldest_for_the_sink_behind(
    tmp_path: Path, count_reads: Callable[[Journal], list[int]]
) -> None:
    # A backlog: the sink ahead reads a whole batch (Prime Traces: 30 MB) in
    # one read, more than is kept. What the sink behind needs first, the
    # oldest, is what is kept; dropping the oldest instead left it nothing.
    journal = _journal(tmp_path, 100)
    counts = count_reads(journal)
    size = len(journal.read(0, kinds=_BOTH, max_entries=1).entries[0].payload)
    reads = SharedReads(journal, _BOTH, keep_bytes=40 * size)
    ahead, behind = reads.reader("ahead"), reads.reader("behind")
    counts.clear()
    ahead.read(0, kinds=_BOTH, max_entries=1000, max_bytes=1 << 20)
    assert counts == [110]
    after, taken = 0, []
    for _ in range(3):  # 27 episodes: all of them kept
        got = behind.read(after, kinds={EntryKind.EPISODE}, max_entries=9, max_bytes=1 << 20)
        taken += [e.seq for e in got.entries]
        after = got.next_after
    assert counts == [110] and len(taken) == 27
    journal.close()


@pytest.mark.parametrize("kind", ["train", "eval"])
def test_what_a_backlog_keeps_for_the_sample_sink_behind(tmp_path: Path, kind: str) -> None:
    # A backlog's Prime Traces batch reads every episode at once. A training
    # run's sample sink takes one step's a batch and keeps its own read ahead:
    # what the window kept for it stayed resident for most of a sync (16 MB
    # of a 20,000-step one). An evaluation's sample sink takes 256 a batch,
    # close behind: its window keeps the whole read, read once for both.
    spec = RunSpec(kind=kind, name="backlog")
    journal = Journal.create(tmp_path / "runs", meta={SPEC_KEY: spec.to_json()})
    pad = "x" * 9_000  # a gsm8k episode's payload
    for i in range(600):
        journal.append(EntryKind.EPISODE, [json.dumps({"id": f"e{i}", "pad": pad}).encode()])
    client = PlatformClient(resolve_settings(api_key="k", environ={}, config={}))
    lifecycle = Lifecycle(journal, client, policy=_FAST, on_failure=lambda *a: None)
    shippers = make_shippers(
        journal, client, lifecycle, opted_out=False, policy=_FAST, on_failure=lambda *a: None
    )
    reads = shippers[0]._reads
    assert reads is not None and shippers[1]._reads is reads
    got = reads.read("traces", 0, kinds=_BOTH, max_entries=10_000, max_bytes=30 << 20)
    assert len(got.entries) == 600  # the batch ahead has every episode (5.4 MB)
    if kind == "train":
        assert 0 < reads.kept * len(got.entries[0].payload) <= 2 << 20
    else:
        assert reads.kept == 600
    client.close()
    journal.close()
