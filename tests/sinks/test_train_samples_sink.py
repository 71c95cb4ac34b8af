"""The training sample table's sink alone, through ``httpx.MockTransport``:
what one batch is, and how each of its three requests is retried.

The platform's answers are scripted per request, so a lost confirm, a
presigned URL that expired while the sink was paused, or a batch spanning
several steps are each one test of milliseconds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import workloads
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scripted_platform import Batch

from primeruns import projection
from primeruns.exceptions import (
    APIError,
    RetryableAPIError,
    TransportError,
    UnprovenAnswerError,
    ValidationRejectedError,
)
from primeruns.journal import Entry, EntryKind, InFlight, Journal
from primeruns.platform import PlatformClient, resolve_settings
from primeruns.ship.policy import RetryPolicy
from primeruns.ship.shipper import Shipper
from primeruns.sinks import sample_objects, train_samples
from primeruns.sinks.base import Binding
from primeruns.sinks.sample_objects import MAX_OBJECTS, MINTS_UNLANDED, NEW, REFUSED
from primeruns.sinks.train_samples import TrainSamplesSink, unpack_units

_BOUND = Binding(run_id="rft-1", kind="train")


class Store:
    """A scripted platform: presign mints numbered keys, PUT stores, confirm
    registers; ``faults`` maps a request (``"presign"``, ``"put"``,
    ``"confirm"``) to the answers its next calls get before the real one
    (``LOST``: the server commits the request and its answer is lost)."""

    def __init__(self) -> None:
        self.minted = 0
        self.put: dict[str, bytes] = {}
        self.confirmed: list[str] = []
        self.faults: dict[str, list[Callable[[], httpx.Response]]] = {}
        self.calls: list[str] = []
        self.steps: dict[str, int] = {}  # each minted key's step
        self._lock = threading.Lock()  # a backlog's requests come from several threads

    def handler(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            path = request.url.path
            what = "put" if request.method == "PUT" else path.rsplit("/", 1)[-1]
            self.calls.append(what)
            scripted = self.faults.get(what)
            if scripted:
                fault = scripted.pop(0)
                if fault is LOST:
                    self._commit(what, request)
                    raise httpx.RemoteProtocolError(f"peer closed the connection ({what})")
                if fault is SILENT:  # committed; a gateway answered an empty 200
                    answer = self._commit(what, request)
                    # (to a request that succeeded: a refusal is not swallowed)
                    return answer if answer.is_error else httpx.Response(200, content=b"")
                return fault()
            return self._commit(what, request)

    def _commit(self, what: str, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if what == "presign":
            self.minted += 1
            key = f"rft/rft-1/obj-{self.minted}.parquet"
            self.steps[key] = json.loads(request.content)["step"]
            url = f"http://store.test/{key}"
            return httpx.Response(200, json={"data": {"presignedUrl": url, "s3Key": key}})
        if what == "put":
            self.put[path.lstrip("/")] = request.content
            return httpx.Response(200)
        body = json.loads(request.content)
        if body["s3_key"] not in self.put:  # as the platform: nothing uploaded there
            return httpx.Response(400, json={"detail": "object not uploaded"})
        self.confirmed.append(body["s3_key"])
        return httpx.Response(200, json={"status": "confirmed"})


def LOST() -> httpx.Response:  # a sentinel the store recognises
    raise AssertionError("never called: the store commits, then drops the answer")


def SILENT() -> httpx.Response:  # a sentinel the store recognises
    raise AssertionError("never called: the store commits, then answers an empty 200")


@pytest.fixture
def store() -> Iterator[Store]:
    yield Store()


def _sink(store: Store) -> TrainSamplesSink:
    settings = resolve_settings(api_key="k-test", base_url="http://platform.test", environ={})
    return TrainSamplesSink(PlatformClient(settings, transport=httpx.MockTransport(store.handler)))


def _entries(steps: Mapping[int, int]) -> list[Entry]:
    """Journal entries of ``steps[s]`` episodes for each step s, in that order."""
    by_step = workloads.agentic_by_step(max(steps.values()))
    out: list[Entry] = []
    for step, count in steps.items():
        for episode in by_step[step][:count]:
            out.append(Entry(len(out) + 1, EntryKind.EPISODE, orjson.dumps(episode)))
    return out


def _batch(sink: TrainSamplesSink, entries: list[Entry]) -> Batch:
    """A batch recorded as the shipper does (in the journal's form), whose
    ``ctx`` is what the shipper gives each attempt."""
    return Batch.prepare(sink, entries, _BOUND)


def test_a_backlog_batch_takes_the_steps_the_read_shows_whole_and_the_last_waits(
    store: Store,
) -> None:
    sink = _sink(store)
    entries = _entries({0: 4, 5: 2, 10: 3, 20: 3})
    first = _batch(sink, entries)
    # Steps 0 (with the off-cadence 5) and 10 are whole in the read: one
    # object each. Step 20 may go on past the read, so it waits for the next.
    assert first.state["last_seq"] == 9
    assert first.records == 7
    assert [(meta["step"], meta["range"]) for meta, _ in unpack_units(first.body)] == [
        (0, 0),
        (10, 0),
    ]
    assert first.state["stages"] == [0, 0] and first.state["keys"] == [None, None]
    second = _batch(sink, entries[9:])
    assert second.last_seq is None  # to the end of the read
    assert [meta["step"] for meta, _ in unpack_units(second.body)] == [20]
    # A batch of one object keeps the form journals always had.
    assert set(second.state) == {"done", "carry", "last_seq", "records"}


def test_a_long_backlog_goes_at_most_max_objects_to_a_batch(store: Store) -> None:
    sink = _sink(store)
    entries = _one_per_step(range(0, 200, 10))
    first = _batch(sink, entries)
    assert [meta["step"] for meta, _ in unpack_units(first.body)] == list(range(0, 80, 10))
    assert first.state["last_seq"] == MAX_OBJECTS and first.records == MAX_OBJECTS


def test_a_backlog_of_large_objects_goes_fewer_to_a_batch(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Steps of long rollouts are megabytes each: a batch stops adding steps
    # once its objects reach the bound (the first always goes, however large).
    sink = _sink(store)
    entries = _one_per_step(range(0, 200, 10))
    size = len(unpack_units(_batch(_sink(store), entries[:1]).body)[0][1])
    monkeypatch.setattr(sample_objects, "MAX_BATCH_BYTES", size * 5 // 2)  # past at 3
    batches = [_batch(sink, entries[:5]), _batch(sink, entries[3:10])]
    assert [[meta["step"] for meta, _ in unpack_units(b.body)] for b in batches] == [
        [0, 10, 20],
        [30, 40, 50],
    ]
    monkeypatch.setattr(sample_objects, "MAX_BATCH_BYTES", 1)
    assert [meta["step"] for meta, _ in unpack_units(_batch(sink, entries[6:]).body)] == [60]


def test_a_backlog_batch_records_each_stage_once_for_all_its_objects(store: Store) -> None:
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 60, 10)))
    units = unpack_units(batch.body)
    assert len(units) == 5  # the sixth step is the read's last: it waits
    batch.send(sink)
    assert sorted(store.calls) == sorted(["presign", "put", "confirm"] * 5)
    # Three writes to the journal for five objects' fifteen requests.
    assert [sorted(change) for change in batch.saved] == [
        ["keys", "stages", "urls"],
        ["stages"],
        ["done", "stages"],
    ]
    assert batch.state["done"] == 5 and batch.state["stages"] == [3] * 5
    assert sorted(store.confirmed) == sorted(store.put) == sorted(batch.state["keys"])
    assert sorted(store.put.values()) == sorted(blob for _, blob in units)
    steps = {key: step for key, step in zip(batch.state["keys"], range(0, 50, 10), strict=True)}
    assert steps == {key: store.steps[key] for key in store.confirmed}


_FAULTS: dict[str, Callable[[], httpx.Response]] = {
    "lost": LOST,
    "500": lambda: httpx.Response(500, text="oops"),
    "503": lambda: httpx.Response(503, text="busy"),
    "silent": SILENT,
    "413": lambda: httpx.Response(413, text="Request Entity Too Large"),
}
_EXPIRED = lambda: httpx.Response(403, text="AccessDenied: request has expired")  # noqa: E731
_FAULT = st.one_of(
    st.tuples(st.sampled_from(["presign", "put", "confirm"]), st.sampled_from(sorted(_FAULTS))),
    st.tuples(st.just("put"), st.just("expired")),
)


class _Platform(Store):
    """The scripted store, but a confirm of an object already confirmed is
    never refused as too large, as on the platform (a repeat is a 200): the
    413 scripted next is left for a confirm of another object."""

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/confirm"):
            with self._lock:
                scripted = self.faults.get("confirm")
                too_large = bool(scripted) and scripted[0] is _FAULTS["413"]
                if too_large and json.loads(request.content)["s3_key"] in self.confirmed:
                    self.calls.append("confirm")
                    return httpx.Response(200, json={"status": "confirmed"})
        return super().handler(request)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(faults=st.lists(_FAULT, max_size=12), crashes=st.lists(st.booleans(), max_size=12))
# Found by a review, and not by the draws of the time: an answer lost to the
# confirm that asks whether an expired URL's bytes landed, and a 413 in the
# same batch (a lost confirm of the last stage and a 413:
# test_a_backlog_batch_whose_confirms_began_is_not_refused_whole).
@example(
    faults=[
        ("put", "lost"),
        ("put", "lost"),
        ("put", "expired"),
        ("put", "503"),
        ("put", "413"),
        ("confirm", "lost"),
    ],
    crashes=[],
)
@example(
    faults=[
        ("put", "lost"),
        ("put", "lost"),
        ("put", "expired"),
        ("confirm", "lost"),
        ("put", "413"),
    ],
    crashes=[],
)
def test_a_backlog_batch_makes_each_object_once_whatever_fails(
    faults: list[tuple[str, str]], crashes: list[bool]
) -> None:
    # The oracle: however requests fail, answers are lost, objects are too
    # large (413) or the process dies before recording what a stage did,
    # each step's records end in exactly one confirmed object, holding bytes
    # made of them, or are counted as lost; never in two objects. A batch
    # refused whole for its size is sent anew in halves, as the shipper
    # does (a batch of one object refused: its records counted lost).
    store = _Platform()
    for what, fault in faults:
        store.faults.setdefault(what, []).append(_EXPIRED if fault == "expired" else _FAULTS[fault])
    sink = _sink(store)
    entries = _one_per_step(range(0, 60, 10))  # five objects: the sixth step waits
    made: dict[int, set[bytes]] = {}  # each step's objects, as any batch made them
    lost: list[int] = []
    dies = iter(crashes)
    todo = [(0, 5)]  # batches to send: (first entry, objects)
    while todo:
        first, count = todo.pop(0)
        batch = _batch(sink, entries[first : first + count + 1])
        units = unpack_units(batch.body)
        steps = [int(meta["step"]) for meta, _ in units]
        assert len(units) == count
        for step, (_, blob) in zip(steps, units, strict=True):
            made.setdefault(step, set()).add(blob)
        for _ in range(40):
            before, saves = json.loads(json.dumps(batch.state)), len(batch.saved)
            try:
                batch.send(sink)
            except (TransportError, APIError) as exc:
                if next(dies, False):
                    # Died before the attempt's last record was written: the
                    # requests of that stage went out, their outcome is not kept.
                    batch.state = before
                    for change in batch.saved[saves:-1]:
                        batch.state.update(change)
                elif isinstance(exc, APIError) and exc.status_code == 413:
                    half = count // 2
                    if half:
                        todo[:0] = [(first, half), (first + half, count - half)]
                    else:
                        lost.extend(steps)
                    break
            else:
                lost.extend(steps[index] for index in batch.failed_at_ack)
                break
        else:
            raise AssertionError(f"the batch never went through: {store.calls}")
    confirmed = set(store.confirmed)
    for key in confirmed:
        assert store.put[key] in made[store.steps[key]]
    by_step = sorted([store.steps[key] for key in confirmed] + lost)
    assert by_step == list(range(0, 50, 10)), f"stored twice or never: {by_step}"


def test_a_backlog_object_whose_url_expired_is_minted_anew_and_others_go_on(
    store: Store,
) -> None:
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 40, 10)))  # three objects
    store.faults["put"] = [lambda: httpx.Response(503, text="busy")] * 3
    with pytest.raises(RetryableAPIError):
        batch.send(sink)  # minted and recorded; the store is busy
    assert batch.state["stages"] == [1, 1, 1]
    expired = lambda: httpx.Response(403, text="AccessDenied: request has expired")  # noqa: E731
    store.faults["put"] = [expired]
    with pytest.raises(RetryableAPIError, match="minting a new one"):
        batch.send(sink)  # one URL expired meanwhile: nothing landed under it
    # The others' bytes landed; they are confirmed with the new one's.
    assert sorted(batch.state["stages"]) == [0, 2, 2]
    batch.send(sink)
    assert batch.state["stages"] == [3, 3, 3] and store.minted == 4
    assert len(store.confirmed) == 3 == len(set(store.confirmed))


def test_a_backlog_object_refused_for_its_content_is_counted_and_the_others_land(
    store: Store,
) -> None:
    # One object of three is refused (422): its records are counted as failed,
    # once, and the other two are confirmed; the batch is then done. Counted
    # whole, the batch would report the two stored objects' records as lost.
    sink = _sink(store)
    batch = _batch(sink, _three_whole_steps())
    assert [meta["records"] for meta, _ in unpack_units(batch.body)] == [2, 3, 4]
    store.faults["confirm"] = [lambda: httpx.Response(422, json={"detail": "bad object"})]
    batch.send(sink)
    # Counted with the batch's acknowledgement, not before it.
    assert [count for count, _ in batch.failed_at_ack.values()] in ([2], [3], [4])
    assert sorted(batch.state["stages"]) == [3, 3, 4] and batch.state["done"] == 3
    assert len(store.confirmed) == 2
    refused = batch.state["stages"].index(4)
    assert batch.state["keys"][refused] not in store.confirmed
    batch.send(sink)  # sent again (a lost acknowledgement): nothing more happens
    assert len(batch.failed_at_ack) == 1 and len(store.calls) == 9


def test_a_fresh_url_a_backlog_object_is_refused_is_not_retried_forever(store: Store) -> None:
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 30, 10)))
    store.faults["put"] = [lambda: httpx.Response(403, text="AccessDenied: bad signature")]
    with pytest.raises(APIError) as raised:
        batch.send(sink)
    assert not isinstance(raised.value, RetryableAPIError)
    assert raised.value.status_code == 403


def test_a_backlog_batch_whose_recorded_stages_are_damaged_is_not_guessed_at(
    store: Store,
) -> None:
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 40, 10)))
    batch.state["stages"] = [3, 7, 0]
    with pytest.raises(ValueError, match="damaged"):
        batch.send(sink)
    batch.state["stages"] = [3, 0]
    with pytest.raises(ValueError, match="damaged"):
        batch.send(sink)
    assert store.calls == []


def test_a_lost_confirm_is_confirmed_again_without_a_second_upload(store: Store) -> None:
    sink = _sink(store)
    batch = _batch(sink, _entries({0: 3}))
    store.faults["confirm"] = [LOST]
    with pytest.raises(TransportError):
        sink.send(batch.body, batch.ctx)
    # The server committed that confirm; the retry confirms the same key again
    # (idempotent) and does not PUT the object a second time.
    sink.send(batch.body, batch.ctx)
    assert store.calls == ["presign", "put", "confirm", "confirm"]
    assert len(store.put) == 1
    assert store.confirmed == [next(iter(store.put))] * 2
    assert batch.state["done"] == 1


def _not_forwarded() -> httpx.Response:
    """A gateway's empty 200 to a request it never passed on to the platform."""
    return httpx.Response(200, content=b"")


def test_a_confirm_a_gateway_answered_empty_without_forwarding_is_confirmed_again(
    store: Store,
) -> None:
    # Taken as the platform's silent answer, the object was never confirmed
    # and the step's samples were lost without a count.
    sink = _sink(store)
    batch = _batch(sink, _entries({0: 3}))
    store.faults["confirm"] = [_not_forwarded]
    batch.send(sink)
    assert store.confirmed == [next(iter(store.put))]
    assert batch.state["done"] == 1


def test_a_silent_confirm_after_the_platform_named_its_keys_is_resent_until_proven(
    store: Store,
) -> None:
    sink = _sink(store)
    _batch(sink, _entries({0: 3})).send(sink)  # answered with proof
    batch = _batch(sink, _entries({0: 3, 10: 3})[3:])
    store.faults["confirm"] = [_not_forwarded]
    with pytest.raises(UnprovenAnswerError):
        batch.send(sink)
    batch.send(sink)  # the shipper's resend: the same key, confirmed
    assert store.calls[3:] == ["presign", "put", "confirm", "confirm"]
    assert len(store.confirmed) == 2 == len(set(store.confirmed))
    assert batch.state["done"] == 1


def test_a_platform_that_answers_every_confirm_with_nothing_is_taken_at_its_word(
    store: Store,
) -> None:
    # The contract allows a silent confirm: it costs one more confirm (it
    # is idempotent) and the object is done, never resent forever.
    store.faults["confirm"] = [SILENT] * 4
    sink = _sink(store)
    for entries in (_entries({0: 3}), _entries({0: 3, 10: 3})[3:]):
        batch = _batch(sink, entries)
        batch.send(sink)
        assert batch.state["done"] == 1
    assert store.calls.count("confirm") == 4 and store.faults["confirm"] == []


def test_an_object_whose_put_a_gateway_answered_without_forwarding_is_put_again(
    store: Store,
) -> None:
    # The store's 200 never came from the store: the confirm finds no bytes
    # (400). Taken as a refusal of the object, the step's samples were
    # counted as failed though nothing was wrong with them.
    sink = _sink(store)
    batch = _batch(sink, _entries({0: 3}))
    store.faults["put"] = [_not_forwarded]
    batch.send(sink)
    assert store.calls == ["presign", "put", "confirm", "put", "confirm"]
    assert store.confirmed == [next(iter(store.put))]
    assert batch.state["done"] == 1 and batch.failed_at_ack == {}


def test_a_backlog_object_whose_put_a_gateway_answered_without_forwarding_lands(
    store: Store,
) -> None:
    sink = _sink(store)
    batch = _batch(sink, _three_whole_steps())
    store.faults["put"] = [_not_forwarded]
    batch.send(sink)
    assert batch.failed_at_ack == {} and batch.state["done"] == 3
    assert sorted(store.confirmed) == sorted(batch.state["keys"]) == sorted(store.put)
    assert store.calls.count("put") == 4


def test_an_object_found_missing_after_both_its_puts_is_minted_anew_then_counted_as_failed(
    store: Store,
) -> None:
    # A 400 to the confirm after both PUTs saying nothing is there: nothing
    # landed under that key (a gateway that never passed them on). It is
    # minted anew under a new key, the keys counted in the batch's state
    # (read back at each attempt, as after a restart), and after a bounded
    # number of keys its records are counted, not retried forever.
    sink = _sink(store)
    batch = _batch(sink, _entries({0: 3}))
    refused = lambda: httpx.Response(400, json={"detail": "object not uploaded"})  # noqa: E731
    store.faults["confirm"] = [refused] * (2 * MINTS_UNLANDED)
    for keys in range(1, MINTS_UNLANDED):
        with pytest.raises(RetryableAPIError, match="under a new key"):
            batch.send(sink)
        assert batch.state["unlanded"] == [keys] and batch.state["key"] is None
    with pytest.raises(APIError) as caught:
        batch.send(sink)
    assert not isinstance(caught.value, RetryableAPIError)
    assert caught.value.status_code == 400 and "never stored" in str(caught.value)
    assert store.calls == ["presign", "put", "confirm", "put", "confirm"] * MINTS_UNLANDED
    assert store.confirmed == []


def _content_refused() -> httpx.Response:
    """The platform's verdict on the bytes stored under the key (as the
    local platform words it), not a word on whether they are there."""
    return httpx.Response(400, json={"detail": "Object k is not a readable Parquet file"})


def test_an_object_whose_content_the_confirm_refuses_is_counted_at_once_with_its_reason(
    store: Store,
) -> None:
    # The same bytes are refused under any key: a PUT again and new keys
    # (six PUTs under three keys before) only delayed the count, and its
    # reason said the store never kept the object, not what was wrong.
    sink = _sink(store)
    batch = _batch(sink, _entries({0: 3}))
    store.faults["confirm"] = [_content_refused] * (2 * MINTS_UNLANDED)
    with pytest.raises(ValidationRejectedError, match="not a readable Parquet file"):
        batch.send(sink)
    assert store.calls == ["presign", "put", "confirm"]


def test_a_backlog_object_whose_content_the_confirm_refuses_is_counted_at_once(
    store: Store,
) -> None:
    handler = store.handler

    def refusing(request: httpx.Request) -> httpx.Response:
        # The platform refuses step 20's object whenever it is confirmed.
        confirm = request.url.path.endswith("/confirm")
        if confirm and store.steps[json.loads(request.content)["s3_key"]] == 20:
            store.calls.append("confirm")
            return _content_refused()
        return handler(request)

    store.handler = refusing  # type: ignore[method-assign]
    sink = _sink(store)
    batch = _batch(sink, _three_whole_steps())
    batch.send(sink)  # every object settled at once: two confirmed, one refused
    assert batch.state["stages"].count(REFUSED) == 1 and len(store.confirmed) == 2
    assert [str(why) for _, why in batch.failed_at_ack.values()] == [
        "HTTP 400 from POST /api/v1/rft/samples/confirm: Object k is not a readable Parquet file"
    ]
    assert store.calls.count("presign") == 3 and store.calls.count("put") == 3


def test_an_object_whose_two_puts_a_gateway_swallowed_is_minted_anew_and_lands(
    store: Store,
) -> None:
    sink = _sink(store)
    batch = _batch(sink, _entries({0: 3}))
    store.faults["put"] = [_not_forwarded, _not_forwarded]
    with pytest.raises(RetryableAPIError, match="under a new key"):
        batch.send(sink)
    batch.send(sink)
    once = ["presign", "put", "confirm", "put", "confirm"]
    assert store.calls == [*once, "presign", "put", "confirm"]  # a new key, which lands
    assert store.confirmed == ["rft/rft-1/obj-2.parquet"]
    assert batch.state["done"] == 1 and batch.failed_at_ack == {}


def test_backlog_objects_whose_two_puts_a_gateway_swallowed_are_minted_anew_and_land(
    store: Store,
) -> None:
    sink = _sink(store)
    batch = _batch(sink, _three_whole_steps())
    store.faults["put"] = [_not_forwarded] * 6  # the PUT and the re-PUT of each
    with pytest.raises(RetryableAPIError, match="under a new key"):
        batch.send(sink)
    assert batch.state["stages"] == [NEW] * 3 and batch.state["unlanded"] == [1, 1, 1]
    batch.send(sink)
    assert batch.failed_at_ack == {} and batch.state["done"] == 3
    assert store.calls.count("presign") == 6 and len(store.confirmed) == 3
    assert sorted(store.confirmed) == sorted(batch.state["keys"])


def test_a_backlog_object_the_store_never_keeps_is_refused_alone_after_bounded_keys(
    store: Store,
) -> None:
    sink = _sink(store)
    batch = _batch(sink, _three_whole_steps())
    # Every PUT of every object is swallowed: each object goes through its
    # keys, then is refused, its records counted with the acknowledgement.
    store.faults["put"] = [_not_forwarded] * (6 * MINTS_UNLANDED)
    for _ in range(1, MINTS_UNLANDED):
        with pytest.raises(RetryableAPIError, match="under a new key"):
            batch.send(sink)
    batch.send(sink)  # every object settled: refused
    assert batch.state["stages"] == [REFUSED] * 3
    assert sorted(count for count, _ in batch.failed_at_ack.values()) == [2, 3, 4]
    assert all("never stored" in str(why) for _, why in batch.failed_at_ack.values())
    assert store.calls.count("presign") == 3 * MINTS_UNLANDED and store.confirmed == []


def test_a_presigned_url_that_expired_during_a_pause_is_minted_anew(store: Store) -> None:
    sink = _sink(store)
    batch = _batch(sink, _entries({10: 3}))
    store.faults["put"] = [
        lambda: httpx.Response(503, text="busy"),
        lambda: httpx.Response(403, text="AccessDenied: request has expired"),
    ]
    with pytest.raises(RetryableAPIError):
        sink.send(batch.body, batch.ctx)  # the URL is recorded; the store is busy
    with pytest.raises(RetryableAPIError, match="minting a new one"):
        sink.send(batch.body, batch.ctx)  # later: the recorded URL expired
    sink.send(batch.body, batch.ctx)
    assert store.calls == ["presign", "put", "put", "confirm", "presign", "put", "confirm"]
    assert list(store.put) == ["rft/rft-1/obj-2.parquet"]
    assert store.confirmed == ["rft/rft-1/obj-2.parquet"]


def test_a_fresh_url_the_store_refuses_is_not_retried_forever(store: Store) -> None:
    sink = _sink(store)
    batch = _batch(sink, _entries({0: 2}))
    store.faults["put"] = [lambda: httpx.Response(403, text="AccessDenied: bad signature")]
    with pytest.raises(APIError) as raised:
        sink.send(batch.body, batch.ctx)
    assert not isinstance(raised.value, RetryableAPIError)
    assert raised.value.status_code == 403


def test_a_step_without_any_trajectory_does_not_swallow_the_steps_after_it(store: Store) -> None:
    # Every rollout of step 0 failed before its first message: no row, no
    # object. The steps after it in the same read still make theirs (before,
    # the batch ended at step 10's first entry and, making nothing, the
    # shipper acknowledged the whole read: steps 10 and 20 were never sent).
    sink = _sink(store)
    entries = _entries({0: 3, 10: 2, 20: 2})
    for entry in entries[:3]:
        episode = orjson.loads(entry.payload)
        for trace in episode["traces"]:
            trace["nodes"], trace["calls"] = [], []
        entries[entries.index(entry)] = Entry(entry.seq, entry.kind, orjson.dumps(episode))
    first = _batch(sink, entries)
    assert [meta["step"] for meta, _ in unpack_units(first.body)] == [10]
    assert first.state["last_seq"] == 5 and first.records == 2
    second = _batch(sink, entries[5:])
    assert [meta["step"] for meta, _ in unpack_units(second.body)] == [20]
    assert second.last_seq is None  # to the end of the read


def test_an_old_batch_whose_object_landed_before_its_url_expired_is_not_uploaded_twice(
    store: Store,
) -> None:
    # A batch recorded by an earlier version (no note that its PUT landed):
    # the object was PUT, its confirm's answer lost, and the process died.
    # Resent after the URL expired, a confirm of the key shows it is there:
    # confirmed once, and no second object of the same rows is made.
    sink = _sink(store)
    batch = _batch(sink, _entries({0: 3}))
    store.faults["confirm"] = [LOST]
    with pytest.raises(TransportError):
        sink.send(batch.body, batch.ctx)
    batch.state["put"] = False  # as recorded before PUTs were noted
    store.faults["put"] = [lambda: httpx.Response(403, text="AccessDenied: request has expired")]
    sink.send(batch.body, batch.ctx)
    assert store.calls == ["presign", "put", "confirm", "put", "confirm"]
    assert store.minted == 1 and len(store.put) == 1
    assert batch.state["done"] == 1


def test_a_batch_sent_through_records_the_keys_the_journal_always_had(store: Store) -> None:
    # The journal's form is unchanged by the typed progress (issue #25):
    # journals of earlier versions resume here, and these resume there.
    sink = _sink(store)
    batch = _batch(sink, _entries({0: 3}))
    assert set(batch.state) == {"done", "carry", "last_seq", "records"}
    assert batch.state["done"] == 0
    sink.send(batch.body, batch.ctx)
    key = "rft/rft-1/obj-1.parquet"
    assert batch.saved == [
        {"key": key, "url": f"http://store.test/{key}"},
        {"put": True},
        {"done": 1, "key": None, "url": None, "put": False},
    ]


_KEY = "rft/rft-1/obj-1.parquet"
_URL = f"http://store.test/{_KEY}"


def _run_shipper(
    store: Store,
    journal: Journal,
    *,
    upto: int | None = None,
    failures: list[str] | None = None,
    sink: TrainSamplesSink | None = None,
) -> Shipper:
    """The sample table's shipper (of ``sink``, default a new one) over
    ``journal``, run until it acknowledged ``upto`` (default: the journal's
    end), then stopped; ``failures`` collects what it reported."""

    def report(what: str, exc: BaseException) -> None:
        if failures is not None:
            failures.append(f"{what}: {exc}")

    shipper = Shipper(
        journal,
        sink or _sink(store),
        binding=lambda: _BOUND,
        training=True,
        policy=RetryPolicy(base_delay_s=0.001, max_delay_s=0.01),
        on_failure=report,
    )
    shipper.start()
    shipper.hurry()
    end = journal.last_seq() if upto is None else upto
    assert shipper.drain(end, deadline=time.monotonic() + 20)
    shipper.stop(timeout=5)
    return shipper


@pytest.mark.parametrize(
    ("recorded", "calls"),
    [
        ({"key": _KEY, "url": _URL}, ["put", "confirm"]),  # minted: PUT to that key
        ({"key": _KEY, "url": _URL, "put": True}, ["confirm"]),  # landed: confirm it
        ({"done": 1, "key": None, "url": None, "put": False}, []),  # confirmed: nothing
    ],
    ids=["minted", "put", "confirmed"],
)
def test_a_batch_recorded_by_the_previous_version_resumes_where_it_got(
    recorded: dict[str, Any], calls: list[str], store: Store, tmp_path: Path
) -> None:
    # A journal left by the version before typed progress: its sample table
    # batch in flight, as that version recorded it (a dict of its keys). The
    # next process goes on from there: no second presign, PUT or object.
    entries = _entries({0: 3, 5: 1})
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [entry.payload for entry in entries])
    prepared = _sink(store).prepare(entries, _BOUND)
    assert prepared is not None
    if recorded.get("put"):  # it landed before the process died
        store.put[_KEY] = unpack_units(prepared.body)[0][1]
    state = {"done": 0, "carry": {"ranges": {"0": 1}}, "last_seq": 4, "records": 3, **recorded}
    journal.set_inflight("train_samples", InFlight(1, 4, prepared.body, state))
    failures: list[str] = []
    sink = _sink(store)
    shipper = _run_shipper(store, journal, failures=failures, sink=sink)
    assert store.calls == calls and failures == [] and store.minted == 0
    assert store.confirmed == ([_KEY] if calls else [])
    assert list(store.put) == ([_KEY] if calls else [])
    assert journal.cursor("train_samples").acked == 4 and journal.losses() == {}
    assert shipper.state.records_sent == 3
    # The recorded carry came back: step 0's next object takes the next range.
    again = sink.prepare(entries, _BOUND)
    assert again is not None and unpack_units(again.body)[0][0]["range"] == 1
    journal.close()


def _three_whole_steps() -> list[Entry]:
    """Steps 0, 10 and 20 of 2, 3 and 4 episodes, then step 30's first: the
    three are whole in the read, one object each of a backlog's batch."""
    entries = _entries({0: 2, 10: 3, 20: 4})
    after = _one_per_step(range(30, 31))[0]
    return [*entries, Entry(len(entries) + 1, after.kind, after.payload)]


def _one_per_step(steps: range) -> list[Entry]:
    """One episode for each step of ``steps`` (a copy of step 0's, renumbered)."""
    episode = workloads.agentic_by_step(1)[0][0]
    out: list[Entry] = []
    for step in steps:
        episode["run"]["work"]["step"] = step
        out.append(Entry(len(out) + 1, EntryKind.EPISODE, orjson.dumps(episode)))
    return out


def test_the_numbering_a_long_run_carries_does_not_grow_with_its_steps(store: Store) -> None:
    # The sample id ranges are carried from batch to batch in the journal,
    # and were one key per step shipped: a 100,000-step run kept and
    # re-encoded 10,000 keys with every object (issue #32). They stay within
    # a window however long the run, and numbering stays unique: a late
    # episode of an early step takes a range none of its objects used.
    sink = _sink(store)
    entries = _one_per_step(range(0, 3000, 10))
    ranges: dict[int, set[int]] = {}
    carries = []
    for entry in entries:
        batch = _batch(sink, [entry])
        carries.append(batch.state["carry"])
        for meta, _ in unpack_units(batch.body):
            ranges.setdefault(meta["step"], set()).add(meta["range"])
    assert len(ranges) == 300
    sizes = [len(json.dumps(carry)) for carry in carries]
    assert max(sizes) <= 2 * sizes[100], "the carried numbering grows with the run"
    for late in (0, 10, 2000, 2990):
        entry = _one_per_step(range(late, late + 1))[0]
        ((meta, _),) = unpack_units(_batch(sink, [entry]).body)
        assert meta["range"] not in ranges[late]
        ranges[late].add(meta["range"])


def test_a_long_numbering_an_earlier_version_carried_is_folded_and_kept_unique(
    store: Store,
) -> None:
    # A journal of an earlier version carries one key per step: restored,
    # it is folded to the window, and no step reuses a range it had.
    sink = _sink(store)
    sink.restore({"ranges": {str(step): 1 for step in range(0, 3000, 10)}})
    for step in (0, 1500, 2990, 3000):
        ((meta, _),) = unpack_units(_batch(sink, _one_per_step(range(step, step + 1))).body)
        # Range 0 is what each of those steps used; step 3000 never shipped.
        assert (meta["range"] == 0) == (step == 3000)
    carry = _batch(sink, _one_per_step(range(3010, 3011))).state["carry"]
    assert len(carry["ranges"]) <= 64


def _too_large() -> httpx.Response:
    return httpx.Response(413, text="Request Entity Too Large")


def test_a_backlog_object_over_a_size_limit_is_not_counted_lost_but_split(store: Store) -> None:
    # A batch of one step's object over a proxy's size limit (413) is halved
    # by the shipper and its records land in smaller objects. In a backlog's
    # batch the same object was settled as refused, its records counted lost.
    # Nothing of the batch is confirmed yet, so it is refused whole and the
    # shipper halves it, as before.
    sink = _sink(store)
    batch = _batch(sink, _three_whole_steps())
    store.faults["put"] = [_too_large]
    with pytest.raises(APIError) as raised:
        batch.send(sink)
    assert raised.value.status_code == 413
    assert batch.failed_at_ack == {} and store.confirmed == []


def test_a_backlog_object_over_a_size_limit_after_a_busy_store_is_split_too(
    store: Store,
) -> None:
    # The store was busy for one object's PUT; the others landed. Confirmed at
    # once, they would be stored when the busy one's next PUT gets a 413, and
    # the batch could no longer be split: no object is confirmed until every
    # object's bytes landed.
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 40, 10)))  # three objects
    store.faults["put"] = [lambda: httpx.Response(503, text="busy")]
    with pytest.raises(RetryableAPIError):
        batch.send(sink)
    assert store.confirmed == []
    store.faults["put"] = [_too_large]
    with pytest.raises(APIError) as raised:
        batch.send(sink)
    assert raised.value.status_code == 413
    assert batch.failed_at_ack == {} and store.confirmed == []


def test_a_backlog_batch_recorded_minted_without_its_key_is_not_guessed_at(
    store: Store,
) -> None:
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 40, 10)))
    batch.state["stages"] = [1, 1, 1]  # minted, by the stages; no key nor URL recorded
    with pytest.raises(ValueError, match="damaged"):
        batch.send(sink)
    batch.state["stages"], batch.state["keys"] = [2, 0, 0], ["k", None, None]
    with pytest.raises(ValueError, match="damaged"):
        batch.send(sink)  # a key and no URL
    assert store.calls == []


def test_a_backlog_over_a_size_limit_is_shipped_whole_in_smaller_batches(
    store: Store, tmp_path: Path
) -> None:
    # Through the shipper: the store refuses the first object's PUT as too
    # large (a proxy's limit); the batch is halved and sent anew, and every
    # episode ends in exactly one confirmed object, numbered once, none lost.
    pq = pytest.importorskip("pyarrow.parquet")
    import io

    entries = _entries({0: 3, 10: 3, 20: 3})
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [entry.payload for entry in entries])
    store.faults["put"] = [_too_large]
    failures: list[str] = []
    _run_shipper(store, journal, failures=failures)
    assert journal.losses() == {}
    ids = [
        (store.steps[key], row["sample_id"])
        for key in store.confirmed
        for row in pq.read_table(io.BytesIO(store.put[key])).to_pylist()
    ]
    assert len(ids) == len(set(ids)) == len(entries)
    assert sorted({store.steps[key] for key in store.confirmed}) == [0, 10, 20]


def test_a_backlog_batch_refused_whole_for_its_size_sends_nothing_more(store: Store) -> None:
    # A presign over a size limit refuses the batch whole: the objects minted
    # beside it are not uploaded, refused or confirmed (the shipper sends
    # their records anew, and would count a refusal again).
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 40, 10)))
    store.faults["presign"] = [_too_large]
    store.faults["put"] = [lambda: httpx.Response(422, json={"detail": "bad object"})] * 3
    with pytest.raises(APIError) as raised:
        batch.send(sink)
    assert raised.value.status_code == 413
    assert "put" not in store.calls and batch.failed_at_ack == {}


def _malformed(entry: Entry) -> Entry:
    """``entry`` with an episode its Parquet object cannot be made of."""
    episode = orjson.loads(entry.payload)
    episode["traces"][0]["rewards"] = "not a mapping"
    return Entry(entry.seq, entry.kind, orjson.dumps(episode))


def test_a_backlog_batch_stops_before_a_step_its_object_cannot_be_made_of(
    store: Store,
) -> None:
    # prepare may raise only when the first entry cannot be sent: the
    # shipper then counts that entry alone as failed. A backlog's batch met
    # a malformed episode of its third step and raised, and the shipper
    # counted the first step's good episode as failed, then the second's.
    sink = _sink(store)
    entries = _one_per_step(range(0, 50, 10))
    entries[2] = _malformed(entries[2])
    batch = _batch(sink, entries)
    assert [meta["step"] for meta, _ in unpack_units(batch.body)] == [0, 10]
    assert batch.state["last_seq"] == 2
    with pytest.raises(AttributeError):
        sink.prepare(entries[2:], _BOUND)  # the malformed step is the first: it fails


def test_an_entry_that_is_not_json_ends_the_batch_before_it(store: Store) -> None:
    # Found while reading on for the next step: the steps before it make their
    # objects (the entry ending step 0's run was parsed to find that end, and
    # raised for the whole read), and it fails when it is the first.
    sink = _sink(store)
    entries = _one_per_step(range(0, 50, 10))
    entries[2] = Entry(entries[2].seq, entries[2].kind, b'{"run": ')
    batch = _batch(sink, entries)
    assert [meta["step"] for meta, _ in unpack_units(batch.body)] == [0, 10]
    assert batch.state["last_seq"] == 2
    single = _sink(store)
    assert [m["step"] for m, _ in unpack_units(_batch(single, entries[1:]).body)] == [10]
    with pytest.raises(orjson.JSONDecodeError):
        sink.prepare(entries[2:], _BOUND)


def test_entries_before_one_that_is_not_json_that_make_no_object_are_not_counted_lost(
    store: Store,
) -> None:
    # Off the cadence (steps 1 and 2), they make no row: prepare raised for
    # the whole read, and the shipper counted its first entry as failed,
    # then the next, each a loss, before the entry that is not JSON came
    # first. They now end a batch of no object (no request, none lost).
    sink = _sink(store)
    entries = _one_per_step(range(1, 31))
    entries[2] = Entry(entries[2].seq, entries[2].kind, b'{"run": ')
    batch = _batch(sink, entries)
    assert unpack_units(batch.body) == [] and batch.records == 0
    assert batch.state["last_seq"] == 2
    batch.send(sink)
    assert batch.failed_at_ack == {} and store.confirmed == []
    with pytest.raises(orjson.JSONDecodeError):
        sink.prepare(entries[2:], _BOUND)  # the entry that is not JSON fails alone
    after = _batch(sink, entries[3:])
    assert [meta["step"] for meta, _ in unpack_units(after.body)] == [10, 20]
    # A step whose episodes make no object (none has a trajectory) likewise.
    bare = _one_per_step(range(0, 30, 10))
    episode = orjson.loads(bare[0].payload)
    episode["traces"] = []
    bare[0] = Entry(bare[0].seq, bare[0].kind, orjson.dumps(episode))
    bare[1] = Entry(bare[1].seq, bare[1].kind, b"not json")
    nothing = _batch(_sink(store), bare)
    assert unpack_units(nothing.body) == [] and nothing.state["last_seq"] == 1


def test_a_malformed_episode_of_a_backlog_costs_only_itself(store: Store, tmp_path: Path) -> None:
    entries = _one_per_step(range(0, 60, 10))
    entries[2] = _malformed(entries[2])
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [entry.payload for entry in entries])
    _run_shipper(store, journal)
    assert sum(loss["count"] for loss in journal.losses().values()) == 1
    assert sorted(store.steps[key] for key in store.confirmed) == [0, 10, 30, 40, 50]


def test_a_shipper_counts_only_the_entry_that_is_not_json_after_entries_of_no_row(
    store: Store, tmp_path: Path
) -> None:
    entries = _one_per_step(range(1, 31))
    entries[2] = Entry(entries[2].seq, entries[2].kind, b'{"run": ')
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [entry.payload for entry in entries])
    _run_shipper(store, journal)
    assert sum(loss["count"] for loss in journal.losses().values()) == 1  # was 3
    assert sorted(store.steps[key] for key in store.confirmed) == [10, 20, 30]


def test_a_refused_backlog_object_is_counted_once_across_a_death(store: Store) -> None:
    # Its records were counted (the shipper's reject, one journal write) and
    # its stage recorded in the next: a death between the two counted them
    # again when the object was refused again. They are now counted in the
    # write that acknowledges the batch.
    handler = store.handler

    def refusing(request: httpx.Request) -> httpx.Response:
        # The platform refuses step 10's object whenever it is confirmed.
        confirm = request.url.path.endswith("/confirm")
        if confirm and store.steps[json.loads(request.content)["s3_key"]] == 10:
            return httpx.Response(422, json={"detail": "bad object"})
        return handler(request)

    store.handler = refusing  # type: ignore[method-assign]
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 40, 10)))
    before = json.loads(json.dumps(batch.state))
    with pytest.raises(RuntimeError):
        sink.send(batch.body, _dies_at_save(batch, 3))  # died writing the confirms' stage
    batch.state = before | {k: v for change in batch.saved for k, v in change.items()}
    batch.send(sink)  # refused again: its records are to be counted with the ack
    assert store.confirmed != []
    assert [count for count, _ in batch.failed_at_ack.values()] == [1]


def _dies_at_save(batch: Batch, nth: int) -> Any:
    """``batch``'s context, whose ``nth`` save never reaches the journal: the
    process died writing it (what was counted before it stays counted)."""
    ctx = batch.ctx
    record, saves = ctx.record, [0]

    def dying(old: Any, new: Any) -> None:
        saves[0] += 1
        if saves[0] == nth:
            raise RuntimeError("killed")
        record(old, new)

    ctx.record = dying
    return ctx


def test_a_refused_object_recorded_before_a_death_is_counted_once_by_the_next_process(
    store: Store, tmp_path: Path
) -> None:
    # The process died after recording an object refused and the others
    # confirmed, before the batch was acknowledged: the next one counts the
    # refused object's records once, with the acknowledgement, and sends
    # nothing again.
    entries = _three_whole_steps()
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [entry.payload for entry in entries])
    batch = _batch(_sink(store), entries)
    assert batch.records == 9 and batch.state["last_seq"] == 9
    batch.state |= {"done": 3, "stages": [3, 4, 3], "keys": ["a", "b", "c"], "urls": ["u"] * 3}
    journal.set_inflight("train_samples", InFlight(1, 9, batch.body, batch.state))
    failures: list[str] = []
    shipper = _run_shipper(store, journal, upto=9, failures=failures)
    assert journal.cursor("train_samples").acked >= 9
    assert [loss["count"] for loss in journal.losses().values()] == [3]
    assert store.calls.count("presign") <= 1  # step 30's object only
    assert shipper.state.records_sent in (6, 7) and len(failures) == 1


def test_a_backlog_batch_whose_objects_are_all_settled_is_done_whatever_done_says(
    store: Store,
) -> None:
    # Every object recorded confirmed (or refused), ``done`` short of them
    # (another version's write, or damage): no request is due, and the batch
    # is acknowledged. It was sent again forever, "not sent yet", with no
    # request to make and nothing to record, and the sink's later batches
    # never went.
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 40, 10)))
    batch.state |= {"done": 0, "stages": [3, 4, 3], "keys": ["a", "b", "c"], "urls": ["u"] * 3}
    batch.send(sink)
    assert store.calls == [] and list(batch.failed_at_ack) == [1]


def test_a_backlog_batch_is_damage_to_the_version_before_it_not_objects_made_again(
    store: Store,
) -> None:
    # 1f3d32e reads a batch's progress as (done, key, url, put) with this
    # batchstate, and knows nothing of stages: given a backlog's batch whose
    # first object waits on its confirm and the others are confirmed, it
    # resent every object from done = 0 under new keys, a second object of
    # each confirmed one (as a run of it on such a journal did). It must
    # refuse the batch as damaged instead.
    from dataclasses import dataclass

    from primeruns.ship import batchstate

    @dataclass(frozen=True)
    class Before:  # 1f3d32e's TrainSamplesProgress
        done: int
        key: str | None = None
        url: str | None = None
        put: bool = False

    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 40, 10)))
    batch.state |= {"done": 0, "stages": [2, 3, 3], "keys": ["a", "b", "c"], "urls": ["u"] * 3}
    with pytest.raises(batchstate.BadState, match="'put'"):
        batchstate.from_journal(InFlight(1, 3, batch.body, batch.state), Before)
    # A batch of one object keeps the form it always had, which it reads.
    one = _batch(sink, _entries({0: 3}))
    assert batchstate.from_journal(InFlight(1, 3, one.body, one.state), Before).progress.done == 0
    assert batch.progress.put is None and one.progress.put is False


def _expired() -> httpx.Response:
    return httpx.Response(403, text="AccessDenied: request has expired")


def _ship(store: Store, tmp_path: Path, entries: list[Entry]) -> tuple[list[int], int]:
    """``entries`` shipped to the sample table through a shipper: the steps of
    the objects confirmed (one a key), and the records counted as lost."""
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [entry.payload for entry in entries])
    _run_shipper(store, journal)
    lost = sum(int(loss["count"]) for loss in journal.losses().values())
    journal.close()
    return sorted(store.steps[key] for key in set(store.confirmed)), lost


def test_an_expired_url_asked_about_is_not_asked_before_a_size_limit_splits_the_batch(
    store: Store, tmp_path: Path
) -> None:
    # Two PUTs landed with their answers lost. On the next try one of their
    # URLs expired, and the other's PUT gets a 413. Had the confirm asking
    # whether the expired one landed gone out with the PUTs (and been
    # committed, its answer lost), the batch refused whole would be split
    # and that object made again under a new key: stored twice. It goes once
    # the PUTs are recorded, so the 413 still splits a batch nothing of
    # which is stored, and no record is lost.
    store.faults["put"] = [LOST, LOST, _expired, _too_large]
    store.faults["confirm"] = [LOST]
    entries = _entries({0: 3, 10: 3, 20: 3})
    confirmed, lost = _ship(store, tmp_path, entries)
    assert confirmed == [0, 10, 20] and lost == 0


def test_a_backlog_object_that_may_be_confirmed_is_not_made_again_when_another_is_too_large(
    store: Store, tmp_path: Path
) -> None:
    # Three faults in one batch: two PUTs landed with their answers lost; on
    # the next try one of their URLs expired and the confirm asking whether it
    # landed is committed with its answer lost (the store was busy for the
    # other); on the try after, the other's PUT gets a 413. The first object
    # may be stored (it is): the batch is not refused whole, which would have
    # the shipper split it and make that object again under a new key. It is
    # confirmed again, the one over the size limit counted as lost, alone.
    store.faults["put"] = [LOST, LOST, _expired, lambda: httpx.Response(503), _too_large]
    store.faults["confirm"] = [LOST]
    entries = _entries({0: 3, 10: 3, 20: 3})
    confirmed, lost = _ship(store, tmp_path, entries)
    assert len(confirmed) == len(set(confirmed)), f"a step stored twice: {confirmed}"
    assert len(confirmed) == 2 and lost == 3  # each step once, or counted lost


def test_a_backlog_batch_whose_confirms_began_is_not_refused_whole(store: Store) -> None:
    # Every object's bytes landed and the confirms went out: step 20's was
    # committed with its answer lost, twice; on the second try step 10's is
    # refused as too large. Step 20's object may be (is) stored, so the
    # batch is not refused whole, which would have the shipper split it and
    # make step 20's object again under a new key: step 10's is refused
    # alone and the others are confirmed under the keys they have.
    handler, lock = store.handler, threading.Lock()
    busy = lambda: httpx.Response(503, text="busy")  # noqa: E731
    answers = {0: [busy, busy], 10: [busy, _too_large], 20: [LOST, LOST]}
    # The first two tries' confirms are all in flight before any is
    # answered: a failure answered first would leave the rest not sent.
    together = threading.Barrier(3, timeout=10)

    def scripted(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/confirm"):
            step = store.steps[json.loads(request.content)["s3_key"]]
            if answers[step]:
                together.wait()
                with lock:  # each confirm is given its step's answer
                    store.faults["confirm"] = [answers[step].pop(0)]
                    return handler(request)
        return handler(request)

    store.handler = scripted  # type: ignore[method-assign]
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 40, 10)))  # three objects
    for _ in range(2):
        with pytest.raises((TransportError, RetryableAPIError)):
            batch.send(sink)
    assert batch.state["stages"] == [2, 4, 2]
    batch.send(sink)
    assert batch.state["stages"] == [3, 4, 3]
    assert [count for count, _ in batch.failed_at_ack.values()] == [1]
    keys = batch.state["keys"]
    assert set(store.confirmed) == {keys[0], keys[2]} and store.minted == 3


def test_an_object_asked_about_after_its_url_expired_is_not_made_again_when_too_large(
    store: Store, tmp_path: Path
) -> None:
    # A batch of one step's object (what a backlog's batch halved comes to).
    # Its PUT landed with the answer lost; on the next try its URL had
    # expired, and the confirm asking whether it landed was committed with
    # its answer lost: the object is stored. The try after PUT it again and
    # got a 413. Refused whole, the shipper halved the batch and made the
    # step's records again in smaller objects: stored twice. A confirm of its
    # key tells first: there, the batch is done.
    store.faults["put"] = [LOST, _expired, _too_large]
    store.faults["confirm"] = [LOST]
    confirmed, lost = _ship(store, tmp_path, _entries({0: 3}))
    assert confirmed == [0] and lost == 0 and store.minted == 1


def test_an_old_url_too_large_with_nothing_stored_still_refuses_the_batch_whole(
    store: Store,
) -> None:
    # Nothing landed under the URL (the store was busy, then a 413): the
    # confirm asking finds nothing there, and the batch is refused whole for
    # the shipper to halve, as before.
    sink = _sink(store)
    batch = _batch(sink, _entries({0: 3}))
    store.faults["put"] = [lambda: httpx.Response(503, text="busy"), _too_large]
    with pytest.raises(RetryableAPIError):
        sink.send(batch.body, batch.ctx)
    with pytest.raises(APIError) as raised:
        sink.send(batch.body, batch.ctx)
    assert raised.value.status_code == 413
    assert store.calls == ["presign", "put", "put", "confirm"] and store.confirmed == []


@pytest.mark.parametrize(
    "damage",
    [{"stages": []}, {"stages": [], "keys": [], "urls": []}, {"stages": None, "done": 1}],
    ids=["no-stages", "no-lists", "stages-gone"],
)
def test_a_backlog_batch_whose_stages_are_gone_is_not_sent_as_a_batch_of_one(
    store: Store, damage: dict[str, Any]
) -> None:
    # A backlog's batch (``put`` null) whose objects are confirmed but the
    # first's answer (``done`` 0), recorded with its stages emptied or gone:
    # read as a batch of the form journals always had, every object from
    # ``done`` on was minted, uploaded and confirmed again under a new key,
    # a second object of each. It is damage.
    sink = _sink(store)
    batch = _batch(sink, _one_per_step(range(0, 40, 10)))  # three objects
    batch.send(sink)
    assert len(store.confirmed) == 3
    calls = list(store.calls)
    batch.state |= {"done": 0, "stages": [2, 3, 3]} | damage
    if batch.state["stages"] is None:
        del batch.state["stages"]
    with pytest.raises(ValueError, match="damaged"):
        batch.send(sink)
    assert store.calls == calls and len(store.confirmed) == 3


def _older_versions_batch(
    store: Store, tmp_path: Path, *, stored: int, stages: list[int]
) -> tuple[Journal, list[str]]:
    """A journal whose sample table batch in flight (steps 0, 10 and 20; step
    30 waits, never minted) is as the version before stage EXPIRED left it: ``stages``, the
    objects not NEW minted on a try before, and object ``stored`` stored
    (that version's confirm committed, its answer lost). Returns the journal
    and the URLs minted for the three objects."""
    entries = _one_per_step(range(0, 40, 10))
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [entry.payload for entry in entries])
    batch = _batch(_sink(store), entries)
    keys = [f"rft/rft-1/obj-{n}.parquet" for n in (1, 2, 3)]
    urls = [f"http://store.test/{key}" for key in keys]
    store.minted, store.steps = 3, dict(zip(keys, (0, 10, 20), strict=True))
    store.put[keys[stored]] = unpack_units(batch.body)[stored][1]
    store.confirmed.append(keys[stored])
    minted = [stage != 0 for stage in stages]
    state = batch.state | {
        "done": 0,
        "stages": stages,
        "keys": [key if made else None for key, made in zip(keys, minted, strict=True)],
        "urls": [url if made else None for url, made in zip(urls, minted, strict=True)],
    }
    journal.set_inflight("train_samples", InFlight(1, 3, batch.body, state))
    # Step 30 waits for good (its presign answered 503): what a test counts is
    # the batch's alone, however late the shipper stops once the batch is done.
    handler = store.handler

    def step_30_waits(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/presign") and json.loads(request.content)["step"] == 30:
            return httpx.Response(503, text="busy")
        return handler(request)

    store.handler = step_30_waits  # type: ignore[method-assign]
    return journal, urls


def _shipped_once(store: Store, journal: Journal) -> tuple[list[int], int]:
    """The sample table's batch in flight in ``journal`` shipped (then the
    journal closed): the steps confirmed, none twice, and the records lost."""
    _run_shipper(store, journal, upto=3)
    lost = sum(int(loss["count"]) for loss in journal.losses().values())
    journal.close()
    confirmed = sorted(store.steps[key] for key in set(store.confirmed))  # (a repeat is one)
    assert len(confirmed) == len(set(confirmed)), f"a step stored twice: {confirmed}"
    return confirmed, lost


def test_a_batch_an_older_version_left_mid_expiry_is_not_split_with_its_object_stored(
    store: Store, tmp_path: Path
) -> None:
    # A backlog's batch as the version before stage EXPIRED (8d8c54a's parent)
    # left it: every object minted on a try before. Step 0's PUT landed, and
    # on the next try its URL had expired; that version asked at once
    # whether it landed, with nothing recorded first, and the confirm was
    # committed with its answer lost: the object is stored, recorded MINTED.
    # This version, resuming, finds its URL expired while step 10's gets a
    # 413. Refused whole, the shipper split the batch and made step 0's
    # records again under a new key: stored twice. It asks first.
    journal, urls = _older_versions_batch(store, tmp_path, stored=0, stages=[1, 1, 1])
    handler = store.handler

    def old_urls(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT" and str(request.url) == urls[0]:
            return _expired()  # for good: an expired URL stays expired
        if request.method == "PUT" and str(request.url) == urls[1]:
            return _too_large()
        return handler(request)

    store.handler = old_urls  # type: ignore[method-assign]
    confirmed, lost = _shipped_once(store, journal)
    assert sorted([*confirmed, *([10] if lost else [])]) == [0, 10, 20]  # once, or counted
    assert store.minted == 3 and lost in (0, 1)


def test_an_object_of_episodes_read_from_the_journal_copies_none_to_null_numbers(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parsed from JSON, an episode holds no NaN or infinity: the copy that
    # turns them into null walked every value of its record (native_wrapper
    # included), a sixth of the CPU of each object a sync makes.
    entries = _one_per_step(range(0, 30, 10))
    now = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)
    monkeypatch.setattr(train_samples, "datetime", _Frozen(now))
    expected = unpack_units(_batch(_sink(store), entries).body)
    copies = 0
    nullify = projection.nullify_non_finite

    def counted(value: Any) -> Any:
        nonlocal copies
        copies += 1
        return nullify(value)

    monkeypatch.setattr(projection, "nullify_non_finite", counted)
    made = unpack_units(_batch(_sink(store), entries).body)
    assert copies == 0
    # The same objects, byte for byte, as the copy made (what a resend
    # recorded by an earlier version sends).
    assert [blob for _, blob in made] == [blob for _, blob in expected]


class _Frozen:
    """``datetime`` whose ``now`` is always ``at`` (an object made twice is the same bytes)."""

    def __init__(self, at: datetime) -> None:
        self._at = at

    def now(self, tz: Any = None) -> datetime:
        return self._at


@pytest.mark.parametrize("busy", ["put", "presign"])
def test_a_batch_an_older_version_left_is_not_split_before_its_old_urls_are_asked_about(
    busy: str, store: Store, tmp_path: Path
) -> None:
    # As above, the older version's batch: step 10's object stored, its URL
    # expired, recorded MINTED. This version's first try did not learn that
    # URL expired: its PUT was answered 503 (the store busy) while step 0's
    # got a 413 (an object over the size limit), or step 20's presign (its
    # URL found expired with nothing there, to be minted anew) got a 413
    # before any PUT went. Refused whole, the shipper split the batch and
    # made step 10's records again under a new key: stored twice. An object
    # recorded MINTED before a stage and not answered in it is asked about
    # first, as one found expired is.
    stages = [1, 1, 0 if busy == "presign" else 1]
    journal, urls = _older_versions_batch(store, tmp_path, stored=1, stages=stages)
    handler, busy_once = store.handler, [lambda: httpx.Response(503, text="busy")]
    if busy == "presign":
        store.faults["presign"] = [_too_large]
    # The first try's PUTs of steps 0 and 10 both in flight before either is answered.
    together = threading.Barrier(2, timeout=10)
    waiting = {urls[0], urls[1]} if busy == "put" else set()

    def old_urls(request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if request.method == "PUT" and url in waiting:
            waiting.discard(url)
            together.wait()
        if request.method == "PUT" and url == urls[1]:
            if busy == "put" and busy_once:
                return busy_once.pop()()
            return _expired()  # for good: an expired URL stays expired
        if request.method == "PUT" and url == urls[0] and busy == "put":
            return _too_large()
        return handler(request)

    store.handler = old_urls  # type: ignore[method-assign]
    confirmed, lost = _shipped_once(store, journal)
    if busy == "put":  # step 0 over the size limit: refused alone
        assert confirmed == [10, 20] and lost == 1 and store.minted == 3
    else:
        assert confirmed[:3] == [0, 10, 20] and lost == 0 and store.minted >= 4
