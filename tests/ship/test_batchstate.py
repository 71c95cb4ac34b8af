"""A recorded batch's state between the journal's JSON and the sinks' typed
progress (``primeruns.ship.batchstate``).

The journal's keys are those every version wrote, and the journal is
untrusted input: a state damaged on disk or written by another tool raises
one exception naming the key (what the shipper does with it is tested with
the shipper, ``test_shipper_alone``), never a TypeError from inside a sink.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import pytest
import workloads
from scripted_platform import Batch, ScriptedPlatform, entries_of

from primeruns.journal import EntryKind, InFlight
from primeruns.ship.batchstate import BadState, changes, from_journal, to_journal
from primeruns.sinks.base import Binding, Prepared
from primeruns.sinks.eval_samples import EvalSamplesProgress, EvalSamplesSink
from primeruns.sinks.traces import TracesSink
from primeruns.sinks.train_metrics import MetricsProgress, TrainMetricsSink
from primeruns.sinks.train_samples import TrainSamplesProgress, TrainSamplesSink

_BOUND = Binding(run_id="run-1", kind="eval")


def _read(state: dict[str, Any], progress_type: type[Any]) -> Prepared[Any]:
    return from_journal(InFlight(1, 3, b"body", state), progress_type)


def test_each_sink_records_a_new_batch_with_the_keys_it_always_did() -> None:
    # The typed progress changes nothing in the journal: a journal written
    # by an earlier version resumes here, and one written here resumes there.
    platform = ScriptedPlatform()
    client = platform.client()
    episodes = entries_of(EntryKind.EPISODE, workloads.gsm8k(3))
    steps = entries_of(EntryKind.EPISODE, workloads.agentic_by_step(2)[0])
    rows = entries_of(EntryKind.METRICS, [{"step": 0, "loss": 1.0}])
    made = {
        "eval_samples": Batch.prepare(EvalSamplesSink(client), episodes, _BOUND),
        "train_samples": Batch.prepare(TrainSamplesSink(client), steps, _BOUND),
        "train_metrics": Batch.prepare(TrainMetricsSink(client), rows, _BOUND),
        "traces": Batch.prepare(TracesSink(client, context={}), episodes, _BOUND),
    }
    keys = {name: set(batch.state) for name, batch in made.items()}
    assert keys == {
        "eval_samples": {"sample_ids", "carry", "last_seq", "records"},
        "train_samples": {"done", "carry", "last_seq", "records"},
        "train_metrics": {"done", "last_seq", "records"},
        "traces": {"content_type", "key", "episode", "counters", "last_seq", "records"},
    }
    for batch in made.values():  # JSON as the journal stores it, and back
        stored = json.loads(json.dumps(batch.state))
        assert _read(stored, batch.progress_type).progress == batch.progress


def test_keys_a_batch_records_later_read_back_and_absent_ones_are_their_defaults() -> None:
    recorded = {"done": 2, "put": True, "last_seq": 3, "records": 5, "carry": {"ranges": {}}}
    batch = _read(recorded, TrainSamplesProgress)
    assert batch.progress == TrainSamplesProgress(done=2, put=True)
    assert (batch.records, batch.last_seq, batch.carry, batch.counters) == (
        5,
        3,
        {"ranges": {}},
        {},
    )
    ids = _read({"sample_ids": ["a", "b"], "records": 2}, EvalSamplesProgress).progress
    assert ids == EvalSamplesProgress(sample_ids=("a", "b"))


def test_only_what_changed_is_written() -> None:
    minted = TrainSamplesProgress(done=0, key="k", url="u")
    assert changes(minted, replace(minted, put=True)) == {"put": True}
    assert changes(replace(minted, put=True), TrainSamplesProgress(done=1)) == {
        "done": 1,
        "key": None,
        "url": None,
        "put": False,
    }
    attempted = EvalSamplesProgress(("a",), attempted=True)
    assert changes(attempted, replace(attempted)) == {}  # saved again: nothing to write
    with pytest.raises(TypeError):
        changes(attempted, MetricsProgress(done=1))


@pytest.mark.parametrize(
    "state",
    [
        {"records": 3},  # "done" missing
        {"done": "2", "records": 3},  # a number as a string
        {"done": True, "records": 3},  # a bool is not a count
        {"done": 1.5, "records": 3},
        {"done": None, "records": 3},
        {"done": 0, "key": 7, "records": 3},
        {"done": 0, "put": "yes", "records": 3},
        {"done": 0},  # "records" missing
        {"done": 0, "records": -1},
        {"done": 0, "records": "3"},
        {"done": 0, "records": 3, "counters": [1]},
        {"done": 0, "records": 3, "counters": {"traces_receipts": "1"}},
    ],
)
def test_a_damaged_state_is_refused_by_name(state: dict[str, Any]) -> None:
    with pytest.raises(BadState, match="the batch recorded in the journal is damaged: '"):
        _read(state, TrainSamplesProgress)


def test_a_list_of_the_wrong_items_is_refused() -> None:
    with pytest.raises(BadState, match="'sample_ids'"):
        _read({"sample_ids": ["a", 2], "records": 2}, EvalSamplesProgress)
    with pytest.raises(BadState, match="'sample_ids'"):
        _read({"sample_ids": "ab", "records": 2}, EvalSamplesProgress)


def test_a_progress_field_may_not_take_a_key_of_the_shippers() -> None:
    @dataclass(frozen=True)
    class Clashing:
        records: int

    with pytest.raises(TypeError, match="records"):
        to_journal(Prepared(body=b"", records=1, progress=Clashing(1)), 1)
