"""Read a journal's records page by page, for ``show`` and ``export``.

Journals are opened read-only (no lock), so both work while the run is live.
Damaged entries are collected, never raised: the caller reports them and
goes on with what is intact.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from typing import Any

from ..journal import Damage, Entry, EntryKind, Journal

__all__ = ["KIND_NAMES", "iter_entries", "load_rows"]

# What ``export --kind`` names, and the entry kinds each means.
KIND_NAMES: dict[str, frozenset[EntryKind]] = {
    "episodes": frozenset({EntryKind.EPISODE}),
    "traces": frozenset({EntryKind.TRACE}),
    "metrics": frozenset({EntryKind.METRICS}),
}


def iter_entries(
    journal: Journal, kinds: Collection[EntryKind], damage: list[Damage]
) -> Iterator[Entry]:
    """Every intact entry of ``kinds``, ascending; damage met is appended to ``damage``."""
    after = 0
    while True:
        result = journal.read(after, kinds=kinds, max_entries=1000, max_bytes=32 << 20)
        damage.extend(result.damaged)
        yield from result.entries
        if result.next_after <= after:
            return
        after = result.next_after


def load_rows(
    journal: Journal, kinds: Collection[EntryKind], damage: list[Damage]
) -> list[dict[str, Any]]:
    """The JSON objects of every intact entry of ``kinds``."""
    rows: list[dict[str, Any]] = []
    for entry in iter_entries(journal, kinds, damage):
        try:
            value = json.loads(entry.payload)
        except ValueError as exc:
            damage.append(Damage(entry.seq, f"entry {entry.seq}: not JSON: {exc}"))
            continue
        if isinstance(value, dict):
            rows.append(value)
    return rows
