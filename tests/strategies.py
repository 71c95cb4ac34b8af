"""Hypothesis strategies for records, shared by every property test.

- ``json_values`` / ``json_records``: JSON-native values that must round-trip
  through the encoder unchanged.
- ``nasty_values``: anything a producer might put in a record (NaN, huge ints,
  invalid Unicode, sets, bytes, enums, dataclasses, odd dict keys, plain
  objects): the encoder must encode it or raise ``RecordEncodeError``, nothing else.
- ``metric_mappings``: ``log_metrics``-style values with non-finite numbers.
- ``episode_records``: mappings of the verifiers ``Episode.to_record()`` shape
  with random message graphs, calls, rewards and errors.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "episode_records",
    "json_records",
    "json_values",
    "metric_mappings",
    "nasty_values",
    "trace_records",
]

# Text that is valid UTF-8 (no surrogate code points).
valid_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)

json_scalars = st.none() | st.booleans() | int64 | finite_floats | valid_text


def json_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """JSON-native values: what ``json.loads`` can give back."""
    return st.recursive(
        json_scalars,
        lambda children: (
            st.lists(children, max_size=5) | st.dictionaries(valid_text, children, max_size=5)
        ),
        max_leaves=max_leaves,
    )


def json_records() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(valid_text, json_values(), max_size=8)


class Colour(enum.Enum):
    RED = "red"
    BLUE = 2


@dataclasses.dataclass
class Point:
    x: Any
    y: Any


class Opaque:
    """Not encodable by any rule."""


def _numpy_values() -> st.SearchStrategy[Any]:
    try:
        import numpy as np
    except ImportError:  # numpy is optional: its values are just not drawn
        return st.nothing()
    return st.one_of(
        st.floats(width=32).map(np.float32),
        st.floats().map(np.float64),
        st.integers(-(2**31), 2**31 - 1).map(np.int32),
        st.lists(st.floats(), max_size=4).map(np.array),
        st.lists(st.integers(-100, 100), max_size=4).map(lambda xs: np.array(xs, dtype=np.int64)),
    )


nasty_scalars = st.one_of(
    json_scalars,
    st.floats(),  # NaN and infinities included
    st.integers(),  # beyond 64 bits included
    st.text(max_size=10),  # lone surrogates included
    st.binary(max_size=5),
    st.decimals(allow_nan=True),
    st.datetimes(),
    st.dates(),
    st.uuids(),
    st.sampled_from(Colour),
    st.just(Opaque()),
    _numpy_values(),
)

nasty_keys = st.one_of(
    st.text(max_size=8),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.tuples(st.integers()),
)


def nasty_values(max_leaves: int = 25) -> st.SearchStrategy[Any]:
    """Arbitrary nested values a producer might log."""
    return st.recursive(
        nasty_scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.tuples(children, children),
            st.frozensets(st.integers() | st.text(max_size=4), max_size=4),
            st.sets(st.integers(), max_size=4),
            st.dictionaries(nasty_keys, children, max_size=4),
            st.builds(Point, children, children),
        ),
        max_leaves=max_leaves,
    )


def metric_mappings() -> st.SearchStrategy[dict[str, Any]]:
    """``log_metrics`` values: numbers (non-finite too), nested dicts and lists."""
    leaf = st.floats() | st.integers(-1000, 1000) | st.booleans() | st.none() | valid_text
    return st.dictionaries(
        valid_text,
        st.recursive(
            leaf,
            lambda children: (
                st.lists(children, max_size=4) | st.dictionaries(valid_text, children, max_size=4)
            ),
            max_leaves=15,
        ),
        max_size=8,
    )


# --------------------------------------------------------------------------- episodes

_roles = st.sampled_from(["system", "user", "assistant", "tool"])


@st.composite
def _message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(_roles)
    message: dict[str, Any] = {"role": role, "content": draw(valid_text)}
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = [
            {"id": "call-1", "type": "function", "name": "bash", "arguments": "{}"}
        ]
    if role == "tool":
        message["tool_call_id"] = "call-1"
    return message


_usage = st.fixed_dictionaries(
    {"prompt_tokens": st.integers(0, 5000), "completion_tokens": st.integers(0, 5000)},
    optional={
        "cached_input_tokens": st.integers(0, 500) | st.none(),
        "reasoning_tokens": st.integers(0, 500),
        "cost": st.floats(0, 1),
    },
)

_reward = st.none() | st.fixed_dictionaries(
    {"score": st.floats(-1, 1) | st.sampled_from([float("nan"), 0.0])},
    optional={"weight": st.floats(0, 2)},
)


@st.composite
def trace_records(draw: st.DrawFn, idx: int | None = None) -> dict[str, Any]:
    """One trace mapping: a random message tree (each node's parent is an
    earlier node), calls on some nodes, rewards, metrics, errors."""
    size = draw(st.integers(0, 6))
    nodes = []
    for index in range(size):
        parent = draw(st.none() | st.integers(0, index - 1)) if index else None
        nodes.append({"parent": parent, "message": draw(_message()), "sampled": True})
    calls = [
        {
            "node": draw(st.none() | st.integers(0, max(size - 1, 0))),
            "finish_reason": draw(st.sampled_from(["stop", "length", "tool_calls", None])),
            "usage": draw(st.none() | _usage),
            "error": draw(st.none() | st.just({"type": "E", "message": "m"})),
        }
        for _ in range(draw(st.integers(0, 4)))
    ]
    return {
        "version": 1,
        "id": draw(st.uuids()).hex,
        "task": {
            "type": "T",
            "data": {
                "idx": draw(st.integers(0, 5)) if idx is None else idx,
                "answer": draw(valid_text | st.none()),
            },
        },
        "agent": {
            "name": draw(st.sampled_from(["agent", "judge", "solver"])),
            "trainable": draw(st.booleans()),
        },
        "tools": draw(st.lists(st.just({"name": "bash", "strict": None}), max_size=1)),
        "nodes": nodes,
        "calls": calls,
        "rewards": draw(st.dictionaries(st.sampled_from(["r1", "r2", "reward"]), _reward)),
        "metrics": draw(
            st.dictionaries(st.sampled_from(["m1", "m2", "r1"]), st.floats() | st.none())
        ),
        "info": draw(st.dictionaries(valid_text, json_scalars, max_size=2)),
        "is_completed": draw(st.booleans()),
        "stop_condition": draw(st.sampled_from([None, "agent_completed", "max_turns", "error"])),
        "errors": draw(
            st.lists(st.just({"type": "E", "message": "boom", "status_code": None}), max_size=2)
        ),
        "timing": {"start": 1.0, "agent": {"start": 1.0, "end": 2.0}},
    }


@st.composite
def episode_records(draw: st.DrawFn) -> dict[str, Any]:
    """One episode mapping of the ``Episode.to_record()`` shape."""
    record: dict[str, Any] = {
        "id": draw(st.uuids()).hex,
        "env": {"id": draw(st.sampled_from(["gsm8k", "", "swe"]))},
        "task": {"type": "T", "data": {"idx": 0}},
        "ok": draw(st.booleans()),
        "is_timeout": False,
        "errors": [],
        "traces": draw(st.lists(trace_records(), max_size=3)),
    }
    if draw(st.booleans()):
        record["run"] = {
            "type": "train",
            "id": "local",
            "work": {"type": "train", "step": draw(st.integers(0, 40))},
        }
    return record
