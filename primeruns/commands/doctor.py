"""``primeruns doctor``: is this machine ready to journal and ship runs?

Checks the runs directory (filesystem type, free space, permissions), the
config file (a broken one is reported, not ignored), the settings and where
each came from (the API key only ever masked), whether the platform and
traces endpoints answer, and whether they accept the API key (one
authenticated read each). It reports; it never crashes on what it finds.
Exit 0 when every check passed, 1 otherwise; ``--json`` gives the checks as
one document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import httpx
from rich.text import Text

from ..exceptions import (
    APIError,
    ConfigurationError,
    ForbiddenError,
    JournalError,
    UnauthorizedError,
)
from ..journal.fsinfo import network_fs_type
from ..platform import PlatformClient
from ..refuge import check_prime_runs_folder, prime_runs_folder_of
from ..reports import statuses
from ..settings import (
    SdkSettings,
    Settings,
    config_file_path,
    mask_key,
    resolve_sdk_settings,
    resolve_settings,
)
from .common import EXIT_FAILED, EXIT_OK, add_json, add_runs_dir, runs_dir_of, timeout_arg
from .console import emit_json, human_bytes, inert, make_console

__all__ = ["add_parser"]

_LOW_SPACE = 1 << 30


class _Checks:
    """The checks as they are made: printed at once, or kept for ``--json``."""

    def __init__(self, *, quiet: bool) -> None:
        self.console = make_console()
        self.quiet = quiet
        self.results: list[dict[str, str]] = []
        self.section = ""
        self.failed = 0

    def heading(self, title: str) -> None:
        self.section = title
        if not self.quiet:
            self.console.print(Text(title, style="bold"))

    def _add(self, result: str, style: str, text: str) -> None:
        self.results.append({"section": self.section, "result": result, "detail": text})
        if not self.quiet:
            line = Text("  ")
            line.append(f"{result:<6}", style=style)
            line.append(inert(text))  # paths, settings and servers' messages
            self.console.print(line)

    def ok(self, text: str) -> None:
        self._add("ok", "green", text)

    def warn(self, text: str) -> None:
        self._add("warn", "yellow", text)

    def fail(self, text: str) -> None:
        self.failed += 1
        self._add("FAIL", "red", text)


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_runs_dir(runs_dir: Path, checks: _Checks) -> None:
    if runs_dir.exists() and not runs_dir.is_dir():
        checks.fail(f"{runs_dir} exists but is not a directory")
        return
    base = runs_dir if runs_dir.exists() else _existing_parent(runs_dir)
    folder = prime_runs_folder_of(runs_dir)
    if folder is not None:
        try:
            check_prime_runs_folder(folder)  # init refuses the run otherwise
        except JournalError as exc:
            checks.fail(str(exc))
    if runs_dir.exists():
        checks.ok(f"{runs_dir} exists")
        mode = stat.S_IMODE(runs_dir.stat().st_mode)
        if mode & 0o077:
            checks.warn(f"{runs_dir} is readable by others (mode {mode:o}); chmod 700 it")
    else:
        checks.ok(f"{runs_dir} does not exist yet; it is created (0700) by the first run")
    if os.access(base, os.W_OK | os.X_OK):
        checks.ok(f"{base} is writable")
    else:
        checks.fail(f"{base} is not writable by this user")
    fstype = network_fs_type(base)
    if fstype:
        checks.fail(
            f"{base} is on a network filesystem ({fstype}), where LMDB can corrupt data; "
            "set PRIME_RUNS_DIR to a node-local disk"
        )
    else:
        checks.ok("local filesystem (not a network mount)")
    usage = shutil.disk_usage(base)
    text = f"{human_bytes(usage.free)} free of {human_bytes(usage.total)}"
    if usage.free < _LOW_SPACE:
        checks.warn(f"low disk space: {text}")
    else:
        checks.ok(text)
    found = statuses(runs_dir) if runs_dir.exists() else []
    waiting = [s for s in found if s.state in ("crashed", "finished", "offline")]
    line = f"{len(found)} journal(s)"
    if waiting:
        checks.warn(f"{line}, {len(waiting)} not shipped: primeruns replay --all / sync --all")
    else:
        checks.ok(line)


def _check_config_file(checks: _Checks) -> None:
    path = config_file_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        checks.ok(f"{path}: none (settings come from the environment)")
        return
    except OSError as exc:
        checks.fail(f"{path} cannot be read ({exc.strerror}): its settings are ignored")
        return
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        checks.fail(f"{path} is not valid JSON ({exc}): its settings are ignored; fix or remove it")
        return
    if not isinstance(data, dict):
        checks.fail(f"{path} holds a JSON {type(data).__name__}, not an object: it is ignored")
        return
    checks.ok(f"{path} read ({len(data)} setting(s))")
    mode = stat.S_IMODE(path.stat().st_mode)
    if data.get("api_key") and mode & 0o077:
        checks.warn(f"{path} holds an API key and is readable by others (mode {mode:o}): chmod 600")


def _reach(name: str, url: str, timeout: float, checks: _Checks) -> bool:
    try:
        response = httpx.get(url, timeout=timeout, follow_redirects=False)
    except httpx.HTTPError as exc:
        checks.fail(f"{name} {url} unreachable: {type(exc).__name__}: {exc}")
        return False
    # Any HTTP answer means the endpoint is there; the key is checked next.
    checks.ok(f"{name} {url} answered HTTP {response.status_code}")
    return True


def _check_key(settings: Settings, timeout: float, checks: _Checks, *, traces: bool) -> None:
    """One authenticated read: does the endpoint accept this key?"""
    client = PlatformClient(settings)
    try:
        if traces:
            client.traces("GET", "/runs", params={"limit": 1})
        else:
            client.api("GET", "/evaluations/", params={"limit": 1}, within=timeout)
    except UnauthorizedError:
        where = "Prime Traces" if traces else "the platform"
        checks.fail(f"{where} refused the API key (401): check PRIME_API_KEY")
    except ForbiddenError as exc:
        if traces:
            # The common case: Prime Traces is allowlisted per team.
            checks.warn(
                "Prime Traces is not enabled for this account (403): episodes go to "
                "evaluations only, and nothing is lost"
            )
        else:
            checks.fail(f"the platform accepted the key but refused the read (403): {exc}")
    except APIError as exc:
        checks.fail(f"an authenticated read failed: {exc}")
    else:
        checks.ok(
            "Prime Traces accepts the API key" if traces else "the platform accepts the API key"
        )
    finally:
        client.close()


def _settings_rows(settings: Settings, tuning: SdkSettings) -> list[tuple[str, str, str]]:
    src, own = settings.sources, tuning.sources
    return [
        ("api key", mask_key(settings.api_key), str(src.get("api_key"))),
        ("base url", settings.api_root, str(src.get("base_url"))),
        ("traces url", settings.traces_url, str(src.get("traces_url"))),
        ("team id", settings.team_id or "(none)", str(src.get("team_id"))),
        ("frontend", settings.frontend_url, str(src.get("frontend_url"))),
        ("traces opt-out", str(settings.traces_opt_out), str(src.get("traces_opt_out"))),
        ("mode", tuning.mode or "(auto)", str(own.get("mode"))),
        ("runs dir", str(tuning.runs_dir), str(own.get("runs_dir"))),
        (
            "journal budget",
            human_bytes(tuning.max_journal_bytes),
            str(own.get("max_journal_bytes")),
        ),
        ("uplink", tuning.uplink, str(own.get("uplink"))),
        ("retry backoff", f"{tuning.retry_base_s:g} s", str(own.get("retry_base_s"))),
        ("training pause", f"{tuning.pause_s:g} s", str(own.get("pause_s"))),
        ("batch linger", f"{tuning.linger_s:g} s", str(own.get("linger_s"))),
        ("close-out stall", f"{tuning.stall_s:g} s", str(own.get("stall_s"))),
        (
            "network fs",
            "allowed" if tuning.allow_network_fs else "warned about",
            str(own.get("allow_network_fs")),
        ),
    ]


def run_doctor(args: argparse.Namespace) -> int:
    """Check the runs directory (filesystem, free space, permissions), the
    config file, the settings and where each came from (key masked), that the
    platform and traces endpoints answer and accept the API key. Exit 0 if
    every check passed."""
    checks = _Checks(quiet=args.json)
    checks.heading("runs directory")
    try:
        _check_runs_dir(runs_dir_of(args), checks)
    except ConfigurationError as exc:  # a bad PRIME_RUNS_DIR
        checks.fail(str(exc))
    checks.heading("settings")
    _check_config_file(checks)
    document: dict[str, Any] = {"checks": checks.results, "settings": {}}
    try:
        settings = resolve_settings(base_url=args.base_url)
        tuning = resolve_sdk_settings(runs_dir=args.runs_dir)
    except ConfigurationError as exc:
        checks.fail(f"settings cannot be resolved: {exc}")
        return _finish(checks, document)
    for label, value, source in _settings_rows(settings, tuning):
        document["settings"][label] = {"value": value, "source": source}
        if not args.json:
            line = Text(f"  {label:<15} {inert(value)}  ")
            line.append(f"({inert(source)})", style="dim")
            checks.console.print(line)
    checks.heading("reachability")
    platform_up = _reach("platform", settings.origin, args.timeout, checks)
    traces_up = True
    if settings.traces_opt_out:
        checks.ok("traces: opted out, not checked")
    else:
        traces_up = _reach("traces", settings.traces_url, args.timeout, checks)
    if not settings.api_key:
        checks.warn("no API key: runs are disabled unless mode='offline'")
    else:
        checks.heading("API key")
        if platform_up:
            _check_key(settings, args.timeout, checks, traces=False)
        if traces_up and not settings.traces_opt_out:
            _check_key(settings, args.timeout, checks, traces=True)
    return _finish(checks, document)


def _finish(checks: _Checks, document: dict[str, Any]) -> int:
    code = EXIT_FAILED if checks.failed else EXIT_OK
    if checks.quiet:
        emit_json({**document, "failed": checks.failed, "exit_code": code})
    elif checks.failed:
        checks.console.print(Text(f"{checks.failed} check(s) failed", style="red"))
    else:
        checks.console.print(Text("all checks passed", style="green"))
    return code


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "doctor",
        help="check the runs directory, settings and connectivity",
        description=run_doctor.__doc__,
    )
    add_runs_dir(parser)
    parser.add_argument("--base-url", help="check this platform instead of the configured one")
    parser.add_argument(
        "--timeout",
        type=timeout_arg,
        default=3.0,
        metavar="S",
        help="HTTP timeout (default 3 s)",
    )
    add_json(parser, "the checks and settings")
    parser.set_defaults(handler=run_doctor)
