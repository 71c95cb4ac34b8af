"""The dashboard's :class:`~.views.Source` over a directory of run journals.

For offline runs (and any run before ``primeruns sync``): the pages read the
journals the producers wrote, with no platform. Journals are opened
read-only, never as owner, so a live run goes on undisturbed. A run's status
is its finish record's (running while its owner lives without one, crashed
after), beside the shipping state ``primeruns ls`` shows. A journal that cannot be read is shown
as damaged, and a damaged entry is skipped: one bad run or record never takes
the pages down. The episodes of a run are projected by the SDK's own code
into the rows the platform would have stored (v0 samples, the training
step's table), so a synced run looks the same on the platform's pages.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from ...journal import Damage, EntryKind, Journal, JournalInfo, list_journals
from ...projection import build_samples, episodes_to_parquet_rows
from ...records import training_step
from ...reports import CRASH_ERROR, RunStatus, describe, load_rows
from ..traces_extract import as_object
from .episodes import sample_row
from .views import RunDetail, RunRow, SampleRow, StepTable, config_text

log = logging.getLogger("primeruns.local.dashboard")

#: Journals whose records are kept after a page read them (oldest dropped first).
CACHED_JOURNALS = 4


def _ending(status: RunStatus) -> tuple[str, str | None]:
    """The run's status and error, as ``primeruns ls`` derives them: its finish
    record's, running while its owner lives, else crashed; damaged when the
    journal cannot be read."""
    outcome = status.outcome
    if outcome == "damaged":
        return "DAMAGED", "; ".join(d.what for d in status.info.damage)
    if outcome == "crashed":
        return "CRASHED", CRASH_ERROR
    error = (status.finish or {}).get("error")
    return outcome.upper(), str(error) if error else None


def _row(status: RunStatus) -> RunRow:
    info = status.info
    spec = status.spec
    state, error = _ending(status)
    created = info.meta.get("journal.created_at")
    return RunRow(
        id=info.local_id,
        kind=spec.kind if spec is not None else None,
        name=spec.name if spec is not None else None,
        model=spec.model if spec is not None else None,
        status=state,
        error=error,
        created_at=float(created) if isinstance(created, int | float) else None,
        updated_at=info.modified or None,
        counts={name: n for name, n in status.counts.items() if n},
        losses={k: int(v.get("count", 0)) for k, v in info.losses.items()},
        damage=[d.what for d in info.damage],
        journal=status.shipping,
    )


def _step_of(row: dict[str, Any]) -> int:
    step = row.get("step")
    return step if isinstance(step, int) else 0


class _Records:
    """One journal's records, read once and kept while its entries do not change."""

    def __init__(self, path: Path) -> None:
        self.damage: list[Damage] = []
        with Journal.open(path, owner=False) as journal:
            self.episodes = load_rows(journal, {EntryKind.EPISODE}, self.damage)
            self.metrics = load_rows(journal, {EntryKind.METRICS}, self.damage)
            summaries = load_rows(journal, {EntryKind.SUMMARY}, self.damage)
            finishes = load_rows(journal, {EntryKind.FINISH}, self.damage)
        finish_summary = as_object(finishes[-1].get("summary")) if finishes else {}
        self.summary = finish_summary or (summaries[-1] if summaries else {})

    @cached_property
    def samples(self) -> list[dict[str, Any]]:
        """The v0 sample rows the platform would store for these episodes."""
        return build_samples(self.episodes)

    @cached_property
    def by_step(self) -> dict[int, list[dict[str, Any]]]:
        """The training episodes by their step."""
        steps: dict[int, list[dict[str, Any]]] = {}
        for record in self.episodes:
            step = training_step(record)
            if step is not None:
                steps.setdefault(step, []).append(record)
        return steps


class JournalSource:
    """Reads the journals under ``runs_dir``; never writes to them."""

    def __init__(self, runs_dir: Path) -> None:
        self.runs_dir = Path(runs_dir)
        self._lock = threading.Lock()  # pages are read in worker threads
        self._cache: dict[tuple[str, int, int, float], _Records] = {}

    def _statuses(self) -> list[RunStatus]:
        return [describe(info) for info in list_journals(self.runs_dir, tally=True)]

    def runs(self) -> list[RunRow]:
        return [_row(s) for s in self._statuses()]

    def _find(self, run_id: str) -> RunStatus | None:
        infos: list[JournalInfo] = list_journals(self.runs_dir, tally=True)
        info = next((i for i in infos if run_id in (i.local_id, i.path.name)), None)
        return None if info is None else describe(info)

    def _records(self, run_id: str, status: RunStatus | None = None) -> _Records | None:
        status = status or self._find(run_id)
        if status is None:
            return None
        info = status.info
        # What a journal holds changes only with its entries: while they do not,
        # the pages of one run (and a live page's polls) reuse one read.
        key = (str(info.path), info.last_seq, info.size_bytes, info.modified)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        try:
            records = _Records(info.path)
        except Exception:  # a journal that cannot be opened: its row says it is damaged
            log.warning("cannot read the journal of %s", run_id, exc_info=True)
            return None
        with self._lock:
            self._cache[key] = records
            while len(self._cache) > CACHED_JOURNALS:
                self._cache.pop(next(iter(self._cache)))
        return records

    def run(self, run_id: str) -> RunDetail | None:
        status = self._find(run_id)
        if status is None:
            return None
        row = _row(status)
        spec = status.spec
        config = dict(spec.config) if spec is not None else {}
        training = (spec.training if spec is not None else None) or {}
        max_steps = training.get("max_steps")
        records = self._records(run_id, status)
        if records is None:
            return RunDetail(row, {}, config_text(config), config)
        if records.damage:
            row = RunRow(**{**vars(row), "damage": row.damage + [d.what for d in records.damage]})
        tables = [StepTable(step, len(eps)) for step, eps in sorted(records.by_step.items())]
        return RunDetail(
            row,
            records.summary,
            config_text(config),
            config,
            max_steps=max_steps if isinstance(max_steps, int) and max_steps > 0 else None,
            metrics=sorted(records.metrics, key=_step_of),
            step_tables=tables if row.kind == "train" else [],
        )

    def samples(self, run_id: str, offset: int, limit: int) -> tuple[list[SampleRow], int]:
        records = self._records(run_id)
        if records is None:
            return [], 0
        samples = records.samples
        page = samples[offset : offset + limit]
        return [sample_row(offset + i + 1, s) for i, s in enumerate(page)], len(samples)

    def sample(self, run_id: str, index: int) -> dict[str, Any] | None:
        records = self._records(run_id)
        if records is None or index < 1:
            return None
        samples = records.samples
        return samples[index - 1] if index <= len(samples) else None

    def step_rows(self, run_id: str, step: int) -> list[dict[str, Any]] | None:
        records = self._records(run_id)
        episodes = None if records is None else records.by_step.get(step)
        if not episodes:
            return None
        return episodes_to_parquet_rows(episodes, run_id, step, created_at=datetime.now(UTC))
