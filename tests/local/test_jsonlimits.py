"""The local platform reads request bodies with orjson where that gives what
``json.loads`` gives (``local.jsonlimits``): no body's answer may change, so
every input orjson reads otherwise (NaN, integers past 64 bits, a byte order
mark, UTF-16, lone surrogates) is read as ``json.loads`` reads it, and what
neither takes is refused with the same error as before; nesting past the
limit is refused either way."""

from __future__ import annotations

import json
import math
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
