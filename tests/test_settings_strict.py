"""Every PRIME_* variable is read in one module and parsed strictly.

A bad value is a ConfigurationError naming the variable, the value (never the
API key) and what is accepted; the spellings documented are accepted; a
disabled run, which uses none of them, only warns. The resolution functions
are tested directly (no process, no journal); one test goes through init().
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
from sdk_helpers import point_at

import primeruns as pr
from primeruns import settings as st
from primeruns.exceptions import ConfigurationError
from primeruns.journal import journal as journal_module
from primeruns.ship import link as link_module
from primeruns.ship.link import UplinkThreads
from primeruns.ship.policy import RetryPolicy

PACKAGE = Path(pr.__file__).resolve().parent
# Bad values of every variable the SDK reads.
BAD: dict[str, list[str]] = {
    st.API_KEY_ENV: ["sk-abc def", "sk-abc\n", "sk-\x00abc", "sk-é", "sk-clé-secrète"],
    st.API_BASE_URL_ENV: ["localhost:8000", "ftp://h", "http://[::1", "http://h:port"],
    st.BASE_URL_ENV: ["api.example.com", "http://u:p@h"],
    st.TEAM_ID_ENV: ["my team", "team\n"],
    st.TRACES_URL_ENV: ["traces.example.com", "http://h:99999", "file:///x"],
    st.FRONTEND_URL_ENV: ["app.example.com", "//app.example.com"],
    st.TRACES_OPT_OUT_ENV: ["maybe", "2", "y"],
    st.MODE_ENV: ["onlin", "enabled"],
    st.RUNS_DIR_ENV: [],  # a file: made per test (see _bad_values)
    st.MAX_JOURNAL_BYTES_ENV: ["lots", "8GiB", "1000", "-5", "1e9", "2.5", "9" * 4301, "١٢٣٤٥٦٧٨"],
    st.UPLINK_ENV: ["thread", "proc", "1"],
    st.RETRY_BASE_ENV: ["fast", "0", "-1", "nan"],
    st.PAUSE_ENV: ["5m", "-1", "inf"],
    st.LINGER_ENV: ["-0.1", "inf", "100ms"],
    st.STALL_ENV: ["1m", "0.05", "0", "nan"],
    st.ALLOW_NETWORK_FS_ENV: ["sure", "2", "y"],
}

# Good values: (raw, the resolved field, what it must hold).
GOOD: dict[str, list[tuple[str, str, object]]] = {
    st.API_KEY_ENV: [("sk-abc_123.XYZ", "platform.api_key", "sk-abc_123.XYZ")],
    st.API_BASE_URL_ENV: [
        ("http://127.0.0.1:8765/api/v1", "platform.api_root", "http://127.0.0.1:8765/api/v1"),
        ("https://h/api/internal/rft", "platform.internal", True),
    ],
    st.BASE_URL_ENV: [("https://h.example", "platform.origin", "https://h.example")],
    st.TEAM_ID_ENV: [("team-1_x", "platform.team_id", "team-1_x"), ("", "platform.team_id", "")],
    st.TRACES_URL_ENV: [("http://t:1/api/v1/", "platform.traces_url", "http://t:1")],
    st.FRONTEND_URL_ENV: [("https://app.example/", "platform.frontend_url", "https://app.example")],
    st.TRACES_OPT_OUT_ENV: [
        *((raw, "platform.traces_opt_out", True) for raw in ("1", "TRUE", " yes ", "on")),
        *((raw, "platform.traces_opt_out", False) for raw in ("0", "false", "No", "off")),
    ],
    st.MODE_ENV: [("Offline", "mode", "offline"), (" offline ", "mode", "offline")],
    st.RUNS_DIR_ENV: [],  # a directory: see test_runs_dir_accepts_a_directory_or_a_new_path
    st.MAX_JOURNAL_BYTES_ENV: [
        ("1048576", "sdk.max_journal_bytes", 1 << 20),
        (" 8589934592 ", "sdk.max_journal_bytes", 8 << 30),
    ],
    st.UPLINK_ENV: [("threads", "sdk.uplink", "threads"), ("PROCESS", "sdk.uplink", "process")],
    st.RETRY_BASE_ENV: [("0.02", "sdk.retry_base_s", 0.02), ("1e-3", "sdk.retry_base_s", 0.001)],
    st.PAUSE_ENV: [("0", "sdk.pause_s", 0.0), ("2", "sdk.pause_s", 2.0)],
    st.LINGER_ENV: [("0", "sdk.linger_s", 0.0), ("0.5", "sdk.linger_s", 0.5)],
    st.STALL_ENV: [("0.1", "sdk.stall_s", 0.1), ("90", "sdk.stall_s", 90.0)],
    st.ALLOW_NETWORK_FS_ENV: [
        *((raw, "sdk.allow_network_fs", True) for raw in ("1", "yes", "On")),
        *((raw, "sdk.allow_network_fs", False) for raw in ("0", "off")),
    ],
}


def _resolve(tmp_path: Path, environ: dict[str, str], **kwargs: Any) -> st.RunSettings:
    kwargs.setdefault("mode", "offline")
    return st.resolve_run_settings(
        environ=environ, config={}, runs_dir=kwargs.pop("runs_dir", tmp_path / "runs"), **kwargs
    )


def _bad_values(var: str, tmp_path: Path) -> list[str]:
    if var == st.RUNS_DIR_ENV:
        a_file = tmp_path / "a-file"
        a_file.write_text("not a directory")
        return [str(a_file)]
    return BAD[var]


def test_every_variable_is_covered() -> None:
    assert len(st.VARIABLES) == len(set(st.VARIABLES)) == 16
    assert set(BAD) == set(GOOD) == set(st.VARIABLES)


@pytest.mark.parametrize("var", st.VARIABLES)
def test_a_bad_value_is_an_error_naming_the_variable_the_value_and_the_fix(
    var: str, tmp_path: Path
) -> None:
    for raw in _bad_values(var, tmp_path):
        # Resolved with no runs_dir argument, so PRIME_RUNS_DIR is read too.
        with pytest.raises(ConfigurationError, match=re.escape(var)) as caught:
            _resolve(tmp_path, {var: raw}, runs_dir=None)
        text = str(caught.value)
        if var == st.API_KEY_ENV:
            # The key never shows, nor any character of it.
            assert raw.strip() not in text and "sk-" not in text
            assert not any(repr(c) in text for c in raw), text
        elif "@" not in raw:
            assert repr(raw) in text, text
        assert re.search(r"\buse\b|\bpass\b|credentials", text), text


@pytest.mark.parametrize("var", st.VARIABLES)
def test_the_documented_spellings_are_accepted(var: str, tmp_path: Path) -> None:
    for raw, where, expected in GOOD[var]:
        resolved = _resolve(tmp_path, {var: raw})
        value: object = resolved
        for attribute in where.split("."):
            value = getattr(value, attribute)
        assert value == expected, (var, raw)
        if var != st.MODE_ENV:
            key = next((k for k, v in resolved.sdk.sources.items() if v == var), None)
            key = key or next((k for k, v in resolved.platform.sources.items() if v == var), None)
            assert key is not None, f"{var} is not recorded as a source"


@pytest.mark.parametrize("var", [v for v in st.VARIABLES if v != st.TEAM_ID_ENV])
def test_blank_is_unset(var: str, tmp_path: Path) -> None:
    assert _resolve(tmp_path, {var: "  "}) == _resolve(tmp_path, {})


def test_runs_dir_accepts_a_directory_or_a_new_path(tmp_path: Path) -> None:
    for path in (tmp_path, tmp_path / "not" / "yet"):
        resolved = _resolve(tmp_path, {st.RUNS_DIR_ENV: str(path)}, runs_dir=None)
        assert resolved.sdk.runs_dir == path
        assert resolved.sdk.sources["runs_dir"] == st.RUNS_DIR_ENV
        assert st.default_runs_dir({st.RUNS_DIR_ENV: str(path)}) == path
    home = {"XDG_STATE_HOME": str(tmp_path / "s")}
    assert st.default_runs_dir(home) == tmp_path / "s" / "prime-runs" / "runs"
    # The argument wins, and an unused bad variable is still an error.
    assert _resolve(tmp_path, {}, runs_dir=tmp_path / "arg").sdk.runs_dir == tmp_path / "arg"
    with pytest.raises(ConfigurationError, match=st.RUNS_DIR_ENV):
        st.default_runs_dir({st.RUNS_DIR_ENV: str(Path(__file__))})


@pytest.mark.parametrize("var", st.VARIABLES)
def test_a_disabled_run_warns_instead_of_raising(
    var: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    defaults = _resolve(tmp_path, {}, mode="disabled", runs_dir=None)
    for raw in _bad_values(var, tmp_path):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="primeruns"):
            resolved = _resolve(tmp_path, {var: raw}, mode="disabled", runs_dir=None)
        assert resolved.mode == "disabled"
        warned = [r.getMessage() for r in caplog.records if var in r.getMessage()]
        assert warned, f"no warning naming {var} for {raw!r}"
        assert "disabled" in warned[0]
        if var == st.API_KEY_ENV:
            assert raw.strip() not in caplog.text
        # What was bad is ignored: the default stands.
        assert resolved.sdk == defaults.sdk
        assert resolved.platform == defaults.platform


def test_a_run_disabled_for_want_of_a_key_warns_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        resolved = _resolve(tmp_path, {st.STALL_ENV: "1m", st.UPLINK_ENV: "thread"}, mode=None)
    assert resolved.mode == "disabled" and resolved.sdk.stall_s == st.DEFAULT_STALL_S
    assert "no API key found" in caplog.text
    assert st.STALL_ENV in caplog.text and st.UPLINK_ENV in caplog.text


def test_the_mode_decides_strictness(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A bad PRIME_RUNS_MODE decides nothing: an error, unless mode="disabled" was passed.
    with pytest.raises(ConfigurationError, match="PRIME_RUNS_MODE='onlin' is not a mode"):
        _resolve(tmp_path, {st.MODE_ENV: "onlin"}, mode=None)
    with pytest.raises(ConfigurationError, match=st.MODE_ENV):
        _resolve(tmp_path, {st.MODE_ENV: "onlin"}, mode="offline")
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        assert _resolve(tmp_path, {st.MODE_ENV: "onlin"}, mode="disabled").mode == "disabled"
    assert st.MODE_ENV in caplog.text
    # A bad mode argument is always an error; PRIME_RUNS_MODE=disabled makes the run lenient.
    with pytest.raises(ConfigurationError, match="mode='thread' is not a mode"):
        _resolve(tmp_path, {}, mode="thread")
    relaxed = _resolve(tmp_path, {st.MODE_ENV: "disabled", st.STALL_ENV: "1m"}, mode=None)
    assert relaxed.mode == "disabled" and relaxed.sdk.mode == "disabled"
    # A key makes the run online, and strict: a bad key is an error then.
    assert _resolve(tmp_path, {st.API_KEY_ENV: "k-1"}, mode=None).mode == "online"
    with pytest.raises(ConfigurationError, match=st.API_KEY_ENV):
        _resolve(tmp_path, {st.API_KEY_ENV: "k 1"}, mode=None)
    with pytest.raises(ConfigurationError, match="needs an API key"):
        _resolve(tmp_path, {}, mode="online")


def test_the_journal_budget_argument(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = {st.MAX_JOURNAL_BYTES_ENV: str(2 << 20)}
    assert _resolve(tmp_path, env, max_journal_bytes=3 << 20).sdk.max_journal_bytes == 3 << 20
    assert _resolve(tmp_path, env).sdk.max_journal_bytes == 2 << 20
    with pytest.raises(ValueError, match="max_journal_bytes"):
        _resolve(tmp_path, {}, max_journal_bytes=1000)
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        lenient = _resolve(tmp_path, {}, mode="disabled", max_journal_bytes=1000)
    assert lenient.sdk.max_journal_bytes == st.DEFAULT_MAX_JOURNAL_BYTES
    assert "max_journal_bytes" in caplog.text
    assert st.DEFAULT_MAX_JOURNAL_BYTES == journal_module.DEFAULT_MAX_JOURNAL_BYTES


def test_the_messages_are_the_documented_ones() -> None:
    with pytest.raises(ConfigurationError) as caught:
        st.parse_uplink(st.UPLINK_ENV, "thread")
    assert str(caught.value) == (
        "PRIME_RUNS_UPLINK='thread' is not an uplink; use 'process' or 'threads'"
    )
    with pytest.raises(
        ConfigurationError, match=r"^PRIME_RUNS_STALL_S='1m' is not a number of seconds"
    ):
        st.resolve_sdk_settings(environ={st.STALL_ENV: "1m"}, runs_dir="r")
    with pytest.raises(ConfigurationError, match=r"PRIME_RUNS_STALL_S='0.05' is below 0.1 s"):
        st.resolve_sdk_settings(environ={st.STALL_ENV: "0.05"}, runs_dir="r")


def test_a_base_url_error_names_where_it_came_from() -> None:
    with pytest.raises(ConfigurationError, match=r"^PRIME_BASE_URL="):
        st.resolve_settings(environ={st.BASE_URL_ENV: "nope"}, config={})
    with pytest.raises(ConfigurationError, match=r"^base_url="):
        st.resolve_settings(base_url="nope", environ={}, config={})
    # The first variable wins, and the one it hides is still checked.
    with pytest.raises(ConfigurationError, match=st.BASE_URL_ENV):
        st.resolve_settings(
            environ={st.API_BASE_URL_ENV: "http://a", st.BASE_URL_ENV: "nope"}, config={}
        )


def test_the_retry_policy_comes_from_the_settings(tmp_path: Path) -> None:
    env = {st.RETRY_BASE_ENV: "0.25", st.PAUSE_ENV: "7", st.LINGER_ENV: "0", st.STALL_ENV: "3"}
    policy = RetryPolicy.from_settings(_resolve(tmp_path, env).sdk)
    assert (policy.base_delay_s, policy.pause_s, policy.linger_s, policy.stall_s) == (
        0.25, 7.0, 0.0, 3.0,
    )  # fmt: skip
    defaults = RetryPolicy.from_settings(_resolve(tmp_path, {}).sdk)
    assert defaults == RetryPolicy()


def test_from_env_is_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(st.STALL_ENV, "1m")
    with pytest.raises(ConfigurationError, match=st.STALL_ENV):
        RetryPolicy.from_env()
    monkeypatch.setenv(st.STALL_ENV, "2")
    assert RetryPolicy.from_env().stall_s == 2.0


def test_what_the_uplink_process_is_handed(tmp_path: Path) -> None:
    """Its settings by the pipe, nothing by the environment: no PRIME_* variable
    reaches it, and what it adopts is what its producer resolved."""
    env = {st.STALL_ENV: "3", st.UPLINK_ENV: "threads", st.ALLOW_NETWORK_FS_ENV: "1"}
    sdk = _resolve(tmp_path, env).sdk
    assert st.SdkSettings.from_handover(sdk.to_handover()) == sdk
    child = st.without_settings({**{v: "x" for v in st.VARIABLES}, "PATH": "/bin", "HOME": "/h"})
    assert child == {"PATH": "/bin", "HOME": "/h"}
    assert st.allow_network_fs({}) is False
    with pytest.raises(ConfigurationError, match=st.ALLOW_NETWORK_FS_ENV):
        st.allow_network_fs({st.ALLOW_NETWORK_FS_ENV: "sure"})


def test_the_adopted_settings_are_what_readers_without_settings_get(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(st, "_adopted", None)
    monkeypatch.delenv(st.ALLOW_NETWORK_FS_ENV, raising=False)
    monkeypatch.setenv(st.STALL_ENV, "1m")  # what the adopted settings replace
    st.adopt_settings(st.SdkSettings(runs_dir=tmp_path, stall_s=5.0, allow_network_fs=True))
    assert RetryPolicy.from_env().stall_s == 5.0
    assert st.allow_network_fs() is True
    monkeypatch.setattr(st, "_adopted", None)
    with pytest.raises(ConfigurationError, match=st.STALL_ENV):
        st.process_sdk_settings()


def test_uplink_threads_take_the_policy_of_the_settings_handed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """UplinkThreads builds its Uplink's policy from ``tuning``, not the
    environment (a stub Uplink records it: a real one needs a journal)."""
    made: dict[str, Any] = {}

    class _Uplink:
        def __init__(
            self, journal: Any, settings: Any, *, policy: RetryPolicy, notify: Any
        ) -> None:
            made["policy"] = policy

        def serve(self, link: Any, predecessors: Any) -> None:
            return None

    monkeypatch.setattr(link_module, "Uplink", _Uplink)
    tuning = st.SdkSettings(runs_dir=tmp_path, stall_s=4.0, retry_base_s=0.3)
    threads = UplinkThreads(None, None, [], tuning)  # type: ignore[arg-type]
    assert threads.wait_exit(5)
    # (beside the loop, its batches wait at least THREADS_LINGER_S: the fallback's own)
    assert made["policy"] == RetryPolicy(
        stall_s=4.0, base_delay_s=0.3, linger_s=link_module.THREADS_LINGER_S
    )


_READS = re.compile(r"os\.environ|getenv\(")


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "settings.py" or p.parent != PACKAGE],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_module_but_settings_reads_a_prime_variable(path: Path) -> None:
    names = "|".join(
        ["PRIME_", "MODE_ENV", "ALLOW_ENV", "UPLINK_ENV", "TRACES_OPT_OUT_ENV", "RUNS_DIR_ENV"]
    )
    for number, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        if _READS.search(code) and re.search(names, code):
            pytest.fail(f"{path.name}:{number} reads the environment: {line.strip()}")


def test_init_raises_for_a_bad_setting_and_a_disabled_run_only_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    point_at(monkeypatch, tmp_path, None)
    runs = tmp_path / "runs"
    monkeypatch.setenv(st.STALL_ENV, "1m")
    with pytest.raises(ConfigurationError, match=st.STALL_ENV):
        pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
    assert not runs.exists() or not any(runs.iterdir())  # refused before any journal
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run = pr.init(environments=["gsm8k"], mode="disabled", runs_dir=runs)
        run.log_episodes([{"id": "e1", "traces": []}])
        run.finish()
    assert any(st.STALL_ENV in r.getMessage() for r in caplog.records)
    assert run.mode == "disabled"


def test_the_vendor_callers_disabled_fallback_never_raises_for_any_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # verifiers falls back to init(mode="disabled") unguarded when its first
    # init() fails: with every variable bad at once it still gets a run.
    point_at(monkeypatch, tmp_path, None)
    for var in st.VARIABLES:
        monkeypatch.setenv(var, _bad_values(var, tmp_path)[0])
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run = pr.init(mode="disabled")
        run.log_episodes([{"id": "e1", "traces": []}])
        run.finish()
    assert run.mode == "disabled"
    named = {var for var in st.VARIABLES if var in caplog.text}
    assert named == set(st.VARIABLES)


@pytest.mark.parametrize("where", ["argument", "config file"])
def test_a_key_of_blanks_alone_is_no_key(tmp_path: Path, where: str) -> None:
    """A key given as blanks alone (an empty paste) is no key, as a blank
    ``PRIME_API_KEY`` is: the run is disabled with the "no API key" warning.
    Taken as a key, the run was online and either raised "needs an API key"
    (its blanks dropped, nothing left) or sent a header h11 refuses."""
    given: dict[str, Any] = {"api_key": " \t "} if where == "argument" else {}
    config = {} if where == "argument" else {"api_key": " \t "}
    settings = st.resolve_run_settings(
        environ={}, config=config, runs_dir=tmp_path / "runs", **given
    )
    assert settings.mode == "disabled"
