"""The local platform reads request bodies with orjson where that gives what
``json.loads`` gives (``local.jsonlimits``): no body's answer may change, so
every input orjson reads otherwise (NaN, integers past 64 bits, a byte order
mark, UTF-16, lone surrogates) is read as ``json.loads`` reads it, and what
neither takes is refused with the same error as before; nesting past the
limit is refused either way."""

from __future__ import annotations

import gc
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from primeruns.local import jsonlimits

SAME = [
    b'{"a": 1, "a": 2}',
    b"[1.5, -0, 1e16, 1e-400, 0.1, 9223372036854775807, -9223372036854775808]",
    b"18446744073709551615",
    b"-9223372036854775809",
    b"123456789012345678901234567890",
    b'{"x": 0.12345678901234567890123}',
    b'["\\ud800", "\\u00e9", "\\"[{"]',
    "[1, 2]".encode("utf-16"),
    b"\xef\xbb\xbf[1]",
    '["\ud800"]',
    '{"é": "ü"}',
    b'  {"a": [1, {"b": null}, true, false]}  ',
]


@pytest.mark.parametrize("data", SAME, ids=range(len(SAME)))
def test_a_body_reads_as_json_loads_reads_it(data: bytes | str) -> None:
    got = jsonlimits.loads(data)
    want = json.loads(data)
    assert got == want
    assert json.dumps(got) == json.dumps(want)  # the same types (an int stays an int)


def test_nan_and_infinity_still_reach_the_callers_hook() -> None:
    seen: list[str] = []

    def constant(name: str) -> Any:
        seen.append(name)
        return None

    assert jsonlimits.loads(b"[NaN, Infinity]", parse_constant=constant) == [None, None]
    assert seen == ["NaN", "Infinity"]
    assert math.isnan(jsonlimits.loads(b"NaN"))


@pytest.mark.parametrize("data", [b'{"a": [1, 2', b"", b"[1,]", b'{"a" 1}', b"\x00"])
def test_what_json_loads_refuses_is_refused_with_its_error(data: bytes) -> None:
    with pytest.raises(ValueError) as ours:
        jsonlimits.loads(data)
    with pytest.raises(ValueError) as theirs:
        json.loads(data)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("depth", [101, 500, 2000])
def test_nesting_past_the_limit_is_refused(depth: int) -> None:
    with pytest.raises(jsonlimits.TooDeep):
        jsonlimits.loads(b"[" * depth + b"]" * depth)
    assert jsonlimits.loads(b"[" * 100 + b"]" * 100) is not None


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32"])
def test_nesting_past_the_limit_is_refused_in_any_encoding_beside_any_padding(
    encoding: str,
) -> None:
    """A body is looked at for nesting when it holds more than MAX_DEPTH of
    ``[`` and ``{``: brackets in strings count, and so does every encoding
    ``json.loads`` reads."""
    deep = _nest("l" * 101, "k")
    for value in (deep, {"pad": "x" * 1000, "v": deep}, {"s": "]]]" * 50, "v": deep}):
        with pytest.raises(jsonlimits.TooDeep):
            jsonlimits.loads(json.dumps(value).encode(encoding))
    fine = {"s": "[[{" * 100, "v": _nest("l" * 99, "k")}
    assert jsonlimits.loads(json.dumps(fine).encode(encoding)) == fine


def test_a_run_of_digits_in_a_string_is_still_read_by_orjson() -> None:
    # A hex digest holds a run of 19 digits about once in 150: such a run sent
    # whole 25 MiB sample pushes to json.loads, and their samples to json.dumps.
    body = b'{"hash": "859e6289a5f3af13f9590363425706828671a4a6", "n": [1.5, 12]}'
    value, by_orjson = jsonlimits.parse(body)
    assert by_orjson
    assert value == json.loads(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"hash": "f9590363425706828671", "n": 123456789012345678901234567890}',
        b'{"hash": "f9590363425706828671", "n": -99999999999999999999}',
    ],
)
def test_an_integer_past_64_bits_is_read_by_json_loads_beside_such_a_run(body: bytes) -> None:
    value, by_orjson = jsonlimits.parse(body)
    assert not by_orjson
    assert value == json.loads(body) and isinstance(value["n"], int)


@pytest.mark.parametrize(
    "body",
    [
        # Past 2 * MAX_DEPTH bytes, where the nesting check's indented text
        # is read for an exponent before the body's digit runs are looked at.
        b'{"t": "3 + 4 = 7, one+two, e+", "pad": "'
        + b"x" * 300
        + b'", "n": 123456789012345678901}',
        b'{"pad": "'
        + b"+" * 300
        + b'", "hash": "f9590363425706828671", "n": -99999999999999999999}',
    ],
)
def test_an_integer_past_64_bits_in_a_long_body_is_read_by_json_loads(body: bytes) -> None:
    value, by_orjson = jsonlimits.parse(body)
    assert not by_orjson
    assert value == json.loads(body) and isinstance(value["n"], int)


def test_reading_a_large_body_starts_no_garbage_collection() -> None:
    """A sample push makes tens of thousands of dicts: each 700 of them set
    off a collection that walked the young objects (a fifth of the parse's
    CPU), though what the parser builds holds no cycle to collect. The first
    allocation after the parse may start one, as after any other code."""
    body = json.dumps({"samples": [{"i": i, "tags": [i]} for i in range(20_000)]}).encode()
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        value = jsonlimits.loads(body)
    finally:
        gc.callbacks.remove(count)
    assert len(value["samples"]) == 20_000
    assert len(started) <= 1
    assert gc.isenabled()


REENCODED = [
    *SAME,
    b"[NaN, Infinity, -Infinity, 1e400]",
    b'{"hash": "f9590363425706828671", "big": 123456789012345678901234567890}',
    b'{"t": 1e-07, "u": 1e+22, "v": -0.0, "w": "\\u0000\\n\\"\\\\ \xc3\xa9 \xf0\x9f\x98\x80"}',
]


@pytest.mark.parametrize("data", REENCODED, ids=range(len(REENCODED)))
def test_what_is_stored_of_a_body_reads_back_as_the_body(data: bytes | str) -> None:
    """``compact`` writes what ``parse`` read so that it reads back the same,
    numbers' types and NaN included (orjson would write NaN as null)."""
    value, by_orjson = jsonlimits.parse(data)
    if "\ud800" in json.dumps(value, ensure_ascii=False):
        with pytest.raises(UnicodeEncodeError):  # a lone surrogate has no UTF-8, as before
            jsonlimits.compact(value, by_orjson=by_orjson)
        return
    stored = jsonlimits.compact(value, by_orjson=by_orjson)
    back = json.loads(stored)
    assert json.dumps(back) == json.dumps(value)


def _nest(kinds: str, key: str) -> Any:
    value: Any = [] if kinds[0] == "l" else {}
    for kind in kinds[1:]:
        value = [value] if kind == "l" else {key: value}
    return value


@pytest.mark.parametrize("key", ["a", 'x"y', "new\nline", "b\\", "  [ {", '": [', "é中"])
@pytest.mark.parametrize("shape", ["l", "d", "ld", "dl", "lld"])
def test_nesting_is_measured_whatever_the_keys_and_the_shape(key: str, shape: str) -> None:
    """Objects and arrays, an empty innermost one, keys that look like JSON,
    alone or beside other members: 101 levels are refused, 100 pass."""
    for depth in (99, 100, 101):
        inner = _nest((shape * depth)[:depth], key)
        for value, levels in ((inner, depth), ({"pad": [1, {"q": "x"}], "v": inner}, depth + 1)):
            data = json.dumps(value).encode()
            if levels > jsonlimits.MAX_DEPTH:
                with pytest.raises(jsonlimits.TooDeep):
                    jsonlimits.loads(data)
            else:
                assert jsonlimits.loads(data) == value


LARGE = 64 * 1024  # a body this long is checked without counting its brackets


@pytest.mark.parametrize("shape", ["l", "d", "ld"])
def test_a_large_body_nested_past_the_limit_is_refused_and_one_within_it_read(
    shape: str,
) -> None:
    """A body of 64 KiB or more (a sample push) is measured by orjson's own
    write of it: 101 levels are refused, 100 pass, with a member beside them
    or not, and brackets in its strings change nothing."""
    pad = "[{" * (LARGE // 2)
    for depth in (99, 100, 101):
        inner = _nest((shape * depth)[:depth], "k")
        for value, levels in (({"pad": pad, "v": inner}, depth + 1), ([inner, pad], depth + 1)):
            data = json.dumps(value).encode()
            assert len(data) > LARGE
            if levels > jsonlimits.MAX_DEPTH:
                with pytest.raises(jsonlimits.TooDeep, match="limit of 100 levels"):
                    jsonlimits.parse(data)
            else:
                assert jsonlimits.parse(data) == (value, True)


@pytest.mark.parametrize("depth", [255, 1000, 5000])
def test_a_large_body_nested_past_what_orjson_writes_or_reads_is_refused(depth: int) -> None:
    data = b'{"pad": "' + b"x" * LARGE + b'", "v": ' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(jsonlimits.TooDeep):
        jsonlimits.parse(data)


def test_an_integer_past_64_bits_in_a_large_body_is_read_by_json_loads() -> None:
    body = b'{"pad": "' + b"1234567890" * (LARGE // 10) + b'", "n": 123456789012345678901}'
    value, by_orjson = jsonlimits.parse(body)
    assert not by_orjson
    assert value == json.loads(body) and isinstance(value["n"], int)
    plain = body.replace(b"123456789012345678901}", b"12345678901234567}")
    value, by_orjson = jsonlimits.parse(plain)
    assert by_orjson and value == json.loads(plain)


@pytest.mark.parametrize(
    "line",
    [b'{"a": "\xc3\xa9", "n": [1, 2.5]}', b'{"x": NaN}', b'{"s": "\\ud800"}', b"[1e400]"],
)
def test_utf8_bytes_read_as_their_text_reads(line: bytes) -> None:
    """A traces line is UTF-8: read as its decoded text is read, without the decoding."""
    assert json.dumps(jsonlimits.parse(line, utf8=True)[0]) == json.dumps(
        jsonlimits.loads(line.decode("utf-8"))
    )


@pytest.mark.parametrize("line", [b"\xef\xbb\xbf[1]", "[1]".encode("utf-16"), b'["\xff"]'])
def test_utf8_bytes_refuse_what_their_text_refuses(line: bytes) -> None:
    """A byte order mark or UTF-16 (which json.loads takes from bytes) are refused
    as the decoded text is; bytes that are not UTF-8 raise UnicodeDecodeError."""
    with pytest.raises(ValueError) as ours:
        jsonlimits.parse(line, utf8=True)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        assert isinstance(ours.value, UnicodeDecodeError)
        return
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("string", ['[{\\"[', "\\\\[\\\\", '\\\\\\"[{', "\\u005b["])
def test_text_kept_as_written_is_measured_as_written(string: str) -> None:
    """``as_written``: a key repeated past the limit is refused though its
    value keeps only the last copy; brackets in strings, escaped quotes and
    backslashes among them, change nothing."""
    pad = '"' + string * 60 + '"'
    for depth in (99, 100):
        shallow = f'{{"s": {pad}, "x": {"[" * depth}{"]" * depth}, "x": 1}}'.encode()
        deep = f'{{"s": {pad}, "x": {"[" * (depth + 1)}{"]" * (depth + 1)}, "x": 1}}'.encode()
        assert jsonlimits.parse(shallow)[0]["x"] == 1 == jsonlimits.parse(deep)[0]["x"]
        if depth == 99:  # the object and 99 arrays: 100 levels
            assert jsonlimits.parse(shallow, as_written=True)[0]["x"] == 1
            with pytest.raises(jsonlimits.TooDeep):
                jsonlimits.parse(deep, as_written=True)
        else:
            with pytest.raises(jsonlimits.TooDeep):
                jsonlimits.parse(shallow, as_written=True)


def _resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_small_value_written_holds_about_its_own_bytes() -> None:
    """orjson's answer keeps the buffer it wrote into, 4 KiB or more past its
    length: 100,000 ``{}`` samples in one push held 400 MB until the push
    was stored. What ``compact`` hands back of a small value is its size."""
    before = _resident_bytes()
    written = [jsonlimits.compact({"i": i}, by_orjson=True) for i in range(20_000)]
    grown = _resident_bytes() - before
    assert written[7] == b'{"i":7}'
    # ~100 bytes each (the bytes and the list's slot) against ~4 KiB before.
    assert grown < 20_000 * 1024, f"{grown / 20_000:.0f} bytes a value"
