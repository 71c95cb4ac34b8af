"""What the `prime` CLI's training commands read, served for external runs.

`prime train list / get / rollouts / progress / distributions / logs /
checkpoints / components` read these routes (prime CLI 0.18.0, its
``prime_cli.api.rl`` client). The SDK writes external training runs: their
metric rows and their sample table (Parquet objects per step). This module
answers each read from what those writes stored, and answers empty where an
external run has nothing on the platform (logs, checkpoints, env servers are
the hosted trainer's, which the SDK never runs).

Decisions where only the client's expectations are known:

- The local platform has one user, :data:`LOCAL_USER_ID`; ``mine=true``
  therefore lists every run. Runs are listed newest first, paginated
  server-side (``page``/``limit``, 1-based) with ``total`` and
  ``total_pages``, optionally by ``team_id``.
- ``samples`` are the rows of the step's confirmed Parquet objects, in
  confirmation order, paginated; timestamps as ISO 8601 strings. A page
  decodes only its rows, and the distributions only their column
  (:mod:`.parquet_bounds`).
- ``progress``: ``latestStep`` is the highest step among metric rows and
  sample objects; a step has samples, and distributions, when one of its
  objects is confirmed (the distributions are computed from its samples).
- ``distributions``: a histogram of ten equal bins of the step's ``reward``
  (``type=rewards``, the default) or ``advantage`` (``type=advantages``)
  column, ``{"bins": [{"min", "max", "count"}], "step"}``; the step defaults
  to the latest step with samples.
"""

from __future__ import annotations

import math
import sqlite3
from datetime import UTC, datetime
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .context import check_platform_auth, context_of
from .errors import PlatformError
from .objects import object_path
from .parquet_bounds import column_histogram, read_rows
from .queries import query_int, row_offset

#: The one user of the local platform (the real one returns the caller's id).
LOCAL_USER_ID = "local-user"
_BINS = 10
_COLUMNS = {"rewards": "reward", "reward": "reward", "advantages": "advantage",
            "advantage": "advantage"}  # fmt: skip


def _page(request: Request, *, limit: int) -> tuple[int, int]:
    page = query_int(request, "page", 1)
    size = query_int(request, "limit", limit)
    assert page is not None and size is not None
    if page < 1 or not 1 <= size <= 1000:
        raise PlatformError(422, "page must be >= 1 and limit within [1, 1000]")
    return page, size


def _iso(stamp: float | None) -> str | None:
    return None if stamp is None else datetime.fromtimestamp(stamp, UTC).isoformat()


def existing_run(conn: sqlite3.Connection, run_id: str) -> sqlite3.Row:
    """The run's row, or a 404 naming it."""
    row: sqlite3.Row | None = conn.execute(
        "SELECT * FROM train_runs WHERE id = ?", (run_id,)
    ).fetchone()
    if row is None:
        raise PlatformError(404, f"Run {run_id} not found")
    return row


async def list_runs(request: Request) -> JSONResponse:
    from .rft import run_view  # the one view of a run, shared with GET /runs/{id}

    check_platform_auth(request)
    page, limit = _page(request, limit=20)
    team = request.query_params.get("team_id")

    def read(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], int]:
        where, args = ("WHERE team_id = ?", (team,)) if team else ("", ())
        total = conn.execute(f"SELECT count(*) FROM train_runs {where}", args).fetchone()[0]
        rows = conn.execute(
            f"SELECT * FROM train_runs {where} ORDER BY created_at DESC, id LIMIT ? OFFSET ?",
            (*args, limit, row_offset(page, limit)),
        ).fetchall()
        return [run_view(r) for r in rows], int(total)

    runs, total = await context_of(request).db.read(read)
    return JSONResponse(
        {
            "runs": runs,
            "total": total,
            "page": page,
            "limit": limit,
            "total_pages": max(1, math.ceil(total / limit)),
        }
    )


def _confirmed(conn: sqlite3.Connection, run_id: str) -> list[sqlite3.Row]:
    return list(
        conn.execute(
            "SELECT key, step, rows, confirmed_at FROM objects WHERE run_id = ?"
            " AND confirmed_at IS NOT NULL ORDER BY step, confirmed_at",
            (run_id,),
        )
    )


async def progress(request: Request) -> JSONResponse:
    check_platform_auth(request)
    run_id = request.path_params["run_id"]

    def read(conn: sqlite3.Connection) -> dict[str, Any]:
        run = existing_run(conn, run_id)
        steps = sorted({int(r["step"]) for r in _confirmed(conn, run_id)})
        metric = conn.execute(
            "SELECT max(step) AS step, max(received_at) AS at FROM train_metrics WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        latest = max([s for s in (metric["step"], *steps) if s is not None], default=None)
        updated = max(s for s in (run["updated_at"], metric["at"]) if s is not None)
        return {
            "latestStep": latest,
            "stepsWithSamples": steps,
            "stepsWithDistributions": steps,
            "lastUpdatedAt": _iso(updated),
        }

    return JSONResponse(await context_of(request).db.read(read))


def _step_objects(
    conn: sqlite3.Connection, run_id: str, step: int | None
) -> tuple[int | None, list[tuple[str, int | None]]]:
    """The step asked for (the latest with samples when None) and its
    objects' keys and row counts, in confirmation order."""
    existing_run(conn, run_id)
    objects = _confirmed(conn, run_id)
    chosen = step if step is not None else max((r["step"] for r in objects), default=None)
    return chosen, [(r["key"], r["rows"]) for r in objects if r["step"] == chosen]


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


async def samples(request: Request) -> JSONResponse:
    check_platform_auth(request)
    run_id = request.path_params["run_id"]
    step = query_int(request, "step", None)
    if step is None:
        raise PlatformError(422, "step is required")
    page, limit = _page(request, limit=100)
    ctx = context_of(request)
    _, keys = await ctx.db.read(lambda conn: _step_objects(conn, run_id, step))
    objects = [(object_path(ctx.objects_dir, key), rows) for key, rows in keys]
    # Only the page's rows are decoded (parquet_bounds.read_rows), not the step's.
    offset = row_offset(page, limit)
    shown, total = await anyio.to_thread.run_sync(read_rows, objects, offset, limit)
    return JSONResponse(
        {
            "run_id": run_id,
            "samples": [_jsonable(r) for r in shown],
            "total": total,
            "page": page,
            "limit": limit,
            "total_pages": math.ceil(total / limit),
        }
    )


def histogram(values: list[Any], bins: int = _BINS) -> list[dict[str, Any]]:
    """``bins`` equal-width bins over the finite values (one bin if all are equal)."""
    finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    if not finite:
        return []
    low, high = min(finite), max(finite)
    if low == high:
        return [{"min": low, "max": high, "count": len(finite)}]
    width = (high - low) / bins
    counts = [0] * bins
    for value in finite:
        counts[min(int((value - low) / width), bins - 1)] += 1
    return [
        {"min": low + i * width, "max": low + (i + 1) * width, "count": count}
        for i, count in enumerate(counts)
    ]


async def distributions(request: Request) -> JSONResponse:
    check_platform_auth(request)
    run_id = request.path_params["run_id"]
    kind = request.query_params.get("type", "rewards")
    column = _COLUMNS.get(kind)
    if column is None:
        raise PlatformError(422, f"type must be one of: {', '.join(sorted(_COLUMNS))}")
    ctx = context_of(request)
    wanted = query_int(request, "step", None)
    step, keys = await ctx.db.read(lambda conn: _step_objects(conn, run_id, wanted))
    paths = [object_path(ctx.objects_dir, key) for key, _ in keys]
    # The one column, a batch at a time: the same bins as histogram() of its values.
    bins = await anyio.to_thread.run_sync(column_histogram, paths, column, _BINS)
    return JSONResponse({"type": kind, "step": step, "bins": bins})


def _empty(field: str, value: Any) -> Any:
    """A route that exists for every run and holds nothing for an external one."""

    async def route(request: Request) -> JSONResponse:
        check_platform_auth(request)
        run_id = request.path_params["run_id"]
        await context_of(request).db.read(lambda conn: existing_run(conn, run_id))
        return JSONResponse({field: value})

    return route


def read_routes(prefix: str) -> list[Route]:
    return [
        Route(f"{prefix}/runs", list_runs, methods=["GET"]),
        Route(f"{prefix}/runs/{{run_id}}/progress", progress, methods=["GET"]),
        Route(f"{prefix}/runs/{{run_id}}/samples", samples, methods=["GET"]),
        Route(f"{prefix}/runs/{{run_id}}/distributions", distributions, methods=["GET"]),
        # The hosted trainer's pods write these; an external run has none.
        Route(f"{prefix}/runs/{{run_id}}/logs", _empty("logs", "")),
        Route(f"{prefix}/runs/{{run_id}}/checkpoints", _empty("checkpoints", [])),
        Route(f"{prefix}/runs/{{run_id}}/env-servers", _empty("env_servers", [])),
    ]
