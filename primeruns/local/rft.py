"""External training runs (RFT) on the public and the internal root (the calls
the SDK makes are in docs/ARCHITECTURE.md, "The wire").

The public root ``/api/v1/rft`` has every endpoint; the internal root
``/api/internal/rft`` (hosted runs, authenticated by ``x-api-key``) has only
finalize, metrics and the sample presign/confirm pair, as on the platform.

Decisions where the platform's behaviour is not known from its clients:

- Statuses are stored uppercase: a created run is ``RUNNING``; lowercase
  ``completed``/``failed`` from ``/status`` and ``/finalize`` become
  ``COMPLETED``/``FAILED``. A status ``PUT`` on a terminal run is 409.
- ``/finalize`` is compare-and-set: RUNNING becomes COMPLETED (FAILED for a
  non-zero ``exit_code``); a repeat on COMPLETED is 200; on FAILED it is 409.
- Metrics keep ONE row per ``(run_id, step)``: a duplicate replaces the
  earlier row (a replayed request collapses). A row without ``step`` is kept
  as its own row. Any JSON values are accepted inside ``metrics``.
- The team allowlist is ``--train-teams``; a team outside it gets 403. With no
  list every team is allowed. Hosted runs are not modelled on the public root.
- Presign mints ``rft/<run>/step-<step>/<uuid>.parquet`` and a URL on this
  server's own object store (see :mod:`.objects`), valid one hour.
  ``confirm`` answers 404 for an unknown key, 400 for a key of another run or
  step, or one not uploaded yet or not Parquet, or past the sample table's
  bounds (:mod:`.parquet_bounds`: rows, decoded bytes, nested columns, each
  named); a repeat confirm is 200.
"""

from __future__ import annotations

import secrets
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from . import storable, typed_fields
from .answers import JSONAnswer
from .context import (
    check_platform_auth,
    context_of,
    dumps,
    json_body,
    new_id,
    now,
    optional_object,
    require_str,
)
from .errors import PlatformError
from .metrics_row import MetricsRow
from .objects import object_path
from .parquet_bounds import checked_rows, footer_bytes
from .queries import is_64_bit, query_int
from .rft_reads import LOCAL_USER_ID, read_routes
from .rft_reads import existing_run as _run
from .typed_fields import INT, STR, shown, shown_environments

TERMINAL = frozenset({"COMPLETED", "FAILED", "STOPPED"})
#: A create's optional fields the contract types (§3.2), besides those checked apart.
_CREATE_TYPES = {
    "batch_size": INT,
    "rollouts_per_example": INT,
    "seq_len": INT,
    "wandb_project": STR,
    "wandb_entity": STR,
    "wandb_run_name": STR,
}


def _known(conn: sqlite3.Connection, run_id: str) -> None:
    """404 unless the run exists: :func:`_run` without reading its row (the
    per-step routes need only that it exists; its request may be KiBs)."""
    if conn.execute("SELECT 1 FROM train_runs WHERE id = ?", (run_id,)).fetchone() is None:
        raise PlatformError(404, f"Run {run_id} not found")


def _internal(request: Request) -> bool:
    # The scope's path, not request.url's: building that URL (the Host
    # header, urlsplit) for this alone cost ~8 µs of every metrics row,
    # presign and confirm; both paths start with the same prefix.
    path: str = request.scope["path"]
    return path.startswith("/api/internal/")


def _auth(request: Request) -> None:
    check_platform_auth(request, internal=_internal(request))


def _int(body: dict[str, Any], key: str, *, optional: bool = False) -> int | None:
    value = body.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlatformError(422, f"Field {key!r} must be an integer")
    if not is_64_bit(value):
        # SQLite cannot bind it (a presign's step): a 500 each time, which a client retries.
        raise PlatformError(422, f"Field {key!r} must be a 64-bit integer")
    return value


def run_view(row: sqlite3.Row) -> dict[str, Any]:
    # A field an earlier version stored with another type than the
    # contract's reads as null (typed_fields.shown).
    req = storable.loads(row["request"])
    return {
        "id": row["id"],
        "name": row["name"],
        "teamId": row["team_id"],
        "userId": LOCAL_USER_ID,
        "status": row["status"],
        "kind": "EXTERNAL",
        "baseModel": shown(req.get("base_model"), STR),
        "maxSteps": shown(req.get("max_steps"), INT),
        "batchSize": shown(req.get("batch_size"), INT),
        "rolloutsPerExample": shown(req.get("rollouts_per_example"), INT),
        "seqLen": shown(req.get("seq_len"), INT),
        "environments": shown_environments(req.get("environments")),
        "runConfig": req.get("run_config"),
        "wandbProject": shown(req.get("wandb_project"), STR),
        "wandbEntity": shown(req.get("wandb_entity"), STR),
        "wandbRunName": shown(req.get("wandb_run_name"), STR),
        "errorMessage": row["error_message"],
        "createdAt": row["created_at"],
        "updatedAt": row["updated_at"],
        "completedAt": row["completed_at"],
    }


async def create_run(request: Request) -> JSONResponse:
    _auth(request)
    body = await json_body(request)
    require_str(body, "base_model")
    team = require_str(body, "team_id")
    _int(body, "max_steps")
    name = require_str(body, "name", optional=True)
    typed_fields.check_environments(body, default=[])
    typed_fields.check(body, _CREATE_TYPES)
    optional_object(body, "run_config")
    allowed = context_of(request).settings.train_teams
    if allowed is not None and team not in allowed:
        raise PlatformError(403, "External training runs are not enabled for this team")
    run_id = new_id("rft_")
    stamp = now()

    def insert(conn: sqlite3.Connection) -> dict[str, Any]:
        conn.execute(
            "INSERT INTO train_runs (id, name, team_id, status, request, created_at, updated_at)"
            " VALUES (?, ?, ?, 'RUNNING', ?, ?, ?)",
            (run_id, name or run_id, team, dumps(body), stamp, stamp),
        )
        return run_view(_run(conn, run_id))

    return JSONResponse({"run": await context_of(request).db.write(insert)}, status_code=201)


async def set_status(request: Request) -> JSONResponse:
    _auth(request)
    run_id = request.path_params["run_id"]
    body = await json_body(request)
    status = body.get("status")
    if status not in ("completed", "failed"):
        raise PlatformError(422, "status must be 'completed' or 'failed'")
    message = body.get("error_message")
    if message is not None and not isinstance(message, str):
        raise PlatformError(422, "error_message must be a string")

    def update(conn: sqlite3.Connection) -> dict[str, Any]:
        row = _run(conn, run_id)
        if row["status"] in TERMINAL:
            raise PlatformError(409, f"Run {run_id} is already {row['status']}")
        stamp = now()
        conn.execute(
            "UPDATE train_runs SET status = ?, error_message = ?, updated_at = ?,"
            " completed_at = ? WHERE id = ?",
            (str(status).upper(), message, stamp, stamp, run_id),
        )
        return run_view(_run(conn, run_id))

    return JSONResponse({"run": await context_of(request).db.write(update)})


async def finalize(request: Request) -> JSONResponse:
    _auth(request)
    body = await json_body(request)
    run_id = require_str(body, "run_id")
    assert run_id is not None
    exit_code = _int(body, "exit_code", optional=True) or 0

    def cas(conn: sqlite3.Connection) -> dict[str, Any]:
        row = _run(conn, run_id)
        if row["status"] == "COMPLETED":
            return {"run_id": run_id, "status": "COMPLETED", "already_finalized": True}
        if row["status"] in TERMINAL:
            raise PlatformError(409, f"Run {run_id} is already {row['status']}")
        status = "COMPLETED" if exit_code == 0 else "FAILED"
        message = None if exit_code == 0 else f"exit code {exit_code}"
        stamp = now()
        conn.execute(
            "UPDATE train_runs SET status = ?, error_message = ?, updated_at = ?,"
            " completed_at = ? WHERE id = ?",
            (status, message, stamp, stamp, run_id),
        )
        return {"run_id": run_id, "status": status, "already_finalized": False}

    return JSONResponse(await context_of(request).db.write(cas))


async def presign(request: Request) -> JSONResponse:
    _auth(request)
    body = await json_body(request)
    run_id = require_str(body, "run_id")
    step = _int(body, "step")
    if step is None or step < 0:
        raise PlatformError(422, "step must be a non-negative integer")
    key = f"rft/{run_id}/step-{step:08d}/{uuid.uuid4().hex}.parquet"
    token = secrets.token_urlsafe(24)
    ttl = context_of(request).settings.presign_ttl_seconds

    def insert(conn: sqlite3.Connection) -> None:
        _known(conn, str(run_id))
        conn.execute(
            "INSERT INTO objects (key, run_id, step, token, expires_at) VALUES (?, ?, ?, ?, ?)",
            (key, run_id, step, token, now() + ttl),
        )

    await context_of(request).db.write_small(insert)
    origin = str(request.base_url).rstrip("/")
    url = f"{origin}/storage/{key}?token={token}"
    return JSONAnswer({"data": {"presignedUrl": url, "s3Key": key, "expiresIn": int(ttl)}})


async def confirm(request: Request) -> JSONResponse:
    _auth(request)
    body = await json_body(request)
    run_id = require_str(body, "run_id")
    step = _int(body, "step")
    key = require_str(body, "s3_key")
    assert key is not None
    ctx = context_of(request)

    def check(conn: sqlite3.Connection) -> sqlite3.Row:
        _known(conn, str(run_id))
        row: sqlite3.Row | None = conn.execute(
            "SELECT * FROM objects WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            raise PlatformError(404, f"Object {key} not found")
        if row["run_id"] != run_id or row["step"] != step:
            raise PlatformError(400, f"Object {key} belongs to another run or step")
        if row["uploaded_at"] is None:
            raise PlatformError(400, f"Object {key} has not been uploaded")
        return row

    async with ctx.object_turns.turn(key):  # no PUT replaces the file checked here
        row = await ctx.db.read_small(check)
        path: Path = object_path(ctx.objects_dir, key)
        try:
            size = path.stat().st_size
        except OSError:
            raise PlatformError(400, f"Object {key} is not a readable Parquet file") from None
        # Refused past the sample table's bounds (rows, decoded bytes), measured
        # without decoding it whole: a small object can decode to a huge table.
        # A small file its footer proves small (the SDK's objects) is checked
        # here, on the loop (~0.1 ms): a hop to a worker thread and back took
        # longer, once per training step of a sync, in its critical path. One
        # only decoding can bound, or a large footer, is checked off the loop.
        footer = footer_bytes(path) if size <= INLINE_CHECK_BYTES else None
        small = footer is not None and footer <= INLINE_FOOTER_BYTES
        rows = checked_rows(path, key, measure=False) if small else None
        if rows is None:
            rows = await anyio.to_thread.run_sync(_measured_rows, path, key)

        def mark(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE objects SET confirmed_at = coalesce(confirmed_at, ?), rows = ?"
                " WHERE key = ?",
                (now(), rows, key),
            )

        await ctx.db.write_small(mark)
    return JSONAnswer(
        {"run_id": run_id, "step": row["step"], "s3_key": key, "rows": rows, "status": "confirmed"}
    )


#: Objects up to this size, of a footer up to this size, are checked on the
#: event loop when their footer proves them small: the footer's parse is what
#: that costs (an SDK object's is a few KB; a file of 10,000 row groups in
#: under 1 MiB took 15-25 ms).
INLINE_CHECK_BYTES = 1024 * 1024
INLINE_FOOTER_BYTES = 64 * 1024


def _measured_rows(path: Path, key: str) -> int:
    rows = checked_rows(path, key)
    assert rows is not None  # measured: a count or a refusal
    return rows


async def get_run(request: Request) -> JSONResponse:
    _auth(request)
    run_id = request.path_params["run_id"]
    row = await context_of(request).db.read(lambda conn: _run(conn, run_id))
    return JSONResponse({"run": run_view(row)})


async def get_metrics(request: Request) -> JSONResponse:
    _auth(request)
    run_id = request.path_params["run_id"]

    # The CLI's filters (contract §3.8): a client looking one step up reads that step.
    bounds = {name: query_int(request, name) for name in ("min_step", "max_step", "limit")}

    def read(conn: sqlite3.Connection) -> list[Any]:
        _run(conn, run_id)
        rows = conn.execute(
            "SELECT body FROM train_metrics WHERE run_id = ?"
            " AND (? IS NULL OR step >= ?) AND (? IS NULL OR step <= ?)"
            " ORDER BY step, row LIMIT ?",
            (
                run_id,
                bounds["min_step"],
                bounds["min_step"],
                bounds["max_step"],
                bounds["max_step"],
                -1 if bounds["limit"] is None else bounds["limit"],
            ),
        ).fetchall()
        # NaN in a row an earlier version stored is read as null (storable.loads).
        return [storable.loads(r["body"]) for r in rows]

    return JSONResponse({"metrics": await context_of(request).db.read(read)})


def _metrics_route(prefix: str, *, internal: bool) -> Route:
    return Route(f"{prefix}/metrics", MetricsRow(internal=internal), methods=["POST"])


def _rft_routes(prefix: str, *, public: bool) -> list[Route]:
    routes = [
        Route(f"{prefix}/finalize", finalize, methods=["POST"]),
        *([] if public else [_metrics_route(prefix, internal=True)]),
        Route(f"{prefix}/samples/presign", presign, methods=["POST"]),
        Route(f"{prefix}/samples/confirm", confirm, methods=["POST"]),
    ]
    if public:
        routes += [
            Route(f"{prefix}/external-runs", create_run, methods=["POST"]),
            Route(f"{prefix}/external-runs/{{run_id}}/status", set_status, methods=["PUT"]),
            Route(f"{prefix}/runs/{{run_id}}", get_run, methods=["GET"]),
            Route(f"{prefix}/runs/{{run_id}}/metrics", get_metrics, methods=["GET"]),
            *read_routes(prefix),
        ]
    return routes


routes = _rft_routes("/api/v1/rft", public=True) + _rft_routes("/api/internal/rft", public=False)
#: The public root's metrics route, tried before any other (``app.build_app``):
#: a sync is one request a row, and each route tried before its own is a regex.
metrics_routes = [_metrics_route("/api/v1/rft", internal=False)]
