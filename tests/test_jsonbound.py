"""What a page shows of a hostile record is bounded, and says what it left out."""

from __future__ import annotations

import pytest

from primeruns import jsonbound
from primeruns.jsonbound import MARK, Bounds, clip, loads


def test_clip_bounds_depth_items_and_strings_with_markers() -> None:
    deep: list[object] = []
    node = deep
    for _ in range(100):
        node.append([])
        node = node[0]  # type: ignore[assignment]
    value = {"text": "x" * 100, "items": list(range(50)), "deep": deep, "n": 3}
    shown = clip(value, Bounds(depth=5, items=10, chars=20))
    assert shown["n"] == 3
    assert shown["text"].startswith("x" * 20) and MARK in shown["text"]
    assert shown["items"][:10] == list(range(10)) and shown["items"][10] == f"{MARK} 40 more items]"
    assert MARK in repr(shown["deep"]) and repr(shown["deep"]).count("[") < 12


def test_clip_keeps_an_honest_record_as_it_is() -> None:
    record = {"id": "e1", "traces": [{"nodes": [{"message": {"content": "hi " * 1000}}]}]}
    assert clip(record) == record


def test_clip_bounds_a_whole_value_by_its_total() -> None:
    shown = clip({f"k{i}": "y" * 100 for i in range(1000)}, Bounds(total=5_000))
    assert len(repr(shown)) < 10_000 and MARK in repr(shown)


@pytest.mark.parametrize(
    "payload",
    [b"[" * 200_000 + b"]" * 200_000, b"[" + b"{}," * 100 + b"{}]", b"x" * 50, b"[1,2"],
)
def test_loads_refuses_with_value_error_only(payload: bytes) -> None:
    with pytest.raises(ValueError):
        loads(payload, 10 << 20, max_values=50)


def test_loads_refuses_what_is_over_its_size() -> None:
    with pytest.raises(ValueError, match="over the 10-byte limit"):
        jsonbound.loads(b'"' + b"x" * 20 + b'"', 10)
    assert loads(b'{"a": NaN}', 100)["a"] != 0  # json's NaN still reads
