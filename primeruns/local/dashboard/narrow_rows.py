"""An episode's table row read off its JSON without decoding the whole record.

An evaluation's analysis reads every episode of the run for a handful of its
fields (``rows.record_row``): a 9 KB verifiers record decoded whole by orjson
took 20 of the 27 us of CPU its row cost, most of the first visit of a
20,000-episode run. A msgspec decoder of structs naming only those fields
skips the rest in C (7 us), and the row is made by the same ``record_row``
from a reduced record: plain dicts and lists holding exactly the keys it
reads, absent keys absent (19.5 us in all).

The row must be the one the whole record gives, so this answers only where it
can show that, and None everywhere else (the caller then decodes the record
whole, ``jsonbound.loads``, as before):

- bytes that are not UTF-8 (msgspec does not check the strings it skips;
  orjson and ``json`` refuse them: the record is not shown);
- anything msgspec refuses: not JSON, NaN, a number past the doubles, a lone
  surrogate, nesting past its limit (``json`` reads some of these, orjson
  none: read whole, the record gives what it always gave);
- an integer past orjson's 64 bits among the values read (orjson reads it as
  a float, msgspec as an int);
- a field of another shape than verifiers' (traces not a list of objects,
  agent or task or its data not an object) or a record ``record_row`` does
  not row (``sample_id``, no traces, no counts);
- msgspec not installed (it comes with the ``local`` extra).

``jsonbound.loads``' bounds are the caller's to check first.
"""

from __future__ import annotations

from typing import Any

import orjson

from .rows import record_row
from .views import SampleRow

try:
    import msgspec
except ImportError:  # pragma: no cover - the local extra brings it
    msgspec = None  # type: ignore[assignment]

if msgspec is not None:
    _UNSET: Any = msgspec.UNSET

    class _TaskData(msgspec.Struct):
        id: Any = _UNSET
        name: Any = _UNSET
        idx: Any = _UNSET

    class _Task(msgspec.Struct):
        data: _TaskData | None = _UNSET

    class _Agent(msgspec.Struct):
        trainable: Any = _UNSET

    class _Trace(msgspec.Struct):
        agent: _Agent | None = _UNSET
        rewards: Any = _UNSET
        task: _Task | None = _UNSET
        errors: Any = _UNSET

    class _Record(msgspec.Struct):
        sample_id: Any = _UNSET
        id: Any = _UNSET
        errors: Any = _UNSET
        num_input_tokens: Any = _UNSET
        num_output_tokens: Any = _UNSET
        traces: list[_Trace] = _UNSET

    _DECODER: Any = msgspec.json.Decoder(_Record)
else:  # pragma: no cover
    _DECODER = None


def _ints_fit(reduced: dict[str, Any]) -> bool:
    """Whether every integer in ``reduced`` is one orjson reads as an integer:
    orjson writes exactly those (and refuses others, as it refuses nesting
    past 255 levels: read whole then), in C (a walk in Python cost as much
    as the decoding saved on the rewards and errors)."""
    try:
        orjson.dumps(reduced)
    except orjson.JSONEncodeError:
        return False
    return True


def reduced_record(payload: bytes) -> dict[str, Any] | None:
    """The fields of the episode record in ``payload`` that ``record_row``
    reads, as the whole record holds them; None where that cannot be shown
    (see the module's docstring). ``payload`` must be within
    ``jsonbound.loads``' bounds (the caller's to check)."""
    if _DECODER is None:
        return None
    if not payload.isascii():
        try:  # msgspec does not check the strings it skips; json and orjson refuse such bytes
            payload.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        # As plain dicts and lists, the fields the JSON did not hold left out (C speed).
        reduced: dict[str, Any] = msgspec.to_builtins(_DECODER.decode(payload))
    except Exception:  # not JSON, another shape, too deep: the whole record says what
        return None
    if "sample_id" in reduced:
        return None
    return reduced if _ints_fit(reduced) else None


def narrow_row(index: int, payload: bytes) -> SampleRow | None:
    """``record_row(index, record)`` of the record in ``payload``, decoding only
    what it reads; None where the whole record must be decoded instead."""
    reduced = reduced_record(payload)
    return None if reduced is None else record_row(index, reduced)
