"""``primeruns doctor``: is this machine ready to journal and ship runs?

Checks the runs directory (filesystem type, free space, permissions), the
settings and where each came from (the API key only ever masked), and whether
the platform and traces endpoints answer. It reports; it never crashes on
what it finds. Exit 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
from pathlib import Path

import httpx

from ..exceptions import ConfigurationError
from ..journal.fsinfo import network_fs_type
from ..platform import resolve_settings
from ..platform.settings import MODE_ENV, mask_key
from .common import EXIT_FAILED, EXIT_OK, add_runs_dir, runs_dir_of, statuses
from .fmt import Style, human_bytes

__all__ = ["add_parser"]

_LOW_SPACE = 1 << 30


class _Checks:
    def __init__(self, style: Style) -> None:
        self.style = style
        self.failed = 0

    def ok(self, text: str) -> None:
        print(f"  {self.style.green('ok')}    {text}")

    def warn(self, text: str) -> None:
        print(f"  {self.style.yellow('warn')}  {text}")

    def fail(self, text: str) -> None:
        self.failed += 1
        print(f"  {self.style.red('FAIL')}  {text}")


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_runs_dir(runs_dir: Path, checks: _Checks) -> None:
    if runs_dir.exists() and not runs_dir.is_dir():
        checks.fail(f"{runs_dir} exists but is not a directory")
        return
    base = runs_dir if runs_dir.exists() else _existing_parent(runs_dir)
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


def _reach(name: str, url: str, timeout: float, checks: _Checks) -> None:
    try:
        response = httpx.get(url, timeout=timeout, follow_redirects=False)
    except httpx.HTTPError as exc:
        checks.fail(f"{name} {url} unreachable: {type(exc).__name__}: {exc}")
        return
    # Any HTTP answer means the endpoint is there; the status is for the user.
    checks.ok(f"{name} {url} answered HTTP {response.status_code}")


def run_doctor(args: argparse.Namespace) -> int:
    """Check the runs directory (filesystem, free space, permissions), the
    settings and where each came from (key masked), and that the platform and
    traces endpoints answer. Exit 0 if every check passed."""
    style = Style(sys.stdout)
    checks = _Checks(style)
    runs_dir = runs_dir_of(args)
    print(style.bold("runs directory"))
    _check_runs_dir(runs_dir, checks)
    print(style.bold("settings"))
    try:
        settings = resolve_settings(base_url=args.base_url)
    except ConfigurationError as exc:
        checks.fail(f"settings cannot be resolved: {exc}")
        return EXIT_FAILED
    src = settings.sources
    rows = [
        ("api key", mask_key(settings.api_key), src.get("api_key")),
        ("base url", settings.api_root, src.get("base_url")),
        ("traces url", settings.traces_url, src.get("traces_url")),
        ("team id", settings.team_id or "(none)", src.get("team_id")),
        ("frontend", settings.frontend_url, src.get("frontend_url")),
        ("traces opt-out", str(settings.traces_opt_out), src.get("traces_opt_out")),
        (
            "mode",
            os.environ.get(MODE_ENV) or "(auto)",
            MODE_ENV if os.environ.get(MODE_ENV) else "default",
        ),
    ]
    for label, value, source in rows:
        print(f"  {label:<15} {value}  {style.dim('(' + str(source) + ')')}")
    if not settings.api_key:
        checks.warn("no API key: runs are disabled unless mode='offline'")
    print(style.bold("reachability"))
    _reach("platform", settings.origin, args.timeout, checks)
    if settings.traces_opt_out:
        checks.ok("traces: opted out, not checked")
    else:
        _reach("traces", settings.traces_url, args.timeout, checks)
    if checks.failed:
        print(style.red(f"{checks.failed} check(s) failed"))
        return EXIT_FAILED
    print(style.green("all checks passed"))
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "doctor",
        help="check the runs directory, settings and connectivity",
        description=run_doctor.__doc__,
    )
    add_runs_dir(parser)
    parser.add_argument("--base-url", help="check this platform instead of the configured one")
    parser.add_argument(
        "--timeout", type=float, default=3.0, metavar="S", help="HTTP timeout (default 3 s)"
    )
    parser.set_defaults(handler=run_doctor)
