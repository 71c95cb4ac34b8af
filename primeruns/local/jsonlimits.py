"""JSON from a request, with its nesting depth bounded.

``json.loads`` recurses once per level: a body of 100,000 ``[`` raised
``RecursionError`` (not ``ValueError``), which the routes did not expect, so
the answer was a 500 and a traceback in the log. A value that parsed just
under the interpreter's limit would fail later instead, when rendered or
re-encoded. Every request body is read through :func:`loads` here, which
refuses more than :data:`MAX_DEPTH` levels with a ``ValueError`` naming it:
the routes' existing ``except ValueError`` turns it into their 400/422.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

#: Levels of arrays and objects a request's JSON may nest. Honest configs,
#: samples and traces (tool schemas included) stay far below it.
MAX_DEPTH = 100


class TooDeep(ValueError):
    """JSON nested deeper than :data:`MAX_DEPTH`."""

    def __init__(self) -> None:
        super().__init__(f"JSON nests deeper than the limit of {MAX_DEPTH} levels")


def loads(data: bytes | str, *, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``json.loads(data)``; raises ValueError (TooDeep beyond MAX_DEPTH)."""
    try:
        value = json.loads(data, parse_constant=parse_constant)
    except RecursionError:
        raise TooDeep() from None
    # Counting brackets runs at C speed; only a body with more of them than the
    # limit (most large ones) needs the walk over its parsed containers.
    if isinstance(data, bytes):
        opened = data.count(b"[") + data.count(b"{")
    else:
        opened = data.count("[") + data.count("{")
    if opened > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
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
