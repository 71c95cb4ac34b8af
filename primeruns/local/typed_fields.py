"""Fields the wire contract gives a type, held to it where stored and read back as it.

The platform validates a request against its model (FastAPI): a field of
the wrong type is a 422 naming it, and nothing is stored. The local
platform stored what it did not look at as it came (a list for
``model_name``, an object for ``batch_size``), and a later read handed it
on: the runs page sorts the models it lists (a list cannot be compared with
a string: a 500 for every load of the page), and a client's model of the
answer (prime-evals') refuses it. So the routes refuse such a field
(:func:`check`) with the platform's 422 and words, and the reads show a
stored field of another type (an earlier version's row) as null
(:func:`shown`). Fields the contract leaves free (a config, a summary, a
metrics row's values) are not looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import PlatformError
from .queries import is_64_bit

__all__ = ["BOOL", "INT", "STR", "check", "check_environments", "shown", "shown_environments"]

#: The types, as the refusal names them.
STR, INT, BOOL = "a string", "an integer", "a boolean"


def _is(value: Any, kind: str) -> bool:
    if kind == STR:
        return isinstance(value, str)
    if kind == BOOL:
        return isinstance(value, bool)
    # An integer SQLite and the answers' encoder hold (64 bits), never a bool.
    return isinstance(value, int) and not isinstance(value, bool) and is_64_bit(value)


def check(body: Mapping[str, Any], fields: Mapping[str, str]) -> None:
    """422 naming the first of ``fields`` (name: type) that ``body`` holds
    with another type; null or absent is none of them."""
    for key, kind in fields.items():
        value = body.get(key)
        if value is not None and not _is(value, kind):
            raise PlatformError(422, f"Field {key!r} must be {kind}")


def check_environments(body: Mapping[str, Any], *, default: Any = None) -> list[Any] | None:
    """``body["environments"]`` (``default`` when absent): a list of
    ``{"id": str, "version_id"?: str}``, else 422."""
    envs = body.get("environments", default)
    if envs is None:
        return None
    if not isinstance(envs, list) or not all(
        isinstance(e, dict)
        and isinstance(e.get("id"), str)
        and e["id"]
        and (e.get("version_id") is None or isinstance(e["version_id"], str))
        for e in envs
    ):
        raise PlatformError(422, "environments must be a list of {id, version_id?} objects")
    return envs


def shown(value: Any, kind: str) -> Any:
    """``value`` where it is of type ``kind``, else None: a row an earlier
    version stored is read as the contract types it."""
    return value if _is(value, kind) else None


def shown_environments(value: Any) -> list[dict[str, Any]]:
    """The environment refs of a stored request, as ``check_environments``
    takes them: an earlier version stored any id (a list, a number) and, for
    a training run, environments of any shape (a number made the
    evaluation's reads and the runs page 500s). A ref without a text id is
    left out; a version of another type reads as null."""
    if not isinstance(value, list):
        return []
    return [
        ref
        if ref.get("version_id") is None or isinstance(ref["version_id"], str)
        else {**ref, "version_id": None}
        for ref in value
        if isinstance(ref, dict) and isinstance(ref.get("id"), str) and ref["id"]
    ]
