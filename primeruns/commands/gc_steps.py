"""``primeruns gc``'s second half: the step tables of the runs it collected.

The processes of a run merge their metrics rows per step in a small table
beside their journals (``sinks.step_rows``: ``<runs dir>/.steps/``). Once a
run's journals are gone it is never read again, and a runs directory of
thousands of past runs would keep a table for each. So ``gc`` deletes a
table with the run's last journal: when every journal logging to its run
(in the runs directory and among the sync journals, which merge theirs in
the same place or beside them) was deleted by this ``gc``, or would be with
``--dry-run``. A table no journal logs to any more (its journals were
collected before tables were) goes once it is older than ``--older-than``.
A table a live process has open is never deleted (``step_rows.delete_table``
takes its lock without waiting), nor one a process is still making; one a
process killed while it made it goes (``collect_drafts``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..reports import RunStatus
from ..sinks.step_rows import delete_draft, delete_table, drafts, table_name, table_run, tables
from .run_groups import run_id_of

__all__ = ["StepTable", "collect_drafts", "collect_tables"]


@dataclass(frozen=True)
class StepTable:
    """One table gc looked at: its file, its run (None: unknown), and what became of it."""

    path: Path
    run_id: str | None
    size_bytes: int
    deleted: bool
    reason: str | None  # why it was kept


def _names(status: RunStatus, run_id: str) -> set[str]:
    """The file names a journal's table may have (a table that does not say
    its run is known by name): under its spec's API root."""
    spec = status.spec
    if spec is None or not spec.base_url:
        return set()
    return {table_name(f"{spec.base_url} {run_id}")}


def collect_tables(
    folders: Iterable[Path],
    journals: list[tuple[RunStatus, bool]],
    *,
    older_than: float,
    dry_run: bool,
) -> list[StepTable]:
    """Delete the step tables in ``folders`` (runs directories) whose runs'
    journals are all gone. ``journals``: every journal gc listed, and
    whether it was deleted (or would be, in a dry run)."""
    by_run: dict[str, list[bool]] = {}
    by_name: dict[str, list[bool]] = {}
    for status, gone in journals:
        run_id = run_id_of(status)
        if run_id is None:
            continue
        by_run.setdefault(run_id, []).append(gone)
        for name in _names(status, run_id):
            by_name.setdefault(name, []).append(gone)
    out = []
    now = time.time()
    for folder in folders:
        for path in tables(folder):
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            key = table_run(path)
            run_id = key.split(" ", 1)[-1] if key else None
            fates = by_run.get(run_id, []) if run_id is not None else by_name.get(path.name, [])
            reason = None
            if fates and not all(fates):
                reason = "a journal of its run is kept"
            elif not fates and now - st.st_mtime < older_than:
                reason = "no journal of its run here, and younger than the threshold"
            deleted = False
            if reason is None and not dry_run:
                deleted = delete_table(path)
                if not deleted:
                    reason = "in use by a live process"
            would = dry_run and reason is None
            out.append(StepTable(path, run_id, st.st_size, deleted or would, reason))
    return out


def collect_drafts(folders: Iterable[Path], *, dry_run: bool) -> list[Path]:
    """Delete the step tables in ``folders`` that processes killed while
    they made them left unfinished (never one a live process is filling):
    those deleted (would be, with ``dry_run``)."""
    return [
        path for folder in folders for path in drafts(folder) if delete_draft(path, dry_run=dry_run)
    ]
