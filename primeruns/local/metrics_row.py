"""``POST /rft/metrics``, a training run's metrics row, as a bare ASGI app.

The contract is one request a metrics row, so a sync of a training run is
as many of these as it has steps, and the platform's CPU per request bounds
how fast a backlog drains. A route written as a function is wrapped by
Starlette in a ``Request``, whose headers are looked up by a pass over them
each (the key, the body's length and type: five a row), a body read through
an async generator, and a second layer catching exceptions. Here the
route reads the three headers it needs in one pass and the body from
``receive`` directly, and raises what it refuses as the function did: the
app's exception handlers, which still wrap every route, answer it in the
same words. Everything outside the route is as for any other: the guard
(its Host, key and cross-site checks and security headers), fault
injection, the router's method check.

What it stores and answers is what the route function it replaced did:
the row is committed before the answer is sent (a 2xx is a receipt). A row
it cannot store (a step past 64 bits, a lone surrogate) or read back (NaN)
is the client's 422, not a 500 now or at every read of the run's rows (the
last two refused by ``context.parsed_object``, as on every route).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from . import jsonlimits
from .answers import JSONAnswer
from .context import (
    MAX_JSON_BODY,
    ServerContext,
    check_key,
    json_bytes,
    now,
    optional_object,
    parsed_object,
    read_capped_from,
    require_str,
    wanted_headers,
)
from .errors import PlatformError
from .queries import is_64_bit

__all__ = ["UPSERT_OF_A_KNOWN_RUN", "MetricsRow"]

#: A metrics row stored if its run exists, in one statement: one row per
#: (run, step), a replayed or repeated step replacing the row.
UPSERT_OF_A_KNOWN_RUN = (
    "INSERT INTO train_metrics (run_id, step, body, received_at)"
    " SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM train_runs WHERE id = ?)"
    " ON CONFLICT (run_id, step) DO UPDATE SET body = excluded.body,"
    " received_at = excluded.received_at"
)

_WANTED = {n.encode(): n for n in ("authorization", "x-api-key", "content-type", "content-length")}


class MetricsRow:
    """The metrics route of the public root, or of the internal one
    (``internal``: ``x-api-key`` is a key there too, as hosted launchers send it)."""

    def __init__(self, *, internal: bool) -> None:
        self.internal = internal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx: ServerContext = scope["app"].state.ctx
        headers = wanted_headers(scope, _WANTED)
        check_key(
            ctx.settings.api_key,
            headers.get("authorization"),
            headers.get("x-api-key") if self.internal else None,
        )
        body = await read_capped_from(
            _chunks(receive), headers.get("content-length"), MAX_JSON_BODY
        )
        values_of, by_orjson = parsed_object(
            json_bytes(body, headers.get("content-type"), MAX_JSON_BODY)
        )
        run_id = require_str(values_of, "run_id")
        values = optional_object(values_of, "metrics")
        if values is None:
            raise PlatformError(422, "Field 'metrics' must be an object")
        step = values.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise PlatformError(422, "metrics.step must be an integer")
        if step is not None and not is_64_bit(step):
            # SQLite cannot bind it: a 500 each time, which a client retries.
            raise PlatformError(422, "metrics.step must be a 64-bit integer")

        # Written back as parsed (orjson's, when it parsed it): a fifth of
        # json.dumps's CPU. What cannot be stored was refused by parsed_object.
        text = jsonlimits.compact(values, by_orjson=by_orjson).decode()

        stored = await ctx.db.write_statement(
            UPSERT_OF_A_KNOWN_RUN, (run_id, step, text, now(), run_id)
        )
        if not stored:  # no such run: nothing was written
            raise PlatformError(404, f"Run {run_id} not found")
        answer = JSONAnswer({"run_id": run_id, "step": step, "status": "ok"})
        await answer(scope, receive, send)


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    """The body's chunks as ``Request.stream`` gives them; a client gone
    mid-body is ``ClientDisconnect``, answered as for any route."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        if message["type"] == "http.request":
            body: bytes = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                return
