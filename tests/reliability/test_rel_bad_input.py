"""Bad input (issue #8 §5): every kind of malformed record, metric, summary,
config and ``init()`` argument. Init-time errors raise naming the argument;
loop-time errors never raise under ``on_error="warn"``: the record is counted
and ``run.errors`` names the field and the fix; and nothing already journaled
(or journaled alongside, in the same call) is lost.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rel_helpers as rh

import primeruns as pr
from primeruns.exceptions import ConfigurationError, JournalError
from primeruns.journal import EntryKind
from primeruns.records import RecordRepairWarning


class _Opaque:
    pass


class _RaisingRecord:
    def to_record(self) -> dict[str, Any]:
        raise RuntimeError("to_record exploded")


def _deep(levels: int) -> dict[str, Any]:
    root: dict[str, Any] = {"id": "deep", "traces": []}
    cur = root
    for _ in range(levels):
        cur["a"] = {}
        cur = cur["a"]
    return root


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pr.Run]:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in [v for v in os.environ if v.startswith("PRIME_")]:
        monkeypatch.delenv(var)
    handle = pr.init(
        kind="train", model="m", team_id="t", mode="offline", runs_dir=tmp_path / "runs"
    )
    yield handle
    if not handle.finished:
        handle.finish()


def _episodes(run: pr.Run) -> list[dict[str, Any]]:
    assert run.journal_path is not None
    return rh.journal_records(run.journal_path, EntryKind.EPISODE)


# (label, bad value, words the message must contain: the field and the fix)
UNENCODABLE = [
    ("object", {"id": "x", "traces": [], "obj": _Opaque()}, ["obj", "convert it to str"]),
    ("bytes", {"id": "x", "traces": [], "blob": b"\xff\xfe"}, ["blob", "decode"]),
    ("tuple key", {"id": "x", "traces": [], (1, 2): "v"}, ["tuple", "str"]),
    ("deep nesting", _deep(100_000), ["nested", "deep"]),
    ("to_record raises", _RaisingRecord(), ["to_record", "exploded"]),
]


@pytest.mark.parametrize(("label", "bad", "words"), UNENCODABLE, ids=[c[0] for c in UNENCODABLE])
def test_an_unencodable_record_is_counted_named_and_its_batch_mates_kept(
    run: pr.Run, label: str, bad: Any, words: list[str]
) -> None:
    run.log_episodes([{"id": "before", "traces": []}])
    mates = [{"id": "mate-1", "traces": []}, bad, {"id": "mate-2", "traces": []}]
    run.log_episodes(mates)  # never raises
    assert run.failed_records == {"encode": 1}
    assert any(all(w in e for w in words) for e in run.errors), run.errors
    assert [e["id"] for e in _episodes(run)] == ["before", "mate-1", "mate-2"]


def test_values_json_cannot_hold_are_made_valid_and_kept(run: pr.Run) -> None:
    run.log_episodes(
        [
            {"id": "nan", "traces": [], "reward": float("nan"), "inf": float("-inf")},
            {"id": "int-keys", "traces": [], 1: "a", 2.5: "b", None: "c"},
            {"id": "huge", "traces": [], "n": 10**400},
            {"id": "set", "traces": [], "s": {3}},
        ]
    )
    with pytest.warns(RecordRepairWarning, match="lone surrogates"):
        run.log_episodes([{"id": "surrogate", "traces": [], "text": "a\ud800b", "\udc80": 1}])
    got = {e["id"]: e for e in _episodes(run)}
    assert got["nan"]["reward"] is None and got["nan"]["inf"] is None
    assert got["int-keys"] == {"id": "int-keys", "traces": [], "1": "a", "2.5": "b", "null": "c"}
    assert got["huge"]["n"] == 10**400
    assert got["surrogate"]["text"] == "a\ufffdb"
    assert run.failed_records == {}


def test_non_finite_metrics_and_summaries_are_dropped_not_raised(run: pr.Run) -> None:
    run.log_metrics({"loss": float("nan"), "lr": float("inf"), "ok": 1.5}, step=0)
    run.update_summary({"best": float("nan"), "n": 3})
    run.finish(summary={"final": float("-inf"), "kept": 2})
    assert run.journal_path is not None
    rows = rh.journal_records(run.journal_path, EntryKind.METRICS)
    assert [{k: v for k, v in r.items() if k != "_timestamp"} for r in rows] == [
        {"ok": 1.5, "step": 0}
    ]
    assert run.summary == {"n": 3, "kept": 2}
    assert run.status is pr.RunStatus.COMPLETED


def test_bad_metric_arguments_never_raise_in_the_loop(run: pr.Run) -> None:
    run.log_metrics({1: 2.0}, step=1)  # type: ignore[dict-item]
    run.log_metrics([("a", 1)], step=1)  # type: ignore[arg-type]
    run.log_metrics({"a": 1.0}, step="one")  # type: ignore[arg-type]
    run.log_episodes({"id": "a mapping, not a list"})
    assert len(run.errors) == 4
    assert "str keys" in run.errors[0] and "mapping" in run.errors[1]
    assert "step must be an int" in run.errors[2] and "list of records" in run.errors[3]


# (label, log_metrics's arguments, words the message must contain)
BAD_STEPS: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    ("2**63", {"loss": 1.0}, {"step": 2**63}, ["step", "2**63 - 1"]),
    ("-2**63 - 1", {"loss": 1.0}, {"step": -(2**63) - 1}, ["step", "-2**63"]),
    ("a bool", {"loss": 1.0}, {"step": True}, ["step", "int"]),
    ("a float", {"loss": 1.0}, {"step": 3.0}, ["step", "int"]),
    ("values' 2**63", {"loss": 1.0, "step": 2**63}, {}, ["values['step']", "2**63 - 1"]),
]


@pytest.mark.parametrize(
    ("label", "values", "kwargs", "words"), BAD_STEPS, ids=[c[0] for c in BAD_STEPS]
)
def test_a_step_the_platform_cannot_keep_is_refused_at_the_call(
    run: pr.Run, label: str, values: dict[str, Any], kwargs: dict[str, Any], words: list[str]
) -> None:
    """A step beyond a 64-bit integer was journaled and then held back every
    metrics row logged after it: the step table merging a step's rows (and
    the platform) keep 64-bit integers, and each attempt failed the same
    way. A ``step=`` that is no int is refused as before; the values' own
    step of another type is left to the platform, as the vendor's SDK leaves it."""
    run.log_metrics({"loss": 0.5}, step=1)
    run.log_metrics(values, **kwargs)  # never raises
    run.log_metrics({"loss": 0.25}, step=-(2**63))  # the range's ends are kept
    run.log_metrics({"loss": 0.125}, step=2**63 - 1)
    assert run.failed_records == {"encode": 1}
    assert len(run.errors) == 1 and all(w in run.errors[0] for w in words), run.errors
    assert run.journal_path is not None
    rows = rh.journal_records(run.journal_path, EntryKind.METRICS)
    assert [r["step"] for r in rows] == [1, -(2**63), 2**63 - 1]


def test_an_episode_whose_step_the_platform_cannot_keep_is_refused_at_the_call(
    run: pr.Run,
) -> None:
    """An episode's ``run.work.step`` beyond 64 bits (its own or a trace's)
    made the local platform answer 500 to its upload each time, and every
    episode after it waited; its sample table row failed at each attempt."""
    work = {"type": "train", "step": 2**63}
    run.log_episodes(
        [
            {"id": "before", "traces": [], "run": {"work": {"type": "train", "step": 10}}},
            {"id": "own", "traces": [], "run": {"work": work}},
            {"id": "trace's", "traces": [{"id": "t", "run": {"work": work}}]},
            {"id": "ends", "traces": [], "run": {"work": {"type": "train", "step": -(2**63)}}},
        ]
    )
    assert run.failed_records == {"encode": 2}
    assert "episodes[1].run.work.step" in run.errors[0] and "2**63 - 1" in run.errors[0]
    assert "episodes[2].traces[0].run.work.step" in run.errors[1]
    assert [e["id"] for e in _episodes(run)] == ["before", "ends"]


def test_log_episodes_of_a_non_iterable_never_raises(run: pr.Run) -> None:
    run.log_episodes(None)  # type: ignore[arg-type]
    assert run.errors


def test_an_unencodable_summary_value_never_raises_and_does_not_poison_finish(
    run: pr.Run,
) -> None:
    run.update_summary({"obj": _Opaque()})
    run.update_summary({"n": 1})
    run.finish()
    assert run.status is pr.RunStatus.COMPLETED and run.summary == {"n": 1}


def test_an_unencodable_finish_summary_still_closes_the_run(run: pr.Run) -> None:
    run.log_episodes([{"id": "kept", "traces": []}])
    try:
        run.finish(summary={"obj": _Opaque(), "n": 1})
    finally:
        assert run.journal_path is not None
        finishes = rh.journal_records(run.journal_path, EntryKind.FINISH)
    assert finishes and finishes[-1]["status"] == "completed"


def test_a_record_over_the_64_mib_line_limit_does_not_lose_its_neighbours(
    run: pr.Run,
) -> None:
    run.log_episodes([{"id": "small-1", "traces": []}])
    run.log_episodes(
        [{"id": "huge", "traces": [], "blob": "x" * (65 << 20)}, {"id": "small-2", "traces": []}]
    )
    ids = [e["id"] for e in _episodes(run)]
    assert "small-1" in ids and "small-2" in ids


# -- init() -------------------------------------------------------------------------

# tags, on_error and finish_timeout are not here: what the vendor's SDK takes
# of them is taken with a warning (tests/test_run_api.py), not refused.
WRONG_TYPES: list[tuple[str, Any]] = [
    ("name", 5),
    ("model", 5),
    ("framework", 5),
    ("description", 5),
    ("config", 5),
    ("mode", 5),
    ("team_id", 5),
    ("api_key", 5),
    ("base_url", 5),
    ("kind", 5),
    ("id", 5),
    ("training", 5),
    ("traces_opt_out", "yes"),
    ("durability", 5),
    ("max_journal_bytes", "x"),
    ("mode", "onlien"),
    ("base_url", "not a url"),
]


@pytest.mark.parametrize(("arg", "value"), WRONG_TYPES, ids=[f"{a}={v!r}" for a, v in WRONG_TYPES])
def test_every_wrong_init_argument_raises_naming_it(
    arg: str, value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    kwargs: dict[str, Any] = {
        "environments": ["gsm8k"],
        "mode": "offline",
        "runs_dir": tmp_path / "runs",
        arg: value,
    }
    with pytest.raises((TypeError, ValueError, ConfigurationError)) as info:
        pr.init(**kwargs)
    assert arg in str(info.value), str(info.value)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize(("arg", "value"), [("environments", 5), ("runs_dir", 5)])
def test_wrong_environments_or_runs_dir_type_names_the_argument(
    arg: str, value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    kwargs: dict[str, Any] = {
        "environments": ["gsm8k"],
        "mode": "offline",
        "runs_dir": tmp_path / "runs",
        arg: value,
    }
    with pytest.raises((TypeError, ValueError)) as info:
        pr.init(**kwargs)
    assert arg in str(info.value), str(info.value)


def test_a_runs_dir_that_is_a_file_is_a_clear_init_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: Journal.create raised UnboundLocalError for this."""
    monkeypatch.setenv("HOME", str(tmp_path))
    afile = tmp_path / "file"
    afile.write_text("not a directory")
    with pytest.raises(JournalError, match="not a directory"):
        pr.init(environments=["gsm8k"], mode="offline", runs_dir=afile)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\xff\xfe lr = 1\n", ["not UTF-8", "save it as UTF-8"]),
        (b"# " + b"x" * (1 << 20), ["limit", "mapping"]),
    ],
    ids=["not-utf8", "too-large"],
)
def test_a_bad_config_file_is_an_init_error_with_the_fix(
    content: bytes, words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "train.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigurationError) as info:
        pr.init(environments=["gsm8k"], mode="offline", runs_dir=tmp_path / "runs", config=path)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert json.dumps(str(path))[1:-1] in str(info.value) or str(path) in str(info.value)


def test_a_record_over_the_line_limit_fails_counted_with_its_reason_online(
    shared_platform: Any, tmp_path: Path
) -> None:
    """The platform refuses a line over 64 MiB: that one record is counted as
    failed with the limit named, and the records around it land once."""
    import rel_torture as rt

    lp = shared_platform
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes([{"id": "small-1", "traces": []}])
        run.log_episodes(
            [
                {"id": "huge", "traces": [], "blob": "x" * (65 << 20)},
                {"id": "small-2", "traces": []},
            ]
        )
        run.finish(timeout=120)
    assert run.status is pr.RunStatus.COMPLETED
    assert run.failed_records == {"traces": 1}
    assert any("line limit" in e for e in run.errors), run.errors
    assert rh.platform_episode_ids(lp.data_dir, run.id) == {"small-1": 1, "small-2": 1}


def test_a_record_over_the_per_record_limit_is_counted_and_its_neighbours_kept(
    run: pr.Run,
) -> None:
    """Before the fix a 130 MiB record raised ValueError into the loop under
    ``on_error="warn"``, the valid record beside it was never journaled and the
    loss was counted nowhere."""
    run.log_episodes(
        [{"id": "huge", "traces": [], "blob": "x" * (130 << 20)}, {"id": "beside", "traces": []}]
    )
    assert [e["id"] for e in _episodes(run)] == ["beside"]
    assert run.failed_records.get("encode") == 1
    assert any("per-record limit" in e and "episodes[0]" in e for e in run.errors), run.errors


def test_a_mapping_that_is_not_an_episode_is_refused_at_log_time_naming_the_fix(
    run: pr.Run,
) -> None:
    """Before, a sample-shaped mapping (no ``traces`` list) was journaled, then
    refused by Prime Traces ("does not match line format 'episode'"), gave the
    sample table no row and ``from_episodes`` an avg_reward of 0.0: lost
    everywhere but counted nowhere useful. It is now refused when logged."""
    sample = {"id": "s", "prompt": "2+2?", "completion": "4", "reward": 1.0}
    run.log_episodes([sample, {"id": "real", "traces": []}])
    assert [e["id"] for e in _episodes(run)] == ["real"]
    assert run.failed_records.get("encode") == 1
    assert any("episodes[0]" in e and "Episode.to_record()" in e for e in run.errors), run.errors
