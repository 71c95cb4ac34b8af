"""Every setting of the SDK, and the one place a ``PRIME_*`` variable is read.

A module of its own, rather than ``primeruns/platform/settings.py`` grown: the
journal (runs directory, network filesystems) and the shipping code (uplink,
retry policy) read settings too, and they sit below the platform package,
which imports the HTTP client. This module imports nothing of the SDK but its
exceptions and value types, so every layer reads it without an import cycle;
``primeruns.platform.settings`` re-exports the platform part for its importers.

Precedence for every setting: the ``init()`` argument, then the environment
variable, then ``~/.prime/config.json`` (the platform settings), then the
default (the vendor's SDK resolves in this order too). Each resolved value
remembers its source, so
``primeruns doctor`` can say where a setting came from.

Parsing is strict: a value that cannot be read raises ConfigurationError
naming the variable, the value and what it accepts; nothing falls back to a
default silently. A blank variable (empty, or only spaces) is an unset one,
except ``PRIME_TEAM_ID``, whose empty value still overrides the config file
(no team). One exception to strictness: a disabled
run uses none of these settings, and callers (verifiers among them) open one,
unguarded, as their fallback when opening a run failed. So ``init()``
resolves a disabled run's settings with ``strict=False``: a bad value is
logged as a warning (``logging.getLogger("primeruns")``) and its default used.

``init()`` resolves everything once (:func:`resolve_run_settings`) and hands
the values down: the platform settings (:class:`Settings`) and the SDK's own
tuning (:class:`SdkSettings`) to the retry policy
(``RetryPolicy.from_settings``) and the uplink (``start_uplink``). The uplink
process receives both through its standard input, never its command line;
its environment keeps no ``PRIME_*`` variable (:func:`without_settings`), so
it cannot read a different value, and it adopts what it was handed
(:func:`adopt_settings`). Two readers have no settings handed to them: the
CLI's default runs directory (:func:`default_runs_dir`) and the journal's
network filesystem check (:func:`allow_network_fs`); they read their one
variable here, as strictly.

It is long (every setting's parser, bounds and message live here, so that
no other module parses one), but it does one job.

The API key is held in :class:`Settings` and nowhere else: it is never
journaled, logged or put in an error message (``masked_key`` is for display;
an error about the key says what is wrong with it, not what it is).
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import SplitResult, urlsplit, urlunsplit

from primeruns.logs import get_logger

from .ascii_digits import decimal_or_none
from .exceptions import ConfigurationError
from .models import Mode
from .redaction import remember_secret

__all__ = [
    "ALLOW_NETWORK_FS_ENV",
    "API_BASE_URL_ENV",
    "API_KEY_ENV",
    "BASE_URL_ENV",
    "DEFAULT_BASE_URL",
    "DEFAULT_FRONTEND_URL",
    "DEFAULT_LINGER_S",
    "DEFAULT_MAX_JOURNAL_BYTES",
    "DEFAULT_PAUSE_S",
    "DEFAULT_RETRY_BASE_S",
    "DEFAULT_STALL_S",
    "FRONTEND_URL_ENV",
    "LINGER_ENV",
    "MAX_JOURNAL_BYTES_ENV",
    "MIN_JOURNAL_BYTES",
    "MIN_RETRY_BASE_S",
    "MIN_STALL_S",
    "MODES",
    "MODE_ENV",
    "PAUSE_ENV",
    "RETRY_BASE_ENV",
    "RUNS_DIR_ENV",
    "STALL_ENV",
    "TEAM_ID_ENV",
    "TRACES_OPT_OUT_ENV",
    "TRACES_URL_ENV",
    "UPLINK_ENV",
    "UPLINK_MODES",
    "VARIABLES",
    "RunSettings",
    "SdkSettings",
    "Settings",
    "UplinkMode",
    "adopt_settings",
    "allow_network_fs",
    "config_file_path",
    "default_runs_dir",
    "default_sync_root",
    "is_loopback",
    "load_config_file",
    "mask_key",
    "parse_bool_setting",
    "parse_byte_count",
    "parse_mode",
    "parse_seconds",
    "parse_uplink",
    "prime_runs_folder",
    "process_sdk_settings",
    "resolve_run_settings",
    "resolve_sdk_settings",
    "resolve_settings",
    "split_api_root",
    "without_settings",
]

log = get_logger("primeruns")

# -- the variables ---------------------------------------------------------------------

API_KEY_ENV = "PRIME_API_KEY"
API_BASE_URL_ENV = "PRIME_API_BASE_URL"
BASE_URL_ENV = "PRIME_BASE_URL"  # read when PRIME_API_BASE_URL is unset
TEAM_ID_ENV = "PRIME_TEAM_ID"
TRACES_URL_ENV = "PRIME_TRACES_URL"
FRONTEND_URL_ENV = "PRIME_FRONTEND_URL"
TRACES_OPT_OUT_ENV = "PRIME_TRACES_OPT_OUT"
MODE_ENV = "PRIME_RUNS_MODE"
RUNS_DIR_ENV = "PRIME_RUNS_DIR"
MAX_JOURNAL_BYTES_ENV = "PRIME_RUNS_MAX_JOURNAL_BYTES"
UPLINK_ENV = "PRIME_RUNS_UPLINK"
RETRY_BASE_ENV = "PRIME_RUNS_RETRY_BASE_S"
PAUSE_ENV = "PRIME_RUNS_PAUSE_S"
LINGER_ENV = "PRIME_RUNS_LINGER_S"
STALL_ENV = "PRIME_RUNS_STALL_S"
ALLOW_NETWORK_FS_ENV = "PRIME_RUNS_ALLOW_NETWORK_FS"

# Every PRIME_* variable the SDK reads; none is read anywhere but here.
VARIABLES = (
    API_KEY_ENV,
    API_BASE_URL_ENV,
    BASE_URL_ENV,
    TEAM_ID_ENV,
    TRACES_URL_ENV,
    FRONTEND_URL_ENV,
    TRACES_OPT_OUT_ENV,
    MODE_ENV,
    RUNS_DIR_ENV,
    MAX_JOURNAL_BYTES_ENV,
    UPLINK_ENV,
    RETRY_BASE_ENV,
    PAUSE_ENV,
    LINGER_ENV,
    STALL_ENV,
    ALLOW_NETWORK_FS_ENV,
)

# -- defaults and bounds ---------------------------------------------------------------

DEFAULT_BASE_URL = "https://api.primeintellect.ai"
DEFAULT_FRONTEND_URL = "https://app.primeintellect.ai"
MODES: tuple[Mode, ...] = ("online", "offline", "disabled")
UplinkMode = Literal["process", "threads"]
UPLINK_MODES: tuple[UplinkMode, ...] = ("process", "threads")
# The journal's (primeruns.journal.journal.DEFAULT_MAX_JOURNAL_BYTES, which a
# test holds equal): the journal package imports this module, not the reverse.
DEFAULT_MAX_JOURNAL_BYTES = 64 << 30
MIN_JOURNAL_BYTES = 1 << 20  # a journal's fixed structures need room to grow
DEFAULT_RETRY_BASE_S = 0.5
MIN_RETRY_BASE_S = 0.001  # zero would retry a failing platform without a pause
DEFAULT_PAUSE_S = 300.0
DEFAULT_LINGER_S = 0.1
DEFAULT_STALL_S = 60.0
MIN_STALL_S = 0.1  # a close-out needs time for its stuck_attempts tries

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_TOKEN = re.compile(r"[\x21-\x7e]*")  # printable ASCII, no spaces: an HTTP header's token

# Longest suffix first: "/api/internal/rft" must win over "/api/internal".
_API_ROOTS = (
    ("/api/internal/rft", "/api/internal", True),
    ("/api/internal", "/api/internal", True),
    ("/api/v1/rft", "/api/v1", False),
    ("/api/v1", "/api/v1", False),
)

T = TypeVar("T")

# -- parsing one value -----------------------------------------------------------------


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


def parse_mode(name: str, raw: str) -> Mode | None:
    """A run mode: None for blank."""
    value = raw.strip().lower()
    if not value:
        return None
    for mode in MODES:
        if value == mode:
            return mode
    raise ConfigurationError(f"{name}={raw!r} is not a mode; use one of online, offline, disabled.")


def parse_uplink(name: str, raw: str) -> UplinkMode:
    value = raw.strip().lower()
    for mode in UPLINK_MODES:
        if value == mode:
            return mode
    raise ConfigurationError(f"{name}={raw!r} is not an uplink; use 'process' or 'threads'")


def parse_seconds(name: str, raw: str, *, minimum: float, default: float) -> float:
    """A finite number of seconds of at least ``minimum``."""
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    accepted = f"use a number of seconds of at least {minimum:g} (the default is {default:g})"
    if not math.isfinite(value):
        raise ConfigurationError(f"{name}={raw!r} is not a number of seconds; {accepted}")
    if value < minimum:
        raise ConfigurationError(f"{name}={raw!r} is below {minimum:g} s; {accepted}")
    return value


def parse_byte_count(name: str, raw: str, *, minimum: int) -> int:
    """A whole number of bytes (digits only) of at least ``minimum``."""
    text = raw.strip()
    accepted = (
        f"use a whole number of bytes of at least {minimum} ({minimum >> 20} MiB); "
        f"the default is {DEFAULT_MAX_JOURNAL_BYTES} ({DEFAULT_MAX_JOURNAL_BYTES >> 30} GiB)"
    )
    # ASCII digits, up to the 4,300 ``int`` reads: past them it raised a
    # ValueError, not this error, out of a disabled run's settings too.
    count = decimal_or_none(text, 4_300)
    if count is None:
        raise ConfigurationError(f"{name}={raw!r} is not a whole number of bytes; {accepted}")
    if count < minimum:
        raise ConfigurationError(f"{name}={raw!r} is below the minimum; {accepted}")
    return count


def _parse_runs_dir(name: str, raw: str) -> Path:
    path = _expanded(name, raw)
    if path.exists() and not path.is_dir():
        raise ConfigurationError(
            f"{name}={raw!r} is not a directory; use a directory (created if missing) "
            "on a node-local disk"
        )
    return path


def _parse_token(name: str, raw: str, *, what: str, secret: bool = False) -> str:
    """One token, as an HTTP header carries it: printable ASCII, no spaces.
    ``secret`` (the API key): the value is never repeated, not even masked."""
    if _TOKEN.fullmatch(raw):
        return raw
    at = next(i for i, c in enumerate(raw) if not _TOKEN.fullmatch(c))
    # A secret's character is described, not quoted: a non-ASCII letter of a
    # key is a letter of the key.
    bad = _kind_of_character(raw[at]) if secret else repr(raw[at])
    raise ConfigurationError(
        f"{name if secret else f'{name}={raw!r}'} is not {what}: character {at + 1} of "
        f"{len(raw)} is {bad}; use it alone (printable ASCII, no spaces or line breaks)"
    )


def _kind_of_character(c: str) -> str:
    if c == " ":
        return "a space"
    if c < " " or c == "\x7f":
        return "a control character (a line break, a tab)"
    return "not ASCII"


def _parse_api_key(name: str, raw: str) -> str:
    return _parse_token(name, raw, what="an API key", secret=True)


def _parse_header_value(name: str, raw: str) -> str:
    """A key given as an argument or in the config file: anything a header can
    carry, without the blanks around it (a server drops them from a header,
    and h11 refuses to send a header ending in one: the run read as a
    platform never reached). httpx refuses a non-ASCII header (a
    UnicodeEncodeError out of ``init``, naming nothing) and h11 a control
    character (which read as an unreachable platform): refused here, naming
    the setting, never the key."""
    at = next((i for i, c in enumerate(raw) if not (" " <= c <= "~" or c == "\t")), None)
    if at is None:
        return raw.strip(" \t")
    raise ConfigurationError(
        f"{name} is not an API key: character {at + 1} of {len(raw)} is not printable "
        f"ASCII (a non-ASCII letter or a line break); use the key alone, as the "
        "platform gave it"
    )


def _parse_team_id(name: str, raw: str) -> str:
    return _parse_token(name, raw, what="a team id")


def _parse_url(name: str, raw: str) -> str:
    """An absolute http(s) URL without credentials (the traces and dashboard URLs)."""
    _checked_url(raw, name)
    return raw.strip()


def _parse_base_url(name: str, raw: str) -> str:
    split_api_root(raw, name=name)
    return raw.strip()


# -- reading the environment -----------------------------------------------------------


class _Reader:
    """Reads variables from one environment; ``strict=False`` turns every bad
    value (of a variable or an argument) into a warning and its default."""

    def __init__(self, environ: Mapping[str, str] | None, strict: bool) -> None:
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.strict = strict

    def value(
        self, name: str, parse: Callable[[str, str], T | None], *, keep_blank: bool = False
    ) -> T | None:
        """The variable's value, None when unset or blank (or bad, not strict)."""
        raw = self.environ.get(name)
        if raw is None or (not keep_blank and not raw.strip()):
            return None
        try:
            return parse(name, raw)
        except ConfigurationError as exc:
            self.problem(exc)
            return None

    def problem(self, exc: ConfigurationError | ValueError) -> None:
        if self.strict:
            raise exc
        log.warning("prime-runs: %s (ignored: a disabled run does not use it)", exc)


# -- the platform settings -------------------------------------------------------------


#: Why ``Path.home()`` raises RuntimeError: said with it.
_NO_HOME = "HOME is not set and this user id has no entry in the password database"


def config_file_path() -> Path:
    return Path.home() / ".prime" / "config.json"


def load_config_file(path: Path | None = None) -> dict[str, Any]:
    """The config file as a dict; anything unreadable degrades to ``{}``."""
    try:
        data = json.loads((path or config_file_path()).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    except RuntimeError:  # no home directory (``_NO_HOME``): no config file either
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


def is_loopback(origin: str) -> bool:
    """Whether ``origin``'s host is this machine (localhost or a loopback address)."""
    host = urlsplit(origin).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _checked_url(url: str, name: str) -> SplitResult:
    """``url`` split, once it is an absolute http(s) URL without credentials;
    ConfigurationError naming ``name`` otherwise."""
    shown = _without_userinfo(url)
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - validates the port: urlsplit itself does not
    except ValueError as exc:  # e.g. "Invalid IPv6 URL", "Port out of range"
        raise ConfigurationError(
            f"{name}={shown!r} is not a valid URL ({exc}); pass e.g. "
            "'https://api.primeintellect.ai' or 'http://127.0.0.1:8765'."
        ) from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(
            f"{name}={shown!r} is not an absolute http(s) URL; pass e.g. "
            "'https://api.primeintellect.ai' or 'http://127.0.0.1:8765'."
        )
    if "@" in parts.netloc:
        # It would be stored in the journal and shown by the CLI: refuse it,
        # without repeating it.
        raise ConfigurationError(
            f"{name}={shown!r} carries credentials (user:password@), which would be "
            f"journaled and shown: remove them; the API key goes in api_key= or "
            f"{API_KEY_ENV}"
        )
    return parts


def split_api_root(base_url: str, *, name: str = "base_url") -> tuple[str, str, bool]:
    """Reduce a base URL to ``(origin, api_prefix, internal)`` (docs/ARCHITECTURE.md, "The wire").

    Only the path is examined: ``https://h/api/internal/rft`` addresses the
    internal RFT router, anything else the public ``/api/v1``. ``name`` is
    the setting errors name (the argument, or the variable it came from).
    """
    parts = _checked_url(base_url, name)
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


@dataclass(frozen=True)
class Settings:
    """The resolved platform settings of one run. ``repr`` never shows the key."""

    api_key: str = field(repr=False)
    origin: str
    api_prefix: str
    internal: bool
    team_id: str | None
    traces_url: str
    frontend_url: str
    traces_opt_out: bool
    sources: Mapping[str, str] = field(default_factory=dict)
    journal_chosen: tuple[str, ...] = ()
    """The loopback URLs among ``origin`` and ``traces_url`` that a journal
    chose, not the user (``ship.uplink.journal_settings``): a neighbour may
    take such a port while its platform is down, so every new connection to
    one is checked for another user's socket before the key goes out on it
    (``loopback_owner``)."""

    def __post_init__(self) -> None:
        # Remembered so that any text that reaches the journal or a log can be
        # scrubbed of it, however it got there (primeruns/redaction.py).
        remember_secret(self.api_key)

    @property
    def api_root(self) -> str:
        return self.origin + self.api_prefix

    @property
    def masked_key(self) -> str:
        return mask_key(self.api_key)


def _config_str(cfg: Mapping[str, Any], key: str) -> str | None:
    value = cfg.get(key)
    return value if isinstance(value, str) and value else None


def _url_setting(
    read: _Reader, cfg: Mapping[str, Any], sources: dict[str, str], key: str, var: str
) -> str | None:
    """The URL ``key`` from its variable, else the config file; None if neither."""
    value = read.value(var, _parse_url)
    if value is not None:
        sources[key] = var
        return value
    raw = _config_str(cfg, key)
    if raw is not None:
        # Checked as strictly as the variable: a URL with credentials in the
        # config file would be journaled and printed by doctor just the same.
        try:
            value = _parse_url(_in_config(key), raw)
        except ConfigurationError as exc:
            read.problem(exc)
        else:
            sources[key] = "config file"
            return value
    sources[key] = "default"
    return None


def _in_config(key: str) -> str:
    """How a message names ``key`` of the config file."""
    return f"{key} in ~/.prime/config.json"


def resolve_settings(
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    team_id: str | None = None,
    traces_opt_out: bool | None = None,
    environ: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
    strict: bool = True,
) -> Settings:
    """The platform settings by the documented precedence (module doc).

    Every platform variable set in ``environ`` (default: this process's
    environment) is parsed, used or not; ``strict=False`` warns about a bad
    one (or a bad ``base_url``) and goes on as if it were unset."""
    read = _Reader(environ, strict)
    cfg = load_config_file() if config is None else config
    sources: dict[str, str] = {}

    env_key = read.value(API_KEY_ENV, _parse_api_key)
    key = ""
    if api_key is not None:
        key, sources["api_key"] = api_key, "argument"
    elif env_key:
        key, sources["api_key"] = env_key, API_KEY_ENV
    elif _config_str(cfg, "api_key"):
        key, sources["api_key"] = cfg["api_key"], "config file"
    else:
        sources["api_key"] = "unset"
    if not isinstance(key, str):
        raise ConfigurationError("api_key must be a string")
    if key and sources["api_key"] != API_KEY_ENV:
        named = "api_key" if sources["api_key"] == "argument" else _in_config("api_key")
        try:
            key = _parse_header_value(named, key)
        except ConfigurationError as exc:
            read.problem(exc)
            key, sources["api_key"] = "", "unset"

    env_urls = [(var, read.value(var, _parse_base_url)) for var in (API_BASE_URL_ENV, BASE_URL_ENV)]
    url, url_name = DEFAULT_BASE_URL, "base_url"
    sources["base_url"] = "default"
    if base_url:
        url, sources["base_url"] = base_url, "argument"
    else:
        for var, value in env_urls:
            if value is not None:
                url, url_name, sources["base_url"] = value, var, var
                break
        else:
            if _config_str(cfg, "base_url"):
                url, sources["base_url"] = cfg["base_url"], "config file"
                url_name = _in_config("base_url")
    try:
        origin, prefix, internal = split_api_root(url, name=url_name)
    except ConfigurationError as exc:
        read.problem(exc)  # a disabled run: warned, and the default used
        origin, prefix, internal = split_api_root(DEFAULT_BASE_URL)
        sources["base_url"] = "default"

    env_team = read.value(TEAM_ID_ENV, _parse_team_id, keep_blank=True)
    team: str | None = None
    if team_id is not None:
        team, sources["team_id"] = team_id, "argument"
    elif env_team is not None:
        team, sources["team_id"] = env_team, TEAM_ID_ENV
    elif cfg.get("team_id"):
        team, sources["team_id"] = str(cfg["team_id"]), "config file"
    else:
        sources["team_id"] = "unset"

    traces = _url_setting(read, cfg, sources, "traces_url", TRACES_URL_ENV) or DEFAULT_BASE_URL
    frontend = _url_setting(read, cfg, sources, "frontend_url", FRONTEND_URL_ENV)
    if frontend is None:
        frontend = DEFAULT_FRONTEND_URL
        if is_loopback(origin):
            # A platform on this machine (``primeruns serve``) serves its run pages
            # at the dashboard's paths on its own origin, so run.url opens there.
            frontend, sources["frontend_url"] = origin, "the local platform's origin"

    opt_out = False
    sources["traces_opt_out"] = "default"
    from_env = read.value(TRACES_OPT_OUT_ENV, parse_bool_setting)
    if traces_opt_out is not None:
        opt_out, sources["traces_opt_out"] = bool(traces_opt_out), "argument"
    elif from_env is not None:
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


# -- the SDK's own settings ------------------------------------------------------------


@dataclass(frozen=True)
class SdkSettings:
    """The SDK's tuning, resolved once: where journals go and how big they
    may grow, how the run ships (uplink, backoff, pauses, lingering, when a
    closing run gives up), and the run's mode (None: decided by the API key).
    """

    runs_dir: Path
    mode: Mode | None = None
    max_journal_bytes: int = DEFAULT_MAX_JOURNAL_BYTES
    uplink: UplinkMode = "process"
    retry_base_s: float = DEFAULT_RETRY_BASE_S
    pause_s: float = DEFAULT_PAUSE_S
    linger_s: float = DEFAULT_LINGER_S
    stall_s: float = DEFAULT_STALL_S
    allow_network_fs: bool = False
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def to_handover(self) -> dict[str, Any]:
        """A JSON-able form for the uplink process (no secret in it)."""
        return {
            "runs_dir": str(self.runs_dir),
            "mode": self.mode,
            "max_journal_bytes": self.max_journal_bytes,
            "uplink": self.uplink,
            "retry_base_s": self.retry_base_s,
            "pause_s": self.pause_s,
            "linger_s": self.linger_s,
            "stall_s": self.stall_s,
            "allow_network_fs": self.allow_network_fs,
            "sources": dict(self.sources),
        }

    @classmethod
    def from_handover(cls, data: Mapping[str, Any]) -> SdkSettings:
        """The settings ``to_handover`` wrote (the producer's, already checked)."""
        return cls(
            runs_dir=Path(data["runs_dir"]),
            mode=data.get("mode"),
            max_journal_bytes=int(data["max_journal_bytes"]),
            uplink="threads" if data.get("uplink") == "threads" else "process",
            retry_base_s=float(data["retry_base_s"]),
            pause_s=float(data["pause_s"]),
            linger_s=float(data["linger_s"]),
            stall_s=float(data["stall_s"]),
            allow_network_fs=bool(data["allow_network_fs"]),
            sources=dict(data.get("sources") or {}),
        )


def _runs_dir_as_given(name: str, raw: str) -> Path:
    """``PRIME_RUNS_DIR`` for an online run: what is there is not judged here.
    A file at that path is a runs directory that cannot take the journal,
    as a read-only or full one: the run journals in a fallback folder with
    one warning (``refuge``), as it does for the ``runs_dir`` argument.
    Refused, verifiers turned the error into a disabled run that kept
    nothing, where the vendor's SDK, which reads no such variable, ships.
    So is a ``~`` path with no home to expand it to."""
    try:
        return _expanded(name, raw)
    except ConfigurationError as exc:
        log.warning("prime-runs: %s; this run's journal goes to a fallback folder", exc)
        return Path(os.devnull) / "runs"  # no folder can be made there


def _expanded(name: str, raw: str) -> Path:
    """``raw`` as a path, a leading ``~`` expanded; ConfigurationError where
    there is no home directory to expand it to (``_NO_HOME``): the
    RuntimeError of ``expanduser`` escaped every init(), the disabled one
    verifiers opens when an online one fails included."""
    try:
        return Path(raw.strip()).expanduser()
    except RuntimeError:
        raise ConfigurationError(
            f"{name}={raw!r} names a folder under the home directory, and there is none "
            f"({_NO_HOME}); use an absolute path"
        ) from None


def _default_runs_dir(read: _Reader, sources: dict[str, str], *, online: bool = False) -> Path:
    explicit = read.value(RUNS_DIR_ENV, _runs_dir_as_given if online else _parse_runs_dir)
    if explicit is not None:
        sources["runs_dir"] = RUNS_DIR_ENV
        return explicit
    sources["runs_dir"] = "default"
    try:
        return prime_runs_folder(read.environ) / "runs"
    except RuntimeError as exc:
        why = (
            f"there is no default runs directory: {exc} ({_NO_HOME}); set {RUNS_DIR_ENV} "
            "(or runs_dir=, XDG_STATE_HOME or HOME) to a directory of your own"
        )
        if online:
            # As for a runs directory that cannot take the journal: it goes
            # to a fallback folder (``refuge``: TMPDIR, /dev/shm, none under
            # a home) and the run ships. Refused, verifiers ran the eval
            # keeping nothing (the vendor's SDK dies here).
            log.warning("prime-runs: %s; this run's journal goes to a fallback folder", why)
            sources["runs_dir"] = "no home directory"
            return Path(os.devnull) / "runs"  # no folder can be made there
        read.problem(ConfigurationError(why))
        return Path(os.devnull)  # (a disabled run's, which writes nothing)


def _seconds(
    read: _Reader, sources: dict[str, str], key: str, name: str, minimum: float, default: float
) -> float:
    value = read.value(name, lambda n, raw: parse_seconds(n, raw, minimum=minimum, default=default))
    sources[key] = "default" if value is None else name
    return default if value is None else value


def _resolve_sdk(
    read: _Reader,
    *,
    mode: Mode | None,
    mode_source: str,
    runs_dir: str | os.PathLike[str] | None,
    max_journal_bytes: int | None,
    online_run: bool = False,
) -> SdkSettings:
    sources: dict[str, str] = {"mode": mode_source}
    if runs_dir is not None:
        directory, sources["runs_dir"] = Path(runs_dir), "argument"
    else:
        directory = _default_runs_dir(read, sources, online=online_run)
    # A relative folder names one of the directory the run began in: a process
    # that changes directory later has not moved its journal. (Not resolved:
    # links are checked where the journal is opened, not followed here.)
    directory = directory.absolute()

    budget = read.value(
        MAX_JOURNAL_BYTES_ENV, lambda n, raw: parse_byte_count(n, raw, minimum=MIN_JOURNAL_BYTES)
    )
    sources["max_journal_bytes"] = "default" if budget is None else MAX_JOURNAL_BYTES_ENV
    if max_journal_bytes is not None:
        if (
            isinstance(max_journal_bytes, bool)
            or not isinstance(max_journal_bytes, int)
            or max_journal_bytes < MIN_JOURNAL_BYTES
        ):
            read.problem(
                ValueError(
                    "init: max_journal_bytes must be a number of bytes of at least 1 MiB, "
                    f"got {max_journal_bytes!r}"
                )
            )
        else:
            budget, sources["max_journal_bytes"] = max_journal_bytes, "argument"

    uplink: UplinkMode | None = read.value(UPLINK_ENV, parse_uplink)
    sources["uplink"] = "default" if uplink is None else UPLINK_ENV
    allow = read.value(ALLOW_NETWORK_FS_ENV, parse_bool_setting)
    sources["allow_network_fs"] = "default" if allow is None else ALLOW_NETWORK_FS_ENV
    return SdkSettings(
        runs_dir=directory,
        mode=mode,
        max_journal_bytes=DEFAULT_MAX_JOURNAL_BYTES if budget is None else budget,
        uplink="process" if uplink is None else uplink,
        retry_base_s=_seconds(
            read, sources, "retry_base_s", RETRY_BASE_ENV, MIN_RETRY_BASE_S, DEFAULT_RETRY_BASE_S
        ),
        pause_s=_seconds(read, sources, "pause_s", PAUSE_ENV, 0.0, DEFAULT_PAUSE_S),
        linger_s=_seconds(read, sources, "linger_s", LINGER_ENV, 0.0, DEFAULT_LINGER_S),
        stall_s=_seconds(read, sources, "stall_s", STALL_ENV, MIN_STALL_S, DEFAULT_STALL_S),
        allow_network_fs=bool(allow),
        sources=sources,
    )


def resolve_sdk_settings(
    *,
    mode: str | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    max_journal_bytes: int | None = None,
    environ: Mapping[str, str] | None = None,
    strict: bool = True,
) -> SdkSettings:
    """The SDK's tuning: each argument given, else its variable, else the
    default. Every tuning variable set is parsed, used or not; a bad one
    raises ConfigurationError naming it (``strict=False``: warns, and the
    default is used). A bad ``mode`` argument always raises."""
    read = _Reader(environ, strict)
    mode_source = "argument"
    resolved = parse_mode("mode", mode) if mode is not None else None
    from_env: Mode | None = read.value(MODE_ENV, parse_mode)
    if resolved is None:
        resolved = from_env
        mode_source = MODE_ENV if from_env is not None else "default"
    return _resolve_sdk(
        read,
        mode=resolved,
        mode_source=mode_source,
        runs_dir=runs_dir,
        max_journal_bytes=max_journal_bytes,
    )


# -- a run's settings ------------------------------------------------------------------


@dataclass(frozen=True)
class RunSettings:
    """What ``init()`` needs resolved: the mode, the platform settings and the tuning."""

    mode: Mode
    platform: Settings
    sdk: SdkSettings


def _has_key(api_key: str | None, env: Mapping[str, str], cfg: Mapping[str, Any]) -> bool:
    """Whether a key is given, by the precedence ``resolve_settings`` applies:
    blanks alone are none (``resolve_settings`` drops the blanks around one)."""
    if api_key is not None:
        return not isinstance(api_key, str) or bool(api_key.strip(" \t"))
    configured = _config_str(cfg, "api_key")
    return bool((env.get(API_KEY_ENV) or "").strip()) or bool((configured or "").strip(" \t"))


def resolve_run_settings(
    *,
    mode: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    team_id: str | None = None,
    traces_opt_out: bool | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    max_journal_bytes: int | None = None,
    environ: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> RunSettings:
    """Every setting of a run ``init()`` opens, resolved once.

    The mode first: the ``mode`` argument, else ``PRIME_RUNS_MODE``, else
    online with an API key and disabled without one (which logs why). A bad
    ``mode`` raises, and so does a bad ``PRIME_RUNS_MODE`` unless the
    argument made the run disabled. Then everything else: strictly for an
    online or offline run (ConfigurationError naming the variable; ValueError
    for a ``max_journal_bytes`` below 1 MiB); a disabled run uses none of it
    and only warns. ``mode='online'`` without a key raises. An online run's
    ``PRIME_RUNS_DIR`` naming a file is no error here: the journal goes to
    a fallback folder, as for any runs directory that cannot take it.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    cfg = load_config_file() if config is None else config
    chosen = parse_mode("mode", mode) if mode is not None else None
    from_env: Mode | None = _Reader(env, chosen != "disabled").value(MODE_ENV, parse_mode)
    run_mode: Mode
    if chosen is not None:
        run_mode, mode_source = chosen, "argument"
    elif from_env is not None:
        run_mode, mode_source = from_env, MODE_ENV
    elif _has_key(api_key, env, cfg):
        run_mode, mode_source = "online", "API key"
    else:
        run_mode, mode_source = "disabled", "no API key"
    strict = run_mode != "disabled"
    platform = resolve_settings(
        api_key=api_key,
        base_url=base_url,
        team_id=team_id,
        traces_opt_out=traces_opt_out,
        environ=env,
        config=cfg,
        strict=strict,
    )
    sdk = _resolve_sdk(
        _Reader(env, strict),
        mode=run_mode,
        mode_source=mode_source,
        runs_dir=runs_dir,
        max_journal_bytes=max_journal_bytes,
        online_run=run_mode == "online",
    )
    if mode_source == "no API key":
        log.warning(
            "prime-runs: no API key found (init(api_key=...), %s or ~/.prime/config.json); "
            "the run is disabled and nothing is recorded. Use mode='offline' to journal it "
            "for `primeruns sync` later.",
            API_KEY_ENV,
        )
    if strict:
        _warn_traces_left_at_production(platform)
    if run_mode == "online" and not platform.api_key:
        raise ConfigurationError(
            f"mode='online' needs an API key: pass api_key=..., set {API_KEY_ENV}, or add "
            "api_key to ~/.prime/config.json (or use mode='offline')."
        )
    return RunSettings(mode=run_mode, platform=platform, sdk=sdk)


def _warn_traces_left_at_production(platform: Settings) -> None:
    """A platform on this machine (``primeruns serve``) with the Prime Traces
    URL left at its default: the traces would go to production, where the
    key of a local platform is refused and the run's close-out waits for a
    stall in silence. Said once, at ``init()``, while the fix is cheap."""
    if platform.traces_opt_out or platform.sources.get("traces_url") != "default":
        return
    if not is_loopback(platform.origin):
        return
    log.warning(
        "prime-runs: base_url %s is on this machine but the Prime Traces URL is left at its "
        "production default %s, so this run's traces go there. For a local platform set "
        "%s=%s (or traces_url in ~/.prime/config.json).",
        platform.origin,
        platform.traces_url,
        TRACES_URL_ENV,
        platform.origin,
    )


# -- readers without settings handed to them -------------------------------------------

_adopted: SdkSettings | None = None


def adopt_settings(sdk: SdkSettings) -> None:
    """Make ``sdk`` this process's settings: for the uplink process, which is
    handed its producer's and has no ``PRIME_*`` variable of its own."""
    global _adopted
    _adopted = sdk


def process_sdk_settings() -> SdkSettings:
    """This process's tuning: the settings it adopted, else the environment's
    (strictly) for a caller that was handed none."""
    return _adopted if _adopted is not None else resolve_sdk_settings()


def prime_runs_folder(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/prime-runs`` (``~/.local/state``): the folder this
    package makes for the default runs directory and the sync root."""
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state).expanduser() / "prime-runs"


def default_sync_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/prime-runs/synced`` (``~/.local/state``): where the
    sync journals of copied runs live, beside the default runs directory and
    never inside a directory copies land in (``rsync --delete`` would remove it).
    With no home directory (``_NO_HOME``), this user's folder in the
    temporary directory, where such a job's online runs journal
    (``refuge``): raised, a requeued job's uplink died taking its first
    attempt's journal over, whose records then never shipped, and every
    other reader of the root (a forked child's, the primary's wait, a
    run key's) failed alike."""
    try:
        return prime_runs_folder(environ) / "synced"
    except RuntimeError:
        return homeless_folder() / "synced"


def homeless_folder() -> Path:
    """This user's folder in the temporary directory (TMPDIR, else
    ``tempfile``'s choice; /dev/shm where none is writable): the first
    fallback folder of a run whose runs directory refused its journal
    (``refuge``), and the sync root's parent where there is no home."""
    import tempfile  # here: a fallback's alone, and ``import`` of settings is every command's

    try:
        base = Path(tempfile.gettempdir())
    except OSError:  # FileNotFoundError: not one of tempfile's candidates is writable
        base = Path("/dev/shm")
    return base / f"prime-runs-{os.geteuid()}"


def default_runs_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$PRIME_RUNS_DIR``, else ``$XDG_STATE_HOME/prime-runs/runs`` (``~/.local/state``)."""
    return _default_runs_dir(_Reader(environ, True), {})


def allow_network_fs(environ: Mapping[str, str] | None = None) -> bool:
    """Whether journals on a network filesystem go unwarned (``PRIME_RUNS_ALLOW_NETWORK_FS``)."""
    if environ is None and _adopted is not None:
        return _adopted.allow_network_fs
    return bool(_Reader(environ, True).value(ALLOW_NETWORK_FS_ENV, parse_bool_setting))


def without_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the SDK's variables: a child handed its settings
    (the uplink process) must not read different ones."""
    return {k: v for k, v in environ.items() if k not in VARIABLES}


@contextmanager
def uplink_overridden(mode: str) -> Iterator[None]:
    """``PRIME_RUNS_UPLINK`` set to ``mode`` for the block, then restored
    (``primeruns.testing.use_transport``: a mocked transport is reachable only
    from threads of this process). Here because every ``PRIME_*`` variable is
    this module's to read and write."""
    previous = os.environ.get(UPLINK_ENV)
    os.environ[UPLINK_ENV] = mode
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(UPLINK_ENV, None)
        else:
            os.environ[UPLINK_ENV] = previous
