"""The journal held in memory (an online run no folder takes): it answers the
shippers as a journal on disk does, forgets what every sink acknowledged, and
counts what it cannot keep."""

from __future__ import annotations

import dis
import sys
import threading
from collections.abc import Callable
from types import FrameType

import pytest

from primeruns.exceptions import RunFinishedError
from primeruns.journal import EntryKind, InFlight
from primeruns.journal.memory import MemoryJournal


def _journal(max_bytes: int = 1 << 20) -> MemoryJournal:
    return MemoryJournal(max_bytes=max_bytes, meta={"spec": {"kind": "eval"}})


def test_reads_after_an_offset_by_kind_and_says_how_far_they_got() -> None:
    j = _journal()
    j.append(EntryKind.RUN_OPEN, [b"{}"])
    j.append(EntryKind.EPISODE, [b"e1", b"e2", b"e3"])
    j.append(EntryKind.METRICS, [b"m1"])
    found = j.read(0, kinds={EntryKind.EPISODE}, max_entries=2)
    assert [(e.seq, e.payload) for e in found.entries] == [(2, b"e1"), (3, b"e2")]
    assert found.next_after == 3
    rest = j.read(found.next_after, kinds={EntryKind.EPISODE})
    assert [e.payload for e in rest.entries] == [b"e3"] and rest.next_after == 5
    assert j.read(5).entries == [] and j.read(5).next_after == 5
    headers = j.read(0, kinds={EntryKind.EPISODE}, max_entry_bytes=0)
    assert headers.entries == [] and [s for s, _, _ in headers.oversized] == [2, 3, 4]
    assert j.get_meta("spec") == {"kind": "eval"}


def test_what_every_sink_acknowledged_leaves_memory_but_the_runs_lifecycle() -> None:
    j = _journal()
    j.append(EntryKind.RUN_OPEN, [b"{}"])
    j.append(EntryKind.EPISODE, [b"x" * 100] * 4)
    j.set_sinks(["traces", "eval_samples"])
    j.set_inflight("traces", InFlight(2, 3, b"body", {"n": 1}))
    assert j.cursor("traces").inflight == InFlight(2, 3, b"body", {"n": 1})
    j.ack("traces", 3)
    assert j.size_bytes() > 400  # eval_samples has acknowledged nothing
    j.ack("eval_samples", 5, failed=1, reason="rejected")
    assert j.cursor("traces").inflight is None
    j.ack("traces", 5)
    assert [e.seq for e in j.read(0).entries] == [1]  # the spec is kept
    assert j.tally([3])[0][EntryKind.EPISODE] + j.tally([3])[1][EntryKind.EPISODE] == 4
    assert j.tallies_past([6, 0, 3]) == [j.tally_past(a) for a in (6, 0, 3)]
    for after in range(7):
        assert j.tally_past(after) == j.tally([after])[-1], after
        for upto in range(after + 1, 8):
            assert j.tally_range(after, upto) == j.tally([after, upto])[1], (after, upto)
    assert j.compacted() == j.tally()[0] - j.tally_range(0, 6)
    assert j.losses() == {"eval_samples": {"count": 1, "reasons": ["rejected"]}}
    with pytest.raises(ValueError):
        j.ack("traces", 4)  # backwards
    with pytest.raises(ValueError):
        j.ack("traces", 9)  # past the end


def test_appends_past_the_budget_are_dropped_and_counted_but_the_finish_is_kept() -> None:
    j = _journal(max_bytes=100)
    assert j.append(EntryKind.EPISODE, [b"x" * 60]).dropped == 0
    assert j.append(EntryKind.EPISODE, [b"y" * 60]).dropped == 1
    assert j.losses()["journal"]["count"] == 1
    assert j.append(EntryKind.FINISH, [b"{}"], essential=True, final=True).dropped == 0
    with pytest.raises(RunFinishedError):
        j.append(EntryKind.EPISODE, [b"z"])


def test_a_waiting_shipper_is_woken_by_an_append() -> None:
    j = _journal()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(j.wait_for_append(0, 30.0)))
    waiter.start()
    j.append(EntryKind.EPISODE, [b"e"])
    waiter.join(30.0)
    assert got == [True]


def test_a_batch_recorded_as_damaged_reads_back_damaged_with_its_reason() -> None:
    """A batch carried here as damaged (a journal elsewhere found its body or
    state damaged) kept neither its damage nor its reason: read back whole,
    the shipper sent its empty body as the batch and its records counted
    as delivered, never as lost. It reads back as recorded, as on disk."""
    j = _journal()
    j.append(EntryKind.EPISODE, [b"e1", b"e2", b"e3"])
    damaged = InFlight(1, 3, b"", {"records": 3}, damage="its body is missing (elsewhere)")
    j.set_inflight("traces", damaged)
    assert j.cursor("traces").inflight == damaged
    j.update_inflight_state("traces", {"records": 2})
    kept = j.cursor("traces").inflight
    assert kept is not None and kept.damage == damaged.damage


def _interrupt_at(line: int, call: Callable[[], object]) -> bool:
    """Run ``call`` with a KeyboardInterrupt raised in ``MemoryJournal.append``
    as it reaches ``line`` (as Ctrl-C's handler raises one between two
    lines); whether it was raised."""
    code = MemoryJournal.append.__code__
    raised: list[bool] = []

    def local(frame: FrameType, event: str, arg: object) -> object:
        if event == "line" and frame.f_lineno == line and not raised:
            raised.append(True)
            raise KeyboardInterrupt
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> object:
        return local if frame.f_code is code else None

    sys.settrace(tracer)
    try:
        call()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    return bool(raised)


@pytest.mark.parametrize(
    "line", sorted({line for _, line in dis.findlinestarts(MemoryJournal.append.__code__) if line})
)
def test_an_append_interrupted_anywhere_leaves_every_later_record_read_once(line: int) -> None:
    j = _journal()
    j.append(EntryKind.RUN_OPEN, [b"{}"])
    _interrupt_at(line, lambda: j.append(EntryKind.EPISODE, [b"a1", b"a2"]))
    j.append(EntryKind.EPISODE, [b"b1"])
    found = j.read(0, kinds={EntryKind.EPISODE})
    seqs = [e.seq for e in found.entries]
    assert seqs == sorted(set(seqs)) and seqs[-1] == j.last_seq()
    payloads = [e.payload for e in found.entries]
    assert payloads[-1] == b"b1" and payloads.count(b"b1") == 1
    assert payloads[:-1] in ([], [b"a1", b"a2"])  # the interrupted call: all or nothing


def test_meta_values_are_removed_with_others_stored() -> None:
    journal = _journal()
    journal.update_meta({"a": 1, "b": 2})
    journal.update_meta({"c": 3}, drop=["a", "missing"])
    assert journal.get_metas(["a", "b", "c"]) == ({"b": 2, "c": 3}, [])


def test_several_meta_values_are_read_at_once() -> None:
    journal = _journal()
    journal.update_meta({"a": [1, 2], "b": None})
    assert journal.get_metas(["a", "b", "missing"]) == ({"a": [1, 2], "b": None}, [])
