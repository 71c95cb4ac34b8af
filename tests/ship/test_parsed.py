"""An evaluation's episodes are parsed once for its two sinks (``ship.parsed``).

What a user depends on: shipping an episode costs one parse of its JSON,
not one per sink (it was the largest CPU cost of shipping, paid twice);
each sink still gets what it sends of the entry (``sinks.forms``),
whichever comes first or however far behind the other it is; what is kept
for a sink still to come is bounded, and is bytes, not parsed records.
"""

from __future__ import annotations

import gc
from typing import Any

import orjson
import pytest

from primeruns.journal import Entry, EntryKind
from primeruns.platform.binding import Binding
from primeruns.ship import parsed
from primeruns.ship.factory import make_shippers
from primeruns.sinks.forms import line_of, rows_of

_BOUND = Binding(run_id="run-1", kind="eval")


def _line(shared: parsed.SharedRecords, entry: Entry) -> bytes:
    return shared.line(entry, _BOUND).line


def _expected_line(entry: Entry) -> bytes:
    return line_of(orjson.loads(entry.payload), _BOUND).line


def _episode(seq: int, size: int = 100) -> Entry:
    record = {"id": f"e{seq}", "traces": [{"id": f"t{seq}", "pad": "x" * size}]}
    return Entry(seq, EntryKind.EPISODE, orjson.dumps(record))


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    real = parsed.parse_entry

    def counting(entry: Entry) -> Any:
        seen.append(entry.seq)
        return real(entry)

    monkeypatch.setattr(parsed, "parse_entry", counting)
    return seen


def test_two_sinks_taking_each_episode_parse_it_once(parses: list[int]) -> None:
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2})
    entries = [_episode(seq) for seq in range(1, 51)]
    first = [_line(shared, e) for e in entries]  # one sink's batch
    second = [shared.rows(e, _BOUND) for e in entries[:30]]  # the other's, a prefix of it
    second += [shared.rows(e, _BOUND) for e in entries[30:]]
    assert parses == list(range(1, 51))
    assert first == [_expected_line(e) for e in entries]
    assert second == [rows_of(orjson.loads(e.payload), _BOUND) for e in entries]
    assert shared.kept == 0  # both took every one: nothing is held


def test_a_kind_one_sink_takes_is_parsed_for_it_and_not_kept(parses: list[int]) -> None:
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2})
    bare = Entry(7, EntryKind.TRACE, orjson.dumps({"id": "t7"}))
    assert _line(shared, bare) == _expected_line(bare)
    assert shared.kept == 0


def test_a_sink_far_behind_parses_for_itself_and_what_is_kept_is_bounded(
    parses: list[int],
) -> None:
    entries = [_episode(seq, size=1000) for seq in range(1, 101)]
    bound = 10 * len(_expected_line(entries[0]))
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2}, keep_bytes=bound)
    for entry in entries:
        _line(shared, entry)
        assert shared.kept <= 10
    late = [_line(shared, e) for e in entries]  # the other sink, a whole backlog behind
    assert late == [_expected_line(e) for e in entries]
    assert shared.kept <= 10
    assert len(parses) <= 2 * len(entries)  # at worst each sink parses for itself, as before


def test_a_sink_a_batch_behind_the_other_still_takes_what_was_kept(parses: list[int]) -> None:
    # A fast evaluation: one sink's batches run a whole batch ahead of the
    # other's, further than the bound. The sink behind takes, in order, the
    # records kept for it; its own parses push none of them out.
    entries = [_episode(seq, size=1000) for seq in range(1, 201)]
    # (of the largest entry: a longer id makes a few bytes more)
    forms = parsed.make_forms(orjson.loads(entries[-1].payload), _BOUND, line=True, rows=True)
    bound = 10 * parsed.size(parsed.Forms(None, forms.rows))  # what is kept of one entry
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2}, keep_bytes=bound)
    lag = 25
    for entry in entries[:lag]:
        _line(shared, entry)
    for ahead, behind in zip(entries[lag:], entries, strict=False):
        _line(shared, ahead)
        assert shared.rows(behind, _BOUND) == rows_of(orjson.loads(behind.payload), _BOUND)
    for entry in entries[-lag:]:
        _line(shared, entry)
    # Kept: the first 10 of each 25 the sink behind reaches.
    assert len(parses) <= 2 * len(entries) - 70
    assert shared.kept <= 10


def test_only_what_the_sink_behind_sends_is_kept_so_the_bound_spares_more_parses(
    parses: list[int],
) -> None:
    # A fast evaluation: Prime Traces' batch (thousands of episodes) is made
    # before the sample table's sink gets to it, past the bound. What is kept
    # of each is the sample rows that sink sends, not the line Prime Traces
    # already took: more entries fit the bound, and fewer are parsed twice.
    entries = [_episode(seq, size=1000) for seq in range(1, 101)]
    forms = parsed.make_forms(orjson.loads(entries[0].payload), _BOUND, line=True, rows=True)
    bound = 20 * parsed.size(forms)  # both forms of 20 entries
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2}, keep_bytes=bound)
    assert [_line(shared, e) for e in entries] == [_expected_line(e) for e in entries]
    rows = parsed.size(parsed.Forms(None, forms.rows))
    assert shared.kept == bound // rows > 20
    assert shared.kept_bytes <= bound
    taken = [shared.rows(e, _BOUND) for e in entries]
    assert taken == [rows_of(orjson.loads(e.payload), _BOUND) for e in entries]
    assert len(parses) == 2 * len(entries) - bound // rows
    assert shared.kept == 0


def test_a_sink_sending_the_form_the_other_took_makes_its_own(parses: list[int]) -> None:
    # Both sinks send the same form: what was kept lacks it, and the second
    # sink parses for itself rather than sending nothing.
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2})
    entries = [_episode(seq) for seq in range(1, 6)]
    for _ in range(2):
        assert [_line(shared, e) for e in entries] == [_expected_line(e) for e in entries]
    assert shared.kept == 0


def test_what_is_kept_for_the_sink_behind_is_bytes_the_collector_never_walks(
    parses: list[int],
) -> None:
    # A fast evaluation: one sink makes a batch of episodes before the other
    # starts on it. A parsed record kept for the sink behind is hundreds of
    # containers living a batch long, which the garbage collector walked
    # again and again: more CPU than the parse it spared. What is kept is
    # what the sink behind sends, as bytes.
    entries = [_episode(seq, size=9000) for seq in range(1, 201)]
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2})
    for entry in entries:
        _line(shared, entry)
    assert shared.kept == len(entries)
    held = [kept[0] for kept in shared._kept.values()]  # each entry's forms
    while held:  # all they hold, down to the bytes: no dict, no list, no record
        assert all(isinstance(obj, tuple | bytes | str | int) or obj is None for obj in held)
        # (a named tuple refers to its class too: not what is held)
        held = [ref for obj in held for ref in gc.get_referents(obj) if not isinstance(ref, type)]
    for entry in entries:
        made = shared.rows(entry, _BOUND)
        assert made == rows_of(orjson.loads(entry.payload), _BOUND)
    assert parses == [e.seq for e in entries] and shared.kept == 0


def test_an_evaluations_two_sinks_share_one_parser(tmp_path: Any) -> None:
    from primeruns.journal import Journal
    from primeruns.platform import PlatformClient, resolve_settings
    from primeruns.ship.lifecycle import Lifecycle
    from primeruns.ship.policy import RetryPolicy
    from primeruns.spec import SPEC_KEY, RunSpec

    spec = RunSpec(kind="eval", name="e")
    with Journal.create(tmp_path, meta={SPEC_KEY: spec.to_json()}) as journal:
        client = PlatformClient(resolve_settings(api_key="k", environ={}, config={}))
        policy = RetryPolicy()
        lifecycle = Lifecycle(journal, client, policy=policy, on_failure=lambda *a: None)
        shippers = make_shippers(
            journal,
            client,
            lifecycle,
            opted_out=False,
            policy=policy,
            on_failure=lambda *a: None,
        )
        traces, samples = (s.sink for s in shippers)
        shared = traces._line.__self__  # type: ignore[attr-defined]
        assert isinstance(shared, parsed.SharedRecords)
        assert samples._rows.__self__ is shared  # type: ignore[attr-defined]
        # and a shipper whose sink goes off or retires leaves it
        assert shippers[0]._records is shippers[1]._records is shared
        # and read the journal once for the two (ship.sharedreads)
        assert shippers[0]._reads is shippers[1]._reads is not None
        client.close()


def test_an_entry_both_sinks_reach_at_once_leaves_nothing_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two sinks woken by the same append take the same entry at the same
    # time: the one that finds the other making its forms makes its own.
    # What the other then makes is kept for nobody: kept, it stayed for
    # ever, and a long run's such entries filled the bound.
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2})
    entry = _episode(1)
    real = parsed.make_forms
    meanwhile: list[Any] = []

    def racing(record: Any, binding: Binding, *, line: bool, rows: bool) -> Any:
        if line and rows and not meanwhile:  # the first sink, making both
            meanwhile.append(shared.rows(entry, _BOUND))  # the other sink, now
        return real(record, binding, line=line, rows=rows)

    monkeypatch.setattr(parsed, "make_forms", racing)
    assert _line(shared, entry) == _expected_line(entry)
    assert meanwhile == [rows_of(orjson.loads(entry.payload), _BOUND)]
    assert shared.kept == 0


def test_once_a_sink_is_off_the_other_makes_and_keeps_nothing_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sample table's sink turned off (or retired): making its rows for
    # every episode, and keeping them, would be for nobody.
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2})
    entries = [_episode(seq) for seq in range(1, 11)]
    for entry in entries[:5]:
        _line(shared, entry)
    assert shared.kept == 5
    shared.leave()
    assert shared.kept == 0
    asked: list[tuple[bool, bool]] = []
    real = parsed.make_forms

    def counting(record: Any, binding: Binding, *, line: bool, rows: bool) -> Any:
        asked.append((line, rows))
        return real(record, binding, line=line, rows=rows)

    monkeypatch.setattr(parsed, "make_forms", counting)
    assert [_line(shared, e) for e in entries[5:]] == [_expected_line(e) for e in entries[5:]]
    assert asked == [(True, False)] * 5 and shared.kept == 0
