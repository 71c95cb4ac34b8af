"""Environments hub: resolve (get-or-create), ``@latest`` by slug, lookup by id.

Decisions where the platform's behaviour is not known from its clients:

- An environment is ``owner/name``. ``resolve`` uses the request's ``team_id``
  (or ``owner_slug``/``team_slug``) as owner, else ``local``.
- Names are 1-128 characters of ``[A-Za-z0-9._-]`` (422 otherwise).
- Answers carry their fields under ``data``: ``id``, ``name``, ``owner{name}``,
  ``version_id`` and, for ``resolve``, ``created`` (true when this call made it).
- An unknown slug or id is a 404.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .context import check_platform_auth, context_of, json_body, new_id, now
from .errors import PlatformError

NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def _view(row: sqlite3.Row, created: bool | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": row["id"],
        "name": row["name"],
        "owner": {"name": row["owner"]},
        "slug": f"{row['owner']}/{row['name']}",
        "version_id": row["version_id"],
    }
    if created is not None:
        data["created"] = created
    return {"data": data}


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise PlatformError(422, f"{what} must be 1-128 characters of [A-Za-z0-9._-]")
    return value


async def resolve(request: Request) -> JSONResponse:
    check_platform_auth(request)
    body = await json_body(request)
    name = _check_name(body.get("name"), "name")
    owner_value = body.get("owner_slug") or body.get("team_slug") or body.get("team_id") or "local"
    owner = _check_name(owner_value, "owner")

    def get_or_create(conn: sqlite3.Connection) -> dict[str, Any]:
        row = conn.execute(
            "SELECT * FROM environments WHERE owner = ? AND name = ?", (owner, name)
        ).fetchone()
        if row is not None:
            return _view(row, created=False)
        conn.execute(
            "INSERT INTO environments (id, owner, name, version_id, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (new_id("env_"), owner, name, new_id("envv_"), now()),
        )
        row = conn.execute(
            "SELECT * FROM environments WHERE owner = ? AND name = ?", (owner, name)
        ).fetchone()
        return _view(row, created=True)

    return JSONResponse(await context_of(request).db.write(get_or_create))


async def latest(request: Request) -> JSONResponse:
    check_platform_auth(request)
    owner = request.path_params["owner"]
    name = request.path_params["name"]

    def read(conn: sqlite3.Connection) -> sqlite3.Row | None:
        row: sqlite3.Row | None = conn.execute(
            "SELECT * FROM environments WHERE owner = ? AND name = ?", (owner, name)
        ).fetchone()
        return row

    row = await context_of(request).db.read(read)
    if row is None:
        raise PlatformError(404, f"Environment {owner}/{name} not found")
    return JSONResponse(_view(row))


async def lookup(request: Request) -> JSONResponse:
    check_platform_auth(request)
    body = await json_body(request)
    env_id = body.get("id")
    if not isinstance(env_id, str) or not env_id:
        raise PlatformError(422, "Field 'id' must be a non-empty string")

    def read(conn: sqlite3.Connection) -> sqlite3.Row | None:
        row: sqlite3.Row | None = conn.execute(
            "SELECT * FROM environments WHERE id = ?", (env_id,)
        ).fetchone()
        return row

    row = await context_of(request).db.read(read)
    if row is None:
        raise PlatformError(404, f"Environment {env_id} not found")
    return JSONResponse(_view(row))


routes = [
    Route("/api/v1/environmentshub/resolve", resolve, methods=["POST"]),
    Route("/api/v1/environmentshub/lookup", lookup, methods=["POST"]),
    Route("/api/v1/environmentshub/{owner}/{name}/@latest", latest, methods=["GET"]),
]
