"""Evaluations API and its v0 sample table (the calls the SDK makes are in
docs/ARCHITECTURE.md, "The wire").

Decisions where the platform's behaviour is not known from its clients:

- A created evaluation starts ``RUNNING``. ``finalize`` moves it to
  ``COMPLETED`` and stores the given metrics; repeating it on a ``COMPLETED``
  evaluation is a 200 (nothing changes), on ``FAILED``/``CANCELLED`` a 409.
- The status guard: a ``PUT`` carrying ``status`` on a terminal evaluation is
  rejected whole with 409. ``status`` may only be ``FAILED`` or ``CANCELLED``
  (422 otherwise). A metadata/metrics-only ``PUT`` is accepted in any status,
  so a run's config and summary land even after it was closed.
- ``metadata`` and ``metrics`` in a ``PUT`` replace the stored documents whole
  (the SDK always sends the whole config and summary); ``finalize`` metrics
  are merged over the stored summary.
- Sample rows are append-only, as on the platform: a pushed row stored twice is
  two rows, which ``/_local/runs/{id}`` shows as ``rows > distinct``.
- Read-back keys are snake_case with ``hasMore`` on the samples page.
- ``error_message`` is capped at 4096 characters (422 above), like the server.
- A push holds at most ``MAX_SAMPLES_PER_PUSH`` (100,000) samples (413
  above, nothing stored): a row costs the same work however small it is.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from . import storable, typed_fields
from .context import (
    check_platform_auth,
    context_of,
    dumps,
    json_body,
    listed_json_body,
    new_id,
    now,
    optional_object,
    require_str,
)
from .dashboard import stored_rows
from .errors import PlatformError
from .queries import query_int, row_offset
from .typed_fields import BOOL, STR, shown, shown_environments

#: A create's fields the contract types (§2.2; prime-evals' extra ones),
#: besides those checked apart (name, environments, team_id, tags, the two objects).
_CREATE_TYPES = {
    "model_name": STR,
    "dataset": STR,
    "framework": STR,
    "description": STR,
    "task_type": STR,
    "run_id": STR,
    "suite_id": STR,
    "is_public": BOOL,
}
#: An update's, as prime-evals sends them (§2.3), besides its checked ones.
_UPDATE_TYPES = {
    "name": STR,
    "model_name": STR,
    "dataset": STR,
    "framework": STR,
    "task_type": STR,
    "description": STR,
}

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
MAX_ERROR_MESSAGE = 4096
#: Rows one push may hold. Each stored row costs ~25 us of CPU and a few KB
#: whatever its size, so 26 MiB of ``{}`` samples (9 million rows) cost
#: minutes and tens of GB. The SDK's smallest row is over 300 bytes and its
#: pushes are under 25 MiB: under 80,000 rows, so none of them is refused.
MAX_SAMPLES_PER_PUSH = 100_000


def evaluation_view(row: sqlite3.Row) -> dict[str, Any]:
    # storable.loads: NaN an earlier version stored reads as null, not a 500;
    # shown: a field it stored with another type than the contract's, as null.
    request = storable.loads(row["request"])
    envs = shown_environments(request.get("environments"))
    dataset = shown(request.get("dataset"), STR)
    tags = request.get("tags")
    return {
        "evaluation_id": row["id"],
        "id": row["id"],
        "name": row["name"],
        "status": row["status"],
        "error_message": row["error_message"],
        "metadata": storable.loads(row["metadata"]),
        "metrics": storable.loads(row["metrics"]),
        "model_name": shown(request.get("model_name"), STR),
        "dataset": dataset,
        "framework": shown(request.get("framework"), STR),
        "description": shown(request.get("description"), STR),
        "tags": [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else [],
        "team_id": row["team_id"],
        "environment_ids": [e["id"] for e in envs],
        "environment_names": [dataset] if dataset else [],
        "is_hosted": False,
        "total_samples": row["sample_count"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "finalized_at": row["finalized_at"],
    }


def _get_row(conn: sqlite3.Connection, eval_id: str) -> sqlite3.Row:
    row: sqlite3.Row | None = conn.execute(
        "SELECT * FROM evaluations WHERE id = ?", (eval_id,)
    ).fetchone()
    if row is None:
        raise PlatformError(404, f"Evaluation {eval_id} not found")
    return row


async def create_evaluation(request: Request) -> JSONResponse:
    check_platform_auth(request)
    body = await json_body(request)
    name = require_str(body, "name", optional=True)
    envs = typed_fields.check_environments(body)
    typed_fields.check(body, _CREATE_TYPES)
    if not envs and not body.get("run_id"):
        raise PlatformError(422, "Either environments or run_id must be given")
    team = body.get("team_id")
    if team is not None and not isinstance(team, str):
        # Bound as it is: SQLite takes no list or object, nor an integer past 64 bits.
        raise PlatformError(422, "Field 'team_id' must be a string")
    tags = body.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise PlatformError(422, "tags must be a list of strings")
    metadata = optional_object(body, "metadata") or {}
    metrics = optional_object(body, "metrics") or {}
    eval_id = new_id("eval_")
    name = name or eval_id
    stamp = now()

    def insert(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO evaluations (id, name, status, request, metadata, metrics, team_id,"
            " created_at, updated_at) VALUES (?, ?, 'RUNNING', ?, ?, ?, ?, ?, ?)",
            (
                eval_id,
                name,
                dumps(body),
                dumps(metadata),
                dumps(metrics),
                team,
                stamp,
                stamp,
            ),
        )

    await context_of(request).db.write(insert)
    origin = str(request.base_url).rstrip("/")
    return JSONResponse(
        {
            "evaluation_id": eval_id,
            "name": name,
            "status": "RUNNING",
            "viewer_url": f"{origin}/dashboard/evaluations/{eval_id}",
        },
        status_code=201,
    )


async def list_evaluations(request: Request) -> JSONResponse:
    check_platform_auth(request)
    skip = query_int(request, "skip", 0)
    limit = query_int(request, "limit", 50)
    assert skip is not None and limit is not None
    if skip < 0 or not 1 <= limit <= 1000:
        raise PlatformError(422, "skip must be >= 0 and limit within [1, 1000]")
    team = request.query_params.get("team_id")
    env_name = request.query_params.get("environment_name")

    def read(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], int]:
        rows = conn.execute("SELECT * FROM evaluations ORDER BY created_at DESC, id").fetchall()
        views = [evaluation_view(r) for r in rows]
        if team is not None:
            views = [v for v in views if v["team_id"] == team]
        if env_name is not None:
            views = [v for v in views if env_name in v["environment_names"]]
        return views[skip : skip + limit], len(views)

    items, total = await context_of(request).db.read(read)
    return JSONResponse({"evaluations": items, "total": total, "skip": skip, "limit": limit})


async def get_evaluation(request: Request) -> JSONResponse:
    check_platform_auth(request)
    eval_id = request.path_params["eval_id"]

    def read(conn: sqlite3.Connection) -> dict[str, Any]:
        return evaluation_view(_get_row(conn, eval_id))

    return JSONResponse(await context_of(request).db.read(read))


async def update_evaluation(request: Request) -> JSONResponse:
    check_platform_auth(request)
    eval_id = request.path_params["eval_id"]
    body = await json_body(request)
    status = body.get("status")
    if status is not None and status not in ("FAILED", "CANCELLED"):
        raise PlatformError(422, "status may only be FAILED or CANCELLED (COMPLETED: finalize)")
    error_message = body.get("error_message")
    if error_message is not None and (
        not isinstance(error_message, str) or len(error_message) > MAX_ERROR_MESSAGE
    ):
        raise PlatformError(422, f"error_message must be a string of <= {MAX_ERROR_MESSAGE} chars")
    metadata = optional_object(body, "metadata")
    metrics = optional_object(body, "metrics")
    # The platform's model refuses a field of another type; what this one
    # does not store (all but the name) is refused alike, not taken silently.
    typed_fields.check(body, _UPDATE_TYPES)
    tags = body.get("tags")
    if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        raise PlatformError(422, "Field 'tags' must be a list of strings")
    simple = {k: body[k] for k in ("name",) if isinstance(body.get(k), str)}

    def update(conn: sqlite3.Connection) -> dict[str, Any]:
        row = _get_row(conn, eval_id)
        if status is not None and row["status"] in TERMINAL:
            raise PlatformError(409, f"Evaluation {eval_id} is already {row['status']}")
        sets: dict[str, Any] = {"updated_at": now(), **simple}
        if metadata is not None:
            sets["metadata"] = dumps(metadata)
        if metrics is not None:
            sets["metrics"] = dumps(metrics)
        if status is not None:
            sets["status"] = status
            sets["error_message"] = error_message
        assignments = ", ".join(f"{k} = ?" for k in sets)
        conn.execute(
            f"UPDATE evaluations SET {assignments} WHERE id = ?", (*sets.values(), eval_id)
        )
        return evaluation_view(_get_row(conn, eval_id))

    return JSONResponse(await context_of(request).db.write(update))


async def finalize_evaluation(request: Request) -> JSONResponse:
    check_platform_auth(request)
    eval_id = request.path_params["eval_id"]
    body = await json_body(request)
    metrics = optional_object(body, "metrics") or {}

    def finalize(conn: sqlite3.Connection) -> dict[str, Any]:
        row = _get_row(conn, eval_id)
        if row["status"] == "COMPLETED":
            return {"evaluation_id": eval_id, "status": "COMPLETED"}
        if row["status"] in TERMINAL:
            raise PlatformError(409, f"Evaluation {eval_id} is already {row['status']}")
        merged = {**storable.loads(row["metrics"]), **metrics}
        stamp = now()
        conn.execute(
            "UPDATE evaluations SET status = 'COMPLETED', metrics = ?, finalized_at = ?,"
            " updated_at = ? WHERE id = ?",
            (dumps(merged), stamp, stamp, eval_id),
        )
        return {"evaluation_id": eval_id, "status": "COMPLETED"}

    return JSONResponse(await context_of(request).db.write(finalize))


async def push_samples(request: Request) -> JSONResponse:
    check_platform_auth(request)
    eval_id = request.path_params["eval_id"]
    # Each sample's stored text comes from the body's nesting check, which
    # writes each apart: a sample is written once, not twice.
    body, by_orjson, texts = await listed_json_body(request, "samples", most=MAX_SAMPLES_PER_PUSH)
    samples = body.get("samples")
    if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
        raise PlatformError(422, "samples must be a list of objects")
    if len(samples) > MAX_SAMPLES_PER_PUSH:
        # Before any row is made: what a row costs does not shrink with it.
        raise PlatformError(
            413, f"A push holds at most {MAX_SAMPLES_PER_PUSH} samples, not {len(samples)}"
        )
    if texts is None:  # json.loads read the body: json.dumps writes what orjson cannot
        try:
            texts = [storable.text(s, by_orjson=by_orjson) for s in samples]
        except storable.Unstorable as exc:  # before any row is stored
            raise PlatformError(422, f"Body is not valid JSON: {exc}") from None
    rows = [
        (eval_id, None if s.get("sample_id") is None else str(s["sample_id"]), text)
        for s, text in zip(samples, texts, strict=True)
    ]

    def append(conn: sqlite3.Connection) -> int:
        _get_row(conn, eval_id)  # an evaluation that is not there: 404, no row made
        stored: list[tuple[int, Any]] = []
        for row, sample in zip(rows, samples, strict=True):
            # TEXT made of the UTF-8 bytes as they are: a str would be decoded
            # here and encoded back by sqlite3 (half the insert's time).
            cursor = conn.execute(
                "INSERT INTO eval_samples (eval_id, sample_id, body)"
                " VALUES (?, ?, CAST(? AS TEXT))",
                row,
            )
            assert cursor.lastrowid is not None  # an INSERT into a rowid table
            stored.append((cursor.lastrowid, sample))
        # The dashboard's row of each, while the sample is parsed (stored_rows.py).
        stored_rows.store(conn, eval_id, stored)
        # Counted by the table's trigger, in this transaction (storage.py): a
        # count over the table made each push cost more the bigger the
        # evaluation already was.
        total: int = _get_row(conn, eval_id)["sample_count"]
        return total

    total = await context_of(request).db.write(append)
    return JSONResponse({"evaluation_id": eval_id, "inserted": len(rows), "total": total})


async def read_samples(request: Request) -> JSONResponse:
    check_platform_auth(request)
    eval_id = request.path_params["eval_id"]
    page = query_int(request, "page", 1)
    limit = query_int(request, "limit", 100)
    assert page is not None and limit is not None
    if page < 1 or not 1 <= limit <= 1000:
        raise PlatformError(422, "page must be >= 1 and limit within [1, 1000]")
    offset = row_offset(page, limit)

    def read(conn: sqlite3.Connection) -> tuple[list[Any], int]:
        total: int = _get_row(conn, eval_id)["sample_count"]
        rows = conn.execute(
            "SELECT body FROM eval_samples WHERE eval_id = ? ORDER BY row LIMIT ? OFFSET ?",
            (eval_id, limit, offset),
        ).fetchall()
        return [storable.loads(r["body"]) for r in rows], total

    samples, total = await context_of(request).db.read(read)
    return JSONResponse(
        {
            "samples": samples,
            "total": total,
            "page": page,
            "limit": limit,
            "hasMore": page * limit < total,
        }
    )


routes = [
    Route("/api/v1/evaluations/", create_evaluation, methods=["POST"]),
    Route("/api/v1/evaluations/", list_evaluations, methods=["GET"]),
    Route("/api/v1/evaluations/{eval_id}", get_evaluation, methods=["GET"]),
    Route("/api/v1/evaluations/{eval_id}", update_evaluation, methods=["PUT"]),
    Route("/api/v1/evaluations/{eval_id}/finalize", finalize_evaluation, methods=["POST"]),
    Route("/api/v1/evaluations/{eval_id}/samples", push_samples, methods=["POST"]),
    Route("/api/v1/evaluations/{eval_id}/samples", read_samples, methods=["GET"]),
]
