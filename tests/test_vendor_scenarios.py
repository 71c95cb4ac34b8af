"""The vendor's own test scenarios, run against this SDK and the local platform.

The vendor's ``prime-runs`` 0.1.4 ships a test suite; most of it reads its
private modules (its worker, sinks and HTTP client, ``run._worker``) and
cannot import here. Each test below is one of its scenarios a caller can
observe through the public API (``import prime_runs as pr``), in our words:
instead of a mocked transport answering canned routes, the run registers and
ships to the local platform, and the test reads back what a caller's
dashboard would show. Records are the ``to_record()`` mappings verifiers
logs (the vendor's fakes stand in for verifiers' objects).

Where this SDK answers otherwise on purpose, the test asserts this SDK's
answer and ``tools/compat/differences.txt`` lists the scenario (``suite:``
lines) with the reason; a test at the end checks that every listed scenario
is one of the vendor's and that it is asserted here.

Not ported: scenarios of the vendor's private parts (``test_http``,
``test_worker``, the sink, backend and projection modules' internals, a
failed create closing the vendor's client, the retirement cooldowns of its
uploaders, a Parquet encoder or ``parquet_available`` patched in), and those
that need the Prime Traces service to answer 401, 403 or 400 to an upload,
which the local platform does not inject (``tests/test_sdk_configurations.py``
covers a refused record).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import module_platform
import prime_runs as pr
import pytest
import workloads
from prime_runs import metrics
from prime_runs.exceptions import ConfigurationError
from prime_runs.journal import EntryKind, Journal
from prime_runs.models import CONFIG_SOURCE_KEY, MAX_CONFIG_SOURCE_BYTES, ConfigSource
from prime_traces import TracesClient
from sdk_helpers import API_KEY, point_at

TEAM = "team-1"
# "team-outside" is not allowlisted for external training runs.
_server, local_platform = module_platform.fixtures(train_teams=[TEAM])

TESTS = Path(__file__).resolve().parent
DIFFERENCES = TESTS.parent / "tools" / "compat" / "differences.txt"

EVAL_TOML = """\
# the environment we are measuring
environment = "primeintellect/terminal-bench-2"
model = "deepseek/deepseek-v4-flash"

[env]
num_examples = 1
"""


# -- helpers ----------------------------------------------------------------------


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_platform: Any) -> Path:
    """This machine's settings kept out, the SDK pointed at the local platform."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_API_BASE_URL", local_platform.url)
    monkeypatch.setenv("PRIME_RUNS_DIR", str(runs))
    return runs


def _get(lp: Any, path: str, **params: Any) -> Any:
    answer = httpx.get(
        f"{lp.url}{path}", params=params, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    answer.raise_for_status()
    return answer.json()


def _post(lp: Any, path: str, body: dict[str, Any]) -> Any:
    answer = httpx.post(
        f"{lp.url}{path}", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    answer.raise_for_status()
    return answer.json()


def _sample_ids(lp: Any, run_id: str) -> list[str]:
    rows = _get(lp, f"/api/v1/evaluations/{run_id}/samples", page=1, limit=1000)["samples"]
    return [row["sample_id"] for row in rows]


def _traced_episodes(lp: Any, run_id: str) -> int:
    return int(lp.run(run_id)["traces"]["distinct_episodes"])


def _eval(**kwargs: Any) -> pr.Run:
    params: dict[str, Any] = {
        "name": "test-run",
        "environments": ["gsm8k"],
        "model": "Qwen3-8B",
        "framework": "verifiers",
        "api_key": API_KEY,
        **kwargs,
    }
    return pr.init(**params)


def _train(**kwargs: Any) -> pr.Run:
    kwargs.setdefault("name", "test-run")
    kwargs.setdefault("model", "Qwen/Qwen3-8B")
    kwargs.setdefault("environments", ["primeintellect/vf-math"])
    kwargs.setdefault("team_id", TEAM)
    return pr.init(kind="train", api_key=API_KEY, **kwargs)


def _episodes(n: int) -> list[dict[str, Any]]:
    return workloads.gsm8k(n)


def _step_episodes(step: int, n: int) -> list[dict[str, Any]]:
    """``n`` training episodes stamped with ``step``, as prime-rl hands them over."""
    return workloads.agentic_by_step(n)[step]


def _launcher_evaluation(lp: Any) -> str:
    """An evaluation a launcher created, with a config document of its own."""
    body = {"name": "hosted", "environments": [{"id": "gsm8k"}], "metadata": {"launcher": 1}}
    return str(_post(lp, "/api/v1/evaluations/", body)["evaluation_id"])


def _launcher_training_run(lp: Any) -> str:
    body = {"name": "managed", "base_model": "Qwen/Qwen3-8B", "team_id": TEAM, "max_steps": 10}
    return str(_post(lp, "/api/v1/rft/external-runs", body)["run"]["id"])


def _trace(reward: float, *, trainable: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex,
        "agent": {"name": "solver", "trainable": trainable},
        "rewards": {"correct": {"score": reward, "weight": 1.0}},
        **extra,
    }


# -- modes (the vendor's test_init.py) ---------------------------------------------------


def test_without_a_key_the_run_is_disabled_and_the_caller_is_told(
    runs: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING):
        run = pr.init(name="local")
    assert run.mode == "disabled"
    assert "no API key" in caplog.text and "disabled" in caplog.text
    run.finish()


def test_the_mode_can_come_from_the_environment(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_RUNS_MODE", "disabled")
    run = pr.init(name="local", api_key=API_KEY)
    assert run.mode == "disabled"
    run.finish()


def test_an_unknown_mode_is_refused(runs: Path) -> None:
    with pytest.raises(ConfigurationError, match="sideways"):
        pr.init(mode="sideways")


def test_a_disabled_run_answers_every_call_and_writes_nothing(runs: Path) -> None:
    home = Path(os.environ["HOME"])
    run = pr.init(mode="disabled")
    run.log_traces([{"id": "t1"}])
    run.finish(summary={"avg_reward": 1.0})
    assert run.id.startswith("disabled-")
    assert run.url is None
    assert run.status is pr.RunStatus.COMPLETED
    assert run.dropped_records == 0
    assert not list(home.iterdir()) and not runs.exists()


class _Opaque:
    """A value no JSON encoder takes (a tokenizer, a client handle)."""


def _fallback_after_refusal(identity: dict[str, Any], refused: type, match: str) -> pr.Run:
    """verifiers' path: the online run refused at init (``refused``, its
    message matching ``match``), then the disabled run it opens unguarded
    with the same identity, which must log and finish."""
    with pytest.raises(refused, match=match):
        pr.init(mode="online", api_key=API_KEY, **identity)
    run = pr.init(mode="disabled", **identity)
    run.log_episodes(_episodes(1))
    run.finish()
    assert run.mode == "disabled" and run.status is pr.RunStatus.COMPLETED
    return run


def test_the_disabled_fallback_takes_the_config_the_online_run_refused(runs: Path) -> None:
    """verifiers opens a disabled run, unguarded, when opening its run
    raised: a config that cannot be stored must not fail that one too (a
    disabled run stores nothing; the vendor keeps the mapping as given)."""
    identity: dict[str, Any] = {
        "name": "x",
        "environments": ["gsm8k"],
        "model": "m",
        "framework": "verifiers",
        "config": {"model": "m", "tokenizer": _Opaque(), "stop": b"\n", (1, 2): 3},
    }
    run = _fallback_after_refusal(identity, TypeError, "config")
    assert run.config["stop"] == b"\n" and run.config[(1, 2)] == 3


def test_the_disabled_fallback_takes_an_environment_the_online_run_refused(
    runs: Path,
) -> None:
    """As with the config: 'a/b/c' is refused when the run is opened here
    (the vendor's SDK fails later, in its hub lookup: differences.txt), but
    the disabled run verifiers opens instead, with the same identity,
    resolves no environment."""
    identity: dict[str, Any] = {"name": "x", "environments": ["team/tasks/v2"], "model": "m"}
    _fallback_after_refusal(identity, ValueError, "owner/name")


def _no_entry(uid: int) -> Any:
    raise KeyError(f"getpwuid(): uid not found: {uid}")


def _without_a_home(monkeypatch: pytest.MonkeyPatch, runs: Path) -> Path:
    """A job under a user id the password database does not know, with no
    HOME (a container's arbitrary uid, ``env -i``): ``Path.home()`` raises
    RuntimeError. Returns its temporary directory (a private folder)."""
    import pwd

    monkeypatch.delenv("HOME")
    monkeypatch.setattr(pwd, "getpwuid", _no_entry)
    scratch = runs.parent / "scratch"
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    scratch.mkdir(mode=0o700)
    return scratch


def _ships_from(scratch: Path, caplog: pytest.LogCaptureFixture, **identity: Any) -> str:
    """An online run opened, logged, finished and shipped from a folder in
    ``scratch``; what it warned."""
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run = pr.init(mode="online", api_key=API_KEY, **identity)
    run.log_episodes(_episodes(2))
    run.finish(timeout=60)
    assert run.status is pr.RunStatus.COMPLETED and run.url is not None
    assert run.journal_path is not None and scratch in run.journal_path.parents
    return " ".join(r.getMessage() for r in caplog.records)


def test_the_disabled_fallback_opens_where_no_home_directory_can_be_found(
    runs: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A job under a user id the password database does not know, with no
    HOME (a container's arbitrary uid, ``env -i``): ``Path.home()`` raises
    RuntimeError. Before, init() raised it, and so did the disabled run
    verifiers opens instead, unguarded: the eval died (the vendor's SDK dies
    so too). Now an online run journals in a fallback folder and ships,
    saying why and the fix; an offline run (kept for a later sync, where a
    fallback folder may not last) names the fix; the disabled one opens;
    and with a runs directory set no home is needed at all."""
    monkeypatch.delenv("PRIME_RUNS_DIR")
    scratch = _without_a_home(monkeypatch, runs)
    identity: dict[str, Any] = {"name": "x", "environments": ["gsm8k"], "model": "m"}
    said = _ships_from(scratch, caplog, **identity)
    assert "no default runs directory" in said and "PRIME_RUNS_DIR" in said
    with pytest.raises(ConfigurationError, match="PRIME_RUNS_DIR"):
        pr.init(mode="offline", **identity)
    run = pr.init(mode="disabled", **identity)
    run.log_episodes(_episodes(1))
    run.finish()
    assert run.mode == "disabled" and run.status is pr.RunStatus.COMPLETED
    monkeypatch.setenv("PRIME_RUNS_DIR", str(runs))
    run = pr.init(mode="online", api_key=API_KEY, **identity)
    run.log_episodes(_episodes(2))
    run.finish(timeout=60)
    assert run.status is pr.RunStatus.COMPLETED and run.url is not None


def test_a_runs_dir_under_a_home_that_cannot_be_found_is_a_configuration_problem(
    runs: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``PRIME_RUNS_DIR="~/runs"`` (quoted in a job script: the shell left
    the ``~``) in a job with no home directory. Before, expanding it raised
    RuntimeError from every init(): the online one, and the disabled one
    verifiers opens instead, unguarded, so the eval died. Now the disabled
    run opens, the online one journals in a fallback folder and ships, and
    the offline one names the variable."""
    monkeypatch.setenv("PRIME_RUNS_DIR", "~/runs")
    scratch = _without_a_home(monkeypatch, runs)
    identity: dict[str, Any] = {"name": "x", "environments": ["gsm8k"], "model": "m"}
    run = pr.init(mode="disabled", **identity)
    run.finish()
    assert run.mode == "disabled" and run.status is pr.RunStatus.COMPLETED
    assert "PRIME_RUNS_DIR='~/runs'" in _ships_from(scratch, caplog, **identity)
    with pytest.raises(ConfigurationError, match="PRIME_RUNS_DIR"):
        pr.init(mode="offline", **identity)


def test_a_requeued_job_with_no_home_directory_ships_what_its_first_attempt_left(
    runs: Path, local_platform: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job attached to a launcher's evaluation, in a container with no
    home directory, is requeued after its first attempt left episodes
    unshipped (the platform refused them). Both attempts journal in the
    fallback folder, so the second takes the first's journal over
    (``earlier_journals``). Before, the take-over looked up the sync root
    under the missing home, and its uplink died at start: shipping went on
    from threads without the first attempt's journal, whose episodes never
    reached the platform, with nothing in ``run.errors``. The sync root is
    now this user's folder in the temporary directory, beside those runs."""
    lp = local_platform
    run_id = _launcher_evaluation(lp)
    monkeypatch.delenv("PRIME_RUNS_DIR")
    monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")  # (the patched password database)
    _without_a_home(monkeypatch, runs)
    episodes = _episodes(4)
    lp.set_faults(retryable_rate=1.0, routes=["/api/v1/traces", f"/api/v1/evaluations/{run_id}/"])
    first = _eval(id=run_id)
    first.log_episodes(episodes[:2])
    first.finish(status="failed", timeout=3)  # (an attached run that failed stays open)
    lp.set_faults(retryable_rate=0.0, routes=[])
    assert _sample_ids(lp, run_id) == []
    second = _eval(id=run_id)
    second.log_episodes(episodes[2:])
    second.finish(timeout=60)
    assert second.status is pr.RunStatus.COMPLETED and not second.errors, second.errors
    assert sorted(_sample_ids(lp, run_id)) == sorted(e["id"] for e in episodes)
    # A job's run named by a run key (its attempts share one run) keeps its
    # record in the same folder: init() raised RuntimeError for it.
    keyed = _eval(run_key="job-7")
    keyed.log_episodes(episodes[:1])
    keyed.finish(timeout=60)
    assert keyed.status is pr.RunStatus.COMPLETED and not keyed.errors, keyed.errors
    assert _sample_ids(lp, keyed.id) == [episodes[0]["id"]]


def test_online_without_a_key_is_a_configuration_error(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match="needs an API key"):
        pr.init(mode="online", environments=["gsm8k"])


# -- an online evaluation ----------------------------------------------------------------


def test_an_online_run_has_the_platforms_id_and_viewer_url(runs: Path, local_platform: Any) -> None:
    run = _eval()
    assert run.mode == "online"
    assert [r["id"] for r in local_platform.runs() if r["id"] == run.id] == [run.id]
    assert run.url == f"{local_platform.url}/dashboard/evaluations/{run.id}"
    run.finish()


def test_episodes_reach_the_sample_table_while_the_run_is_going(
    runs: Path, local_platform: Any
) -> None:
    (episode,) = _episodes(1)
    run = _eval()
    run.log_traces([episode])
    assert run.flush()
    assert _sample_ids(local_platform, run.id) == [episode["id"]]
    # Still running: the dashboard fills in as rollouts land.
    assert local_platform.run(run.id)["status"] == "RUNNING"
    run.finish()


def test_what_a_producer_logs_lands_once_with_its_summary(runs: Path, local_platform: Any) -> None:
    episodes = _episodes(3)
    run = _eval()
    for episode in episodes:
        run.log_traces([episode])
    summary = metrics.from_episodes(episodes)
    run.finish(summary=summary)
    assert sorted(_sample_ids(local_platform, run.id)) == sorted(e["id"] for e in episodes)
    stored = local_platform.run(run.id)
    assert stored["samples"]["rows"] == stored["samples"]["distinct"] == 3
    assert stored["status"] == "COMPLETED"
    assert stored["summary"]["avg_reward"] == summary["avg_reward"]
    assert run.status is pr.RunStatus.COMPLETED and run.errors == []


# -- attaching to a launcher's evaluation ------------------------------------------------


def test_an_evaluation_attaches_to_the_one_its_launcher_created(
    runs: Path, local_platform: Any
) -> None:
    hosted = _launcher_evaluation(local_platform)
    before = len(local_platform.runs())
    (episode,) = _episodes(1)
    run = _eval(id=hosted)
    assert run.id == hosted and run.attached is True
    assert run.url is not None and run.url.endswith(f"/dashboard/evaluations/{hosted}")
    run.log_traces([episode])
    run.finish(summary={"avg_reward": 1.0})
    assert len(local_platform.runs()) == before  # nothing created
    assert _sample_ids(local_platform, hosted) == [episode["id"]]
    stored = local_platform.run(hosted)
    # The launcher's config document is left alone; the summary goes up, with
    # the count of episodes Prime Traces stored.
    assert stored["config"] == {"launcher": 1}
    assert stored["summary"]["avg_reward"] == 1.0
    assert stored["summary"]["prime_runs"]["traces_episodes_written"] == 1
    assert stored["status"] == "COMPLETED"
    assert run.status is pr.RunStatus.COMPLETED and run.errors == []


def test_an_attached_evaluation_leaves_its_failure_to_the_launcher(
    runs: Path, local_platform: Any
) -> None:
    hosted = _launcher_evaluation(local_platform)
    run = _eval(id=hosted)
    run.fail("boom")
    assert run.status is pr.RunStatus.FAILED
    stored = local_platform.run(hosted)
    assert stored["status"] == "RUNNING" and stored["error_message"] is None
    assert stored["config"] == {"launcher": 1}  # no failure marker either


def test_an_attached_evaluation_needs_no_environments(runs: Path, local_platform: Any) -> None:
    hosted = _launcher_evaluation(local_platform)
    run = _eval(id=hosted, environments=None)
    assert run.id == hosted
    run.finish()
    assert local_platform.run(hosted)["status"] == "COMPLETED"


def test_a_disabled_evaluation_keeps_the_id_it_was_given(runs: Path) -> None:
    run = pr.init(mode="disabled", id="eval-hosted")
    assert run.id == "eval-hosted"
    assert run.attached is False  # nothing on the platform to hand back to
    run.finish()
    assert run.status is pr.RunStatus.COMPLETED


def test_a_record_with_nan_is_not_an_opaque_400(runs: Path, local_platform: Any) -> None:
    (episode,) = _episodes(1)
    episode["reward"] = float("nan")
    run = _eval(on_error="raise")
    run.log_traces([episode])
    run.finish()
    assert run.status is pr.RunStatus.COMPLETED and run.failed_records == {}
    assert _sample_ids(local_platform, run.id) == [episode["id"]]


# -- training runs -----------------------------------------------------------------------


def test_a_training_run_registers_what_it_was_given(runs: Path, local_platform: Any) -> None:
    run = _train(
        training=pr.TrainingSpec(max_steps=50, batch_size=32), config={"trainer": {"lr": 1e-6}}
    )
    assert run.kind == "train" and run.attached is False
    assert run.url is not None and run.id in run.url
    body = _get(local_platform, f"/api/v1/rft/runs/{run.id}")
    body = body.get("run", body)
    assert body["baseModel"] == "Qwen/Qwen3-8B"
    assert (body["maxSteps"], body["batchSize"]) == (50, 32)
    assert [e["id"] for e in body["environments"]] == ["primeintellect/vf-math"]
    assert body["runConfig"] == {"trainer": {"lr": 1e-6}}
    assert body["teamId"] == TEAM
    run.finish()


def test_a_training_run_ships_metrics_and_step_samples(runs: Path, local_platform: Any) -> None:
    run = _train()
    run.log_metrics({"loss": 0.5}, step=10)
    run.log_episodes(_step_episodes(10, 2))
    run.finish()
    rows = _get(local_platform, f"/api/v1/rft/runs/{run.id}/metrics")["metrics"]
    assert [(r["step"], r["loss"]) for r in rows] == [(10, 0.5)]
    stored = local_platform.run(run.id)
    assert [(o["step"], o["rows"]) for o in stored["parquet_objects"]] == [(10, 2)]
    assert stored["status"] == "COMPLETED"
    assert run.status is pr.RunStatus.COMPLETED and run.errors == []


def test_a_failed_training_run_is_marked_failed_with_its_reason(
    runs: Path, local_platform: Any
) -> None:
    with pytest.raises(ValueError), _train() as run:
        raise ValueError("loss is NaN")
    stored = local_platform.run(run.id)
    assert stored["status"] == "FAILED"
    assert stored["error_message"] == "ValueError: loss is NaN"


def test_attaching_to_a_managed_training_run_registers_nothing(
    runs: Path, local_platform: Any
) -> None:
    managed = _launcher_training_run(local_platform)
    before = len(local_platform.runs())
    run = _train(id=managed)
    assert run.id == managed and run.attached is True
    assert run.url is not None and run.url.endswith(managed)
    run.finish()
    assert len(local_platform.runs()) == before
    assert local_platform.run(managed)["status"] == "COMPLETED"  # a clean exit completes it


def test_an_attached_training_run_leaves_its_failure_to_the_launcher(
    runs: Path, local_platform: Any
) -> None:
    managed = _launcher_training_run(local_platform)
    run = _train(id=managed)
    run.fail("boom")
    assert run.status is pr.RunStatus.FAILED
    stored = local_platform.run(managed)
    assert stored["status"] == "RUNNING" and stored["error_message"] is None


def test_a_training_run_needs_a_team(runs: Path, local_platform: Any) -> None:
    before = len(local_platform.runs())
    with pytest.raises(ConfigurationError, match="team"):
        pr.init(kind="train", model="Qwen/Qwen3-8B", api_key=API_KEY, mode="online")
    assert len(local_platform.runs()) == before


def test_a_team_outside_the_allowlist_gets_the_platforms_reason(runs: Path) -> None:
    with pytest.raises(pr.ForbiddenError, match="not enabled for this team"):
        _train(team_id="team-outside", mode="online")


def test_a_disabled_training_run_keeps_the_id_it_was_given(runs: Path) -> None:
    run = pr.init(kind="train", mode="disabled", id="run-managed", model="m")
    assert run.id == "run-managed" and run.kind == "train"
    run.log_metrics({"loss": 0.1}, step=1)
    run.finish()
    assert run.status is pr.RunStatus.COMPLETED


@pytest.mark.parametrize(
    "kwargs",
    [{"kind": "eval", "training": pr.TrainingSpec()}, {"kind": "serve"}],
    ids=["eval-with-training", "unknown-kind"],
)
def test_the_kind_arguments_are_checked_first(runs: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        pr.init(mode="disabled", **kwargs)


def test_a_training_runs_records_say_they_are_training(runs: Path, local_platform: Any) -> None:
    run = _train()
    run.log_episodes(_step_episodes(3, 1))
    run.finish()
    landed = _get(local_platform, "/api/v1/episodes", run_id=run.id)["items"]
    raw = _get(local_platform, f"/api/v1/episodes/{landed[0]['episode_id']}", raw="true")
    assert raw["run"]["id"] == run.id and raw["run"]["type"] == "train"
    with TracesClient(api_key=API_KEY, base_url=local_platform.url, team_id="") as client:
        assert run.id in {r.run_id for r in client.list_runs(run_type="train", limit=100).items}


# -- the run's config source (the vendor's test_config_source.py) ------------------------


def test_a_config_path_is_read_verbatim(tmp_path: Path) -> None:
    path = tmp_path / "eval.toml"
    path.write_text(EVAL_TOML)
    source = ConfigSource.coerce(str(path))
    assert source.text == EVAL_TOML
    assert (source.format, source.filename) == ("toml", "eval.toml")


def test_a_config_files_format_follows_its_suffix(tmp_path: Path) -> None:
    for name, expected in [
        ("train.toml", "toml"),
        ("eval.json", "json"),
        ("run.yaml", "yaml"),
        ("run.yml", "yaml"),
        ("config", "text"),
    ]:
        path = tmp_path / name
        path.write_text("x = 1")
        assert ConfigSource.coerce(path).format == expected


def test_inline_config_text_must_say_it_is_text() -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        ConfigSource.coerce("environment = 'gsm8k'")
    source = ConfigSource.coerce(ConfigSource(text="environment = 'gsm8k'"))
    assert source.text == "environment = 'gsm8k'"


def test_an_oversized_or_binary_config_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "eval.toml"
    path.write_text("x = 1\n" * MAX_CONFIG_SOURCE_BYTES)
    with pytest.raises(ConfigurationError, match="over the"):
        ConfigSource.coerce(path)
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigurationError, match="not UTF-8"):
        ConfigSource.coerce(path)


def test_a_config_source_of_another_type_says_what_was_expected() -> None:
    with pytest.raises(TypeError, match="a path or a ConfigSource"):
        ConfigSource.coerce(object())


def test_a_config_source_round_trips_through_a_mapping() -> None:
    source = ConfigSource(text="a = 1", format="toml", filename="eval.toml")
    assert ConfigSource.from_mapping(source.to_dict()) == source
    assert ConfigSource.from_mapping({"format": "toml"}) is None


def test_a_config_mapping_is_kept_as_given_even_when_it_looks_like_a_source(
    runs: Path,
) -> None:
    run = pr.init(mode="disabled", config={"a": 1, "b": None})
    assert run.config == {"a": 1, "b": None} and run.config_source is None
    run = pr.init(mode="disabled", config={"text": "hello", "format": "toml"})
    assert run.config == {"text": "hello", "format": "toml"} and run.config_source is None


def test_an_online_run_stores_its_config_file_with_the_run(
    runs: Path, tmp_path: Path, local_platform: Any
) -> None:
    path = tmp_path / "eval.toml"
    path.write_text(EVAL_TOML)
    run = _eval(config=path)
    run.finish()
    stored = local_platform.run(run.id)["config"][CONFIG_SOURCE_KEY]
    assert stored == {"format": "toml", "text": EVAL_TOML, "filename": "eval.toml"}


def test_values_merged_onto_a_launch_file_are_stored_beside_it(
    runs: Path, tmp_path: Path, local_platform: Any
) -> None:
    path = tmp_path / "eval.toml"
    path.write_text(EVAL_TOML)
    config = {
        "model": "deepseek/deepseek-v4-flash",
        CONFIG_SOURCE_KEY: ConfigSource.from_file(path).to_dict(),
    }
    run = _eval(config=config)
    run.finish()
    stored = local_platform.run(run.id)["config"]
    assert stored["model"] == "deepseek/deepseek-v4-flash"
    assert stored[CONFIG_SOURCE_KEY]["text"] == EVAL_TOML
    assert run.config_source is not None and run.config_source.filename == "eval.toml"


def test_a_run_reports_its_own_config_source(runs: Path, tmp_path: Path) -> None:
    path = tmp_path / "train.toml"
    path.write_text(EVAL_TOML)
    run = pr.init(environments=["gsm8k"], mode="disabled", config=path)
    assert run.config_source is not None
    assert (run.config_source.filename, run.config_source.text) == ("train.toml", EVAL_TOML)
    run.finish()
    assert pr.init(environments=["gsm8k"], mode="disabled").config_source is None


def test_the_config_source_survives_a_failure(
    runs: Path, tmp_path: Path, local_platform: Any
) -> None:
    path = tmp_path / "eval.toml"
    path.write_text(EVAL_TOML)
    run = _eval(config=path)
    run.fail("something broke")
    stored = local_platform.run(run.id)
    assert (stored["status"], stored["error_message"]) == ("FAILED", "something broke")
    assert stored["config"][CONFIG_SOURCE_KEY]["text"] == EVAL_TOML


# -- where records go (the vendor's test_upload_routing.py) ------------------------------


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_an_enabled_account_stores_the_episodes_in_prime_traces_and_keeps_the_run(
    runs: Path, local_platform: Any, kind: str
) -> None:
    with _eval() if kind == "eval" else _train() as run:
        if kind == "eval":
            episodes = _episodes(2)
        else:
            episodes = _step_episodes(10, 2)
            run.log_metrics({"loss": 0.5}, step=10)
        run.log_episodes(episodes[:1])
        run.flush()
        run.log_episodes(episodes[1:])
    assert run.failed_records == {} and run.errors == []
    assert _traced_episodes(local_platform, run.id) == 2
    stored = local_platform.run(run.id)
    assert stored["status"] == "COMPLETED"
    if kind == "eval":
        assert stored["summary"]["prime_runs"] == {"traces_episodes_written": 2}
        # Here the sample table gets its rows too (differences.txt).
        assert sorted(_sample_ids(local_platform, run.id)) == sorted(e["id"] for e in episodes)
    else:
        assert stored["train_metrics"] == {"rows": 1, "steps": 1}


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_an_account_without_prime_traces_ships_every_episode_to_the_sample_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_local_platform: Any, kind: str
) -> None:
    lp = make_local_platform(traces_disabled=True, train_teams=[TEAM])
    point_at(monkeypatch, tmp_path, lp.url)
    monkeypatch.setenv("PRIME_API_BASE_URL", lp.url)
    monkeypatch.setenv("PRIME_RUNS_DIR", str(tmp_path / "runs"))
    with _eval() if kind == "eval" else _train() as run:
        episodes = _episodes(2) if kind == "eval" else _step_episodes(10, 2)
        for episode in episodes:
            run.log_episodes([episode])
            run.flush()
    assert run.failed_records == {} and run.errors == []
    stored = lp.run(run.id)
    assert stored["traces"]["episodes"] == 0
    if kind == "eval":
        assert _sample_ids(lp, run.id) == [e["id"] for e in episodes]
        assert run.summary["prime_runs"]["traces_episodes_written"] == 0
    else:
        assert _step_rows(stored) == {10: 2}


def _step_rows(stored: dict[str, Any]) -> dict[int, int]:
    """Rows of the Parquet sample table per step (one object per batch shipped)."""
    rows: dict[int, int] = {}
    for obj in stored["parquet_objects"]:
        rows[obj["step"]] = rows.get(obj["step"], 0) + obj["rows"]
    return rows


def _opt_out_through(source: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Opt out of Prime Traces through ``source``; returns init's arguments."""
    if source == "argument":
        return {"traces_opt_out": True}
    if source == "env":
        monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "true")
    else:
        prime = Path(os.environ["HOME"]) / ".prime"
        prime.mkdir()
        (prime / "config.json").write_text(json.dumps({"traces_opt_out": True}))
    return {}


@pytest.mark.parametrize("source", ["argument", "env", "config"])
@pytest.mark.parametrize("kind", ["eval", "train"])
def test_opting_out_never_reaches_prime_traces(
    runs: Path, local_platform: Any, monkeypatch: pytest.MonkeyPatch, kind: str, source: str
) -> None:
    opt_out = _opt_out_through(source, monkeypatch)
    with _eval(**opt_out) if kind == "eval" else _train(**opt_out) as run:
        episodes = _episodes(2) if kind == "eval" else _step_episodes(10, 2)
        for episode in episodes:
            run.log_episodes([episode])
            run.flush()
    assert run.failed_records == {} and run.errors == []
    stored = local_platform.run(run.id)
    assert stored["traces"]["episodes"] == stored["traces"]["traces"] == 0
    if kind == "eval":
        assert _sample_ids(local_platform, run.id) == [e["id"] for e in episodes]
        # The summary a server-side denial leaves, so completion checks agree.
        assert run.summary["prime_runs"]["traces_episodes_written"] == 0
    else:
        assert _step_rows(stored) == {10: 2}


def test_an_opt_out_argument_overrides_the_environment(
    runs: Path, local_platform: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "1")
    with _eval(traces_opt_out=False) as run:
        run.log_episodes(_episodes(1))
    assert _traced_episodes(local_platform, run.id) == 1


def test_an_unknown_opt_out_value_is_refused_before_the_run_is_created(
    runs: Path, local_platform: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused after the create, it would strand a RUNNING run nobody holds."""
    monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "maybe")
    before = len(local_platform.runs())
    with pytest.raises(ConfigurationError, match="PRIME_TRACES_OPT_OUT"):
        _eval(team_id=TEAM)
    assert len(local_platform.runs()) == before


def test_a_disabled_run_ignores_the_opt_out_variable(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "maybe")
    with pr.init(mode="disabled") as run:
        run.log_episodes(_episodes(1))
    assert run.status is pr.RunStatus.COMPLETED


@pytest.mark.parametrize("given", ["update", "finish"])
def test_the_receipt_count_leaves_the_callers_other_prime_runs_values(
    runs: Path, local_platform: Any, given: str
) -> None:
    summary = {
        "prime_runs": {
            "custom_metric": 1,
            "nested": {"reward": 0.5},
            "traces_episodes_written": 999,
        }
    }
    with _eval() as run:
        run.log_traces([_trace(1.0)])  # a trace alone is no episode
        run.log_episodes([{"id": f"empty-{uuid.uuid4().hex}", "traces": []}, *_episodes(1)])
        if given == "update":
            run.update_summary(summary)
        else:
            run.finish(summary=summary)
    expected = {"custom_metric": 1, "nested": {"reward": 0.5}, "traces_episodes_written": 1}
    assert run.summary["prime_runs"] == expected
    assert summary["prime_runs"]["traces_episodes_written"] == 999  # the caller's, untouched
    assert local_platform.run(run.id)["summary"]["prime_runs"] == expected


@pytest.mark.parametrize("value", [None, 1, "custom", [1]])
def test_a_prime_runs_summary_that_is_no_mapping_gives_way_to_the_receipt_count(
    runs: Path, value: Any
) -> None:
    with _eval() as run:
        run.log_episodes(_episodes(1))
        run.update_summary({"prime_runs": value})
    assert run.summary["prime_runs"] == {"traces_episodes_written": 1}


# -- the run handle (the vendor's test_run.py) ---------------------------------------------


def test_a_summary_built_up_before_finish_is_stored_without_non_finite_values(
    runs: Path, local_platform: Any
) -> None:
    run = _eval()
    run.update_summary({"avg_reward": 0.5, "loss": float("nan")})
    run.update_summary({"avg_error": 0.0})
    run.finish(summary={"avg_reward": 0.75, "grad": float("inf")})
    given = {k: v for k, v in run.summary.items() if k != "prime_runs"}  # the receipt count
    assert given == {"avg_reward": 0.75, "avg_error": 0.0}
    stored = local_platform.run(run.id)["summary"]
    assert {k: stored[k] for k in ("avg_reward", "avg_error")} == given
    assert "loss" not in stored and "grad" not in stored


def test_a_second_finish_changes_nothing(runs: Path, local_platform: Any) -> None:
    run = _eval()
    run.finish(summary={"avg_reward": 1.0})
    run.finish(status=pr.RunStatus.FAILED)
    assert run.status is pr.RunStatus.COMPLETED
    stored = local_platform.run(run.id)
    assert stored["status"] == "COMPLETED" and stored["summary"]["avg_reward"] == 1.0


@pytest.mark.parametrize("status", ["running", pr.RunStatus.RUNNING])
def test_finish_refuses_a_status_that_is_not_terminal_and_the_run_goes_on(
    runs: Path, local_platform: Any, status: Any
) -> None:
    run = _eval()
    with pytest.raises(ValueError, match="terminal"):
        run.finish(status=status)
    assert not run.finished and local_platform.run(run.id)["status"] == "RUNNING"
    run.finish()
    assert local_platform.run(run.id)["status"] == "COMPLETED"


@pytest.mark.parametrize("call", ["traces", "episodes", "metrics", "summary"])
def test_a_write_after_finish_is_a_producer_bug(runs: Path, call: str) -> None:
    run = pr.init(kind="train", mode="disabled", model="m")
    run.finish()
    with pytest.raises(pr.RunFinishedError):
        if call == "traces":
            run.log_traces([{"id": "t1"}])
        elif call == "episodes":
            run.log_episodes([{"id": "ep1", "traces": []}])
        elif call == "metrics":
            run.log_metrics({"loss": 0.5})
        else:
            run.update_summary({"late": 1.0})


def test_the_context_manager_completes_a_clean_run(runs: Path, local_platform: Any) -> None:
    with _eval() as run:
        run.log_traces(_episodes(1))
    assert local_platform.run(run.id)["status"] == "COMPLETED"


def test_an_exception_in_the_block_fails_the_run_and_propagates(
    runs: Path, local_platform: Any
) -> None:
    with pytest.raises(ValueError, match="rollout blew up"), _eval() as run:
        raise ValueError("rollout blew up")
    stored = local_platform.run(run.id)
    assert stored["status"] == "FAILED" and "rollout blew up" in stored["error_message"]


def test_an_interrupt_cancels_the_run_rather_than_failing_it(
    runs: Path, local_platform: Any
) -> None:
    with pytest.raises(KeyboardInterrupt), _eval() as run:
        raise KeyboardInterrupt
    stored = local_platform.run(run.id)
    assert (stored["status"], stored["error_message"]) == ("CANCELLED", "interrupted")


def test_a_run_cancelled_by_finish_keeps_its_reason(runs: Path, local_platform: Any) -> None:
    run = _eval()
    assert pr.RunStatus.CANCELLED.is_terminal()
    run.finish(status="cancelled", error="operator stopped it")
    assert run.status is pr.RunStatus.CANCELLED
    stored = local_platform.run(run.id)
    assert (stored["status"], stored["error_message"]) == ("CANCELLED", "operator stopped it")


def test_a_metrics_row_loses_its_non_finite_values_and_keeps_the_producers_step(
    runs: Path, local_platform: Any
) -> None:
    run = _train()
    run.log_metrics(
        {
            "step": 7,
            "loss": 0.5,
            "nan": float("nan"),
            "nested": {"loss": float("inf"), "reward": 1.0},
            "quantiles": [0.1, float("nan"), 0.9],  # here: refused, named (differences.txt)
        },
        step=8,
    )
    run.finish()
    (row,) = _get(local_platform, f"/api/v1/rft/runs/{run.id}/metrics")["metrics"]
    assert row["step"] == 7 and row["loss"] == 0.5 and "nan" not in row
    assert row["nested"] == {"reward": 1.0}
    assert "quantiles" not in row
    assert run.failed_records == {"encode": 1}
    assert any("quantiles" in e and "not a number" in e for e in run.errors), run.errors


# -- Ctrl-C in the loop ------------------------------------------------------------------


def _interrupt_the_next_spool_write(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Ctrl-C's KeyboardInterrupt, raised where CPython raises it: in the main
    thread, as the next write() of the run's spool returns (a signal's
    handler runs once the call is back), so the records are on disk and the
    append has not noted them yet. Fires once; the list says it did."""
    fired: list[bool] = []

    def interrupting(real: Any) -> Any:
        def call(fd: int, data: Any) -> int:
            done: int = real(fd, data)
            if (
                not fired
                and threading.current_thread() is threading.main_thread()
                and stat.S_ISREG(os.fstat(fd).st_mode)
            ):
                fired.append(True)
                raise KeyboardInterrupt
            return done

        return call

    # (An append goes to the spool in one writev(); a long one, or the rest
    # of a short one, in write().)
    monkeypatch.setattr(os, "write", interrupting(os.write))
    monkeypatch.setattr(os, "writev", interrupting(os.writev))
    return fired


def _journal_damage(run: pr.Run) -> list[Any]:
    assert run.journal_path is not None
    journal = Journal.open(run.journal_path, owner=False)
    try:
        return journal.damage()
    finally:
        journal.close()


def test_an_interrupt_caught_in_the_loop_loses_none_of_the_later_records(
    runs: Path, local_platform: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    episodes = _episodes(6)
    run = _eval(finish_timeout=30)  # (unfixed, the close-out waited for it all)
    run.log_episodes(episodes[:2])
    fired = _interrupt_the_next_spool_write(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run.log_episodes(episodes[2:3])
    assert fired
    for episode in episodes[3:]:  # the loop caught it and goes on
        run.log_episodes([episode])
    run.finish()
    assert _journal_damage(run) == []
    # The interrupted call's records were on disk: kept, once.
    assert sorted(_sample_ids(local_platform, run.id)) == sorted(e["id"] for e in episodes)
    assert local_platform.run(run.id)["status"] == "COMPLETED"


def test_an_interrupt_inside_a_log_call_cancels_the_run_it_closes(
    runs: Path, local_platform: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    episodes = _episodes(3)
    with pytest.raises(KeyboardInterrupt), _eval(finish_timeout=30) as run:
        run.log_episodes(episodes[:2])
        _interrupt_the_next_spool_write(monkeypatch)
        run.log_episodes(episodes[2:])
    assert _journal_damage(run) == []
    stored = local_platform.run(run.id)
    assert (stored["status"], stored["error_message"]) == ("CANCELLED", "interrupted")
    assert sorted(_sample_ids(local_platform, run.id)) == sorted(e["id"] for e in episodes)


_SIGTERM_AFTER_A_CUT_CALL = """
import os, signal, sys
import prime_runs as pr
from primeruns import hooks

run = pr.init(name="x", environments=["gsm8k"], mode="offline", runs_dir=sys.argv[1])
deferral = type(hooks.sigterm_deferred)
real_exit = deferral.__exit__

def cut(self, *exc):  # Ctrl-C's KeyboardInterrupt, raised as the call's exit is entered
    deferral.__exit__ = real_exit
    raise KeyboardInterrupt

deferral.__exit__ = cut
try:
    run.log_episodes([{"id": "e1", "traces": [{"id": "t1"}]}])
except KeyboardInterrupt:
    pass  # the loop goes on; later, the scheduler preempts the job
print(run.journal_path, flush=True)
os.kill(os.getpid(), signal.SIGTERM)
print("still running", flush=True)
"""


def test_a_sigterm_after_an_interrupted_call_still_ends_the_run_and_the_process(
    tmp_path: Path,
) -> None:
    """The SDK keeps a SIGTERM arriving inside a log call for the call's end
    (it may hold the journal's lock); a call whose end a KeyboardInterrupt
    cut must not keep every later one (the vendor's SDK, which has no
    handler, dies of it)."""
    done = subprocess.run(
        [sys.executable, "-c", _SIGTERM_AFTER_A_CUT_CALL, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "still running" not in done.stdout, done.stderr
    assert done.returncode == -signal.SIGTERM, done.stderr
    journal = Journal.open(Path(done.stdout.split()[0]), owner=False)
    try:
        (finish,) = journal.read(0, kinds=[EntryKind.FINISH]).entries
    finally:
        journal.close()
    assert json.loads(finish.payload)["status"] == "cancelled"


# -- run-level aggregates (the vendor's test_metrics.py) ---------------------------------


def _episode(traces: list[dict[str, Any]], ok: bool = True) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "ok": ok, "traces": traces}


def test_only_trainable_traces_are_scored() -> None:
    episode = _episode([_trace(1.0), _trace(0.0, trainable=False)])
    assert metrics.from_episodes([episode])["avg_reward"] == 1.0


def test_every_trace_is_scored_when_none_is_trainable() -> None:
    episode = _episode([_trace(1.0, trainable=False), _trace(0.0, trainable=False)])
    assert metrics.from_episodes([episode])["avg_reward"] == 0.5


def test_sub_rewards_and_environment_metrics_average_together() -> None:
    episodes = [
        _episode([_trace(1.0, metrics={"turns": 4.0})]),
        _episode([_trace(0.0, metrics={"turns": 6.0})]),
    ]
    averages = metrics.from_episodes(episodes)["avg_metrics"]
    assert (averages["correct"], averages["turns"]) == (0.5, 5.0)


def test_a_metric_on_some_traces_averages_over_those_alone() -> None:
    episodes = [_episode([_trace(1.0, metrics={"partial": 1.0})]), _episode([_trace(1.0)])]
    assert metrics.from_episodes(episodes)["avg_metrics"]["partial"] == 1.0


def test_the_error_rate_counts_episodes_not_traces() -> None:
    episodes = [_episode([_trace(1.0), _trace(1.0)]), _episode([], ok=False)]
    assert metrics.from_episodes(episodes)["avg_error"] == 0.5


def test_an_empty_run_has_zeros_rather_than_a_division_by_zero() -> None:
    assert metrics.from_episodes([]) == {"avg_reward": 0.0, "avg_metrics": {}, "avg_error": 0.0}


# -- the differences, listed ---------------------------------------------------------------


def test_every_difference_listed_for_the_suite_is_a_scenario_asserted_here() -> None:
    """``suite:`` lines of differences.txt name a vendor test
    (``file::name``) and the test here that asserts this SDK's answer."""
    ours = {name for name in globals() if name.startswith("test_")}
    listed = [
        line.split(" | ")
        for line in DIFFERENCES.read_text().splitlines()
        if line.startswith("suite: ")
    ]
    assert listed
    for vendor, here, reason in listed:
        assert vendor.startswith("suite: tests/test_") and "::test_" in vendor, vendor
        assert here in ours, f"differences.txt names {here!r}, which is no test here"
        assert reason.strip(), vendor


def test_every_function_that_defers_sigterm_is_known_by_its_frames() -> None:
    """A SIGTERM is kept for a log call's end only while a frame of a
    function whose body runs ``with sigterm_deferred`` is on the stack
    (``hooks._Deferral.under_way``): one left unregistered would have its
    SIGTERM handled inside the call, under the SDK's locks."""
    import ast

    import primeruns
    from primeruns import hooks, run  # noqa: F401  (its import registers them, as a Run's does)

    package = Path(primeruns.__file__).parent
    deferring: set[str] = set()
    for source in package.rglob("*.py"):
        if source.name == "hooks.py":
            continue
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.FunctionDef) and "sigterm_deferred" in ast.unparse(node):
                deferring.add(f"{source.stem}.{node.name}")
    known = {f"{Path(c.co_filename).stem}.{c.co_name}" for c in hooks.sigterm_deferred.codes}
    assert deferring and deferring == known
