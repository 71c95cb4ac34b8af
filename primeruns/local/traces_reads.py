"""Prime Traces read endpoints: traces, episodes, runs, run steps.

Reads see one copy per id: the newest stored row wins (a re-upload replaces
what readers see, while ``/_local`` still counts every row). Runs are not an
entity: a run is the set of traces whose own ``run.id`` names it. Its
``run_type`` is what its newest trace's record says (``run.type``) when that
is ``eval`` or ``train``, else what that trace's upload context says: the
service types by the context alone, which lists a run uploaded without a
``run_type`` context (another uploader's, a bare ``upload_records``) as
``unknown`` though every record says ``train``; the two agree for every run
this SDK or the vendor's ships.

Cursors are opaque base64 of an offset bound to a hash of the filters; a
cursor used with other filters is 400 ``invalid_cursor``. Nodes, calls,
search and deletes are in ``traces_index``; exports are not served (the
service answers 500 for them and the client does not wrap them).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import sqlite3
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import jsonlimits
from .context import check_traces_auth, context_of
from .errors import TracesError, rejected
from .storable import FiniteJSONResponse as JSONResponse
from .traces_extract import number

MAX_LIMIT = 100
DEFAULT_LIMIT = 50
LATEST_TRACES = "row IN (SELECT max(row) FROM traces GROUP BY trace_id)"
#: A reward an earlier version indexed as infinite (finite scores summed past
#: the doubles) is read as none (:func:`trace_summary`), so no filter on the
#: reward keeps it either (1e999 is SQLite's infinity).
FINITE_REWARD = "abs(reward) < 1e999"
_LATEST_EPISODES = "row IN (SELECT max(row) FROM episodes GROUP BY episode_id)"
_TRACE_FIELDS = (
    "row, trace_id, upload_id, episode_id, run_id, step, environment_id, model_id,"
    " model_provider, task_id, agent_name, reward, outcome, has_error, is_truncated,"
    " duration_ms, total_tokens, size_bytes, created_at, ingested_at, context, run_type"
)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat()


def trace_summary(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "trace_id": row["trace_id"],
        "upload_id": row["upload_id"],
        "episode_id": row["episode_id"],
        "created_at": iso(row["created_at"]),
        "ingested_at": iso(row["ingested_at"]),
        "run_id": row["run_id"],
        "environment_id": row["environment_id"],
        "model": {"provider": row["model_provider"], "id": row["model_id"]},
        "task_id": row["task_id"],
        "agent_name": row["agent_name"],
        "score": {"reward": number(row["reward"]), "outcome": row["outcome"]},
        "execution": {
            "has_error": bool(row["has_error"]),
            "is_truncated": bool(row["is_truncated"]),
        },
        "duration_ms": row["duration_ms"],
        "total_tokens": row["total_tokens"],
        "size_bytes": row["size_bytes"],
        "context": json.loads(row["context"]),
    }


def episode_summary(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "episode_id": row["episode_id"],
        "upload_id": row["upload_id"],
        "schema_version": row["schema_version"],
        "created_at": iso(row["created_at"]),
        "ingested_at": iso(row["ingested_at"]),
        "run_id": row["run_id"],
        "environment_id": row["environment_id"],
        "outcome": row["outcome"],
        "has_error": bool(row["has_error"]),
        "error": {"type": row["error_type"], "message": row["error_message"]},
    }


class Query:
    """Filters from a request's query string, turned into SQL, with errors as 400s."""

    def __init__(self, request: Request) -> None:
        self.params = request.query_params
        self.where: list[str] = []
        self.args: list[Any] = []

    def add(self, clause: str, *args: Any) -> None:
        self.where.append(clause)
        self.args.extend(args)

    def text(self, name: str, column: str) -> None:
        values = self.params.getlist(name)
        if values:
            self.add(f"{column} IN ({', '.join('?' * len(values))})", *values)

    def number(self, name: str, clause: str, kind: type = float) -> None:
        value = self.params.get(name)
        if value is None:
            return
        try:
            self.add(clause, kind(value))
        except ValueError:
            raise rejected("invalid_filter", f"{name} must be a number") from None

    def flag(self, name: str) -> bool | None:
        """A ``true``/``false`` parameter (None when absent)."""
        value = self.params.get(name)
        if value is None:
            return None
        if value not in ("true", "false"):
            raise rejected("invalid_filter", f"{name} must be true or false")
        return value == "true"

    def boolean(self, name: str, column: str) -> None:
        value = self.flag(name)
        if value is not None:
            self.add(f"{column} = ?", int(value))

    def time(self, name: str, clause: str) -> None:
        value = self.params.get(name)
        if value is None:
            return
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise rejected("invalid_filter", f"{name} must be an ISO 8601 datetime") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        self.add(clause, parsed.timestamp())

    def context(self, column: str) -> None:
        for key, value in self.params.multi_items():
            if key.startswith("context."):
                self.add(f"json_extract({column}, ?) = ?", f'$."{key[8:]}"', value)

    def sql(self) -> str:
        return " AND ".join(self.where) if self.where else "1"

    def page(self) -> tuple[int, int]:
        """(offset, limit) from ``cursor`` and ``limit``."""
        try:
            limit = int(self.params.get("limit", DEFAULT_LIMIT))
        except ValueError:
            raise rejected("invalid_filter", "limit must be an integer") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise rejected("invalid_filter", f"limit must be within [1, {MAX_LIMIT}]")
        return self._cursor()[0], limit

    def resume_at(self) -> tuple[float, int, int] | None:
        """Where the cursor's page begins, if it says (``next_cursor``'s
        ``at``): a row's (created_at, row), and how many of that row's items
        earlier pages showed. A page that knows it reads from there, not
        from the start."""
        at = self._cursor()[1]
        if at is None:
            return None
        try:
            created, row, skip = at
            found = (float(created), int(row), int(skip))
        except (ValueError, TypeError, OverflowError):  # (an int past a float's range)
            raise rejected("invalid_cursor", "cursor is not valid") from None
        # A time that is a number, and a row SQLite can bind (past it, the
        # query raised OverflowError: a 500 for a client's cursor).
        if not math.isfinite(found[0]) or not 0 <= found[1] < 2**63 or found[2] < 0:
            raise rejected("invalid_cursor", "cursor is not valid")
        return found

    def _cursor(self) -> tuple[int, Any]:
        cursor = self.params.get("cursor")
        if cursor is None:
            return 0, None
        try:
            decoded = jsonlimits.loads(base64.urlsafe_b64decode(cursor.encode()))
            offset, bound = int(decoded["o"]), decoded["h"]
        except (ValueError, KeyError, TypeError):
            raise rejected("invalid_cursor", "cursor is not valid") from None
        if bound != self._hash() or offset < 0:
            raise rejected("invalid_cursor", "cursor does not belong to these filters")
        return offset, decoded.get("at")

    def _hash(self) -> str:
        pairs = sorted((k, v) for k, v in self.params.multi_items() if k not in ("cursor", "limit"))
        return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]

    def next_cursor(
        self, offset: int, limit: int, total: int, at: tuple[float, int, int] | None = None
    ) -> str | None:
        """The next page's cursor (``at``: where it begins, see ``resume_at``)."""
        if offset + limit >= total:
            return None
        fields: dict[str, Any] = {"o": offset + limit, "h": self._hash()}
        if at is not None:
            fields["at"] = list(at)
        token = json.dumps(fields)
        return base64.urlsafe_b64encode(token.encode()).decode()


def _trace_filters(q: Query) -> None:
    q.text("run_id", "run_id")
    q.text("upload_id", "upload_id")
    q.text("environment_id", "environment_id")
    q.text("model_id", "model_id")
    q.text("model_provider", "model_provider")
    q.text("task_id", "task_id")
    q.text("outcome", "outcome")
    q.number("reward_min", f"reward >= ? AND {FINITE_REWARD}")
    q.number("reward_max", f"reward <= ? AND {FINITE_REWARD}")
    q.boolean("has_error", "has_error")
    q.boolean("is_truncated", "is_truncated")
    q.time("created_after", "created_at >= ?")
    q.time("created_before", "created_at < ?")
    q.context("context")


def _order(q: Query) -> str:
    sort = q.params.get("sort")
    if sort in (None, "-created_at", "created_at_desc"):
        return "created_at DESC, row DESC"
    if sort in ("created_at", "created_at_asc"):
        return "created_at ASC, row ASC"
    raise rejected("invalid_filter", f"unknown sort {sort!r}")


async def _trace_page(
    request: Request, extra: str = "1", extra_args: tuple[Any, ...] = ()
) -> JSONResponse:
    q = Query(request)
    _trace_filters(q)
    order = _order(q)
    offset, limit = q.page()
    where = f"{LATEST_TRACES} AND {extra} AND {q.sql()}"
    args = (*extra_args, *q.args)

    def read(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], int]:
        total = conn.execute(f"SELECT count(*) FROM traces WHERE {where}", args).fetchone()[0]
        rows = conn.execute(
            f"SELECT {_TRACE_FIELDS} FROM traces WHERE {where} ORDER BY {order} LIMIT ? OFFSET ?",
            (*args, limit, offset),
        ).fetchall()
        return [trace_summary(r) for r in rows], int(total)

    items, total = await context_of(request).db.read(read)
    return JSONResponse({"items": items, "next_cursor": q.next_cursor(offset, limit, total)})


async def list_traces(request: Request) -> Response:
    check_traces_auth(request)
    return await _trace_page(request)


async def newest_trace(request: Request, trace_id: str, fields: str) -> sqlite3.Row:
    """The newest stored copy of a trace (what readers see); 404 ``trace_not_found``."""

    def read(conn: sqlite3.Connection) -> sqlite3.Row | None:
        row: sqlite3.Row | None = conn.execute(
            f"SELECT {fields} FROM traces WHERE trace_id = ? ORDER BY row DESC LIMIT 1",
            (trace_id,),
        ).fetchone()
        return row

    row = await context_of(request).db.read(read)
    if row is None:
        raise TracesError(404, "trace_not_found", f"trace {trace_id!r} not found")
    return row


async def get_trace(request: Request) -> Response:
    check_traces_auth(request)
    trace_id = request.path_params["trace_id"]
    raw = request.query_params.get("raw") == "true"

    row = await newest_trace(request, trace_id, "raw" if raw else _TRACE_FIELDS)
    if raw:
        return Response(bytes(row["raw"]), media_type="application/json")
    return JSONResponse(trace_summary(row))


async def list_episodes(request: Request) -> Response:
    check_traces_auth(request)
    q = Query(request)
    q.text("run_id", "run_id")
    q.text("upload_id", "upload_id")
    q.text("environment_id", "environment_id")
    q.text("outcome", "outcome")
    q.boolean("has_error", "has_error")
    q.time("created_after", "created_at >= ?")
    q.time("created_before", "created_at < ?")
    member = "EXISTS (SELECT 1 FROM traces t WHERE t.episode_id = episodes.episode_id AND {})"
    q.number("run_step", member.format("t.step = ?"), int)
    q.number("step_min", member.format("t.step >= ?"), int)
    q.number("step_max", member.format("t.step <= ?"), int)
    for key, value in q.params.multi_items():
        if key.startswith("context."):
            q.add(member.format("json_extract(t.context, ?) = ?"), f'$."{key[8:]}"', value)
    offset, limit = q.page()
    where = f"{_LATEST_EPISODES} AND {q.sql()}"

    def read(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], int]:
        total = conn.execute(f"SELECT count(*) FROM episodes WHERE {where}", q.args).fetchone()[0]
        rows = conn.execute(
            f"SELECT * FROM episodes WHERE {where} ORDER BY created_at DESC, row DESC"
            " LIMIT ? OFFSET ?",
            (*q.args, limit, offset),
        ).fetchall()
        return [episode_summary(r) for r in rows], int(total)

    items, total = await context_of(request).db.read(read)
    return JSONResponse({"items": items, "next_cursor": q.next_cursor(offset, limit, total)})


async def get_episode(request: Request) -> Response:
    check_traces_auth(request)
    episode_id = request.path_params["episode_id"]

    def read(conn: sqlite3.Connection) -> tuple[sqlite3.Row | None, list[sqlite3.Row]]:
        row = conn.execute(
            "SELECT * FROM episodes WHERE episode_id = ? ORDER BY row DESC LIMIT 1", (episode_id,)
        ).fetchone()
        members = conn.execute(
            f"SELECT {_TRACE_FIELDS} FROM traces WHERE {LATEST_TRACES} AND episode_id = ?",
            (episode_id,),
        ).fetchall()
        return row, members

    row, members = await context_of(request).db.read(read)
    if row is None:
        raise TracesError(404, "episode_not_found", f"episode {episode_id!r} not found")
    if request.query_params.get("raw") == "true":
        return Response(bytes(row["raw"]), media_type="application/json")
    detail = episode_summary(row)
    detail["traces"] = {
        "trace_count": len(members),
        "total_tokens": sum(m["total_tokens"] for m in members),
        "total_duration_ms": sum(m["duration_ms"] for m in members),
        "any_trace_error": any(m["has_error"] for m in members),
        "agent_names": sorted({m["agent_name"] for m in members if m["agent_name"]}),
    }
    return JSONResponse(detail)


async def list_episode_traces(request: Request) -> Response:
    check_traces_auth(request)
    return await _trace_page(request, "episode_id = ?", (request.path_params["episode_id"],))


def _run_summaries(rows: list[sqlite3.Row]) -> dict[str, dict[str, Any]]:
    """Totals per run over latest trace rows (ordered by ingestion, oldest first)."""
    runs: dict[str, dict[str, Any]] = {}
    for r in rows:
        run = runs.setdefault(r["run_id"], {"rows": [], "episodes": set(), "steps": set()})
        run["rows"].append(r)
        if r["episode_id"] is not None:
            run["episodes"].add(r["episode_id"])
        if r["step"] is not None:
            run["steps"].add(r["step"])
    out: dict[str, dict[str, Any]] = {}
    for run_id, run in runs.items():
        rs: list[sqlite3.Row] = run["rows"]
        newest = rs[-1]
        steps: set[int] = run["steps"]
        context = json.loads(newest["context"])
        out[run_id] = {
            "run_id": run_id,
            "run_type": _run_type(newest["run_type"], context.get("run_type")),
            "first_trace_created_at": iso(min(r["created_at"] for r in rs)),
            "last_trace_created_at": iso(max(r["created_at"] for r in rs)),
            "last_trace_ingested_at": iso(newest["ingested_at"]),
            "trace_count": len(rs),
            "episode_count": len(run["episodes"]),
            "avg_reward": mean_reward(rs),
            "step_min": min(steps) if steps else None,
            "step_max": max(steps) if steps else None,
            "step_count": len(steps),
            "has_error": any(r["has_error"] for r in rs),
            "first_user_id": None,
            "environment_ids": sorted({r["environment_id"] for r in rs if r["environment_id"]}),
            "model_ids": sorted({r["model_id"] for r in rs if r["model_id"]}),
            "context": context,
        }
    return out


def mean_reward(rows: list[sqlite3.Row]) -> float | None:
    """The mean of the rows' rewards (None when none has one): an infinite
    one an earlier version indexed counts as none, and finite ones that sum
    past the doubles (two of 1.5e308) have their finite mean, not infinity
    (either was a 500 for every read of the run, the list of runs included)."""
    rewards = [reward for r in rows if (reward := number(r["reward"])) is not None]
    if not rewards:
        return None
    total = sum(rewards)
    if math.isfinite(total):
        return total / len(rewards)
    return sum(reward / len(rewards) for reward in rewards)


def _run_type(record: str | None, context: object) -> str:
    """A run's type: the record's ``run.type``, else the upload context's."""
    for said in (record, context):
        if said in ("eval", "train"):
            return str(said)
    return "unknown"


def _run_rows(conn: sqlite3.Connection, run_id: str | None) -> list[sqlite3.Row]:
    where = "run_id IS NOT NULL" if run_id is None else "run_id = ?"
    args = () if run_id is None else (run_id,)
    return conn.execute(
        f"SELECT {_TRACE_FIELDS} FROM traces WHERE {LATEST_TRACES} AND {where}"
        " ORDER BY ingested_at, row",
        args,
    ).fetchall()


async def list_runs(request: Request) -> Response:
    check_traces_auth(request)
    q = Query(request)
    offset, limit = q.page()
    types = set(q.params.getlist("run_type"))
    if types - {"eval", "train", "unknown"}:
        raise rejected("invalid_filter", "run_type must be eval, train or unknown")
    summaries = await context_of(request).db.read(
        lambda conn: _run_summaries(_run_rows(conn, None))
    )
    items = sorted(summaries.values(), key=lambda s: s["last_trace_ingested_at"], reverse=True)
    if types:
        items = [s for s in items if s["run_type"] in types]
    return JSONResponse(
        {
            "items": items[offset : offset + limit],
            "next_cursor": q.next_cursor(offset, limit, len(items)),
        }
    )


async def get_run(request: Request) -> Response:
    check_traces_auth(request)
    run_id = request.path_params["run_id"]
    summaries = await context_of(request).db.read(
        lambda conn: _run_summaries(_run_rows(conn, run_id))
    )
    if run_id not in summaries:
        raise TracesError(404, "run_not_found", f"run {run_id!r} has no traces")
    return JSONResponse(summaries[run_id])


async def run_steps(request: Request) -> Response:
    check_traces_auth(request)
    run_id = request.path_params["run_id"]
    rows = await context_of(request).db.read(lambda conn: _run_rows(conn, run_id))
    by_step: dict[int, list[sqlite3.Row]] = {}
    for r in rows:
        if r["step"] is not None:
            by_step.setdefault(r["step"], []).append(r)
    items = []
    for step in sorted(by_step):
        rs = by_step[step]
        items.append(
            {
                "step": step,
                "trace_count": len(rs),
                "episode_count": len({r["episode_id"] for r in rs if r["episode_id"]}),
                "avg_reward": mean_reward(rs),
            }
        )
    steps = sorted(by_step)
    return JSONResponse(
        {
            "step_min": steps[0] if steps else None,
            "step_max": steps[-1] if steps else None,
            "step_count": len(steps),
            "items": items,
        }
    )


routes = [
    Route("/api/v1/traces", list_traces, methods=["GET"]),
    Route("/api/v1/traces/{trace_id}", get_trace, methods=["GET"]),
    Route("/api/v1/episodes", list_episodes, methods=["GET"]),
    Route("/api/v1/episodes/{episode_id}", get_episode, methods=["GET"]),
    Route("/api/v1/episodes/{episode_id}/traces", list_episode_traces, methods=["GET"]),
    Route("/api/v1/runs", list_runs, methods=["GET"]),
    Route("/api/v1/runs/{run_id}", get_run, methods=["GET"]),
    Route("/api/v1/runs/{run_id}/steps", run_steps, methods=["GET"]),
]
