"""The Run handle's contract that needs no platform: modes, arguments, inputs."""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import select
import signal
import socket
from pathlib import Path
from typing import Any

import module_platform
import pytest
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.journal import EntryKind, Journal

# The runs of these tests are told apart by id: one server serves them all.
_server, local_platform = module_platform.fixtures()


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _journal_records(path: Path, kind: EntryKind) -> list[dict[str, Any]]:
    journal = Journal.open(path, owner=False)
    try:
        result = journal.read(0, kinds={kind}, max_entries=100_000, max_bytes=1 << 30)
        return [json.loads(e.payload) for e in result.entries]
    finally:
        journal.close()


def test_no_api_key_gives_a_disabled_run_that_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    with caplog.at_level(logging.WARNING):
        run = pr.init(environments=["gsm8k"], runs_dir=runs)
    assert run.mode == "disabled" and run.id.startswith("disabled-")
    assert "no API key" in caplog.text
    run.log_episodes([{"id": "e1", "traces": []}])
    run.finish()
    assert run.journal_path is None and not runs.exists()


def test_offline_run_journals_everything_and_touches_no_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, _closed_port_url())
    monkeypatch.setenv("PRIME_RUNS_MODE", "offline")
    run = pr.init(kind="train", model="m", team_id="t", base_url=_closed_port_url(), runs_dir=runs)
    run.log_metrics({"loss": 0.5, "nan": float("nan")}, step=3)
    run.log_episodes([{"id": "e1", "traces": []}])
    run.finish()
    assert run.url is None and run.mode == "offline"
    assert run.errors == []
    assert run.journal_path is not None
    metrics = _journal_records(run.journal_path, EntryKind.METRICS)
    assert len(metrics) == 1
    assert metrics[0]["loss"] == 0.5 and metrics[0]["step"] == 3 and "nan" not in metrics[0]
    assert "_timestamp" in metrics[0]
    finish = _journal_records(run.journal_path, EntryKind.FINISH)
    assert finish[0]["status"] == "completed"


def test_online_without_a_key_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    with pytest.raises(pr.ConfigurationError, match="API key"):
        pr.init(mode="online", runs_dir=runs)
    with pytest.raises(pr.ConfigurationError, match="not a mode"):
        pr.init(mode="sometimes", api_key=API_KEY, runs_dir=runs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": 3}, "name"),
        ({"model": ["m"]}, "model"),
        ({"kind": "pretrain"}, "kind"),
        ({"durability": "maybe"}, "durability"),
        ({"training": {"max_steps": 3}, "kind": "train"}, "training"),
        ({"training": pr.TrainingSpec()}, "training"),
        ({"environments": [3]}, "environments"),
        ({"environments": ["a/"]}, "slug"),
        ({"config": 3}, "config"),
        ({"traces_opt_out": "yes"}, "traces_opt_out"),
        # Bytes of the environment decoded with surrogateescape: an id is
        # matched exactly, so it is refused, not repaired as a name is.
        ({"id": "run-\udcff"}, "id holds text that is not valid Unicode"),
    ],
)
def test_wrong_argument_types_name_the_argument(
    kwargs: dict[str, Any], field: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    with pytest.raises((TypeError, ValueError, pr.ConfigurationError), match=field):
        pr.init(**{"environments": ["gsm8k"], "mode": "offline", "runs_dir": runs, **kwargs})


class _FloatRaises:
    """A value whose ``__float__`` raises something other than TypeError."""

    def __float__(self) -> float:
        raise RuntimeError("no float")

    def __repr__(self) -> str:
        return "_FloatRaises()"


class _IterRaises:
    """Tags whose iteration raises something other than TypeError."""

    def __iter__(self) -> Any:
        raise RuntimeError("no iteration")

    def __repr__(self) -> str:
        return "_IterRaises()"


class _EqRaises:
    """An on_error whose comparison raises (a numpy array's does)."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("ambiguous")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "_EqRaises()"


class _ReprRaises:
    """A value whose ``repr`` raises (an int of 5,000 digits' does)."""

    def __repr__(self) -> str:
        raise ValueError("no repr")


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"tags": "a,b"}, "tags='a,b' is taken as ['a,b']: pass a list of strings"),
        ({"tags": ["a", 3]}, "tags=['a', 3] is taken as ['a', '3']: pass a list of strings"),
        ({"on_error": "ignore"}, "on_error='ignore' is taken as 'warn': pass 'warn' or 'raise'"),
        ({"finish_timeout": -1}, "finish_timeout=-1 is taken as 0.0: pass a non-negative number"),
        ({"finish_timeout": "30"}, "finish_timeout='30' is taken as 30.0: pass a non-negative"),
        # Past a float, or a __float__ that raises: the default, as "x" is.
        ({"finish_timeout": 10**400}, "is taken as 300.0: pass a non-negative number"),
        ({"finish_timeout": _FloatRaises()}, "=_FloatRaises() is taken as 300.0: pass a"),
        ({"tags": _IterRaises()}, "tags=_IterRaises() is taken as []: pass a list of strings"),
        ({"on_error": _EqRaises()}, "on_error=_EqRaises() is taken as 'warn': pass 'warn'"),
        # The warning is said even where the value cannot be shown.
        ({"tags": _ReprRaises()}, "tags=<_ReprRaises> is taken as []: pass a list of strings"),
        ({"finish_timeout": -(10**5000)}, "finish_timeout=<int> is taken as 300.0: pass a"),
        # NaN was taken as 0 (max(0, nan)): the run closed out shipping nothing;
        # an infinity waited on the producer's side for ever.
        ({"finish_timeout": math.nan}, "finish_timeout=nan is taken as 300.0: pass a non-neg"),
        ({"finish_timeout": math.inf}, "finish_timeout=inf is taken as 300.0: pass a non-neg"),
        ({"finish_timeout": "-inf"}, "finish_timeout='-inf' is taken as 300.0: pass a non-"),
    ],
)
def test_what_the_vendors_sdk_takes_opens_the_run_with_a_warning_naming_the_fix(
    kwargs: dict[str, Any],
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Code written for the vendor's SDK ran with these (it reads any
    on_error but "raise" as "warn", max(0, float(finish_timeout)), and a
    string of tags as its characters); raised here, its caller (verifiers)
    would open a disabled run that keeps nothing."""
    runs = point_at(monkeypatch, tmp_path, None)
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs, **kwargs)
    run.log_episodes([{"id": "e0", "traces": []}])
    run.finish()
    assert run.status is pr.RunStatus.COMPLETED
    assert run.journal_path is not None
    assert [r["id"] for r in _journal_records(run.journal_path, EntryKind.EPISODE)] == ["e0"]
    assert any(said in r.getMessage() for r in caplog.records), caplog.text


def test_config_file_is_stored_byte_for_byte_and_bad_ones_fail_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    cfg = tmp_path / "train.toml"
    cfg.write_text("lr = 1e-4 # café\n", encoding="utf-8")
    run = pr.init(environments=["gsm8k"], mode="offline", config=cfg, runs_dir=runs)
    assert run.config_source == pr.ConfigSource(
        text="lr = 1e-4 # café\n", format="toml", filename="train.toml"
    )
    run.finish()
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(pr.ConfigurationError, match="not UTF-8"):
        pr.init(environments=["gsm8k"], mode="offline", config=bad, runs_dir=runs)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (256 * 1024 + 1))
    with pytest.raises(pr.ConfigurationError, match="limit"):
        pr.init(environments=["gsm8k"], mode="offline", config=big, runs_dir=runs)
    with pytest.raises(pr.ConfigurationError, match="does not exist"):
        pr.init(
            environments=["gsm8k"], mode="offline", config=tmp_path / "missing.toml", runs_dir=runs
        )


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Unencodable:
    pass


def test_unencodable_record_is_counted_and_named_under_warn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
    good = {"id": "ok", "traces": [], "info": {"color": Color.RED, "p": Point(1, 2.5), "s": {3}}}
    bad = {"id": "bad", "traces": [], "info": {"obj": Unencodable()}}
    with caplog.at_level(logging.WARNING):
        run.log_episodes([good, bad])
    assert run.failed_records == {"encode": 1}
    assert "info.obj" in caplog.text
    run.finish()
    assert run.journal_path is not None
    stored = _journal_records(run.journal_path, EntryKind.EPISODE)
    assert [r["id"] for r in stored] == ["ok"]
    assert stored[0]["info"] == {"color": "red", "p": {"x": 1, "y": 2.5}, "s": [3]}


def test_unencodable_record_raises_under_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs, on_error="raise")
    with pytest.raises(TypeError, match=r"info\.obj"):
        run.log_episodes([{"id": "bad", "traces": [], "info": {"obj": Unencodable()}}])
    run.finish()


def test_log_after_finish_raises_run_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
    run.finish()
    run.finish()  # idempotent
    with pytest.raises(pr.RunFinishedError):
        run.log_episodes([])
    with pytest.raises(pr.RunFinishedError):
        run.log_metrics({"a": 1})
    with pytest.raises(ValueError, match="terminal"):
        pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs).finish(status="running")


def test_summary_drops_non_finite_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
    run.update_summary({"a": 1.0, "b": float("inf"), "n": {"x": float("nan")}})
    run.finish(summary={"c": [1.0, float("nan")]})
    assert run.summary == {"a": 1.0, "c": [1.0]}


def test_journal_files_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(
        environments=["gsm8k"], mode="offline", runs_dir=runs, api_key="sk-very-secret-key-999"
    )
    run.log_episodes([{"id": "e", "traces": []}])
    run.finish()
    path = run.journal_path
    assert path is not None
    assert path.stat().st_mode & 0o777 == 0o700
    for child in path.iterdir():
        assert child.stat().st_mode & 0o077 == 0, child.name
        if child.is_file():
            assert b"sk-very-secret-key-999" not in child.read_bytes()


def test_an_evaluation_without_environments_is_refused_at_init_even_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, an offline eval without environments= was accepted and then
    could never be synced (an EnvironmentResolutionError from primeruns sync)."""
    runs = point_at(monkeypatch, tmp_path, None)
    with pytest.raises(pr.ConfigurationError, match="environments="):
        pr.init(mode="offline", runs_dir=runs)
    assert not runs.exists() or not any(runs.iterdir())


def test_a_numpy_integer_step_is_a_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, ``log_metrics(step=numpy.int64(2))`` dropped the row."""
    import numpy as np

    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(kind="train", model="m", team_id="t", mode="offline", runs_dir=runs)
    run.log_metrics({"loss": 0.5}, step=np.int64(2))
    run.finish()
    assert run.failed_records == {}
    assert run.journal_path is not None
    with Journal.open(run.journal_path, owner=False) as journal:
        rows = journal.read(0, kinds={EntryKind.METRICS}, max_entries=10).entries
    assert [json.loads(r.payload)["step"] for r in rows] == [2]


def test_a_base_url_carrying_credentials_is_refused_without_repeating_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, ``http://user:KEY@host`` was stored in the journal's meta and
    printed by ``primeruns show``."""
    runs = point_at(monkeypatch, tmp_path, None)
    with pytest.raises(pr.ConfigurationError) as info:
        pr.init(
            environments=["gsm8k"],
            mode="offline",
            api_key=API_KEY,
            base_url="http://user:sk-secret-in-url@127.0.0.1:9",
            runs_dir=runs,
        )
    assert "credentials" in str(info.value) and "sk-secret-in-url" not in str(info.value)


def test_edits_to_the_live_summary_and_config_are_stored_with_the_run(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As with the vendor's SDK, ``run.summary`` and ``run.config`` are the
    run's own mappings: what a user puts there before ``finish()`` lands on
    the platform (a value that cannot be encoded is left out and named)."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, runs_dir=runs,
                  base_url=local_platform.url, config={"lr": 1})  # fmt: skip
    run.config["edited"] = 2
    run.summary["note"] = "by hand"
    run.summary["bad"] = object()
    run.finish(timeout=60)
    stored = local_platform.run(run.id)
    assert stored["config"]["edited"] == 2 and stored["config"]["lr"] == 1
    assert stored["summary"]["note"] == "by hand" and "bad" not in stored["summary"]
    assert any("bad" in e for e in run.errors), run.errors


def test_a_forked_child_never_waits_on_a_lock_its_parent_held_at_the_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parent thread holds the run's lock while another forks: the child's
    log call must return (its records kept in a journal of the child's own),
    not wait forever."""
    import os
    import threading

    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with run._recorder.lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: log, then say whether anything was dropped
        try:
            run.log_metrics({"a": 1.0})
            run.log_episodes([{"id": "e", "traces": [{}]}])
            os._exit(0 if run.dropped_records == 0 else 3)
        finally:
            os._exit(4)
    release.set()
    holder.join()
    # The child's exit, as an event (a pidfd), bounded: a deadlocked child is the failure.
    pidfd = os.pidfd_open(pid)
    try:
        exited, _, _ = select.select([pidfd], [], [], 30)
    finally:
        os.close(pidfd)
    if not exited:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on a lock its parent held at the fork")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    run.finish()


def test_the_value_types_behave_as_the_vendors() -> None:
    assert pr.RunStatus("completed").is_terminal() and not pr.RunStatus.RUNNING.is_terminal()
    assert str(pr.RunStatus.FAILED) == "RunStatus.FAILED" and pr.RunStatus.FAILED == "failed"
    spec = pr.TrainingSpec(max_steps=3)
    spec.max_steps = 10  # plain dataclasses, settable as the vendor's are
    assert spec.max_steps == 10
    source = pr.ConfigSource.from_mapping({"text": "a = 1", "filename": "c.toml"})
    assert source == pr.ConfigSource(text="a = 1", format="toml", filename="c.toml")
    assert pr.ConfigSource.from_mapping({"format": "toml"}) is None
    assert pr.ConfigSource.coerce(None) is None and pr.ConfigSource.coerce(source) is source
    with pytest.raises(pr.ConfigurationError, match="does not exist"):
        pr.ConfigSource.coerce("no/such/file.toml")
    with pytest.raises(pr.ConfigurationError, match="kind"):
        pr.init(mode="disabled", kind="pretrain")
    assert pr.init(mode="disabled", finish_timeout=None).mode == "disabled"


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_run_url_of_a_local_run_opens_its_page_on_the_local_platform(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The real dashboard's paths on the local origin: what ``run.url`` prints
    opens that run, not the production site or an anchor that is not there."""
    import httpx

    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    extra: dict[str, Any] = (
        {"kind": "train", "team_id": "team-a", "training": pr.TrainingSpec(max_steps=1)}
        if kind == "train"
        else {"environments": ["gsm8k"]}
    )
    run = pr.init(name="url <probe>", model="m", api_key=API_KEY, base_url=local_platform.url,
                  runs_dir=runs, **extra)  # fmt: skip
    section = "training" if kind == "train" else "evaluations"
    assert run.url == f"{local_platform.url}/dashboard/{section}/{run.id}"
    run.finish(timeout=60)
    page = httpx.get(run.url, timeout=10)
    assert page.status_code == 200 and run.id in page.text
    assert "url &lt;probe&gt;" in page.text and "url <probe>" not in page.text  # escaped
    assert "COMPLETED" in page.text.upper()
