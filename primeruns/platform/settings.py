"""Where the SDK's settings come from, resolved once at ``init()``.

Precedence for every setting, as in the vendor's SDK: the ``init()`` argument,
then the environment variable, then ``~/.prime/config.json``, then the default.
Each resolved value remembers its source, so ``primeruns doctor`` can say where
a setting came from. The API key is held here and nowhere else: it is never
journaled, logged or put in an error message (``masked_key`` is for display).
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..exceptions import ConfigurationError

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_FRONTEND_URL",
    "MODE_ENV",
    "TRACES_OPT_OUT_ENV",
    "Settings",
    "config_file_path",
    "load_config_file",
    "mask_key",
    "parse_bool_setting",
    "resolve_settings",
    "split_api_root",
]

DEFAULT_BASE_URL = "https://api.primeintellect.ai"
DEFAULT_FRONTEND_URL = "https://app.primeintellect.ai"
MODE_ENV = "PRIME_RUNS_MODE"
TRACES_OPT_OUT_ENV = "PRIME_TRACES_OPT_OUT"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

# Longest suffix first: "/api/internal/rft" must win over "/api/internal".
_API_ROOTS = (
    ("/api/internal/rft", "/api/internal", True),
    ("/api/internal", "/api/internal", True),
    ("/api/v1/rft", "/api/v1", False),
    ("/api/v1", "/api/v1", False),
)


def config_file_path() -> Path:
    return Path.home() / ".prime" / "config.json"


def load_config_file(path: Path | None = None) -> dict[str, Any]:
    """The config file as a dict; anything unreadable degrades to ``{}``."""
    try:
        data = json.loads((path or config_file_path()).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _without_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@``, for messages."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        return url if "@" not in url else "***@" + url.rsplit("@", 1)[1]
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{scheme}://{netloc}{slash}{path}"


def _is_loopback(origin: str) -> bool:
    host = urlsplit(origin).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_api_root(base_url: str) -> tuple[str, str, bool]:
    """Reduce a base URL to ``(origin, api_prefix, internal)`` (see
    docs/ARCHITECTURE.md, "The wire").

    Only the path is examined: ``https://h/api/internal/rft`` addresses the
    internal RFT router, anything else the public ``/api/v1``.
    """
    shown = _without_userinfo(base_url)
    try:
        parts = urlsplit(base_url.strip())
        parts.port  # noqa: B018 - validates the port: urlsplit itself does not
    except ValueError as exc:  # e.g. "Invalid IPv6 URL", "Port out of range"
        raise ConfigurationError(
            f"base_url={shown!r} is not a valid URL ({exc}); pass e.g. "
            "'https://api.primeintellect.ai' or 'http://127.0.0.1:8765'."
        ) from None
    if not parts.scheme or not parts.netloc:
        raise ConfigurationError(
            f"base_url={shown!r} is not an absolute http(s) URL; pass e.g. "
            "'https://api.primeintellect.ai' or 'http://127.0.0.1:8765'."
        )
    if "@" in parts.netloc:
        # It would be stored in the journal and shown by the CLI: refuse it,
        # without repeating it.
        raise ConfigurationError(
            f"base_url={shown!r} carries credentials (user:password@); pass the key as "
            "api_key= or PRIME_API_KEY instead"
        )
    path = parts.path.rstrip("/")
    prefix, internal = "/api/v1", False
    for suffix, api_prefix, is_internal in _API_ROOTS:
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            prefix, internal = api_prefix, is_internal
            break
    origin = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return origin, prefix, internal


def _traces_root(url: str) -> str:
    url = url.strip().rstrip("/")
    return url[: -len("/api/v1")] if url.endswith("/api/v1") else url


def mask_key(key: str) -> str:
    """A display form that proves which key without revealing it."""
    if not key:
        return "(none)"
    if len(key) <= 8:
        return "*" * len(key)
    return f"{key[:3]}…{key[-4:]}"


def parse_bool_setting(name: str, raw: str) -> bool | None:
    """An env-style boolean: None for blank, ConfigurationError for junk."""
    value = raw.strip().lower()
    if not value:
        return None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(
        f"{name}={raw!r} is not a boolean; use one of 1/true/yes/on or 0/false/no/off."
    )


@dataclass(frozen=True)
class Settings:
    """The resolved settings of one run. ``repr`` never shows the key."""

    api_key: str = field(repr=False)
    origin: str
    api_prefix: str
    internal: bool
    team_id: str | None
    traces_url: str
    frontend_url: str
    traces_opt_out: bool
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def api_root(self) -> str:
        return self.origin + self.api_prefix

    @property
    def masked_key(self) -> str:
        return mask_key(self.api_key)


def resolve_settings(
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    team_id: str | None = None,
    traces_opt_out: bool | None = None,
    environ: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Settings:
    """Resolve every setting by the documented precedence; see the module docstring."""
    env = os.environ if environ is None else environ
    cfg = load_config_file() if config is None else config
    sources: dict[str, str] = {}

    key = ""
    if api_key is not None:
        key, sources["api_key"] = api_key, "argument"
    elif env.get("PRIME_API_KEY"):
        key, sources["api_key"] = env["PRIME_API_KEY"], "PRIME_API_KEY"
    elif isinstance(cfg.get("api_key"), str) and cfg["api_key"]:
        key, sources["api_key"] = cfg["api_key"], "config file"
    else:
        sources["api_key"] = "unset"
    if not isinstance(key, str):
        raise ConfigurationError("api_key must be a string")

    url = DEFAULT_BASE_URL
    sources["base_url"] = "default"
    if base_url:
        url, sources["base_url"] = base_url, "argument"
    else:
        for var in ("PRIME_API_BASE_URL", "PRIME_BASE_URL"):
            if env.get(var):
                url, sources["base_url"] = env[var], var
                break
        else:
            if isinstance(cfg.get("base_url"), str) and cfg["base_url"]:
                url, sources["base_url"] = cfg["base_url"], "config file"
    origin, prefix, internal = split_api_root(url)

    team: str | None = None
    if team_id is not None:
        team, sources["team_id"] = team_id, "argument"
    elif "PRIME_TEAM_ID" in env:
        team, sources["team_id"] = env["PRIME_TEAM_ID"], "PRIME_TEAM_ID"
    elif cfg.get("team_id"):
        team, sources["team_id"] = str(cfg["team_id"]), "config file"
    else:
        sources["team_id"] = "unset"

    traces = DEFAULT_BASE_URL
    sources["traces_url"] = "default"
    if env.get("PRIME_TRACES_URL"):
        traces, sources["traces_url"] = env["PRIME_TRACES_URL"], "PRIME_TRACES_URL"
    elif isinstance(cfg.get("traces_url"), str) and cfg["traces_url"]:
        traces, sources["traces_url"] = cfg["traces_url"], "config file"

    frontend = DEFAULT_FRONTEND_URL
    sources["frontend_url"] = "default"
    if env.get("PRIME_FRONTEND_URL"):
        frontend, sources["frontend_url"] = env["PRIME_FRONTEND_URL"], "PRIME_FRONTEND_URL"
    elif isinstance(cfg.get("frontend_url"), str) and cfg["frontend_url"]:
        frontend, sources["frontend_url"] = cfg["frontend_url"], "config file"
    elif _is_loopback(origin):
        # A platform on this machine (``primeruns serve``) serves its run pages
        # at the dashboard's paths on its own origin, so run.url opens there.
        frontend, sources["frontend_url"] = origin, "the local platform's origin"

    opt_out = False
    sources["traces_opt_out"] = "default"
    if traces_opt_out is not None:
        opt_out, sources["traces_opt_out"] = bool(traces_opt_out), "argument"
    else:
        from_env = parse_bool_setting(TRACES_OPT_OUT_ENV, env.get(TRACES_OPT_OUT_ENV, ""))
        if from_env is not None:
            opt_out, sources["traces_opt_out"] = from_env, TRACES_OPT_OUT_ENV
        elif "traces_opt_out" in cfg:
            raw = cfg["traces_opt_out"]
            opt_out = raw.strip().lower() in _TRUE if isinstance(raw, str) else bool(raw)
            sources["traces_opt_out"] = "config file"

    return Settings(
        api_key=key,
        origin=origin,
        api_prefix=prefix,
        internal=internal,
        team_id=team,
        traces_url=_traces_root(traces),
        frontend_url=frontend.rstrip("/"),
        traces_opt_out=opt_out,
        sources=sources,
    )
