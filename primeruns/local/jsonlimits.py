"""JSON from a request, with its nesting depth bounded.

``json.loads`` recurses once per level: a body of 100,000 ``[`` raised
``RecursionError`` (not ``ValueError``), which the routes did not expect, so
the answer was a 500 and a traceback in the log. A value that parsed just
under the interpreter's limit would fail later instead, when rendered or
re-encoded. Every request body is read through :func:`loads` here, which
refuses more than :data:`MAX_DEPTH` levels with a ``ValueError`` naming it:
the routes' existing ``except ValueError`` turns it into their 400/422.

It parses with orjson where orjson gives exactly what ``json.loads`` gives,
else with ``json.loads``: parsing request bodies was most of the local
platform's CPU in its own benchmarks (a sample table push of 1,000 gsm8k
episodes is ~20 MB of JSON): orjson takes 30% less time on such a body, and
a quarter less on the traces service's lines. orjson refuses
what ``json.loads`` accepts (NaN and Infinity, a byte order mark, UTF-16,
lone surrogates), and turns an integer past 64 bits into a float: a body
with any of those, or with a run of 19 digits, is parsed by ``json.loads``,
as before, so no answer changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

#: Levels of arrays and objects a request's JSON may nest. Honest configs,
#: samples and traces (tool schemas included) stay far below it.
MAX_DEPTH = 100


class TooDeep(ValueError):
    """JSON nested deeper than :data:`MAX_DEPTH`."""

    def __init__(self) -> None:
        super().__init__(f"JSON nests deeper than the limit of {MAX_DEPTH} levels")


# Every byte a digit maps to, the rest to a space: a run of 19 digits may be
# an integer orjson cannot hold (it holds -2**63 to 2**64 - 1).
_DIGITS = bytes(0x39 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"9" * 19
_SLOW = object()


def _fast(raw: bytes) -> Any:
    """``raw`` parsed by orjson when that is what ``json.loads`` gives, else ``_SLOW``."""
    if _LONG_RUN in raw.translate(_DIGITS):
        return _SLOW
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:  # json.loads may take it (NaN, a BOM), or say why not
        return _SLOW


def loads(data: bytes | str, *, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``json.loads(data)``; raises ValueError (TooDeep beyond MAX_DEPTH)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    value = _fast(raw)
    if value is _SLOW:
        try:
            value = json.loads(data, parse_constant=parse_constant)
        except RecursionError:
            raise TooDeep() from None
    # Counting brackets runs at C speed; only a body with more of them than the
    # limit (most large ones) needs the walk over its parsed containers.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise TooDeep()
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` containers (iterative: no recursion)."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False
