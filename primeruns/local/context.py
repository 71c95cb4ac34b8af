"""Request plumbing shared by every route module: the server context, auth, bodies.

One place decides how a bearer is checked (and that the key never appears in an
answer), how a JSON body is read under a size cap, and how ids and timestamps
are minted, so the route modules only say what their endpoint does.
"""

from __future__ import annotations

import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.types import Scope

from ..ascii_digits import declared_over
from . import jsonlimits, storable
from .errors import PlatformError, TracesError
from .faults import FaultInjector
from .object_turns import ObjectTurns
from .settings import ServerSettings
from .storage import Database

#: Cap on a platform API JSON body. The SDK packs sample pushes to 25 MiB; a
#: little headroom over that, and bodies above it are a 413 as on the platform.
MAX_JSON_BODY = 26 * 1024 * 1024


@dataclass
class ServerContext:
    """What every route needs: settings, the database, the object directory, faults."""

    settings: ServerSettings
    db: Database
    objects_dir: Path
    faults: FaultInjector
    object_turns: ObjectTurns = field(default_factory=ObjectTurns)


def context_of(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    return ctx


def now() -> float:
    return time.time()


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:20]}"


def wanted_headers(scope: Scope, wanted: Mapping[bytes, str]) -> dict[str, str]:
    """The request's headers named in ``wanted`` (lower-case name as bytes:
    name as str), the first of a repeated one (as Starlette's ``Headers.get``
    gives it), in one pass; the others' names and values are not decoded.
    For the layers that read a few headers of every request (the guard, the
    metrics route), where a ``Headers`` look-up was a pass of its own each
    and decoding the headers never read was a third of the guard's CPU."""
    found: dict[str, str] = {}
    for raw_name, value in scope["headers"]:
        name = wanted.get(raw_name.lower())
        if name is not None and name not in found:
            found[name] = value.decode("latin-1")
    return found


def _bearer(request: Request) -> str | None:
    return _bearer_of(request.headers.get("authorization", ""))


def _bearer_of(value: str) -> str | None:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _matches(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


def check_platform_auth(request: Request, *, internal: bool = False) -> None:
    """401 unless the request carries the configured key (any key when none is set).

    The internal RFT root authenticates with ``x-api-key`` (hosted launchers
    send the same token as a bearer too, either is enough).
    """
    key = context_of(request).settings.api_key
    if key is not None:
        headers = request.headers
        check_key(key, headers.get("authorization"), headers.get("x-api-key") if internal else None)


def check_key(key: str | None, authorization: str | None, x_api_key: str | None) -> None:
    """:func:`check_platform_auth` on the headers' values (``x_api_key``
    None where that header does not count): for a route that reads its
    headers itself (``metrics_row``)."""
    if key is None:
        return
    if _matches(key, _bearer_of(authorization or "")):
        return
    if _matches(key, x_api_key):
        return
    raise PlatformError(401, "Invalid or missing API key")


def check_traces_auth(request: Request) -> None:
    """The traces service's checks: credential first, then whether it is enabled."""
    settings = context_of(request).settings
    if settings.api_key is not None and not _matches(settings.api_key, _bearer(request)):
        raise TracesError(401, "unauthenticated", "Invalid or missing API key")
    if settings.traces_disabled:
        raise TracesError(
            403, "service_not_enabled", "Prime Traces is not enabled for this account"
        )


async def read_capped(request: Request, limit: int) -> bytes | None:
    """The whole request body, or None when it is over ``limit`` bytes."""
    return await read_capped_from(request.stream(), request.headers.get("content-length"), limit)


async def read_capped_from(
    chunks: AsyncIterator[bytes], declared: str | None, limit: int
) -> bytes | None:
    """:func:`read_capped` of a body read as ``chunks`` and said to be
    ``declared`` bytes long (its Content-Length, if any)."""
    if declared is not None and declared_over(declared, limit):
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


async def json_body(request: Request, *, limit: int = MAX_JSON_BODY) -> dict[str, Any]:
    """The request's JSON object body, as the platform API (FastAPI) validates it.

    An empty body is ``{}`` (the SDK omits empty dict bodies altogether). A body
    over ``limit`` is 413; anything but a JSON object is 422.
    """
    return (await parsed_json_body(request, limit=limit))[0]


async def parsed_json_body(
    request: Request, *, limit: int = MAX_JSON_BODY
) -> tuple[dict[str, Any], bool]:
    """:func:`json_body`, and whether orjson parsed it: what a route stores of
    it is then written back with orjson (``jsonlimits.compact``)."""
    return parsed_object(await _json_bytes(request, limit))


def parsed_object(raw: bytes | None) -> tuple[dict[str, Any], bool]:
    """:func:`parsed_json_body` of the body :func:`json_bytes` gave; 422
    where it holds what cannot be stored or answered (:mod:`.storable`: a
    lone surrogate, NaN or Infinity), looked for only where orjson did not
    parse it, whatever field of it a route stores."""
    if raw is None:
        return {}, True
    with _refused_as_422():
        value, by_orjson = jsonlimits.parse(raw)
        storable.check(value, by_orjson=by_orjson)
    return _object(value), by_orjson


async def listed_json_body(
    request: Request, key: str, *, most: int
) -> tuple[dict[str, Any], bool, list[bytes] | None]:
    """:func:`parsed_json_body`, and the compact text of each object listed
    under ``key``, made by the body's nesting check (``jsonlimits.parse_listed``:
    None when ``storable.text`` is to write them, and refuse what it cannot:
    the body is not looked at twice)."""
    raw = await _json_bytes(request, MAX_JSON_BODY)
    if raw is None:
        return {}, True, None
    with _refused_as_422():
        value, by_orjson, texts = jsonlimits.parse_listed(raw, key, most=most)
    return _object(value), by_orjson, texts


async def _json_bytes(request: Request, limit: int) -> bytes | None:
    body = await read_capped(request, limit)
    return json_bytes(body, request.headers.get("content-type"), limit)


def json_bytes(body: bytes | None, content_type: str | None, limit: int) -> bytes | None:
    """A request's ``body`` (None: it was over ``limit``) as JSON to parse,
    None when it is blank; 413 over ``limit``, 415 unless ``content_type``
    says JSON (none is taken for JSON)."""
    if body is None:
        raise PlatformError(413, f"Request body is over the {limit}-byte limit")
    if not body.strip():
        return None
    if content_type is None:
        content_type = "application/json"
    if "json" not in content_type.split(";")[0].lower():
        raise PlatformError(415, f"Expected application/json, got {content_type!r}")
    return body


@contextmanager
def _refused_as_422() -> Iterator[None]:
    """A body too deep or not JSON as the route's 422."""
    try:
        yield
    except jsonlimits.TooDeep as exc:
        raise PlatformError(422, f"Body is refused: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlatformError(422, f"Body is not valid JSON: {exc}") from None


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PlatformError(422, "Body must be a JSON object")
    return value


def require_str(body: dict[str, Any], key: str, *, optional: bool = False) -> str | None:
    """``body[key]`` as a non-empty string (422 otherwise); None if optional and absent."""
    value = body.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise PlatformError(422, f"Field {key!r} must be a non-empty string")
    return value


def optional_object(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PlatformError(422, f"Field {key!r} must be an object")
    return value


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
