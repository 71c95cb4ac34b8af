"""The v0 sample projection and the training Parquet table, held to the vendor.

The golden fixtures in ``tests/data`` (made by ``tools/make_golden_projection.py``)
hold episodes as ``to_record()`` mappings next to what the vendor's
``prime-runs`` 0.1.4 computed from the same episodes as verifiers objects.
"""

from __future__ import annotations

import copy
import io
import itertools
import json
import logging
import math
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import episode_records

from primeruns import projection
from primeruns.projection import (
    ENVELOPE_BYTES,
    SampleRows,
    batch_samples,
    build_samples,
    episode_to_samples,
    episodes_to_parquet_bytes,
    episodes_to_parquet_rows,
    json_bytes,
    numbered_rows,
    parquet_available,
    record_to_samples,
    sample_rows,
    summary_trace_index,
    train_sample_schema,
)
from primeruns.records import encode_json

DATA = Path(__file__).resolve().parent / "data"
CREATED_AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def golden(name: str) -> dict[str, Any]:
    raw = (DATA / f"golden_{name}.json.zst").read_bytes()
    loaded: dict[str, Any] = json.loads(zstandard.ZstdDecompressor().decompress(raw))
    return loaded


class RecordObject:
    """A producer object that exposes only ``to_record()`` (and ``traces``)."""

    def __init__(self, record: dict[str, Any]) -> None:
        self._record = record
        self.traces = record.get("traces")

    def to_record(self) -> dict[str, Any]:
        return copy.deepcopy(self._record)


def same(actual: Any, expected: Any) -> bool:
    """Equality that also holds key order and int-vs-float (the JSON text of a
    row depends on both)."""
    return json.dumps(actual) == json.dumps(expected)


# --------------------------------------------------------------------------- v0 rows


def test_eval_rows_from_mappings_equal_the_vendor_rows_from_objects() -> None:
    case = golden("eval")
    inputs, first = case["inputs"], case["first_call"]
    counts: dict[Any, int] = {}
    rows = build_samples(inputs[:first], counts) + build_samples(inputs[first:], counts)
    assert same(rows, case["samples"])
    assert [[key, value] for key, value in counts.items()] == case["rollout_numbers"]


def test_eval_rows_from_objects_equal_those_from_mappings() -> None:
    case = golden("eval")
    counts: dict[Any, int] = {}
    rows = build_samples([RecordObject(record) for record in case["inputs"]], counts)
    assert same(rows, case["samples"])


def test_the_golden_covers_the_corner_cases() -> None:
    # Guards the fixture itself: the corner cases it was made for are in it.
    rows = {row["episode_id"]: row for row in golden("eval")["samples"]}
    assert rows["variant-no-rewards"]["reward"] == 0
    assert rows["variant-error"]["error"] == {
        "type": "ProviderError",
        "message": "upstream 500",
        "status_code": 500,
    }
    assert rows["variant-truncated-by-length"]["is_truncated"] is True
    assert len(rows["variant-branches"]["trajectory"]) == 2
    assert rows["variant-usage-counters"]["token_usage"]["cost"] == pytest.approx(0.5125)
    assert rows["variant-judge-first"]["info"]["native_trace_index"] == 1
    assert rows["variant-all-untrainable"]["agent"] == "agent"
    assert rows["variant-no-nodes-no-calls"]["token_usage"] is None
    assert rows["variant-nan-metric"]["metrics"]["nan_metric"] is None
    assert "variant-no-traces" not in rows


def test_rollout_numbers_count_per_example_across_calls() -> None:
    inputs = golden("eval")["inputs"][:8]  # examples 0 and 1, four rollouts each
    counts: dict[Any, int] = {}
    numbers = [
        row["rollout_number"] for record in inputs for row in build_samples([record], counts)
    ]
    assert numbers == [1, 2, 3, 4, 1, 2, 3, 4]
    assert counts == {0: 4, 1: 4}
    assert build_samples(inputs[:1], counts)[0]["rollout_number"] == 5


def test_oversize_episode_falls_back_to_one_row_per_trace(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    case = golden("oversize")
    monkeypatch.setattr(projection, "MAX_SAMPLES_PAYLOAD_BYTES", case["limit"])
    with caplog.at_level(logging.WARNING, logger="primeruns.projection"):
        rows = build_samples(case["inputs"])
    assert same(rows, case["samples"])
    big = case["inputs"][0]
    assert [row["sample_id"] for row in rows[:2]] == [trace["id"] for trace in big["traces"]]
    assert all("native_wrapper" not in (row["info"] or {}) for row in rows[:2])
    assert "native_wrapper" in rows[2]["info"]
    assert big["id"] in caplog.text


def test_v0_rows_pass_through_and_bare_traces_have_no_projection() -> None:
    row = {"sample_id": "s1", "reward": 1.0}
    trace = golden("eval")["inputs"][0]["traces"][0]
    assert build_samples([row, trace]) == [row]
    assert build_samples([row])[0] is not row
    assert record_to_samples(trace, {}) is None
    assert record_to_samples({"id": "e", "traces": []}, {}) == []


def test_non_finite_numbers_in_rows_become_null() -> None:
    record = copy.deepcopy(golden("eval")["inputs"][0])
    record["traces"][0]["metrics"]["loss"] = math.inf
    record["traces"][0]["rewards"]["nan_reward"] = {"score": math.nan, "weight": 1.0}
    record["traces"][0]["info"] = {"x": [math.nan]}
    (row,) = episode_to_samples(record, 1)
    assert row["metrics"]["loss"] is None
    assert row["nan_reward"] is None
    assert row["reward"] is None
    assert row["info"]["x"] == [None]
    assert row["info"]["native_wrapper"]["traces"][0]["metrics"]["loss"] is None
    encode_json(row)  # a valid request body


def test_non_finite_numbers_in_the_training_tables_text_columns_become_null() -> None:
    """Each text column is encoded as it is unless a value in it is not
    finite: then, and only then, copied with them nulled (the JSON a column
    holds is never refused for them, nor a row lost)."""
    record = copy.deepcopy(golden("train")["inputs"][0])
    plain = episodes_to_parquet_rows([record], "r", 10, created_at=CREATED_AT)
    record["traces"][0]["metrics"]["loss"] = math.inf
    record["traces"][0]["info"] = {"x": [math.nan, 1.5]}
    (row,) = episodes_to_parquet_rows([record], "r", 10, created_at=CREATED_AT)
    assert json.loads(row["metrics"])["loss"] is None
    assert json.loads(row["info"])["x"] == [None, 1.5]
    assert row["completion"] == plain[0]["completion"]  # the columns without one as ever
    assert ", " in row["info"]  # json.dumps' default separators, as the viewer's


def test_summary_trace_is_the_first_trainable_one() -> None:
    def trace(trainable: bool) -> dict[str, Any]:
        return {"agent": {"trainable": trainable}}

    assert summary_trace_index({"traces": [trace(False), trace(True), trace(True)]}) == 1
    assert summary_trace_index({"traces": [trace(False), trace(False)]}) == 0
    assert summary_trace_index(RecordObject({"traces": [{"agent": {}}]})) == 0


@settings(max_examples=60, deadline=None)
@given(episode_records())
def test_any_episode_mapping_projects_to_valid_rows(record: dict[str, Any]) -> None:
    rows = build_samples([record])
    assert len(rows) == (1 if record["traces"] else 0)
    for row in rows:
        encode_json(row)  # no NaN left, JSON all through
        assert row["sample_id"] == record["id"]
        branches = row["trajectory"]
        assert row["completion"] == (branches[-1]["messages"] if branches else [])


# --------------------------------------------------------------------------- batching


def test_batches_pack_rows_up_to_the_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(projection, "MAX_SAMPLES_PAYLOAD_BYTES", 200)
    rows = [{"sample_id": index, "pad": "x" * 40} for index in range(10)]
    batches = batch_samples(rows)
    assert [row for batch in batches for row in batch] == rows
    for batch in batches:
        body = encode_json({"samples": batch})
        assert len(body) <= 200
        assert len(body) == ENVELOPE_BYTES + sum(map(json_bytes, batch)) + len(batch) - 1
    # Greedy: the next row would not have fitted in the batch before it.
    for first, second in itertools.pairwise(batches):
        assert len(encode_json({"samples": [*first, second[0]]})) > 200


def test_a_row_that_fits_exactly_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    row = {"sample_id": 1, "pad": "y" * 30}
    monkeypatch.setattr(projection, "MAX_SAMPLES_PAYLOAD_BYTES", ENVELOPE_BYTES + json_bytes(row))
    assert batch_samples([row, row]) == [[row], [row]]


def test_a_row_too_large_to_send_alone_raises() -> None:
    row = {"sample_id": "big", "pad": "z" * projection.MAX_SAMPLES_PAYLOAD_BYTES}
    with pytest.raises(ValueError, match=r"sample 1 .*'big'.* too large"):
        batch_samples([{"sample_id": "small"}, row])


# --------------------------------------------------------------------------- Parquet

needs_pyarrow = pytest.mark.skipif(not parquet_available(), reason="pyarrow is not installed")


def read_rows(payload: bytes) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(io.BytesIO(payload)).to_pylist()
    return rows


@needs_pyarrow
def test_parquet_rows_from_mappings_equal_the_vendor_rows() -> None:
    case = golden("train")
    payload = episodes_to_parquet_bytes(
        case["inputs"],
        case["run_id"],
        case["step"],
        sample_id_offset=case["sample_id_offset"],
        created_at=CREATED_AT,
    )
    assert payload is not None
    rows = read_rows(payload)
    assert {row.pop("created_at") for row in rows} == {CREATED_AT}
    assert same(rows, case["rows"])
    objects = [RecordObject(record) for record in case["inputs"]]
    from_objects = episodes_to_parquet_bytes(
        objects,
        case["run_id"],
        case["step"],
        sample_id_offset=case["sample_id_offset"],
        created_at=CREATED_AT,
    )
    assert from_objects == payload


@needs_pyarrow
def test_training_v0_rows_equal_the_vendor() -> None:
    case = golden("train")
    assert same(build_samples(case["inputs"]), case["samples"])


@needs_pyarrow
def test_parquet_file_has_the_viewer_schema_and_options() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    case = golden("train")
    payload = episodes_to_parquet_bytes(case["inputs"], "r", 10, created_at=CREATED_AT)
    assert payload is not None
    parquet = pq.ParquetFile(io.BytesIO(payload))
    schema = parquet.schema_arrow
    assert schema == train_sample_schema()
    assert schema.field("created_at").type == pa.timestamp("us", tz="UTC")
    assert [schema.field(name).type for name in ("step", "problem_id", "sample_id")] == [
        pa.int64()
    ] * 3
    column = parquet.metadata.row_group(0).column(schema.get_field_index("run_id"))
    assert column.compression == "SNAPPY"
    assert column.statistics is not None and column.statistics.has_min_max
    assert any("DICTIONARY" in encoding for encoding in column.encodings)
    assert [row["sample_id"] for row in read_rows(payload)] == list(range(len(case["inputs"])))


@needs_pyarrow
def test_parquet_bytes_are_identical_for_identical_input() -> None:
    # An in-flight upload is resent byte-identical: same records, range, created_at.
    case = golden("train")
    first = episodes_to_parquet_bytes(
        case["inputs"], "r", 10, sample_id_offset=2**32, created_at=CREATED_AT
    )
    again = episodes_to_parquet_bytes(
        copy.deepcopy(case["inputs"]), "r", 10, sample_id_offset=2**32, created_at=CREATED_AT
    )
    assert first is not None and first == again
    later = episodes_to_parquet_bytes(case["inputs"], "r", 10, sample_id_offset=2**32)
    assert later != first  # created_at defaults to now


def _reference_parquet(episodes: list[Any], step: int, offset: int) -> bytes | None:
    """The object as ``Table.from_pylist`` of the rows made it: the bytes
    every version before the rows went to Arrow as one struct array sent."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = episodes_to_parquet_rows(
        episodes, "r", step, sample_id_offset=offset, created_at=CREATED_AT
    )
    if not rows:
        return None
    sink = pa.BufferOutputStream()
    pq.write_table(
        pa.Table.from_pylist(rows, schema=train_sample_schema()),
        sink,
        compression="snappy",
        use_dictionary=True,
        write_statistics=True,
    )
    reference: bytes = sink.getvalue().to_pybytes()
    return reference


@needs_pyarrow
def test_parquet_bytes_are_those_of_a_table_made_column_by_column() -> None:
    # The object's bytes are the wire's: the one-pass conversion of its rows
    # must make the table from_pylist made, nulls and non-ASCII text included.
    inputs = copy.deepcopy(golden("train")["inputs"])
    odd = inputs[1]
    odd["env"] = {"id": "envé😀"}
    for trace in odd["traces"]:
        trace["info"] = {"advantage": None, "note": "ü\u0000"}
    inputs[2]["traces"][0]["task"]["data"]["idx"] = None
    for step, offset in ((0, 0), (10, 2**32 + 5)):
        made = episodes_to_parquet_bytes(
            inputs, "r", step, sample_id_offset=offset, created_at=CREATED_AT
        )
        assert made is not None and made == _reference_parquet(inputs, step, offset)


@needs_pyarrow
@settings(max_examples=40, deadline=None)
@given(st.lists(episode_records(), min_size=1, max_size=3))
def test_any_episodes_make_the_bytes_of_a_table_made_column_by_column(
    records: list[dict[str, Any]],
) -> None:
    made = episodes_to_parquet_bytes(records, "r", 3, sample_id_offset=9, created_at=CREATED_AT)
    assert made == _reference_parquet(records, 3, 9)


@needs_pyarrow
def test_rows_without_trajectory_are_skipped_but_use_their_sample_id() -> None:
    inputs = golden("train")["inputs"][:3]
    hollow = copy.deepcopy(inputs[1])
    for trace in hollow["traces"]:
        trace["nodes"] = []
    payload = episodes_to_parquet_bytes([inputs[0], hollow, inputs[2]], "r", 0, sample_id_offset=7)
    assert payload is not None
    assert [row["sample_id"] for row in read_rows(payload)] == [7, 9]
    assert episodes_to_parquet_bytes([hollow], "r", 0) is None
    assert episodes_to_parquet_bytes([], "r", 0) is None


@needs_pyarrow
def test_problem_id_falls_back_to_the_sample_id() -> None:
    record = copy.deepcopy(golden("train")["inputs"][0])
    record["traces"][0]["task"]["data"]["idx"] = None
    other = copy.deepcopy(record)
    other["traces"][0]["task"]["data"]["idx"] = "not-a-number"
    payload = episodes_to_parquet_bytes([record, other], "r", 0, sample_id_offset=100)
    assert payload is not None
    assert [row["problem_id"] for row in read_rows(payload)] == [100, 101]


def test_pyarrow_is_imported_only_when_parquet_is_made() -> None:
    code = (
        "import sys, primeruns.projection as p; "
        "p.build_samples([]); p.parquet_available.__name__; "
        "assert 'pyarrow' not in sys.modules, 'pyarrow imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_vendor_import_name_reaches_this_module() -> None:
    import prime_runs.projection

    assert prime_runs.projection is projection
    assert prime_runs.projection.build_samples is build_samples


# ------------------------------------------------------------- rows made before numbering


def _numbered(record: dict[str, Any], number: int) -> list[bytes]:
    """``record_to_samples``' rows with the rollout numbered ``number``, encoded."""
    key = next(
        (t for t in record.get("traces") or [] if (t.get("agent") or {}).get("trainable", True)),
        (record.get("traces") or [{}])[0],
    )
    idx = ((key.get("task") or {}).get("data") or {}).get("idx")
    rows = record_to_samples(record, {idx: number - 1}) or []
    return [orjson.dumps(row) for row in rows]


def _encoded(made: SampleRows, number: int) -> list[bytes]:
    """The rows ``made.pieces`` gives, each on its own (its pieces less the
    comma after it), checking the size it gives."""
    pieces, size = made.pieces(number)
    assert len(b"".join(pieces)) == size
    step = 4 if made.numbered else 2
    return [b"".join(pieces[i : i + step - 1]) for i in range(0, len(pieces), step)]


@settings(max_examples=60, deadline=None)
@given(episode_records())
def test_rows_made_before_numbering_are_the_rows_numbered(record: dict[str, Any]) -> None:
    # Made once for both of an evaluation's sinks, before the sample table's
    # sink numbers the rollout: byte for byte what projecting it numbered gives.
    made = sample_rows(record)
    assert made is not None
    for number in (1, 9, 10, 123_456):
        assert made.fits(number)
        assert _encoded(made, number) == _numbered(record, number)
        assert list(made.sample_ids) == [
            str(row["sample_id"]) for row in record_to_samples(record, {}) or []
        ]


@settings(max_examples=60, deadline=None)
@given(episode_records())
def test_rows_made_with_the_records_json_are_the_rows_made_without(record: dict[str, Any]) -> None:
    # The sinks hand over the record's JSON made for its Prime Traces line
    # (``sinks.forms``): written into the row as it is, not encoded again.
    try:
        parsed = json.loads(json.dumps(record, allow_nan=False))  # as the journal holds it
    except ValueError:
        assume(False)  # a non-finite number: JSON has none
    alone = sample_rows(parsed, finite=True)
    assert sample_rows(parsed, finite=True, encoded=orjson.dumps(parsed)) == alone
    assert alone is not None
    if len(alone.rows) == 1 and alone.sample_ids[0] == parsed.get("id"):
        # The bytes handed over are the ones written (told apart by their indent).
        indented = orjson.dumps(parsed, option=orjson.OPT_INDENT_2)
        made = sample_rows(parsed, finite=True, encoded=indented)
        assert made is not None and b'"native_wrapper":' + indented in made.rows[0]


def test_a_row_the_numbers_digits_push_over_the_ceiling_goes_one_row_per_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = golden("oversize")["inputs"][0]  # two traces
    (row,) = record_to_samples(record, {}) or []
    # Fits with a one-digit number, not with a two-digit one.
    monkeypatch.setattr(projection, "MAX_SAMPLES_PAYLOAD_BYTES", ENVELOPE_BYTES + json_bytes(row))
    made = sample_rows(record)
    assert made is not None and made.fits(9) and not made.fits(10)
    ids, rows = numbered_rows(record, 10)
    assert rows == _numbered(record, 10) and len(rows) == len(record["traces"]) > 1
    assert list(ids) == [trace["id"] for trace in record["traces"]]


def test_rows_that_need_no_number_are_made_whole() -> None:
    v0 = {"sample_id": "s1", "reward": 1.0}
    made = sample_rows(v0)
    assert made is not None and not made.numbered
    assert _encoded(made, 7) == [orjson.dumps(v0)] and made.sample_ids == ("s1",)
    assert sample_rows({"id": "bare trace"}) is None
    empty = sample_rows({"id": "e", "traces": []})
    assert empty is not None and _encoded(empty, 1) == [] and not empty.numbered
