"""An evaluation's episodes are parsed once for its two sinks (``ship.parsed``).

What a user depends on: shipping an episode costs one parse of its JSON,
not one per sink (it was the largest CPU cost of shipping, paid twice);
each sink still gets the record the entry holds, whichever comes first or
however far behind the other it is; and what is kept for a sink still to
come is bounded.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from primeruns.journal import Entry, EntryKind
from primeruns.ship import parsed
from primeruns.ship.factory import make_shippers


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
    first = [shared.parse(e) for e in entries]  # one sink's batch
    second = [shared.parse(e) for e in entries[:30]]  # the other's, a prefix of it
    second += [shared.parse(e) for e in entries[30:]]
    assert parses == list(range(1, 51))
    assert second == first == [orjson.loads(e.payload) for e in entries]
    assert shared.kept == 0  # both took every one: nothing is held


def test_a_kind_one_sink_takes_is_parsed_for_it_and_not_kept(parses: list[int]) -> None:
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2})
    bare = Entry(7, EntryKind.TRACE, orjson.dumps({"id": "t7"}))
    assert shared.parse(bare) == {"id": "t7"}
    assert shared.kept == 0


def test_a_sink_far_behind_parses_for_itself_and_what_is_kept_is_bounded(
    parses: list[int],
) -> None:
    entries = [_episode(seq, size=1000) for seq in range(1, 101)]
    bound = 10 * len(entries[0].payload)
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2}, keep_bytes=bound)
    for entry in entries:
        shared.parse(entry)
        assert shared.kept <= 10
    late = [shared.parse(e) for e in entries]  # the other sink, a whole backlog behind
    assert late == [orjson.loads(e.payload) for e in entries]
    assert shared.kept <= 10
    assert len(parses) <= 2 * len(entries)  # at worst each sink parses for itself, as before


def test_a_sink_a_batch_behind_the_other_still_takes_what_was_kept(parses: list[int]) -> None:
    # A fast evaluation: one sink's batches run a whole batch ahead of the
    # other's, further than the bound. The sink behind takes, in order, the
    # records kept for it; its own parses push none of them out.
    entries = [_episode(seq, size=1000) for seq in range(1, 201)]
    bound = 10 * len(entries[0].payload)
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2}, keep_bytes=bound)
    lag = 25
    for entry in entries[:lag]:
        shared.parse(entry)
    for ahead, behind in zip(entries[lag:], entries, strict=False):
        shared.parse(ahead)
        assert shared.parse(behind) == orjson.loads(behind.payload)
    for entry in entries[-lag:]:
        shared.parse(entry)
    # Kept: the first 10 of each 25 the sink behind reaches.
    assert len(parses) <= 2 * len(entries) - 70
    assert shared.kept <= 10


def test_a_sink_a_whole_batch_ahead_leaves_few_parsed_records_alive(parses: list[int]) -> None:
    # A fast evaluation: one sink parses a batch of 2,000 episodes (9 KB
    # each, as gsm8k's) before the other starts on it. Each record kept for
    # the sink behind is hundreds of Python containers living a batch long,
    # which the garbage collector walks again and again: more CPU than the
    # parse it spares. Few are kept; the sink behind parses the rest.
    entries = [_episode(seq, size=9000) for seq in range(1, 2001)]
    shared = parsed.SharedRecords({EntryKind.EPISODE: 2})
    for entry in entries:
        shared.parse(entry)
    assert shared.kept * len(entries[0].payload) <= 1 << 20
    assert [shared.parse(e) for e in entries] == [orjson.loads(e.payload) for e in entries]
    assert shared.kept == 0


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
        assert traces._parse == samples._parse  # type: ignore[attr-defined]
        # and read the journal once for the two (ship.sharedreads)
        assert shippers[0]._reads is shippers[1]._reads is not None
        assert isinstance(traces._parse.__self__, parsed.SharedRecords)  # type: ignore[attr-defined]
        client.close()
