"""The local platform as one ASGI app: routes of every API area, errors, faults.

Error rendering lives here so that every failure takes one of the two wire
dialects (``{"detail"}`` for the platform API, the ``{"error"}`` envelope for
Prime Traces) and an unexpected exception is still a JSON 500 in its
route's dialect, never a dropped connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from primeruns.logs import get_logger

from . import (
    evals,
    hub,
    inspect,
    objects,
    rft,
    traces_index,
    traces_reads,
    traces_upload,
)
from .context import ServerContext
from .dashboard import dashboard_routes
from .dashboard.platform_source import PlatformSource
from .errors import PlatformError, TracesError
from .faults import FaultInjector, FaultMiddleware, FaultSettings
from .settings import ServerSettings
from .storage import Database

log = get_logger("primeruns.local")

_TRACES_PREFIXES = ("/api/v1/traces", "/api/v1/episodes", "/api/v1/runs")


def _is_traces(request: Request) -> bool:
    return request.url.path.startswith(_TRACES_PREFIXES)


async def _platform_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, PlatformError)
    if _is_traces(request):
        return TracesError(exc.status, None, exc.message).response()
    return exc.response()


async def _traces_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TracesError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if _is_traces(request):
        code = "trace_not_found" if exc.status_code == 404 else None
        return TracesError(exc.status_code, code, exc.detail).response()
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _client_gone(request: Request, exc: Exception) -> Response:
    # A client that went away mid-body (a sync killed, a network lost) is not
    # the platform's fault: a line, not a traceback that reads as one. Handled
    # here, not by ``_unexpected``: that one's middleware re-raises to the
    # server, which logs it again.
    log.info("client went away during %s %s", request.method, request.url.path)
    return Response(status_code=400)  # (nobody reads it)


#: On a 500 the server ends the connection (uvicorn closes it once the
#: exception reaches it; its state is unknown: a body half read, a pipelined
#: request behind it): the answer says so, or a client reuses the kept-alive
#: connection and its next request meets a closed socket, a failure it cannot
#: tell from a request lost after it was processed.
_ENDS = {"Connection": "close"}


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    if _is_traces(request):
        # The service's envelope, its code null (the contract gives a 500 no
        # code): a client of the service reads no other body.
        return TracesError(500, None, "internal error", _ENDS).response()
    return JSONResponse({"detail": "internal error"}, status_code=500, headers=_ENDS)


def _lifespan(db: Database) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        db.close()

    return lifespan


def build_app(settings: ServerSettings, faults: FaultSettings | None = None) -> Starlette:
    """The app for ``settings``; its database opens now and closes on shutdown."""
    # Checked first: a rejected fault setting must not leave a data directory behind.
    injector = FaultInjector(faults or FaultSettings(retry_after=settings.retry_after))
    db = Database(settings.data_dir)
    routes = [
        # What a training run's sync sends per step (a metrics row; a sample
        # object's presign, PUT and confirm) and per upload of traces, first:
        # starlette tries each route in turn, a regex each, and these came
        # after 24 to 43 others (14 to 23 us of CPU a request to find its
        # route; 2 to 4 now). No route before them took any of their paths,
        # so every request is answered by the same route as before. The
        # metrics rows' first of all: a sync sends one a step.
        *rft.metrics_routes,
        *objects.routes,
        *traces_upload.routes,
        *rft.routes,
        *inspect.routes,
        *dashboard_routes(),
        *evals.routes,
        *hub.routes,
        *traces_reads.routes,
        *traces_index.routes,
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(FaultMiddleware, injector=injector)],
        exception_handlers={
            PlatformError: _platform_error,
            TracesError: _traces_error,
            HTTPException: _http_error,
            ClientDisconnect: _client_gone,
            Exception: _unexpected,
        },
        lifespan=_lifespan(db),
    )
    app.state.ctx = ServerContext(settings, db, settings.data_dir / "objects", injector)
    app.state.dashboard_source = PlatformSource(db, app.state.ctx.objects_dir)
    return app
