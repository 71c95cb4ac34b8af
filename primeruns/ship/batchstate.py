"""A recorded batch's state as the journal keeps it, and back: the one place
that knows the stored form.

The journal is a generic log: it keeps a batch's state as one JSON object
(``InFlight.state``), merged key by key as the batch moves on. The shipper's
keys (``last_seq``, ``records``, ``carry``, ``counters``, ``set_apart``) and the sink's
progress fields (one key each, by field name) share that object, as they
always have, so journals written by earlier versions resume here and the
ones written here resume there, but for one case: a batch made again
without records that repeat an id (``set_apart``) is resumed by a version
older than that key as if it had never held them, so those records are
neither sent nor counted there. Counting them at the refusal instead
would count them twice when the batch is resumed here.

A progress field with a default is left out of a new batch's record while it
is at its default (a presigned ``key`` not minted yet, an evaluation batch
not ``attempted`` yet): those keys were always absent until set, and a
missing one reads as its default. A field without a default (``done``, an
idempotency key) is always recorded, and missing is damage.

The state comes from a file that may be damaged or written by another tool,
so it is checked, not trusted: a key missing or of the wrong JSON type raises
:class:`BadState` (not a TypeError from deep inside a sink's send), and the
shipper counts that batch as failed rather than guess how far it got.
"""

from __future__ import annotations

import dataclasses
import reprlib
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from ..journal import InFlight
from ..sinks.base import Prepared
from . import ledger

__all__ = [
    "BadState",
    "apart_of",
    "apart_to_journal",
    "bounded_why",
    "carry_before",
    "carry_of",
    "changes",
    "from_journal",
    "records_of",
    "to_journal",
]

P = TypeVar("P")

# The shipper's own keys; a sink's progress field may not take one of them.
_SHIPPER_KEYS = frozenset({"last_seq", "records", "carry", "carry_before", "counters", "set_apart"})


class BadState(ValueError):
    """A recorded batch's state this version cannot read."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the batch recorded in the journal is damaged: {what}")


def to_journal(
    prepared: Prepared[Any], last_seq: int, *, carry_before: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The state to record with a new batch that ends at ``last_seq``.
    ``carry_before``: the sink's carry before this batch, which it goes back
    to if the batch is refused whole and its records are sent anew."""
    progress = prepared.progress
    state = {
        f.name: _stored(getattr(progress, f.name))
        for f, _ in _fields(type(progress))
        if f.default is dataclasses.MISSING or getattr(progress, f.name) != f.default
    }
    if prepared.carry is not None:
        state["carry"] = dict(prepared.carry)
        if carry_before is not None:
            state["carry_before"] = dict(carry_before)
    if prepared.counters:
        state["counters"] = dict(prepared.counters)
    state["last_seq"] = last_seq
    state["records"] = prepared.records
    return state


def changes(old: Any, new: Any) -> dict[str, Any]:
    """The keys to merge into a recorded state whose progress goes from
    ``old`` to ``new``: the fields that changed (none: nothing to write)."""
    if type(new) is not type(old):
        raise TypeError(f"progress {type(old).__name__} replaced by a {type(new).__name__}")
    return {
        f.name: _stored(getattr(new, f.name))
        for f, _ in _fields(type(new))
        if getattr(new, f.name) != getattr(old, f.name)
    }


def from_journal(inflight: InFlight, progress_type: type[P]) -> Prepared[P]:
    """A recorded batch as typed values; :class:`BadState` if its state is damaged."""
    state = inflight.state
    records = _records(state)
    counters = state.get("counters", {})
    if not isinstance(counters, dict):
        raise BadState(f"'counters' cannot be {reprlib.repr(counters)}")
    values = {
        f.name: _read(state, f.name, hint)
        for f, hint in _fields(progress_type)
        if f.name in state or f.default is dataclasses.MISSING
    }
    return Prepared(
        body=inflight.body,
        records=records,
        progress=progress_type(**values),
        last_seq=inflight.last_seq,
        carry=carry_of(state),
        counters={str(k): _value(v, int, "counters") for k, v in counters.items()},
    )


def apart_to_journal(records: int, why: BaseException) -> dict[str, Any]:
    """The state that says a batch passes over ``records`` records set apart
    for ``why`` (the service's refusal of the batch they were in): counted
    as failed with the batch's acknowledgement, whichever process makes it."""
    return {"set_apart": {"records": records, **_said(why)}}


def bounded_why(why: BaseException) -> BaseException:
    """``why`` as a batch's state keeps it (``apart_to_journal``): its class,
    status and code, its message cut at ``_WHY_CHARS``; so the records set
    apart are counted with the same reason whichever process counts them."""
    return ledger.error_from_record(_said(why))


# A refusal's message is the server's text, as long as it made it: what of it
# is kept with a batch, and said with the records it cost.
_WHY_CHARS = 4096


def _said(why: BaseException) -> dict[str, Any]:
    said: dict[str, Any] = {"type": type(why).__name__, "message": str(why)[:_WHY_CHARS]}
    for name in ("status_code", "code"):
        value = getattr(why, name, None)
        if isinstance(value, int | str) and not isinstance(value, bool):
            said[name] = value[:_WHY_CHARS] if isinstance(value, str) else value
    return said


def apart_of(state: Mapping[str, Any], records: int) -> tuple[int, BaseException] | None:
    """How many of a recorded batch's ``records`` were set apart, and why
    (``apart_to_journal``); None if none. :class:`BadState` if that part of
    the state is damaged: never more than the batch, never fewer than one."""
    said = state.get("set_apart")
    if said is None:
        return None
    if not isinstance(said, dict):
        raise BadState(f"'set_apart' cannot be {reprlib.repr(said)}")
    count = _value(said.get("records"), int, "set_apart")
    if not 1 <= count <= records:
        raise BadState(f"'set_apart' cannot be {count} of {records} records")
    # An unknown class (or none) comes back as an APIError naming it.
    return count, ledger.error_from_record(said)


def records_of(state: Mapping[str, Any]) -> int | None:
    """The records a recorded batch holds, where its state still says (None:
    that count is damaged too): what a batch whose progress is damaged loses."""
    try:
        return _records(state)
    except BadState:
        return None


def _records(state: Mapping[str, Any]) -> int:
    records = _read(state, "records", int)
    if records < 0:
        raise BadState(f"'records' cannot be {records}")
    return int(records)


def carry_before(state: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """What a recorded batch's sink carried before it (``{}``: it started
    afresh); None when not recorded (the sink carries nothing, or an earlier
    version recorded the batch: its carry then stays as it is)."""
    before = state.get("carry_before")
    return before if isinstance(before, dict) else None


def carry_of(state: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """What a recorded batch carries for the batches after it, if anything."""
    carry = state.get("carry")
    return carry if isinstance(carry, dict) else None


def _fields(progress_type: type[Any]) -> list[tuple[dataclasses.Field[Any], Any]]:
    """A progress dataclass's fields with their types, resolved (the sinks'
    annotations are strings): worked out once per type."""
    found = _FIELDS.get(progress_type)
    if found is None:
        fields = dataclasses.fields(progress_type)
        clash = _SHIPPER_KEYS & {f.name for f in fields}
        if clash:
            raise TypeError(f"{progress_type.__name__} has fields the shipper records: {clash}")
        hints = typing.get_type_hints(progress_type)
        found = _FIELDS[progress_type] = [(f, hints[f.name]) for f in fields]
    return found


_FIELDS: dict[type[Any], list[tuple[dataclasses.Field[Any], Any]]] = {}


def _stored(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _read(state: Mapping[str, Any], name: str, hint: Any) -> Any:
    if name not in state:
        raise BadState(f"{name!r} is missing")
    return _value(state[name], hint, name)


def _value(value: Any, hint: Any, name: str) -> Any:
    """``value`` as the JSON of a field of type ``hint`` (int, bool, str,
    None, unions of them, ``tuple[X, ...]``), or :class:`BadState`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _value(value, option, name)
            except BadState:
                continue
    elif origin is tuple:
        if isinstance(value, list):
            return tuple(_value(item, typing.get_args(hint)[0], name) for item in value)
    # bool is an int to isinstance, but a count of true is damage all the same.
    elif isinstance(value, hint) and (hint is bool or not isinstance(value, bool)):
        return value
    raise BadState(f"{name!r} cannot be {reprlib.repr(value)}")
