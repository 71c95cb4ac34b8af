"""The shipper alone, with a fake sink: the cursor protocol without a network.

Fast checks of what every sink relies on: each record is sent in exactly one
acknowledged batch, a batch that failed is resent byte-identical (also by a
new shipper after a restart), a rejected record fails alone, and a sink's
standing reaches the journal, where the producer reads it; and the next
batch, prepared while the one before is in flight, changes none of that.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import workloads
from damaging import put_stray
from scripted_platform import LOST, PASS, REFUSED, ScriptedPlatform, error
from spooled import killed_segment

from primeruns.exceptions import (
    APIError,
    JournalCorruptError,
    JournalFullError,
    RetryableAPIError,
    ValidationRejectedError,
)
from primeruns.journal import Entry, EntryKind, InFlight, Journal, frames, reading
from primeruns.journal.frames import encode_frame
from primeruns.journal.layout import META_KIND, key
from primeruns.journal.spool import APPEND, list_segments, segment_name
from primeruns.platform.errors import error_from_transport
from primeruns.ship import ledger
from primeruns.ship.policy import RetryPolicy
from primeruns.ship.shipper import Shipper
from primeruns.sinks.base import Binding, NoProgress, Prepared, SendContext, Sink
from primeruns.sinks.eval_samples import EvalSamplesSink

_FAST = RetryPolicy(base_delay_s=0.001, max_delay_s=0.01, attempts_per_strike=3)
_BOUND = Binding(run_id="run-1", kind="eval")


class FakeSink:
    """Batches of up to ``max_entries`` ids; fails as told."""

    name = "fake"
    kinds = frozenset({EntryKind.EPISODE})
    max_entries = 4
    max_bytes = 1 << 20
    isolates_rejections = True
    progress_type: type[Any] = NoProgress

    def __init__(self, *, transient: int = 0, reject_id: str | None = None) -> None:
        self.transient = transient
        self.reject_id = reject_id
        self.attempts: list[bytes] = []
        self.stored: list[str] = []
        self.retried = threading.Event()  # a second attempt was made

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared[Any] | None:
        ids = [json.loads(e.payload)["id"] for e in entries]
        return Prepared(body=json.dumps(ids).encode(), records=len(ids), progress=NoProgress())

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        self.attempts.append(body)
        if len(self.attempts) >= 2:
            self.retried.set()
        if self.transient > 0:
            self.transient -= 1
            raise RetryableAPIError("503 from the fake", status_code=503)
        ids = json.loads(body)
        if self.reject_id in ids:
            line = ids.index(self.reject_id) + 1
            raise ValidationRejectedError(f"HTTP 400: line {line}: bad id", status_code=400)
        self.stored.extend(ids)


def _journal(tmp_path: Path, n: int) -> Journal:
    journal = Journal.create(tmp_path / "runs")
    payloads = [json.dumps({"id": f"e{i}", "traces": []}).encode() for i in range(n)]
    journal.append(EntryKind.EPISODE, payloads)
    return journal


def _journal_missing(tmp_path: Path, entries: int, missing: Iterable[int]) -> Journal:
    """A journal of ``entries`` entries moved into LMDB, the ``missing`` ones deleted there."""
    journal = _journal(tmp_path, entries)
    journal._mover.step()  # into LMDB, where the damage is made
    with journal._tx.lock, journal._tx.store.begin(write=True) as txn:
        for seq in missing:
            assert txn.delete(key(seq), db=journal._tx.dbs["entries"])
    return journal


def _shipper(journal: Journal, sink: Sink, failures: list[str]) -> Shipper:
    return Shipper(
        journal,
        sink,
        binding=lambda: _BOUND,
        training=False,
        policy=_FAST,
        on_failure=lambda what, exc: failures.append(f"{what}: {exc}"),
    )


def _ship(journal: Journal, sink: Sink, failures: list[str]) -> Shipper:
    shipper = _shipper(journal, sink, failures)
    shipper.start()
    return shipper


def test_every_record_lands_once_through_transient_failures(tmp_path: Path) -> None:
    journal = _journal(tmp_path, 10)
    sink = FakeSink(transient=2)
    failures: list[str] = []
    shipper = _ship(journal, sink, failures)
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    assert sink.stored == [f"e{i}" for i in range(10)]
    # The two failed attempts and the success carried the same bytes.
    assert sink.attempts[0] == sink.attempts[1] == sink.attempts[2]
    assert journal.cursor("fake").acked == journal.last_seq()
    journal.close()


def test_a_batch_recorded_before_a_restart_is_resent_byte_identical(tmp_path: Path) -> None:
    journal = _journal(tmp_path, 6)
    first = FakeSink(transient=10**6)  # never succeeds: the batch stays in flight
    failures: list[str] = []
    shipper = _ship(journal, first, failures)
    assert first.retried.wait(10)  # recorded before its first attempt, then retried
    shipper.stop(timeout=5)
    recorded = journal.cursor("fake").inflight
    assert recorded is not None
    # A new process (a restart, replay) sends the recorded batch first, as it was.
    second = FakeSink()
    again = _ship(journal, second, failures)
    assert again.drain(journal.last_seq(), deadline=_soon(10))
    again.stop(timeout=5)
    assert second.attempts[0] == first.attempts[0] == recorded.body
    assert sorted(second.stored) == sorted(f"e{i}" for i in range(6))
    assert len(second.stored) == len(set(second.stored))
    journal.close()


def test_a_rejected_record_fails_alone_and_is_counted(tmp_path: Path) -> None:
    journal = _journal(tmp_path, 8)
    sink = FakeSink(reject_id="e2")
    failures: list[str] = []
    shipper = _ship(journal, sink, failures)
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    assert sorted(sink.stored) == sorted(f"e{i}" for i in range(8) if i != 2)
    assert journal.losses()["fake"]["count"] == 1
    assert any("bad id" in f for f in failures)
    journal.close()


class _OverCountingSink(FakeSink):
    """Leaves counts to take with each batch's acknowledgement that no batch
    of its can have: more records than the batch, and fewer than none (as a
    sink whose progress read back from a damaged journal said so would)."""

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        self.attempts.append(body)
        refused = APIError("refused for its content", status_code=422)
        ctx.failed_at_ack[0] = (10**6, refused)
        ctx.failed_at_ack[1] = (-7, refused)


def test_records_counted_with_an_acknowledgement_are_at_most_the_batchs(
    tmp_path: Path,
) -> None:
    journal = _journal(tmp_path, 8)
    failures: list[str] = []
    shipper = _ship(journal, _OverCountingSink(), failures)
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    assert journal.losses()["fake"]["count"] == 8  # two batches of 4, every record
    assert shipper.state.records_sent == 0
    journal.close()


def test_a_retired_sink_is_recorded_in_the_journal_for_the_producer(tmp_path: Path) -> None:
    journal = _journal(tmp_path, 3)
    sink = FakeSink(transient=10**6)
    shipper = _ship(journal, sink, [])
    assert not shipper.drain(journal.last_seq(), deadline=_soon(20))  # retired: gives up
    shipper.stop(timeout=5)
    standing = ledger.read_standing(journal, "fake")
    assert standing.retired is not None and "failed batches in a row" in standing.retired
    assert standing.settled
    journal.close()


def _soon(seconds: float) -> float:
    return time.monotonic() + seconds


def test_a_stop_that_lands_just_before_the_wait_for_appends_still_stops_it(
    tmp_path: Path,
) -> None:
    # The shipper waits for appends without a timeout: a stop between its
    # check of the flag and its wait must still end that wait (a lost one
    # would hang finish; this test then fails by pytest's timeout).
    journal = _journal(tmp_path, 3)
    sink = FakeSink()
    real_wait = journal.wait_for_append
    shipper = _shipper(journal, sink, [])

    def stop_first(*args: Any, **kwargs: Any) -> bool:
        shipper.signal_stop()  # the stop lands here, before the wait
        return real_wait(*args, **kwargs)

    journal.wait_for_append = stop_first  # type: ignore[method-assign]
    shipper.start()
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.join()
    assert not shipper.alive
    assert sink.stored == ["e0", "e1", "e2"]
    journal.close()


def test_a_shipper_waiting_for_its_run_to_register_ships_once_registered(
    tmp_path: Path,
) -> None:
    # No binding yet (the platform was down at init): the shipper waits,
    # without a timer, for the registration's poke.
    journal = _journal(tmp_path, 3)
    sink = FakeSink()
    bound: list[Binding] = []
    shipper = Shipper(
        journal,
        sink,
        binding=lambda: bound[0] if bound else None,
        training=False,
        policy=_FAST,
        on_failure=lambda what, exc: None,
    )
    shipper.start()
    bound.append(_BOUND)
    shipper.poke()  # what the registration does once it has the run's id
    assert shipper.drain(journal.last_seq(), deadline=_soon(30))
    shipper.stop()
    assert sink.stored == ["e0", "e1", "e2"]
    journal.close()


def test_a_sink_an_internal_error_stopped_ships_again_when_the_run_closes(
    tmp_path: Path,
) -> None:
    # An unexpected error (a bug, or a race like an ack refused for an entry
    # read a moment early) ends the shipper's thread and retires the sink.
    # The close-out revives retired sinks: that must start a thread again.
    # Before, the sink read as active with no thread to ship it, and finish
    # waited out the 60 s stall with its records unshipped.
    journal = _journal(tmp_path, 6)
    sink = FakeSink()
    real_ack = journal.ack
    refused: list[int] = []

    def refuse_once(sink_name: str, upto_seq: int, **kwargs: Any) -> None:
        if not refused:
            refused.append(upto_seq)
            raise ValueError(f"cannot ack {upto_seq}: the last entry is {upto_seq - 1}")
        real_ack(sink_name, upto_seq, **kwargs)

    journal.ack = refuse_once  # type: ignore[method-assign]
    shipper = _ship(journal, sink, [])
    assert not shipper.drain(journal.last_seq(), deadline=_soon(10))  # retired at once
    assert shipper.state.retired_reason is not None
    assert "internal error" in shipper.state.retired_reason
    shipper.revive(final=True)
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    assert set(sink.stored) == {f"e{i}" for i in range(6)}
    # The batch whose ack was refused went again first, as it was (what a
    # content-addressed upload needs to store it once).
    assert sink.attempts[1] == sink.attempts[0]
    assert journal.cursor("fake").acked == journal.last_seq()
    journal.close()


def test_entries_missing_from_the_journal_are_each_counted_as_lost(tmp_path: Path) -> None:
    # A damaged journal (here: five entries gone from LMDB) never stops the
    # sink: it ships the rest and counts every entry it cannot send. It used
    # to count one per damage report, so a missing range of five counted 1.
    journal = _journal_missing(tmp_path, 12, range(4, 9))
    sink = FakeSink()
    shipper = _ship(journal, sink, [])
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    assert sink.stored == [f"e{i}" for i in (0, 1, 2, 8, 9, 10, 11)]  # seq = i + 1
    assert journal.losses()["fake"]["count"] == 5
    journal.close()


@dataclass(frozen=True)
class _Done:
    done: int


class _MultiRequestSink(FakeSink):
    """Each batch takes ``requests`` requests, the first ``failures`` attempts
    of each failing transiently: a flaky link under a batch of several
    requests (the sample table's presign, PUT and confirm)."""

    progress_type = _Done

    def __init__(self, *, requests: int, failures: int) -> None:
        super().__init__()
        self.requests = requests
        self.failures = failures
        self._failed_here = 0

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared[Any] | None:
        prepared = super().prepare(entries, binding)
        return None if prepared is None else replace(prepared, progress=_Done(0))

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        self.attempts.append(body)
        for index in range(ctx.progress.done, self.requests):
            if self._failed_here < self.failures:
                self._failed_here += 1
                raise RetryableAPIError("503 from the fake", status_code=503)
            self._failed_here = 0
            ctx.save_progress(_Done(index + 1))
        self.stored.extend(json.loads(body))


@pytest.mark.parametrize(
    "state",
    [
        {"done": "one", "last_seq": 3, "records": 3},
        {"last_seq": 3, "records": 3},
        {"done": 1, "last_seq": 3, "records": [3]},
    ],
    ids=["wrong-type", "missing", "records"],
)
def test_a_batch_whose_recorded_state_is_damaged_counts_as_failed_and_the_sink_goes_on(
    state: dict[str, Any], tmp_path: Path
) -> None:
    # A journal is untrusted input. Its batch is not resent with progress
    # made up (as if nothing of it was done: it could be stored twice) nor
    # does the sink's send meet a TypeError: as for damaged entries, each of
    # its entries is counted with the reason, and the next batch ships.
    journal = _journal(tmp_path, 7)
    journal.set_inflight("fake", InFlight(1, 3, json.dumps(["e0", "e1", "e2"]).encode(), state))
    sink = _MultiRequestSink(requests=1, failures=0)
    failures: list[str] = []
    shipper = _ship(journal, sink, failures)
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    assert sink.stored == ["e3", "e4", "e5", "e6"]
    loss = journal.losses()["fake"]
    assert loss["count"] == 3
    assert "the batch recorded in the journal is damaged" in loss["reasons"][0]
    assert len(failures) == 1 and "damaged" in failures[0]
    assert shipper.state.retired_reason is None and shipper.state.active
    journal.close()


@pytest.mark.parametrize(
    ("passes_over", "state", "lost"),
    [
        (True, {"done": "one", "last_seq": 5, "records": 3}, 3),
        (True, {"done": 1, "last_seq": 5, "records": "3"}, 5),
        (True, {"done": "one", "last_seq": 5, "records": 9}, 5),
        (False, {"done": "one", "last_seq": 5, "records": 0}, 5),
        (False, {"done": "one", "last_seq": 5, "records": 2}, 5),
        (False, {"done": "one", "last_seq": 5, "records": 9}, 5),
    ],
    ids=[
        "progress-damaged",
        "records-damaged",
        "records-past-the-range",
        "a-record-each-entry-records-0",
        "a-record-each-entry-records-fewer",
        "a-record-each-entry-records-past-the-range",
    ],
)
def test_a_damaged_batch_counts_the_records_it_held_not_every_entry_of_its_range(
    passes_over: bool, state: dict[str, Any], lost: int, tmp_path: Path
) -> None:
    # A batch's range may hold entries none of its records stands for (a
    # step off the sample table's cadence makes no row): they are dealt
    # with, not lost. A batch whose progress cannot be read loses its
    # records, as its state says; only where that count is damaged too is
    # every entry of its range counted, and never more than that.
    # A journal is untrusted input, and a state may say fewer records than
    # the batch held: where every entry of the sink's kinds is one of its
    # records (Prime Traces, the evaluation samples, the metrics), a batch
    # of entries 1 to 5 held 5, whatever its state says (one saying 0 had
    # them pass uncounted, neither shipped nor lost).
    journal = _journal(tmp_path, 7)
    journal.set_inflight("fake", InFlight(1, 5, json.dumps(["e0", "e1", "e2"]).encode(), state))
    sink = _MultiRequestSink(requests=1, failures=0)
    sink.passes_over_entries = passes_over  # True: as the sample table's
    shipper = _ship(journal, sink, [])
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    assert sink.stored == ["e5", "e6"]
    assert journal.losses()["fake"]["count"] == lost
    journal.close()


def test_a_damaged_batch_is_counted_over_its_range_not_the_whole_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a damaged batch lost is read from the headers of its range
    # alone: a long run's log is not walked once per damaged batch.
    journal = _journal(tmp_path, 3_000)
    journal._absorb()
    shipper = _shipper(journal, FakeSink(), [])
    looked: list[int] = []
    monkeypatch.setattr(
        reading, "peek_kind", lambda value: looked.append(1) or frames.peek_kind(value)
    )
    assert shipper._lost_with(InFlight(2_001, 2_005, b"", {"done": "one"})) == 5
    assert len(looked) <= 5
    journal.close()


def _damage_inflight(
    journal: Journal, sink: str, *, body: bytes | None, info: Any = None, acked: int = 0
) -> None:
    """Write ``sink``'s recorded batch as a damaged journal holds it: its body
    ``body`` (None: gone), and its cursor's batch ``info`` where given, past
    offset ``acked``."""

    def put(txn: Any) -> bool:
        if body is None:
            txn.delete(sink.encode(), db=journal._tx.dbs["inflight"])
        else:
            txn.put(sink.encode(), body, db=journal._tx.dbs["inflight"])
        if info is not None:
            cursor = {"acked": acked, "inflight": info}
            txn.put(
                sink.encode(),
                encode_frame(META_KIND, orjson.dumps(cursor)),
                db=journal._tx.dbs["cursors"],
            )
        return True

    with journal._tx.lock:
        journal._tx.write(put)


_WHOLE_BODY = encode_frame(META_KIND, json.dumps(["e0", "e1", "e2"]).encode())


@pytest.mark.parametrize(
    ("body", "info"),
    [
        (b"not a frame", None),
        (None, None),
        (None, {"first_seq": 1, "last_seq": 5, "state": ["not", "a", "map"]}),
        *(
            (_WHOLE_BODY, {"first_seq": 1, "last_seq": 5, "state": falsy})
            for falsy in (0, "", [], False, None)
        ),
    ],
    ids=[
        "body-damaged",
        "body-missing",
        "state-not-a-map",
        "state-0",
        "state-empty-string",
        "state-empty-list",
        "state-false",
        "state-null",
    ],
)
def test_a_batch_whose_recorded_body_is_damaged_is_counted_and_the_rest_ships(
    body: bytes | None, info: Any, tmp_path: Path
) -> None:
    # A copy from another host, a flipped bit: the body a resend must send
    # byte for byte is gone. Its cursor raised out of every read, so the
    # whole journal went unshipped (`primeruns sync`: exit 4, "damaged
    # journal", every sink). Now that batch alone counts as lost, with the
    # reason, and the rest of every sink ships. A state that is no map is
    # damage too, a falsy one as much as any (it read as an empty state,
    # and its batch was refused with no word of its cursor's damage).
    journal = _journal(tmp_path, 7)
    state = {"done": 0, "last_seq": 5, "records": 3}
    journal.set_inflight("fake", InFlight(1, 5, json.dumps(["e0", "e1", "e2"]).encode(), state))
    _damage_inflight(journal, "fake", body=body, info=info)
    failures: list[str] = []
    sink = _MultiRequestSink(requests=1, failures=0)
    shipper = _ship(journal, sink, failures)
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    assert sink.stored == ["e5", "e6"]  # never the damaged batch, nothing made up
    loss = journal.losses()["fake"]
    assert loss["count"] == 5  # its range's entries: each is one of the sink's records
    assert "the batch in flight of cursor 'fake'" in loss["reasons"][0]
    assert shipper.state.active
    journal.close()


@pytest.mark.parametrize(
    "info",
    [
        {"first_seq": "x", "last_seq": 3},
        {"first_seq": 3, "last_seq": 1},
        {"first_seq": True, "last_seq": 3},
        [1, 3],
    ],
    ids=["a-string", "backwards", "a-bool", "not-a-map"],
)
def test_a_cursor_whose_batch_range_is_unreadable_is_named_damage(
    info: Any, tmp_path: Path
) -> None:
    # Which entries the sink dealt with is unknown: not guessed at, and said
    # as the journal's damage (a ValueError or TypeError escaped before).
    journal = _journal(tmp_path, 3)
    journal.set_inflight("fake", InFlight(1, 3, b"[]", {"records": 3}))
    _damage_inflight(journal, "fake", body=encode_frame(META_KIND, b"[]"), info=info)
    with pytest.raises(JournalCorruptError, match="its offset or its batch's range is unreadable"):
        journal.cursor("fake")
    journal.close()


@pytest.mark.parametrize("body", [None, encode_frame(META_KIND, b"[]")], ids=["missing", "whole"])
@pytest.mark.parametrize("last", [4, 8], ids=["behind-the-offset", "across-the-offset"])
def test_a_cursor_whose_batch_reaches_back_past_its_offset_is_named_damage(
    body: bytes | None, last: int, tmp_path: Path
) -> None:
    # Entries 1-5 acknowledged, a batch of 2..last recorded: one of the two
    # is damaged. Read as a damaged batch, its records were counted lost
    # though the sink holds them (across), or its ack went backwards and the
    # sink stopped with nothing counted (behind); read whole, it was sent
    # again. Which entries the sink dealt with is unknown: the journal's damage.
    journal = _journal(tmp_path, 10)
    journal.set_inflight("fake", InFlight(1, 5, b"[]", {"records": 5}))
    info = {"first_seq": 2, "last_seq": last, "state": {"records": last - 1}}
    _damage_inflight(journal, "fake", body=body, info=info, acked=5)
    with pytest.raises(JournalCorruptError, match="its offset or its batch's range is unreadable"):
        journal.cursor("fake")
    journal.close()


@pytest.mark.parametrize(
    "acked", ["7", 7.0, True, -1], ids=["a-string", "a-float", "a-bool", "negative"]
)
def test_an_offset_cursor_refuses_is_refused_read_alone_too(acked: Any, tmp_path: Path) -> None:
    # The close-out's wait, compaction and ls read a sink's offset alone: an
    # offset its cursor refuses as damage ("7" read as 7 there) made a sink
    # that cannot ship look done to the close-out.
    journal = _journal(tmp_path, 10)
    cursor = encode_frame(META_KIND, orjson.dumps({"acked": acked, "inflight": None}))
    with journal._tx.lock:
        journal._tx.write(lambda txn: txn.put(b"fake", cursor, db=journal._tx.dbs["cursors"]))
    with pytest.raises(JournalCorruptError, match="offset"):
        journal.cursor("fake")
    with pytest.raises(JournalCorruptError, match="offset"):
        journal.acked("fake")
    assert "fake" not in journal.cursors()
    journal.close()


def test_a_damaged_batch_carried_to_another_journal_keeps_no_body(tmp_path: Path) -> None:
    # The previous version reads no "damage": a carried batch with a body
    # (an empty one) was a batch to send there, its records counted as
    # delivered. With none, that version refuses the cursor as damage.
    journal = _journal(tmp_path, 3)
    damaged = InFlight(1, 3, b"", {"records": 3}, damage="its body is missing (elsewhere)")
    journal.set_inflight("fake", damaged)
    with journal._tx.read() as txn:
        assert txn.get(b"fake", db=journal._tx.dbs["inflight"]) is None
    carried = journal.cursor("fake").inflight
    assert carried is not None and carried.damage == damaged.damage  # its reason, as found
    journal.close()


def test_a_damaged_batch_stays_damaged_when_carried_to_another_journal(tmp_path: Path) -> None:
    # A rehome or a sync journal's hand-over records the batch again in
    # another journal: it must arrive as damaged, not as a batch with an
    # empty body that its state says is to be sent.
    journal = _journal(tmp_path / "a", 3)
    journal.set_inflight("fake", InFlight(1, 3, b"[]", {"records": 3}))
    _damage_inflight(journal, "fake", body=b"not a frame")
    damaged = journal.cursor("fake").inflight
    assert damaged is not None and damaged.damage is not None
    other = _journal(tmp_path / "b", 3)
    other.set_inflight("fake", damaged)
    carried = other.cursor("fake").inflight
    assert carried is not None and carried.damage == damaged.damage
    journal.close()
    other.close()


def test_a_damaged_carry_does_not_stop_the_sink(tmp_path: Path) -> None:
    # The numbering a batch carries is the sink's to read; one it cannot read
    # (a damaged journal) starts the numbering afresh, where the sink's
    # restore used to raise out of the shipper's constructor: nothing shipped.
    journal = _journal(tmp_path, 3)
    state = {"sample_ids": [], "carry": {"rollouts": {"0": "x"}}, "last_seq": 3, "records": 3}
    journal.set_inflight("eval_samples", InFlight(1, 3, b'{"samples":[]}', state))
    platform = ScriptedPlatform()
    receipt = {"evaluation_id": "run-1", "inserted": 0, "total": 0}
    platform.route(
        "push",
        "POST",
        "/api/v1/evaluations/[^/]+/samples",
        lambda *_: httpx.Response(200, json=receipt),
    )
    shipper = _ship(journal, EvalSamplesSink(platform.client()), [])
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    assert platform.calls == ["push"]
    journal.close()


def test_an_episode_no_row_can_be_made_of_after_episodes_without_rows_fails_alone(
    tmp_path: Path,
) -> None:
    """Eval samples end a batch before an episode they cannot make rows of
    (an integer of 400 digits) only after a row: with none before it (the
    episodes before it hold no traces), prepare raised, and the shipper
    failed the batch's first entry, an episode with nothing to send, in its
    place; then the bad one: two records counted lost for one."""
    episodes: list[Any] = list(workloads.gsm8k(2))
    empty = orjson.dumps({**episodes[0], "traces": []})
    bad = orjson.dumps(episodes[1])[:-1] + b', "huge": 1' + b"0" * 400 + b"}"
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [empty, empty, bad])
    platform = ScriptedPlatform()  # no route: any request fails the test's drain
    shipper = _ship(journal, EvalSamplesSink(platform.client()), [])
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    losses = journal.losses()
    journal.close()
    assert platform.calls == []
    assert losses["eval_samples"]["count"] == 1


def _closing(
    journal: Journal, sink: FakeSink, policy: RetryPolicy, *, closing: bool = True
) -> Shipper:
    """A started training shipper; ``closing``: revived as a close-out does
    (``sync`` and ``replay`` are not)."""
    shipper = Shipper(
        journal,
        sink,
        binding=lambda: _BOUND,
        training=True,
        policy=policy,
        on_failure=lambda what, exc: None,
    )
    if closing:
        shipper.revive(final=True)  # what a close-out does
    shipper.start()
    return shipper


def test_a_closing_drain_waits_for_a_batch_that_moves_on_request_by_request(
    tmp_path: Path,
) -> None:
    # Each batch is acknowledged only after its three requests, each failing
    # twice first: longer than the stall allowance between acknowledgements,
    # yet a request succeeds every few tries. Before, the close-out measured
    # only acknowledgements and gave up on it ("nothing shipped for 60 s").
    from primeruns.ship.uplink import _drain_while_moving

    journal = _journal(tmp_path, 8)
    sink = _MultiRequestSink(requests=3, failures=2)
    policy = RetryPolicy(base_delay_s=0.01, max_delay_s=0.02, stall_s=0.05, stuck_attempts=8)
    shipper = _closing(journal, sink, policy)
    drained, stalled = _drain_while_moving([shipper], journal.last_seq(), _soon(30), None)
    shipper.stop(timeout=5)
    assert (drained, stalled) == (True, None)
    assert sink.stored == [f"e{i}" for i in range(8)]
    journal.close()


def test_a_closing_drain_gives_up_on_a_sink_that_keeps_failing_and_says_why(
    tmp_path: Path,
) -> None:
    from primeruns.ship.uplink import _drain_while_moving

    journal = _journal(tmp_path, 4)
    sink = FakeSink(transient=10**6)
    policy = RetryPolicy(base_delay_s=0.01, max_delay_s=0.02, stall_s=0.2, stuck_attempts=8)
    shipper = _closing(journal, sink, policy)
    drained, stalled = _drain_while_moving([shipper], journal.last_seq(), _soon(30), None)
    shipper.stop(timeout=5)
    assert not drained
    assert stalled is not None and stalled >= 0.2
    assert len(sink.attempts) >= 8  # it had its tries before being called stuck
    assert shipper.state.last_error is not None and "503 from the fake" in shipper.state.last_error
    assert shipper.pending_records() == 4  # still in the journal, for replay
    journal.close()


class _UnreachedSink(FakeSink):
    """A platform gone: every request fails to connect (nothing listens),
    or, ``answered``, the platform answers every one with a 503."""

    def __init__(self, *, answered: bool = False) -> None:
        super().__init__()
        self.answered = answered

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        self.attempts.append(body)
        if self.answered:
            raise RetryableAPIError("503 from the fake", status_code=503)
        raise error_from_transport(httpx.ConnectError("connection refused"), "POST /fake")


@pytest.mark.parametrize("answered", [False, True])
def test_a_closing_drain_gives_a_platform_refusing_every_connection_the_short_allowance(
    answered: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform went down mid-run: finish()'s drain waited the whole stall
    allowance (60 s) for requests that could not even connect, then the
    finalize its share: 69 s, where the vendor's SDK gave up in 45, keeping
    nothing (the records here stay journaled for sync). Every try refused at
    connect for UNREACHED_S is stuck, as a registration that never connected
    is; a platform that answers, even with 503s, may be restarting and keeps
    the stall allowance."""
    from primeruns.ship import policy as policy_module
    from primeruns.ship.uplink import _drain_while_moving

    monkeypatch.setattr(policy_module, "UNREACHED_S", 0.2)
    journal = _journal(tmp_path, 4)
    sink = _UnreachedSink(answered=answered)
    policy = RetryPolicy(base_delay_s=0.01, max_delay_s=0.02, stall_s=60.0, stuck_attempts=8)
    shipper = _closing(journal, sink, policy)
    # Answered: the deadline (not the stall allowance, 60 s) ends the drain.
    drained, stalled = _drain_while_moving(
        [shipper], journal.last_seq(), _soon(2 if answered else 60), None
    )
    shipper.stop(timeout=5)
    assert not drained
    if answered:
        assert stalled is None
    else:
        assert stalled is not None and 0.2 <= stalled < 60.0
    assert shipper.pending_records() == 4  # still in the journal, for sync
    journal.close()


class _RestartingSink(FakeSink):
    """A platform restarting: it answers 503 while it drains (until
    ``answering_s`` after the first try), then refuses connections while it
    is down (for ``down_s``), then takes every batch."""

    def __init__(self, answering_s: float, down_s: float) -> None:
        super().__init__()
        self.answering_s, self.down_s = answering_s, down_s
        self.first: float | None = None
        self.refused = 0

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        if now - self.first < self.answering_s:
            self.attempts.append(body)
            raise RetryableAPIError("503 from the fake", status_code=503)
        if now - self.first < self.answering_s + self.down_s:
            self.attempts.append(body)
            self.refused += 1
            raise error_from_transport(httpx.ConnectError("connection refused"), "POST /fake")
        super().send(body, ctx)


def _ships_through_the_refusals(shipper: Shipper, journal: Journal, sink: _RestartingSink) -> None:
    """Drain ``shipper`` to the log's end: it ships everything, refused a few times on the way."""
    from primeruns.ship.uplink import _drain_while_moving

    drained, stalled = _drain_while_moving(
        [shipper], journal.last_seq(), _soon(30), lambda progress: None
    )
    shipper.stop(timeout=5)
    assert sink.refused >= 2
    assert (drained, stalled) == (True, None)
    assert shipper.pending_records() == 0
    journal.close()


def test_a_closing_drain_gives_a_platform_that_answered_then_refuses_the_short_allowance_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart: 503s for longer than UNREACHED_S, then refused for less,
    then back. The short allowance counts from the last try that connected,
    not from the last that moved: counted from the move, the first two
    refusals ended the drain, leaving records the old rule shipped."""
    from primeruns.ship import policy as policy_module

    monkeypatch.setattr(policy_module, "UNREACHED_S", 2.0)
    journal = _journal(tmp_path, 4)
    sink = _RestartingSink(answering_s=2.2, down_s=0.6)
    policy = RetryPolicy(base_delay_s=0.01, max_delay_s=0.02, stall_s=60.0, stuck_attempts=8)
    shipper = _closing(journal, sink, policy)
    _ships_through_the_refusals(shipper, journal, sink)


def test_a_sync_drain_ships_by_strikes_through_a_platform_refusing_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sync`` and ``replay`` ship by strikes, as a live run does: the short
    allowance of a platform refusing every connection is a closing run's
    (its sinks retry until the deadline rather than strike out). Applied to
    a sync, one restart of the platform ended it with records it could ship."""
    from primeruns.ship import policy as policy_module

    monkeypatch.setattr(policy_module, "UNREACHED_S", 0.2)
    journal = _journal(tmp_path, 4)
    sink = _RestartingSink(answering_s=0.0, down_s=0.8)
    policy = RetryPolicy(
        base_delay_s=0.01, max_delay_s=0.02, attempts_per_strike=1000, stall_s=60.0
    )
    shipper = _closing(journal, sink, policy, closing=False)
    _ships_through_the_refusals(shipper, journal, sink)


def test_a_batch_striking_out_while_the_run_closes_is_not_paused(tmp_path: Path) -> None:
    # revive(final=True) may land while a batch is on its last attempt of a
    # strike: the strike must not pause the sink for five minutes after it.
    journal = _journal(tmp_path, 3)
    sink = FakeSink(transient=5)
    policy = RetryPolicy(
        base_delay_s=0.001,
        max_delay_s=0.01,
        attempts_per_strike=1,
        strikes_to_retire=1,
        pause_s=300.0,
    )
    shipper = _closing(journal, sink, policy)
    assert shipper.drain(journal.last_seq(), deadline=_soon(10))
    shipper.stop(timeout=5)
    assert shipper.state.paused_until == 0.0
    assert sink.stored == ["e0", "e1", "e2"]
    journal.close()


class _HangingSink(FakeSink):
    """Every request hangs until released (a platform that holds requests
    until the client's timeout), then fails as a timeout would."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        self.attempts.append(body)
        self.release.wait(30)
        raise RetryableAPIError("the request timed out", status_code=504)


def test_a_closing_drain_gives_up_on_a_platform_that_holds_every_request(
    tmp_path: Path,
) -> None:
    # The sink never gets to fail its tries (each lasts a client timeout of
    # a minute or more): twice the stall allowance with nothing moving is
    # enough. Before, finish() waited out its whole timeout.
    from primeruns.ship.uplink import _drain_while_moving

    journal = _journal(tmp_path, 3)
    sink = _HangingSink()
    policy = RetryPolicy(base_delay_s=0.01, max_delay_s=0.02, stall_s=0.2, stuck_attempts=8)
    shipper = _closing(journal, sink, policy)
    drained, stalled = _drain_while_moving([shipper], journal.last_seq(), _soon(30), None)
    assert not drained
    assert stalled is not None and stalled >= 0.4
    assert len(sink.attempts) == 1  # still in its first request
    sink.release.set()
    shipper.stop(timeout=5)
    journal.close()


def test_a_backlog_of_episodes_reaches_the_sample_table_a_few_hundred_rows_a_push(
    tmp_path: Path,
) -> None:
    """A backlog (a burst of episodes, an uplink behind) is pushed in requests
    of at most 256 episodes (a row each), not 2,000: a 25 MiB push of gsm8k
    samples kept the local platform parsing for ~0.3 s of CPU while this sink
    waited on it, and the last such push after the loop ended was most of what
    finish() waited for (tools/bench/end_to_end.py)."""
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [orjson.dumps(e) for e in workloads.gsm8k(600)])
    platform = ScriptedPlatform()
    pushed: list[int] = []

    def push(request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        pushed.append(len(json.loads(request.content)["samples"]))
        return httpx.Response(
            200, json={"evaluation_id": "run-1", "inserted": pushed[-1], "total": sum(pushed)}
        )

    def read(request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        return httpx.Response(200, json={"samples": [], "total": sum(pushed)})

    path = "/api/v1/evaluations/[^/]+/samples"
    platform.route("push", "POST", path, push)
    platform.route("read", "GET", path, read)
    shipper = _ship(journal, EvalSamplesSink(platform.client()), [])
    assert shipper.drain(journal.last_seq(), deadline=_soon(60))
    shipper.stop(timeout=5)
    journal.close()
    assert sum(pushed) == 600 and max(pushed) <= 256


# -- the next batch prepared while the one before it is in flight (ship.early) --
# What a user depends on: a backlog drains with the sink's own work for the
# next batch done during the request before it, and that changes nothing of
# what is sent. Scenarios are shipped twice, by a sink that allows it and by
# the same sink that does not: both must send the same batches, with the
# same numbering, each record once (the oracle: the shipper without it).


class NumberingSink(FakeSink):
    """Numbers its records from batch to batch (a carry, as the sample table
    numbers rollouts) and fails as told: by the attempt (1-based) a 503, a
    413 (refused whole: too large) or a rejection naming an id's line."""

    def __init__(
        self, *, early: bool, transient: Sequence[int] = (), too_large: Sequence[int] = ()
    ) -> None:
        super().__init__(reject_id="e5")
        self.prepares_while_sending = early
        self.fail_at = set(transient)
        self.too_large = set(too_large)
        self.number = 0
        self.prepares = 0
        self.rows: list[list[Any]] = []  # stored: [id, number]

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared[Any] | None:
        self.prepares += 1
        ids = [json.loads(e.payload)["id"] for e in entries]
        rows = [[i, self.number + n + 1] for n, i in enumerate(ids)]
        return Prepared(
            body=json.dumps(rows).encode(),
            records=len(rows),
            progress=NoProgress(),
            carry={"number": self.number + len(rows)},
        )

    def restore(self, carry: dict[str, Any]) -> None:
        self.number = int(carry.get("number", 0))

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        self.attempts.append(body)
        rows = json.loads(body)
        if len(self.attempts) in self.fail_at:
            raise RetryableAPIError("503 from the fake", status_code=503)
        if len(self.attempts) in self.too_large and len(rows) > 1:
            raise APIError("HTTP 413: too large", status_code=413)
        ids = [row[0] for row in rows]
        if self.reject_id in ids:
            line = ids.index(self.reject_id) + 1
            raise ValidationRejectedError(f"HTTP 400: line {line}: bad id", status_code=400)
        self.rows.extend(rows)


def _drain(journal: Journal, sink: Sink) -> None:
    shipper = _ship(journal, sink, [])
    assert shipper.drain(journal.last_seq(), deadline=_soon(20))
    shipper.stop(timeout=5)


class _HeldSink(NumberingSink):
    """Holds its first request until the next batch is prepared (or 10 s);
    looks at what the journal recorded of each batch it sends."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(early=True)
        self.reject_id = "none"
        self.journal = journal
        self.second = threading.Event()
        self.prepared_in_flight: bool | None = None
        self.recorded: list[bool] = []

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared[Any] | None:
        prepared = super().prepare(entries, binding)
        if self.prepares == 2:
            self.second.set()
        # Bodies the journal compresses, as a push of samples is.
        return None if prepared is None else replace(prepared, body=prepared.body + b" " * 65536)

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        if self.prepared_in_flight is None:
            self.prepared_in_flight = self.second.wait(10)
        inflight = self.journal.cursor(self.name).inflight
        self.recorded.append(inflight is not None and inflight.body == body)
        super().send(body, ctx)


def test_the_next_batch_is_prepared_while_the_one_before_is_in_flight(tmp_path: Path) -> None:
    journal = _journal(tmp_path, 12)
    sink = _HeldSink(journal)
    _drain(journal, sink)
    assert sink.prepared_in_flight  # the second batch was made during the first request
    # Each batch prepared once, recorded as sent, each record stored once, in order.
    assert sink.prepares == 3
    assert sink.recorded == [True, True, True]
    assert sink.rows == [[f"e{i}", i + 1] for i in range(12)]
    assert journal.cursor("fake").acked == journal.last_seq()
    journal.close()


@pytest.mark.parametrize(
    "faults",
    [
        {},
        {"transient": (1, 2, 4)},
        {"too_large": (1,)},
        {"transient": (2,), "too_large": (3,)},
    ],
    ids=["clean", "transient", "too-large", "both"],
)
def test_what_is_sent_is_what_the_shipper_sends_without_preparing_early(
    faults: dict[str, Any], tmp_path: Path
) -> None:
    # A batch in flight that is refused whole and cut (a 413, a rejection
    # isolating e5), retried or acknowledged: the batch prepared meanwhile is
    # used only where it is the one that would be made then, with the same
    # numbering. The oracle: the same scenario without early preparation.
    sent: dict[bool, list[bytes]] = {}
    stored: dict[bool, list[list[Any]]] = {}
    for early in (False, True):
        journal = _journal(tmp_path / str(early), 14)
        sink = NumberingSink(early=early, **faults)
        _drain(journal, sink)
        assert journal.losses()["fake"]["count"] == 1  # e5 alone
        sent[early], stored[early] = sink.attempts, sink.rows
        journal.close()
    assert stored[True] == stored[False]
    assert sent[True] == sent[False]
    ids = [row[0] for row in stored[True]]
    assert sorted(ids) == sorted(f"e{i}" for i in range(14) if i != 5)
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("early", [False, True])
def test_damage_met_while_a_batch_is_in_flight_is_still_counted(
    early: bool, tmp_path: Path
) -> None:
    # The read for the next batch, made during the request before it, is the
    # one that meets the missing entries: they are counted all the same.
    journal = _journal_missing(tmp_path, 12, (6, 7))
    sink = NumberingSink(early=early)
    sink.reject_id = "none"
    _drain(journal, sink)
    assert [row[0] for row in sink.rows] == [f"e{i}" for i in range(12) if i not in (5, 6)]
    assert journal.losses()["fake"]["count"] == 2
    journal.close()


def test_a_backlog_reaches_the_sample_table_once_through_lost_answers_and_failures(
    tmp_path: Path,
) -> None:
    # The sample table appends and cannot deduplicate: with the next push
    # prepared while one is in flight, pushes whose answer was lost, refused
    # or failed, and reads that failed, every row is there exactly once.
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [orjson.dumps(e) for e in workloads.gsm8k(900)])
    platform = ScriptedPlatform()
    table: list[dict[str, Any]] = []

    def push(request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        rows = json.loads(request.content)["samples"]
        table.extend(rows)
        return httpx.Response(200, json={"evaluation_id": "run-1", "inserted": len(rows)})

    def read(request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        page, limit = int(request.url.params["page"]), int(request.url.params["limit"])
        items = table[(page - 1) * limit : page * limit]
        return httpx.Response(200, json={"samples": items, "total": len(table)})

    path = "/api/v1/evaluations/[^/]+/samples"
    platform.route("push", "POST", path, push)
    platform.route("read", "GET", path, read)
    platform.fail("push", LOST, PASS, error(503, "busy"), REFUSED, PASS, LOST, LOST)
    platform.fail("read", PASS, PASS, error(502, "gateway"), PASS, REFUSED)
    sink = EvalSamplesSink(platform.client())
    assert sink.prepares_while_sending
    _drain(journal, sink)
    journal_losses = journal.losses()
    journal.close()
    ids = [row["sample_id"] for row in table]
    assert len(ids) == len(set(ids)) == 900  # a row per episode, each once
    assert journal_losses == {}


@pytest.mark.parametrize("early", [False, True])
def test_damage_whose_count_could_not_be_written_is_counted_once_it_can(
    early: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk is full as the read that met entries 6 and 7 missing counts
    # them: the shipper backs off and reads again, and the loss is written
    # then (once), before the batch past the gap is acknowledged.
    journal = _journal_missing(tmp_path, 12, (6, 7))
    record_loss = journal.record_loss
    full = [True]  # the disk is full for the first loss written

    def full_once(sink: str, count: int, reason: str, **how: Any) -> None:
        if full:
            full.pop()
            raise JournalFullError(f"journal {journal.path}: no space left on device")
        record_loss(sink, count, reason, **how)

    monkeypatch.setattr(journal, "record_loss", full_once)
    sink = NumberingSink(early=early)
    sink.reject_id = "none"
    _drain(journal, sink)
    assert not full  # the disk was full once
    assert [row[0] for row in sink.rows] == [f"e{i}" for i in range(12) if i not in (5, 6)]
    assert journal.losses()["fake"]["count"] == 2
    journal.close()


class _TwoAtATimeSink(NumberingSink):
    """Takes two of the entries it is given (as a sink that cuts its batch at
    a size or a change of kind): the rest stay read ahead for the next."""

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared[Any] | None:
        prepared = super().prepare(entries[:2], binding)
        assert prepared is not None
        last = entries[min(1, len(entries) - 1)].seq
        return replace(prepared, last_seq=None if last == entries[-1].seq else last)


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("gone", [(4, 6), (4, 8)])
def test_damage_read_ahead_of_a_batch_is_counted_once(
    early: bool, gone: tuple[int, int], tmp_path: Path
) -> None:
    # The first read meets entry 4 missing and keeps 3 and 5 for the next
    # batch; the read for the next batch (made during the first request, or
    # after it) meets entry 6 or 8 missing. A read made early and dropped for
    # that reads 3 and 5 again, and a read that stops just before a gap
    # reports it, as the next read does: each lost entry counts once.
    journal = _journal_missing(tmp_path, 12, gone)
    sink = _TwoAtATimeSink(early=early)
    sink.reject_id = "none"
    _drain(journal, sink)
    assert [row[0] for row in sink.rows] == [f"e{i}" for i in range(12) if i + 1 not in gone]
    assert journal.losses()["fake"]["count"] == 2
    journal.close()


@pytest.mark.parametrize("early", [False, True])
def test_damage_in_a_batch_refused_whole_is_counted_once(early: bool, tmp_path: Path) -> None:
    # The first batch's read meets entry 3 missing; the batch is refused as
    # too large and made again of half as many, from the same place: the
    # read that makes it meets entry 3 again, counted already.
    journal = _journal_missing(tmp_path, 12, [3])
    sink = NumberingSink(early=early, too_large=(1,))
    sink.reject_id = "none"
    _drain(journal, sink)
    assert [row[0] for row in sink.rows] == [f"e{i}" for i in range(12) if i != 2]
    assert journal.losses()["fake"]["count"] == 1
    journal.close()


class _StopsOnceStored:
    """Mixed into a sink: stops its shipper once its first batch is stored (a
    process ending there: a close-out's deadline, a SIGTERM)."""

    shipper: Shipper

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        super().send(body, ctx)  # type: ignore[misc]
        self.shipper.signal_stop()


class _StopAfterFirst(_StopsOnceStored, FakeSink):
    """A sink of one entry a batch that stops after its first."""


def test_a_gap_just_past_a_batch_is_counted_once_across_a_restart(tmp_path: Path) -> None:
    # The first batch's read (four entries) stops at entry 6 and reports 5
    # missing on the way: the batch is acknowledged past the gap, so the
    # next process, reading on from there, does not count it again.
    journal = _journal_missing(tmp_path, 12, [5])
    first = _StopAfterFirst()
    first.shipper = _shipper(journal, first, [])
    first.shipper.start()
    first.shipper.join(10)
    assert first.stored == ["e0", "e1", "e2", "e3"]
    second = FakeSink()
    _drain(journal, second)
    assert second.stored == [f"e{i}" for i in range(5, 12)]
    assert journal.losses()["fake"]["count"] == 1
    journal.close()


class _TwoThenStop(_StopsOnceStored, _TwoAtATimeSink):
    """Takes two entries a batch and stops after its first."""


def _two_then_stop(journal: Journal) -> _TwoThenStop:
    """A process that ships one batch of two entries of ``journal`` and
    stops: its sink, once its shipper ended."""
    first = _TwoThenStop(early=False)
    first.reject_id = "none"
    first.shipper = _shipper(journal, first, [])
    first.shipper.start()
    first.shipper.join(10)
    return first


def test_damage_read_ahead_is_counted_once_across_a_restart(tmp_path: Path) -> None:
    # The first read meets entry 4 missing and counts it; the batch takes
    # entries 1 and 2 alone and the process stops once it is acknowledged,
    # short of the gap. The next process reads on from entry 2 and meets
    # entry 4 missing again: counted already, it is not counted twice.
    journal = _journal_missing(tmp_path, 12, [4])
    first = _two_then_stop(journal)
    assert [row[0] for row in first.rows] == ["e0", "e1"]
    assert journal.acked("fake") == 2 and journal.losses()["fake"]["count"] == 1
    second = _TwoAtATimeSink(early=False)
    second.reject_id = "none"
    _drain(journal, second)
    assert [row[0] for row in second.rows] == [f"e{i}" for i in range(2, 12) if i != 3]
    assert journal.losses()["fake"]["count"] == 1
    journal.close()


def _spooled_then_damaged(
    tmp_path: Path, n: int, damaged: int, how: str, *, moved: int = 0, shipped: int = 0
) -> Path:
    """A journal of ``n`` episodes logged one call each, all in its newest
    (and only) spool segment, the first ``moved`` of them moved into LMDB
    too and the first ``shipped`` shipped, as a producer killed before its
    mover got to the rest leaves it, with the call the kill interrupted cut
    short at its end; then the append of episode ``damaged`` is damaged
    (``how``)."""
    journal = Journal.create(tmp_path / "runs")
    journal._mover.stop()
    for i in range(n):
        if i == moved and moved:
            journal._mover.step()
        if i == shipped and shipped:
            _drain(journal, FakeSink())
        journal.append(EntryKind.EPISODE, [json.dumps({"id": f"e{i}", "traces": []}).encode()])
    segment, data, starts = killed_segment(journal)
    at = starts[damaged]
    if how == "append header":
        data[at] ^= 0xFF  # its magic
    elif how == "frame header":
        data[at + APPEND.size] ^= 0xFF  # its frame's version
    elif how == "append length":  # past the segment's end, as a cut-short append's
        data[at + 10] ^= 0x40
    else:
        data[at + 4 : at + 40] = bytes(36)  # a zeroed range across both
    cut = encode_frame(
        int(EntryKind.EPISODE), b'{"id":"never returned"}', compress=False, seq=n + 1
    )
    data += APPEND.pack(b"PS", 1, 1, len(cut)) + cut[:-5]
    segment.write_bytes(bytes(data))
    return journal.path


@pytest.mark.parametrize("how", ["append header", "frame header", "zeroed", "append length"])
def test_damage_in_the_newest_spool_segment_is_counted_once(how: str, tmp_path: Path) -> None:
    # Episodes e3 to e11 were written whole (their calls returned) and
    # damage in e3's append ends what a reader takes of the segment; no
    # later segment's first seq tells how many came after. Each episode
    # lands or is counted lost, once, across processes (the first read, of
    # e0 to e2, meets the damage and the batch takes two); the call cut short
    # by the kill is neither.
    path = _spooled_then_damaged(tmp_path, 12, 3, how)
    with Journal.open(path, owner=True):
        pass  # a sync that shipped nothing (the platform down): its mover moved e0-e2
    with Journal.open(path, owner=True) as journal:
        first = _two_then_stop(journal)
        assert [row[0] for row in first.rows] == ["e0", "e1"]
        lost = journal.losses()["fake"]
        assert lost["count"] == 9 and lost["reasons"][-1].startswith("damaged: spool segment")
    stored = [row[0] for row in first.rows]
    for _ in range(2):  # the next process, and one after everything shipped
        with Journal.open(path, owner=True) as journal:
            second = FakeSink()
            _drain(journal, second)
            assert journal.losses()["fake"]["count"] == 9
            stored += second.stored
    assert stored == ["e0", "e1", "e2"]


def test_damage_in_a_moved_part_of_the_newest_spool_segment_counts_what_was_not(
    tmp_path: Path,
) -> None:
    # The mover had moved e0 to e5 into LMDB when the producer was killed,
    # and the segment was damaged in e3's append after: e3 to e5 ship from
    # LMDB, and what the damage cost is e6 to e11, counted once.
    path = _spooled_then_damaged(tmp_path, 12, 3, "append header", moved=6)
    stored: list[str] = []
    for _ in range(2):
        with Journal.open(path, owner=True) as journal:
            sink = FakeSink()
            _drain(journal, sink)
            stored += sink.stored
            assert journal.losses()["fake"]["count"] == 6
    assert stored == [f"e{i}" for i in range(6)]


def test_damage_past_everything_shipped_is_counted_before_a_drain_ends(tmp_path: Path) -> None:
    # e0 to e2 were shipped before the kill, and damage in e3's append cost
    # e3 to e11: a drain to the log's end (e2, acknowledged already) waits
    # until the damage past it is counted, or the process ends without it.
    path = _spooled_then_damaged(tmp_path, 12, 3, "append header", shipped=3)
    for _ in range(2):
        with Journal.open(path, owner=True) as journal:
            assert journal.acked("fake") == journal.last_seq() == 3
            sink = FakeSink()
            unstarted = _shipper(journal, sink, [])
            # Shipped through the log's end, but the damage is owed (once).
            counted = journal.losses().get("fake", {}).get("count")
            assert unstarted.settled(3) == (counted == 9)
            _drain(journal, sink)
            assert sink.stored == []
            assert journal.losses()["fake"]["count"] == 9


@pytest.mark.parametrize("successor", ["cut short", "empty"])
def test_damage_before_a_segment_that_holds_no_entry_is_counted_and_passed(
    successor: str, tmp_path: Path
) -> None:
    # The producer was killed in its first append to a new segment (or
    # just after making it): that segment holds no whole append, but its
    # name says entries 4 to 12 came before it, in the segment that damage
    # in e3's append cut short. The log's end was taken as 12 and the reads
    # stopped at 3 with nothing reported: no loss counted, and every drain
    # waited out its deadline. They are counted, once, and passed.
    path = _spooled_then_damaged(tmp_path, 12, 3, "append header")
    [(_, name)] = list_segments(path)
    segment = path / name
    data = segment.read_bytes()
    cut = encode_frame(int(EntryKind.EPISODE), b'{"id":"never returned"}', compress=False, seq=13)
    tail = APPEND.size + len(cut) - 5
    segment.write_bytes(data[:-tail])
    (path / segment_name(13)).write_bytes(data[-tail:] if successor == "cut short" else b"")
    stored: list[str] = []
    for _ in range(2):
        with Journal.open(path, owner=True) as journal:
            assert journal.last_seq() == 12
            sink = FakeSink()
            _drain(journal, sink)
            stored += sink.stored
            assert journal.losses()["fake"]["count"] == 9
            assert journal.acked("fake") == 12
    assert stored == ["e0", "e1", "e2"]


@pytest.mark.parametrize("first", [(1 << 64) - 2, 1 << 63])
def test_a_segment_named_past_any_seq_ships_the_rest_and_settles(
    first: int, tmp_path: Path
) -> None:
    """A journal is untrusted input: a spool segment named past the last seq
    an LMDB key may hold (a crafted name, near 2**64) set the log's end to
    the seq before it, though no read could reach it: the reads past the
    journal's own five entries found neither entries nor damage, so a
    shipper never settled (a sync waited out its deadline), and the end
    past the damage ran past 2**64. Such a segment holds no entry of the
    log: its five episodes ship, the shipper settles, and it is reported as
    damage."""
    journal = _journal(tmp_path, 5)
    path = journal.path
    journal.close()
    frames = [
        encode_frame(int(EntryKind.EPISODE), b'{"id":"x","traces":[]}', compress=False, seq=seq)
        for seq in (first, first + 1)
    ]
    crafted = APPEND.pack(b"PS", 1, 2, sum(map(len, frames))) + b"".join(frames)
    (path / segment_name(first)).write_bytes(crafted)
    with Journal.open(path, owner=True) as owner:
        assert (owner.last_seq(), owner.damaged_end()) == (5, 5)
        assert any(segment_name(first) in d.what for d in owner.damage())
        sink = FakeSink()
        _drain(owner, sink)
        assert sink.stored == [f"e{i}" for i in range(5)]
        assert owner.losses() == {}
    with Journal.open(path, owner=False) as reader:
        assert (reader.last_seq(), reader.damaged_end()) == (5, 5)
        assert [e.seq for e in reader.read(0, max_entries=100).entries] == list(range(1, 6))


def test_a_sink_numbers_on_past_a_batch_whose_recorded_state_is_damaged(tmp_path: Path) -> None:
    # Rows 1-7 numbered (e0-e6), the batch of e4-e6 in flight, its state then
    # damaged. Its records are lost, but it may have been stored: the rows
    # after it go on from 8, as the sink saved before recording it. Numbered
    # afresh from 1, they took numbers (rollouts, sample ids) stored already.
    journal = _journal(tmp_path, 10)
    journal.ack("fake", 4)
    journal.set_meta("carry.fake", {"number": 7})
    journal.set_inflight("fake", InFlight(5, 7, b"[]", {"records": 3, "carry": {"number": 7}}))
    info = {"first_seq": 5, "last_seq": 7, "state": ["not", "a", "map"]}
    _damage_inflight(journal, "fake", body=encode_frame(META_KIND, b"[]"), info=info, acked=4)
    sink = NumberingSink(early=False)
    sink.reject_id = "none"
    _drain(journal, sink)
    assert sink.rows == [["e7", 8], ["e8", 9], ["e9", 10]]
    assert journal.losses()["fake"]["count"] == 3
    journal.close()


def _paused_training_sink(tmp_path: Path) -> Journal:
    """A training run's sink paused (five minutes) after a batch struck out,
    its shipper stopped: the pause is what the journal says for the producer."""
    journal = _journal(tmp_path, 3)
    policy = RetryPolicy(
        base_delay_s=0.001,
        max_delay_s=0.01,
        attempts_per_strike=1,
        strikes_to_retire=1,
        pause_s=300.0,
    )
    shipper = Shipper(
        journal,
        FakeSink(transient=10**6),
        binding=lambda: _BOUND,
        training=True,
        policy=policy,
        on_failure=lambda what, exc: None,
    )
    shipper.start()
    assert not shipper.drain(journal.last_seq(), deadline=_soon(10))  # paused: gives up
    shipper.stop(timeout=5)
    assert shipper.state.paused_until > time.monotonic()
    assert ledger.read_standing(journal, "fake").settled
    return journal


def _step_wall_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


def test_a_recorded_pause_outlasts_a_wall_clock_step_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NTP or a resumed VM steps the wall clock two hours ahead during the
    # pause: the sink is still paused (flush() must not wait out its five
    # minutes as if it were shipping).
    journal = _paused_training_sink(tmp_path)
    _step_wall_clock(monkeypatch, 2 * 3600)
    assert ledger.read_standing(journal, "fake").settled
    journal.close()


def test_a_recorded_pause_ends_on_time_after_a_wall_clock_step_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wall clock steps two hours back during the pause, and the pause's
    # five minutes pass (on the clocks that never step): the sink ships
    # again, and flush() must wait for it, not read it as paused for hours.
    journal = _paused_training_sink(tmp_path)
    _step_wall_clock(monkeypatch, -2 * 3600)
    real = time.clock_gettime
    monkeypatch.setattr(time, "clock_gettime", lambda clock: real(clock) + 301.0)
    assert not ledger.read_standing(journal, "fake").settled
    journal.close()


def test_a_stray_key_in_the_journal_is_not_counted_as_a_lost_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A key no entry has (a hand-made journal, a damaged tree) is damage to
    # the structure, not a record: every record still ships. The live
    # uplink counted it as one lost record at every read that walked past
    # it, so a run's losses grew with each batch read after it; sync and
    # replay, which read a rebuilt journal, counted none. Said, not counted.
    journal = _journal(tmp_path, 6)
    journal._mover.step()  # into LMDB, where the stray key goes
    put_stray(journal, b"\xff" * 9, b"stray")  # after every entry's key
    sink = FakeSink()
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        shipper = _ship(journal, sink, [])
        assert shipper.drain(journal.last_seq(), deadline=_soon(10))
        # Each read walks LMDB's keys to their end, past the stray key, then
        # the spool (where appends stay: none can go into LMDB past it).
        for more in range(6, 12, 2):
            journal.append(EntryKind.EPISODE, [json.dumps({"id": f"e{more}"}).encode()])
            journal.append(EntryKind.EPISODE, [json.dumps({"id": f"e{more + 1}"}).encode()])
            assert shipper.drain(journal.last_seq(), deadline=_soon(10))
        shipper.stop(timeout=5)
    assert sink.stored == [f"e{i}" for i in range(12)]
    assert "fake" not in journal.losses()
    assert caplog.text.count("malformed entry key") == 1  # said once
    journal.close()
