"""The Prime Traces sink alone, through ``httpx.MockTransport``.

The scripted service checks each upload with the local platform's own
validator (``primeruns.local.traces_ingest``), keeps the receipt it committed
per Idempotency-Key and answers a resend with it, as the real service does.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import workloads
from scripted_platform import LOST, Batch, ScriptedPlatform, entries_of, error
from traces_service import TracesService

import primeruns.sinks.traces as traces_module
from primeruns.exceptions import (
    ForbiddenError,
    RetryableAPIError,
    TraceTooLargeError,
    TransportError,
    ValidationRejectedError,
)
from primeruns.journal import EntryKind, Journal
from primeruns.local.multipart import boundary_of, parse_parts
from primeruns.records import stamp_run
from primeruns.ship.policy import Failure, RetryPolicy, classify
from primeruns.ship.shipper import Shipper
from primeruns.sinks.base import Binding, SinkOff
from primeruns.sinks.traces import TracesSink

_BOUND = Binding(run_id="eval-1", kind="eval")


@pytest.fixture
def service(platform: ScriptedPlatform) -> TracesService:
    return TracesService(platform)


def _sink(platform: ScriptedPlatform, **kwargs: Any) -> TracesSink:
    return TracesSink(platform.client(), context={"source": "unit-test"}, **kwargs)


def _episodes(n: int) -> list[Any]:
    return entries_of(EntryKind.EPISODE, workloads.gsm8k(n))


def _not_enabled() -> httpx.Response:
    return error(403, "Prime Traces is not enabled for this account", code="service_not_enabled")


def test_a_recorded_batch_is_resent_byte_for_byte_and_stored_once_whatever_failed(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    sink = _sink(platform)
    batch = Batch.prepare(sink, _episodes(5), _BOUND)
    platform.fail("upload", error(503, "busy", code="ingest_unavailable"), LOST)
    with pytest.raises(RetryableAPIError):
        batch.send(sink)
    with pytest.raises(TransportError):
        batch.send(sink)  # committed, the answer lost
    batch.send(sink)  # answered with the committed receipt
    sent = platform.sent("upload")
    assert len(sent) == 3
    assert len({request.content for request in sent}) == 1
    assert len({request.headers["idempotency-key"] for request in sent}) == 1
    assert len({request.headers["content-type"] for request in sent}) == 1
    # The key is the digest of the uncompressed JSONL the body carries.
    [_, traces_part] = parse_parts(boundary_of(sent[0].headers["content-type"]), sent[0].content)
    jsonl = gzip.decompress(bytes(traces_part.data))
    assert sent[0].headers["idempotency-key"] == "sha256:" + hashlib.sha256(jsonl).hexdigest()
    assert len(service.episodes) == 5 and service.replays == 1
    assert sink.committed == 1


def test_without_isal_zlib_makes_the_same_upload_the_service_stores(
    platform: ScriptedPlatform, service: TracesService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where isal has no wheel, zlib gzips the batch: the same lines under the
    same key, which the service reads and stores as it does isal's."""
    entries = _episodes(4)
    fast = Batch.prepare(_sink(platform), entries, _BOUND)
    monkeypatch.setattr(traces_module, "_deflate", zlib.compress)
    plain = Batch.prepare(_sink(platform), entries, _BOUND)
    assert plain.body != fast.body  # another deflater, another stream

    def lines(batch: Batch) -> bytes:
        content_type = batch.state["content_type"]
        [_, part] = parse_parts(boundary_of(content_type), batch.body)
        return gzip.decompress(bytes(part.data))

    assert lines(plain) == lines(fast)
    assert plain.state["key"] == fast.state["key"]
    plain.send(_sink(platform))
    assert len(service.episodes) == 4


def test_the_upload_is_gzipped_with_the_gil_released() -> None:
    """The point of ISA-L here (and zlib's way too): the shipper's thread
    gzips a batch while the training loop's threads run on. isal before 1.2
    held the GIL for the whole call, which the declared floor once allowed.

    Told without a clock: another thread, woken just before the call, can
    take the GIL only when the call lets it go; the interpreter's own turn
    taking is put off (a switch interval of 10 s) until long after the call
    returned and ``inside`` was cleared. On a loaded machine the woken
    thread may not get a core during the call: tried up to five times. A
    call that holds the GIL never lets it see ``inside``."""
    jsonl = b"".join(
        b'{"prompt":"q %d","completion":"a %d","reward":0.5}\n' % (i, 7 * i) for i in range(200_000)
    )
    seen: list[bool] = []
    for _ in range(5):
        seen.append(_seen_inside_deflate(jsonl))
        if seen[-1]:
            break
    assert seen[-1], seen


def _seen_inside_deflate(jsonl: bytes) -> bool:
    """Whether a thread woken just before ``_deflate`` ran during it."""
    inside = False
    seen: list[bool] = []
    go = threading.Event()

    def look() -> None:
        go.wait()
        seen.append(inside)  # runs once it has the GIL

    other = threading.Thread(target=look)
    other.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        inside = True
        go.set()
        traces_module._deflate(jsonl, 1, wbits=31)
        inside = False
    finally:
        sys.setswitchinterval(interval)
    other.join()
    return seen == [True]


def test_the_same_entries_always_make_the_same_upload_so_a_rebuilt_batch_is_a_replay(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    entries = _episodes(4)
    first = Batch.prepare(_sink(platform), entries, _BOUND)
    again = Batch.prepare(_sink(platform), entries, _BOUND)  # another process, later
    assert again.body == first.body and again.state == first.state
    first.send(_sink(platform))
    again.send(_sink(platform))
    assert len(service.episodes) == 4 and service.replays == 1


def test_every_line_names_this_run_and_episodes_and_bare_traces_go_in_separate_uploads(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    [episode, other] = workloads.gsm8k(2)
    bare = workloads.gsm8k(3)[2]["traces"]
    entries = entries_of(EntryKind.EPISODE, [episode, other]) + entries_of(
        EntryKind.TRACE, bare, first_seq=3
    )
    sink = _sink(platform)
    episodes = Batch.prepare(sink, entries, _BOUND)
    assert episodes.records == 2 and episodes.state["last_seq"] == 2
    episodes.send(sink)
    traces = Batch.prepare(sink, entries[2:], _BOUND)
    assert traces.records == len(bare) and traces.last_seq is None
    traces.send(sink)
    [episode_upload, trace_upload] = platform.sent("upload")
    assert episode_upload.headers["x-prime-line-format"] == "episode"
    assert "x-prime-line-format" not in trace_upload.headers  # the service's default: trace
    assert [row["run_id"] for row in service.episodes] == ["eval-1", "eval-1"]
    assert {json.loads(row["raw"])["run"]["id"] for row in service.traces} == {"eval-1"}
    assert sink.committed == 2


def test_service_not_enabled_before_the_first_receipt_turns_the_sink_off_quietly(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    sink = _sink(platform)
    batch = Batch.prepare(sink, _episodes(2), _BOUND)
    platform.fail("upload", _not_enabled())
    with pytest.raises(SinkOff) as raised:
        batch.send(sink)
    # Off for good (recorded in the journal by the shipper), and not a loss.
    assert raised.value.lasting
    assert classify(raised.value) is Failure.OFF
    assert service.episodes == []


def test_service_not_enabled_after_a_receipt_is_an_error_not_an_opt_out(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    sink = _sink(platform)
    entries = _episodes(4)
    Batch.prepare(sink, entries[:2], _BOUND).send(sink)
    platform.fail("upload", _not_enabled())
    with pytest.raises(ForbiddenError) as raised:
        Batch.prepare(sink, entries[2:], _BOUND).send(sink)
    assert raised.value.code == "service_not_enabled"
    assert classify(raised.value) is Failure.FATAL  # the backlog stays for a replay


def test_a_receipt_committed_by_an_earlier_process_also_makes_service_not_enabled_an_error(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    sink = _sink(platform, committed=3)  # what the journal says earlier processes got
    platform.fail("upload", _not_enabled())
    with pytest.raises(ForbiddenError):
        Batch.prepare(sink, _episodes(1), _BOUND).send(sink)


def test_a_403_for_another_reason_is_an_error_even_before_any_receipt(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    sink = _sink(platform)
    platform.fail("upload", error(403, "not a member of this team", code="forbidden"))
    with pytest.raises(ForbiddenError) as raised:
        Batch.prepare(sink, _episodes(1), _BOUND).send(sink)
    assert not isinstance(raised.value, SinkOff)


def test_a_run_opted_out_of_prime_traces_sends_nothing(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    sink = _sink(platform, opted_out=True)
    with pytest.raises(SinkOff):
        sink.prepare(_episodes(3), _BOUND)
    assert platform.calls == []


def test_a_receipt_whose_status_is_not_committed_is_not_success(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    sink = _sink(platform)
    batch = Batch.prepare(sink, _episodes(2), _BOUND)
    digest = batch.state["key"].removeprefix("sha256:")
    platform.fail("upload", httpx.Response(200, json={"upload_id": digest, "status": "pending"}))
    # Not stored as far as the sink can tell: resent as is (a replay is safe),
    # never counted as a loss of the batch's records.
    with pytest.raises(RetryableAPIError, match="pending"):
        batch.send(sink)
    assert sink.committed == 0


def test_an_empty_200_is_not_a_receipt(platform: ScriptedPlatform, service: TracesService) -> None:
    """A proxy's bare 200 says nothing was committed: it must not count as a
    receipt (the batch would be acknowledged and its records never stored)."""
    sink = _sink(platform)
    batch = Batch.prepare(sink, _episodes(2), _BOUND)
    platform.fail("upload", httpx.Response(200))
    with pytest.raises(RetryableAPIError):
        batch.send(sink)
    assert sink.committed == 0


def test_a_batch_the_service_refuses_is_refused_whole_and_names_the_bad_line(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    episodes = workloads.gsm8k(3)
    episodes[2]["id"] = ""
    sink = _sink(platform)
    with pytest.raises(ValidationRejectedError, match="line 3"):
        Batch.prepare(sink, entries_of(EntryKind.EPISODE, episodes), _BOUND).send(sink)
    # Nothing of it stored, so the shipper may cut it before line 3 and send the rest.
    assert service.episodes == [] and sink.isolates_rejections


def test_a_line_over_the_service_limit_fails_alone_and_its_neighbours_ship(
    platform: ScriptedPlatform, service: TracesService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(traces_module, "MAX_LINE_BYTES", 40_000)  # the service's is 64 MiB
    episodes = workloads.gsm8k(3)
    episodes[1]["info"] = {"padding": "x" * 50_000}
    entries = entries_of(EntryKind.EPISODE, episodes)
    sink = _sink(platform)
    before = Batch.prepare(sink, entries, _BOUND)
    assert before.records == 1 and before.state["last_seq"] == 1
    with pytest.raises(TraceTooLargeError):
        sink.prepare(entries[1:], _BOUND)  # the shipper counts this one entry as failed
    after = Batch.prepare(sink, entries[2:], _BOUND)
    before.send(sink)
    after.send(sink)
    assert [row["episode_id"] for row in service.episodes] == [episodes[0]["id"], episodes[2]["id"]]


def test_an_episode_no_line_can_be_made_of_fails_alone_and_its_neighbours_ship(
    platform: ScriptedPlatform, service: TracesService
) -> None:
    """As a line over the limit: an episode holding an integer of 400 digits
    (the journal takes it; orjson does not) raised in the middle of a batch,
    and the shipper failed the batch's first entry in its place, then the
    next: good episodes lost for one bad one. The upload ends before it."""
    episodes = workloads.gsm8k(3)
    bad = orjson.dumps(episodes[1])[:-1] + b', "huge": 1' + b"0" * 400 + b"}"
    entries = entries_of(EntryKind.EPISODE, [episodes[0], bad, episodes[2]])
    sink = _sink(platform)
    before = Batch.prepare(sink, entries, _BOUND)
    assert before.records == 1 and before.state["last_seq"] == 1
    with pytest.raises(ValueError):
        sink.prepare(entries[1:], _BOUND)  # the shipper counts this one entry as failed
    after = Batch.prepare(sink, entries[2:], _BOUND)
    before.send(sink)
    after.send(sink)
    assert [row["episode_id"] for row in service.episodes] == [episodes[0]["id"], episodes[2]["id"]]


def test_an_upload_ends_before_the_line_that_would_pass_the_request_target(
    platform: ScriptedPlatform, service: TracesService, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = workloads.gsm8k(1)[0]
    # Copies with renewed ids of the same length: every line is the same size.
    episodes = [workloads.renew_ids(copy.deepcopy(first), i) for i in range(10)]
    line = len(orjson.dumps(stamp_run(episodes[0], _BOUND.run_id, _BOUND.kind))) + 1
    monkeypatch.setattr(traces_module, "TARGET_BATCH_BYTES", int(line * 3.5))
    sink = _sink(platform)
    batch = Batch.prepare(sink, entries_of(EntryKind.EPISODE, episodes), _BOUND)
    assert batch.records == 3 and batch.state["last_seq"] == 3
    batch.send(sink)
    assert len(service.episodes) == 3


def test_a_backlog_reaches_prime_traces_in_uploads_of_a_few_mib_each_once(
    platform: ScriptedPlatform, service: TracesService, tmp_path: Path
) -> None:
    """A backlog (a burst of episodes, an uplink behind) goes in uploads of
    at most ``BACKLOG_BATCH_BYTES`` of episodes, not 30 MiB ones: each is
    stamped and gzipped while the one before is in flight, so the platform
    starts on the first sooner and this process's work overlaps its own
    (tools/bench/end_to_end.py). An answer lost on the way is replayed, and
    the service answers it with its receipt: every episode once."""
    episodes = workloads.gsm8k(2000)
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [orjson.dumps(e) for e in episodes])
    platform.fail("upload", LOST)
    shipper = Shipper(
        journal,
        _sink(platform),
        binding=lambda: _BOUND,
        training=False,
        policy=RetryPolicy(base_delay_s=0.001, max_delay_s=0.01),
        on_failure=lambda what, exc: None,
    )
    shipper.start()
    assert shipper.drain(journal.last_seq(), deadline=time.monotonic() + 60)
    shipper.stop(timeout=5)
    journal.close()
    assert sorted(row["episode_id"] for row in service.episodes) == sorted(
        e["id"] for e in episodes
    )
    assert service.replays == 1
    sizes = []
    for request in platform.sent("upload"):
        [_, part] = parse_parts(boundary_of(request.headers["content-type"]), request.content)
        sizes.append(len(gzip.decompress(bytes(part.data))))
    largest_line = max(len(orjson.dumps(e)) for e in episodes) * 2
    assert len(service.receipts) >= 3
    assert max(sizes) <= traces_module.BACKLOG_BATCH_BYTES + largest_line
