"""Hostile values (issue #28): under the default ``on_error="warn"`` nothing a
user passes to ``log_*``, ``update_summary`` or ``finish`` raises. A value that
cannot be encoded (bytes, a cycle, a non-str key, nesting past the limit) or a
metric that is not a number (``"high"``, a list, ``None``) is dropped alone,
counted in ``failed_records["encode"]`` and named in one warning; the rest of
its record is journaled, and ``finish()`` journals its entry and closes the
run as asked whatever its summary holds.

Before the fix a ``bytes`` metric raised ``RecordEncodeError`` into the loop,
a cyclic dict raised ``RecursionError`` from ``log_metrics``,
``update_summary`` and ``finish(summary=)`` (the last left the run finished
without a finish entry, closed as crashed), and a metric that is not a number
was journaled and shipped without a word.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import rel_helpers as rh
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import primeruns as pr
from primeruns.journal import EntryKind


class _Opaque:
    """An object no encoder knows."""


def _cycle() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["again"] = loop
    return loop


def _cyclic_list() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _deep(levels: int = 400) -> dict[str, Any]:
    root: dict[str, Any] = {}
    cur = root
    for _ in range(levels):
        cur["a"] = {}
        cur = cur["a"]
    cur["leaf"] = 1.0
    return root


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in [v for v in os.environ if v.startswith("PRIME_")]:
        monkeypatch.delenv(var)
    return tmp_path / "runs"


@pytest.fixture
def run(isolated: Path) -> Iterator[pr.Run]:
    handle = pr.init(kind="train", model="m", team_id="t", mode="offline", runs_dir=isolated)
    yield handle
    if not handle.finished:
        handle.finish()


def _rows(run: pr.Run) -> list[dict[str, Any]]:
    assert run.journal_path is not None
    rows = rh.journal_records(run.journal_path, EntryKind.METRICS)
    return [{k: v for k, v in r.items() if k != "_timestamp"} for r in rows]


def _finishes(run: pr.Run) -> list[dict[str, Any]]:
    assert run.journal_path is not None
    return rh.journal_records(run.journal_path, EntryKind.FINISH)


# -- the rows of the issue, one by one ------------------------------------------------

BAD_METRICS = [
    ("bytes", b"\x00\xff", "decode"),
    ("cycle", _cycle(), "refers to itself"),
    ("text", "high", "not a number"),
    ("list", [1.0, 2.0], "not a number"),
    ("none", None, "not a number"),
    ("object", _Opaque(), "not a number"),
    ("deep", _deep(), "nested"),
]


@pytest.mark.parametrize(("label", "bad", "words"), BAD_METRICS, ids=[b[0] for b in BAD_METRICS])
def test_a_bad_metric_value_is_dropped_alone_counted_and_named(
    run: pr.Run, label: str, bad: Any, words: str
) -> None:
    run.log_metrics({"loss": 0.5, "bad": bad, "grad": {"norm": 2.0}}, step=3)  # never raises
    assert _rows(run) == [{"loss": 0.5, "grad": {"norm": 2.0}, "step": 3}]
    assert run.failed_records == {"encode": 1}
    assert any("log_metrics.bad" in e and words in e for e in run.errors), run.errors


def test_a_bad_value_nested_in_a_metric_group_is_dropped_alone(run: pr.Run) -> None:
    run.log_metrics({"eval": {"acc": 0.5, "note": "fine", 3: 1.0}}, step=0)
    assert _rows(run) == [{"eval": {"acc": 0.5}, "step": 0}]
    assert run.failed_records == {"encode": 2}
    assert any("log_metrics.eval.note" in e for e in run.errors), run.errors
    assert any("log_metrics.eval[3]" in e and "str" in e for e in run.errors), run.errors


def test_the_same_bad_field_warns_once_and_is_counted_every_time(
    run: pr.Run, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="primeruns")
    for step in range(50):
        run.log_metrics({"loss": 1.0 / (step + 1), "phase": "warmup"}, step=step)
    assert run.failed_records == {"encode": 50}
    assert len(_rows(run)) == 50
    said = [r.getMessage() for r in caplog.records if "log_metrics.phase" in r.getMessage()]
    assert len(said) == 1, said
    assert "not a number" in said[0]


@pytest.mark.parametrize(
    "bad",
    [_cycle(), _cyclic_list(), b"raw", _Opaque(), _deep(), {(1, 2): 1}],
    ids=["cycle", "cyclic-list", "bytes", "obj", "deep", "key"],
)
def test_update_summary_keeps_the_good_keys_of_a_bad_call(run: pr.Run, bad: Any) -> None:
    run.update_summary({"n": 1, "bad": bad, "note": "text is fine in a summary"})
    assert run.summary == {"n": 1, "note": "text is fine in a summary"}
    assert run.failed_records == {"encode": 1}
    assert any("update_summary.bad" in e for e in run.errors), run.errors


@pytest.mark.parametrize(
    "bad",
    [_cycle(), b"raw", _Opaque(), {(1, 2): 1}, _deep()],
    ids=["cycle", "bytes", "obj", "key", "deep"],
)
def test_finish_with_a_bad_summary_journals_its_entry_and_closes_as_asked(
    run: pr.Run, bad: Any
) -> None:
    run.log_episodes([{"id": "kept", "traces": []}])
    run.finish(summary={"n": 1, "bad": bad}, status="failed", error="diverged")
    assert run.finished and run.status is pr.RunStatus.FAILED
    [entry] = _finishes(run)
    assert entry["status"] == "failed" and entry["error"] == "diverged"
    assert entry["summary"] == {"n": 1}
    assert run.failed_records == {"encode": 1}
    assert any("summary.bad" in e for e in run.errors), run.errors


def test_a_summary_that_is_not_a_mapping_is_said_and_the_run_still_closes(run: pr.Run) -> None:
    run.update_summary({"n": 1})
    run.finish(summary=[("a", 1)])  # type: ignore[arg-type]
    assert run.status is pr.RunStatus.COMPLETED
    assert _finishes(run)[0]["summary"] == {"n": 1}
    assert any("mapping" in e for e in run.errors), run.errors


def test_a_summary_edited_in_place_into_a_cycle_does_not_stop_the_finish(run: pr.Run) -> None:
    run.update_summary({"n": 1})
    run.summary["loop"] = _cycle()  # the live summary is the user's dict
    run.finish()
    assert _finishes(run)[0]["summary"] == {"n": 1}
    assert run.status is pr.RunStatus.COMPLETED


def test_episodes_and_traces_with_hostile_fields_never_raise(run: pr.Run) -> None:
    run.log_episodes([{"id": "a", "traces": [], "x": _cycle()}, {"id": "b", "traces": []}])
    run.log_traces([{"id": "t1", "blob": b"x"}, {"id": "t2"}])
    run.log_traces(None)  # type: ignore[arg-type]
    assert run.journal_path is not None
    assert [e["id"] for e in rh.journal_records(run.journal_path, EntryKind.EPISODE)] == ["b"]
    assert [t["id"] for t in rh.journal_records(run.journal_path, EntryKind.TRACE)] == ["t2"]
    assert run.failed_records.get("encode") == 2


def test_online_the_row_reaches_the_platform_without_its_bad_fields(
    shared_platform: Any, tmp_path: Path
) -> None:
    """The vendor's 0.1.4 loses the whole row for one bytes value (its
    metrics sink cannot encode it) and ships text metrics without a word."""
    import json
    import sqlite3

    import rel_torture as rt

    lp = shared_platform
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = pr.init(
            kind="train",
            model="m",
            team_id="team-a",
            api_key=rt.KEY,
            base_url=lp.url,
            runs_dir=tmp_path / "runs",
        )
        run.log_metrics({"loss": 0.5, "blob": b"x", "phase": "warmup"}, step=0)
        run.log_metrics({"loss": 0.25, "loop": _cycle()}, step=1)
        run.finish(summary={"best": 0.25, "loop": _cycle()}, timeout=120)
    assert run.status is pr.RunStatus.COMPLETED
    assert run.failed_records == {"encode": 4}
    conn = sqlite3.connect(f"file:{lp.data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        query = "SELECT body FROM train_metrics WHERE run_id = ? ORDER BY step"
        bodies = [json.loads(r[0]) for r in conn.execute(query, (run.id,))]
    finally:
        conn.close()
    assert [{k: v for k, v in b.items() if k != "_timestamp"} for b in bodies] == [
        {"loss": 0.5, "step": 0},
        {"loss": 0.25, "step": 1},
    ]


# -- on_error="raise": the documented exception, and still a closed run ----------------


def test_under_raise_a_bad_metric_raises_type_error_after_journaling_the_rest(
    isolated: Path,
) -> None:
    run = pr.init(
        kind="train", model="m", team_id="t", mode="offline", runs_dir=isolated, on_error="raise"
    )
    with pytest.raises(TypeError, match=r"log_metrics\.blob"):
        run.log_metrics({"loss": 1.0, "blob": b"x"}, step=0)
    with pytest.raises(TypeError, match="refers to itself"):
        run.update_summary({"loop": _cycle()})
    with pytest.raises(TypeError, match=r"summary\.loop"):
        run.finish(summary={"n": 2, "loop": _cycle()})
    assert run.finished and run.status is pr.RunStatus.COMPLETED
    assert _rows(run) == [{"loss": 1.0, "step": 0}]
    assert _finishes(run)[0]["summary"] == {"n": 2}


# -- the property: any mix of good and hostile values ----------------------------------

_keys = st.from_regex(r"k_[a-z0-9]{1,6}", fullmatch=True)
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
_finite = st.floats(allow_nan=False, allow_infinity=False)
_int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)

good_metric = st.recursive(
    _finite | _int64 | st.booleans(),
    lambda inner: st.dictionaries(_keys, inner, min_size=1, max_size=3),
    max_leaves=6,
)
good_summary_value = st.recursive(
    _finite | _int64 | st.booleans() | st.none() | _text,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, min_size=1, max_size=3)
    ),
    max_leaves=6,
)
# Each of these is dropped whole and counted once wherever it stands.
unencodable = st.sampled_from(["bytes", "cycle", "object", "deep", "tuple-key"])
not_a_number = st.sampled_from(["text", "none", "list"])


def _make(label: str) -> Any:
    return {
        "bytes": lambda: b"\x00\xff",
        "cycle": _cycle,
        "object": _Opaque,
        "deep": _deep,
        "tuple-key": lambda: {(1, 2): 1.0},
        "text": lambda: "high",
        "none": lambda: None,
        "list": lambda: [1.0, 2.0],
    }[label]()


@dataclass
class Expected:
    episodes: list[str] = field(default_factory=list)
    traces: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    bad: int = 0
    bad_names: set[str] = field(default_factory=set)


def _fields(
    draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[str]
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """A mapping to pass, what of it must land, and the names that must be dropped."""
    passed: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key in draw(st.lists(_keys, max_size=5, unique=True)):
        if draw(st.booleans()):
            passed[key] = kept[key] = draw(good)
        else:
            passed[key] = _make(draw(bad))
            dropped.append(key)
    return passed, kept, dropped


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[tuple[str, Any]], dict[str, Any], Expected]:
    """Calls to make (name, argument), the finish summary, and what must land."""
    expected = Expected()
    calls: list[tuple[str, Any]] = []
    for n in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["episodes", "traces", "metrics", "summary"]))
        if op in ("episodes", "traces"):
            batch = []
            for i in range(draw(st.integers(0, 3))):
                rid = f"{op}-{n}-{i}"
                record: dict[str, Any] = {"id": rid}
                if op == "episodes":
                    record["traces"] = []
                if draw(st.booleans()):
                    record["x"] = draw(good_summary_value)
                    (expected.episodes if op == "episodes" else expected.traces).append(rid)
                else:
                    record["x"] = _make(draw(unencodable))
                    expected.bad += 1
                batch.append(record)
            calls.append((op, batch))
        elif op == "metrics":
            passed, kept, dropped = _fields(draw, good_metric, unencodable | not_a_number)
            calls.append((op, (passed, n)))
            expected.rows.append({**kept, "step": n})
            expected.bad += len(dropped)
            expected.bad_names.update(f"log_metrics.{k}" for k in dropped)
        else:
            passed, kept, dropped = _fields(draw, good_summary_value, unencodable)
            calls.append((op, passed))
            expected.summary.update(kept)
            expected.bad += len(dropped)
            expected.bad_names.update(f"update_summary.{k}" for k in dropped)
    final, kept, dropped = _fields(draw, good_summary_value, unencodable)
    expected.summary.update(kept)
    expected.bad += len(dropped)
    expected.bad_names.update(f"summary.{k}" for k in dropped)
    return calls, final, expected


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(session=sessions())
def test_under_warn_nothing_raises_every_good_record_lands_once_and_each_bad_one_is_counted(
    isolated: Path, session: tuple[list[tuple[str, Any]], dict[str, Any], Expected]
) -> None:
    calls, final, expected = session
    with tempfile.TemporaryDirectory(dir=isolated.parent) as scratch:
        run = pr.init(kind="train", model="m", team_id="t", mode="offline", runs_dir=scratch)
        for op, arg in calls:
            if op == "episodes":
                run.log_episodes(arg)
            elif op == "traces":
                run.log_traces(arg)
            elif op == "metrics":
                run.log_metrics(arg[0], step=arg[1])
            else:
                run.update_summary(arg)
        run.finish(summary=final)

        assert run.journal_path is not None
        path = run.journal_path
        assert [e["id"] for e in rh.journal_records(path, EntryKind.EPISODE)] == expected.episodes
        assert [t["id"] for t in rh.journal_records(path, EntryKind.TRACE)] == expected.traces
        assert _rows(run) == expected.rows
        assert run.summary == expected.summary
        [entry] = _finishes(run)
        assert entry["status"] == "completed" and entry["summary"] == expected.summary
        assert run.status is pr.RunStatus.COMPLETED
        assert run.failed_records.get("encode", 0) == expected.bad
        for name in expected.bad_names:
            assert any(name in e for e in run.errors), (name, run.errors)
