"""What every command shares: exit codes, errors and run lookup.

A ``RUN`` argument is a journal directory or a local run id under the runs
directory (or, as a convenience, the platform's run id of a journal there).
The state shown by ``ls`` and used by ``replay --all``/``sync``/``gc`` is
derived in :mod:`primeruns.reports`, which the dashboard reads too.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import math
from collections.abc import Callable, Iterator
from pathlib import Path

from ..exceptions import PrimeRunsError
from ..journal import list_journals
from ..journal.trust import why_unreadable
from ..settings import RUNS_DIR_ENV, default_runs_dir
from .console import inert

__all__ = [
    "EXIT_DAMAGED",
    "EXIT_FAILED",
    "EXIT_LOCKED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CommandError",
    "add_json",
    "add_runs_dir",
    "inert_errors",
    "no_cyclic_gc",
    "resolve_run",
    "runs_dir_of",
    "seconds_arg",
    "timeout_arg",
]

EXIT_OK = 0
EXIT_FAILED = 1  # something was not done: not everything shipped, a check failed
EXIT_USAGE = 2  # wrong arguments: no such run, not a journal (argparse uses 2 too)
EXIT_LOCKED = 3  # refused: the journal's owner still runs
EXIT_DAMAGED = 4  # the journal is damaged: what was intact was handled, the rest reported


class CommandError(Exception):
    """A one-line error for the user, with the exit code it deserves."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


Handler = Callable[[argparse.Namespace], int]


def inert_errors(handler: Handler) -> Handler:
    """``handler`` whose errors are made inert (see ``console.inert``) on their
    way to the one line the command line prints: a journal's path or a
    server's words in a message must not act on the terminal."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except OSError as exc:
            if exc.filename is not None:
                exc.filename = inert(exc.filename)
            raise
        except (CommandError, PrimeRunsError) as exc:
            exc.args = tuple(inert(a) if isinstance(a, str) else a for a in exc.args)
            raise

    return run


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Within: Python's cycle collector does not run. A listing of thousands
    of journals makes hundreds of thousands of small dicts and lists that
    live until it ends and hold no cycles; the collector walked them all again
    and again (~15% of ``ls``'s CPU with 3,000 past runs). What little
    cyclic garbage a command makes is freed when it ends, or at the next
    collection after this."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def add_runs_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs-dir",
        metavar="D",
        type=Path,
        default=None,
        help=f"where run journals live (default: ${RUNS_DIR_ENV}, else "
        "~/.local/state/prime-runs/runs)",
    )


#: The most seconds a number of them on the command line may be (11.6
#: days): a wait past what the system's waits take raised OverflowError with
#: a traceback (``standby.pause``'s poll takes 2**31 - 1 ms, 24.8 days, a
#: socket's timeout about 292 years), after a first pass or at the connect.
_MOST_SECONDS = 1_000_000


def seconds_arg(text: str) -> float:
    """An argparse type: a finite number of seconds of at least 0 and at most
    ``_MOST_SECONDS``. ``float`` alone took "nan" and "inf": ``sync --watch
    --interval nan`` synced in a loop that never slept (a wait of NaN is
    none), an infinite one raised OverflowError out of the wait, as one past
    24.8 days still did (``--interval 1e300``)."""
    value = _float(text)
    if not math.isfinite(value) or not 0 <= value <= _MOST_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds; use a finite number of at least 0"
            f" and at most {_MOST_SECONDS}"
        )
    return value


def timeout_arg(text: str) -> float:
    """An argparse type: a timeout, a finite number of seconds above 0. A
    timeout of 0 was taken, and could do nothing: ``sync`` or ``replay
    --timeout 0`` registered a run and shipped none of it (exit 1), ``doctor
    --timeout 0`` found a platform that answers unreachable (its connect
    given no time). At most ``_MOST_SECONDS``: ``doctor --timeout 1e10``
    raised OverflowError, a traceback, out of its connect's socket."""
    value = _float(text)
    if not math.isfinite(value) or not 0 < value <= _MOST_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a timeout; use a finite number of seconds above 0"
            f" and at most {_MOST_SECONDS}"
        )
    return value


def _float(text: str) -> float:
    """``text``'s number, NaN where it is none."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print {what} as one JSON document on stdout (messages go to stderr)",
    )


def runs_dir_of(args: argparse.Namespace) -> Path:
    explicit: Path | None = getattr(args, "runs_dir", None)
    return explicit if explicit is not None else default_runs_dir()


def _is_journal(path: Path) -> bool:
    """Whether ``path`` holds a journal; CommandError for a folder this user
    may not look into (another user's private folder), naming why."""
    try:
        return (path / "data.mdb").is_file()
    except PermissionError as exc:
        raise CommandError(why_unreadable(path, exc)) from None


def resolve_run(ref: str, runs_dir: Path) -> Path:
    """The journal directory ``ref`` names; CommandError (exit 2) if none does."""
    direct = Path(ref).expanduser()
    if _is_journal(direct):
        return direct
    if "/" not in ref and ref not in (".", "..") and _is_journal(runs_dir / ref):
        return runs_dir / ref
    if direct.exists():
        raise CommandError(f"{ref} is not a prime-runs journal (no data.mdb in it)")
    matches = [
        info.path
        for info in list_journals(runs_dir)
        if (info.meta.get("platform") or {}).get("run_id") == ref
    ]
    if len(matches) == 1:
        return matches[0]
    raise CommandError(
        f"no run {ref!r}: not a journal directory, nor a run id under {runs_dir} "
        "(see `primeruns ls --runs-dir D`)"
    )
