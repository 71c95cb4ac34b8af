"""The evaluation sample table's sink alone, through ``httpx.MockTransport``.

The table appends and never deduplicates (as on the platform, see
``primeruns/local/evals.py``), so what keeps a row from landing twice is the
sink itself: a batch is marked attempted, with the table's length, before it
is sent, and an attempted batch is looked for past that length before it is
sent again. Other processes of the run push to the same table meanwhile
(``SampleTable.others``), so the batch need not be at the table's tail.
"""

from __future__ import annotations

import copy
import json
from functools import partial
from typing import Any

import httpx
import orjson
import pytest
import workloads
from scripted_platform import (
    LOST,
    PASS,
    REFUSED,
    Batch,
    ScriptedPlatform,
    entries_of,
    error,
    failed_attempt,
)

import primeruns.sinks.eval_samples as eval_samples_module
from primeruns.exceptions import RetryableAPIError, TransportError, UnprovenAnswerError
from primeruns.journal import EntryKind
from primeruns.platform import plain
from primeruns.projection import record_to_samples
from primeruns.records import stamp_run
from primeruns.sinks.base import Binding
from primeruns.sinks.eval_samples import EvalSamplesProgress, EvalSamplesSink

_BOUND = Binding(run_id="eval-1", kind="eval")
_PATH = r"/api/v1/evaluations/(?P<eval_id>[^/]+)/samples"


class SampleTable:
    """``POST`` appends the rows; ``GET`` pages them (page from 1, ``total``)."""

    def __init__(self, platform: ScriptedPlatform) -> None:
        self.rows: list[dict[str, Any]] = []
        self.pages: list[tuple[int, int]] = []  # (page, limit) of every read
        platform.route("push", "POST", _PATH, self.push)
        platform.route("read", "GET", _PATH, self.read)

    def push(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        samples = json.loads(request.content)["samples"]
        self.rows.extend(samples)
        return httpx.Response(200, json={"inserted": len(samples), "total": len(self.rows)})

    def read(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        page = int(request.url.params["page"])
        limit = int(request.url.params["limit"])
        self.pages.append((page, limit))
        rows = self.rows[(page - 1) * limit : page * limit]
        total = len(self.rows)
        return httpx.Response(
            200,
            json={
                "samples": rows,
                "total": total,
                "page": page,
                "limit": limit,
                "hasMore": page * limit < total,
            },
        )

    def ids(self) -> list[str]:
        return [row["sample_id"] for row in self.rows]

    def others(self, count: int, name: str) -> None:
        """Rows another process of the run pushed (its episodes' own ids)."""
        self.rows.extend({"sample_id": f"{name}-{i}"} for i in range(count))


@pytest.fixture
def table(platform: ScriptedPlatform) -> SampleTable:
    return SampleTable(platform)


def _episodes(records: list[dict[str, Any]], first_seq: int = 1) -> list[Any]:
    return entries_of(EntryKind.EPISODE, records, first_seq=first_seq)


def _ship(sink: EvalSamplesSink, records: list[dict[str, Any]], first_seq: int = 1) -> Batch:
    batch = Batch.prepare(sink, _episodes(records, first_seq), _BOUND)
    batch.send(sink)
    return batch


def _prepared(
    platform: ScriptedPlatform, episodes: list[dict[str, Any]]
) -> tuple[EvalSamplesSink, Batch]:
    """A new sink and its batch of ``episodes``, recorded."""
    sink = EvalSamplesSink(platform.client())
    return sink, Batch.prepare(sink, _episodes(episodes), _BOUND)


def _numbers(batch: Batch) -> list[int]:
    return [row["rollout_number"] for row in json.loads(batch.body)["samples"]]


def test_a_batch_is_marked_attempted_with_the_tables_length_before_its_first_send(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    table.others(7, "other")
    sink = EvalSamplesSink(platform.client())
    batch = Batch.prepare(sink, _episodes(workloads.gsm8k(4)), _BOUND)
    ctx = batch.ctx
    saves: list[tuple[EvalSamplesProgress, list[str]]] = []
    record = ctx.record

    def spy(old: Any, new: Any) -> None:
        saves.append((new, list(platform.calls)))  # the requests made so far
        record(old, new)

    ctx.record = spy
    sink.send(batch.body, ctx)
    [(saved, before)] = saves
    assert saved.attempted and before == ["read"]  # the length, read before the push
    assert batch.saved == [{"attempted": True, "base": 7}]
    assert table.pages == [(1, 1)]  # a fresh batch is not looked for
    assert platform.calls == ["read", "push"]
    assert len(table.rows) == 11


@pytest.mark.parametrize(
    ("fault", "calls"),
    [
        (LOST, ["read", "push", "read"]),  # stored, the answer lost: found, not pushed
        (REFUSED, ["read", "push", "read", "push"]),
        (error(503, "busy"), ["read", "push", "read", "push"]),  # refused before storing
    ],
    ids=["lost-answer", "refused", "503"],
)
def test_a_resend_looks_for_its_rows_first_so_each_row_is_stored_once(
    fault: Any, calls: list[str], platform: ScriptedPlatform, table: SampleTable
) -> None:
    episodes = workloads.gsm8k(5)
    sink = EvalSamplesSink(platform.client())
    batch = Batch.prepare(sink, _episodes(episodes), _BOUND)
    failed = failed_attempt(platform, "push", fault, partial(batch.send, sink))
    assert isinstance(failed, TransportError | RetryableAPIError)
    batch.send(sink)
    assert platform.calls == calls
    assert table.ids() == [e["id"] for e in episodes]


def test_a_batch_recorded_before_a_restart_is_looked_for_by_the_next_process(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    episodes = workloads.gsm8k(6)
    first = EvalSamplesSink(platform.client())
    batch = Batch.prepare(first, _episodes(episodes), _BOUND)
    lost = failed_attempt(platform, "push", LOST, partial(batch.send, first))
    assert isinstance(lost, TransportError)  # the process dies waiting for this answer
    # The next process has only what the journal recorded: the body and state.
    recorded = json.loads(json.dumps(batch.state))
    assert recorded["attempted"] is True
    later = EvalSamplesSink(platform.client())
    later.restore(recorded["carry"])
    Batch(batch.body, recorded, batch.records, _BOUND, later.progress_type).send(later)
    assert table.ids() == [e["id"] for e in episodes]


@pytest.mark.parametrize(("earlier", "pages"), [(230, [3]), (190, [2, 3])])
def test_the_check_reads_only_the_pages_from_where_the_table_ended_at_the_first_send(
    earlier: int, pages: list[int], platform: ScriptedPlatform, table: SampleTable
) -> None:
    episodes = workloads.gsm8k(earlier + 30)
    sink = EvalSamplesSink(platform.client())
    for start in range(0, earlier, 100):
        _ship(sink, episodes[start : min(start + 100, earlier)], first_seq=start + 1)
    batch = Batch.prepare(sink, _episodes(episodes[earlier:], earlier + 1), _BOUND)
    table.pages.clear()
    failed_attempt(platform, "push", LOST, partial(batch.send, sink))
    batch.send(sink)
    assert table.pages == [(1, 1)] + [(page, 100) for page in pages]
    assert len(table.rows) == earlier + 30 == len(set(table.ids()))


@pytest.mark.parametrize("after", [5, 100, 450])
def test_a_lost_answer_is_found_behind_rows_other_processes_pushed_after_it(
    after: int, platform: ScriptedPlatform, table: SampleTable
) -> None:
    """Issue #29: the run's other processes (forked children, pool workers,
    ranks) pushed after the batch landed, so it is not at the table's tail; it
    is found where the table ended at its first send, and not pushed again.
    The look stops at the page that completes it, however much came after."""
    table.others(150, "before")
    episodes = workloads.gsm8k(30)
    sink, batch = _prepared(platform, episodes)
    lost = failed_attempt(platform, "push", LOST, partial(batch.send, sink))
    assert isinstance(lost, TransportError)
    table.others(after, "after")  # another process pushes before the resend
    table.pages.clear()
    batch.send(sink)
    mine = [e["id"] for e in episodes]
    assert [i for i in table.ids() if i in set(mine)] == mine  # once each
    assert platform.calls[-1] == "read"  # found, not pushed again
    assert table.pages == [(2, 100)]  # rows 100..199 hold all of it: 150..179


def test_a_look_cut_short_by_a_failure_goes_on_where_it_stopped(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    """A batch that did not land is looked for from where the table ended at
    its first send to the table's end, then sent again. Pages read before
    the batch's first row move its ``base`` past them, durably: on a flaky
    link a long look is not started over at every try."""
    table.others(120, "before")
    episodes = workloads.gsm8k(20)
    sink, batch = _prepared(platform, episodes)
    failed_attempt(platform, "push", REFUSED, partial(batch.send, sink))
    table.others(400, "after")
    table.pages.clear()
    platform.fail("read", PASS, PASS, error(503, "busy"))  # the look's third page
    with pytest.raises(RetryableAPIError):
        batch.send(sink)
    assert batch.state["base"] == 300  # rows 100..299 hold none of it
    batch.send(sink)
    assert table.pages == [(2, 100), (3, 100), (4, 100), (5, 100), (6, 100)]
    assert batch.state["base"] == 520
    assert table.ids()[-20:] == [e["id"] for e in episodes]
    assert len(table.rows) == 540 == len(set(table.ids()))


def _large_rows(table: SampleTable, count: int, size: int, name: str) -> None:
    """Rows another process pushed, each about ``size`` bytes (a long agentic
    episode's row: a push takes up to MAX_REQUEST_BYTES of them)."""
    table.rows.extend({"sample_id": f"{name}-{i}", "completion": "c" * size} for i in range(count))


def test_a_table_whose_first_row_is_over_an_answers_bound_still_takes_every_batch(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    """The table's length is read as a page of its first row, which may be as
    large as a push (MAX_REQUEST_BYTES): over the client's bound for an
    answer (plain.MAX_ANSWER_BYTES), every later batch failed at that read
    and none was ever sent."""
    _large_rows(table, 1, plain.MAX_ANSWER_BYTES + (2 << 20), "first")
    episodes = workloads.gsm8k(5)
    _ship(EvalSamplesSink(platform.client()), episodes)
    assert table.ids()[1:] == [e["id"] for e in episodes]


def test_a_lost_answer_is_found_among_rows_whose_page_is_over_an_answers_bound(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    """A page of 100 large rows (250 KB each: 25 MB) is over the client's
    bound for an answer: the look for a batch whose answer was lost failed
    at it on every try, and the batch, which is in the table, was never
    settled. Such rows are read in smaller pages; found, it is not pushed again."""
    _large_rows(table, 90, 250_000, "before")
    episodes = workloads.gsm8k(5)
    sink, batch = _prepared(platform, episodes)
    lost = failed_attempt(platform, "push", LOST, partial(batch.send, sink))
    assert isinstance(lost, TransportError)
    _large_rows(table, 30, 250_000, "after")
    batch.send(sink)
    mine = [e["id"] for e in episodes]
    assert [i for i in table.ids() if i in set(mine)] == mine  # once each
    assert platform.calls[-1] == "read"  # found, not pushed again


def test_a_batch_an_earlier_version_attempted_is_looked_for_from_the_start(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    """Its record has ``attempted`` and no length: the rows may be anywhere."""
    episodes = workloads.gsm8k(10)
    sink, batch = _prepared(platform, episodes)
    table.others(40, "before")
    table.rows.extend(json.loads(batch.body)["samples"])  # it landed, the answer was lost
    table.others(260, "after")
    batch.state["attempted"] = True  # as an earlier version recorded it
    batch.send(sink)
    assert platform.calls == ["read"]  # found on the first page
    assert len(table.rows) == 310


def test_rollouts_are_numbered_per_task_across_batches_and_across_a_restart(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    episodes = workloads.gsm8k(6)  # the bundle's first six: rollouts of task 0 and 1
    tasks = [e["task"]["data"]["idx"] for e in episodes]
    sink = EvalSamplesSink(platform.client())
    first = _ship(sink, episodes[:3])
    later = EvalSamplesSink(platform.client())  # a restart: the journal's carry
    later.restore(json.loads(json.dumps(first.state["carry"])))
    _ship(later, episodes[3:], first_seq=4)
    expected: dict[int, int] = {}
    numbers = []
    for task in tasks:
        expected[task] = expected.get(task, 0) + 1
        numbers.append(expected[task])
    assert [row["rollout_number"] for row in table.rows] == numbers
    assert [row["example_id"] for row in table.rows] == tasks


def test_a_batch_prepared_again_because_the_journal_could_not_record_it_keeps_its_numbers(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    """A shipper whose journal is full when it records a batch backs off and
    prepares the same entries again (primeruns/ship/shipper.py, _run and
    _next_batch); the rows must be numbered as the first time. The sink goes
    on from a batch's numbering only once the shipper recorded it (restore)."""
    entries = _episodes(workloads.gsm8k(3))
    sink = EvalSamplesSink(platform.client())
    unrecorded = sink.prepare(entries, _BOUND)
    again = Batch.prepare(sink, entries, _BOUND)  # recorded this time
    assert unrecorded is not None
    assert _numbers(again) == [1, 2, 3]
    assert unrecorded.body == again.body
    following = Batch.prepare(sink, _episodes(workloads.gsm8k(3)), _BOUND)
    assert _numbers(following) == [4, 5, 6]


def test_a_batch_ends_before_the_episode_that_would_pass_the_request_limit(
    platform: ScriptedPlatform, table: SampleTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = workloads.gsm8k(1)[0]
    episodes = [workloads.renew_ids(copy.deepcopy(first), i) for i in range(10)]
    [row] = [len(orjson.dumps(r)) for r in record_to_samples(episodes[0], {}) or []]
    limit = len(b'{"samples":[]}') + int(3.5 * (row + 1))
    monkeypatch.setattr(eval_samples_module, "MAX_REQUEST_BYTES", limit)
    sink, batch = _prepared(platform, episodes)
    assert batch.records == 3 and batch.state["last_seq"] == 3
    assert len(batch.body) <= limit
    batch.send(sink)
    rest = Batch.prepare(sink, _episodes(episodes[3:], first_seq=4), _BOUND)
    assert rest.records == 3 and rest.state["last_seq"] == 6
    assert _numbers(rest) == [4, 5, 6]
    assert len(table.rows) == 3


def test_an_episode_too_large_for_any_request_fails_alone(
    platform: ScriptedPlatform, table: SampleTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eval_samples_module, "MAX_REQUEST_BYTES", 200_000)
    episodes = workloads.gsm8k(3)
    episodes[1]["info"] = {"padding": "x" * 250_000}
    entries = _episodes(episodes)
    sink = EvalSamplesSink(platform.client())
    before = Batch.prepare(sink, entries, _BOUND)
    assert before.records == 1 and before.state["last_seq"] == 1
    with pytest.raises(ValueError, match="journal entry 2"):
        sink.prepare(entries[1:], _BOUND)  # the shipper counts this one entry as failed
    after = Batch.prepare(sink, entries[2:], _BOUND)
    assert after.records == 1 and after.last_seq is None


def test_an_episode_no_row_can_be_made_of_fails_alone_not_its_batch_mates(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    """The shipper fails the first entry of a batch whose prepare raises (a
    sink builds up to a bad record, not past it). An episode holding an
    integer of 400 digits (the journal takes it; orjson does not) raised in
    the middle of a batch: the entries before it were failed one by one in
    its place, 3 of 5 episodes lost for one bad one. The batch now ends
    before it, and it fails alone."""
    episodes: list[Any] = list(workloads.gsm8k(3))
    bad = orjson.dumps(episodes[1])[:-1] + b', "huge": 1' + b"0" * 400 + b"}"
    entries = _episodes([episodes[0], bad, episodes[2]])
    sink = EvalSamplesSink(platform.client())
    before = Batch.prepare(sink, entries, _BOUND)
    assert before.records == 1 and before.state["last_seq"] == 1
    with pytest.raises(ValueError):
        sink.prepare(entries[1:], _BOUND)  # the shipper counts this one entry as failed
    after = Batch.prepare(sink, entries[2:], _BOUND)
    assert after.records == 1 and after.last_seq is None


def test_episodes_without_traces_make_no_request(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    sink = EvalSamplesSink(platform.client())
    empty = [{"id": f"e{i}", "traces": []} for i in range(3)]
    assert sink.prepare(_episodes(empty), _BOUND) is None  # acknowledged without a request
    assert platform.calls == []


def test_a_platform_that_refuses_the_read_still_gets_every_row_once(
    platform: ScriptedPlatform, table: SampleTable
) -> None:
    """A test's mock that answers the push alone (docs/TESTING.md): the length
    is unknown, so a lost answer's rows are looked for from the table's start."""
    table.others(130, "before")
    episodes = workloads.gsm8k(12)
    sink, batch = _prepared(platform, episodes)
    platform.fail("read", error(404, "not faked"))
    failed_attempt(platform, "push", LOST, partial(batch.send, sink))
    assert batch.state["attempted"] is True and "base" not in batch.state
    table.others(70, "after")
    table.pages.clear()
    batch.send(sink)
    assert table.pages == [(1, 100), (2, 100)]  # from the start to rows 130..141
    assert len(table.rows) == 212 == len(set(table.ids()))


def test_each_row_is_encoded_once_and_sent_as_projected(
    platform: ScriptedPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A row holds the whole record (21 KB for a 9 KB gsm8k episode): sized
    # by the projection and encoded again by the sink, it cost about a third
    # of the sink's CPU per episode.
    episodes = workloads.gsm8k(3)
    numbers: dict[Any, int] = {}
    expected = [
        row
        for record in episodes
        for row in record_to_samples(stamp_run(record, _BOUND.run_id, _BOUND.kind), numbers) or []
    ]
    real = orjson.dumps
    rows_encoded: list[Any] = []

    def counting(value: Any, *args: Any, **kwargs: Any) -> bytes:
        if isinstance(value, dict) and "sample_id" in value:
            rows_encoded.append(value["sample_id"])
        return real(value, *args, **kwargs)

    monkeypatch.setattr(orjson, "dumps", counting)
    batch = Batch.prepare(EvalSamplesSink(platform.client()), _episodes(episodes), _BOUND)
    assert rows_encoded == [row["sample_id"] for row in expected]
    assert json.loads(batch.body)["samples"] == expected


class NormalisingTable(SampleTable):
    """A table behind a JSON store that keeps every number as a double: its
    read-back pages state ``total`` as ``5.0``, not ``5``."""

    def read(self, request: httpx.Request, match: dict[str, str]) -> httpx.Response:
        page = json.loads(super().read(request, match).content)
        page["total"] = float(page["total"])
        return httpx.Response(200, json=page)


def test_a_tables_total_read_back_as_a_float_is_that_count(platform: ScriptedPlatform) -> None:
    """A store normalising numbers answers ``total: 5.0``: that is the count.
    Taken as no ``total``, no batch was ever sent (its length is read before
    the push) and a lost answer's rows were never counted as stored."""
    table = NormalisingTable(platform)
    table.others(130, "before")
    episodes = workloads.gsm8k(12)
    sink, batch = _prepared(platform, episodes)
    failed_attempt(platform, "push", LOST, partial(batch.send, sink))
    table.others(70, "after")
    batch.send(sink)  # found where the table ended at the first send
    assert platform.calls[-1] == "read"
    assert table.ids().count(episodes[0]["id"]) == 1
    assert len(table.rows) == 212 == len(set(table.ids()))


@pytest.mark.parametrize("total", [5.5, True, "5", None, float("inf")])
def test_a_tables_total_that_is_no_count_is_no_proof(total: Any) -> None:
    page = {"samples": [], "total": total}
    with pytest.raises(UnprovenAnswerError):
        eval_samples_module._total(page)
