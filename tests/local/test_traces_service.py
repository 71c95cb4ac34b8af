"""Prime Traces over real HTTP: the vendor's client, replays, reads and rejections."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from local_helpers import episode, error_code, jsonl, post_upload, trace
from prime_traces import LineFormat, TracesClient
from prime_traces.exceptions import NotFoundError

from primeruns.local import LocalPlatform


def test_vendor_client_uploads_episodes_and_replay_stores_nothing(
    platform: LocalPlatform, client: TracesClient
) -> None:
    episodes = [episode("run-vendor", traces=2, step=s) for s in (0, 0, 1)]
    first = client.upload_records(
        episodes, line_format=LineFormat.EPISODE, context={"source": "test", "run_type": "train"}
    )
    assert [r.status for r in first] == ["committed"]
    again = client.upload_records(
        episodes, line_format=LineFormat.EPISODE, context={"source": "test", "run_type": "train"}
    )
    assert again == first
    stored = platform.run("run-vendor")["traces"]
    assert stored == {
        "episodes": 3,
        "distinct_episodes": 3,
        "traces": 6,
        "distinct_traces": 6,
        "uploads": 1,
        "replayed_uploads": 1,
    }
    run = client.get_run("run-vendor")
    assert (run.trace_count, run.episode_count, run.step_min, run.step_max) == (6, 3, 0, 1)
    assert run.avg_reward == 1.0 and run.model_ids == ["m-1"]
    listed = client.list_episodes(run_id="run-vendor")
    assert sorted(e.episode_id for e in listed.items) == sorted(e["id"] for e in episodes)
    steps = client.list_run_steps("run-vendor")
    assert [(s.step, s.episode_count) for s in steps.items] == [(0, 2), (1, 1)]
    assert [r.run_id for r in client.list_runs(run_type="train").items] == ["run-vendor"]


def test_runs_are_listed_by_the_type_their_records_say(client: TracesClient) -> None:
    # Uploaded with no run_type in the context (another uploader's, or a bare
    # upload_records): the records still say which kind of run they belong to.
    client.upload_records([episode("run-trained", step=3)], line_format=LineFormat.EPISODE)
    client.upload_records([episode("run-evaluated")], line_format=LineFormat.EPISODE)
    # A record without a run type: the upload context types it.
    untyped = trace("run-context")
    untyped["run"] = {"id": "run-context"}
    client.upload_records([untyped], context={"run_type": "train"})
    client.upload_records([trace(None)])  # no run at all: listed nowhere

    mine = {"run-trained", "run-evaluated", "run-context"}  # the platform is shared

    def listed(*types: Any) -> set[str]:
        return mine & {r.run_id for r in client.list_runs(run_type=list(types)).items}

    assert listed("train") == {"run-trained", "run-context"}
    assert listed("eval") == {"run-evaluated"}
    assert listed("unknown") == set()
    assert client.get_run("run-trained").model_extra["run_type"] == "train"


def test_bare_traces_read_back_raw_and_paginated(client: TracesClient) -> None:
    traces = [trace("run-bare") for _ in range(5)]
    (receipt,) = client.upload_records(traces)
    raw = client.get_raw(traces[0]["id"])
    assert raw == jsonl([traces[0]]).rstrip(b"\n")
    summary = client.get(traces[0]["id"])
    assert summary.upload_id == receipt.upload_id and summary.episode_id is None
    seen = [t.trace_id for t in client.iter(run_id="run-bare", limit=2)]
    assert sorted(seen) == sorted(t["id"] for t in traces)


def test_episode_detail_raw_envelope_and_member_traces(client: TracesClient) -> None:
    ep = episode("run-detail", traces=3)
    client.upload_records([ep], line_format=LineFormat.EPISODE)
    detail = client.get_episode(ep["id"])
    assert detail.traces.trace_count == 3 and detail.traces.total_tokens == 126
    envelope = json.loads(client.get_episode_raw(ep["id"]))
    assert envelope["traces"] == [t["id"] for t in ep["traces"]]
    members = client.list_episode_traces(ep["id"])
    assert {t.trace_id for t in members.items} == {t["id"] for t in ep["traces"]}


def test_a_record_in_two_different_uploads_is_two_rows(
    platform: LocalPlatform, client: TracesClient
) -> None:
    t = trace("run-dup")
    client.upload_records([t])
    client.upload_records([t, trace("run-dup")])
    stored = platform.run("run-dup")["traces"]
    assert stored["traces"] == 3 and stored["distinct_traces"] == 2
    assert client.get_run("run-dup").trace_count == 2


def test_a_step_past_64_bits_is_stored_not_answered_500(
    platform: LocalPlatform, client: TracesClient
) -> None:
    """A trace whose run.work.step SQLite cannot hold (an older SDK journaled
    such steps) was an OverflowError in the insert: a 500 for every upload
    holding it, which the SDK retries for good. The trace is stored, its
    step left out of the indexed column; the steps at the range's ends stay."""
    huge = trace("run-huge", step=2**63 + 2)
    ends = [trace("run-huge", step=2**63 - 1), trace("run-huge", step=-(2**63))]
    client.upload_records([huge, *ends])
    stored = platform.run("run-huge")["traces"]
    assert stored["traces"] == 3 and stored["distinct_traces"] == 3
    assert client.get_run("run-huge").trace_count == 3


def test_unknown_ids_are_404_with_codes(client: TracesClient, platform: LocalPlatform) -> None:
    with pytest.raises(NotFoundError) as exc:
        client.get_run("no-such-run")
    assert exc.value.code == "run_not_found"
    with pytest.raises(NotFoundError) as exc:
        client.get("no-such-trace")
    assert exc.value.code == "trace_not_found"
    with pytest.raises(NotFoundError) as exc:
        client.get_episode("no-such-episode")
    assert exc.value.code == "episode_not_found"
    assert client.list_run_steps("no-such-run").items == []


def test_same_key_other_line_format_is_409(platform: LocalPlatform) -> None:
    body = jsonl([trace("run-409")])
    assert post_upload(platform.url, body).status_code == 201
    replay = post_upload(platform.url, body)
    assert replay.status_code == 200 and replay.json()["status"] == "committed"
    conflict = post_upload(platform.url, body, episode_format=True)
    assert conflict.status_code == 409 and error_code(conflict) == "line_format_conflict"


GOOD = jsonl([trace("run-bad")])


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"body": GOOD, "key": "sha256:" + "0" * 64}, "digest_mismatch"),
        ({"body": GOOD, "key": "md5:abc"}, "invalid_idempotency_key"),
        ({"body": b"not json\n"}, "invalid_trace"),
        ({"body": b"[1,2]\n"}, "invalid_trace"),
        ({"body": b'{"id":"x"}\n'}, "invalid_trace"),
        ({"body": b'{"id":"x","timing":{"start":NaN}}\n'}, "invalid_trace"),
        ({"body": jsonl([trace(start=1.0)])}, "created_at_out_of_window"),
        ({"body": b"\xff\xfe\n"}, "malformed_encoding"),
        ({"body": GOOD, "metadata": b'{"schema_version": 2}'}, "unsupported_schema_version"),
        ({"body": GOOD, "metadata": b"nope"}, "invalid_metadata"),
        ({"body": GOOD, "metadata": b'{"schema_version":1,"context":{"a":1}}'}, "invalid_metadata"),
        ({"body": GOOD, "episode_format": True}, "line_format_mismatch"),
        ({"body": jsonl([episode()])}, "line_format_mismatch"),
        ({"body": jsonl([trace(trace_id="same"), trace(trace_id="same")])}, "duplicate_trace_id"),
        (
            {
                "body": jsonl([episode(episode_id="e"), episode(episode_id="e")]),
                "episode_format": True,
            },
            "duplicate_episode_id",
        ),
        (
            {"body": jsonl([episode(episode_id="e" * 300)]), "episode_format": True},
            "episode_id_too_long",
        ),
        ({"body": GOOD, "headers": {"X-Prime-Line-Format": "bogus"}}, "line_format_mismatch"),
    ],
)
def test_rejections_are_400_with_the_contract_code(
    platform: LocalPlatform, kwargs: dict[str, object], code: str
) -> None:
    response = post_upload(platform.url, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 400, response.text
    assert error_code(response) == code


def test_bad_gzip_and_bad_multipart_are_400(platform: LocalPlatform) -> None:
    key = {"Idempotency-Key": "sha256:" + "a" * 64}
    files: dict[str, Any] = {
        "metadata": (None, b'{"schema_version":1}', "application/json"),
        "traces": ("t.jsonl", b"not gzip", "application/x-ndjson", {"Content-Encoding": "gzip"}),
    }
    r = httpx.post(f"{platform.url}/api/v1/traces", headers=key, files=files)
    assert r.status_code == 400 and error_code(r) == "malformed_encoding"
    r = httpx.post(
        f"{platform.url}/api/v1/traces",
        content=b"--x\r\ngarbage",
        headers={**key, "Content-Type": "multipart/form-data; boundary=x"},
    )
    assert r.status_code == 400 and error_code(r) == "malformed_encoding"
    r = httpx.post(f"{platform.url}/api/v1/traces", json={"a": 1}, headers=key)
    assert r.status_code == 415
    # An oversized declared body is refused before it is read (raw socket: httpx
    # will not send a body shorter than its Content-Length).
    host, port = platform.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /api/v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data;"
            b" boundary=x\r\nIdempotency-Key: "
            + key["Idempotency-Key"].encode()
            + b"\r\nContent-Length: "
            + str(2**29).encode()
            + b"\r\n\r\nx"
        )
        answer = b""
        while b"}}" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400") and b"upload_too_large" in answer


def test_read_filters_are_validated(platform: LocalPlatform) -> None:
    for query in (
        "limit=0",
        "limit=101",
        "has_error=maybe",
        "cursor=zzz",
        "reward_min=x",
        "created_after=yesterday",
    ):
        r = httpx.get(f"{platform.url}/api/v1/traces?{query}")
        assert r.status_code == 400, query
        assert error_code(r) in ("invalid_filter", "invalid_cursor")


def test_api_key_and_disabled_service(make_local_platform: object, tmp_path: Path) -> None:
    make = make_local_platform
    secured = make(api_key="sekret")  # type: ignore[operator]
    body = jsonl([trace("run-auth")])
    r = post_upload(secured.url, body, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and error_code(r) == "unauthenticated"
    assert "sekret" not in r.text
    assert (
        post_upload(secured.url, body, headers={"Authorization": "Bearer sekret"}).status_code
        == 201
    )
    disabled = make(traces_disabled=True)  # type: ignore[operator]
    r = post_upload(disabled.url, body)
    assert r.status_code == 403 and error_code(r) == "service_not_enabled"
    r = httpx.get(f"{disabled.url}/api/v1/runs")
    assert r.status_code == 403 and error_code(r) == "service_not_enabled"
