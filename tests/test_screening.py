"""The screen of a metrics row or a summary (``primeruns.screening``): what it
keeps, what it leaves out and how it names each field it leaves out."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from strategies import nasty_values

from primeruns import records, screening
from primeruns.screening import DEPTH_LIMIT, metrics_row, summary


def _paths(screened: screening.Screened) -> list[str]:
    return [error.path for error in screened.rejected]


def _cycle() -> dict[str, Any]:
    loop: dict[str, Any] = {"x": 1.0}
    loop["again"] = loop
    return loop


class _Exploding(Mapping[str, Any]):
    """A mapping whose reading raises (a lazy config proxy gone wrong)."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        return 1


class _AttributeBomb:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name} here")


# -- metrics rows ---------------------------------------------------------------------


def test_a_row_of_numbers_is_kept_as_given_in_a_new_dict() -> None:
    row = {"loss": 0.5, "step": 3, "done": True}
    screened = metrics_row(row)
    assert screened.kept == row and screened.kept is not row and screened.rejected == ()


def test_non_finite_numbers_and_emptied_groups_are_left_out_silently() -> None:
    screened = metrics_row({"a": math.nan, "b": -math.inf, "g": {"x": math.nan}, "c": 1.0})
    assert screened.kept == {"c": 1.0} and screened.rejected == ()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("high", ["text", "not a number", "update_summary"]),
        (None, ["None", "leave the key out"]),
        ([1.0, 2.0], ["list", "one number per key"]),
        (b"\x00", ["bytes", "decode"]),
        (object(), ["object", "float()"]),
        (np.array([1.0, 2.0]), ["ndarray", "one number per key"]),
    ],
    ids=["text", "none", "list", "bytes", "object", "array"],
)
def test_a_value_that_is_not_a_number_is_left_out_and_named_with_the_fix(
    value: Any, words: list[str]
) -> None:
    screened = metrics_row({"loss": 1.0, "bad": value}, what="log_metrics")
    assert screened.kept == {"loss": 1.0}
    [error] = screened.rejected
    assert error.path == "log_metrics.bad"
    assert all(w in str(error) for w in words), str(error)


def test_a_text_metric_is_not_repeated_in_the_message() -> None:
    [error] = metrics_row({"phase": "secret-token-123"}).rejected
    assert "secret-token-123" not in str(error)


def test_numpy_decimal_and_zero_d_values_are_numbers() -> None:
    screened = metrics_row(
        {
            "f32": np.float32(0.5),
            "i64": np.int64(7),
            "zero_d": np.array(2.5),
            "dec": Decimal("1.25"),
            "nan32": np.float32("nan"),
            "dec_nan": Decimal("NaN"),
        }
    )
    assert screened.kept == {"f32": 0.5, "i64": 7, "zero_d": 2.5, "dec": 1.25}
    assert screened.rejected == ()
    assert orjson.loads(records.encode_metrics_row(screened.kept)) == screened.kept


def test_a_nested_group_keeps_its_numbers_and_names_the_bad_field_inside() -> None:
    screened = metrics_row({"eval": {"acc": 0.5, "note": "ok", 3: 1.0}}, what="log_metrics")
    assert screened.kept == {"eval": {"acc": 0.5}}
    assert _paths(screened) == ["log_metrics.eval.note", "log_metrics.eval[3]"]
    assert "use str keys" in str(screened.rejected[1])


def test_a_non_str_key_at_the_top_is_left_out() -> None:
    screened = metrics_row({1: 1.0, None: 2.0, "ok": 3.0})  # type: ignore[dict-item]
    assert screened.kept == {"ok": 3.0}
    assert _paths(screened) == ["log_metrics[1]", "log_metrics[None]"]


def test_a_cycle_is_cut_where_it_closes_and_the_rest_kept() -> None:
    screened = metrics_row({"loss": 1.0, "c": _cycle()})
    assert screened.kept == {"loss": 1.0, "c": {"x": 1.0}}
    assert _paths(screened) == ["log_metrics.c.again"]
    assert "refers to itself" in str(screened.rejected[0])


def test_nesting_past_the_limit_is_left_out() -> None:
    root: dict[str, Any] = {}
    cur = root
    for _ in range(DEPTH_LIMIT + 5):
        cur["a"] = {}
        cur = cur["a"]
    cur["leaf"] = 1.0
    screened = metrics_row({"deep": root, "ok": 1.0})
    assert screened.kept == {"ok": 1.0}
    [error] = screened.rejected
    assert "nested more than" in str(error)


def test_a_mapping_that_raises_when_read_is_left_out_not_raised() -> None:
    screened = metrics_row({"ok": 1.0, "proxy": _Exploding()})
    assert screened.kept == {"ok": 1.0}
    assert "reading it raised RuntimeError" in str(screened.rejected[0])
    assert metrics_row(_Exploding()).kept == {}


def test_an_object_whose_attributes_raise_is_left_out_not_raised() -> None:
    screened = metrics_row({"ok": 1.0, "bomb": _AttributeBomb()})
    assert screened.kept == {"ok": 1.0} and _paths(screened) == ["log_metrics.bomb"]


def test_the_input_is_never_changed() -> None:
    row = {"a": math.nan, "b": "x", "g": {"c": None, "d": 1.0}}
    before = repr(row)
    metrics_row(row)
    summary(row)
    assert repr(row) == before


# -- summaries ------------------------------------------------------------------------


def test_a_summary_keeps_text_none_lists_and_what_the_encoder_knows() -> None:
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    values = {"note": "best", "none": None, "xs": [1, "a", None], "when": when, "s": {3}}
    screened = summary(values)
    assert screened.kept == values and screened.rejected == ()


def test_a_summary_leaves_out_bytes_cycles_objects_and_bad_keys_each_alone() -> None:
    cyclic_list: list[Any] = [1]
    cyclic_list.append(cyclic_list)
    values = {
        "n": 1,
        "blob": b"x",
        "loop": _cycle(),
        "obj": object(),
        "keys": {(1, 2): 1, "fine": 2},
        "xs": cyclic_list,
        "nan": math.nan,
        "nested_nan": [1.0, math.inf],
    }
    screened = summary(values, what="update_summary")
    assert screened.kept == {
        "n": 1,
        "loop": {"x": 1.0},
        "keys": {"fine": 2},
        "xs": [1],
        "nested_nan": [1.0],
    }
    assert _paths(screened) == [
        "update_summary.blob",
        "update_summary.loop.again",
        "update_summary.obj",
        "update_summary.keys[(1, 2)]",
        "update_summary.xs[1]",
    ]


def test_a_list_emptied_by_what_was_left_out_is_left_out_with_it() -> None:
    screened = summary({"xs": [b"a", b"b"], "empty": []})
    assert screened.kept == {"empty": []}
    assert _paths(screened) == ["summary.xs[0]", "summary.xs[1]"]


def test_a_model_dump_that_raises_is_left_out_not_raised() -> None:
    class Model:
        __pydantic_fields__: dict[str, Any] = {}

        def model_dump(self, **_: Any) -> Any:
            raise RuntimeError("validation blew up")

    screened = summary({"m": Model(), "ok": 1})
    assert screened.kept == {"ok": 1}
    assert "raised RuntimeError" in str(screened.rejected[0])


@settings(max_examples=200)
@given(nasty_values())
def test_the_screen_never_raises_and_what_it_keeps_always_encodes(value: Any) -> None:
    for screen in (metrics_row, summary):
        screened = screen({"v": value, "ok": 1})
        assert screened.kept["ok"] == 1
        wrapped = {"summary": screened.kept}  # as the finish entry holds it
        assert isinstance(orjson.loads(records.encode_record(wrapped)), dict)
