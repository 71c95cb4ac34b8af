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
with any of those is parsed by ``json.loads``, as before, so no answer
changes. Such an integer is a run of 19 digits or more; so is a run of
digits in a string (a hex digest holds one in about 150), which sent whole
25 MiB sample pushes down the slow path (``json.loads``, then ``json.dumps``
of every sample: 6x the CPU). So a body with such a run is parsed by orjson
all the same, and handed to ``json.loads`` only if it holds a float that
could have been such an integer (one of 1e16 or more, which orjson writes
with ``e+``, as ``repr`` does, or before orjson 3.11.7 with ``e`` alone).

A sample push is read by :func:`parse_listed`: the write that measures its
depth and looks for exponents is made of each sample apart, and is the text
stored of it, where the whole body was written for the check and each sample
once more to be stored (a fifth of the platform's CPU in an evaluation).

What the platform stores it re-encodes (a sample's body, a trace's raw
document): :func:`compact` writes with orjson what orjson parsed (:func:`parse`
says which), ~5x faster than ``json.dumps``; a value ``json.loads`` parsed may
hold NaN or an integer past 64 bits, which orjson writes as ``null`` or
refuses, and is written by ``json.dumps`` as before.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Callable, Iterator
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
# an integer orjson cannot hold (it holds -2**63 to 2**64 - 1) and makes a float.
_DIGITS = bytes(0x39 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"9" * 19
_SLOW = object()


def _loads(raw: bytes) -> Any:
    """``orjson.loads(raw)`` with the cyclic collector held off.

    A 5.5 MB sample push makes some 30,000 dicts and lists: each 700 of them
    started a collection that walked the young objects, the request's
    included (a fifth of the parse's CPU). What orjson builds holds no
    cycle, so nothing is left for the collector that it would have freed."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return orjson.loads(raw)
    finally:
        if paused:
            gc.enable()


#: orjson 3.11.7 and later write a float of 1e16 or more with ``e+`` (``1e+16``,
#: as ``repr`` does); earlier ones without the sign (``1e16``). Found by trying.
_SIGNED_EXPONENT = b"e+" in orjson.dumps(1e16)
#: A positive exponent as orjson before 3.11.7 writes one: a digit either side.
_UNSIGNED_EXPONENT = re.compile(rb"[0-9]e[0-9]")


def _has_exponent(text: bytes) -> bool:
    """Whether ``text``, orjson's, holds a float of 1e16 or more (or an
    ``e+`` in a string: then the slow path only costs time). Found by its
    ``+``, which is rare in prose, where ``b"e+" in text`` stops at every
    ``e`` (7 ms on a 7 MB text against 0.6 ms)."""
    if not _SIGNED_EXPONENT:  # strings out first: a hex digest holds "9e6"
        return _UNSIGNED_EXPONENT.search(_STRING.sub(b"", text)) is not None
    at = text.find(b"+")
    while at >= 0:
        if at and text[at - 1] == 0x65:  # "e"
            return True
        at = text.find(b"+", at + 1)
    return False


#: A body this long or longer is not counted for brackets: it holds more than
#: MAX_DEPTH of them all but always (a sample push does), and counting them
#: cost as much as the nesting check it might have spared (two passes over
#: the body: 5 ms of a 5.5 MB push).
_COUNTED_BELOW = 64 * 1024


def _may_nest_past(raw: bytes, limit: int) -> bool:
    """Whether ``raw`` may hold JSON nested past ``limit`` levels.

    Each level opens with a byte of its own, ``[`` or ``{`` (in UTF-16 and
    UTF-32 too), and closes with another: a body with fewer bytes, or with
    ``limit`` such bytes or fewer (strings' included), nests no further, and
    is not looked at. A trace line (~70 of them in 8 KB) is not: its nesting
    check wrote the whole line again, a tenth of the traces route. A body of
    :data:`_COUNTED_BELOW` bytes or more is taken to."""
    if len(raw) <= 2 * limit:
        return False
    return len(raw) >= _COUNTED_BELOW or raw.count(b"[") + raw.count(b"{") > limit


def _writable_levels() -> int:
    """How many levels of containers orjson writes before it refuses a value
    (``Recursion limit reached``), for the innermost container that counts
    least: 254 in orjson 3.x, but before 3.12 an empty array innermost is not
    counted (255 of them are written, and a value one level past the limit
    whose innermost array is empty passed). Found by trying each shape; a
    value that another shape makes orjson refuse within the limit is walked
    (:func:`_written_within`), so the larger count is the one taken."""
    return max(_writable(0), _writable([]), _writable({}))


def _writable(innermost: Any) -> int:
    """Levels of arrays orjson writes around ``innermost``, itself one when it
    is a container."""
    own = 1 if isinstance(innermost, list | dict) else 0
    low, high = 1, 4096  # orjson writes ``low`` levels and refuses ``high``
    while high - low > 1:
        mid = (low + high) // 2
        value: Any = type(innermost)()
        for _ in range(mid - own):
            value = [value]
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError:
            high = mid
        else:
            low = mid
    return low


#: Arrays a value is wrapped in so that orjson, writing it, refuses it
#: exactly when it nests more than MAX_DEPTH levels itself.
_WRAP = _writable_levels() - MAX_DEPTH


def _written_within(value: Any) -> bytes | None:
    """``value``'s compact text from orjson, wrapped in :data:`_WRAP` arrays;
    ``None`` when orjson refuses it for its depth, which is then more than
    :data:`MAX_DEPTH` levels (or, should orjson refuse a parsed value for
    another reason, when a walk of it finds it so).

    One compact write in C: what the nesting check cost before was an
    indented write (a quarter longer) and a search of its lines for the
    deepest margin (5 ms of a 5.5 MB sample push against 3 ms)."""
    wrapped = value
    for _ in range(_WRAP):
        wrapped = [wrapped]
    return _wrapped_written(wrapped, value, above=0)


def _each_written_within(values: list[Any], *, above: int) -> Iterator[bytes | None]:
    """Each of ``values``' compact text from orjson, or ``None`` when it nests
    more than :data:`MAX_DEPTH` levels with the ``above`` levels it sits in;
    measured as :func:`_written_within` measures, but its wrapping arrays
    (``above`` more) are made once for all of them and sliced off each text."""
    slot: list[Any] = [None]
    wrapped: Any = slot
    for _ in range(_WRAP + above - 1):
        wrapped = [wrapped]
    cut = _WRAP + above
    for value in values:
        slot[0] = value
        written = _wrapped_written(wrapped, value, above=above)
        yield None if written is None else written[cut:-cut]


def _wrapped_written(wrapped: Any, value: Any, *, above: int) -> bytes | None:
    """``orjson.dumps(wrapped)``, ``value`` in arrays; ``None`` when orjson
    refuses it and ``value`` nests more than MAX_DEPTH levels less ``above``."""
    try:
        return orjson.dumps(wrapped)
    except orjson.JSONEncodeError:
        if _walk_deeper_than(value, MAX_DEPTH - above):
            return None
        raise


def _fast(raw: bytes, *, may_nest: bool) -> Any:
    """``raw`` parsed by orjson when that is what ``json.loads`` gives, else
    ``_SLOW``. Raises TooDeep when orjson parsed it and it nests past the
    limit, which is looked for when ``raw`` ``may_nest`` past it."""
    try:
        value = _loads(raw)
    except orjson.JSONDecodeError:  # json.loads may take it (NaN, a BOM), or say why not
        return _SLOW
    return _checked(raw, value, may_nest=may_nest)


def _checked(raw: bytes, value: Any, *, may_nest: bool) -> Any:
    """``value``, orjson's parse of ``raw``, or ``_SLOW`` when ``json.loads``
    may read ``raw`` otherwise; TooDeep as :func:`_fast` says."""
    if may_nest:
        try:
            written = _written_within(value)
        except orjson.JSONEncodeError:  # not for its depth: its digit runs are looked at
            exponent = True
        else:
            if written is None:
                raise TooDeep()
            # orjson writes a float of 1e16 or more with an exponent: a body
            # without one holds no integer orjson made a float, and its digit
            # runs are not looked at (a pass over the whole body).
            exponent = _has_exponent(written)
        if exponent and _has_long_run(raw):
            return _SLOW
    elif _has_long_run(raw):
        try:
            if _has_exponent(orjson.dumps(value)):
                return _SLOW  # a float that may have been an integer past 64 bits
        except orjson.JSONEncodeError:
            return _SLOW
    return value


def _has_long_run(raw: bytes) -> bool:
    """Whether ``raw`` holds a run of digits an integer past 64 bits may be."""
    return _LONG_RUN in raw.translate(_DIGITS)


def parse(
    data: bytes | str,
    *,
    parse_constant: Callable[[str], Any] | None = None,
    utf8: bool = False,
    as_written: bool = False,
) -> tuple[Any, bool]:
    """``(loads(data), by_orjson)``: ``by_orjson`` when orjson parsed it, so
    every number in it is a finite float or an integer within 64 bits (orjson
    refuses the rest), which :func:`compact` may write with orjson.

    ``utf8``: bytes read as ``loads(data.decode("utf-8"))`` reads them (no
    BOM, no UTF-16; UnicodeDecodeError when they are not UTF-8), without
    decoding them where orjson parses them (it takes UTF-8 alone).

    ``as_written``: ``data`` is kept as sent (a bare trace's line), so its
    text is measured too, not only its value (a key repeated in an object
    keeps its last copy, and the text may nest far deeper: stored, a read
    of it recursed past the interpreter's limit)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    may_nest = _may_nest_past(raw, MAX_DEPTH)
    value = _fast(raw, may_nest=may_nest)
    by_orjson = value is not _SLOW
    if not by_orjson:
        if utf8 and not isinstance(data, str):
            data = data.decode("utf-8")
        value = _slow(data, parse_constant=parse_constant, may_nest=may_nest)
    if as_written and may_nest and _text_deeper_than(raw):
        raise TooDeep()
    return value, by_orjson


def _slow(data: bytes | str, *, parse_constant: Callable[[str], Any] | None, may_nest: bool) -> Any:
    """``json.loads(data)``, refused past the depth (looked for when it ``may_nest``)."""
    try:
        value = json.loads(data, parse_constant=parse_constant)
    except RecursionError:
        raise TooDeep() from None
    if may_nest and _deeper_than(value):
        raise TooDeep()
    return value


def loads(data: bytes | str, *, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``json.loads(data)``; raises ValueError (TooDeep beyond MAX_DEPTH)."""
    return parse(data, parse_constant=parse_constant)[0]


def parse_listed(raw: bytes, key: str, *, most: int) -> tuple[Any, bool, list[bytes] | None]:
    """``parse(raw)``, and each object listed under ``key`` as :func:`compact`
    writes it (a sample push's samples, as they are stored): written once,
    by the nesting check, where they were written twice (once in the whole
    body, wrapped, for its depth, and once each to be stored: a fifth of the
    local platform's CPU in an evaluation's samples push).

    The texts are ``None`` when orjson did not parse ``raw`` (what
    :func:`compact` writes then is json.dumps's), and when its value is not
    an object whose ``key`` is a list of ``most`` objects or fewer, which the
    caller refuses: past ``most``, before each member's text was made."""
    may_nest = _may_nest_past(raw, MAX_DEPTH)
    try:
        value = _loads(raw)
    except orjson.JSONDecodeError:
        return _slow(raw, parse_constant=None, may_nest=may_nest), False, None
    members = _listed(value, key, most)
    apart = None if members is None else _written_apart(value, key, members)
    if apart is None:  # measured whole, as parse measures it
        texts = None
        slow = _checked(raw, value, may_nest=may_nest) is _SLOW
    else:  # as _checked: a float of 1e16 or more may be an integer past 64 bits
        texts, exponent = apart
        slow = exponent and _has_long_run(raw)
    if slow:
        return _slow(raw, parse_constant=None, may_nest=may_nest), False, None
    return value, True, texts


def _listed(value: Any, key: str, most: int) -> list[dict[str, Any]] | None:
    """``value[key]`` when ``value`` is an object and that a list of ``most`` objects or fewer."""
    members = value.get(key) if isinstance(value, dict) else None
    if not isinstance(members, list) or len(members) > most:
        return None
    return members if all(isinstance(m, dict) for m in members) else None


def _written_apart(
    value: dict[str, Any], key: str, members: list[dict[str, Any]]
) -> tuple[list[bytes], bool] | None:
    """Each of ``members`` (``value[key]``) written as :func:`_written_within`
    writes it where it sits, two levels down, and the rest of ``value``
    written beside them: their texts, and whether the whole's text holds an
    exponent (:func:`_has_exponent`: the parts' texts and the key hold all of
    its numbers and strings). Raises TooDeep when a part nests past the limit,
    as the whole would; ``None`` when orjson refuses a part for another
    reason (:func:`_checked` then says what the whole is)."""
    try:
        rest = _written_within({k: v for k, v in value.items() if k != key})
        if rest is None:
            raise TooDeep()
        exponent = _has_exponent(rest) or _has_exponent(orjson.dumps(key))
        texts: list[bytes] = []
        for text in _each_written_within(members, above=2):  # the object, the list
            if text is None:
                raise TooDeep()
            exponent = exponent or _has_exponent(text)
            texts.append(text)
    except orjson.JSONEncodeError:
        return None
    return texts, exponent


#: Compact text shorter than this is copied out of orjson's buffer (:func:`compact`).
_COPIED_BELOW = 4096


def compact(value: Any, *, by_orjson: bool, allow_nan: bool = True) -> bytes:
    """``value`` as compact UTF-8 JSON, as ``json.dumps(value, separators=(",",
    ":"), ensure_ascii=False)`` writes it, or as text that reads back as the
    same value (orjson writes ``1e-07`` as ``1e-7``). ``by_orjson``: the value
    came from :func:`parse` saying so; else NaN would be written as ``null``
    by orjson, and json.dumps writes it (``allow_nan`` False: ValueError, as
    ``json.dumps`` raises it, where a float is NaN or infinite)."""
    if by_orjson:
        try:
            written = orjson.dumps(value)
        except orjson.JSONEncodeError:  # not a parsed value after all: json.dumps says why
            pass
        else:
            # orjson's answer keeps the buffer it wrote into, 4 KiB or more
            # past its length: a short one is copied out, so a push of many
            # small samples holds their bytes, not a page or two each (and
            # the copy is cheaper than the fresh pages: less CPU, not more).
            return bytes(memoryview(written)) if len(written) < _COPIED_BELOW else written
    return json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan
    ).encode()


def _deeper_than(value: Any) -> bool:
    """Whether ``value`` (``json.loads``'s) nests more than :data:`MAX_DEPTH`
    containers: orjson's write of it wrapped
    (:func:`_written_within`) says so in C; what orjson cannot write (an
    integer past 64 bits) is walked."""
    try:
        return _written_within(value) is None
    except orjson.JSONEncodeError:  # walked already: not deeper
        return False


#: A string, escapes and all, met outside one (valid JSON: from its opening quote).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Every byte but brackets, deleted; what is left of an object's, an array's.
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_AS_ARRAYS = bytes.maketrans(b"{}", b"[]")


def _text_deeper_than(raw: bytes) -> bool:
    """Whether the valid JSON text ``raw`` nests more than :data:`MAX_DEPTH`
    levels as written, which its value may not show: of a key repeated in an
    object only the last copy is kept, however deep the ones before nest.

    In C: the strings taken out, then all but brackets; each pass of
    ``replace`` takes the innermost pairs away, one level a pass."""
    brackets = _STRING.sub(b"", raw).translate(_AS_ARRAYS, _NOT_BRACKETS)
    for _ in range(MAX_DEPTH):
        peeled = brackets.replace(b"[]", b"")
        if len(peeled) == len(brackets):
            return False  # nothing left
        brackets = peeled
    return bool(brackets)


def _walk_deeper_than(value: Any, limit: int) -> bool:
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
