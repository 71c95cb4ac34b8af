"""The record encoder and record rules: what a logged value becomes on the wire."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import uuid
import warnings
from collections.abc import Mapping
from decimal import Decimal
from pathlib import PurePosixPath
from typing import Any

import attrs
import orjson
import pytest
import workloads
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import json_records, metric_mappings, nasty_values

from primeruns.exceptions import is_record_rejection
from primeruns.records import (
    MAX_DEPTH,
    RecordEncodeError,
    RecordRepairWarning,
    clean_metrics,
    encode_json,
    encode_parsed,
    encode_record,
    is_episode,
    stamp_run,
    to_mapping,
    training_step,
)


def decode(payload: bytes) -> Any:
    # Strict: the stdlib refuses NaN only with a hook, so check for it explicitly.
    def refuse(constant: str) -> Any:
        raise AssertionError(f"non-JSON constant {constant} in output")

    return json.loads(payload, parse_constant=refuse)


class Shade(enum.Enum):
    DARK = "dark"


@dataclasses.dataclass
class Step:
    index: int
    tags: tuple[str, ...]


@attrs.define
class Loss:
    value: float
    when: dt.date


class WithRecord:
    def __init__(self, record: Any) -> None:
        self.record = record

    def to_record(self) -> Any:
        return self.record


# --------------------------------------------------------------------------- to_mapping


def test_to_mapping_returns_a_mapping_as_is() -> None:
    record = {"a": 1}
    assert to_mapping(record, what="r") is record


def test_to_mapping_prefers_to_record() -> None:
    assert to_mapping(WithRecord({"x": 1}), what="r") == {"x": 1}


def test_to_mapping_refuses_a_to_record_that_returns_no_mapping() -> None:
    with pytest.raises(RecordEncodeError, match=r"episodes\[2\].*returned list"):
        to_mapping(WithRecord([1]), what="episodes[2]")


def test_to_mapping_wraps_a_raising_to_record() -> None:
    class Broken:
        def to_record(self) -> dict[str, Any]:
            raise KeyError("missing")

    with pytest.raises(RecordEncodeError) as caught:
        to_mapping(Broken(), what="episodes[0]")
    assert isinstance(caught.value.__cause__, KeyError)
    assert "episodes[0]" in str(caught.value) and "KeyError" in str(caught.value)
    assert is_record_rejection(caught.value)


def test_to_mapping_takes_pydantic_attrs_and_dataclasses() -> None:
    base: Any = pytest.importorskip("pydantic").BaseModel

    class Model(base):  # type: ignore[misc]
        when: dt.date
        shade: Shade

    assert to_mapping(Model(when=dt.date(2024, 1, 2), shade=Shade.DARK), what="r") == {
        "when": "2024-01-02",
        "shade": "dark",
    }
    assert to_mapping(Step(1, ("a",)), what="r") == {"index": 1, "tags": ["a"]}
    assert to_mapping(Loss(0.5, dt.date(2024, 1, 2)), what="r")["value"] == 0.5


@pytest.mark.parametrize("value", [3, "text", [1], Step])
def test_to_mapping_refuses_what_is_no_record(value: Any) -> None:
    with pytest.raises(RecordEncodeError, match=r"traces\[1\].*is not a record"):
        to_mapping(value, what="traces[1]")


# --------------------------------------------------------------------------- encode_record


def test_encode_record_is_compact_utf8_json() -> None:
    assert encode_record({"a": [1, 2.5, None, True], "é": "ü"}) == (
        '{"a":[1,2.5,null,true],"é":"ü"}'.encode()
    )


def test_encode_record_encodes_what_users_log() -> None:
    np = pytest.importorskip("numpy")
    record = {
        "np_float": np.float32(1.5),
        "np_int": np.int64(7),
        "np_array": np.arange(3),
        "np_matrix": np.ones((2, 2), dtype=np.float16),
        "when": dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC),
        "day": dt.date(2024, 5, 6),
        "shade": Shade.DARK,
        "pair": (1, "b"),
        "set": {3, 1, 2},
        "mixed_set": frozenset({1}),
        "decimal": Decimal("2.25"),
        "id": uuid.UUID(int=1),
        "path": PurePosixPath("/tmp/x"),
        "step": Step(2, ("x", "y")),
        "loss": Loss(0.25, dt.date(2024, 1, 1)),
        "int_keys": {1: "one", 2: "two"},
    }
    assert decode(encode_record(record)) == {
        "np_float": 1.5,
        "np_int": 7,
        "np_array": [0, 1, 2],
        "np_matrix": [[1.0, 1.0], [1.0, 1.0]],
        "when": "2024-05-06T07:08:09+00:00",
        "day": "2024-05-06",
        "shade": "dark",
        "pair": [1, "b"],
        "set": [1, 2, 3],
        "mixed_set": [1],
        "decimal": 2.25,
        "id": "00000000-0000-0000-0000-000000000001",
        "path": "/tmp/x",
        "step": {"index": 2, "tags": ["x", "y"]},
        "loss": {"value": 0.25, "when": "2024-01-01"},
        "int_keys": {"1": "one", "2": "two"},
    }


def test_encode_record_encodes_nested_pydantic_models() -> None:
    base: Any = pytest.importorskip("pydantic").BaseModel

    class Inner(base):  # type: ignore[misc]
        shade: Shade

    assert decode(encode_record({"inner": [Inner(shade=Shade.DARK)], "s": {1.5}})) == {
        "inner": [{"shade": "dark"}],
        "s": [1.5],
    }


def test_non_finite_floats_in_records_become_null() -> None:
    np = pytest.importorskip("numpy")
    record = {"nan": math.nan, "inf": [-math.inf], "np": np.float64("nan"), "d": Decimal("NaN")}
    assert decode(encode_record(record)) == {"nan": None, "inf": [None], "np": None, "d": None}


def test_ints_beyond_64_bits_stay_exact() -> None:
    record = {"big": 2**100 + 1, "small": -(2**70), "nested": [{"x": 3**50}]}
    assert decode(encode_record(record)) == record


def test_invalid_unicode_is_repaired_with_a_warning_naming_the_field() -> None:
    with pytest.warns(RecordRepairWarning, match=r"episodes\[4\]\.traces\[0\]\.text"):
        payload = encode_record({"traces": [{"text": "a\ud800b"}]}, what="episodes[4]")
    assert decode(payload) == {"traces": [{"text": "a\ufffdb"}]}


def test_a_split_surrogate_pair_is_joined_not_replaced() -> None:
    with pytest.warns(RecordRepairWarning):
        payload = encode_record({"emoji": "\ud83d\ude00", "key\udfff": 1})
    assert decode(payload) == {"emoji": "\U0001f600", "key\ufffd": 1}


def test_an_unencodable_value_names_its_field_and_the_fix() -> None:
    record = {"traces": [{"metrics": {"loss": object()}}]}
    with pytest.raises(RecordEncodeError) as caught:
        encode_record(record, what="episodes[3]")
    error = caught.value
    assert error.path == "episodes[3].traces[0].metrics.loss"
    assert "builtins.object" in error.reason
    assert "convert it" in str(error)


def test_bytes_are_refused_with_the_fix() -> None:
    with pytest.raises(RecordEncodeError, match=r"record\.blob.*decode them"):
        encode_record({"blob": b"\x00"})


def test_keys_that_collide_once_encoded_are_refused() -> None:
    with pytest.raises(RecordEncodeError, match="same text"):
        encode_record({1: "a", "1": "b"})


def test_odd_keys_are_named() -> None:
    with pytest.raises(RecordEncodeError, match=r"record\.m.*dict key of type tuple"):
        encode_record({"m": {(1, 2): 3}})


def test_too_deep_and_self_referencing_values_are_refused() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(MAX_DEPTH + 5):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(RecordEncodeError, match="levels deep"):
        encode_record(deep)
    loop: dict[str, Any] = {}
    loop["self"] = [loop]
    with pytest.raises(RecordEncodeError, match="refers to itself"):
        encode_record(loop)


def nested(containers: int) -> dict[int, Any]:
    """``containers`` levels of JSON containers; the int key forces the slow path."""
    value: Any = 0
    for _ in range(containers - 1):
        value = [value]
    return {1: value}


def test_the_depth_limit_is_the_same_on_both_paths() -> None:
    # Found by fuzz/encode_record.py: the slow path once let through one level
    # more than orjson takes, which then escaped as a bare TypeError.
    assert decode(encode_record(nested(MAX_DEPTH)))["1"] is not None
    with pytest.raises(RecordEncodeError, match="levels deep"):
        encode_record(nested(MAX_DEPTH + 1))
    with pytest.raises(RecordEncodeError, match="levels deep"):
        encode_json(nested(MAX_DEPTH + 1))


def test_encode_record_of_real_episodes_is_their_json() -> None:
    for record in workloads.gsm8k(20) + workloads.agentic(5):
        assert decode(encode_record(WithRecord(record))) == record


@given(json_records())
def test_json_native_records_round_trip(record: dict[str, Any]) -> None:
    assert decode(encode_record(record)) == record


@settings(max_examples=300)
@given(nasty_values())
def test_anything_encodes_or_raises_record_encode_error(value: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordRepairWarning)
        try:
            payload = encode_record({"value": value})
        except RecordEncodeError as error:
            assert error.path.startswith("record")
            return
    decode(payload)  # always strict JSON: no NaN, valid UTF-8


# --------------------------------------------------------------------------- encode_json


def test_encode_json_refuses_nan_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"body\.summary\.avg\[1\]"):
        encode_json({"summary": {"avg": [1.0, math.nan]}})
    with pytest.raises(ValueError, match=r"body\.pair\[0\]"):
        encode_json({"pair": (math.inf, 1)})


def test_encode_json_refuses_numpy_nan() -> None:
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match=r"body\.x"):
        encode_json({"x": np.float32("nan")})


def test_encode_json_encodes_like_encode_record() -> None:
    body = {"run_id": "r", "step": 3, "big": 2**80, "when": dt.date(2024, 1, 1), "t": ("a",)}
    assert decode(encode_json(body)) == {
        "run_id": "r",
        "step": 3,
        "big": 2**80,
        "when": "2024-01-01",
        "t": ["a"],
    }
    assert encode_json([1, "x"]) == b'[1,"x"]'


# What json.loads can give back beyond orjson's: NaN, the infinities, an
# integer past 64 bits, a lone surrogate; and text that spells null.
_parsed_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["null", "nullity", "\ud800"])
)
_parsed_values = st.recursive(
    _parsed_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_parsed_values)
def test_encode_parsed_writes_or_refuses_a_parsed_value_as_encode_json_does(value: Any) -> None:
    """A sync's metrics rows are encoded without encode_json's walk
    (``encode_parsed``): the same bytes for every value a JSON parser gives,
    and the same refusal, naming the same field, of a NaN or an infinity."""

    def outcome(encode: Any) -> tuple[bytes | str, list[str]]:
        # A lone surrogate is repaired with a warning: the same one, too.
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                written: bytes | str = encode(value)
            except ValueError as exc:
                written = str(exc)
        return written, [str(w.message) for w in said]

    assert outcome(encode_parsed) == outcome(encode_json)


def test_encode_parsed_refuses_a_nan_beside_a_none_naming_it() -> None:
    with pytest.raises(ValueError, match=r"body\.metrics\.loss is nan"):
        encode_parsed({"metrics": {"rank": None, "loss": math.nan}})
    assert encode_parsed({"metrics": {"rank": None, "s": "null"}}) == (
        b'{"metrics":{"rank":null,"s":"null"}}'
    )


# --------------------------------------------------------------------------- clean_metrics


def test_clean_metrics_follows_the_contract() -> None:
    values = {
        "loss": 0.5,
        "nan": math.nan,
        "inf": -math.inf,
        "curve": [1.0, math.nan, 2.0, [math.inf, 3.0]],
        "nested": {"a": math.nan},
        "empty": {},
        "deep": {"keep": {"x": 1}, "drop": {"y": math.inf}},
        "rows": [{"z": math.nan}],
        "label": "text",
        "none": None,
    }
    original = json.dumps(values)
    assert clean_metrics(values) == {
        "loss": 0.5,
        "curve": [1.0, 2.0, [3.0]],
        "deep": {"keep": {"x": 1}},
        "rows": [{}],
        "label": "text",
        "none": None,
    }
    assert json.dumps(values) == original  # the input is not changed


def test_clean_metrics_drops_numpy_non_finite() -> None:
    np = pytest.importorskip("numpy")
    assert clean_metrics({"a": np.float32("nan"), "b": np.float32(1.0)}) == {"b": 1.0}


def test_clean_metrics_wants_str_keys() -> None:
    with pytest.raises(RecordEncodeError, match=r"metrics\.train\[3\].*must be str"):
        clean_metrics({"train": {3: 1.0}})
    with pytest.raises(TypeError, match="must be a mapping"):
        clean_metrics([1.0])  # type: ignore[arg-type]


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping):
        return any(_has_non_finite(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(item) for item in value)
    return False


@given(metric_mappings())
def test_clean_metrics_is_idempotent_and_leaves_nothing_non_finite(values: dict[str, Any]) -> None:
    once = clean_metrics(values)
    assert not _has_non_finite(once)
    assert clean_metrics(once) == once
    assert not any(isinstance(item, Mapping) and not item for item in once.values())
    orjson.dumps(once)


# --------------------------------------------------------------------------- record rules


def test_is_episode() -> None:
    assert is_episode({"traces": []})
    assert not is_episode({"id": "t"})


def test_stamp_run_keys_the_copy_to_the_platform_run() -> None:
    record = {
        "id": "e",
        "run": {"type": "train", "id": "local", "name": "n", "work": {"type": "train", "step": 3}},
        "traces": [{"id": "a"}, {"id": "b", "run": {"id": "x", "name": "own"}}, "odd"],
    }
    snapshot = json.dumps(record)
    stamped = stamp_run(record, "R1", "train")
    assert stamped["run"] == {
        "type": "train",
        "id": "R1",
        "name": "n",
        "work": {"type": "train", "step": 3},
    }
    assert stamped["traces"][0]["run"] == stamped["run"]
    assert stamped["traces"][0]["run"] is not stamped["run"]
    assert stamped["traces"][1]["run"] == {"id": "R1", "name": "own", "type": "train"}
    assert stamped["traces"][2] == "odd"
    assert json.dumps(record) == snapshot  # the producer's record is untouched


def test_stamp_run_gives_a_bare_trace_a_run_block() -> None:
    assert stamp_run({"id": "t"}, "R2", "eval") == {"id": "t", "run": {"id": "R2", "type": "eval"}}


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ({"type": "train", "id": "r", "work": {"type": "train", "step": 10}}, 10),
        ({"type": "train", "id": "r", "work": {"type": "train", "step": 0}}, 0),
        ({"type": "train", "id": "r", "work": {"type": "eval", "step": 10}}, None),
        ({"type": "eval", "id": "r", "work": {"type": "train", "step": 10}}, None),
        ({"type": "train", "id": "r", "work": {"type": "train", "step": True}}, None),
        ({"type": "train", "id": "r", "work": {"type": "train", "step": 1.0}}, None),
        ({"type": "train", "id": "r"}, None),
        (None, None),
    ],
)
def test_training_step(run: Any, expected: int | None) -> None:
    assert training_step({"run": run, "traces": []}) == expected


@given(st.integers(0, 10**6))
def test_training_step_reads_objects_too(step: int) -> None:
    @dataclasses.dataclass
    class Work:
        step: int
        type: str = "train"

    @dataclasses.dataclass
    class Run:
        work: Work
        type: str = "train"

    @dataclasses.dataclass
    class Episode:
        run: Run

    assert training_step(Episode(Run(Work(step)))) == step  # type: ignore[arg-type]
