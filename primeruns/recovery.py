"""Ship a journal on disk to the platform: ``primeruns replay`` and ``sync``,
and a requeued training job picking up its predecessor's backlog.

It uses the very shippers and lifecycle a live run uses (there is one path
to the platform): take ownership of the journal, register the run if it never
was, ship every sink's unacknowledged entries (a recorded in-flight batch
first, byte-identical), then close the run out: with the status its finish
entry recorded, or as crashed when it has none. A run already closed out is
left as it is, so replaying twice is harmless.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .exceptions import APIError, JournalError
from .journal import Damage, EntryKind, Journal, list_journals
from .platform import PlatformClient, Settings, resolve_settings
from .platform.settings import split_api_root
from .ship.factory import make_shippers
from .ship.lifecycle import Lifecycle
from .ship.policy import RetryPolicy
from .ship.shipper import Shipper, drain_all

__all__ = [
    "CRASH_ERROR",
    "Progress",
    "ShipReport",
    "find_run_journals",
    "journal_settings",
    "ship_journal",
    "terminal_state",
]

log = logging.getLogger("primeruns.recovery")

CRASH_ERROR = "the producer stopped without finishing the run"


@dataclass
class Progress:
    """How far a shipment got, for a progress bar."""

    records: int = 0
    bytes: int = 0
    pending: dict[str, int] = field(default_factory=dict)
    """Per sink, journal entries not yet dealt with (all kinds counted)."""


@dataclass
class ShipReport:
    """What shipping one journal did; ``ok`` when nothing is left to do."""

    path: Path
    local_id: str
    run_id: str | None = None
    url: str | None = None
    status: str | None = None
    records: int = 0
    bytes: int = 0
    pending: dict[str, int] = field(default_factory=dict)
    losses: dict[str, dict[str, Any]] = field(default_factory=dict)
    damaged: list[Damage] = field(default_factory=list)
    finalized: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.pending and self.finalized and not self.errors


def journal_settings(
    journal: Journal, *, base_url: str | None = None, traces_url: str | None = None
) -> Settings:
    """Settings to ship ``journal`` with: the API key from this environment
    (never from the journal), and the platform the run was bound to, unless
    overridden."""
    spec = journal.get_meta("spec", {}) or {}
    bound = journal.get_meta("platform") or {}
    current = resolve_settings(base_url=base_url)
    if base_url is None:
        recorded = bound.get("base_url") or (
            spec.get("base_url") if current.sources.get("base_url") == "default" else None
        )
        if recorded:
            current = resolve_settings(base_url=str(recorded))
    traces = traces_url
    if traces is None and current.sources.get("traces_url") == "default":
        # An explicit --base-url moves Prime Traces along with the API (the
        # recorded traces URL is the old platform's), unless the environment
        # names one.
        traces = split_api_root(base_url)[0] if base_url else spec.get("traces_url")
    if traces:
        from dataclasses import replace

        current = replace(current, traces_url=str(traces).rstrip("/"))
    return current


def terminal_state(journal: Journal) -> tuple[str, str | None, dict[str, Any]]:
    """``(status, error, summary)`` from the journal's finish entry, or a
    crash (with the last summary update) when the producer never finished."""
    finishes = journal.read(0, kinds={EntryKind.FINISH}, max_entries=1_000_000, max_bytes=1 << 30)
    if finishes.entries:
        record = json.loads(finishes.entries[-1].payload)
        return str(record.get("status", "failed")), record.get("error"), record.get("summary") or {}
    summaries = journal.read(0, kinds={EntryKind.SUMMARY}, max_entries=1_000_000, max_bytes=1 << 30)
    summary = json.loads(summaries.entries[-1].payload) if summaries.entries else {}
    return "crashed", CRASH_ERROR, summary


def find_run_journals(
    runs_dir: Path, run_id: str, *, exclude: Path | None = None
) -> tuple[list[Path], list[str]]:
    """Journals under ``runs_dir`` of platform run ``run_id``: those whose owner
    is gone (a requeued job ships them), and the owners still logging to it."""
    gone: list[Path] = []
    live: list[str] = []
    for info in list_journals(runs_dir):
        if exclude is not None and info.path == exclude:
            continue
        spec = info.meta.get("spec") or {}
        bound = info.meta.get("platform") or {}
        if run_id in (spec.get("attach_id"), bound.get("run_id")):
            if info.owner_alive:
                live.append(str(info.owner or info.path))
            else:
                gone.append(info.path)
    return gone, live


def _pending(journal: Journal, shippers: list[Shipper]) -> dict[str, int]:
    out: dict[str, int] = {}
    for shipper in shippers:
        if shipper.state.off_reason is None:
            left = shipper.pending_records()
            if left:
                out[shipper.name] = left
    return out


def ship_journal(
    path: Path,
    *,
    settings: Settings | None = None,
    timeout: float = 3600.0,
    finalize: bool = True,
    progress: Callable[[Progress], None] | None = None,
    policy: RetryPolicy | None = None,
) -> ShipReport:
    """Ship everything ``path`` holds and close the run out (see module doc).

    Raises ``JournalLockedError`` (naming the owner) while the producer lives,
    and ``JournalError`` for a path that is not a journal. Platform failures
    are reported in the result, never raised.
    """
    # Damage is looked for before anything writes (opening as owner writes):
    # LMDB must never write into a damaged tree (it can loop or crash), so
    # such a journal is rebuilt from what is intact, the damaged file kept.
    probe = Journal.open(path, owner=False)
    try:
        damaged = probe.damage()
    finally:
        probe.close()
    journal = Journal.open(path, owner=True, repair=bool(damaged))
    report = ShipReport(path=journal.path, local_id=journal.local_id)
    errors: list[str] = []

    def on_failure(what: str, exc: BaseException) -> None:
        errors.append(f"{what}: {type(exc).__name__}: {exc}")

    try:
        report.damaged = damaged
        settings = settings or journal_settings(journal)
        client = PlatformClient(settings)
        policy = policy or RetryPolicy.from_env()
        lifecycle = Lifecycle(journal, client, policy=policy, on_failure=on_failure)
        try:
            binding = lifecycle.register()
        except APIError as exc:
            report.errors.append(f"register: {exc}")
            return report
        report.run_id, report.url = binding.run_id, binding.url
        spec = lifecycle.spec
        shippers = make_shippers(
            journal,
            client,
            lifecycle,
            opted_out=bool(spec.get("traces_opt_out")),
            policy=policy,
            on_failure=on_failure,
        )
        for shipper in shippers:
            shipper.start()
        deadline = time.monotonic() + timeout
        target = journal.last_seq()
        try:
            while True:
                done = drain_all(shippers, target, min(deadline, time.monotonic() + 0.25))
                if progress is not None:
                    progress(
                        Progress(
                            records=sum(s.state.records_sent for s in shippers),
                            bytes=sum(s.state.bytes_sent for s in shippers),
                            # Cheap while running: journal entries left, not records.
                            pending={
                                s.name: target - s.shipped_through()
                                for s in shippers
                                if s.shipped_through() < target
                            },
                        )
                    )
                if done or all(s.settled(target) for s in shippers) or time.monotonic() > deadline:
                    break
        finally:
            for shipper in shippers:
                shipper.signal_stop()
            for shipper in shippers:
                shipper.join(timeout=5.0)
        report.records = sum(s.state.records_sent for s in shippers)
        report.bytes = sum(s.state.bytes_sent for s in shippers)
        report.pending = _pending(journal, shippers)
        for shipper in shippers:
            if shipper.state.retired_reason:
                errors.append(f"{shipper.name} stopped: {shipper.state.retired_reason}")
        status, error, summary = terminal_state(journal)
        report.status = status
        if lifecycle.finalized or journal.get_meta("continued_by"):
            # Closed out already, or a later process of the same run carried on
            # and owns the close-out.
            report.finalized = True
        elif finalize and not report.pending:
            if spec.get("kind") == "eval":
                summary = dict(summary)
                prime = dict(summary.get("prime_runs") or {})
                prime["traces_episodes_written"] = int(journal.get_meta("episodes_written", 0) or 0)
                summary["prime_runs"] = prime
            lifecycle.finalize(status, error, summary, deadline=deadline)
            report.finalized = lifecycle.finalized
        if report.finalized and not report.pending:
            journal.set_meta("state", "shipped")
        report.losses = journal.losses()
        client.close()
    except JournalError:
        raise
    finally:
        report.errors.extend(errors)
        journal.close()
    return report
