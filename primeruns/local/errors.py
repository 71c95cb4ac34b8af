"""Error answers in the two dialects the platform speaks.

The platform API (evaluations, hub, RFT) answers errors FastAPI-style,
``{"detail": "..."}``; the Prime Traces service wraps them in its envelope,
``{"error": {"code": "...", "message": "..."}}``. Route code raises one of the
two exceptions below and the app's handlers render it, so a handler never
builds an error body by hand and never leaks a 500 for bad input.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse


class PlatformError(Exception):
    """An error answer of the platform API: ``{"detail": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> JSONResponse:
        return JSONResponse({"detail": self.message}, status_code=self.status)


class TracesError(Exception):
    """An error answer of the Prime Traces service, in its envelope."""

    def __init__(
        self,
        status: int,
        code: str | None,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        body = {"error": {"code": self.code, "message": self.message}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def rejected(code: str, message: str) -> TracesError:
    """A 400 upload or read rejection: nothing was stored."""
    return TracesError(400, code, message)
