"""Integers from a request's query string, bounded as storage holds them.

SQLite binds 64-bit integers, and the answers are encoded by orjson (64
bits too): a query integer past them (``limit=2**64``, a page whose rows'
offset passes them) failed binding the query or encoding the answer, a 500
for input the client sent. A platform must not 500 on input, so such a
value is refused as the client's error, naming the parameter, with the
status the platform gives any query value that does not validate (422,
FastAPI's, as for one that is not an integer at all).
"""

from __future__ import annotations

from starlette.requests import Request

from .errors import PlatformError

__all__ = ["is_64_bit", "query_int", "row_offset"]

_LOWEST, _HIGHEST = -(2**63), 2**63 - 1


def is_64_bit(value: int) -> bool:
    """Whether SQLite binds ``value`` (a signed 64-bit integer)."""
    return _LOWEST <= value <= _HIGHEST


def query_int(request: Request, name: str, default: int | None = None) -> int | None:
    """The query parameter ``name`` as an integer (``default`` when absent);
    refused (422, naming it) unless it is one within 64 bits."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise PlatformError(422, f"{name} must be an integer") from None
    if not is_64_bit(value):
        raise PlatformError(422, f"{name} must be a 64-bit integer")
    return value


def row_offset(page: int, limit: int) -> int:
    """The offset of the first row of ``page`` (from 1) of ``limit`` rows;
    refused (422) where it passes what a query can take."""
    offset = (page - 1) * limit
    if offset > _HIGHEST:
        raise PlatformError(422, "page is past the last row a read can reach")
    return offset
