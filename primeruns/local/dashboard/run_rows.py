"""The runs list's rows, kept per journal while its files and owner are as they were.

A reload of the offline dashboard's runs page listed every journal (from its
summary, or the listing's memo) and then derived each one's state and row
again: with 3,000 past runs most of a reload, for rows that had not changed.
A row depends on the journal's files (its stamp), its owner (running or not)
and, for a copy, its sync journal; so a row is kept with the stamp and owner
it was derived from, and used again while both hold. A copy's row is never
kept (its sync journal changes it, not its own files), nor the row of a
journal whose files cannot be stamped.

The rows are bounded in bytes (``ROWS_BYTES``), least recently used out
first: a row left out is derived again, a little slower, never wrong.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

from .views import RunRow

__all__ = ["ROWS_BYTES", "RowCache", "row_cost"]

#: What the kept rows may hold in all.
ROWS_BYTES = 16 << 20
_ROW_BASE = 600  # a row's fixed fields and their objects, roughly


def row_cost(row: RunRow) -> int:
    """Roughly the bytes a row holds."""
    texts = [row.id, row.kind, row.name, row.model, row.status, row.error, row.journal]
    texts += [*row.damage, *row.environments, *row.tags, *row.counts, *row.losses]
    return _ROW_BASE + sum(len(t) + 50 for t in texts if t)


class RowCache:
    """Rows by journal path, each with the key it was derived for."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = ROWS_BYTES if max_bytes is None else max_bytes
        self.bytes = 0
        self._rows: OrderedDict[Path, tuple[Any, RunRow, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, path: Path, key: Any) -> RunRow | None:
        """The row kept for ``path`` if it was derived for ``key``."""
        hit = self._rows.get(path)
        if hit is None or hit[0] != key:
            return None
        self._rows.move_to_end(path)
        return hit[1]

    def put(self, path: Path, key: Any, row: RunRow) -> None:
        self.drop(path)
        cost = row_cost(row)
        if cost > self.max_bytes:
            return
        self._rows[path] = (key, row, cost)
        self.bytes += cost
        while self.bytes > self.max_bytes:
            _, (_, _, dropped) = self._rows.popitem(last=False)
            self.bytes -= dropped

    def drop(self, path: Path) -> None:
        hit = self._rows.pop(path, None)
        if hit is not None:
            self.bytes -= hit[2]

    def keep_only(self, paths: set[Path]) -> None:
        """Forget the rows of journals no longer listed."""
        for path in [p for p in self._rows if p not in paths]:
            self.drop(path)
