"""``POST /api/v1/traces``: the content-addressed upload (what the SDK relies on is
in docs/ARCHITECTURE.md, "The wire").

The upload id *is* the digest, so committing is keyed on it: a second request
with the same key and line format stores nothing and gets the committed
receipt back, byte for byte (this emulator's choice: the first commit answers
201, a replay 200). The same key under the other line format is 409
``line_format_conflict``. Each committed upload's episode and trace rows are
stored as rows, so a record that reached the server in two *different*
uploads shows up twice (``rows > distinct`` in ``/_local/runs/{id}``).
"""

from __future__ import annotations

import operator
import sqlite3
import time
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .context import check_traces_auth, context_of, dumps, read_capped
from .errors import TracesError, rejected
from .traces_ingest import MAX_REQUEST_BYTES, Upload, parse_key, stage_rows, verify_request

_TRACE_COLUMNS = [
    *("trace_id", "upload_id", "episode_id", "run_id", "run_type", "run_name", "step"),
    *("environment_id", "model_id", "model_provider", "task_id", "agent_name", "reward"),
    *("outcome", "has_error", "is_truncated", "duration_ms", "total_tokens", "size_bytes"),
    *("created_at", "ingested_at", "context", "raw"),
]
_EPISODE_COLUMNS = [
    *("episode_id", "upload_id", "run_id", "run_type", "run_name", "environment_id"),
    *("outcome", "has_error", "error_type", "error_message", "schema_version"),
    *("created_at", "ingested_at", "raw"),
]


def _insert(
    conn: sqlite3.Connection, table: str, columns: list[str], rows: list[dict[str, Any]]
) -> None:
    """``rows`` (each a mapping holding every column) inserted in one
    statement, each row's values picked in C (``itemgetter``): a dict copy
    and a generator a row cost ~10 µs of an episode's ~120."""
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    conn.executemany(sql, map(operator.itemgetter(*columns), rows))


def replay(conn: sqlite3.Connection, upload: Upload) -> tuple[int, bytes] | None:
    """(200, stored receipt) for a committed key, 409 for another format, else None."""
    existing = conn.execute(
        "SELECT line_format, receipt FROM uploads WHERE upload_id = ?", (upload.upload_id,)
    ).fetchone()
    if existing is not None:
        if existing["line_format"] != upload.line_format:
            raise TracesError(
                409,
                "line_format_conflict",
                f"upload {upload.upload_id} was committed with line format "
                f"{existing['line_format']!r}",
            )
        conn.execute(
            "UPDATE uploads SET replays = replays + 1 WHERE upload_id = ?", (upload.upload_id,)
        )
        return 200, str(existing["receipt"]).encode()
    return None


def commit(conn: sqlite3.Connection, upload: Upload, ingested_at: float) -> tuple[int, bytes]:
    """Store ``upload`` once (a concurrent twin committed first: replay it). (status, body)."""
    answer = replay(conn, upload)
    if answer is not None:
        return answer
    receipt = {
        "upload_id": upload.upload_id,
        "status": "committed",
        "line_format": upload.line_format,
        "lines": upload.lines,
        "episodes": len(upload.episodes),
        "traces": len(upload.traces),
    }
    body = dumps(receipt)
    conn.execute(
        "INSERT INTO uploads (upload_id, line_format, receipt, context, schema_version,"
        " ingested_at) VALUES (?, ?, ?, ?, ?, ?)",
        (
            upload.upload_id,
            upload.line_format,
            body,
            dumps(upload.context),
            upload.schema_version,
            ingested_at,
        ),
    )
    context = dumps(upload.context)
    # The staged rows are this request's own: completed in place.
    for trace in upload.traces:
        trace["upload_id"] = upload.upload_id
        trace["context"] = context
    for episode in upload.episodes:
        episode["upload_id"] = upload.upload_id
    _insert(conn, "traces", _TRACE_COLUMNS, upload.traces)
    _insert(conn, "episodes", _EPISODE_COLUMNS, upload.episodes)
    return 201, body.encode()


async def upload_traces(request: Request) -> Response:
    check_traces_auth(request)
    # The key is checked before the body is read: a malformed one needs no upload.
    parse_key(request.headers.get("idempotency-key"))
    body = await read_capped(request, MAX_REQUEST_BYTES)
    if body is None:
        raise rejected("upload_too_large", f"request is over {MAX_REQUEST_BYTES} bytes")
    ctx = context_of(request)
    stamp = time.time()

    def verify() -> Upload:
        return verify_request(
            content_type=request.headers.get("content-type", ""),
            body=body,
            key_header=request.headers.get("idempotency-key"),
            format_header=request.headers.get("x-prime-line-format"),
        )

    upload = await anyio.to_thread.run_sync(verify)
    # A replay, or the same key under the other format, is answered from the key.
    answer = await ctx.db.write(lambda conn: replay(conn, upload))
    if answer is None:
        await anyio.to_thread.run_sync(stage_rows, upload, stamp)
        answer = await ctx.db.write(lambda conn: commit(conn, upload, stamp))
    status, receipt = answer
    return Response(receipt, status_code=status, media_type="application/json")


routes = [Route("/api/v1/traces", upload_traces, methods=["POST"])]
