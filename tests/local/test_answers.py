"""``local.answers.JSONAnswer`` writes Starlette's ``JSONResponse`` bytes,
whichever encoder it took (orjson for plain values, ``json.dumps`` else)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from primeruns.local.answers import JSONAnswer, _plain

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _rendered(kind: type[JSONResponse], content: Any) -> bytes | type[BaseException]:
    try:
        return bytes(kind(content).body)
    except (ValueError, TypeError, UnicodeError) as exc:
        return type(exc)


@settings(max_examples=200, deadline=None)
@given(_values)
def test_an_answer_is_the_bytes_json_dumps_writes(content: Any) -> None:
    assert _rendered(JSONAnswer, content) == _rendered(JSONResponse, content)


@pytest.mark.parametrize(
    "content",
    [
        {"run_id": "rft_1", "step": 2**63 - 1, "status": "ok"},
        {"data": {"presignedUrl": "http://h/storage/k?token=a-b_c", "expiresIn": 3600}},
        {"k": 'a\x00\x1f\x7f\u2028"\\é😀\n\t/<>&', "n": None, "b": True, "l": [-(2**63)]},
        {"big": 2**64 - 1, "neg": -(2**63)},
    ],
)
def test_the_platforms_own_answers_are_plain_and_the_same_bytes(content: Any) -> None:
    assert _plain(content)
    assert JSONAnswer(content).body == JSONResponse(content).body


@pytest.mark.parametrize(
    "content",
    [{"x": 0.1}, {"x": 1e16}, {"x": 2**64}, {"x": math.nan}, {1: "a"}, {"x": (1, 2)}],
)
def test_what_orjson_would_spell_apart_goes_to_json_dumps(content: Any) -> None:
    assert not _plain(content)
    assert _rendered(JSONAnswer, content) == _rendered(JSONResponse, content)
