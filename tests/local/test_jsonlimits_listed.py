"""A sample push's samples are written once (``jsonlimits.parse_listed``): the
write that checks the body's depth and looks for exponents also makes each
sample's stored text. No answer may change for it: every body is refused as
``parse`` refused it (the same error, the same message), and every sample is
stored as ``compact`` wrote it after ``parse``, byte for byte: bodies nested
to the limit and one past it wherever the deepest member sits, numbers at
the edges of what orjson holds, strings that look like them, text orjson
refuses to read."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primeruns.local import jsonlimits
from primeruns.local.app import build_app
from primeruns.local.settings import ServerSettings

KEY = "samples"
LIMIT = jsonlimits.MAX_DEPTH
LARGE = 64 * 1024  # a body this long is measured without counting its brackets


def _outcome(answer: Any) -> tuple[Any, ...]:
    """What a route sees of a body: its refusal, or its value (types
    included), whether orjson read it, and each sample as stored."""
    if isinstance(answer, BaseException):
        return ("refused", type(answer), str(answer))
    value, by_orjson, stored = answer
    return ("read", json.dumps(value), by_orjson, stored)


def _stored(value: Any, by_orjson: bool, texts: list[bytes] | None, most: int, key: str) -> Any:
    """Each sample's stored bytes, as the route makes them (None when the
    route refuses the body's samples before making any)."""
    members = value.get(key) if isinstance(value, dict) else None
    if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
        return None
    if len(members) > most:
        return None
    if texts is not None:
        return texts
    try:
        return [jsonlimits.compact(m, by_orjson=by_orjson) for m in members]
    except UnicodeEncodeError as exc:  # a lone surrogate has no UTF-8, as before
        return ("unstorable", str(exc))


def _before(raw: bytes, most: int, key: str) -> tuple[Any, ...]:
    """The route before: the whole body parsed, then each sample written."""
    try:
        value, by_orjson = jsonlimits.parse(raw)
    except ValueError as exc:
        return _outcome(exc)
    return _outcome((value, by_orjson, _stored(value, by_orjson, None, most, key)))


def _now(raw: bytes, most: int, key: str) -> tuple[Any, ...]:
    try:
        value, by_orjson, texts = jsonlimits.parse_listed(raw, key, most=most)
    except ValueError as exc:
        return _outcome(exc)
    return _outcome((value, by_orjson, _stored(value, by_orjson, texts, most, key)))


def _same(raw: bytes, most: int = 1000, key: str = KEY) -> tuple[Any, ...]:
    now = _now(raw, most, key)
    assert now == _before(raw, most, key)
    return now


# -- numbers and strings at orjson's edges -------------------------------------------
_EDGE_NUMBERS = [
    "0",
    "-0",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "-18446744073709551616",
    "1234567890123456789",
    "12345678901234567890",
    "123456789012345678901234567890",
    "9999999999999998",
    "9007199254740993",
    "1e15",
    "1e16",
    "1E16",
    "1e+16",
    "1.0e16",
    "10000000000000000.0",
    "12345678901234567890.0",
    "99999999999999999999.5",
    "1e308",
    "1.7976931348623157e308",
    "1e309",
    "-1e400",
    "5e-324",
    "1e-400",
    "1e-7",
    "-0.0",
    "0.1",
    "2.5E-3",
    "NaN",
    "Infinity",
    "-Infinity",
]
_EDGE_STRINGS = [
    '"x"',
    '""',
    '"859e6289a5f3af13f9590363425706828671a4a6"',
    '"3 + 4 = 7, 1e+16, one+two"',
    '"12345678901234567890"',
    '"1e16"',
    '"\\ud800"',
    '"\\udfff\\ud800"',
    '"\\u00e9 \\u0000 \\n \\" \\\\"',
    '"é中😀"',
    '"[{[{"',
    '"\\"]}"',
    '"e+"',
]
_KEYS = ['"a"', '"a"', '"e+"', '"samples"', '"\\ud800"', '"1e+16"', '"k[{"']


def _chain(depth: int, kinds: str = "l") -> str:
    """``depth`` containers one in another, arrays and objects as ``kinds`` cycles."""
    text = ""
    for level in reversed(range(depth)):
        kind = kinds[level % len(kinds)]
        text = f"[{text}]" if kind == "l" else (f'{{"k":{text}}}' if text else "{}")
    return text


_leaves = st.one_of(
    st.sampled_from([*_EDGE_NUMBERS, *_EDGE_STRINGS, "true", "false", "null"]),
    st.integers(min_value=-(2**66), max_value=2**66).map(str),
    st.integers(min_value=2**63 - 3, max_value=2**64 + 3).map(lambda i: str(i * (-1) ** i)),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=8).map(lambda s: json.dumps(s, ensure_ascii=False)),
    st.builds(
        _chain, st.integers(min_value=94, max_value=LIMIT), st.sampled_from(["l", "d", "ld"])
    ),
)


def _array(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"


def _object(members: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{k}:{v}" for k, v in members) + "}"


_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(_array),
        st.lists(st.tuples(st.sampled_from(_KEYS), inner), max_size=4).map(_object),
    ),
    max_leaves=12,
)
_samples = st.one_of(
    st.lists(st.tuples(st.sampled_from(_KEYS), _values), max_size=4).map(_object),
    _values,  # not an object: the route refuses the push
)
_pads = st.sampled_from(["", '"' + "x" * 300 + '"', '"' + "1234567890[{" * (LARGE // 12) + '"'])


@st.composite
def _bodies(draw: st.DrawFn, key: str) -> bytes:
    """A push: its samples, and members beside them before or after, padding
    among them (a body past 200 bytes, past 64 KiB, is measured otherwise)."""
    samples = _array(draw(st.lists(_samples, max_size=5)))
    beside = draw(st.lists(st.tuples(st.sampled_from(_KEYS), _values), max_size=2))
    pad = draw(_pads)
    if pad:
        beside.append(('"pad"', pad))
    at = draw(st.integers(min_value=0, max_value=len(beside)))
    members = [*beside[:at], (f'"{key}"', samples), *beside[at:]]
    body = _object(members)
    if draw(st.booleans()):
        body = draw(st.sampled_from([samples, f'{{"{key}": 1}}', "[" + body + "]", body]))
    return body.encode("utf-8", "surrogatepass")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), most=st.sampled_from([0, 2, 1000]), key=st.sampled_from([KEY, "e+"]))
def test_a_push_is_answered_and_stored_as_before(data: st.DataObject, most: int, key: str) -> None:
    """Any body, its samples under the route's key or one that reads as an exponent."""
    _same(data.draw(_bodies(key)), most, key)


# -- the depth, at the limit and one past it, wherever the deepest value sits -----
def _push(samples: list[str], beside: list[tuple[str, str]], at: int) -> bytes:
    members = [*beside[:at], (f'"{KEY}"', _array(samples)), *beside[at:]]
    return _object(members).encode()


_PADS = {"short": "", "counted": '"' + "x" * 300 + '"', "large": '"' + "[{" * LARGE + '"'}


_PLAIN = '{"sample_id":"s","reward":1.5}'


def _placed(place: str, levels: int, kinds: str) -> bytes:
    """A push whose deepest value nests ``levels`` levels in all, in ``place``."""
    sample = _chain(levels - 2, kinds)  # the body and the list hold it
    if not sample.startswith("{"):
        sample = '{"v":' + _chain(levels - 3, kinds) + "}"
    within = '{"a":[1,' + _chain(levels - 4, kinds) + "]}"
    beside = _chain(levels - 1, kinds)
    samples, members = {
        "first sample": ([sample, _PLAIN, _PLAIN], []),
        "middle sample": ([_PLAIN, sample, _PLAIN], [('"a"', "1")]),
        "last sample": ([_PLAIN, _PLAIN, sample], [('"a"', "1")]),
        "within a sample": ([_PLAIN, within], []),
        "a sample not an object": ([_PLAIN, _chain(levels - 2, kinds)], []),
        "beside, first": ([_PLAIN], [('"x"', beside), ('"a"', "1")]),
        "beside, last": ([_PLAIN], [('"a"', "1"), ('"x"', beside)]),
    }[place]
    return _push(samples, members, 1 if members and members[0][0] == '"a"' else 0)


_PLACES = [
    "first sample",
    "middle sample",
    "last sample",
    "within a sample",
    "a sample not an object",
    "beside, first",
    "beside, last",
]


@pytest.mark.parametrize("pad", list(_PADS))
@pytest.mark.parametrize("kinds", ["l", "d", "ld", "dl"])
@pytest.mark.parametrize("place", _PLACES)
def test_depth_at_and_past_the_limit_is_answered_as_before_wherever_it_sits(
    pad: str, kinds: str, place: str
) -> None:
    """A body nesting to the limit, or one level past it, in a sample, deep
    in one, or in a member beside the samples, before them or after, in a
    short body, one whose brackets are counted and one too long to count."""
    for levels in (LIMIT - 1, LIMIT, LIMIT + 1):
        body = _placed(place, levels, kinds)
        if _PADS[pad]:
            body = body[:-1] + b',"pad":' + _PADS[pad].encode() + b"}"
        got = _same(body)
        assert (got[0] == "refused") == (levels > LIMIT), (place, levels)
        if levels > LIMIT:
            assert got[1] is jsonlimits.TooDeep


@pytest.mark.parametrize("number", _EDGE_NUMBERS)
@pytest.mark.parametrize("pad", list(_PADS))
def test_numbers_at_orjsons_edges_are_stored_as_before(number: str, pad: str) -> None:
    """Integers about 64 bits, floats about 1e16 and past a double's range,
    NaN and Infinity, beside a run of digits in a string or not."""
    for hash_ in ('"f9590363425706828671"', '"abc"'):
        sample = f'{{"sample_id":{hash_},"n":{number},"m":[{number}]}}'
        beside = [('"pad"', _PADS[pad])] if _PADS[pad] else []
        for at in range(len(beside) + 1):
            _same(_push([sample, '{"t":"1 + 1"}'], beside, at))
            _same(_push(['{"t":"1 + 1"}'], [('"n"', number), *beside], at))


@pytest.mark.parametrize("key", [KEY, "e+"])
@pytest.mark.parametrize("pad", list(_PADS))
def test_an_exponent_in_any_part_beside_a_run_of_digits_is_read_as_before(
    key: str, pad: str
) -> None:
    """What looks like an exponent (in a sample, beside the samples, in the
    key that lists them) with a run of 19 digits elsewhere: ``json.loads``
    reads the body, as before, and ``json.dumps`` writes its samples."""
    digits = '{"hash":"f9590363425706828671"}'
    padding = [('"pad"', _PADS[pad])] if _PADS[pad] else []
    for sample in ['{"t":"1e+16"}', '{"e+":1}', '{"n":1e16}', '{"t":"x"}']:
        for beside in ([], [('"t"', '"1e+5"')], [('"e+"', "1")], [('"n"', "1e300")]):
            members = [*beside, *padding]
            for at in range(len(members) + 1):
                listed = [*members[:at], (f'"{key}"', _array([sample, digits])), *members[at:]]
                _same(_object(listed).encode(), key=key)


def test_samples_are_stored_as_orjson_writes_them() -> None:
    samples = [
        {"sample_id": f"s{i}", "reward": i / 7, "tags": [i, "é"], "m": {}} for i in range(50)
    ]
    body = orjson.dumps({KEY: samples, "pad": "x" * LARGE})
    value, by_orjson, texts = jsonlimits.parse_listed(body, KEY, most=1000)
    assert by_orjson and value[KEY] == samples
    assert texts == [orjson.dumps(s) for s in samples]


def _push_through_the_route(data: Path, body: bytes) -> tuple[httpx.Response, int]:
    """The samples route's answer to ``body``, and how many bytes orjson wrote for it."""
    app = build_app(ServerSettings(data_dir=data))
    written: list[int] = []
    dumps = orjson.dumps

    def counted(value: Any, *args: Any, **kwargs: Any) -> bytes:
        text = dumps(value, *args, **kwargs)
        written.append(len(text))
        return text

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://local") as client:
            created = await client.post("/api/v1/evaluations/", json={"name": "e", "run_id": "r"})
            url = f"/api/v1/evaluations/{created.json()['evaluation_id']}/samples"
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(orjson, "dumps", counted)
                return await client.post(
                    url, content=body, headers={"Content-Type": "application/json"}
                )

    try:
        return asyncio.run(call()), sum(written)
    finally:
        app.state.ctx.db.close()


def test_a_push_is_written_once(tmp_path: Path) -> None:
    """The nesting check's write of each sample is the text stored: orjson
    writes about the body's bytes once for a push, where it wrote them twice
    (the whole body wrapped, then each sample)."""
    samples = [{"sample_id": f"s{i}", "answer": "7 + 5 = 12. " * 200} for i in range(100)]
    body = orjson.dumps({KEY: samples})
    answer, written = _push_through_the_route(tmp_path, body)
    assert answer.status_code == 200 and answer.json()["inserted"] == 100
    assert written < 1.2 * len(body)
    with closing(sqlite3.connect(tmp_path / "platform.sqlite3")) as conn:
        rows = conn.execute("SELECT CAST(body AS BLOB) FROM eval_samples ORDER BY row").fetchall()
    assert [row[0] for row in rows] == [orjson.dumps(s) for s in samples]
