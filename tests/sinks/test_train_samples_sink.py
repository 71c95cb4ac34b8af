"""The training sample table's sink alone, through ``httpx.MockTransport``:
what one batch is, and how each of its three requests is retried.

The platform's answers are scripted per request, so a lost confirm, a
presigned URL that expired while the sink was paused, or a batch spanning
several steps are each one test of milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
import orjson
import pytest
import workloads

from primeruns.exceptions import APIError, RetryableAPIError, TransportError
from primeruns.journal import Entry, EntryKind
from primeruns.platform import PlatformClient, resolve_settings
from primeruns.sinks.base import Binding, SendContext
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

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        what = "put" if request.method == "PUT" else path.rsplit("/", 1)[-1]
        self.calls.append(what)
        scripted = self.faults.get(what)
        if scripted:
            fault = scripted.pop(0)
            if fault is LOST:
                self._commit(what, request)
                raise httpx.RemoteProtocolError(f"peer closed the connection ({what})")
            return fault()
        return self._commit(what, request)

    def _commit(self, what: str, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if what == "presign":
            self.minted += 1
            key = f"rft/rft-1/obj-{self.minted}.parquet"
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


class _Batch:
    """A recorded batch and the context a shipper gives each of its attempts."""

    def __init__(self, sink: TrainSamplesSink, entries: list[Entry]) -> None:
        prepared = sink.prepare(entries, _BOUND)
        assert prepared is not None
        self.body = prepared.body
        self.state: dict[str, Any] = dict(prepared.state)
        self.records = prepared.records
        self.ctx = SendContext(
            binding=_BOUND, state=self.state, save_state=self.state.update, reject=_no_reject
        )


def _no_reject(count: int, exc: BaseException) -> None:
    raise AssertionError(f"no record of this batch may be rejected: {exc}")


def test_a_batch_is_the_object_of_one_step_so_each_confirmed_object_is_acknowledged(
    store: Store,
) -> None:
    sink = _sink(store)
    entries = _entries({0: 4, 5: 2, 10: 3, 20: 3})
    first = _Batch(sink, entries)
    # Steps 0 and the off-cadence 5 are consumed; 10 begins the next batch.
    assert first.state["last_seq"] == 6
    assert first.records == 4
    assert [meta["step"] for meta, _ in unpack_units(first.body)] == [0]
    second = _Batch(sink, entries[6:])
    assert second.state["last_seq"] == 9
    assert [meta["step"] for meta, _ in unpack_units(second.body)] == [10]


def test_a_lost_confirm_is_confirmed_again_without_a_second_upload(store: Store) -> None:
    sink = _sink(store)
    batch = _Batch(sink, _entries({0: 3}))
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


def test_a_presigned_url_that_expired_during_a_pause_is_minted_anew(store: Store) -> None:
    sink = _sink(store)
    batch = _Batch(sink, _entries({10: 3}))
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
    batch = _Batch(sink, _entries({0: 2}))
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
    first = _Batch(sink, entries)
    assert [meta["step"] for meta, _ in unpack_units(first.body)] == [10]
    assert first.state["last_seq"] == 5 and first.records == 2
    second = _Batch(sink, entries[5:])
    assert [meta["step"] for meta, _ in unpack_units(second.body)] == [20]
    assert "last_seq" not in second.state  # to the end of the read


def test_an_old_batch_whose_object_landed_before_its_url_expired_is_not_uploaded_twice(
    store: Store,
) -> None:
    # A batch recorded by an earlier version (no note that its PUT landed):
    # the object was PUT, its confirm's answer lost, and the process died.
    # Resent after the URL expired, a confirm of the key shows it is there:
    # confirmed once, and no second object of the same rows is made.
    sink = _sink(store)
    batch = _Batch(sink, _entries({0: 3}))
    store.faults["confirm"] = [LOST]
    with pytest.raises(TransportError):
        sink.send(batch.body, batch.ctx)
    batch.state["put"] = False  # as recorded before PUTs were noted
    store.faults["put"] = [lambda: httpx.Response(403, text="AccessDenied: request has expired")]
    sink.send(batch.body, batch.ctx)
    assert store.calls == ["presign", "put", "confirm", "put", "confirm"]
    assert store.minted == 1 and len(store.put) == 1
    assert batch.state["done"] == 1
