"""Records repeating an id, refused by Prime Traces: the shipper and the
traces sink against a service scripted behind ``httpx.MockTransport``.

The service refuses an upload that repeats a trace or episode id (400
``duplicate_trace_id``/``duplicate_episode_id``), naming the id, not its
line. The records that repeat one are set apart in one step and counted as
failed with the service's reason; the rest go in one request. The answer is
untrusted: one naming no id of the batch, every id of it, a huge body or
garbage never crashes the shipper nor keeps it going round.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import workloads
from scripted_platform import LOST, PASS, ScriptedPlatform, error
from traces_service import TracesService

from primeruns.journal import EntryKind, Journal
from primeruns.local.multipart import boundary_of, parse_parts
from primeruns.ship.policy import RetryPolicy
from primeruns.ship.shipper import Shipper
from primeruns.sinks.base import Binding
from primeruns.sinks.repeated_ids import lines_to_set_apart, named_ids
from primeruns.sinks.traces import TracesSink

_BOUND = Binding(run_id="eval-1", kind="eval")
_FAST = RetryPolicy(base_delay_s=0.001, max_delay_s=0.01)
_WAIT_S = 60.0  # a bound on a wait for the shipper's thread, never a pace


def _journal(tmp_path: Path, episodes: list[dict[str, Any]]) -> Journal:
    journal = Journal.create(tmp_path / "runs")
    journal.append(EntryKind.EPISODE, [orjson.dumps(e) for e in episodes])
    return journal


def _shipper(journal: Journal, platform: ScriptedPlatform) -> Shipper:
    return Shipper(
        journal,
        TracesSink(platform.client(), context={"source": "unit-test"}),
        binding=lambda: _BOUND,
        training=False,
        policy=_FAST,
        on_failure=lambda what, exc: None,
    )


def _drain(journal: Journal, platform: ScriptedPlatform) -> None:
    shipper = _shipper(journal, platform)
    shipper.start()
    assert shipper.drain(journal.last_seq(), deadline=time.monotonic() + _WAIT_S)
    shipper.stop(timeout=5)


def _lost(journal: Journal) -> tuple[int, list[str]]:
    loss = journal.losses().get("traces", {"count": 0, "reasons": []})
    return int(loss["count"]), list(loss["reasons"])


def _with_repeats(n: int) -> tuple[list[dict[str, Any]], set[int]]:
    """``n`` episodes, five of which repeat an id: a trace id of an earlier
    episode (three), an earlier episode's id, or one id on two of its own
    traces. Returns them and the indexes of the five."""
    episodes = workloads.gsm8k(n)
    for repeat, original in ((7, 2), (8, 2), (30, 29)):
        episodes[repeat]["traces"][0]["id"] = episodes[original]["traces"][0]["id"]
    episodes[12]["id"] = episodes[11]["id"]
    episodes[20]["traces"].append(dict(episodes[20]["traces"][0]))
    return episodes, {7, 8, 30, 12, 20}


def test_every_record_repeating_an_id_is_set_apart_at_once_and_the_rest_ships_once(
    platform: ScriptedPlatform, tmp_path: Path
) -> None:
    """Before, the batch was halved until the records sharing an id went in
    uploads of their own: 15 requests here, all stored, the repeats
    replacing the first copies in the service's reads."""
    service = TracesService(platform)
    episodes, repeats = _with_repeats(40)
    journal = _journal(tmp_path, episodes)
    _drain(journal, platform)
    kept = [e for i, e in enumerate(episodes) if i not in repeats]
    assert Counter(service.episode_ids()) == Counter(e["id"] for e in kept)
    assert Counter(service.trace_ids()) == Counter(t["id"] for e in kept for t in e["traces"])
    count, reasons = _lost(journal)
    assert count == len(repeats)
    assert any("repeats in this upload" in r for r in reasons), reasons
    assert platform.calls == ["upload", "upload"]  # refused, then the rest at once
    assert journal.cursor("traces").acked == journal.last_seq()
    journal.close()


@pytest.mark.parametrize("also_an_episode_id", [False, True])
def test_an_id_the_service_holds_already_fails_its_one_record(
    also_an_episode_id: bool, platform: ScriptedPlatform, tmp_path: Path
) -> None:
    """Nothing repeats within the batch: the id the answer names is on one
    line, which any upload would have refused (a service scoping repeats
    beyond one request). Named as a trace id (``duplicate_trace_id``), it is
    the line holding it as one: an earlier episode whose own id is the same
    string repeats nothing. Before, the first line holding the name in any
    role was set apart: that innocent episode counted as failed, and the
    rest, refused again, lost the episode holding the trace too (two
    records counted for one repeat, in three requests)."""
    episodes = workloads.gsm8k(30)
    if also_an_episode_id:
        episodes[3]["id"] = episodes[17]["traces"][0]["id"]
    service = TracesService(platform, held=frozenset({episodes[17]["traces"][0]["id"]}))
    journal = _journal(tmp_path, episodes)
    _drain(journal, platform)
    assert service.episode_ids() == [e["id"] for i, e in enumerate(episodes) if i != 17]
    assert _lost(journal)[0] == 1
    assert platform.calls == ["upload", "upload"]
    journal.close()


def _garbage() -> httpx.Response:
    return httpx.Response(400, content=b"<html>\x00\xff bad request</html>")


def _named(ids: list[str]) -> httpx.Response:
    message = "trace ids " + ", ".join(repr(i) for i in ids) + " repeat"
    return error(400, message, code="duplicate_trace_id")


_ANSWERS = {
    "an-id-not-in-the-batch": lambda: _named(["not-in-this-batch"]),
    "thousands-of-ids": lambda: _named([f"id-{i}" for i in range(3000)]),
    "a-code-without-a-message": lambda: error(400, "", code="duplicate_trace_id"),
    "garbage": _garbage,
    "a-huge-body": lambda: _named([f"id-{i:07d}" for i in range(400_000)]),
}


@pytest.mark.parametrize("answer", list(_ANSWERS))
def test_a_refusal_naming_nothing_of_the_batch_sets_apart_what_the_batch_repeats(
    answer: str, platform: ScriptedPlatform, tmp_path: Path
) -> None:
    """The first upload is refused with an answer that names no id of the
    batch. With the code of a repeated id, the batch's own lines say which
    record repeats one: set apart, the rest in one request (a huge message,
    which ``MockTransport`` hands over whole, is read only so far). With no
    code (a gateway's page), it is halved as before; the half that repeats
    the id is refused by the service, naming it, and the rest of the batch
    goes in one request. Either way the repeat alone is counted. Before,
    the halving went on until the two were apart, and both were stored."""
    service = TracesService(platform)
    episodes = workloads.gsm8k(30)
    episodes[5]["traces"][0]["id"] = episodes[3]["traces"][0]["id"]
    platform.fail("upload", _ANSWERS[answer]())
    journal = _journal(tmp_path, episodes)
    _drain(journal, platform)
    assert service.episode_ids() == [e["id"] for i, e in enumerate(episodes) if i != 5]
    assert _lost(journal)[0] == 1
    # Refused, the rest; or refused, the first half refused, the rest.
    assert len(platform.calls) == (3 if answer == "garbage" else 2)
    journal.close()


def test_a_refusal_naming_nothing_of_a_batch_that_repeats_nothing_halves_it(
    platform: ScriptedPlatform, tmp_path: Path
) -> None:
    """Nothing found to set apart: the batch is halved, as before this
    change (this guards that fallback), and every record ships once."""
    service = TracesService(platform)
    episodes = workloads.gsm8k(30)
    platform.fail("upload", _named(["not-in-this-batch"]))
    journal = _journal(tmp_path, episodes)
    _drain(journal, platform)
    assert service.episode_ids() == [e["id"] for e in episodes]
    assert _lost(journal)[0] == 0
    assert platform.calls == ["upload"] * 3  # refused, then two halves
    journal.close()


def test_a_service_naming_the_first_id_of_every_upload_ends_with_each_record_counted(
    platform: ScriptedPlatform, tmp_path: Path
) -> None:
    """A service that refuses everything, each time naming the first trace
    id of the upload: one record set apart per request, each counted with
    the reason, and the shipper ends (never goes round, never drops one)."""
    episodes = workloads.gsm8k(12)

    def refuse(request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        first = orjson.loads(_jsonl(request).split(b"\n")[0])
        return _named([first["traces"][0]["id"]])

    platform.route("upload", "POST", "/api/v1/traces", refuse)
    journal = _journal(tmp_path, episodes)
    _drain(journal, platform)
    count, reasons = _lost(journal)
    assert count == len(episodes) and reasons
    assert len(platform.calls) == len(episodes)  # the last one fails alone, as it is
    journal.close()


def test_the_records_set_apart_are_counted_once_when_the_answer_to_the_rest_is_lost(
    platform: ScriptedPlatform, tmp_path: Path
) -> None:
    service = TracesService(platform)
    platform.fail("upload", PASS, LOST)  # refused; the rest stored, its answer lost
    episodes, repeats = _with_repeats(40)
    journal = _journal(tmp_path, episodes)
    _drain(journal, platform)
    assert Counter(service.episode_ids()) == Counter(
        e["id"] for i, e in enumerate(episodes) if i not in repeats
    )
    assert service.replays == 1
    assert _lost(journal)[0] == len(repeats)
    journal.close()


@pytest.mark.parametrize("then", ["stored", "refused"])
def test_a_new_shipper_sends_the_rest_as_recorded_and_counts_the_set_apart_once(
    then: str, platform: ScriptedPlatform, tmp_path: Path
) -> None:
    """The rest of the batch is recorded with how many records it passes
    over and why: a process that stops before its answer leaves that to
    the next, which resends the rest byte for byte and counts them once.
    Refused in its turn (the service holds an id of it now), the rest's
    lines are not its entries in order to the new process, which knows
    nothing of the records set apart: it is halved, and they are found
    again, each counted once, no innocent record with them."""
    service = TracesService(platform, routed=False)
    down = threading.Event()
    tried = threading.Event()

    def upload(request: httpx.Request, params: dict[str, str]) -> httpx.Response:
        if len(platform.calls) > 1 and not down.is_set():
            tried.set()
            return error(503, "restarting")
        return service.upload(request, params)

    platform.route("upload", "POST", "/api/v1/traces", upload)
    episodes, repeats = _with_repeats(40)
    journal = _journal(tmp_path, episodes)
    first = _shipper(journal, platform)
    first.start()
    assert tried.wait(_WAIT_S)
    first.stop(timeout=5)
    recorded = journal.cursor("traces").inflight
    assert recorded is not None and recorded.state["set_apart"]["records"] == len(repeats)
    assert _lost(journal)[0] == 0  # not counted yet: counted with the rest's answer
    if then == "refused":
        service.held = frozenset({episodes[25]["traces"][0]["id"]})
        repeats.add(25)
    down.set()
    sent = len(platform.requests)
    _drain(journal, platform)
    assert platform.requests[sent][1].content == recorded.body
    assert Counter(service.episode_ids()) == Counter(
        e["id"] for i, e in enumerate(episodes) if i not in repeats
    )
    assert _lost(journal)[0] == len(repeats)
    journal.close()


def test_the_lines_set_apart_are_found_in_the_batch_not_taken_from_the_answer() -> None:
    def line(episode_id: str, *trace_ids: str) -> bytes:
        return orjson.dumps({"id": episode_id, "traces": [{"id": t} for t in trace_ids]})

    jsonl = b"\n".join([line("e1", "a"), line("e2", "b"), line("e3", "a"), b"not json", b""])
    # The batch's own repeats, whatever the answer names.
    assert lines_to_set_apart(jsonl, episode=True, named={"b", "zzz"}) == [3]
    # An episode id equal to a trace id repeats nothing.
    jsonl = b"\n".join([line("a", "a"), line("e2", "b"), b""])
    assert lines_to_set_apart(jsonl, episode=True, named=()) == []
    # Nothing repeats: the first line holding a named id, one a refusal.
    assert lines_to_set_apart(jsonl, episode=True, named={"b", "a"}) == [1]
    bare = b"\n".join([orjson.dumps({"id": "t1"}), orjson.dumps({"id": "t1"}), b""])
    assert lines_to_set_apart(bare, episode=False) == [2]
    assert named_ids("trace id 'x' and \"y\" repeat") == {"x", "y"}
    assert len(named_ids(" ".join(f"'{i}'" for i in range(10_000)))) == 256


def _jsonl(request: httpx.Request) -> bytes:
    [_, part] = parse_parts(boundary_of(request.headers["content-type"]), request.content)
    return gzip.decompress(bytes(part.data))
