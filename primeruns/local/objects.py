"""The object store behind presigned URLs: Parquet files under ``<data>/objects``.

A presigned ``PUT`` carries its own credential (the ``token`` query parameter
minted by presign); like S3 it refuses a request that also carries an
``Authorization`` header (400) and never redirects. A repeated ``PUT`` to the
same URL overwrites the object (idempotent, so a client may retry it) until
the object is confirmed: confirm checked what it holds, so afterwards only a
resend of the same bytes is taken (200, nothing written) and other bytes are
a 409 (a confirmed object cannot be swapped for one that was never checked,
see :mod:`.parquet_bounds`). Objects
are written to a temporary file and renamed, so a dropped upload never leaves
a half object behind. Files are 0600.

A PUT and a confirm of one key take turns (:mod:`.object_turns`): confirm
checks the file and then marks the object confirmed, and a PUT landing
between the two replaced the checked file with one never checked.
"""

from __future__ import annotations

import hmac
import os
import sqlite3
from pathlib import Path

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from .context import context_of, now, read_capped
from .storage import ensure_private_dir

#: Largest object accepted. Training step objects are a few MiB; this bounds
#: what a bad client can make the server hold in memory.
MAX_OBJECT_BYTES = 512 * 1024 * 1024


def object_path(objects_dir: Path, key: str) -> Path:
    # Keys are minted by presign from safe characters; never trust them as paths.
    return objects_dir / key.replace("/", "__")


def _same_bytes(path: Path, body: bytes) -> bool:
    """Whether the stored object holds exactly ``body``."""
    try:
        if path.stat().st_size != len(body):
            return False
        with path.open("rb") as f:
            return hmac.compare_digest(f.read(), body)
    except OSError:
        return False


async def put_object(request: Request) -> Response:
    ctx = context_of(request)
    key = request.path_params["key"]
    token = request.query_params.get("token", "")
    if "authorization" in request.headers:
        return PlainTextResponse(
            "InvalidArgument: a presigned request must not carry an Authorization header",
            status_code=400,
        )

    def lookup(conn: sqlite3.Connection) -> sqlite3.Row | None:
        row: sqlite3.Row | None = conn.execute(
            "SELECT * FROM objects WHERE key = ?", (key,)
        ).fetchone()
        return row

    row = await ctx.db.read_small(lookup)
    if row is None or not hmac.compare_digest(row["token"].encode(), token.encode()):
        return PlainTextResponse("AccessDenied: bad or missing signature", status_code=403)
    if row["expires_at"] < now():
        return PlainTextResponse("AccessDenied: request has expired", status_code=403)
    body = await read_capped(request, MAX_OBJECT_BYTES)
    if body is None:
        return PlainTextResponse("EntityTooLarge", status_code=413)
    path = object_path(ensure_private_dir(ctx.objects_dir), key)
    async with ctx.object_turns.turn(key):
        # Read again in its turn: a confirm may have marked it meanwhile.
        row = await ctx.db.read_small(lookup)
        assert row is not None  # objects' rows are never deleted
        if row["confirmed_at"] is not None:
            if _same_bytes(path, body):
                return Response(status_code=200)
            return PlainTextResponse(
                "Conflict: the object is confirmed; only a resend of the same bytes is taken",
                status_code=409,
            )
        tmp = path.with_suffix(".partial")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        tmp.replace(path)

        def mark(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE objects SET size = ?, uploaded_at = ? WHERE key = ?",
                (len(body), now(), key),
            )

        await ctx.db.write_small(mark)
    return Response(status_code=200)


routes = [Route("/storage/{key:path}", put_object, methods=["PUT"])]
