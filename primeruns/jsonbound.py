"""JSON read from a journal for showing it, with its size and depth bounded.

A journal is data anyone with write access to the runs directory could have
shaped: an entry of 128 MiB that compresses to a few KB, arrays nested
200,000 levels deep, objects of millions of keys. Decoded whole and kept,
they took the offline dashboard to gigabytes. What is *shown* of a record
never needs all of it, so readers that show records go through here:

- :func:`loads` decodes at most ``max_bytes`` of JSON and turns every failure
  (nesting past the decoder's limit included, which ``json`` raises as
  ``RecursionError``) into ``ValueError``;
- :func:`clip` returns a copy bounded in depth, items, string length and
  total size, with a visible marker (``[clipped: ...]``) wherever something
  was left out, so a page says what it does not show rather than hiding it;
- :func:`finite_number` takes a number read from such JSON as a float only
  where one can be: ``json`` reads NaN, Infinity and integers of any length.

Shipping never goes through here: it sends records byte for byte.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["MARK", "MAX_VALUES", "Bounds", "clip", "finite_number", "loads", "marker"]

#: The word every marker starts with (pages and tests look for it).
MARK = "[clipped:"


@dataclass(frozen=True)
class Bounds:
    """How much of one value is kept."""

    #: Levels of arrays and objects kept; deeper ones become a marker.
    depth: int = 32
    #: Items kept per array or object.
    items: int = 1_000
    #: Characters kept per string (keys: at most 1,024).
    chars: int = 64 << 10
    #: Characters and items kept in the whole value (a rough size).
    total: int = 1 << 20


DEFAULT = Bounds()


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, or None if it is not a (non-bool) finite
    number: NaN (which compares false to everything), an infinity, or an
    integer past the floats (an OverflowError, not a value)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        as_float = float(value)
    except OverflowError:
        return None
    return as_float if math.isfinite(as_float) else None


def marker(what: str) -> str:
    return f"{MARK} {what}]"


#: Values (containers and scalars) ``loads`` decodes at most: what a decoded
#: value costs is ~60 bytes a value plus its text, so this caps one at ~60 MB
#: whatever its length (2 MiB of ``[{},{},...]`` is 700,000 objects).
MAX_VALUES = 1_000_000


def loads(payload: bytes | memoryview, max_bytes: int, max_values: int = MAX_VALUES) -> Any:
    """The JSON value in ``payload``; ValueError if it is longer than
    ``max_bytes``, holds more than about ``max_values`` values (counted by
    its separators, at C speed, before decoding), is not JSON, or is nested
    past the decoder's limit."""
    if len(payload) > max_bytes:
        raise ValueError(f"{len(payload)} bytes of JSON, over the {max_bytes}-byte limit shown")
    data = bytes(payload)
    # Each value but the first follows a comma, or opens a container; commas
    # and brackets inside strings count too, so this overestimates, never under.
    # Each is a byte: JSON no longer than max_values cannot hold more, and is
    # not counted (three passes over every episode were a fifth of reading a
    # run's episodes for its analysis).
    if len(data) > max_values:
        values = data.count(b",") + data.count(b"[") + data.count(b"{")
        if values > max_values:
            raise ValueError(f"JSON of about {values} values, over the {max_values} shown")
    try:
        return orjson.loads(data)  # bounded nesting (1,024), no recursion into Python
    except orjson.JSONDecodeError:
        # What orjson refuses and json takes (NaN, Infinity, a number past the
        # doubles), or not JSON. (An integer past 64 bits but within the
        # doubles orjson reads as a float: such a value is shown rounded.)
        pass
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested past the decoder's limit") from None


class _Budget:
    def __init__(self, total: int) -> None:
        self.left = total


def clip(value: Any, bounds: Bounds = DEFAULT) -> Any:
    """A copy of the decoded JSON ``value`` within ``bounds``, markers where cut."""
    return _clip(value, bounds, 0, _Budget(bounds.total))


def _clip(value: Any, bounds: Bounds, depth: int, budget: _Budget) -> Any:
    if budget.left <= 0:
        return marker("the rest of this record is over the size shown")
    if isinstance(value, str):
        return _text(value, min(bounds.chars, max(budget.left, 0)), budget)
    if not isinstance(value, dict | list):
        budget.left -= 1
        return value
    if depth >= bounds.depth:
        budget.left -= 1
        return marker(f"nested deeper than {bounds.depth} levels")
    if isinstance(value, list):
        items: list[Any] = []
        for index, item in enumerate(value):
            if index >= bounds.items or budget.left <= 0:
                items.append(marker(f"{len(value) - index} more items"))
                break
            budget.left -= 1
            items.append(_clip(item, bounds, depth + 1, budget))
        return items
    out: dict[str, Any] = {}
    for index, (key, item) in enumerate(value.items()):
        if index >= bounds.items or budget.left <= 0:
            out[MARK] = f"{len(value) - index} more keys]"
            break
        budget.left -= 1
        shown = _text(str(key), min(bounds.chars, 1024), budget)
        out[shown] = _clip(item, bounds, depth + 1, budget)
    return out


def _text(text: str, limit: int, budget: _Budget) -> str:
    budget.left -= min(len(text), limit)
    if len(text) <= limit:
        return text
    return text[:limit] + " " + marker(f"{len(text) - limit} more characters")
