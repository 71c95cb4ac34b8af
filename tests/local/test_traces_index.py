"""Every public call of the prime-traces 0.0.10 client answers on the local
platform for data that exists: nodes, calls, run search and deletes (besides
the uploads and reads of ``test_traces_service``), over real HTTP, on real
verifiers episodes (the bundled gsm8k workload); run search's pages, pinned
on hand-made traces, and what a page costs, on an app served in-process."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
import workloads
from local_helpers import jsonl, post_upload, trace, upload_parts
from prime_traces import LineFormat, TracesClient
from prime_traces.exceptions import NotFoundError, ValidationRejectedError

from primeruns.local import LocalPlatform, traces_index
from primeruns.local.app import build_app
from primeruns.local.settings import ServerSettings


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


_NEEDLE = "needle"
_FILLER = "x" * 50  # longer than the excerpt's 40 code points either side


def _node(role: str, content: Any, **more: Any) -> dict[str, Any]:
    return {"message": {"role": role, "content": content, **more}}


def _search_run_docs(run_id: str) -> list[dict[str, Any]]:
    """Traces of one run, listed oldest first (by ``timing.start``), with 0 to
    3 matching nodes each, matches in every field, and a trace whose older
    copy matched where the newest does not."""
    t0 = time.time() - 3600
    hit = f"{_FILLER}{_NEEDLE}{_FILLER}"
    nodes: list[list[dict[str, Any]]] = [
        [_node("system", f"{_NEEDLE} first"), _node("user", "nothing"), _node("assistant", hit)],
        [_node("user", "no match here")],
        [_node("user", f"ü{_NEEDLE}"), _node("assistant", [{"type": "text", "text": _NEEDLE}])],
        [
            _node("assistant", None, tool_calls=[{"function": {"arguments": f'"{_NEEDLE}"'}}]),
            _node("tool", hit, tool_call_id="c1"),
        ],
        [_node("assistant", "x", reasoning_content=f"think {_NEEDLE}"), _node("user", hit)],
        [],
        [_node("user", _NEEDLE), _node("user", f"{_NEEDLE}{_NEEDLE}"), _node("system", hit)],
    ]
    docs = []
    for i, shown in enumerate(nodes):
        doc = trace(run_id, step=i % 2, reward=i / 10, trace_id=f"{run_id}-t{i}", start=t0 + i)
        doc["nodes"] = shown
        if i == 4:
            doc["ok"] = False
        docs.append(doc)
    return docs


def _expected(
    docs: list[dict[str, Any]], generations: dict[str, int], field: str, role: str | None
) -> list[tuple[Any, ...]]:
    """What search answers, worked out from the documents alone."""
    found = []
    for doc in docs:
        for i, node in enumerate(doc["nodes"]):
            message = node["message"]
            value = message.get(field)
            if (role is not None and message["role"] != role) or value is None:
                continue
            text = (
                value
                if isinstance(value, str)
                else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            )
            start = text.find(_NEEDLE)
            if start < 0:
                continue
            end = start + len(_NEEDLE)
            shown = "text" if isinstance(value, str) else "json"
            generation = generations.get(doc["id"], 1)
            cut = max(0, start - 40)
            where = (start, end, text[cut : end + 40], cut)
            found.append((doc["id"], i, generation, message["role"], field, shown, *where))
    return found


def _row(match: dict[str, Any]) -> tuple[Any, ...]:
    keys = ("trace_id", "node_idx", "generation", "role", "field", "representation")
    keys += ("match_start", "match_end", "excerpt", "excerpt_start")
    return tuple(match[k] for k in keys)


def _pages(url: str, run_id: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every page of a run's search, following ``next_cursor`` to the end."""
    pages: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        sent = {**params, "cursor": cursor} if cursor else params
        r = httpx.get(f"{url}/api/v1/runs/{run_id}/search", params=sent, timeout=10)
        assert r.status_code == 200, r.text
        pages.append(r.json())
        cursor = pages[-1]["next_cursor"]
        if cursor is None:
            return pages


@pytest.mark.parametrize(
    ("filters", "field", "role", "kept"),
    [
        ({}, "content", None, range(7)),
        ({}, "content", "system", range(7)),
        ({}, "tool_calls", None, range(7)),
        ({}, "reasoning_content", None, range(7)),
        ({"run_step": 0}, "content", None, (0, 2, 4, 6)),
        ({"reward_min": 0.15, "reward_max": 0.45}, "content", None, (2, 3, 4)),
        ({"has_error": "true"}, "content", None, (4,)),
        ({"has_error": "false"}, "content", None, (0, 1, 2, 3, 5, 6)),
    ],
)
def test_search_pages_follow_the_cursor_and_cover_the_filtered_traces(
    platform: LocalPlatform,
    filters: dict[str, Any],
    field: str,
    role: str | None,
    kept: Iterable[int],
) -> None:
    """Pinned answers of a run's search: each page of every size in trace
    order (oldest first) then node order, a cursor until the last match
    (none after a page ending exactly on it), ``coverage`` on the first page
    only, counting every trace the filters keep, matches or not."""
    run_id = "run-pages"
    docs = _search_run_docs(run_id)
    if not httpx.get(f"{platform.url}/api/v1/traces/{run_id}-t0", timeout=10).is_success:
        older = json.loads(json.dumps(docs[6]))
        older["nodes"] = [_node("user", f"{_NEEDLE} in the older copy only")] * 3
        assert post_upload(platform.url, jsonl([older])).status_code == 201
        # Uploaded newest first: the order is the traces' own time, not the upload's.
        assert post_upload(platform.url, jsonl(docs[::-1])).status_code == 201
    kept_docs = [docs[i] for i in kept]
    expected = _expected(kept_docs, {f"{run_id}-t6": 2}, field, role)
    params: dict[str, Any] = {"query": _NEEDLE, "field": field, **filters}
    if role is not None:
        params["role"] = role
    whole = _pages(platform.url, run_id, {**params, "limit": 100})
    assert len(whole) == 1 and [_row(m) for m in whole[0]["items"]] == expected
    assert whole[0]["coverage"] == {
        "examined_traces": len(kept_docs),
        "unindexed_trace_ids": [],
        "partial_index": False,
    }
    for limit in (1, 2, 3, len(expected) or 1):
        pages = _pages(platform.url, run_id, {**params, "limit": limit})
        assert [m for p in pages for m in p["items"]] == whole[0]["items"], limit
        assert len(pages) == max(1, -(-len(expected) // limit)), limit
        assert all(len(p["items"]) == limit for p in pages[:-1])
        assert pages[0]["coverage"] == whole[0]["coverage"]
        assert all("coverage" not in p for p in pages[1:])


def test_search_cursors_are_bound_to_their_filters_and_pages_past_the_end_are_empty(
    platform: LocalPlatform,
) -> None:
    run_id = "run-cursor"
    assert post_upload(platform.url, jsonl(_search_run_docs(run_id))).status_code == 201
    url = f"{platform.url}/api/v1/runs/{run_id}/search"
    first = httpx.get(url, params={"query": _NEEDLE, "limit": 2}, timeout=10).json()
    cursor = first["next_cursor"]
    assert cursor is not None
    other = httpx.get(url, params={"query": _NEEDLE, "role": "user", "cursor": cursor}, timeout=10)
    assert other.status_code == 400 and other.json()["error"]["code"] == "invalid_cursor"
    nothing = httpx.get(url, params={"query": "no such needle", "limit": 1}, timeout=10)
    assert nothing.json() == {
        "items": [],
        "next_cursor": None,
        "coverage": {"examined_traces": 7, "unindexed_trace_ids": [], "partial_index": False},
    }
    # A cursor past the last match (the run's traces deleted since): an empty
    # last page, without coverage (not the first page).
    assert (
        httpx.delete(f"{platform.url}/api/v1/traces?run_id={run_id}", timeout=10).status_code == 202
    )
    gone = httpx.get(url, params={"query": _NEEDLE, "limit": 2, "cursor": cursor}, timeout=10)
    assert gone.status_code == 200 and gone.json() == {"items": [], "next_cursor": None}
    empty = httpx.get(f"{platform.url}/api/v1/runs/no-such-run/search?query=abc", timeout=10)
    assert empty.json()["coverage"]["examined_traces"] == 0 and empty.json()["items"] == []


def _in_process(
    data_dir: Path,
    docs: list[dict[str, Any]],
    ask: Callable[[httpx.AsyncClient], Awaitable[list[dict[str, Any]]]],
) -> list[dict[str, Any]]:
    """``ask`` an app served in this process (so that a test can watch what
    it does) once ``docs`` are uploaded to it."""
    app = build_app(ServerSettings(data_dir=data_dir))

    async def scenario() -> list[dict[str, Any]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://local") as c:
            headers, files = upload_parts(jsonl(docs))
            r = await c.post("/api/v1/traces", headers=headers, files=files)
            assert r.status_code == 201, r.text
            return await ask(c)

    try:
        return asyncio.run(scenario())
    finally:
        app.state.ctx.db.close()


async def _search(c: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    r = await c.get("/api/v1/runs/run-big/search", params={"query": _NEEDLE, **params})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _big_run(n: int, content: str) -> list[dict[str, Any]]:
    """``n`` traces of run ``run-big``, oldest first, one matching node each."""
    t0 = time.time() - 3600
    docs = []
    for i in range(n):
        doc = trace("run-big", trace_id=f"big-{i}", start=t0 + i)
        doc["nodes"] = [_node("user", f"{_NEEDLE} {i} {content}")]
        docs.append(doc)
    return docs


def test_a_search_page_parses_only_the_traces_it_shows_and_one_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Page 1 of a run of 300 traces with a match each, 10 to a page: 11
    traces parsed (the 11th tells whether there is a next page), not 300;
    every page after it 11 too, however deep (its cursor says where the
    page before ended: it parsed every trace before it). The coverage
    still counts every trace of the run."""
    parsed: list[int] = []
    parse = traces_index._parse_trace

    def counting(raw: bytes) -> dict[str, Any]:
        parsed.append(1)
        return parse(raw)

    monkeypatch.setattr(traces_index, "_parse_trace", counting)

    async def ask(c: httpx.AsyncClient) -> list[dict[str, Any]]:
        pages = [await _search(c, limit=10)]
        counts = [len(parsed)]
        for _ in range(20):
            pages.append(await _search(c, limit=10, cursor=pages[-1]["next_cursor"]))
            counts.append(len(parsed) - sum(counts))
        return [*pages[:2], {"counts": counts, "last": pages[-1]}]

    first, second, work = _in_process(tmp_path, _big_run(300, ""), ask)
    assert work["counts"] == [11] * 21
    assert [m["trace_id"] for m in first["items"]] == [f"big-{i}" for i in range(10)]
    assert [m["trace_id"] for m in second["items"]] == [f"big-{i}" for i in range(10, 20)]
    assert [m["trace_id"] for m in work["last"]["items"]] == [f"big-{i}" for i in range(200, 210)]
    assert first["coverage"]["examined_traces"] == 300
    assert first["next_cursor"] is not None and second["next_cursor"] is not None


def test_a_search_page_holds_no_more_than_a_few_traces_in_memory(tmp_path: Path) -> None:
    """Page 1 (one match) of a run of 48 traces of 128 KB: what Python holds
    at its peak while answering is a few traces' worth, not the run's 6 MB
    (every document was read at once, and parsed, for any page)."""
    size = 128 * 1024

    async def ask(c: httpx.AsyncClient) -> list[dict[str, Any]]:
        tracemalloc.start()
        try:
            page = await _search(c, limit=1)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        return [page, {"peak": peak}]

    page, measured = _in_process(tmp_path, _big_run(48, "x" * size), ask)
    assert [m["trace_id"] for m in page["items"]] == ["big-0"]
    assert page["coverage"]["examined_traces"] == 48 and page["next_cursor"] is not None
    assert measured["peak"] < 8 * size, measured


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


def test_a_crafted_cursor_position_is_refused_not_a_server_error(tmp_path: Path) -> None:
    """A cursor is the client's to send back: one whose position (``at``)
    says a row or a time no trace can have (an integer past SQLite's, past
    a float's, not a number) is an invalid cursor (400), never a 500."""

    async def ask(c: httpx.AsyncClient) -> list[dict[str, Any]]:
        first = await _search(c, limit=2)
        token = json.loads(base64.urlsafe_b64decode(first["next_cursor"]))
        answers = []
        for at in ([0, 10**30, 0], [10**400, 1, 0], [0, -(10**30), 0], ["NaN", 1, 0]):
            crafted = json.dumps({**token, "at": at}).encode()
            cursor = base64.urlsafe_b64encode(crafted).decode()
            r = await c.get(
                "/api/v1/runs/run-big/search",
                params={"query": _NEEDLE, "limit": 2, "cursor": cursor},
            )
            answers.append({"at": repr(at)[:20], "status": r.status_code, "body": r.json()})
        return answers

    for answer in _in_process(tmp_path, _big_run(6, ""), ask):
        assert answer["status"] == 400, answer
        assert answer["body"]["error"]["code"] == "invalid_cursor", answer
