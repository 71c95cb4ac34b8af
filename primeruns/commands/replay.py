"""``primeruns replay`` and ``primeruns sync``: ship journals on disk to the platform.

Both are thin commands over :func:`primeruns.ship.uplink.ship_journal`, the same
shippers a live run uses: take ownership (refused, naming the owner, while it
lives), register the run if it never was, ship every unacknowledged record,
and close the run out (as crashed when it has no finish entry). ``replay`` is
for crashed or interrupted online runs, ``sync`` for offline ones; either
takes explicit runs. Exit codes: 0 everything shipped and closed out, 1 not
(the reason is printed), 2 no such run, 3 the owner lives, 4 the journal is
damaged (what was intact was shipped, the rest is reported).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from ..exceptions import JournalCorruptError, JournalError, JournalLockedError
from ..journal import Journal, list_journals
from ..ship.uplink import ShipReport, journal_settings, ship_journal
from .common import (
    EXIT_DAMAGED,
    EXIT_FAILED,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    RunStatus,
    add_runs_dir,
    describe,
    resolve_run,
    runs_dir_of,
    statuses,
)
from .fmt import Style, human_bytes
from .progress import ProgressLine

__all__ = ["add_parser", "describe_plan", "replay_one"]

_MAX_DAMAGE_LINES = 5


def _status_of(path: Path) -> RunStatus:
    for info in list_journals(path.parent):
        if info.path == path:
            return describe(info)
    raise CommandError(f"{path} is not a prime-runs journal")


def describe_plan(status: RunStatus) -> list[str]:
    """What shipping this journal would do, in plain sentences (``--dry-run``)."""
    lines: list[str] = []
    if status.info.owner_alive:
        return [f"refused: owned by {status.info.owner}, which is still running"]
    if not status.platform:
        lines.append("would register the run on the platform (it never was)")
    pending = {k: v for k, v in status.pending.items() if v}
    if pending:
        parts = ", ".join(f"{k} {v}" for k, v in pending.items())
        lines.append(f"would ship pending entries: {parts}")
    else:
        lines.append("nothing pending to ship")
    if status.finalized:
        lines.append(f"already closed out as {status.finalized.get('status')}: left as it is")
    elif status.finish is not None:
        lines.append(f"would close it out as {status.finish.get('status')} (its finish entry)")
    else:
        lines.append("would close it out as failed: crashed (no finish entry)")
    if status.info.damage:
        lines.append(f"journal damage: {len(status.info.damage)} problem(s) (see primeruns show)")
    return lines


def _report(report: ShipReport, style: Style, out: TextIO) -> int:
    code = EXIT_OK
    where = report.url or report.run_id or "(not registered)"
    if report.damaged:
        code = EXIT_DAMAGED
        out.write(
            style.red(f"  damaged: {len(report.damaged)} problem(s); intact entries were shipped\n")
        )
        for d in report.damaged[:_MAX_DAMAGE_LINES]:
            out.write(f"    - {d.what}\n")
        if len(report.damaged) > _MAX_DAMAGE_LINES:
            out.write(f"    ... and {len(report.damaged) - _MAX_DAMAGE_LINES} more\n")
    for sink, loss in report.losses.items():
        reasons = "; ".join(loss.get("reasons") or []) or "no reason recorded"
        out.write(style.yellow(f"  lost {loss.get('count', 0)} for {sink}: {reasons}\n"))
    for error in report.errors:
        out.write(style.red(f"  error: {error}\n"))
    if report.ok:
        out.write(
            style.green("  done")
            + f": {report.records} records ({human_bytes(report.bytes)}) shipped; "
            f"run closed out as {report.status}: {where}\n"
        )
        return code
    if report.pending:
        parts = ", ".join(f"{k} {v}" for k, v in report.pending.items())
        out.write(style.red(f"  incomplete: still pending {parts}") + f" ({where})\n")
    elif not report.finalized:
        out.write(style.red("  incomplete: the run could not be closed out") + f" ({where})\n")
    out.write("  the journal keeps everything not shipped: run the command again to retry\n")
    return EXIT_FAILED


def replay_one(
    path: Path,
    *,
    base_url: str | None = None,
    timeout: float = 3600.0,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Ship one journal and close its run out, printing progress and the result.

    Returns the exit code (see the module doc); never raises for a locked,
    damaged or unreachable case.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    style = Style(out)
    try:
        with Journal.open(path, owner=False) as journal:
            settings = journal_settings(journal, base_url=base_url)
    except JournalCorruptError as exc:
        err.write(f"{path}: damaged journal: {exc}\n")
        return EXIT_DAMAGED
    except JournalError as exc:
        err.write(f"{path}: {exc}\n")
        return EXIT_USAGE
    if not settings.api_key:
        err.write(
            f"{path}: no API key: set PRIME_API_KEY (or api_key in ~/.prime/config.json) "
            "to ship runs\n"
        )
        return EXIT_USAGE
    out.write(style.bold(f"{path.name}") + f" -> {settings.api_root}\n")
    bar = ProgressLine(out, "shipped")
    try:
        report = ship_journal(path, settings=settings, timeout=timeout, progress=bar)
    except JournalLockedError as exc:
        who = exc.owner or "another process"
        err.write(
            f"{path}: refused: the run is owned by {who}, which is still running; "
            "replay it after that process exits\n"
        )
        return EXIT_LOCKED
    except JournalCorruptError as exc:
        err.write(f"{path}: damaged journal: {exc}\n")
        return EXIT_DAMAGED
    except JournalError as exc:
        err.write(f"{path}: {exc}\n")
        return EXIT_USAGE
    bar.done()
    return _report(report, style, out)


def _targets(args: argparse.Namespace, *, offline: bool) -> list[Path]:
    runs_dir = runs_dir_of(args)
    if args.runs:
        return [resolve_run(ref, runs_dir) for ref in args.runs]
    if not args.all and not offline:
        raise CommandError("name the runs to replay, or pass --all")
    chosen: list[Path] = []
    for status in statuses(runs_dir):
        is_offline = status.spec.get("mode") == "offline"
        if status.needs_shipping and is_offline == offline:
            chosen.append(status.info.path)
    return chosen


def _run(args: argparse.Namespace, *, offline: bool) -> int:
    targets = _targets(args, offline=offline)
    what = "offline runs to sync" if offline else "runs to replay"
    if not targets:
        print(f"no {what} under {runs_dir_of(args)}")
        return EXIT_OK
    worst = EXIT_OK
    for path in targets:
        if args.dry_run:
            status = _status_of(path)
            print(Style(sys.stdout).bold(path.name) + f" ({status.state})")
            for line in describe_plan(status):
                print(f"  {line}")
            if status.info.owner_alive:
                worst = max(worst, EXIT_LOCKED)
            continue
        try:
            code = replay_one(path, base_url=args.base_url, timeout=args.timeout)
        except Exception as exc:  # one journal's trouble must not strand the others
            print(f"{path}: not shipped: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = EXIT_FAILED
        worst = max(worst, code)
    return worst


def run_replay(args: argparse.Namespace) -> int:
    """Ship every unacknowledged record of crashed or interrupted runs and close
    them out on the platform (a run without a finish entry is closed as failed,
    crashed). Refuses while a run's owner is alive. Exit 0 only when everything
    shipped and the run is closed out."""
    return _run(args, offline=False)


def run_sync(args: argparse.Namespace) -> int:
    """Register offline runs (PRIME_RUNS_MODE=offline) on the platform and ship
    them: without RUN arguments, every offline run not yet synced."""
    return _run(args, offline=True)


def _common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs", metavar="RUN", nargs="*", help="journal directories or local run ids"
    )
    parser.add_argument(
        "--all", action="store_true", help="every run under --runs-dir that needs it"
    )
    add_runs_dir(parser)
    parser.add_argument("--base-url", help="ship to this platform instead of the run's own")
    parser.add_argument(
        "--dry-run", action="store_true", help="say what would be shipped; send nothing"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        metavar="S",
        help="give up shipping a run after S seconds (default 3600)",
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = sub.add_parser(
        "replay",
        help="ship crashed runs' journals and close them out",
        description=run_replay.__doc__,
    )
    _common_args(replay)
    replay.set_defaults(handler=run_replay)
    sync = sub.add_parser(
        "sync", help="register and ship offline runs", description=run_sync.__doc__
    )
    _common_args(sync)
    sync.set_defaults(handler=run_sync)
