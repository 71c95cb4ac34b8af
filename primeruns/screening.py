"""The screen a metrics row or a summary passes before it is encoded.

A metrics row (``log_metrics``) or a summary (``update_summary``,
``finish(summary=)``) is one record made of many independent fields. One bad
field must cost neither the others nor, under ``on_error="warn"``, an
exception in the producer's loop. So the screen keeps what can be journaled
and names each field it drops, with the fix; the recorder counts each in
``failed_records["encode"]`` and warns once per field.

A field is dropped when it is bytes, refers to itself (a cycle), has a key
that is not a ``str``, is nested past the encoder's limit, or is anything
else the encoder refuses; in a metrics row also when it is not a number
(``"high"``, a list, ``None``): the dashboard draws numbers only and drops a
curve with anything else in it, silently.

Two rules are not drops but the platform contract's cleaning (§6.5), silent
as ever: a non-finite number is left out, and so is a nested mapping left
empty (or empty to begin with). In a metrics row, numpy scalars, ``Decimal``
and 0-d arrays or tensors (anything with ``ndim == 0`` and ``item()``) are
numbers, taken as their Python value.

The common metrics row (str keys to ``int``, ``float`` or ``bool``) is one
loop over its items, on the hot path of ``log_metrics``; everything else
takes the full walk. The screen never raises, whatever it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, NamedTuple

from . import records
from .records import RecordEncodeError, field_path

__all__ = ["DEPTH_LIMIT", "Screened", "metrics_row", "plain_row", "summary"]

#: Deepest nesting kept: far below the encoder's own limit (254), deeper than
#: any real row or summary, and the walk (3 or 4 frames a level) stays far
#: from Python's recursion limit however deep the caller's own stack is.
DEPTH_LIMIT = 100

_DROP: Any = object()


class Screened(NamedTuple):
    """What to journal (a new dict), and one error per field left out. (A
    named tuple: a frozen dataclass costs more to make than screening a row.)"""

    kept: dict[str, Any]
    rejected: tuple[RecordEncodeError, ...] = ()


def metrics_row(values: Mapping[str, Any], *, what: str = "log_metrics") -> Screened:
    """``values`` as a metrics row: numbers only (nested groups of numbers too)."""
    flat = plain_row(values)
    if flat is not None:
        return Screened(flat)
    return _Screen(numbers_only=True).top(values, what)


def summary(values: Mapping[str, Any], *, what: str = "summary") -> Screened:
    """``values`` as a summary: any value the encoder takes, text included."""
    return _Screen(numbers_only=False).top(values, what)


def plain_row(values: Mapping[str, Any]) -> dict[str, Any] | None:
    """The common row (str keys to ``float``, ``int`` or ``bool``), copied
    without its non-finite numbers; None when it needs ``metrics_row``'s
    walk. Nothing can be dropped from such a row, so the recorder takes it
    from here, on every ``log_metrics`` call, without a ``Screened``."""
    out: dict[str, Any] = {}
    try:
        for key, value in values.items():
            kind = type(value)
            if type(key) is not str:
                return None
            if kind is float:
                if value - value == 0.0:  # finite: inf - inf and nan - nan are nan
                    out[key] = value
            elif kind is int or kind is bool:
                out[key] = value
            else:
                return None
    except Exception:  # a mapping whose items() raises: the walk names it
        return None
    return out


def _kind(value: Any) -> str:
    kind = type(value)
    if kind.__module__ == "builtins":
        return f"a {kind.__qualname__}"
    return f"a {kind.__module__}.{kind.__qualname__}"


def _key_text(key: Any) -> str:
    try:
        text = repr(key)
    except Exception:
        return f"<{type(key).__name__}>"
    return text if len(text) <= 40 else f"{text[:37]}..."


def _is_finite(number: float) -> bool:
    return number - number == 0.0


class _Screen:
    """One screening: the fields dropped so far, and the containers being
    walked (meeting one again is a cycle)."""

    def __init__(self, *, numbers_only: bool) -> None:
        self.numbers_only = numbers_only
        self.rejected: list[RecordEncodeError] = []
        self._open: set[int] = set()

    def top(self, values: Mapping[str, Any], what: str) -> Screened:
        kept = self.mapping(values, what, 0)
        return Screened(kept if isinstance(kept, dict) else {}, tuple(self.rejected))

    def drop(self, path: str, reason: str, fix: str) -> Any:
        self.rejected.append(RecordEncodeError(path, reason, fix))
        return _DROP

    def enter(self, value: Any, path: str, depth: int) -> bool:
        """Whether ``value`` (a container) may be walked; if not, it is dropped."""
        if id(value) in self._open:
            self.drop(
                path, "it refers to itself (a cycle)", "log a copy without the back reference"
            )
            return False
        if depth >= DEPTH_LIMIT:
            self.drop(path, f"nested more than {DEPTH_LIMIT} levels deep", "flatten the value")
            return False
        self._open.add(id(value))
        return True

    def mapping(self, values: Mapping[Any, Any], path: str, depth: int) -> Any:
        if not self.enter(values, path, depth):
            return _DROP
        try:
            try:
                items = list(values.items())
            except Exception as exc:
                return self.drop(
                    path, f"reading it raised {type(exc).__name__}", "pass a plain dict"
                )
            out: dict[str, Any] = {}
            for key, item in items:
                if not isinstance(key, str):
                    self.drop(
                        f"{path}[{_key_text(key)}]",
                        f"a key of type {type(key).__name__}",
                        "use str keys",
                    )
                    continue
                kind = type(item)
                if kind is float or kind is int or kind is bool:  # most fields: no call
                    if kind is not float or _is_finite(item):
                        out[key] = item
                    continue
                kept = self.guarded(item, field_path(path, key), depth + 1)
                # An emptied (or empty) nested mapping says nothing: left out too.
                if kept is _DROP or (type(kept) is dict and not kept):
                    continue
                out[key] = kept
            return out
        finally:
            self._open.discard(id(values))

    def guarded(self, value: Any, path: str, depth: int) -> Any:
        """``value`` screened; whatever a user's object raises drops it alone."""
        try:
            return self.value(value, path, depth)
        except Exception as exc:
            return self.drop(
                path,
                f"checking {_kind(value)} raised {type(exc).__name__}",
                "convert it to str, a number, a list or a dict before logging",
            )

    def value(self, value: Any, path: str, depth: int) -> Any:
        kind = type(value)
        if kind is float:
            return value if _is_finite(value) else _DROP
        if kind is int or kind is bool:
            return value
        if isinstance(value, Mapping):
            return self.mapping(value, path, depth)
        if self.numbers_only:
            return self.number(value, path)
        return self.anything(value, path, depth)

    def number(self, value: Any, path: str) -> Any:
        if isinstance(value, int):  # bool and IntEnum too
            return value
        if isinstance(value, float):
            return float(value) if _is_finite(value) else _DROP
        if isinstance(value, Decimal):
            return float(value) if value.is_finite() else _DROP
        if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
            try:
                item = value.item()  # numpy scalars, 0-d arrays and tensors
            except Exception:
                item = None
            if isinstance(item, int | float) and not isinstance(value, str | bytes):
                return item if not isinstance(item, float) or _is_finite(item) else _DROP
        return self.drop(path, *_not_a_number(value))

    def anything(self, value: Any, path: str, depth: int) -> Any:
        if value is None or isinstance(value, str | int):
            return value
        if isinstance(value, float):
            return value if _is_finite(value) else _DROP
        if isinstance(value, list | tuple):
            if not self.enter(value, path, depth):
                return _DROP
            try:
                out = []
                dropped = len(self.rejected)
                for index, item in enumerate(value):
                    kept = self.guarded(item, f"{path}[{index}]", depth + 1)
                    if kept is not _DROP:
                        out.append(kept)
                # A list emptied by what was dropped from it is left out with it.
                return _DROP if not out and len(self.rejected) > dropped else out
            finally:
                self._open.discard(id(value))
        if isinstance(value, Decimal) and not value.is_finite():
            return _DROP
        try:
            # +2: the finish entry holds the summary two levels down.
            native = records.json_native(value, what=path, depth=depth + 2)
        except RecordEncodeError as exc:
            self.rejected.append(exc)
            return _DROP
        except Exception as exc:  # a model_dump() or property of the user's that raised
            return self.drop(
                path,
                f"converting {_kind(value)} raised {type(exc).__name__}",
                "convert it to str, a number, a list or a dict before logging",
            )
        # The value as given (a datetime stays one in run.summary); a non-finite
        # scalar (numpy, Decimal) is left out as a float would be.
        return _DROP if native is None else value


def _not_a_number(value: Any) -> tuple[str, str]:
    """Why a metric value is refused, and the fix, without the value itself
    (a metric's text could be anything, a secret included)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return (
            "it is bytes, not a number (and bytes are not JSON)",
            "log a number; decode text to str and put it in the summary or the config",
        )
    if isinstance(value, str):
        return (
            "it is text, not a number: the dashboard draws numbers only",
            "log a number (float(x)); put text in run.update_summary() or the config",
        )
    if value is None:
        return ("it is None, not a number", "leave the key out of the row when it has no value")
    if isinstance(value, list | tuple | set | frozenset) or bool(getattr(value, "ndim", None)):
        return (
            f"it is {_kind(value)}, not a number",
            "log one number per key (its mean, or one key per element)",
        )
    return (f"it is {_kind(value)}, not a number", "convert it with float() before logging")
