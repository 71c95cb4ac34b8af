"""Producer records to compact JSON bytes: the one encoder every ``log_*`` call uses.

This SDK journals each record as the JSON of its mapping (``to_record()`` output,
or the mapping the producer gave), and every sink later works from that mapping.
So this module decides, once and in one place, what a record *is* on the wire:

- ``to_mapping`` turns a producer object into its mapping (``to_record()``, a
  mapping as-is, a pydantic v2 model, an attrs or dataclass instance).
- ``encode_record`` turns that mapping into compact UTF-8 JSON. It is on the hot
  path of ``log_episodes``, so the common case is one ``orjson.dumps`` call; only
  when that fails does a slow, path-tracking walk run, which either repairs the
  value (big ints, lone surrogates, sets, int keys, ...) or raises
  ``RecordEncodeError`` naming the exact field and the fix.
- ``encode_json`` is the same encoder for platform request bodies, which must not
  carry NaN (the platform answers an opaque 400): it refuses it locally.
- ``clean_metrics``, ``stamp_run``, ``is_episode`` and ``training_step`` are the
  small record rules the platform's services expect: no non-finite number in
  a metrics row, the platform run in every trace's own ``run`` block, and the
  training step an episode is filed under.

Decisions where the platform's clients say nothing:

- Non-finite floats inside *records* become ``null`` (the traces service refuses
  NaN, and JSON has none); in request bodies they are an error instead.
- Text that is not valid Unicode (lone surrogates, e.g. from
  ``surrogateescape``-decoded bytes) is repaired: valid surrogate pairs are
  joined, lone ones become U+FFFD, and one ``RecordRepairWarning`` per record
  names the first repaired field. Dropping the record for one bad character
  would lose far more than the character.
- ``Decimal`` becomes a JSON number through ``float`` (metrics are read as
  floats); a non-finite ``Decimal`` follows the float rule.
- ``bytes`` are refused: there is no one obviously right text form for them.
- Sets become lists, sorted when their items are mutually comparable, so equal
  sets always encode to equal bytes.

This module imports neither numpy nor pydantic: values of those types are
recognised by duck typing, so a producer that never uses them never pays for them.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import json
import math
import uuid
import warnings
from collections.abc import Mapping
from decimal import Decimal
from pathlib import PurePath
from typing import Any

import orjson

__all__ = [
    "MAX_DEPTH",
    "RecordEncodeError",
    "RecordRepairWarning",
    "clean_metrics",
    "encode_json",
    "encode_parsed",
    "encode_record",
    "field_path",
    "is_episode",
    "json_native",
    "stamp_run",
    "to_mapping",
    "training_step",
]

#: Deepest nesting accepted. Equal to orjson's own limit, so the fast and the
#: slow path accept the same records (a self-referencing value hits it too).
MAX_DEPTH = 254

_FAST_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_RETRY_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


class RecordEncodeError(TypeError):
    """A record (or one field inside it) cannot be turned into JSON.

    ``path`` names the field (``"episodes[3].traces[0].metrics.loss"``), ``reason``
    says what is wrong with it. A ``TypeError`` so that callers (and
    ``is_record_rejection``) treat it as a problem of this record only.
    """

    def __init__(self, path: str, reason: str, fix: str = "") -> None:
        self.path = path
        self.reason = reason
        # A self-referencing value has an absurdly long path: keep the message short.
        shown = path if len(path) <= 160 else f"{path[:70]}...{path[-70:]}"
        message = f"cannot encode {shown}: {reason}"
        if fix:
            message += f"; {fix}"
        super().__init__(message)


class RecordRepairWarning(UserWarning):
    """A record was encoded after a lossy repair (e.g. invalid Unicode replaced)."""


# --------------------------------------------------------------------------- mapping


def _is_pydantic_model(obj: Any) -> bool:
    # Pydantic v2 models carry ``__pydantic_fields__`` on the class; checked by
    # duck typing so that pydantic is never imported here.
    return hasattr(type(obj), "__pydantic_fields__") and callable(getattr(obj, "model_dump", None))


def _is_attrs_instance(obj: Any) -> bool:
    return not isinstance(obj, type) and hasattr(type(obj), "__attrs_attrs__")


def _is_dataclass_instance(obj: Any) -> bool:
    return not isinstance(obj, type) and dataclasses.is_dataclass(obj)


_converter: Any = None


def _unstructure(obj: Any) -> Any:
    """attrs/dataclass instance to builtins through cattrs (imported on first use).

    cattrs unstructures deeply and can trip on what it meets inside (a tuple
    turned list as a dict key, say); then the instance's own fields are taken
    one level deep, and the encoder walks (and names) whatever is inside them.
    """
    global _converter
    if _converter is None:
        import cattrs

        _converter = cattrs.Converter()
    try:
        return _converter.unstructure(obj)
    except Exception:
        if _is_attrs_instance(obj):
            names = [field.name for field in type(obj).__attrs_attrs__]
        else:
            names = [field.name for field in dataclasses.fields(obj)]
        return {name: getattr(obj, name) for name in names}


def to_mapping(obj: Any, *, what: str) -> Mapping[str, Any]:
    """The mapping that represents ``obj`` on the wire.

    Takes, in this order: an object with a callable ``to_record()`` (its result),
    a ``Mapping`` (as-is, not copied), a pydantic v2 model
    (``model_dump(mode="json")``), an attrs or dataclass instance (cattrs
    unstructure). ``what`` names the record in errors (``"episodes[3]"``).

    Raises ``RecordEncodeError`` for anything else, for a ``to_record()`` that
    raises (wrapped, with the original as ``__cause__``) or that returns
    something other than a mapping.
    """
    if type(obj) is dict:  # the common record, which has no to_record()
        return obj
    to_record = getattr(obj, "to_record", None)
    if callable(to_record) and not isinstance(obj, Mapping):
        try:
            value = to_record()
        except Exception as exc:
            raise RecordEncodeError(
                what,
                f"{type(obj).__name__}.to_record() raised {type(exc).__name__}: {exc}",
                "fix the producer object or log its mapping instead",
            ) from exc
        if not isinstance(value, Mapping):
            raise RecordEncodeError(
                what,
                f"{type(obj).__name__}.to_record() returned {type(value).__name__}, not a mapping",
                "to_record() must return a dict",
            )
        return value
    if isinstance(obj, Mapping):
        return obj
    if _is_pydantic_model(obj):
        dumped = obj.model_dump(mode="json")
        if isinstance(dumped, Mapping):
            return dumped
    elif _is_attrs_instance(obj) or _is_dataclass_instance(obj):
        unstructured = _unstructure(obj)
        if isinstance(unstructured, Mapping):
            return unstructured
    raise RecordEncodeError(
        what,
        f"a {type(obj).__name__} is not a record",
        "log a mapping, an object with to_record(), a pydantic model, "
        "or an attrs/dataclass instance",
    )


# --------------------------------------------------------------------------- encoding


def _is_numpy(value: Any) -> bool:
    return type(value).__module__ == "numpy"


def _sorted_if_possible(items: Any) -> list[Any]:
    values = list(items)
    try:
        return sorted(values)
    except TypeError:
        return values


def _decimal_to_float(value: Decimal) -> float:
    if value.is_finite():
        return float(value)
    # float() refuses a signalling NaN; every non-finite Decimal follows the float rule.
    return math.nan if value.is_nan() else float(value)


def _fast_default(value: Any) -> Any:
    """orjson's hook for types it does not know; anything doubtful raises, and
    the slow path then finds and names the field."""
    if isinstance(value, set | frozenset):
        return _sorted_if_possible(value)
    if isinstance(value, Decimal):
        return _decimal_to_float(value)
    if isinstance(value, PurePath):
        return str(value)
    if _is_numpy(value):
        if hasattr(value, "tolist"):
            return value.tolist()
    elif _is_pydantic_model(value):
        return value.model_dump(mode="json")
    elif _is_attrs_instance(value):
        return _unstructure(value)
    raise TypeError(type(value).__name__)


_SCALARS = (str, int, float, bool, type(None))


def field_path(path: str, key: str) -> str:
    """``path`` and ``key`` as a field name in messages (``a.b`` or ``a["b c"]``)."""
    if key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=True)}]"


class _Walker:
    """The slow path: a copy of a value made of JSON-native builtins only,
    with the path of every field at hand for errors and warnings."""

    def __init__(self, *, finite: bool) -> None:
        # True: a non-finite float is an error (request bodies); False: null.
        self.finite = finite
        self.big_ints = False
        self.repaired: list[str] = []

    def text(self, value: str, path: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            self.repaired.append(path)
            # UTF-16 round trip joins split surrogate pairs; lone ones become U+FFFD.
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value

    def key(self, key: Any, path: str) -> str:
        if isinstance(key, str):
            return self.text(key, path)
        if isinstance(key, enum.Enum):
            return self.key(key.value, path)
        if key is None or isinstance(key, bool):
            return "null" if key is None else ("true" if key else "false")
        if isinstance(key, int | float) or _is_numpy(key):
            return self.key(json.dumps(self.value(key, path, 0)), path)
        if isinstance(key, uuid.UUID | _dt.date | _dt.time):
            return str(key) if isinstance(key, uuid.UUID) else key.isoformat()
        raise RecordEncodeError(
            path, f"a dict key of type {type(key).__name__}", "use str (or int) keys"
        )

    def value(self, value: Any, path: str, depth: int) -> Any:
        # ``depth`` counts the containers above ``value``: orjson takes at most
        # MAX_DEPTH of them, so a container may not start at that depth.
        if depth > MAX_DEPTH or (depth == MAX_DEPTH and not isinstance(value, _SCALARS)):
            raise RecordEncodeError(
                path,
                f"nested more than {MAX_DEPTH} levels deep (or refers to itself)",
                "flatten the value",
            )
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str):
            return self.text(value, path)
        if isinstance(value, int):
            if not -(2**63) <= value < 2**64:
                self.big_ints = True
            return int(value)
        if isinstance(value, float):
            return self.number(float(value), path)
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for key, item in value.items():
                name = self.key(key, path)
                child = field_path(path, name)
                if name in out:
                    raise RecordEncodeError(
                        child, "two keys encode to the same text", "use distinct keys"
                    )
                out[name] = self.value(item, child, depth + 1)
            return out
        if isinstance(value, list | tuple):
            return [self.value(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
        if isinstance(value, set | frozenset):
            items = _sorted_if_possible(value)
            return [self.value(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(items)]
        if isinstance(value, enum.Enum):
            return self.value(value.value, path, depth + 1)
        if isinstance(value, _dt.datetime | _dt.date | _dt.time):
            return value.isoformat()
        if isinstance(value, uuid.UUID):
            return str(value)
        if isinstance(value, Decimal):
            return self.number(_decimal_to_float(value), path)
        if isinstance(value, PurePath):
            return self.text(str(value), path)
        if _is_numpy(value) and hasattr(value, "tolist"):
            return self.value(value.tolist(), path, depth + 1)
        if isinstance(value, bytes | bytearray | memoryview):
            raise RecordEncodeError(
                path, "bytes are not JSON", "decode them to str (or base64-encode them)"
            )
        to_record = getattr(value, "to_record", None)
        if (
            callable(to_record)
            or _is_pydantic_model(value)
            or _is_attrs_instance(value)
            or _is_dataclass_instance(value)
        ):
            return self.value(to_mapping(value, what=path), path, depth + 1)
        raise RecordEncodeError(
            path,
            f"a {type(value).__module__}.{type(value).__qualname__} is not JSON",
            "convert it to str, a number, a list or a dict before logging",
        )

    def number(self, value: float, path: str) -> float | None:
        if math.isfinite(value):
            return value
        if self.finite:
            raise ValueError(f"{path} is {value!r}: NaN and infinity are not valid JSON")
        return None

    def dumps(self, value: Any) -> bytes:
        if self.repaired:
            more = len(self.repaired) - 1
            warnings.warn(
                f"{self.repaired[0]} held text that is not valid Unicode "
                f"(lone surrogates){f' (and {more} more fields)' if more else ''}; "
                "replaced with U+FFFD",
                RecordRepairWarning,
                stacklevel=4,
            )
        if self.big_ints:
            # orjson stops at 64 bits; the stdlib keeps any int exact.
            return json.dumps(
                value, ensure_ascii=False, allow_nan=False, separators=(",", ":")
            ).encode("utf-8")
        return orjson.dumps(value)


#: The steps a training step may be: the platform keeps them as 64-bit
#: signed integers (its metrics rows, the Parquet tables' ``step`` column),
#: as does the table merging a step's rows on this host (SQLite's INTEGER).
#: A step beyond them was never stored: its row held back every row logged
#: after it, each attempt failing the same way.
LAST_STEP = (1 << 63) - 1
FIRST_STEP = -LAST_STEP - 1


def step_out_of_range(what: str, step: int) -> str:
    """The message for an integer step the platform cannot keep."""
    return (
        f"{what} is {step}, outside the steps the platform keeps: "
        f"use an integer from -2**63 to 2**63 - 1 ({FIRST_STEP} to {LAST_STEP})"
    )


def encode_record(obj: Any, *, what: str = "record") -> bytes:
    """Compact UTF-8 JSON of ``to_mapping(obj)``: the bytes the journal stores.

    Encodes numpy scalars and arrays, datetimes (ISO 8601), enums (their value),
    tuples and sets (lists), ``Decimal``, ``UUID``, paths, nested pydantic /
    attrs / dataclass / ``to_record()`` objects and int dict keys (as strings).
    Non-finite floats become ``null``; ints beyond 64 bits stay exact; invalid
    Unicode is repaired (see the module docstring) with a ``RecordRepairWarning``.

    Raises ``RecordEncodeError`` (a ``TypeError``) naming the field, prefixed by
    ``what``, for anything else. Pure function: thread-safe, no I/O.
    """
    mapping = to_mapping(obj, what=what)
    try:
        return orjson.dumps(mapping, default=_fast_default, option=_FAST_OPTIONS)
    except TypeError:
        pass
    walker = _Walker(finite=False)
    return walker.dumps(walker.value(mapping, what, 0))


def json_native(value: Any, *, what: str, depth: int = 0) -> Any:
    """``value`` as JSON-native builtins, by the rules of ``encode_record``
    (a non-finite float becomes None), or ``RecordEncodeError`` naming the
    field, prefixed by ``what``. Any value is accepted, not only a mapping;
    ``depth`` counts the containers it will stand in."""
    return _Walker(finite=False).value(value, what, depth)


_PLAIN_SCALARS = (str, int, bool, type(None))


#: Where a value sits, for the message naming it: the top's name, or (where
#: its container sits, its key or index). Built as the walk goes (a tuple a
#: level), rendered only for a message (``_named``): a field name formatted
#: for every key was most of a metrics row's encoding.
_Where = str | tuple[Any, str | int]


def _named(where: _Where) -> str:
    """``where`` as a field name in messages (``body.metrics["a b"][2]``)."""
    if isinstance(where, str):
        return where
    parent, key = where
    base = _named(parent)
    return field_path(base, key) if isinstance(key, str) else f"{base}[{key}]"


def _plain_and_finite(value: Any, where: _Where, depth: int = 0) -> bool:
    """Whether ``value`` is made of builtin JSON types only (dict with str
    keys, list, str, int, float, bool, None), which orjson encodes exactly.

    Raises ``ValueError`` naming the first non-finite float. Anything else
    (numpy, ``Decimal``, tuples, objects...) answers False: the slow walk then
    converts it and checks what it converts.
    """
    kind = type(value)
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"{_named(where)} is {value!r}: NaN and infinity are not valid JSON")
        return True
    if kind in _PLAIN_SCALARS:
        return True
    if depth >= MAX_DEPTH:
        return False
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return False
            if not _plain_and_finite(item, (where, key), depth + 1):
                return False
        return True
    if kind is list:
        for index, item in enumerate(value):
            if not _plain_and_finite(item, (where, index), depth + 1):
                return False
        return True
    return False


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON for a platform request body, by the rules of
    ``encode_record`` except that a non-finite float raises ``ValueError``
    naming the field (the platform would answer an opaque 400). Any value is
    accepted at the top, not only a mapping."""
    if _plain_and_finite(value, "body"):
        try:
            return orjson.dumps(value)
        except TypeError:
            pass  # a big int or invalid Unicode: the walk below handles both
    walker = _Walker(finite=True)
    return walker.dumps(walker.value(value, "body", 0))


def encode_parsed(value: Any) -> bytes:
    """``encode_json`` of a value a JSON parser made (dicts, lists, str,
    int, float, bool, None: orjson's or json's ``loads``), the same bytes,
    without its walk in the common case. A sync encodes each metrics row it
    ships twice (its request body, its step table entry), and the walk that
    proves a value plain and finite was most of each encoding, for values
    that are plain by where they came from. Finite is what is left to know:
    orjson writes NaN and the infinities (json's ``loads`` reads them) as
    ``null``, so an answer holding ``null`` that does not read back as the
    value is encoded by ``encode_json``, which names the field; so is what
    orjson refuses (an integer past 64 bits, a lone surrogate)."""
    try:
        written = orjson.dumps(value)
    except TypeError:
        return encode_json(value)
    # A ``null`` read back as what was written is a None (a rank not given,
    # a metric logged as None): a NaN reads back None, unequal, as does an
    # infinity. Comparing is C's work, where the walk is Python's.
    if b"null" in written and orjson.loads(written) != value:
        return encode_json(value)
    return written


# --------------------------------------------------------------------------- metrics

_DROP: Any = object()


def _finite_or_drop(value: Any, path: str) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else _DROP
    if _is_numpy(value) and getattr(value, "ndim", None) == 0:
        # A numpy scalar (float32, float16...): judged by its Python value.
        item = value.item()
        return value if not isinstance(item, float) or math.isfinite(item) else _DROP
    if isinstance(value, Decimal) and not value.is_finite():
        return _DROP
    if isinstance(value, Mapping):
        cleaned: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise RecordEncodeError(
                    f"{path}[{key!r}]",
                    f"metric names must be str, not {type(key).__name__}",
                    "use str keys",
                )
            kept = _finite_or_drop(item, field_path(path, key))
            # An emptied (or empty) nested mapping says nothing: drop it too.
            if kept is _DROP or (isinstance(kept, dict) and not kept):
                continue
            cleaned[key] = kept
        return cleaned
    if isinstance(value, list | tuple):
        items = (_finite_or_drop(item, f"{path}[{i}]") for i, item in enumerate(value))
        return [item for item in items if item is not _DROP]
    return value


_PLAIN = (int, bool, str, type(None))


def _flat_finite(values: Mapping[str, Any]) -> dict[str, Any] | None:
    """The common case of ``clean_metrics`` (a flat row of str keys to plain
    numbers and strings), on the hot path of ``log_metrics``; None when the
    row needs the full walk."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        kind = type(value)
        if type(key) is not str:
            return None
        if kind is float:
            if value - value == 0.0:  # finite: inf - inf and nan - nan are nan
                out[key] = value
        elif kind in _PLAIN:
            out[key] = value
        else:
            return None
    return out


def encode_metrics_row(row: dict[str, Any]) -> bytes:
    """``encode_record`` of a row ``clean_metrics`` returned: its common flat
    case (str keys, plain values) goes to orjson directly, on the hot path of
    ``log_metrics``; anything orjson refuses (an int beyond 64 bits, a nested
    value) takes the full encoder."""
    try:
        return orjson.dumps(row)
    except TypeError:
        return encode_record(row, what="log_metrics")


def clean_metrics(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``values`` without non-finite numbers (JSON has none).

    NaN and infinity are removed recursively, list elements too; a nested
    mapping left empty (or empty to begin with) is removed; the top level is
    kept even when empty. Idempotent. Raises ``RecordEncodeError`` when a key
    is not a str, and ``TypeError`` when ``values`` is not a mapping.
    """
    if type(values) is not dict and not isinstance(values, Mapping):
        raise TypeError(f"metrics must be a mapping of str to values, not {type(values).__name__}")
    flat = _flat_finite(values)
    if flat is not None:
        return flat
    cleaned = _finite_or_drop(values, "metrics")
    assert isinstance(cleaned, dict)
    return cleaned


# --------------------------------------------------------------------------- record rules


def is_episode(record: Mapping[str, Any]) -> bool:
    """Whether a record is an episode (it has ``traces``) rather than a bare trace."""
    if isinstance(record, Mapping):
        return "traces" in record
    return hasattr(record, "traces")


def _run_block(run: Any, run_id: str, run_type: str) -> dict[str, Any]:
    block = dict(run) if isinstance(run, Mapping) else {}
    block["id"] = run_id
    block["type"] = run_type
    return block


def stamp_run(record: Mapping[str, Any], run_id: str, run_type: str) -> dict[str, Any]:
    """A shallow copy of ``record`` keyed to the platform run.

    The top-level ``run`` block keeps the producer's keys (``name``, ``work``)
    with ``id`` and ``type`` overridden; a missing block becomes ``{id, type}``.
    Each mapping in an episode's ``traces`` list gets its own ``run`` block if it
    has one, else a copy of the envelope's, overridden the same way (the traces
    service reads ``run_id`` from ``trace.run.id`` only). ``record`` is not changed.
    """
    stamped = dict(record)
    envelope = _run_block(stamped.get("run"), run_id, run_type)
    stamped["run"] = envelope
    members = stamped.get("traces")
    if isinstance(members, list):
        stamped["traces"] = [
            {**member, "run": _run_block(member.get("run") or envelope, run_id, run_type)}
            if isinstance(member, Mapping)
            else member
            for member in members
        ]
    return stamped


def get_field(obj: Any, name: str) -> Any:
    """``obj[name]`` of a mapping, else its attribute ``name``; None if absent."""
    if type(obj) is dict:  # the common case, before the ABC check
        return obj.get(name)
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def training_step(record: Mapping[str, Any]) -> int | None:
    """The training step of a training-work episode, else None: the episodes the
    training sample table takes (on its cadence).

    Needs ``run.type == "train"``, ``run.work.type == "train"`` and an int (not
    bool) ``run.work.step``. Reads keys of mappings or attributes of objects.
    """
    run = get_field(record, "run")
    if run is None or get_field(run, "type") != "train":
        return None
    work = get_field(run, "work")
    if work is None or get_field(work, "type") != "train":
        return None
    step = get_field(work, "step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None
