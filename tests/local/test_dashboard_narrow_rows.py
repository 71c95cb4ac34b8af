"""An evaluation's analysis reads each episode's row off the fields it needs
(``narrow_rows``), and the row is the one the whole record gives, whatever the
journal holds: duplicate keys, integers past 64 bits, NaN, numbers past the
doubles, lone surrogates, bytes that are not UTF-8, control characters,
nesting past the decoders' limits, fields of the wrong type, cut or
corrupted JSON. Where it cannot be shown, the whole record is decoded, within
``jsonbound``'s bounds, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sdk_helpers import point_at
from strategies import episode_records, trace_records

import primeruns as pr
from primeruns import jsonbound
from primeruns.local.dashboard import journal_source, narrow_rows
from primeruns.local.dashboard.journal_index import MAX_ENTRY_BYTES, decoded
from primeruns.local.dashboard.journal_source import JournalSource, _fact_of, _fact_of_payload
from primeruns.local.dashboard.rows import record_row

#: Names record_row reads, so duplicates and wrong types land where they matter.
_NAMES = [
    "id",
    "sample_id",
    "traces",
    "agent",
    "trainable",
    "rewards",
    "score",
    "weight",
    "task",
    "data",
    "name",
    "idx",
    "errors",
    "type",
    "message",
    "num_input_tokens",
    "num_output_tokens",
]

#: JSON texts (as bytes) that decoders read differently or refuse.
_HOSTILE = st.sampled_from(
    [
        b"18446744073709551616",  # 2**64: orjson reads a float, msgspec an int
        b"18446744073709551615",
        b"-9223372036854775809",
        b"-9223372036854775808",
        b"1180591620717411303424",
        b"1e400",
        b"-1e400",
        b"NaN",
        b"Infinity",
        b"-0",
        b"-0.0",
        b"1E2",
        b"0.1",
        b"01",
        b'"\\ud800"',  # a lone surrogate: json reads it, orjson and msgspec refuse it
        b'"\\udc00x"',
        b'"\\u0069d"',
        b'"\xff"',  # not UTF-8
        b'"\xed\xa0\x80"',  # a surrogate encoded
        b'"a\x01b"',  # a raw control character
        b'"\\q"',
        b"[" * 1100 + b"]" * 1100,
        b"[" * 990 + b"]" * 990,
        b"[1, {}]",
        b"{}",
        b"[]",
        b'""',
        b"null",
        b"true",
        b"false",
        b'{"score": 1, "weight": 18446744073709551616}',
        b'{"type": 2, "message": null}',
        b'{"id": 99999999999999999999999}',
        b'{"trainable": 0}',
    ]
)


def _key(name: str, escape: bool) -> bytes:
    if escape:  # the same name, every character escaped
        return b'"' + "".join(f"\\u{ord(c):04x}" for c in name).encode() + b'"'
    return json.dumps(name).encode()


def _text(value: str, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def _dumps(data: st.DataObject, value: Any, rate: int, depth: int = 0) -> bytes:
    """``value`` as JSON, with hostile texts (about one value in ``rate``; none
    for 0), duplicate keys and escaped keys drawn in."""
    if rate and depth < 8 and data.draw(st.integers(0, rate)) == 0:
        return data.draw(_HOSTILE)
    if isinstance(value, dict):
        pairs = list(value.items())
        if rate and data.draw(st.integers(0, 4)) == 0:  # a name twice: first or last wins
            name = data.draw(st.sampled_from(_NAMES + [k for k, _ in pairs]))
            at = data.draw(st.integers(0, len(pairs)))
            pairs.insert(at, (name, data.draw(st.none() | st.integers() | st.just({}))))
        parts = [
            _key(k, data.draw(st.integers(0, 10)) == 0) + b":" + _dumps(data, v, rate, depth + 1)
            for k, v in pairs
        ]
        return b"{" + b",".join(parts) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(_dumps(data, v, rate, depth + 1) for v in value) + b"]"
    if isinstance(value, str):
        return _text(value, data.draw(st.booleans()))
    if isinstance(value, float):
        return json.dumps(value).encode()  # NaN and Infinity as Python writes them
    return json.dumps(value).encode()


@st.composite
def _payloads(draw: st.DrawFn) -> bytes:
    record = draw(episode_records())
    if draw(st.integers(0, 4)):  # most with a trace
        record["traces"] = record["traces"] or [draw(trace_records())]
    if draw(st.integers(0, 5)):
        record["num_input_tokens"] = draw(st.integers(0, 10_000) | st.integers())
        record["num_output_tokens"] = draw(st.integers(0, 10_000))
    for trace in record["traces"]:
        data = trace["task"]["data"]
        data["id"] = draw(st.none() | st.text(max_size=5) | st.integers())
        if draw(st.booleans()):
            data["name"] = draw(st.text(max_size=5))
        if draw(st.integers(0, 3)) == 0:
            trace["errors"] = draw(
                st.lists(st.text(max_size=5) | st.fixed_dictionaries({"type": st.text()}))
            )
    if draw(st.integers(0, 12)) == 0:
        record[draw(st.sampled_from(_NAMES))] = draw(
            st.none() | st.integers() | st.text() | st.lists(st.integers(), max_size=2)
        )
    if draw(st.integers(0, 3)):  # most without NaN, which msgspec refuses
        record = json.loads(json.dumps(record).replace("NaN", "0.5"))
    payload = _dumps(draw(st.data()), record, draw(st.sampled_from([0, 0, 300, 30])))
    mutation = draw(st.sampled_from(["none"] * 12 + ["cut", "byte", "array"]))
    if mutation == "cut" and payload:
        payload = payload[: draw(st.integers(0, len(payload) - 1))]
    elif mutation == "byte":  # put in anywhere
        at = draw(st.integers(0, len(payload)))
        payload = payload[:at] + bytes([draw(st.integers(0, 255))]) + payload[at:]
    elif mutation == "array":  # not an object
        payload = b"[" + payload + b"]"
    return payload


def _today(payload: bytes, size: int) -> Any:
    """Episode 3's row (entry 7) as the analysis made it before: the whole record decoded."""
    return _fact_of(3, *decoded(7, payload, "", MAX_ENTRY_BYTES), size)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_payloads())
def test_the_narrow_row_is_the_whole_records_row_for_any_payload(payload: bytes) -> None:
    for size in (len(payload), journal_source.DIRECT_ROW_BYTES + 1):
        assert _fact_of_payload(3, 7, payload, "", size) == _today(payload, size)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(episode_records(), st.integers(0, 10_000), st.integers(0, 10_000))
def test_a_verifiers_record_is_read_narrow(record: dict[str, Any], read: int, wrote: int) -> None:
    record.update(num_input_tokens=read, num_output_tokens=wrote)
    try:
        payload = json.dumps(record, allow_nan=False).encode()
    except ValueError:  # a NaN score: msgspec refuses the literal, the record is read whole
        assume(False)
    whole = record_row(3, jsonbound.loads(payload, MAX_ENTRY_BYTES))
    if whole is not None:
        assert narrow_rows.narrow_row(3, payload) == whole


def test_without_msgspec_the_whole_record_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(narrow_rows, "_DECODER", None)
    payload = json.dumps(
        {"id": "e", "num_input_tokens": 1, "traces": [{"rewards": {"r": {"score": 1}}}]}
    ).encode()
    assert narrow_rows.narrow_row(0, payload) is None
    assert _fact_of_payload(0, 1, payload, "", len(payload)).reward == 1.0


def test_a_decode_bomb_is_refused_as_before() -> None:
    # Over a million values in a few MB: jsonbound refuses it, and so does the row.
    bomb = b'{"id":"e","num_input_tokens":1,"traces":[{}],"x":[' + b"{}," * 700_000 + b"{}]}"
    row = _fact_of_payload(3, 7, bomb, "", len(bomb))
    assert row == _today(bomb, len(bomb))
    assert row.error is not None and "values, over the" in row.error


def test_the_analysis_decodes_no_whole_record_of_a_verifiers_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    records = [
        {
            "id": f"e{i}",
            "num_input_tokens": 10 + i,
            "num_output_tokens": 5,
            "traces": [
                {
                    "agent": {"name": "agent", "trainable": True, "config": {"big": "x" * 500}},
                    "rewards": {"correct": {"score": i % 2, "weight": 1.0}},
                    "task": {"type": "T", "data": {"idx": i, "prompt": "p" * 500}},
                    "nodes": [{"message": {"role": "user", "content": "q" * 500}}],
                    "errors": [],
                }
            ],
            "errors": [],
        }
        for i in range(12)
    ]
    run = pr.init(name="narrow", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    run.log_episodes(records)
    run.finish()
    assert run.journal_path is not None
    wholes = []
    loads = jsonbound.loads
    monkeypatch.setattr(
        jsonbound, "loads", lambda payload, *a, **k: wholes.append(1) or loads(payload, *a, **k)
    )
    rows, total = JournalSource(runs).sample_facts(run.journal_path.name, 100)
    assert total == 12 and [r.reward for r in rows] == [float(i % 2) for i in range(12)]
    assert [r.task for r in rows] == [str(i) for i in range(12)]
    assert len(wholes) == 0  # jsonbound.loads read no episode whole


def test_a_usual_verifiers_record_is_rowed_off_its_structs(monkeypatch: pytest.MonkeyPatch) -> None:
    # No error, plain numbers and texts: the row is read off msgspec's structs,
    # neither made plain nor walked by record_row (a quarter of a row's cost).
    record = {
        "id": "e1",
        "num_input_tokens": 120,
        "num_output_tokens": 1362,
        "errors": [],
        "traces": [
            {
                "agent": {"name": "a", "trainable": True},
                "rewards": {"correct": {"score": 1.0, "weight": 0.5}, "fmt": {"score": 2}},
                "task": {"data": {"id": "gsm8k-0", "idx": 0, "prompt": "p"}},
                "nodes": [{"message": {"role": "user", "content": "q…"}}],
                "errors": [],
            }
        ],
    }
    payload = json.dumps(record, ensure_ascii=False).encode()
    walked: list[int] = []
    monkeypatch.setattr(
        narrow_rows, "record_row", lambda i, r: walked.append(i) or record_row(i, r)
    )
    row = narrow_rows.narrow_row(3, payload)
    assert row == record_row(3, json.loads(payload))
    assert row is not None and (row.reward, row.task, row.sample_id) == (2.5, "gsm8k-0", "e1")
    assert walked == []
