"""Every public call of the prime-traces 0.0.10 client answers on the local
platform for data that exists: nodes, calls, run search and deletes (besides
the uploads and reads of ``test_traces_service``), over real HTTP, on real
verifiers episodes (the bundled gsm8k workload)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import workloads
from prime_traces import LineFormat, TracesClient
from prime_traces.exceptions import NotFoundError, ValidationRejectedError

from primeruns.local import LocalPlatform


def _upload(client: TracesClient, run_id: str, n: int) -> list[dict[str, Any]]:
    episodes = []
    for i, ep in enumerate(workloads.gsm8k(n)):
        ep = json.loads(json.dumps(ep))
        ep["id"] = f"{run_id}-ep{i}"
        ep["run"] = {"id": run_id, "type": "eval"}
        for j, tr in enumerate(ep["traces"]):
            tr["id"] = f"{run_id}-ep{i}-t{j}"
            tr["run"] = {"id": run_id, "type": "eval"}
        episodes.append(ep)
    client.upload_records(episodes, line_format=LineFormat.EPISODE, context={"run_type": "eval"})
    return episodes


def test_nodes_and_calls_read_a_traces_messages_in_order(client: TracesClient) -> None:
    (ep,) = _upload(client, "run-nodes", 1)
    doc = ep["traces"][0]
    nodes = client.list_nodes(doc["id"])
    assert [n.message.role for n in nodes.items] == [n["message"]["role"] for n in doc["nodes"]]
    assert [n.message.content for n in nodes.items] == [
        n["message"]["content"] for n in doc["nodes"]
    ]
    assert [n.node_idx for n in nodes.items] == list(range(len(doc["nodes"])))
    assert nodes.partial_index is False and nodes.next_cursor is None
    sampled = client.list_nodes(doc["id"], sampled=True)
    assert [n.node_idx for n in sampled.items] == [
        i for i, n in enumerate(doc["nodes"]) if n.get("sampled")
    ]
    assert [n.node_idx for n in client.list_nodes(doc["id"], role=["user"]).items] == [
        i for i, n in enumerate(doc["nodes"]) if n["message"]["role"] == "user"
    ]
    assert [n.node_idx for n in client.list_nodes(doc["id"], after=0).items] == list(
        range(1, len(doc["nodes"]))
    )
    first = client.list_nodes(doc["id"], limit=1)
    assert len(first.items) == 1 and first.next_cursor is not None
    second = client.list_nodes(doc["id"], limit=1, cursor=first.next_cursor)
    assert second.items[0].node_idx == 1
    calls = client.list_calls(doc["id"])
    assert [(c.call_idx, c.node_idx, c.model, c.finish_reason) for c in calls.items] == [
        (i, c["node"], c["model"], c["finish_reason"]) for i, c in enumerate(doc["calls"])
    ]
    assert client.list_calls(doc["id"], model=["no-such-model"]).items == []
    with pytest.raises(NotFoundError):
        client.list_nodes("no-such-trace")


def test_search_finds_each_node_holding_the_text_with_exact_offsets(client: TracesClient) -> None:
    episodes = _upload(client, "run-search", 4)
    needle = "boxed"
    page = client.search(needle, run_id="run-search")
    expected = [
        (tr["id"], i)
        for ep in episodes
        for tr in ep["traces"]
        for i, n in enumerate(tr["nodes"])
        if isinstance(n["message"].get("content"), str) and needle in n["message"]["content"]
    ]
    assert sorted((m.trace_id, m.node_idx) for m in page.items) == sorted(expected)
    assert page.coverage is not None and page.coverage.examined_traces == sum(
        len(ep["traces"]) for ep in episodes
    )
    for match in page.items:
        assert match.representation == "text" and match.field == "content"
        assert match.match_end - match.match_start == len(needle)
        assert needle in match.excerpt
        assert match.excerpt.index(needle) == match.match_start - match.excerpt_start
    system = client.search(needle, run_id="run-search", role="system")
    assert all(m.role == "system" for m in system.items)
    assert client.search("no such text anywhere", run_id="run-search").items == []
    with pytest.raises(ValidationRejectedError):
        client.search("ab", run_id="run-search")


def test_delete_removes_every_copy_and_a_repeat_is_not_found(client: TracesClient) -> None:
    (ep,) = _upload(client, "run-delete", 1)
    trace_id = ep["traces"][0]["id"]
    created = client.get(trace_id).created_at
    with pytest.raises(NotFoundError):  # a hint matching no stored copy
        client.delete(trace_id, created_at="2001-01-01T00:00:00Z")
    assert client.get(trace_id).trace_id == trace_id
    client.delete(trace_id, created_at=created.isoformat())
    with pytest.raises(NotFoundError):
        client.get(trace_id)
    with pytest.raises(NotFoundError):
        client.delete(trace_id)
    assert client.get_episode(ep["id"]).episode_id == ep["id"]  # episode rows stay


def test_delete_run_removes_its_traces_and_leaves_other_runs(client: TracesClient) -> None:
    _upload(client, "run-gone", 2)
    kept = _upload(client, "run-kept", 1)
    client.delete_run("run-gone")
    assert client.list(run_id="run-gone").items == []
    assert len(client.list(run_id="run-kept").items) == len(kept[0]["traces"])
    with pytest.raises(NotFoundError):
        client.delete_run("run-gone")


def test_raw_downloads_and_the_episode_envelope(client: TracesClient, tmp_path: Path) -> None:
    (ep,) = _upload(client, "run-raw", 1)
    trace_id = ep["traces"][0]["id"]
    dest = tmp_path / "trace.json"
    written = client.download_raw(trace_id, dest)
    assert written == dest.stat().st_size and json.loads(dest.read_bytes())["id"] == trace_id
    assert json.loads(client.get_raw(trace_id)) == json.loads(dest.read_bytes())
    envelope = json.loads(client.get_episode_raw(ep["id"]))
    assert envelope["traces"] == [t["id"] for t in ep["traces"]]
    members = client.list_episode_traces(ep["id"])
    assert sorted(t.trace_id for t in members.items) == sorted(t["id"] for t in ep["traces"])


def test_a_jsonl_file_and_raw_lines_upload_once_and_a_rerun_replays(
    client: TracesClient, platform: LocalPlatform, tmp_path: Path
) -> None:
    """``upload_file`` after a crash: the rerun's batches replay their receipts."""
    lines = []
    for i, ep in enumerate(workloads.gsm8k(3)):
        ep = json.loads(json.dumps(ep))
        ep["id"], ep["run"] = f"file-ep{i}", {"id": "run-file", "type": "eval"}
        for j, tr in enumerate(ep["traces"]):
            tr["id"], tr["run"] = f"file-ep{i}-t{j}", {"id": "run-file", "type": "eval"}
        lines.append(json.dumps(ep).encode())
    path = tmp_path / "episodes.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    first = client.upload_file(path, line_format=LineFormat.EPISODE)
    again = client.upload_lines([line + b"\n" for line in lines], line_format=LineFormat.EPISODE)
    assert [r.upload_id for r in again] == [r.upload_id for r in first]
    stored = platform.run("run-file")["traces"]
    assert stored["distinct_episodes"] == stored["episodes"] == 3


def test_the_async_client_reads_and_deletes_the_same(platform: LocalPlatform) -> None:
    import asyncio

    from prime_traces import AsyncTracesClient

    sync = TracesClient(api_key="k", base_url=platform.url, team_id="")
    (ep,) = _upload(sync, "run-async", 1)
    sync.close()
    trace_id = ep["traces"][0]["id"]

    async def go() -> tuple[int, int, int]:
        async with AsyncTracesClient(api_key="k", base_url=platform.url, team_id="") as c:
            nodes = await c.list_nodes(trace_id)
            calls = await c.list_calls(trace_id)
            found = await c.search("boxed", run_id="run-async")
            await c.delete(trace_id)
            return len(nodes.items), len(calls.items), len(found.items)

    nodes, calls, found = asyncio.run(go())
    assert nodes == len(ep["traces"][0]["nodes"]) and calls == len(ep["traces"][0]["calls"])
    assert found >= 1
    with (
        TracesClient(api_key="k", base_url=platform.url, team_id="") as c,
        pytest.raises(NotFoundError),
    ):
        c.get(trace_id)
