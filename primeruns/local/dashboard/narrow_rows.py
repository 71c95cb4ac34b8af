"""An episode's table row read off its JSON without decoding the whole record.

An evaluation's analysis reads every episode of the run for a handful of its
fields (``rows.record_row``): a 9 KB verifiers record decoded whole by orjson
took 20 of the 27 us of CPU its row cost, most of the first visit of a
20,000-episode run. A msgspec decoder of structs naming only those fields
skips the rest in C (7 us), and the row is read off those structs
(``_plain_row``) where the record is the usual one (no error, plain numbers
and texts), else made by the same ``record_row`` from a reduced record:
plain dicts and lists holding exactly the keys it reads, absent keys absent.

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

from ...projection import trace_reward
from ..traces_extract import number
from .rows import MAX_COUNT, record_row
from .views import SampleRow, sample_row_of

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


def _decoded(payload: bytes) -> Any:
    """The structs of the fields ``record_row`` reads; None where msgspec's
    reading cannot be shown to be the whole record's (see the module's
    docstring). ``payload`` must be within ``jsonbound.loads``' bounds."""
    if _DECODER is None:
        return None
    if not payload.isascii():
        try:  # msgspec does not check the strings it skips; json and orjson refuse such bytes
            payload.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        return _DECODER.decode(payload)
    except Exception:  # not JSON, another shape, too deep: the whole record says what
        return None


def _reduced(record: Any) -> dict[str, Any] | None:
    # As plain dicts and lists, the fields the JSON did not hold left out (C speed).
    reduced: dict[str, Any] = msgspec.to_builtins(record)
    if "sample_id" in reduced:
        return None
    return reduced if _ints_fit(reduced) else None


def reduced_record(payload: bytes) -> dict[str, Any] | None:
    """The fields of the episode record in ``payload`` that ``record_row``
    reads, as the whole record holds them; None where that cannot be shown
    (see the module's docstring). ``payload`` must be within
    ``jsonbound.loads``' bounds (the caller's to check)."""
    record = _decoded(payload)
    return None if record is None else _reduced(record)


#: orjson's integers (past them it reads a float, where msgspec reads an int).
_INT_LOW, _INT_HIGH = -(1 << 63), 1 << 64


def _plain(value: Any) -> bool:
    """Whether ``value`` is a float, or an integer both decoders read alike (not a bool)."""
    kind = type(value)
    return kind is float or (kind is int and _INT_LOW <= value < _INT_HIGH)


def _empty(errors: Any) -> bool:
    return errors is _UNSET or errors is None or (type(errors) is list and not errors)


def _plain_row(index: int, record: Any) -> SampleRow | None:
    """``record_row`` of the usual verifiers record, read off its structs: no
    error, both token counts, rewards of plain numbers, a text or an integer
    orjson reads alike for its id and task. None for any other record, which
    goes the general way (``_reduced``, then ``record_row``): the same row,
    where the structs made plain, checked by orjson and read by
    ``record_row`` were a quarter of a row's instructions."""
    if record.sample_id is not _UNSET or not _empty(record.errors):
        return None
    read, written = record.num_input_tokens, record.num_output_tokens
    if type(read) is not int or type(written) is not int:
        return None
    if not (0 <= read < MAX_COUNT and 0 <= written < MAX_COUNT):
        return None
    traces = record.traces
    if traces is _UNSET or not traces:
        return None
    summary = traces[0]  # the first trainable (``rows._trainable``), else the first
    for trace in traces:
        agent = trace.agent
        trainable = True if agent is None or agent is _UNSET else agent.trainable
        if trainable is _UNSET:
            trainable = True
        if type(trainable) is not bool:
            return None
        if trainable:
            summary = trace
            break
    if not _empty(summary.errors):
        return None
    rewards = summary.rewards
    if type(rewards) is dict:
        for reward in rewards.values():
            if reward is None:
                continue
            if type(reward) is not dict or not _plain(reward.get("score", "")):
                return None
            if not _plain(reward.get("weight", 1.0)):
                return None
    elif not (rewards is _UNSET or rewards is None):
        return None
    task, label = summary.task, None
    data = None if task is None or task is _UNSET else task.data
    if data is not None and data is not _UNSET:
        label = data.id or data.name or data.idx
        if label is _UNSET or label is None:
            label = None
        elif type(label) is not str and not (type(label) is int and _plain(label)):
            return None
    episode_id = record.id
    if episode_id is _UNSET or episode_id is None:
        episode_id = None
    elif type(episode_id) is not str and not (type(episode_id) is int and _plain(episode_id)):
        return None
    return sample_row_of(
        index,
        None if episode_id is None else str(episode_id),
        number(trace_reward({"rewards": rewards})),
        None,
        None if label is None else str(label),
        read,
        written,
        None,
    )


def narrow_row(index: int, payload: bytes) -> SampleRow | None:
    """``record_row(index, record)`` of the record in ``payload``, decoding only
    what it reads; None where the whole record must be decoded instead."""
    record = _decoded(payload)
    if record is None:
        return None
    row = _plain_row(index, record)
    if row is not None:
        return row
    reduced = _reduced(record)
    return None if reduced is None else record_row(index, reduced)
