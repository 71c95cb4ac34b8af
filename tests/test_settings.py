"""Settings resolution: argument, then environment, then config file, then default."""

from __future__ import annotations

import pytest

from primeruns.exceptions import ConfigurationError
from primeruns.platform.settings import mask_key, resolve_settings, split_api_root


def test_argument_beats_environment_beats_config_file() -> None:
    env = {"PRIME_API_KEY": "env-key", "PRIME_TEAM_ID": "env-team"}
    cfg = {"api_key": "file-key", "team_id": "file-team", "base_url": "http://file:1"}
    s = resolve_settings(api_key="arg-key", environ=env, config=cfg)
    assert s.api_key == "arg-key"
    assert s.team_id == "env-team"
    assert s.origin == "http://file:1"
    assert s.sources["api_key"] == "argument"
    assert s.sources["team_id"] == "PRIME_TEAM_ID"
    assert s.sources["base_url"] == "config file"
    s2 = resolve_settings(environ={}, config=cfg)
    assert s2.api_key == "file-key" and s2.team_id == "file-team"


def test_empty_team_env_var_still_wins() -> None:
    s = resolve_settings(environ={"PRIME_TEAM_ID": ""}, config={"team_id": "file-team"})
    assert s.team_id == ""


@pytest.mark.parametrize(
    ("url", "origin", "prefix", "internal"),
    [
        ("https://api.example.com", "https://api.example.com", "/api/v1", False),
        ("https://api.example.com/api/v1/", "https://api.example.com", "/api/v1", False),
        ("https://api.example.com/api/v1/rft", "https://api.example.com", "/api/v1", False),
        ("https://h/x/api/internal/rft", "https://h/x", "/api/internal", True),
        ("https://h/api/internal", "https://h", "/api/internal", True),
        ("https://rft.example.com/rft", "https://rft.example.com/rft", "/api/v1", False),
    ],
)
def test_api_root_is_read_from_the_path(url: str, origin: str, prefix: str, internal: bool) -> None:
    assert split_api_root(url) == (origin, prefix, internal)


def test_base_url_must_be_absolute() -> None:
    with pytest.raises(ConfigurationError, match="base_url"):
        split_api_root("localhost:8000")


def test_traces_url_never_falls_back_to_base_url() -> None:
    s = resolve_settings(base_url="http://127.0.0.1:9", environ={}, config={})
    assert s.traces_url == "https://api.primeintellect.ai"
    s = resolve_settings(environ={"PRIME_TRACES_URL": "http://t:1/api/v1/"}, config={})
    assert s.traces_url == "http://t:1"


@pytest.mark.parametrize(("raw", "expected"), [("1", True), (" YES ", True), ("off", False)])
def test_opt_out_env_values(raw: str, expected: bool) -> None:
    s = resolve_settings(environ={"PRIME_TRACES_OPT_OUT": raw}, config={"traces_opt_out": True})
    assert s.traces_opt_out is expected


def test_opt_out_blank_env_falls_through_and_junk_is_an_error() -> None:
    assert resolve_settings(
        environ={"PRIME_TRACES_OPT_OUT": " "}, config={"traces_opt_out": "true"}
    ).traces_opt_out
    with pytest.raises(ConfigurationError, match="PRIME_TRACES_OPT_OUT"):
        resolve_settings(environ={"PRIME_TRACES_OPT_OUT": "maybe"}, config={})


def test_key_never_shown_in_repr_or_mask() -> None:
    s = resolve_settings(api_key="sk-secret-0123456789", environ={}, config={})
    assert "secret" not in repr(s)
    assert "secret" not in mask_key(s.api_key)
    assert mask_key("sk-secret-0123456789").endswith("6789")


def test_unreadable_config_file_degrades_to_empty(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    (home / ".prime").mkdir(parents=True)
    (home / ".prime" / "config.json").write_bytes(b"\xff\xfe not json")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    assert resolve_settings(environ={}).api_key == ""
