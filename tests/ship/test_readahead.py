"""A sink that builds each batch from a prefix of what it is given (the
training sample table: one step's episodes per object) has every entry read
from the journal once, not once per batch before it, ships each record once,
in order, and sends its backlog without waiting between batches."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from primeruns.journal import Entry, EntryKind, Journal
from primeruns.ship.policy import RetryPolicy
from primeruns.ship.readahead import ReadAhead
from primeruns.ship.sharedreads import SharedReads
from primeruns.ship.shipper import Shipper
from primeruns.sinks.base import Binding, NoProgress, Prepared, SendContext

_FAST = RetryPolicy(base_delay_s=0.001, max_delay_s=0.01, attempts_per_strike=3)
_BOUND = Binding(run_id="run-1", kind="train")


class OneAtATime:
    """Sends one episode per batch out of the up to 64 it is given."""

    name = "one"
    kinds = frozenset({EntryKind.EPISODE})
    max_entries = 64
    max_bytes = 1 << 20
    isolates_rejections = False
    progress_type: type[Any] = NoProgress

    def __init__(self) -> None:
        self.stored: list[str] = []

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared[Any] | None:
        first = entries[0]
        return Prepared(
            body=first.payload,
            records=1,
            progress=NoProgress(),
            last_seq=None if len(entries) == 1 else first.seq,
        )

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        self.stored.append(json.loads(body)["id"])


def _journal(tmp_path: Path, n: int) -> Journal:
    """``n`` episodes, each after a metrics row (another sink's kind)."""
    journal = Journal.create(tmp_path / "runs")
    for i in range(n):
        journal.append(EntryKind.METRICS, [b'{"step": %d}' % i])
        journal.append(EntryKind.EPISODE, [json.dumps({"id": f"e{i}"}).encode()])
    return journal


def _drain(journal: Journal, sink: Any, reads: SharedReads | None = None) -> None:
    """Ship everything in ``journal`` to ``sink`` (through ``reads``, the reads
    shared with another sink, when given), then stop."""
    shipper = Shipper(
        journal,
        sink,
        binding=lambda: _BOUND,
        training=True,
        policy=_FAST,
        on_failure=lambda what, exc: None,
        reads=reads,
    )
    shipper.start()
    assert shipper.drain(journal.last_seq(), deadline=time.monotonic() + 30)
    shipper.stop(timeout=5)


def test_a_sink_taking_one_entry_per_batch_has_each_entry_read_once(
    tmp_path: Path, count_reads: Callable[[Journal], list[int]]
) -> None:
    journal = _journal(tmp_path, 200)
    counts = count_reads(journal)
    sink = OneAtATime()
    _drain(journal, sink)
    assert sink.stored == [f"e{i}" for i in range(200)]
    assert journal.cursor("one").acked == journal.last_seq()
    assert sum(counts) == 200  # each episode read once (it was 64 per batch)
    journal.close()


def test_a_read_from_where_the_kept_entries_do_not_follow_on_reads_afresh(
    tmp_path: Path,
) -> None:
    journal = _journal(tmp_path, 10)
    ahead = ReadAhead(journal, {EntryKind.EPISODE})
    first = ahead.read(0, max_entries=4, max_bytes=1 << 20)
    assert [e.seq for e in first.entries] == [2, 4, 6, 8]
    ahead.consumed(4)  # a batch took two
    # Refused whole and sent again smaller: from where it began.
    again = ahead.read(0, max_entries=1, max_bytes=1 << 20)
    assert [e.seq for e in again.entries] == [2] and again.next_after < 4
    # On from the batch's end: what was kept, then what follows.
    on = ahead.read(4, max_entries=3, max_bytes=1 << 20)
    assert [e.seq for e in on.entries] == [6, 8, 10]
    journal.close()


def test_what_is_kept_is_cut_to_a_read_smaller_than_it(tmp_path: Path) -> None:
    journal = _journal(tmp_path, 10)
    ahead = ReadAhead(journal, {EntryKind.EPISODE})
    ahead.read(0, max_entries=8, max_bytes=1 << 20)
    ahead.consumed(2)
    small = ahead.read(2, max_entries=2, max_bytes=1 << 20)
    # Acknowledged to next_after, the batch passes over nothing it did not take.
    assert [e.seq for e in small.entries] == [4, 6] and small.next_after == 7
    size = len(small.entries[0].payload)
    by_bytes = ahead.read(6, max_entries=8, max_bytes=size)
    assert [e.seq for e in by_bytes.entries] == [8] and by_bytes.next_after == 9
    journal.close()


def test_a_backlog_a_sink_takes_a_prefix_at_a_time_does_not_wait_between_batches(
    tmp_path: Path,
) -> None:
    # Lingering waits for more entries to fill a small batch: the entries of
    # the batch after one that left some behind are there already.
    journal = _journal(tmp_path, 5)
    sink = OneAtATime()
    shipper = Shipper(
        journal,
        sink,
        binding=lambda: _BOUND,
        training=True,
        # Longer than any machine's uptime (the monotonic clock's value): the
        # first batch lingered for what was left of it on a machine up for
        # less than the linger.
        policy=replace(_FAST, linger_s=1e9),
        on_failure=lambda what, exc: None,
    )
    waits: list[float | None] = []
    real_sleep = shipper._sleep

    def sleep(seconds: float | None) -> None:
        waits.append(seconds)
        real_sleep(seconds)

    shipper._sleep = sleep  # type: ignore[method-assign]
    shipper.start()
    assert shipper.drain(journal.last_seq(), deadline=time.monotonic() + 30)
    shipper.stop(timeout=5)
    assert sink.stored == [f"e{i}" for i in range(5)]
    assert not [w for w in waits if w is not None and w > 60]  # no lingering
    journal.close()


class Steps:
    """The training sample table's way: a batch is the first step's run of
    episodes (up to ``max_entries`` of them), cut where the next step begins."""

    name = "steps"
    kinds = frozenset({EntryKind.EPISODE})
    max_entries = 512
    max_bytes = 64 << 20
    reads_ahead_of_batch = True
    isolates_rejections = False
    progress_type: type[Any] = NoProgress

    def __init__(self) -> None:
        self.given: list[int] = []  # how many entries each prepare was given
        self.batches: list[list[str]] = []

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared[Any] | None:
        self.given.append(len(entries))
        records = [json.loads(e.payload) for e in entries]
        taken = [r for r in records if r["step"] == records[0]["step"]]
        last = entries[len(taken) - 1].seq
        return Prepared(
            body=json.dumps([r["id"] for r in taken]).encode(),
            records=len(taken),
            progress=NoProgress(),
            last_seq=None if last == entries[-1].seq else last,
        )

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        self.batches.append(json.loads(body))


def _ship_steps(tmp_path: Path, sizes: list[int]) -> Steps:
    journal = Journal.create(tmp_path / "runs")
    for step, size in enumerate(sizes):
        for i in range(size):
            journal.append(
                EntryKind.EPISODE, [json.dumps({"id": f"{step}.{i}", "step": step}).encode()]
            )
    sink = Steps()
    _drain(journal, sink)
    journal.close()
    return sink


def test_a_sink_taking_one_steps_episode_per_batch_is_not_given_hundreds_ahead(
    tmp_path: Path,
) -> None:
    # What a read brings in past its batch is kept until a batch takes it: 511
    # of a step's single episode were kept for the whole of a sync (4.6 MB),
    # where a short run's held none.
    sink = _ship_steps(tmp_path, [1] * 700)
    assert sink.batches == [[f"{step}.0"] for step in range(700)]
    assert max(sink.given[-500:]) <= 16


def test_steps_of_uneven_size_go_as_they_would_read_in_full(tmp_path: Path) -> None:
    # A read cut short for a step larger than the ones before is read again
    # in full: no step is split where 512 entries read at once kept it whole.
    sizes = [1, 1, 1, 40, 1, 1, 3, 300, 2, 2, 600, 1, 1, 1, 17, 1]
    sink = _ship_steps(tmp_path, sizes)
    expected = []
    for step, size in enumerate(sizes):
        ids = [f"{step}.{i}" for i in range(size)]
        expected += [ids[at : at + 512] for at in range(0, size, 512)]
    assert sink.batches == expected


def test_a_step_read_through_the_shared_reads_with_traces_between_is_not_split(
    tmp_path: Path,
) -> None:
    # Through the reads shared with Prime Traces, a bare trace logged after
    # each episode counted towards a read cut short to about twice the last
    # step: 16 entries read brought 8 episodes of a step of 12, all taken,
    # and the step went in two objects where 512 entries read kept it whole.
    journal = Journal.create(tmp_path / "runs")
    sizes = [1] * 600 + [12, 1, 30, 1, 1, 5]
    for step, size in enumerate(sizes):
        for i in range(size):
            journal.append(
                EntryKind.EPISODE, [json.dumps({"id": f"{step}.{i}", "step": step}).encode()]
            )
            if step >= 600:
                journal.append(EntryKind.TRACE, [json.dumps({"id": f"t{step}.{i}"}).encode()])
    sink = Steps()
    _drain(journal, sink, SharedReads(journal, frozenset({EntryKind.EPISODE, EntryKind.TRACE})))
    journal.close()
    assert sink.batches == [[f"{step}.{i}" for i in range(size)] for step, size in enumerate(sizes)]
