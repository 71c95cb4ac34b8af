"""What every command shares: exit codes, errors, run lookup and a run's state.

A ``RUN`` argument is a journal directory or a local run id under the runs
directory (or, as a convenience, the platform's run id of a journal there).
The state shown by ``ls`` and used by ``replay --all``/``sync``/``gc`` is
derived here, in one place, from what a journal says without taking its lock.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..journal import EntryKind, Journal, JournalInfo, list_journals
from ..settings import RUNS_DIR_ENV, default_runs_dir
from ..ship.factory import sink_kinds
from ..ship.ledger import records_left

__all__ = [
    "EXIT_DAMAGED",
    "EXIT_FAILED",
    "EXIT_LOCKED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CommandError",
    "RunStatus",
    "add_json",
    "add_runs_dir",
    "describe",
    "pending_per_sink",
    "resolve_run",
    "runs_dir_of",
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


def add_runs_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs-dir",
        metavar="D",
        type=Path,
        default=None,
        help=f"where run journals live (default: ${RUNS_DIR_ENV}, else "
        "~/.local/state/prime-runs/runs)",
    )


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
    return (path / "data.mdb").is_file()


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


# The record kinds a user logs: by their names in JSON, and as a sentence says them.
RECORD_KINDS = {
    "episodes": EntryKind.EPISODE,
    "traces": EntryKind.TRACE,
    "metrics": EntryKind.METRICS,
}
UNIT_LABELS = {
    EntryKind.EPISODE: "episodes",
    EntryKind.TRACE: "traces",
    EntryKind.METRICS: "metric rows",
}


def unit_of(kinds: Collection[EntryKind], logged: Mapping[str, int]) -> str:
    """What a sink shipping ``kinds`` counts, in words: the one kind of them
    the run logged, else plain records."""
    names = [name for name, kind in RECORD_KINDS.items() if kind in kinds and logged.get(name)]
    return UNIT_LABELS[RECORD_KINDS[names[0]]] if len(names) == 1 else "records"


def pending_per_sink(info: JournalInfo) -> dict[str, int | str]:
    """Per sink of the run, the records it has still to ship, or ``"off"``
    (counted when ``info`` comes from a listing with ``tally=True``)."""
    kind = str((info.meta.get("spec") or {}).get("kind") or "eval")
    out: dict[str, int | str] = {}
    for sink, kinds in sink_kinds(kind).items():
        if info.meta.get(f"sink_off.{sink}"):
            out[sink] = "off"
            continue
        acked = int(info.cursors.get(sink, 0))
        if acked in info.after:
            out[sink] = records_left(info.after[acked], kinds)
        else:  # not counted (no tally, or it failed): every entry past the offset
            out[sink] = max(0, info.last_seq - acked)
    return out


def _finish_record(path: Path, last_seq: int) -> dict[str, Any] | None:
    """The run's finish entry, if any. It is the last thing a run appends, so
    only the journal's tail is read (cheap on a long run)."""
    import json

    try:
        with Journal.open(path, owner=False) as journal:
            tail = journal.read(
                max(0, last_seq - 16), kinds={EntryKind.FINISH}, max_entries=16, max_bytes=1 << 24
            )
    except Exception:  # damage is reported elsewhere; state falls back to "crashed"
        return None
    if not tail.entries:
        return None
    try:
        record = json.loads(tail.entries[-1].payload)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


@dataclass(frozen=True)
class RunStatus:
    """One journal as the commands see it."""

    info: JournalInfo
    state: str  # running | shipped | offline | finished | crashed
    finish: dict[str, Any] | None
    pending: dict[str, int | str]

    @property
    def spec(self) -> dict[str, Any]:
        spec = self.info.meta.get("spec")
        return spec if isinstance(spec, dict) else {}

    @property
    def platform(self) -> dict[str, Any]:
        bound = self.info.meta.get("platform")
        return bound if isinstance(bound, dict) else {}

    @property
    def finalized(self) -> dict[str, Any] | None:
        value = self.info.meta.get("finalized")
        return value if isinstance(value, dict) else None

    @property
    def pending_total(self) -> int:
        return sum(v for v in self.pending.values() if isinstance(v, int))

    @property
    def needs_shipping(self) -> bool:
        """What replay/sync would do something for: not closed out or not all shipped."""
        return self.state not in ("running", "shipped")

    @property
    def counts(self) -> dict[str, int]:
        """What the run logged, in the user's units (episodes, traces, metric rows)."""
        logged = self.info.after.get(0, Counter())
        return {name: logged[int(kind)] for name, kind in RECORD_KINDS.items()}

    @property
    def losses_total(self) -> int:
        return sum(int(loss.get("count", 0)) for loss in self.info.losses.values())

    @property
    def outcome(self) -> str:
        """How the run ended: running, completed, failed, or crashed (no finish
        entry), whatever became of its shipping."""
        if self.info.owner_alive:
            return "running"
        if self.finish is None:
            return "damaged" if self.info.damage and not self.info.meta else "crashed"
        return str(self.finish.get("status") or "failed")

    @property
    def shipping(self) -> str:
        """Where its shipping stands: shipped, N pending, offline (never synced),
        not closed out, live (its uplink ships now), or damaged."""
        if self.info.damage and not self.info.meta:
            return "damaged"
        offline = self.spec.get("mode") == "offline" and not self.platform
        if offline:
            return "offline"
        if self.info.owner_alive:
            return "live"
        if self.pending_total:
            # Sinks ship the same episodes: the most any sink has left, not the sum.
            return f"{max(v for v in self.pending.values() if isinstance(v, int))} pending"
        return "shipped" if self.finalized else "not closed out"

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.info.modified) if self.info.modified else 0.0


def describe(info: JournalInfo) -> RunStatus:
    """Derive a journal's state: running while its owner lives; shipped once it
    is closed out on the platform with nothing pending; offline for an offline
    run not yet synced; else finished (it has a finish entry) or crashed."""
    pending = pending_per_sink(info)
    finish = None if info.owner_alive else _finish_record(info.path, info.last_seq)
    spec = info.meta.get("spec") or {}
    total = sum(v for v in pending.values() if isinstance(v, int))
    if info.owner_alive:
        state = "running"
    elif info.meta.get("finalized") and total == 0:
        state = "shipped"
    elif spec.get("mode") == "offline" and not info.meta.get("platform"):
        state = "offline"
    elif finish is not None:
        state = "finished"
    else:
        state = "crashed"
    return RunStatus(info=info, state=state, finish=finish, pending=pending)


def statuses(runs_dir: Path) -> list[RunStatus]:
    return [describe(info) for info in list_journals(runs_dir, tally=True)]
