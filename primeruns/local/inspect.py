"""Inspection and control: ``/healthz``, ``/_local/runs`` and ``/_local/faults``.

These are how tests (and curious users) see what the server really stored,
independent of the API under test: every count is of stored ROWS next to
DISTINCT ids, so a record stored twice shows as ``rows > distinct``. A run id
is looked up as an evaluation, then a training run, then a run seen only in
Prime Traces uploads (kind from its traces' ``run.type``, status ``UNKNOWN``).
None of these routes is subject to fault injection.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import storable
from .context import context_of, json_body
from .errors import PlatformError


def _one(conn: sqlite3.Connection, sql: str, *args: Any) -> Any:
    return conn.execute(sql, args).fetchone()[0]


def run_report(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """Everything stored for ``run_id``, or None if nothing is."""
    ev = conn.execute("SELECT * FROM evaluations WHERE id = ?", (run_id,)).fetchone()
    tr = conn.execute("SELECT * FROM train_runs WHERE id = ?", (run_id,)).fetchone()
    trace_rows = _one(conn, "SELECT count(*) FROM traces WHERE run_id = ?", run_id)
    episode_rows = _one(conn, "SELECT count(*) FROM episodes WHERE run_id = ?", run_id)
    if ev is None and tr is None and not trace_rows and not episode_rows:
        return None
    report: dict[str, Any]
    if ev is not None:
        report = {
            "id": run_id,
            "kind": "eval",
            "name": ev["name"],
            "status": ev["status"],
            "error_message": ev["error_message"],
            "summary": storable.loads(ev["metrics"]),
            "config": storable.loads(ev["metadata"]),
        }
    elif tr is not None:
        request = storable.loads(tr["request"])
        report = {
            "id": run_id,
            "kind": "train",
            "name": tr["name"],
            "status": tr["status"],
            "error_message": tr["error_message"],
            "summary": {},
            "config": request.get("run_config") or {},
        }
    else:
        seen = conn.execute(
            "SELECT run_type, run_name FROM traces WHERE run_id = ? UNION ALL"
            " SELECT run_type, run_name FROM episodes WHERE run_id = ? LIMIT 1",
            (run_id, run_id),
        ).fetchone()
        report = {
            "id": run_id,
            "kind": seen["run_type"] if seen and seen["run_type"] in ("eval", "train") else None,
            "name": seen["run_name"] if seen else None,
            "status": "UNKNOWN",
            "error_message": None,
            "summary": {},
            "config": {},
        }
    uploads = conn.execute(
        "SELECT count(*), coalesce(sum(replays), 0) FROM uploads WHERE upload_id IN"
        " (SELECT upload_id FROM traces WHERE run_id = ?"
        "  UNION SELECT upload_id FROM episodes WHERE run_id = ?)",
        (run_id, run_id),
    ).fetchone()
    report["traces"] = {
        "episodes": episode_rows,
        "distinct_episodes": _one(
            conn, "SELECT count(DISTINCT episode_id) FROM episodes WHERE run_id = ?", run_id
        ),
        "traces": trace_rows,
        "distinct_traces": _one(
            conn, "SELECT count(DISTINCT trace_id) FROM traces WHERE run_id = ?", run_id
        ),
        "uploads": uploads[0],
        "replayed_uploads": uploads[1],
    }
    report["samples"] = {
        "rows": _one(conn, "SELECT count(*) FROM eval_samples WHERE eval_id = ?", run_id),
        "distinct": _one(
            conn,
            "SELECT count(DISTINCT sample_id) FROM eval_samples WHERE eval_id = ?",
            run_id,
        ),
    }
    report["train_metrics"] = {
        "rows": _one(conn, "SELECT count(*) FROM train_metrics WHERE run_id = ?", run_id),
        "steps": _one(
            conn, "SELECT count(DISTINCT step) FROM train_metrics WHERE run_id = ?", run_id
        ),
    }
    report["parquet_objects"] = [
        {"step": r["step"], "key": r["key"], "rows": r["rows"]}
        for r in conn.execute(
            "SELECT step, key, rows FROM objects WHERE run_id = ? AND confirmed_at IS NOT NULL"
            " ORDER BY step, confirmed_at",
            (run_id,),
        )
    ]
    return report


def run_list(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    runs = [
        {"id": r["id"], "name": r["name"], "kind": "eval", "status": r["status"]}
        for r in conn.execute("SELECT id, name, status FROM evaluations ORDER BY created_at")
    ]
    runs += [
        {"id": r["id"], "name": r["name"], "kind": "train", "status": r["status"]}
        for r in conn.execute("SELECT id, name, status FROM train_runs ORDER BY created_at")
    ]
    known = {r["id"] for r in runs}
    for r in conn.execute(
        "SELECT run_id, max(run_type) AS run_type, max(run_name) AS run_name FROM traces"
        " WHERE run_id IS NOT NULL GROUP BY run_id ORDER BY min(row)"
    ):
        if r["run_id"] not in known:
            kind = r["run_type"] if r["run_type"] in ("eval", "train") else None
            runs.append(
                {"id": r["run_id"], "name": r["run_name"], "kind": kind, "status": "UNKNOWN"}
            )
    return runs


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def local_runs(request: Request) -> Response:
    return JSONResponse({"runs": await context_of(request).db.read(run_list)})


async def local_run(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    report = await context_of(request).db.read(lambda conn: run_report(conn, run_id))
    if report is None:
        raise PlatformError(404, f"Nothing is stored for run {run_id}")
    return JSONResponse(report)


async def get_faults(request: Request) -> Response:
    return JSONResponse(context_of(request).faults.snapshot())


async def set_faults(request: Request) -> Response:
    body = await json_body(request)
    try:
        return JSONResponse(context_of(request).faults.update(body))
    except ValueError as exc:
        raise PlatformError(422, str(exc)) from None


routes = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/_local/runs", local_runs, methods=["GET"]),
    Route("/_local/runs/{run_id}", local_run, methods=["GET"]),
    Route("/_local/faults", get_faults, methods=["GET"]),
    Route("/_local/faults", set_faults, methods=["POST"]),
]
