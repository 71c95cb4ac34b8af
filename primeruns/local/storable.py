"""JSON a client sent, as the platform can store it and answer it again.

``json.loads`` reads what orjson refuses, and two of those cannot be kept:
a lone surrogate (``\\ud800`` to ``\\udfff`` escaped) is no character, so
SQLite cannot store a string holding one (UnicodeEncodeError: a 500, which a
client takes for the platform's fault and sends again, for ever); NaN,
Infinity and a number past a double (``1e400``) are floats JSON has no words
for, so a row holding one was stored and every answer reading it back failed
(a 500 for good, a list of runs or evaluations included). Both are the
client's error (the platform's 422, the traces service's 400).

Only a value orjson did not parse can hold either (orjson refuses both), so
only such a value is looked at: a request orjson parsed costs what it did.
Rows an earlier version stored with such floats are read with null there
(:func:`loads`), as both SDKs send such a value; an answer built of what an
earlier version indexed, or of a document it stored as written (a trace
holding ``1e400``), writes null there too (:class:`FiniteJSONResponse`).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from ..projection import nullify_non_finite
from . import jsonlimits

__all__ = [
    "NOT_A_NUMBER",
    "NOT_TEXT",
    "FiniteJSONResponse",
    "Unstorable",
    "check",
    "loads",
    "text",
]

#: Not quoted: the answer could not hold the string either.
NOT_TEXT = "a string holds a lone surrogate (\\ud800-\\udfff)"
NOT_A_NUMBER = "a number is NaN or infinite (send null)"


class Unstorable(ValueError):
    """A value holding a lone surrogate or a float JSON cannot write; its
    message is :data:`NOT_TEXT` or :data:`NOT_A_NUMBER`."""


def text(value: Any, *, by_orjson: bool) -> bytes:
    """``jsonlimits.compact(value)``, the text stored of it; Unstorable
    where it holds what cannot be stored or answered."""
    try:
        return jsonlimits.compact(value, by_orjson=by_orjson, allow_nan=False)
    except UnicodeEncodeError:
        raise Unstorable(NOT_TEXT) from None
    except ValueError:  # json.dumps's "Out of range float values are not JSON compliant"
        raise Unstorable(NOT_A_NUMBER) from None


def check(value: Any, *, by_orjson: bool) -> None:
    """Unstorable where ``value`` (``jsonlimits.parse``'s) holds what cannot
    be stored or answered; a value orjson parsed is not looked at."""
    if not by_orjson:
        text(value, by_orjson=False)


def loads(stored: str | bytes) -> Any:
    """A JSON text the platform stored, NaN, Infinity and -Infinity read as
    null: a data folder an earlier version wrote may hold them, and answered
    as they read, every read of the row failed (a 500, which the SDKs retry
    as transient)."""
    return json.loads(stored, parse_constant=_null)


def _null(constant: str) -> None:
    return None


class FiniteJSONResponse(JSONResponse):
    """``JSONResponse``, a float JSON has no word for (NaN, Infinity) written
    as null: an answer holding one was a 500 (``json.dumps`` refuses it),
    for good, as what held it stays stored. An answer holding none is
    rendered once, as by ``JSONResponse``: only a refused one is walked."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:  # "Out of range float values are not JSON compliant"
            return super().render(nullify_non_finite(content))
