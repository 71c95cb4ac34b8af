"""JSON answers written by orjson where it writes Starlette's bytes.

``JSONResponse`` renders with ``json.dumps`` (compact, ``ensure_ascii=False``,
NaN refused): ~20 µs of a metrics row's answer, a presign's or a confirm's,
against ~5 with orjson, and a backlog is thousands of them. For strings,
integers within 64 bits, booleans, None, and lists and mappings of these
(string keys), both write the same bytes (``test_answers`` holds them to
it); anything else (a float, whose shortest form the two spell apart, a
larger integer, a subclass) goes to ``json.dumps`` as before.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse

_DEPTH = 8  # an answer is shallow; deeper goes the old way


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether orjson writes ``value`` as ``json.dumps`` does."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(-(2**63) <= value < 2**64)
    if depth >= _DEPTH:
        return False
    if kind is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    if kind is list:
        return all(_plain(v, depth + 1) for v in value)
    return False


class JSONAnswer(JSONResponse):
    """``JSONResponse``, the same bytes, rendered by orjson when it can."""

    def render(self, content: Any) -> bytes:
        if _plain(content):
            return orjson.dumps(content)
        return super().render(content)
