"""Prime Traces' node and call index, run search and deletes.

The service builds a node/call index of each trace asynchronously; this
emulator reads the stored document instead, so every trace is indexed at
once (never 409 ``trace_not_indexed``, never ``partial_index``). How a
node maps to its row is not known from the service's clients; the choices,
as a user of a verifiers trace would expect:

- a node's ``node_idx`` is its position in the trace's ``nodes``;
  ``parent_idx`` its first ``semantic_parents`` entry (None for a root);
- a call's ``call_idx`` is its position in ``calls``, ``node_idx`` its
  ``node``, ``time_start``/``time_end`` its ``time.start``/``time.end``;
- search scans the newest copy of each trace of the run, node by node, and
  answers one match per node: the first case-sensitive occurrence of the
  query in the field, taken as text when it is a string and as its compact
  JSON otherwise (``representation``), with offsets in code points and an
  excerpt of up to 40 code points either side. ``generation`` counts the
  copies stored under the trace id (1 for the first upload). A page reads
  and parses documents one at a time, oldest trace first, and stops at the
  first match past the page (which tells whether there is a next one);
  ``coverage.examined_traces`` counts the traces the filters keep without
  reading any document.

Deletes remove every stored copy of a trace, or every trace of a run, and
leave episode rows alone.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .context import check_traces_auth, context_of
from .errors import TracesError, rejected
from .storable import FiniteJSONResponse as JSONResponse
from .traces_extract import as_list, as_object, number
from .traces_reads import FINITE_REWARD, LATEST_TRACES, Query, newest_trace

_SEARCH_FIELDS = ("content", "reasoning_content", "tool_calls")
_EXCERPT = 40
_MIN_QUERY = 3


def _parse_trace(raw: bytes) -> dict[str, Any]:
    """A stored trace document; ``{}`` (no nodes, no calls) when it is not
    a JSON object: what was stored is shown as far as it can be, never a 500."""
    try:
        return as_object(json.loads(raw))
    except ValueError:
        return {}


async def _document(request: Request, trace_id: str) -> dict[str, Any]:
    """The newest stored copy of a trace, parsed; 404 ``trace_not_found``."""
    row = await newest_trace(request, trace_id, "raw")
    return _parse_trace(bytes(row["raw"]))


def _node(index: int, node: Any) -> dict[str, Any]:
    node = as_object(node)
    message = as_object(node.get("message"))
    parents = [p for p in as_list(node.get("semantic_parents")) if isinstance(p, int)]
    shown: dict[str, Any] = {"role": message.get("role"), "content": message.get("content")}
    for key in ("reasoning_content", "tool_calls", "tool_call_id", "name", "tool_name"):
        if message.get(key) is not None:
            shown[key] = message[key]
    return {
        "node_idx": index,
        "parent_idx": parents[0] if parents else None,
        "timestamp": number(node.get("timestamp")),
        "sampled": bool(node.get("sampled")),
        "message": shown,
    }


def _call(index: int, call: Any) -> dict[str, Any]:
    call = as_object(call)
    timing = as_object(call.get("time"))
    node = call.get("node")
    return {
        "call_idx": index,
        "node_idx": node if isinstance(node, int) and not isinstance(node, bool) else None,
        "time_start": number(timing.get("start")),
        "time_end": number(timing.get("end")),
        "model": call.get("model") if isinstance(call.get("model"), str) else None,
        "endpoint": call.get("endpoint") if isinstance(call.get("endpoint"), str) else None,
        "finish_reason": call.get("finish_reason")
        if isinstance(call.get("finish_reason"), str)
        else None,
    }


def _page(
    request: Request,
    items: list[dict[str, Any]],
    keep: Callable[[dict[str, Any]], bool],
    *,
    after: int | None = None,
) -> JSONResponse:
    q = Query(request)
    offset, limit = q.page()
    if after is not None:
        if request.query_params.get("cursor") is not None:
            raise rejected("invalid_filter", "after cannot be combined with cursor")
        items = [i for i in items if i["node_idx"] > after]
    chosen = [i for i in items if keep(i)]
    return JSONResponse(
        {
            "items": chosen[offset : offset + limit],
            "next_cursor": q.next_cursor(offset, limit, len(chosen)),
            "partial_index": False,
        }
    )


async def list_nodes(request: Request) -> Response:
    check_traces_auth(request)
    doc = await _document(request, request.path_params["trace_id"])
    nodes = [_node(i, n) for i, n in enumerate(as_list(doc.get("nodes")))]
    roles = set(request.query_params.getlist("role"))
    sampled = Query(request).flag("sampled")
    after_text = request.query_params.get("after")
    try:
        after = None if after_text is None else int(after_text)
    except ValueError:
        raise rejected("invalid_filter", "after must be an integer") from None

    def keep(node: dict[str, Any]) -> bool:
        return (not roles or node["message"]["role"] in roles) and (
            sampled is None or node["sampled"] == sampled
        )

    return _page(request, nodes, keep, after=after)


async def list_calls(request: Request) -> Response:
    check_traces_auth(request)
    doc = await _document(request, request.path_params["trace_id"])
    calls = [_call(i, c) for i, c in enumerate(as_list(doc.get("calls")))]
    models = set(request.query_params.getlist("model"))
    reasons = set(request.query_params.getlist("finish_reason"))

    def keep(call: dict[str, Any]) -> bool:
        return (not models or call["model"] in models) and (
            not reasons or call["finish_reason"] in reasons
        )

    return _page(request, calls, keep)


def _representation(value: Any) -> tuple[str, str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value, "text"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")), "json"


def _matches(
    doc: dict[str, Any], query: str, field: str, role: str | None
) -> Iterator[dict[str, Any]]:
    """The matches of one trace, node by node (without the trace's own
    fields): lazily, so that a page ending inside a long trace stops there."""
    for index, node in enumerate(as_list(doc.get("nodes"))):
        message = as_object(as_object(node).get("message"))
        if role is not None and message.get("role") != role:
            continue
        shown = _representation(message.get(field))
        if shown is None:
            continue
        text, representation = shown
        start = text.find(query)
        if start < 0:
            continue
        end = start + len(query)
        excerpt_start = max(0, start - _EXCERPT)
        yield {
            "node_idx": index,
            "role": message.get("role"),
            "field": field,
            "representation": representation,
            "match_start": start,
            "match_end": end,
            "excerpt": text[excerpt_start : end + _EXCERPT],
            "excerpt_start": excerpt_start,
        }


def _search_page(
    conn: sqlite3.Connection,
    where: str,
    args: tuple[Any, ...],
    match: Callable[[dict[str, Any]], Iterator[dict[str, Any]]],
    offset: int,
    limit: int,
    at: tuple[float, int, int] | None = None,
) -> tuple[list[dict[str, Any]], int, tuple[float, int, int] | None]:
    """The matches ``offset`` to ``offset + limit`` of the traces ``where``
    keeps (oldest first), how many matches were counted (all of them, or
    ``offset + limit + 1`` when there are more: enough for ``next_cursor``),
    and where the next page begins (the trace of its first match, and how
    many of that trace's matches come before it).

    The listing reads no document: sorting it with each trace's ``raw`` would
    read every document of the run before the first row, whichever page is
    asked. Each document is then read by its row and parsed only when the
    page still needs matches, so a page holds one document at a time. With
    ``at`` (the previous page's end) the listing begins there: a deep page
    parses what it shows (and one trace more), not every trace before it."""
    page: list[dict[str, Any]] = []
    counted = 0
    resumed_row, skip = -1, 0
    if at is not None:
        created, resumed_row, skip = at
        where = f"({where}) AND (created_at > ? OR (created_at = ? AND row >= ?))"
        args = (*args, created, created, resumed_row)
        counted = offset  # (the matches before ``at``: the earlier pages')
    listing = conn.execute(
        f"SELECT row, created_at, trace_id, upload_id, episode_id FROM traces WHERE {where}"
        " ORDER BY created_at ASC, row ASC",
        args,
    )
    try:
        for trace in listing:
            (raw,) = conn.execute(
                "SELECT raw FROM traces WHERE row = ?", (trace["row"],)
            ).fetchone()
            generation: int | None = None
            # (a trace gone since, or no longer the latest copy: none skipped)
            shown_before = skip if trace["row"] == resumed_row else 0
            for index, found in enumerate(match(_parse_trace(bytes(raw)))):
                if index < shown_before:
                    continue  # shown by the page before, within this trace
                counted += 1
                if counted <= offset:
                    continue
                if counted > offset + limit:
                    return page, counted, (float(trace["created_at"]), int(trace["row"]), index)
                if generation is None:  # looked up (index traces_id) for shown traces only
                    generation = int(
                        conn.execute(
                            "SELECT count(*) FROM traces WHERE trace_id = ?", (trace["trace_id"],)
                        ).fetchone()[0]
                    )
                page.append(
                    {
                        "trace_id": trace["trace_id"],
                        "upload_id": trace["upload_id"],
                        "generation": generation,
                        "episode_id": trace["episode_id"],
                        **found,
                    }
                )
    finally:
        # Left unfinished, the statement would hold its read transaction open
        # (and keep WAL checkpoints from completing) until garbage-collected.
        listing.close()
    return page, counted, None


async def search_run(request: Request) -> Response:
    check_traces_auth(request)
    run_id = request.path_params["run_id"]
    params = request.query_params
    query = params.get("query") or ""
    if len(query) < _MIN_QUERY:
        raise rejected("invalid_filter", f"query needs at least {_MIN_QUERY} characters")
    field = params.get("field", "content")
    if field not in _SEARCH_FIELDS:
        raise rejected("invalid_filter", f"field must be one of {', '.join(_SEARCH_FIELDS)}")
    role = params.get("role")
    q = Query(request)
    q.add("run_id = ?", run_id)
    q.number("run_step", "step = ?", int)
    q.number("reward_min", f"reward >= ? AND {FINITE_REWARD}")
    q.number("reward_max", f"reward <= ? AND {FINITE_REWARD}")
    q.boolean("has_error", "has_error")
    offset, limit = q.page()
    at = q.resume_at()
    where = f"{LATEST_TRACES} AND {q.sql()}"
    args = tuple(q.args)

    def match(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return _matches(doc, query, field, role)

    def read(
        conn: sqlite3.Connection,
    ) -> tuple[list[dict[str, Any]], int, tuple[float, int, int] | None, int | None]:
        # Documents are parsed here, in the database's thread, one at a time
        # as they are read, rather than all of them on the event loop: the
        # connection is held for what the page needs (up to every document
        # of the run for a rare query).
        page, counted, next_at = _search_page(conn, where, args, match, offset, limit, at)
        examined = None
        if offset == 0:  # coverage is only on the first page
            examined = conn.execute(f"SELECT count(*) FROM traces WHERE {where}", args).fetchone()
        return page, counted, next_at, None if examined is None else int(examined[0])

    page, counted, next_at, examined = await context_of(request).db.read(read)
    body: dict[str, Any] = {
        "items": page,
        "next_cursor": q.next_cursor(offset, limit, counted, next_at),
    }
    if examined is not None:
        body["coverage"] = {
            "examined_traces": examined,
            "unindexed_trace_ids": [],
            "partial_index": False,
        }
    return JSONResponse(body)


async def delete_trace(request: Request) -> Response:
    check_traces_auth(request)
    trace_id = request.path_params["trace_id"]
    # ``created_at``: a pruning hint; one that matches no stored copy is a 404,
    # even when the trace exists under another timestamp.
    hint = Query(request)
    hint.add("trace_id = ?", trace_id)
    hint.time("created_at", "abs(created_at - ?) < 0.001")

    def delete(conn: sqlite3.Connection) -> int:
        if not conn.execute(f"SELECT 1 FROM traces WHERE {hint.sql()}", hint.args).fetchone():
            return 0
        return conn.execute("DELETE FROM traces WHERE trace_id = ?", (trace_id,)).rowcount

    if not await context_of(request).db.write(delete):
        raise TracesError(404, "trace_not_found", f"trace {trace_id!r} not found")
    return Response(status_code=202)


async def delete_run_traces(request: Request) -> Response:
    check_traces_auth(request)
    run_id = request.query_params.get("run_id")
    if not run_id:
        raise rejected("invalid_filter", "run_id is required to delete traces")

    def delete(conn: sqlite3.Connection) -> int:
        return conn.execute("DELETE FROM traces WHERE run_id = ?", (run_id,)).rowcount

    if not await context_of(request).db.write(delete):
        raise TracesError(404, "run_not_found", f"run {run_id!r} has no traces")
    return Response(status_code=202)


routes = [
    Route("/api/v1/traces", delete_run_traces, methods=["DELETE"]),
    Route("/api/v1/traces/{trace_id}", delete_trace, methods=["DELETE"]),
    Route("/api/v1/traces/{trace_id}/nodes", list_nodes, methods=["GET"]),
    Route("/api/v1/traces/{trace_id}/calls", list_calls, methods=["GET"]),
    Route("/api/v1/runs/{run_id}/search", search_run, methods=["GET"]),
]
