"""The evaluation sample table's rollout numbering as the shipper carries it
in the journal: in parts (``sinks.rollout_numbers``), each batch saving only
the chunks it changed, and exact across restarts, a batch refused whole, a
journal of the previous version and a damaged carry.

Batches are prepared and recorded as the shipper's loop does
(``Shipper._record``), and acknowledged as a successful send would be: the
numbering is all these tests look at, so no request is made.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import workloads
from hypothesis import given, settings
from hypothesis import strategies as st

import primeruns.sinks.rollout_numbers as rollout_numbers
from primeruns.journal import Entry, EntryKind, InFlight, Journal
from primeruns.projection import SampleRows, sample_rows
from primeruns.ship import batchstate
from primeruns.ship.policy import RetryPolicy
from primeruns.ship.shipper import Shipper
from primeruns.sinks.base import Binding
from primeruns.sinks.eval_samples import EvalSamplesSink

_BOUND = Binding(run_id="eval-1", kind="eval")
_NAME = EvalSamplesSink.name


class Evaluation:
    """A journal of episodes whose examples the test names, and the shipper
    of its sample table, made anew by ``restart`` as the next process's."""

    def __init__(self, path: Path) -> None:
        self.journal = Journal.create(path)
        self.path = self.journal.path
        record = workloads.gsm8k(1)[0]
        template = sample_rows(record)
        assert template is not None and template.numbered
        self.template: SampleRows = template
        self.keys: dict[int, Any] = {}  # example of each entry
        self.shipper = self._shipper()

    def _shipper(self) -> Shipper:
        def rows(entry: Entry, _binding: Binding) -> SampleRows:
            key = self.keys[entry.seq]
            return self.template._replace(key=key, sample_ids=(f"s{entry.seq}",))

        return Shipper(
            self.journal,
            EvalSamplesSink(None, rows=rows),  # type: ignore[arg-type]
            binding=lambda: _BOUND,
            training=False,
            policy=RetryPolicy(),
            on_failure=lambda *_: None,
        )

    def log(self, keys: Sequence[Any]) -> list[Entry]:
        first = self.journal.last_seq() + 1
        self.journal.append(EntryKind.EPISODE, [b"{}"] * len(keys))
        for offset, key in enumerate(keys):
            self.keys[first + offset] = key
        return [Entry(first + i, EntryKind.EPISODE, b"{}") for i in range(len(keys))]

    def record(self, keys: Sequence[Any]) -> tuple[InFlight, list[int]]:
        """Log, prepare and record a batch of ``keys`` (not acknowledged);
        the batch and its rows' rollout numbers."""
        entries = self.log(keys)
        prepared = self.shipper.sink.prepare(entries, _BOUND)
        assert prepared is not None and prepared.last_seq is None
        inflight = self.shipper._record(prepared, entries[0].seq, entries[-1].seq, entries[-1].seq)
        return inflight, numbers(inflight.body)

    def ship(self, keys: Sequence[Any]) -> list[int]:
        """A batch of ``keys`` recorded and acknowledged; its rollout numbers."""
        inflight, found = self.record(keys)
        self.journal.ack(_NAME, inflight.last_seq)
        return found

    def restart(self, path: Path | None = None) -> None:
        """The next process: the journal opened again (``path``: a copy of it)."""
        self.journal.close()
        self.journal = Journal.open(path or self.path, owner=True)
        self.shipper = self._shipper()

    def move_to_copy(self, folder: Path) -> None:
        """The journal copied (rsync'd to another host) into ``folder``, and
        shipped on from the copy by its next process."""
        self.journal.close()
        copy = folder / self.path.name
        shutil.copytree(self.path, copy)
        self.path = copy
        self.journal = Journal.open(copy, owner=True)
        self.shipper = self._shipper()

    def close(self) -> None:
        self.journal.close()


def numbers(body: bytes) -> list[int]:
    return [row["rollout_number"] for row in orjson.loads(body)["samples"]]


@pytest.fixture
def evaluation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(rollout_numbers, "CHUNK", 2)  # parts of two examples: many parts
    run = Evaluation(tmp_path / "runs")
    yield run
    run.close()


def test_a_restart_after_three_batches_numbers_on_every_example(evaluation: Evaluation) -> None:
    """The fourth batch repeats examples of the first batch, whose parts the
    later batches did not change: the next process reads every part saved."""
    assert evaluation.ship([0, 1, 2, 3, 0]) == [1, 1, 1, 1, 2]
    assert evaluation.ship([4, 5]) == [1, 1]
    assert evaluation.ship([6, 3]) == [1, 2]
    evaluation.restart()
    assert evaluation.ship([0, 1, 6, 3, 7]) == [3, 2, 2, 3, 1]
    assert evaluation.ship([7, 0]) == [2, 4]


def test_a_batch_saves_only_the_parts_it_changed(evaluation: Evaluation) -> None:
    """What a batch carries (and saves, and records twice with itself) does
    not grow with the examples numbered before it: examples of earlier parts
    move to the open one, with their counts; the parts they left are not
    saved again (their lower counts are passed over)."""
    evaluation.ship(list(range(200)))
    inflight, found = evaluation.record([150, 3])
    assert found == [2, 2]
    assert inflight.state["carry"] == {"rollouts.100": [[150, 2], [3, 2]]}
    assert inflight.state["carry_before"] == {"rollouts.100": None}
    assert evaluation.journal.get_meta(f"carry.{_NAME}.rollouts.75") == [[150, 1], [151, 1]]
    assert evaluation.journal.get_meta(f"carry.{_NAME}") is None  # no whole numbering
    evaluation.journal.ack(_NAME, inflight.last_seq)
    evaluation.restart()
    assert evaluation.ship([3, 150, 151]) == [3, 3, 2]


def test_examples_keep_their_json_type_across_a_restart(evaluation: Evaluation) -> None:
    """A task without an index (``None``) and one indexed by the string "7"
    number on after a restart: the whole numbering the previous version saved
    made every example a JSON object key, and read back ``"None"`` (another
    example than None: its rollouts were numbered from 1 again)."""
    assert evaluation.ship([None, None, "7", 7]) == [1, 2, 1, 1]
    evaluation.restart()
    assert evaluation.ship([None, "7", 7]) == [3, 2, 2]


def test_a_journal_of_the_previous_version_numbers_on(evaluation: Evaluation) -> None:
    """Its whole numbering (``carry.eval_samples``: example as a JSON key)
    is the base under the parts saved since; the batch it left in flight
    carries the same whole numbering, and is read over it."""
    journal = evaluation.journal
    whole = {"rollouts": {"0": 2, "1": 1, "2": 5}}
    evaluation.log([0, 1, 0, 2])
    journal.ack(_NAME, 3)
    journal.set_meta(f"carry.{_NAME}", whole)
    state = {"sample_ids": ["s4"], "carry": whole, "last_seq": 4, "records": 1}
    journal.set_inflight(_NAME, InFlight(4, 4, b'{"samples":[]}', state))
    evaluation.restart()
    journal = evaluation.journal
    journal.ack(_NAME, 4)  # the batch in flight, resent as recorded
    assert evaluation.ship([0, 1, 9]) == [3, 2, 1]
    evaluation.restart()
    assert evaluation.ship([0, 1, 2, 9]) == [4, 3, 6, 2]


def test_an_example_indexed_by_an_array_or_object_is_numbered(evaluation: Evaluation) -> None:
    """A task's index is any JSON value (the row's ``example_id``): one that
    is an array or an object made the batch's prepare raise, and the shipper
    then failed the batch's first episode, a good one, and the next, up to
    it. Such an example is numbered like any other, across a restart."""
    nested, other = [1, {"a": 2}], {"b": [3], "a": None}
    assert evaluation.ship([0, nested, 1, other, [1, {"a": 2}], 2]) == [1, 1, 1, 1, 2, 1]
    evaluation.restart()
    assert evaluation.ship([{"a": None, "b": [3]}, nested, [1, {"a": 3}]]) == [2, 3, 1]


@pytest.mark.parametrize(
    ("example", "written"),
    [(None, "None"), (True, "True"), (1.5, "1.5"), (-3, "-3"), ("7", "7"), (7, "7")],
    ids=["none", "bool", "float", "negative", "digit-string", "int"],
)
def test_the_previous_versions_numbering_is_read_under_the_key_it_wrote(
    evaluation: Evaluation, example: Any, written: str
) -> None:
    """The previous version wrote each example as ``str(example)``: its
    rollouts 1..4 of a task without an index are under ``"None"``, of task
    1.5 under ``"1.5"``. Those numbers are stored already: the next rollout
    is 5, whatever the example's JSON type (it was numbered 1 again)."""
    evaluation.journal.set_meta(f"carry.{_NAME}", {"rollouts": {written: 4, "other": 9}})
    evaluation.restart()
    assert evaluation.ship([example, example]) == [5, 6]
    evaluation.restart()
    assert evaluation.ship([example]) == [7]


def test_a_batch_refused_whole_gives_its_numbers_back(evaluation: Evaluation) -> None:
    """A batch refused whole (a 413) is made again smaller: its records take
    the numbers they had, here and after a restart (the parts it changed are
    saved back as they were before it: one it opened, as none)."""
    assert evaluation.ship([0, 1, 2]) == [1, 1, 1]
    refused, found = evaluation.record([2, 3, 4, 0])
    assert found == [2, 1, 1, 2]
    evaluation.shipper._send_anew(refused)
    assert evaluation.journal.get_meta(f"carry.{_NAME}.rollouts.2") is None
    evaluation.restart()
    entries = [Entry(seq, EntryKind.EPISODE, b"{}") for seq in range(4, 6)]
    prepared = evaluation.shipper.sink.prepare(entries, _BOUND)
    assert prepared is not None
    assert numbers(prepared.body) == [2, 1]


def test_a_copy_of_the_journal_numbers_on(evaluation: Evaluation, tmp_path: Path) -> None:
    """A copy (rsync'd from a node) holds the parts in its meta: its sync
    numbers on as the original would."""
    evaluation.ship([0, 1, 2, 3, 4])
    evaluation.ship([2])
    evaluation.journal.close()
    shutil.copytree(evaluation.path, tmp_path / "copy" / evaluation.path.name)
    evaluation.restart(tmp_path / "copy" / evaluation.path.name)
    assert evaluation.ship([0, 2, 4]) == [2, 3, 2]


@pytest.mark.parametrize(
    "damaged",
    ["not a list", [[0, "x"], [1]], [[{"a": 1}, 3]], [[0, -2], [1, True]], None],
    ids=["not-a-list", "bad-count", "bad-example", "negative", "null"],
)
def test_a_damaged_part_costs_only_its_own_examples(evaluation: Evaluation, damaged: Any) -> None:
    """The journal is untrusted input: a part that cannot be read leaves its
    examples to number from the start, and the others number on (numbering
    everything afresh gave every example's next rollout a number stored
    already); nothing raises out of the shipper."""
    evaluation.ship([0, 1, 2, 3, 0, 2])
    evaluation.journal.set_meta(f"carry.{_NAME}.rollouts.0", damaged)
    evaluation.restart()
    assert evaluation.ship([2, 3, 0]) == [3, 2, 1]


def test_an_example_in_two_parts_takes_the_higher_count(evaluation: Evaluation) -> None:
    """Two parts naming one example (a damaged journal): the next number is
    past both, never one given already."""
    evaluation.ship([0, 1, 2, 3])
    evaluation.journal.set_meta(f"carry.{_NAME}.rollouts.1", [[2, 1], [3, 1], [0, 4]])
    evaluation.restart()
    assert evaluation.ship([0, 1]) == [5, 2]


def test_a_damaged_count_in_the_previous_versions_numbering_costs_only_its_example(
    evaluation: Evaluation,
) -> None:
    """One unreadable count in an earlier version's whole numbering used to
    make the whole carry unreadable: every example numbered afresh from 1,
    numbers the table holds already. Only that example does now."""
    evaluation.journal.set_meta(f"carry.{_NAME}", {"rollouts": {"0": "x", "1": 3, "2": 1}})
    evaluation.restart()
    assert evaluation.ship([0, 1, 2]) == [1, 4, 2]


def test_a_part_whose_frame_is_damaged_costs_only_its_own_examples(
    evaluation: Evaluation,
) -> None:
    """A part that is not even a frame (damaged bytes on disk): it is read
    neither as the value a batch that changes it goes back to, nor at
    start-up, and nothing raises out of the shipper (the recording of a
    batch would back off and try again forever; its constructor, ship
    nothing)."""
    evaluation.ship([0, 1, 2, 3, 0, 2])  # parts 0: [0, 1], 1 (open): [2, 3]
    _damage_part(evaluation.journal, "rollouts.1")
    inflight, found = evaluation.record([2])
    assert found == [3]
    assert inflight.state["carry_before"]["rollouts.1"] is None
    evaluation.journal.ack(_NAME, inflight.last_seq)
    _damage_part(evaluation.journal, "rollouts.1")
    evaluation.restart()
    assert evaluation.ship([0, 3, 2]) == [3, 1, 1]


def _damage_part(journal: Journal, part: str) -> None:
    with journal._tx.lock, journal._tx.store.begin(write=True) as txn:
        txn.put(f"carry.{_NAME}.{part}".encode(), b"\x00garbage", db=journal._tx.dbs["meta"])


_EXAMPLES = [0, 1, 2, 3, None, "7", 7, 1.5, [1], {"a": 1}]


@pytest.mark.parametrize("seed", range(6))
def test_no_rollout_number_is_stored_twice_whatever_befalls_the_shipper(
    evaluation: Evaluation, tmp_path: Path, seed: int
) -> None:
    """An oracle over batches shipped, recorded then cut off by a SIGKILL
    (resent as recorded by the next process), saved but never recorded,
    refused whole and made again, restarts and copies of the journal, from
    a journal the previous version numbered: the rows stored hold, per
    example, no rollout number twice (gaps are allowed)."""
    rng = random.Random(seed)
    stored: dict[str, list[int]] = {}
    whole = {"rollouts": {"0": 2, "None": 1, "1.5": 3}}  # stored by the previous version
    for example, count in ((0, 2), (None, 1), (1.5, 3)):
        stored[orjson.dumps(example).decode()] = list(range(1, count + 1))
    evaluation.journal.set_meta(f"carry.{_NAME}", whole)
    evaluation.restart()

    def land(body: bytes, keys: Sequence[Any]) -> None:
        for example, number in zip(keys, numbers(body), strict=True):
            stored.setdefault(orjson.dumps(example).decode(), []).append(number)

    for step in range(20):
        keys = [rng.choice(_EXAMPLES) for _ in range(rng.randint(1, 4))]
        what = rng.choice(["ship", "ship", "killed", "unrecorded", "refused", "copy"])
        if what == "ship":
            inflight, _ = evaluation.record(keys)
            land(inflight.body, keys)
            evaluation.journal.ack(_NAME, inflight.last_seq)
        elif what == "killed":  # recorded, then SIGKILL: the next process resends it
            evaluation.record(keys)
            evaluation.restart()
            resent = evaluation.journal.cursor(_NAME).inflight
            assert resent is not None
            land(resent.body, keys)
            evaluation.journal.ack(_NAME, resent.last_seq)
        elif what == "unrecorded":  # its parts saved, then SIGKILL before recording it
            entries = evaluation.log(keys)
            prepared = evaluation.shipper.sink.prepare(entries, _BOUND)
            assert prepared is not None and prepared.carry is not None
            evaluation.shipper._save_carry(prepared.carry, prepared.tidied)
            evaluation.restart()
            evaluation.journal.ack(_NAME, entries[-1].seq)  # (left out of this oracle)
        elif what == "refused":  # refused whole, made again (the records' numbers back)
            refused, _ = evaluation.record(keys)
            evaluation.shipper._send_anew(refused)
            entries = [
                Entry(seq, EntryKind.EPISODE, b"{}")
                for seq in range(refused.first_seq, refused.last_seq + 1)
            ]
            prepared = evaluation.shipper.sink.prepare(entries, _BOUND)
            assert prepared is not None
            again = evaluation.shipper._record(
                prepared, entries[0].seq, entries[-1].seq, entries[-1].seq
            )
            land(again.body, keys)
            evaluation.journal.ack(_NAME, again.last_seq)
        else:  # rsync'd elsewhere, shipped on from the copy
            evaluation.move_to_copy(tmp_path / f"copy{step}")
    for example, taken in stored.items():
        assert len(taken) == len(set(taken)), (example, taken)


def test_a_batch_of_past_examples_in_random_order_changes_a_part_per_chunk_of_them(
    evaluation: Evaluation,
) -> None:
    """Rollouts of past examples in random order changed the part of each
    one's chunk (a batch of 256 of a large evaluation: 256 parts of 16
    examples, copied, encoded and saved three times each, 3.7 times the cost
    at 50,000 examples as at 1,000): they move to the open part, so a batch
    changes a part per ``CHUNK`` of its examples, whatever came before. The
    parts the batch before emptied (both its examples moved on: two of
    them) are removed with its save, a part per two examples it moved at
    most, but are not in its record: what it carries, and would give back,
    is the parts it changed (with them, a batch of random examples of a
    1,000-example evaluation carried some 60 parts where it changed 16)."""
    evaluation.ship(list(range(400)))
    counts = dict.fromkeys(range(400), 1)
    rng = random.Random(3)
    moved = 0
    prefix = f"carry.{_NAME}."
    for _ in range(4):
        keys = rng.sample(range(400), 40)
        saved = {k for k in evaluation.journal.all_meta() if k.startswith(prefix)}
        inflight, found = evaluation.record(keys)
        parts = math.ceil(len(keys) / rollout_numbers.CHUNK) + 1
        carry = inflight.state["carry"]
        assert len(carry) <= parts
        assert all(pairs for pairs in carry.values())
        assert inflight.state["carry_before"].keys() == carry.keys()
        assert sum(len(pairs) for pairs in carry.values()) <= len(keys) + 1
        now = {k for k in evaluation.journal.all_meta() if k.startswith(prefix)}
        assert len(saved - now) <= moved // 2  # emptied by the batch before
        moved = len(keys)
        for key in keys:
            counts[key] += 1
        assert found == [counts[key] for key in keys]
        evaluation.journal.ack(_NAME, inflight.last_seq)


def test_a_batch_killed_after_its_send_is_resent_with_its_numbers(evaluation: Evaluation) -> None:
    """Sent, then the process is killed before the answer is recorded: the
    next process resends the recorded body, its rows numbered as they were
    (the platform appends: other numbers would be rows stored twice), and
    numbers on past it, examples moved out of earlier parts included."""
    evaluation.ship([0, 1, 2, 3, 4, 5])
    sent, found = evaluation.record([1, 5, 1, 6])
    assert found == [2, 2, 3, 1]
    evaluation.restart()
    resent = evaluation.journal.cursor(_NAME).inflight
    assert resent is not None and resent.body == sent.body
    evaluation.journal.ack(_NAME, resent.last_seq)
    assert evaluation.ship([1, 0, 5, 6]) == [4, 2, 3, 2]
    evaluation.restart()
    assert evaluation.ship([6, 1, 0]) == [3, 5, 3]


# Examples no two of which the numbering takes for one (1 and True, 1 and
# 1.0 are one example to a dict), and those the version before the parts
# could key apart in its whole numbering (``str(example)``).
_POOL = [0, 1, 2, 3, 4, 5, "a", "0", None, 1.5, [1], {"a": 1}]
_WHOLE_POOL = [0, 1, 2, 3, None, 1.5, "a"]
_EVENTS = ["ship", "ship", "ship", "restart", "killed", "unrecorded", "refused", "copy"]
_MOST_KEYS = 12  # examples of a batch of the oracle's


def _name(example: Any) -> str:
    return orjson.dumps(example, option=orjson.OPT_SORT_KEYS).decode()


def _previous_parts(earlier: Sequence[Any]) -> dict[str, Any]:
    """The parts the previous version saved for ``earlier``'s rollouts: each
    example in the chunk it was first numbered in, counted there."""
    counts: dict[str, list[Any]] = {}
    for example in earlier:
        counts.setdefault(_name(example), [example, 0])[1] += 1
    pairs = list(counts.values())
    size = rollout_numbers.CHUNK
    return {
        f"rollouts.{index // size}": pairs[index : index + size]
        for index in range(0, len(pairs), size)
    }


@settings(max_examples=40, deadline=None)
@given(
    chunk=st.sampled_from([1, 2, 3, 16]),
    tidied=st.sampled_from([1, rollout_numbers.TIDIED]),
    layout=st.sampled_from(["none", "whole", "parts"]),
    earlier=st.lists(st.sampled_from(_WHOLE_POOL), max_size=24),
    steps=st.lists(
        st.tuples(
            st.sampled_from(_EVENTS),
            st.lists(st.sampled_from(_POOL), min_size=1, max_size=_MOST_KEYS),
        ),
        min_size=1,
        max_size=10,
    ),
)
def test_each_row_is_numbered_its_examples_count_of_rollouts_whatever_befalls(
    chunk: int,
    tidied: int,
    layout: str,
    earlier: list[Any],
    steps: list[tuple[str, list[Any]]],
) -> None:
    """An oracle: every row stored is numbered one past the rollouts of its
    example numbered before it, counted over batches in any order, from a
    journal the previous version numbered (its whole numbering, or its
    parts: every example left in the chunk it was first numbered in), across
    restarts, copies of the journal, a batch killed after its send (resent
    as recorded), one refused whole and made again (the same numbers), and
    one whose parts were saved but that was never recorded (its numbers
    skipped, never given again), and with parts left to tidy from batch to
    batch (a part a batch at most: the bound on what is saved then waits).
    The numbering is what the previous version gave (a count per example);
    only how it is kept changed."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(rollout_numbers, "CHUNK", chunk)
        patch.setattr(rollout_numbers, "TIDIED", tidied)
        run = Evaluation(Path(tmp) / "runs")
        try:
            bounded = tidied >= _MOST_KEYS  # a part per example moved: tidying keeps up
            _numbered_as_counted(run, Path(tmp), layout, earlier, steps, bounded)
        finally:
            run.close()


def _numbered_as_counted(
    run: Evaluation,
    tmp: Path,
    layout: str,
    earlier: list[Any],
    steps: list[tuple[str, list[Any]]],
    bounded: bool,
) -> None:
    counts: dict[str, int] = {}
    # The whole numbering's counts, by the key it wrote (``str(example)``):
    # a floor under every example that it names so (the string "0" too).
    floor: dict[str, int] = {}
    if layout != "none":
        for example in earlier:
            counts[_name(example)] = counts.get(_name(example), 0) + 1
        if layout == "whole":
            floor = {str(example): counts[_name(example)] for example in earlier}
            run.journal.set_meta(f"carry.{_NAME}", {"rollouts": floor})
        else:
            parts = _previous_parts(earlier)
            run.journal.update_meta({f"carry.{_NAME}.{p}": v for p, v in parts.items()})
        run.restart()

    def expected(keys: Sequence[Any]) -> list[int]:
        """The numbers of ``keys``' rows, as counted (and now counted)."""
        found = []
        for example in keys:
            name = _name(example)
            written = name if isinstance(example, list | dict) else str(example)
            counts[name] = max(counts.get(name, 0), floor.get(written, 0)) + 1
            found.append(counts[name])
        return found

    moved = 0  # examples the last batch numbered: moved on at most
    for step, (event, keys) in enumerate(steps):
        if event != "restart" and event != "copy":
            moved = len(keys)
        if event == "ship":
            assert run.ship(keys) == expected(keys)
        elif event == "restart":
            run.restart()
        elif event == "killed":  # recorded, sent, killed before the answer was recorded
            sent, found = run.record(keys)
            assert found == expected(keys)
            run.restart()
            resent = run.journal.cursor(_NAME).inflight
            assert resent is not None and resent.body == sent.body
            run.journal.ack(_NAME, resent.last_seq)
        elif event == "unrecorded":  # its parts saved, killed before it was recorded
            entries = run.log(keys)
            prepared = run.shipper.sink.prepare(entries, _BOUND)
            assert prepared is not None and prepared.carry is not None
            assert numbers(prepared.body) == expected(keys)  # skipped from now on
            run.shipper._save_carry(prepared.carry, prepared.tidied)
            run.restart()
            run.journal.ack(_NAME, entries[-1].seq)
        elif event == "refused":  # refused whole (a 413): made again, numbered the same
            before = dict(counts)
            refused, found = run.record(keys)
            assert found == expected(keys)
            run.shipper._send_anew(refused)
            counts.clear()
            counts.update(before)
            entries = [
                Entry(seq, EntryKind.EPISODE, b"{}")
                for seq in range(refused.first_seq, refused.last_seq + 1)
            ]
            prepared = run.shipper.sink.prepare(entries, _BOUND)
            assert prepared is not None
            again = run.shipper._record(prepared, entries[0].seq, entries[-1].seq, entries[-1].seq)
            assert numbers(again.body) == found == expected(keys)
            run.journal.ack(_NAME, again.last_seq)
        else:  # rsync'd to another host, shipped on from the copy
            run.move_to_copy(tmp / f"copy{step}")
        if bounded:
            _within_bounds(run.journal, moved)


def _within_bounds(journal: Journal, moved: int) -> None:
    """What start-up reads of the numbering: at most twice a pair per example
    it numbers, and two per example the last batch moved on (the parts it
    left are saved again without them by the next one); and no part that
    holds none (removed: not a key per part a run ever had)."""
    prefix = f"carry.{_NAME}.rollouts."
    parts = [v for k, v in journal.all_meta().items() if k.startswith(prefix)]
    assert all(isinstance(part, list) and part for part in parts)
    pairs = [pair for part in parts if isinstance(part, list) for pair in part]
    examples = {_name(example) for example, _count in pairs}
    assert len(pairs) <= 2 * len(examples) + 2 * moved


def test_a_numbering_saved_stays_within_twice_its_examples_whatever_the_rollouts(
    evaluation: Evaluation,
) -> None:
    """A dataset repeated once per rollout (round-robin: each pass moves
    every example on to the open part) left a stale pair per rollout in the
    part it left, all read at start-up: 50,000 examples of 4 rollouts, start-up
    4.2 times as long. The parts a batch emptied are saved again by the next
    one, so what is saved stays within twice the examples numbered (and the
    last batch's moves), and numbers on as counted after a restart."""
    for rollout in range(1, 9):
        for start in range(0, 60, 20):
            keys = list(range(start, start + 20))
            assert evaluation.ship(keys) == [rollout] * 20
        _within_bounds(evaluation.journal, 20)
    evaluation.restart()
    assert len(evaluation.shipper.sink._rollouts) == 60
    assert evaluation.shipper.sink._rollouts.saved_pairs() <= 2 * 60 + 2 * 20
    assert evaluation.ship([0, 59, 7]) == [9, 9, 9]


def test_the_stale_parts_an_earlier_version_left_are_tidied_over_the_next_batches(
    evaluation: Evaluation,
) -> None:
    """A journal of the version before the tidying, its dataset repeated
    once per rollout (round-robin): every part of the passes before the
    last holds only stale pairs (50,000 examples of 4 rollouts: 9,375
    parts). The first batch of the next process removed them all in its one
    save (0.9 s of CPU); each batch now tidies ``TIDIED`` parts at most, the
    batches after it the rest (across a restart too), and every example
    numbers on."""
    examples, passes = 600, 3
    size = rollout_numbers.CHUNK
    per_pass = examples // size
    prefix = f"carry.{_NAME}."
    evaluation.journal.update_meta(
        {
            f"{prefix}rollouts.{rollout * per_pass + first // size}": [
                [key, rollout + 1] for key in range(first, first + size)
            ]
            for rollout in range(passes)
            for first in range(0, examples, size)
        }
    )
    evaluation.restart()

    def saved() -> int:
        return sum(1 for k in evaluation.journal.all_meta() if k.startswith(prefix))

    stale = (passes - 1) * per_pass  # the parts of every pass but the last
    tidied = rollout_numbers.TIDIED
    assert stale > 2 * tidied
    assert evaluation.ship([0]) == [passes + 1]  # into a part of its own (the last is full)
    assert saved() == per_pass + 1 + stale - tidied
    evaluation.restart()
    assert evaluation.ship([1]) == [passes + 1]  # into the same
    assert saved() == per_pass + 1 + stale - 2 * tidied
    assert evaluation.ship([2, 0]) == [passes + 1, passes + 2]
    # The rest, and the last pass's part that 0 and 1 left, removed; the
    # two that 2 and 0 filled since.
    assert saved() == per_pass - 1 + 2
    _within_bounds(evaluation.journal, 2)
    evaluation.restart()
    found = evaluation.ship(list(range(examples)))
    assert found == [passes + 3, passes + 2, passes + 2] + [passes + 1] * (examples - 3)


def test_a_part_naming_an_example_twice_takes_the_higher_count(evaluation: Evaluation) -> None:
    """One part naming an example twice (a damaged or hostile journal): the
    next number is past both counts, whichever comes last, never one the
    table holds already."""
    evaluation.ship([0, 1, 2, 3])
    evaluation.journal.set_meta(f"carry.{_NAME}.rollouts.0", [[0, 5], [1, 1], [0, 2]])
    evaluation.restart()
    assert evaluation.ship([0, 1]) == [6, 2]


def test_a_digit_that_is_not_a_number_costs_only_its_item(evaluation: Evaluation) -> None:
    """Strings that ``str.isdigit`` calls digits but ``int`` does not read
    (a superscript two; past int's 4,300 digits) as a count, a part's name or
    a count of the previous version's numbering (a hostile journal): each
    is left out alone. Before, one made the whole restore raise, and the
    shipper numbered every example afresh from 1, rows the table holds."""
    evaluation.ship([0, 1, 2, 3, 0])  # parts 0: [0, 1], 1: [2, 3]
    prefix = f"carry.{_NAME}"
    evaluation.journal.set_meta(f"{prefix}.rollouts.1", [[2, 1], [3, "\u00b2"]])
    evaluation.journal.set_meta(f"{prefix}.rollouts.\u00b2", [[1, 7]])
    evaluation.journal.set_meta(prefix, {"rollouts": {"4": "\u00b2", "5": "9" * 5000, "6": 2}})
    evaluation.restart()
    assert evaluation.ship([0, 1, 2, 3, 4, 5, 6]) == [3, 2, 2, 1, 1, 1, 3]


def test_a_count_past_any_a_run_makes_costs_only_its_example(evaluation: Evaluation) -> None:
    """A count of 2**64 in a part (a hostile or damaged journal): the next
    rollout number, one past it, was sent as an integer that orjson reads as
    a float (2**63 and on: no 64-bit signed integer). Past any count a run
    makes, it is unreadable, as a part named past any index is: its example
    numbers from 1, the others on, in the previous version's numbering too."""
    evaluation.ship([0, 1, 2, 3])  # parts 0: [0, 1], 1: [2, 3]
    prefix = f"carry.{_NAME}"
    evaluation.journal.set_meta(f"{prefix}.rollouts.0", [[0, 2**64], [1, 3]])
    evaluation.journal.set_meta(f"{prefix}.rollouts.1", [[2, 10**15 - 1], [3, 2**63]])
    evaluation.journal.set_meta(prefix, {"rollouts": {"4": str(2**64), "5": 2**64, "6": 2}})
    evaluation.restart()
    found = evaluation.ship([0, 1, 2, 3, 4, 5, 6])
    assert found == [1, 4, 10**15, 1, 1, 1, 3]
    assert all(type(number) is int for number in found)


def test_a_part_named_past_any_index_a_run_makes_costs_only_its_examples(
    evaluation: Evaluation,
) -> None:
    """A damaged part's name with as many digits as a journal key holds:
    the chunk opened after it was named past the journal's longest key, so
    every batch's save raised and the sample table shipped nothing again.
    Left out, it costs only its own examples' numbering."""
    prefix = f"carry.{_NAME}.rollouts."
    hostile = {f"{prefix}{'9' * (511 - len(prefix))}": [["a", 3], ["b", 3]]}
    evaluation.journal.update_meta(hostile)
    evaluation.restart()
    assert evaluation.ship(["c", "c"]) == [1, 2]
    assert evaluation.ship(["c"]) == [3]


def test_a_batch_killed_while_its_numbers_were_given_back_and_then_stored_numbers_on(
    evaluation: Evaluation,
) -> None:
    """A batch refused whole gives its parts back (saved as before it), and
    the process is killed before it drops the batch: the next process goes
    on from the batch, still recorded, and a resend the platform takes
    stores its numbers. The parts saved must hold them too, not only the
    process's memory: a later process numbered from the given-back parts,
    and gave an example's rollout a number stored already."""
    assert evaluation.ship(["a", "b"]) == [1, 1]  # part 0: a, b
    sent, found = evaluation.record(["a", "c"])  # changes part 0 (a) and opens part 1 (c)
    assert found == [2, 1]
    evaluation.shipper._save_carry(batchstate.carry_before(sent.state))  # given back, then killed
    evaluation.restart()
    resent = evaluation.journal.cursor(_NAME).inflight
    assert resent is not None and resent.body == sent.body
    evaluation.journal.ack(_NAME, resent.last_seq)  # stored this time
    assert evaluation.ship(["c"]) == [2]  # changes part 1 alone
    evaluation.restart()
    assert evaluation.ship(["a", "b", "c"]) == [3, 2, 3]
